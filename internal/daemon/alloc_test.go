package daemon_test

import (
	"net/netip"
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/link/udp"
)

// TestDataPathZeroAlloc: a client's post (encode, post ring, the
// daemon's decode and PostSend, the engine's packets on both daemons) and
// its completion (push hook into the ring, Poll from shared memory) allocate
// nothing, measured over the whole process (client and both daemons);
// waiting on the channel, and with Wait on a moderated CQ (count 2, so the
// period timer runs too).
func TestDataPathZeroAlloc(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation counts")
	}
	for _, useWait := range []bool{false, true} {
		t.Run(map[bool]string{false: "channel", true: "wait-moderated"}[useWait], func(t *testing.T) {
			dataPathZeroAlloc(t, useWait)
		})
	}
}

func dataPathZeroAlloc(t *testing.T, useWait bool) {
	// UDP loopback (the in-memory link allocates per datagram).
	ipA, ipB := loopbackPair(2)
	la, err := udp.Listen(udp.Options{Addrs: []netip.Addr{ipA}})
	if err != nil {
		t.Skip(err)
	}
	lb, err := udp.Listen(udp.Options{Addrs: []netip.Addr{ipB}})
	if err != nil {
		t.Skip(err)
	}
	da, db := startDaemon(t, la, "a", 0), startDaemon(t, lb, "b", 0)
	a := newEnd(t, da.dial(t), 1<<16, 16, rcAccess)
	b := newEnd(t, db.dial(t), 1<<16, 16, rcAccess)
	a.connect(t, ipB, b.q.Num(), 1)
	b.connect(t, ipA, a.q.Num(), 1)
	wr := []qp.SendWR{{WRID: 1, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
		SGL: []qp.SGE{{Addr: a.iova, Length: 1 << 16, LKey: a.m.LKey()}}, RemoteAddr: b.iova, RKey: b.m.RKey()},
		{WRID: 3, Opcode: qp.WRSend, Flags: qp.SendSignaled, SGL: []qp.SGE{{Addr: a.iova, Length: 64, LKey: a.m.LKey()}}}}
	recv := []qp.RecvWR{{WRID: 2, SGL: []qp.SGE{{Addr: b.iova, Length: 64, LKey: b.m.LKey()}}}}
	wcs := make([]cq.WC, 4)
	if useWait {
		for _, e := range []*end{a, b} {
			if err := e.v.ModifyCQ(e.cq, cq.Moderation{Count: 2, PeriodUS: 100}); err != nil {
				t.Fatal(err)
			}
		}
	}
	wait := func(e *end, n int) {
		for n > 0 {
			k := e.cq.Poll(wcs)
			if k == 0 {
				e.cq.ReqNotify(false)
				if k = e.cq.Poll(wcs); k == 0 {
					if useWait {
						if err := e.cq.Wait(); err != nil {
							t.Fatal(err)
						}
					} else {
						<-e.cq.Channel()
					}
					continue
				}
			}
			for _, wc := range wcs[:k] {
				if wc.Status != cq.StatusSuccess {
					t.Fatalf("completion %+v", wc)
				}
			}
			n -= k
		}
	}
	step := func() {
		if _, err := b.q.PostRecv(recv); err != nil {
			t.Fatal(err)
		}
		if _, err := a.q.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		wait(a, 2)
		wait(b, 1)
	}
	for i := 0; i < 50; i++ { // warm up: buffers grow, timers exist
		step()
	}
	if n := testing.AllocsPerRun(200, step); n > 0.05 {
		t.Fatalf("%.2f allocations per post (64 KiB WRITE + SEND, RECV) through the daemon", n)
	}
}
