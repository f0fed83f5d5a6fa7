package daemon_test

import (
	"testing"
	"time"

	"github.com/softroce/softroce/pkg/cq"
	"github.com/softroce/softroce/pkg/event"
	"github.com/softroce/softroce/pkg/qp"
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
	e := &end{v: c, iova: 0x10000, wc: make([]cq.WC, 8), timeout: 12}
	var err error
	if e.pd, err = c.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if e.cq, err = c.CreateCQ(1); err != nil { // ring of 1 + engine CQ of 1: the third completion overruns
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
	timeout := time.After(waitLimit)
	for {
		select {
		case ev := <-c.Events():
			if ev.Type != event.CQErr {
				continue // e.g. the QP's own events
			}
			if ev.Object != e.cq {
				t.Fatalf("CQ_ERR with object %v, want the client's CQ", ev.Object)
			}
			select {
			case ev := <-other.Events():
				t.Fatalf("another client got %v", ev.Type)
			default:
			}
			return
		case <-timeout:
			t.Fatal("no CQ_ERR event reached the client")
		}
	}
}
