package roce

import (
	"net/netip"
	"testing"

	"github.com/softroce/softroce/internal/netnstest"
	"github.com/softroce/softroce/pkg/roce/link"
)

// BenchmarkPollEmpty: one Device.Poll with nothing to read and nothing queued — the spin of a
// polled application's wait loop (perf --busy-poll between the peer's WRITEs), on the in-memory
// link and on the AF_XDP path (an empty receive ring; root: a namespace with a veth pair). The
// device reads its link directly (no test wrapper).
func BenchmarkPollEmpty(b *testing.B) {
	for _, kind := range []string{"mem", "xdp"} {
		b.Run(kind, func(b *testing.B) {
			var l link.Link
			switch kind {
			case "mem":
				var err error
				if l, err = link.NewMemNetwork(link.MemOptions{}).Attach(addrA); err != nil {
					b.Fatal(err)
				}
			case "xdp":
				x, _ := netnstest.Veth(b, "srpa", "198.18.7.1/24", "srpb", "198.18.7.2/24", 1500)
				if err := x.Do(func() (err error) {
					l, err = link.ListenUDP(link.UDPOptions{Addrs: []netip.Addr{netip.MustParseAddr("198.18.7.1")}, XDP: link.XDPOptions{On: true}})
					return err
				}); err != nil {
					b.Fatal(err)
				}
			}
			d, err := Open(Options{Link: l, Polled: true})
			if err != nil {
				l.Close()
				b.Fatal(err)
			}
			defer d.Close()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if n, err := d.Poll(); n != 0 || err != nil {
					b.Fatalf("Poll = %d, %v on an idle link", n, err)
				}
			}
		})
	}
}
