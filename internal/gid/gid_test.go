package gid

import (
	"errors"
	"net"
	"net/netip"
	"testing"
)

func TestLinkLocalFromMAC(t *testing.T) {
	cases := []struct{ mac, want string }{
		{"52:54:00:12:34:56", "fe80::5054:ff:fe12:3456"}, // QEMU default NIC
		{"02:00:00:00:00:01", "fe80::ff:fe00:1"},         // U/L bit set -> cleared
		{"00:00:00:00:00:00", "fe80::200:ff:fe00:0"},     // loopback
	}
	for _, c := range cases {
		mac, err := net.ParseMAC(c.mac)
		if err != nil {
			t.Fatal(err)
		}
		if got := LinkLocalFromMAC(mac); got != netip.MustParseAddr(c.want) {
			t.Errorf("%s: %v, want %s", c.mac, got, c.want)
		}
	}
	if got := LinkLocalFromMAC(nil); got != netip.MustParseAddr("fe80::200:ff:fe00:0") {
		t.Errorf("nil MAC: %v", got)
	}
}

func TestActiveMTU(t *testing.T) {
	cases := map[int]int{
		1500: 1024, 9000: 4096, 65536: 4096, 1280: 1024, 1104: 1024, 1103: 512,
		1079: 512, 2128: 2048, 2127: 1024, 4176: 4096, 4175: 2048, 336: 256, 200: 256, 0: 256,
	}
	for netdev, want := range cases {
		if got := ActiveMTU(netdev); got != want {
			t.Errorf("ActiveMTU(%d) = %d, want %d", netdev, got, want)
		}
	}
	for e := uint8(1); e <= 5; e++ {
		if MTUEnum(MTUBytes(e)) != e {
			t.Errorf("enum %d round trip", e)
		}
	}
	if MTUEnum(1500) != 0 || MTUBytes(0) != 0 || MTUBytes(6) != 0 {
		t.Error("invalid MTUs must map to 0")
	}
}

func TestFromAddrsOrder(t *testing.T) {
	mac, _ := net.ParseMAC("52:54:00:12:34:56")
	ip := netip.MustParseAddr
	tb := FromAddrs(Options{MAC: mac, MTU: 9000, Addrs: []netip.Addr{
		ip("2001:db8::1"), ip("198.18.0.1"), ip("fe80::1234"), ip("::ffff:198.18.0.2"),
		ip("198.18.0.1"), ip("fd00::7"),
	}})
	want := []string{"fe80::5054:ff:fe12:3456", "::ffff:198.18.0.1", "::ffff:198.18.0.2", "2001:db8::1", "fd00::7"}
	if tb.Len() != len(want) {
		t.Fatalf("%d entries %v, want %v", tb.Len(), tb.Entries(), want)
	}
	for i, w := range want {
		e, err := tb.Entry(i)
		if err != nil {
			t.Fatal(err)
		}
		if netip.AddrFrom16(e.GID) != ip(w) || e.Type != TypeRoCEv2 {
			t.Errorf("entry %d = %v (%v), want %s", i, netip.AddrFrom16(e.GID), e.Type, w)
		}
		if e.Addr.Is4() != (i == 1 || i == 2) {
			t.Errorf("entry %d Addr %v: IPv4 GIDs must carry the 4-byte address", i, e.Addr)
		}
		if idx, err := tb.Index(e.Addr); err != nil || idx != i {
			t.Errorf("Index(%v) = %d, %v; want %d", e.Addr, idx, err, i)
		}
		if idx, err := tb.IndexGID(e.GID); err != nil || idx != i {
			t.Errorf("IndexGID(%v) = %d, %v", e.GID, idx, err)
		}
	}
	if i, err := tb.Index(ip("::ffff:198.18.0.2")); i != 2 || err != nil {
		t.Errorf("mapped lookup: %d %v", i, err)
	}
	if _, err := tb.Index(ip("198.18.9.9")); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown IP: %v", err)
	}
	if _, err := tb.Entry(5); !errors.Is(err, ErrNotFound) {
		t.Errorf("entry out of range: %v", err)
	}
	if _, err := tb.Entry(-1); !errors.Is(err, ErrNotFound) {
		t.Errorf("entry -1: %v", err)
	}
	if tb.ActiveMTU() != 4096 {
		t.Errorf("ActiveMTU %d", tb.ActiveMTU())
	}
	addrs := tb.Addrs()
	if len(addrs) != 4 || addrs[0] != ip("198.18.0.1") || addrs[2] != ip("2001:db8::1") {
		t.Errorf("Addrs %v", addrs)
	}
}

// TestFromAddrsLinkLocal: a link-local address counts only with its zone (binding it needs
// the interface); the MAC's makes the index-0 GID bindable, another one is appended after the
// other IPv6 GIDs, as ib_core adds every address of a netdev.
func TestFromAddrsLinkLocal(t *testing.T) {
	mac, _ := net.ParseMAC("52:54:00:18:00:01")
	ip := netip.MustParseAddr
	tb := FromAddrs(Options{MAC: mac, Addrs: []netip.Addr{
		ip("fe80::5054:ff:fe18:1%rxetap0"), ip("fe80::7"), ip("fe80::8%rxetap0"), ip("198.18.0.1"), ip("2001:db8:198:18::1"),
	}})
	want := []string{"fe80::5054:ff:fe18:1%rxetap0", "198.18.0.1", "2001:db8:198:18::1", "fe80::8%rxetap0"}
	if tb.Len() != len(want) {
		t.Fatalf("%d entries %v, want %v", tb.Len(), tb.Entries(), want)
	}
	for i, w := range want {
		e, _ := tb.Entry(i)
		if e.Addr != ip(w) || netip.AddrFrom16(e.GID) != ip(w).WithZone("").Unmap() && !ip(w).Is4() {
			t.Errorf("entry %d = %v (GID %v), want %s", i, e.Addr, netip.AddrFrom16(e.GID), w)
		}
		if j, err := tb.Index(ip(w).WithZone("")); j != i || err != nil {
			t.Errorf("Index(%s) = %d, %v", w, j, err)
		}
	}
	if got := tb.Addrs(); len(got) != 4 || got[0] != ip("fe80::5054:ff:fe18:1%rxetap0") {
		t.Errorf("Addrs %v: want every entry, the link-local ones with their zone", got)
	}
	// without the zone the index-0 GID stays unbindable
	tb = FromAddrs(Options{MAC: mac, Addrs: []netip.Addr{ip("fe80::5054:ff:fe18:1"), ip("198.18.0.1")}})
	if got := tb.Addrs(); len(got) != 1 || got[0] != ip("198.18.0.1") || tb.Len() != 2 {
		t.Errorf("unzoned link-local: Addrs %v, entries %v", got, tb.Entries())
	}
}

func TestFromAddrsDefaults(t *testing.T) {
	tb := FromAddrs(Options{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}})
	if tb.NetdevMTU != 1500 || tb.ActiveMTU() != 1024 {
		t.Fatalf("default MTU %d -> %d", tb.NetdevMTU, tb.ActiveMTU())
	}
	e, _ := tb.Entry(0)
	if netip.AddrFrom16(e.GID) != netip.MustParseAddr("fe80::200:ff:fe00:0") {
		t.Fatalf("index 0 without MAC: %v", e.Addr)
	}
}

func TestIndexZeroAlloc(t *testing.T) {
	tb := FromAddrs(Options{Addrs: []netip.Addr{netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("2001:db8::1")}})
	a := netip.MustParseAddr("2001:db8::1")
	if n := testing.AllocsPerRun(100, func() { tb.Index(a) }); n != 0 {
		t.Fatalf("Index allocates %v", n)
	}
}

func FuzzIndex(f *testing.F) {
	f.Add([]byte{198, 18, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		ip, ok := netip.AddrFromSlice(b)
		if !ok {
			return
		}
		tb := FromAddrs(Options{Addrs: []netip.Addr{ip}})
		i, err := tb.Index(ip)
		if ip.Unmap().Is6() && ip.Unmap().IsLinkLocalUnicast() {
			return
		}
		if err != nil || i < 1 {
			t.Fatalf("%v not found (%d, %v)", ip, i, err)
		}
	})
}

func TestGUIDFromMAC(t *testing.T) {
	cases := []struct {
		mac  string
		want uint64
	}{
		{"52:54:00:12:34:56", 0x505400fffe123456}, // what rxe on QEMU's NIC reports: 5054:00ff:fe12:3456
		{"02:00:00:00:00:01", 0x000000fffe000001},
		{"00:00:00:00:00:00", 0x020000fffe000000}, // rxe on loopback: 0200:00ff:fe00:0000
	}
	for _, c := range cases {
		mac, err := net.ParseMAC(c.mac)
		if err != nil {
			t.Fatal(err)
		}
		got := GUIDFromMAC(mac)
		if got != c.want {
			t.Errorf("%s: %#x, want %#x", c.mac, got, c.want)
		}
		// the index-0 GID's interface identifier is the GUID, as in rxe's table
		g := FromAddrs(Options{MAC: mac}).entries[0].GID
		if id := uint64(g[8])<<56 | uint64(g[9])<<48 | uint64(g[10])<<40 | uint64(g[11])<<32 |
			uint64(g[12])<<24 | uint64(g[13])<<16 | uint64(g[14])<<8 | uint64(g[15]); id != got {
			t.Errorf("%s: GID 0 interface id %#x, GUID %#x", c.mac, id, got)
		}
	}
	if got := FromAddrs(Options{}).GUID(); got != 0x020000fffe000000 {
		t.Errorf("no MAC: %#x", got)
	}
}
