package roce

import (
	"net/netip"
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/netnstest"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/afxdp"
	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/link/udp"
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
				if l, err = mem.NewNetwork(mem.Options{}).Attach(addrA); err != nil {
					b.Fatal(err)
				}
			case "xdp":
				x, _ := netnstest.Veth(b, "srpa", "198.18.7.1/24", "srpb", "198.18.7.2/24", 1500)
				l = listenXDP(b, x, "198.18.7.1")
			}
			d := openPolled(b, l)
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

// BenchmarkPolledRoundTripXDP is BenchmarkPolledRoundTrip through the AF_XDP path (root: two
// namespaces on a veth pair; each WRITE and ACK is a frame through the kernel's veth and generic
// XDP hook into the peer's ring): the host's version of the lab's `perf --busy-poll --xdp`
// 8-byte WRITE latency, one round trip per op.
func BenchmarkPolledRoundTripXDP(b *testing.B) {
	x, y := netnstest.Veth(b, "srpa", "198.18.7.1/24", "srpb", "198.18.7.2/24", 1500)
	var devs [2]*Device
	for i, s := range []struct {
		th *netnstest.Thread
		a  string
	}{{x, "198.18.7.1"}, {y, "198.18.7.2"}} {
		devs[i] = openPolled(b, listenXDP(b, s.th, s.a))
	}
	da, db := devs[0], devs[1]
	x1, y1 := newEnd(b, da, qp.TypeRC, 1<<12), newEnd(b, db, qp.TypeRC, 1<<12)
	connect(b, x1, y1, qp.MTU1024, 1, 2)
	wx, wy := []qp.SendWR{writeWR(x1, y1, 1, 0)}, []qp.SendWR{writeWR(y1, x1, 2, 64)}
	var wc [4]cq.WC
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		pingPongRound(b, i, x1, y1, da, db, wx, wy, wc[:])
	}
}

// pingPongRound is round i of ib_write_lat's loop between two polled devices: x posts wx, y
// polls until the WRITE lands (and, from round 1 on, its own previous WRITE completes), y posts
// wy, x polls until that lands and its WRITE completes. It allocates nothing.
func pingPongRound(tb testing.TB, i int, x, y *end, da, db *Device, wx, wy []qp.SendWR, wc []cq.WC) {
	if _, err := x.qp.PostSend(wx); err != nil {
		tb.Fatal(err)
	}
	w := y.qp.RemoteWrites() + 1
	for y.qp.RemoteWrites() != w {
		pollOrFail(tb, db)
	}
	for i > 0 && y.scq.Poll(wc) == 0 {
		pollOrFail(tb, db)
	}
	if _, err := y.qp.PostSend(wy); err != nil {
		tb.Fatal(err)
	}
	w = x.qp.RemoteWrites() + 1
	for x.qp.RemoteWrites() != w {
		pollOrFail(tb, da)
	}
	for x.scq.Poll(wc) == 0 {
		pollOrFail(tb, da)
	}
}

func pollOrFail(tb testing.TB, d *Device) {
	if _, err := d.Poll(); err != nil {
		tb.Fatal(err)
	}
}

// listenXDP opens a UDP link with the AF_XDP path on addr inside th's namespace (root).
func listenXDP(tb testing.TB, th *netnstest.Thread, addr string) link.Link {
	tb.Helper()
	var l link.Link
	if err := th.Do(func() (err error) {
		l, err = afxdp.Open(afxdp.Options{UDP: udp.Options{Addrs: []netip.Addr{netip.MustParseAddr(addr)}}})
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	return l
}

// openPolled opens a polled device on l, closed when the test ends.
func openPolled(tb testing.TB, l link.Link) *Device {
	tb.Helper()
	d, err := Open(Options{Link: l, Polled: true})
	if err != nil {
		l.Close()
		tb.Fatal(err)
	}
	tb.Cleanup(func() { d.Close() })
	return d
}
