package daemon_test

import (
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/event"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/roce"
)

// TestEventsForwarded: an asynchronous event of a client's object reaches
// that client's Events channel with the client's own object (a CQ overrun,
// IBTA 11.4.2.1: CQ_ERR), and no other client's.
func TestEventsForwarded(t *testing.T) {
	da, db := memPair(t)
	c := da.dial(t)
	other := da.dial(t)
	p := newEnd(t, db.dial(t), 1<<16, 8, rcAccess)
	e := overrunCQ(t, c, p)
	waitCQErr(t, c, e)
	select {
	case ev := <-other.Events():
		t.Fatalf("another client got %v", ev.Type)
	default:
	}
}

// TestEventsThroughVerbs: roce.Verbs.Events delivers the same CQ_ERR to a
// program in both modes (ibv_get_async_event), embedded and through the daemon.
func TestEventsThroughVerbs(t *testing.T) {
	for _, mode := range []string{"embedded", "daemon"} {
		t.Run(mode, func(t *testing.T) {
			nw := mem.NewNetwork(mem.Options{QueueDepth: 8192})
			la, _ := nw.Attach(ipA)
			lb, _ := nw.Attach(ipB)
			db := startDaemon(t, lb, "b", 0)
			var v roce.Verbs
			if mode == "embedded" {
				devA, err := roce.Open(roce.Options{Link: la})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { devA.Close() })
				v = devA.Verbs()
			} else {
				v = startDaemon(t, la, "a", 0).dial(t)
			}
			p := newEnd(t, db.dial(t), 1<<16, 8, rcAccess)
			waitCQErr(t, v, overrunCQ(t, v, p))
		})
	}
}

// overrunCQ makes an RC end on c whose CQ holds one completion (ring of 1 +
// engine CQ of 1 through the daemon), connects it to p and posts three
// signaled WRITEs to p, so the CQ overruns.
func overrunCQ(t *testing.T, c roce.Verbs, p *end) *end {
	t.Helper()
	e := &end{v: c, iova: 0x10000, wc: make([]cq.WC, 8), timeout: 12}
	var err error
	if e.pd, err = c.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if e.cq, err = c.CreateCQ(1); err != nil {
		t.Fatal(err)
	}
	if e.buf, err = c.AllocBuffer(1 << 16); err != nil {
		t.Fatal(err)
	}
	if e.m, err = c.RegMR(e.pd, e.buf, e.iova, rcAccess); err != nil {
		t.Fatal(err)
	}
	if e.q, err = c.CreateQP(roce.VerbsQPInit{Type: qp.TypeRC, PD: e.pd, SendCQ: e.cq, RecvCQ: e.cq,
		Cap: qp.Cap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		t.Fatal(err)
	}
	e.connect(t, ipB, p.q.Num(), 1)
	p.connect(t, ipA, e.q.Num(), 1)
	for i := 0; i < 3; i++ {
		e.write(t, uint64(i), i*1024, 1024, p, i*1024)
	}
	return e
}

// waitCQErr waits for c's CQ_ERR event naming e's CQ (other events, e.g. the
// QP's own, are skipped).
func waitCQErr(t *testing.T, c roce.Verbs, e *end) {
	t.Helper()
	timeout := time.After(waitLimit)
	for {
		select {
		case ev := <-c.Events():
			if ev.Type != event.CQErr {
				continue
			}
			if ev.Object != e.cq {
				t.Fatalf("CQ_ERR with object %v, want the program's CQ", ev.Object)
			}
			return
		case <-timeout:
			t.Fatal("no CQ_ERR event reached the program")
		}
	}
}
