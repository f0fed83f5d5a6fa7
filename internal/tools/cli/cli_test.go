package cli

import (
	"bytes"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/internal/tools/tooltest"
)

// TestParseGetopt: NewFlagSet and Parse read a command line as getopt_long does.
func TestParseGetopt(t *testing.T) {
	type vals struct {
		size, iters int
		all, freq   bool
		dev         DevFlag
		name        string
	}
	parse := func(args ...string) (vals, []string, error) {
		var v vals
		fs := NewFlagSet("t")
		fs.IntVarP(&v.size, "size", "s", 0, "")
		fs.IntVarP(&v.iters, "iters", "n", 0, "")
		fs.BoolVarP(&v.all, "all", "a", false, "")
		fs.BoolVarP(&v.freq, "CPU-freq", "F", false, "")
		fs.VarP(&v.dev, "ib-dev", "d", "")
		fs.StringVar(&v.name, "iters-name", "", "") // a name that extends another
		err := Parse(fs, args)
		return v, fs.Args(), err
	}
	for _, tc := range []struct {
		args []string
		want vals
		rest []string
	}{
		{[]string{"-s", "65536"}, vals{size: 65536}, nil},
		{[]string{"-s65536"}, vals{size: 65536}, nil},
		{[]string{"--size=65536"}, vals{size: 65536}, nil},
		{[]string{"--size", "65536"}, vals{size: 65536}, nil},
		{[]string{"-n1000", "-aF"}, vals{iters: 1000, all: true, freq: true}, nil},
		{[]string{"-aFs", "8"}, vals{size: 8, all: true, freq: true}, nil},
		{[]string{"-aFs8"}, vals{size: 8, all: true, freq: true}, nil},
		{[]string{"host", "-s", "0x10", "-d", "127.0.0.2"}, vals{size: 16, dev: DevFlag{Addr: netip.MustParseAddr("127.0.0.2")}}, []string{"host"}},
		{[]string{"--siz", "4", "--CPU"}, vals{size: 4, freq: true}, nil},
		{[]string{"--iters", "5"}, vals{iters: 5}, nil},
		{[]string{"--iters-n", "x"}, vals{name: "x"}, nil},
		{[]string{"-s", "1", "--", "-n", "2"}, vals{size: 1}, []string{"-n", "2"}},
	} {
		v, rest, err := parse(tc.args...)
		if err != nil || v != tc.want || strings.Join(rest, " ") != strings.Join(tc.rest, " ") {
			t.Errorf("%q: %+v %q %v, want %+v %q", tc.args, v, rest, err, tc.want, tc.rest)
		}
	}
	for _, args := range [][]string{
		{"-size", "5"},           // Go's single-dash long option: -s ize
		{"--i", "5"},             // ambiguous: iters, iters-name
		{"-s"},                   // value missing
		{"-s", "12abc"},          // not a number (perftest: "should be int")
		{"-x"},                   // unknown
		{"--unknown"},            // unknown
		{"-d", "224.0.0.1"},      // not a unicast address
		{"-d", "2001:db8::1%lo"}, // a zone on a global address
	} {
		if _, _, err := parse(args...); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
	if _, _, err := parse("-h"); !errors.Is(err, pflag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
	if _, _, err := parse("--help"); !errors.Is(err, pflag.ErrHelp) {
		t.Errorf("--help: %v", err)
	}
}

// TestPrintFlags: the help lists options as getopt tools do, hidden ones left out.
func TestPrintFlags(t *testing.T) {
	fs := NewFlagSet("t")
	fs.IntP("size", "s", 65536, "Size of message to exchange")
	fs.BoolP("all", "a", false, "Run sizes from 2 till 2^23")
	fs.String("daemon", "", "through the daemon on unix `socket`")
	u := NewUnsupported(fs)
	u.Bool("O", "dualport", "dual-port mode")
	var b bytes.Buffer
	PrintFlags(&b, fs)
	want := "  -s, --size=<int>       Size of message to exchange (default 65536)\n" +
		"  -a, --all              Run sizes from 2 till 2^23\n" +
		"      --daemon=<socket>  through the daemon on unix socket\n"
	if b.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", b.String(), want)
	}
	if err := Parse(fs, []string{"-O"}); err != nil || u.Given() != "-O/--dualport" {
		t.Errorf("unsupported -O: %v %q", err, u.Given())
	}
}

func TestParseAddr(t *testing.T) {
	for in, want := range map[string]string{"127.0.0.2": "127.0.0.2", "::ffff:198.18.0.1": "198.18.0.1", "2001:db8::1": "2001:db8::1",
		"fe80::1%lo": "fe80::1%lo"} {
		if a, err := ParseAddr(in); err != nil || a.String() != want {
			t.Errorf("ParseAddr(%q) = %v, %v", in, a, err)
		}
	}
	for _, in := range []string{"", "x", "0.0.0.0", "::", "224.0.0.1", "2001:db8::1%lo", "::ffff:198.18.0.1%lo"} {
		if _, err := ParseAddr(in); !errors.Is(err, ErrAddr) {
			t.Errorf("ParseAddr(%q): %v", in, err)
		}
	}
	for in, want := range map[string]string{"198.18.0.1": "198.18.0.1:4791", "198.18.0.1:7": "198.18.0.1:7",
		"[2001:db8::1]:7": "[2001:db8::1]:7", "2001:db8::1": "[2001:db8::1]:4791", "[::ffff:198.18.0.2]:9": "198.18.0.2:9"} {
		if ap, err := ParseAddrPort(in, 4791); err != nil || ap.String() != want {
			t.Errorf("ParseAddrPort(%q) = %v, %v", in, ap, err)
		}
	}
	for _, in := range []string{"", "198.18.0.1:x", "198.18.0.1:70000", "0.0.0.0:1", "host:1"} {
		if _, err := ParseAddrPort(in, 4791); err == nil {
			t.Errorf("ParseAddrPort(%q) accepted", in)
		}
	}
}

func TestDevFlag(t *testing.T) {
	var f DevFlag
	for in, want := range map[string]string{"127.0.0.2": "127.0.0.2", "::ffff:198.18.0.1": "198.18.0.1", "lo": "lo", "fd00::1": "fd00::1",
		"fe80::1%eth0": "fe80::1%eth0"} {
		if err := f.Set(in); err != nil || f.String() != want || !f.IsSet() {
			t.Errorf("Set(%q): %v, %q", in, err, f.String())
		}
	}
	for _, in := range []string{"", "0.0.0.0", "224.0.0.1", "fd00::1%lo", "a/b", "averyveryverylongname"} {
		if err := f.Set(in); err == nil {
			t.Errorf("Set(%q) accepted", in)
		}
	}
	var unset DevFlag
	if a, err := ResolveLocalAddr(&unset, netip.MustParseAddr("127.0.0.1")); err != nil || !a.IsLoopback() {
		t.Errorf("route to 127.0.0.1: %v %v", a, err)
	}
	if _, err := ResolveLocalAddr(&unset, netip.Addr{}); err == nil {
		t.Error("no -d and no peer accepted")
	}
	lo := DevFlag{Interface: "lo"}
	if a, err := ResolveLocalAddr(&lo, netip.Addr{}); err != nil || a != netip.MustParseAddr("127.0.0.1") {
		t.Errorf("lo: %v %v", a, err)
	}
	if InterfaceMTU(netip.MustParseAddr("127.0.0.1")) < 1500 {
		t.Errorf("lo MTU %d", InterfaceMTU(netip.MustParseAddr("127.0.0.1")))
	}
	for mtu, want := range map[int]qp.MTU{1500: qp.MTU1024, 9000: qp.MTU4096, 65536: qp.MTU4096, 1104: qp.MTU1024, 1103: qp.MTU512, 2128: qp.MTU2048, 0: qp.MTU4096, 300: qp.MTU256} {
		if got := ActiveMTU(mtu); got != want {
			t.Errorf("ActiveMTU(%d) = %v, want %v", mtu, got, want)
		}
	}
	d, err := OpenLocal(&DevFlag{Addr: netip.MustParseAddr("127.0.0.2")}, DevOptions{Port: tooltest.FreeUDPPort(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Dev.Close()
	if g, err := d.Dev.GID(d.GIDIndex); err != nil || g.Unmap() != d.Addr || d.MTU != qp.MTU4096 || d.GID() != netip.MustParseAddr("::ffff:127.0.0.2").As16() {
		t.Errorf("device %+v: GID(%d) = %v, %v", d, d.GIDIndex, g, err)
	}
}

func TestListenOptions(t *testing.T) {
	o, err := ListenOptions([]string{"127.0.0.1", "::ffff:127.0.0.2"})
	if err != nil || len(o.Addrs) != 2 || o.Addrs[1] != netip.MustParseAddr("127.0.0.2") {
		t.Fatalf("addresses: %+v %v", o, err)
	}
	if o, err := ListenOptions([]string{"lo"}); err != nil || o.Interface != "lo" {
		t.Fatalf("interface: %+v %v", o, err)
	}
	if _, err := ListenOptions([]string{"2001:db8::1%lo"}); err == nil {
		t.Fatal("zoned global address accepted")
	}
	// a link-local address names its interface (binding it needs the zone)
	if o, err := ListenOptions([]string{"fe80::1%lo"}); err != nil || len(o.Addrs) != 1 || o.Addrs[0] != netip.MustParseAddr("fe80::1%lo") {
		t.Fatalf("link-local with zone: %+v %v", o, err)
	}
	if o, err := ListenOptions(nil); err != nil || len(o.Addrs) == 0 {
		t.Fatalf("default (all addresses): %+v %v", o, err)
	}
}

// TestListenMTU: `softroce daemon --listen ADDR` takes the port MTU from the interfaces holding
// the addresses, the smallest one, as rxe does (1500 -> 1024, loopback's 65536 -> 4096); none
// known leaves the device default.
func TestListenMTU(t *testing.T) {
	a, b, c := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("192.0.2.9")
	mtus := map[netip.Addr]int{a: 1500, b: 65536}
	look := func(x netip.Addr) int { return mtus[x] }
	for _, tc := range []struct {
		addrs []netip.Addr
		want  qp.MTU
	}{
		{[]netip.Addr{a}, qp.MTU1024},
		{[]netip.Addr{b}, qp.MTU4096},
		{[]netip.Addr{b, a}, qp.MTU1024},
		{[]netip.Addr{c}, 0},
		{[]netip.Addr{c, b}, qp.MTU4096},
		{nil, 0},
	} {
		if got := ListenMTU(tc.addrs, look); got != tc.want {
			t.Errorf("ListenMTU(%v) = %v, want %v", tc.addrs, got, tc.want)
		}
	}
	if got := ListenMTU([]netip.Addr{netip.MustParseAddr("127.0.0.1")}, InterfaceMTU); got != qp.MTU4096 {
		t.Errorf("ListenMTU(127.0.0.1) on this host = %v, want 4096 (loopback)", got)
	}
}

// TestStrtol: the C tools' number reading (strtol(s, NULL, base), atoi).
func TestStrtol(t *testing.T) {
	for _, tc := range []struct {
		s    string
		base int
		want int64
	}{
		{"12abc", 0, 12}, {"abc", 0, 0}, {"", 10, 0}, {"0x10", 0, 16}, {"0x10", 10, 0}, {"010", 0, 8}, {"010", 10, 10},
		{" -7", 10, -7}, {"+3x", 0, 3}, {"0x", 0, 0}, {"08", 0, 0}, {"99999999999999999999999", 10, 1 << 62}, {"0XfF", 0, 255},
	} {
		if got := Strtol(tc.s, tc.base); got != tc.want {
			t.Errorf("Strtol(%q, %d) = %d, want %d", tc.s, tc.base, got, tc.want)
		}
	}
}

// TestOpenLocalGIDIndex: with -d IFNAME, a GID index picks the interface's GID of that index as
// kernel rxe's table lists it (gid.FromInterface: on lo 0 is the unbound link-local GID, 1 is
// 127.0.0.1) and the device opens on the whole interface so the index is the same; an index
// past the table, or the link-local GID the interface does not have, is refused; with -d ADDR
// the index is the address's own.
func TestOpenLocalGIDIndex(t *testing.T) {
	lo := DevFlag{Interface: "lo"}
	d, err := OpenLocal(&lo, DevOptions{Port: tooltest.FreeUDPPort(t), GIDIndex: 1, ByGIDIndex: true})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Dev.Close()
	if d.GIDIndex != 1 || d.Addr != netip.MustParseAddr("127.0.0.1") || d.Dev.GIDIndex(d.Addr) != 1 {
		t.Fatalf("lo GID index 1: %v at %d (device's index %d)", d.Addr, d.GIDIndex, d.Dev.GIDIndex(d.Addr))
	}
	if g, err := d.Dev.GID(0); err != nil || !g.IsLinkLocalUnicast() {
		t.Fatalf("GID 0 %v (%v): want rxe's link-local GID", g, err)
	}
	for _, idx := range []int{0, d.Dev.GIDTable().Len()} {
		if d2, err := OpenLocal(&lo, DevOptions{Port: tooltest.FreeUDPPort(t), GIDIndex: idx, ByGIDIndex: true}); !errors.Is(err, ErrDev) {
			if d2 != nil {
				d2.Dev.Close()
			}
			t.Errorf("GID index %d of lo: %v, want ErrDev", idx, err)
		}
	}
	a, err := OpenLocal(&DevFlag{Addr: netip.MustParseAddr("127.0.0.2")}, DevOptions{Port: tooltest.FreeUDPPort(t), GIDIndex: 3, ByGIDIndex: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Dev.Close()
	if a.Addr != netip.MustParseAddr("127.0.0.2") || a.GIDIndex != a.Dev.GIDIndex(a.Addr) {
		t.Fatalf("-d ADDR with an index: %v at %d", a.Addr, a.GIDIndex)
	}
}
