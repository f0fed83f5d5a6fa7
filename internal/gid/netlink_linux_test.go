package gid

import (
	"net"
	"net/netip"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestFromInterfaceLoopback(t *testing.T) {
	tb, err := FromInterface("lo")
	if err != nil {
		t.Skip("no lo:", err)
	}
	if tb.IfIndex == 0 || tb.Name != "lo" {
		t.Fatalf("interface %q index %d", tb.Name, tb.IfIndex)
	}
	e, _ := tb.Entry(0)
	if netip.AddrFrom16(e.GID) != netip.MustParseAddr("fe80::200:ff:fe00:0") {
		t.Fatalf("lo index 0 = %v", netip.AddrFrom16(e.GID))
	}
	if i, err := tb.Index(netip.MustParseAddr("127.0.0.1")); err != nil || i < 1 {
		t.Fatalf("127.0.0.1 -> %d, %v", i, err)
	}
	if tb.ActiveMTU() != ActiveMTU(tb.NetdevMTU) || tb.NetdevMTU == 0 {
		t.Fatalf("MTU %d -> %d", tb.NetdevMTU, tb.ActiveMTU())
	}
	if _, err := FromInterface("no-such-if0"); err == nil {
		t.Fatal("unknown interface must fail")
	}
}

// newNetns returns a handle of a fresh network namespace (the thread that made it is discarded).
func newNetns(t *testing.T) netns.NsHandle {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespace)")
	}
	type res struct {
		h   netns.NsHandle
		err error
	}
	c := make(chan res, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			c <- res{err: err}
			return
		}
		h, err := netns.Get()
		c <- res{h, err}
	}()
	r := <-c
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { r.h.Close() })
	return r.h
}

// TestFromInterfaceAndWatch: a veth in a private netns with a known MAC, MTU 9000 and
// 198.18.0.0/15 addresses; the table follows address additions and removals.
func TestFromInterfaceAndWatch(t *testing.T) {
	ns := newNetns(t)
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	mac, _ := net.ParseMAC("52:54:00:aa:bb:cc")
	la := netlink.NewLinkAttrs()
	la.Name, la.MTU, la.HardwareAddr = "srv0", 9000, mac
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "srv1"}); err != nil {
		t.Fatal(err)
	}
	l, err := h.LinkByName("srv0")
	if err != nil {
		t.Fatal(err)
	}
	addAddr := func(s string) {
		a, err := netlink.ParseAddr(s)
		if err != nil {
			t.Fatal(err)
		}
		a.Flags = unix.IFA_F_NODAD
		if err := h.AddrAdd(l, a); err != nil {
			t.Fatal(err)
		}
	}
	addAddr("198.18.1.1/24")

	tables := make(chan *Table, 16)
	done := make(chan struct{})
	wait, err := Watch(WatchOptions{Name: "srv0", Done: done, Handle: h, Namespace: &ns,
		OnChange: func(t *Table) { tables <- t }})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { close(done); wait() }()
	// Safety bound on waiting for netlink events, not a sleep.
	next := func(pred func(*Table) bool) *Table {
		t.Helper()
		timeout := time.After(10 * time.Second)
		for {
			select {
			case tb := <-tables:
				if pred(tb) {
					return tb
				}
			case <-timeout:
				t.Fatal("no matching table update")
			}
		}
	}
	first := next(func(*Table) bool { return true })
	if first.ActiveMTU() != 4096 || first.NetdevMTU != 9000 {
		t.Fatalf("MTU %d -> %d", first.NetdevMTU, first.ActiveMTU())
	}
	e0, _ := first.Entry(0)
	if netip.AddrFrom16(e0.GID) != netip.MustParseAddr("fe80::5054:ff:feaa:bbcc") {
		t.Fatalf("index 0 = %v", netip.AddrFrom16(e0.GID))
	}
	if i, err := first.Index(netip.MustParseAddr("198.18.1.1")); i != 1 || err != nil {
		t.Fatalf("198.18.1.1 -> %d %v", i, err)
	}
	addAddr("198.18.2.2/24")
	addAddr("2001:db8::5/64")
	tb := next(func(tb *Table) bool { return tb.Len() == 4 })
	want := []string{"fe80::5054:ff:feaa:bbcc", "::ffff:198.18.1.1", "::ffff:198.18.2.2", "2001:db8::5"}
	for i, w := range want {
		e, _ := tb.Entry(i)
		if netip.AddrFrom16(e.GID) != netip.MustParseAddr(w) {
			t.Fatalf("entry %d = %v, want %s (%v)", i, netip.AddrFrom16(e.GID), w, tb.Entries())
		}
	}
	a, _ := netlink.ParseAddr("198.18.1.1/24")
	if err := h.AddrDel(l, a); err != nil {
		t.Fatal(err)
	}
	tb = next(func(tb *Table) bool {
		_, err := tb.Index(netip.MustParseAddr("198.18.1.1"))
		return err != nil
	})
	if i, err := tb.Index(netip.MustParseAddr("198.18.2.2")); i != 1 || err != nil {
		t.Fatalf("after removal 198.18.2.2 -> %d %v", i, err)
	}
	// link-local addresses: the MAC's is the index-0 GID, now bindable with the interface as
	// its zone; another one is a GID of its own after the other IPv6 ones
	addAddr("fe80::5054:ff:feaa:bbcc/64")
	addAddr("fe80::99/64")
	tb = next(func(tb *Table) bool { return tb.Len() == 4 && len(tb.Addrs()) == 4 })
	want = []string{"fe80::5054:ff:feaa:bbcc%srv0", "198.18.2.2", "2001:db8::5", "fe80::99%srv0"}
	for i, w := range want {
		if e, _ := tb.Entry(i); e.Addr != netip.MustParseAddr(w) {
			t.Fatalf("entry %d = %v, want %s (%v)", i, e.Addr, w, tb.Entries())
		}
	}
	if got := tb.Addrs(); got[0] != netip.MustParseAddr("fe80::5054:ff:feaa:bbcc%srv0") || got[3] != netip.MustParseAddr("fe80::99%srv0") {
		t.Fatalf("Addrs %v", got)
	}
}
