package roce

import (
	"net/netip"
	"testing"

	"github.com/softroce/softroce/pkg/link"
)

// TestPortableTrafficClass: the portable sockets (UDPOptions.Portable) send each datagram's
// traffic class and report the one a datagram arrived with (IP_RECVTOS / IPV6_RECVTCLASS), the
// ECN field included: a CE mark reaches the engine on this path too.
func TestPortableTrafficClass(t *testing.T) {
	for _, a := range []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")} {
		tx, err := listenStdUDP([]netip.Addr{a}, 0)
		if err != nil {
			t.Skip("no socket on", a, err)
		}
		rx, err := listenStdUDP([]netip.Addr{a}, 0)
		if err != nil {
			tx.Close()
			t.Fatal(err)
		}
		classes := []uint8{link.ECNECT0, link.ECNCE, 0, 0xB8 | link.ECNCE}
		for i, c := range classes {
			d := link.Datagram{Buf: []byte{byte(i), 1, 2, 3}, Src: tx.locals[0], Dst: rx.locals[0], TClass: c}
			if err := tx.Send([]link.Datagram{d}); err != nil {
				t.Fatal(err)
			}
			in := []link.Datagram{{Buf: make([]byte, 64)}}
			if n, err := rx.Recv(in); n != 1 || err != nil {
				t.Fatal(n, err)
			}
			if in[0].Buf[0] != byte(i) || in[0].TClass != c || in[0].CE() != (c&3 == 3) {
				t.Fatalf("%v: datagram %d sent with %#x arrived with %#x", a, i, c, in[0].TClass)
			}
		}
		tx.Close()
		rx.Close()
	}
}
