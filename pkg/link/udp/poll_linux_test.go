package udp

import (
	"net/netip"
	"testing"

	"github.com/softroce/softroce/pkg/link/internal/linktest"
)

// TestTryRecv: linktest.TryRecv over plain sockets and GRO sockets whose segments come back
// as views.
func TestTryRecv(t *testing.T) {
	a, b := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	for _, kind := range []string{"udp", "udp-gro"} {
		t.Run(kind, func(t *testing.T) {
			tx := listenTB(t, Options{Addrs: []netip.Addr{a}, AnyPort: true})
			rx := listenTB(t, Options{Addrs: []netip.Addr{b}, AnyPort: true, GRO: kind == "udp-gro"})
			linktest.TryRecv(t, tx, rx, rx.LocalAddrPorts()[0])
		})
	}
}
