package udp

import (
	"net/netip"
	"testing"

	"go.uber.org/goleak"

	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/internal/linktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pair is two links of the shared suite.
type pair = linktest.Pair

// Variants of the shared suite.
const (
	varUDP    = "udp"     // one IPv4 socket per link on 127.0.0.1 / 127.0.0.2
	varUDPGSO = "udp-gso" // the same with GSO forced on and GRO on
	varUDP6   = "udp6"    // IPv6 on ::1 (GSO on by default for IPv6)
	varMulti  = "udp-multi"
)

// TestSuite runs the shared suite (linktest) over the UDP set-ups.
func TestSuite(t *testing.T) {
	var vs []linktest.Variant
	for _, v := range []string{varUDP, varUDPGSO, varUDP6, varMulti} {
		vs = append(vs, linktest.Variant{Name: v, New: func(tb testing.TB) *pair { return genTestPair(tb, v) }})
	}
	linktest.Run(t, vs...)
}

func genTestPair(tb testing.TB, variant string) *pair {
	tb.Helper()
	ip := netip.MustParseAddr
	switch variant {
	case varUDP, varUDPGSO:
		o := Options{AnyPort: true}
		if variant == varUDPGSO {
			o.GSO, o.GRO = GSOOn, true
		}
		oa, ob := o, o
		oa.Addrs, ob.Addrs = []netip.Addr{ip("127.0.0.1")}, []netip.Addr{ip("127.0.0.2")}
		a, b := listenTB(tb, oa), listenTB(tb, ob)
		return &pair{A: a, B: b, AAddr: a.LocalAddrPorts()[0], BAddr: b.LocalAddrPorts()[0], MaxPayload: 65507}
	case varUDP6:
		a := listenTB(tb, Options{Addrs: []netip.Addr{ip("::1")}, AnyPort: true, GRO: true})
		b := listenTB(tb, Options{Addrs: []netip.Addr{ip("::1")}, AnyPort: true, GRO: true})
		return &pair{A: a, B: b, AAddr: a.LocalAddrPorts()[0], BAddr: b.LocalAddrPorts()[0],
			MaxPayload: 65536 - 40 - 8} // lo's MTU with DF: no IPv6 fragments
	case varMulti:
		a := listenTB(tb, Options{Addrs: []netip.Addr{ip("127.0.0.3"), ip("127.0.0.4")}, AnyPort: true})
		b := listenTB(tb, Options{Addrs: []netip.Addr{ip("127.0.0.5"), ip("127.0.0.6")}, AnyPort: true})
		return &pair{A: a, B: b, AAddr: a.LocalAddrPorts()[1], BAddr: b.LocalAddrPorts()[1], MaxPayload: 65507}
	}
	tb.Fatalf("unknown variant %q", variant)
	return nil
}

func listenTB(tb testing.TB, o Options) *Link {
	tb.Helper()
	l, err := Listen(o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	return l
}

func recvN(t testing.TB, l link.Link, n, batch int) []link.Datagram {
	t.Helper()
	return linktest.RecvN(t, l, n, batch)
}

func recvBufs(n int) []link.Datagram { return linktest.RecvBufs(n) }

// udpStats is Stats under another name, so that allStats can embed it next to link.Stats.
type udpStats Stats

// allStats are both sets of a link's counters, its fields promoted.
type allStats struct {
	link.Stats
	udpStats
}

func statsOf(l *Link) allStats { return allStats{l.Stats(), udpStats(l.UDPStats())} }
