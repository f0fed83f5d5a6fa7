package roce

import (
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/mem"
)

// TestPolledClockReadsPerRoundTrip: a polled ping-pong of 8-byte WRITEs (ib_write_lat's loop)
// reads the clock 4 times per round trip: each side's PostSend (its ACK timer starts, IBTA
// 9.7.6.1.3) and each side's Poll that reads the peer's [ACK, WRITE]. The Poll that flushes
// what the previous one deferred reads none: the application's PostSend sent the deferred ACK
// and started the timer already (qp.QP.FlushDeferred).
func TestPolledClockReadsPerRoundTrip(t *testing.T) {
	nw := mem.NewNetwork(mem.Options{QueueDepth: 16})
	clk := &countClock{Clock: qp.NewManualClock(time.Unix(1000, 0))}
	open := func(a link.Link) *Device {
		d, err := Open(Options{Link: a, Polled: true, Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	l1, _ := nw.Attach(addrA)
	l2, _ := nw.Attach(addrB)
	da, db := open(l1), open(l2)
	x, y := newEnd(t, da, qp.TypeRC, 1<<12), newEnd(t, db, qp.TypeRC, 1<<12)
	connect(t, x, y, qp.MTU1024, 1, 2)
	wx, wy := []qp.SendWR{writeWR(x, y, 1, 0)}, []qp.SendWR{writeWR(y, x, 2, 64)}
	var wc [4]cq.WC
	round := func(i int) { pingPongRound(t, i, x, y, da, db, wx, wy, wc[:]) }
	for i := 0; i < 4; i++ {
		round(i)
	}
	const rounds = 50
	base := clk.n.Load()
	for i := 4; i < 4+rounds; i++ {
		round(i)
	}
	if got := clk.n.Load() - base; got != 4*rounds {
		t.Fatalf("%d clock reads in %d round trips, want %d (4 per round trip)", got, rounds, 4*rounds)
	}
}
