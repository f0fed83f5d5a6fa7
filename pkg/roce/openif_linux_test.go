package roce

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/gid"
	"github.com/softroce/softroce/internal/qp"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestOpenUDPInterface opens devices by interface name (OpenUDP
// UDPOptions.Interface) in a network namespace the test creates: a veth
// pair srv0 (MTU 1500, 198.18.1.1 and 2001:db8::1) and srv1 (MTU 9000,
// 198.18.1.2), each with a known MAC. The GID table comes from netlink
// as rxe builds it (index 0 the link-local GID from the MAC, then
// IPv4-mapped and IPv6 GIDs, IBTA A17.8), the port's active MTU from the
// interface MTU less 80 bytes of headers (1500 -> 1024, 9000 -> 4096),
// and an RC WRITE at that path MTU moves between the two devices. (The portable sockets:
// they tell the race detector that a send happens before its receive, see stdUDP.)
func TestOpenUDPInterface(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespace)")
	}
	type result struct {
		a, b *Device
		err  error
		step string
	}
	c := make(chan result, 1)
	go func() {
		// never unlocked: the thread, left in the namespace, exits with the goroutine
		runtime.LockOSThread()
		fail := func(step string, err error) { c <- result{err: err, step: step} }
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			fail("unshare", err)
			return
		}
		h, err := netlink.NewHandle()
		if err != nil {
			fail("netlink", err)
			return
		}
		defer h.Close()
		mac0, _ := net.ParseMAC("52:54:00:aa:bb:01")
		mac1, _ := net.ParseMAC("52:54:00:aa:bb:02")
		la := netlink.NewLinkAttrs()
		la.Name, la.MTU, la.HardwareAddr = "srv0", 1500, mac0
		if err := h.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "srv1", PeerHardwareAddr: mac1}); err != nil {
			fail("veth", err)
			return
		}
		for _, s := range []struct {
			name  string
			mtu   int
			addrs []string
		}{
			{"lo", 0, nil},
			{"srv0", 1500, []string{"198.18.1.1/24", "2001:db8::1/64"}},
			{"srv1", 9000, []string{"198.18.1.2/24"}},
		} {
			l, err := h.LinkByName(s.name)
			if err != nil {
				fail("link "+s.name, err)
				return
			}
			if s.mtu != 0 {
				if err := h.LinkSetMTU(l, s.mtu); err != nil {
					fail("mtu "+s.name, err)
					return
				}
			}
			for _, as := range s.addrs {
				a, err := netlink.ParseAddr(as)
				if err != nil {
					fail("addr", err)
					return
				}
				a.Flags = unix.IFA_F_NODAD
				if err := h.AddrAdd(l, a); err != nil {
					fail("addr "+as, err)
					return
				}
			}
			if err := h.LinkSetUp(l); err != nil {
				fail("up "+s.name, err)
				return
			}
		}
		a, err := OpenUDP(UDPOptions{Interface: "srv0", Name: "a", Portable: true})
		if err != nil {
			fail("OpenUDP srv0", err)
			return
		}
		b, err := OpenUDP(UDPOptions{Interface: "srv1", Name: "b", Portable: true})
		if err != nil {
			a.Close()
			fail("OpenUDP srv1", err)
			return
		}
		// a device opened on an address takes its GUID from the interface holding it
		byAddr, err := OpenUDP(UDPOptions{Addrs: []netip.Addr{netip.MustParseAddr("198.18.1.2")}, Port: 4792, Portable: true})
		if err != nil {
			a.Close()
			b.Close()
			fail("OpenUDP 198.18.1.2", err)
			return
		}
		g, g0 := byAddr.Attr().NodeGUID, byAddr.GIDs()[0]
		byAddr.Close()
		if g != 0x505400fffeaabb02 || g0 != netip.MustParseAddr("fe80::5054:ff:feaa:bb02") {
			a.Close()
			b.Close()
			fail("OpenUDP 198.18.1.2", fmt.Errorf("node GUID %#x and GID 0 %v, want srv1's", g, g0))
			return
		}
		c <- result{a: a, b: b}
	}()
	r := <-c
	if r.err != nil {
		t.Fatalf("%s: %v", r.step, r.err)
	}
	da, db := r.a, r.b
	t.Cleanup(func() {
		da.Close()
		db.Close()
	})

	wantGIDs := map[*Device][]string{
		da: {"fe80::5054:ff:feaa:bb01", "::ffff:198.18.1.1", "2001:db8::1"},
		db: {"fe80::5054:ff:feaa:bb02", "::ffff:198.18.1.2"},
	}
	for d, want := range wantGIDs {
		tb := d.GIDTable()
		if tb == nil || tb.Len() != len(want) {
			t.Fatalf("%s: GID table %v, want %v", d.Name(), d.GIDs(), want)
		}
		for i, w := range want {
			e, err := tb.Entry(i)
			if err != nil || netip.AddrFrom16(e.GID) != netip.MustParseAddr(w) {
				t.Fatalf("%s: GID %d = %v (%v), want %s", d.Name(), i, netip.AddrFrom16(e.GID), err, w)
			}
			if e.Type != gid.TypeRoCEv2 {
				t.Fatalf("%s: GID %d type %v, want RoCE v2", d.Name(), i, e.Type)
			}
		}
	}
	// node and system image GUID: the EUI-64 of the MAC, as rxe's (addrconf_addr_eui48)
	for d, want := range map[*Device]uint64{da: 0x505400fffeaabb01, db: 0x505400fffeaabb02} {
		if a := d.Attr(); a.NodeGUID != want || a.SysImageGUID != want {
			t.Fatalf("%s: node GUID %#x, sys_image_guid %#x, want %#x", d.Name(), a.NodeGUID, a.SysImageGUID, want)
		}
	}
	if m := da.PortAttr().ActiveMTU; m != qp.MTU1024 {
		t.Fatalf("srv0 (MTU 1500): active MTU %v, want 1024", m)
	}
	if m := db.PortAttr().ActiveMTU; m != qp.MTU4096 {
		t.Fatalf("srv1 (MTU 9000): active MTU %v, want 4096", m)
	}
	if i := da.GIDIndex(netip.MustParseAddr("198.18.1.1")); i != 1 {
		t.Fatalf("GIDIndex(198.18.1.1) = %d, want 1", i)
	}

	// traffic between the two interface devices at srv0's active MTU
	a, b := newEnd(t, da, qp.TypeRC, 4<<20), newEnd(t, db, qp.TypeRC, 4<<20)
	a.addr, b.addr = netip.MustParseAddr("198.18.1.1"), netip.MustParseAddr("198.18.1.2")
	connect(t, a, b, da.PortAttr().ActiveMTU, 10, 20)
	const size = 10*1024 + 5
	a.fill(0, size, 0x5A)
	post(t, a, qp.SendWR{WRID: 1, Opcode: qp.WRRDMAWrite, SGL: a.sgl(0, size, 3), Flags: qp.SendSignaled,
		RemoteAddr: b.va(dst), RKey: b.mr.RKey()})
	checkWC(t, waitWC(t, a.scq, 1)[0], cq.WC{WRID: 1, Opcode: cq.OpRDMAWrite, ByteLen: size})
	same(t, "WRITE over the namespace's interfaces", b.buf[dst:dst+size], a.buf[:size])
	if s := da.Stats(); s.SentPkts < 11 {
		t.Fatalf("sent %d packets for %d bytes at MTU 1024", s.SentPkts, size)
	}
}
