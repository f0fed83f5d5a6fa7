package qp

import (
	"sync"
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/event"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/pkg/bth"
)

// evLog records affiliated events.
type evLog struct {
	mu sync.Mutex
	ev []event.Type
}

func (l *evLog) sink(e event.Event) {
	l.mu.Lock()
	l.ev = append(l.ev, e.Type)
	l.mu.Unlock()
}

func (l *evLog) types() []event.Type {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]event.Type(nil), l.ev...)
}

// evPair is rcPair with event logs and CQ capacities per side.
func evPair(t *testing.T, capA, capB int, o connOpts) (*net, *side, *side, *evLog, *evLog) {
	n := newNet(t)
	la, lb := &evLog{}, &evLog{}
	a := n.newSide("10.0.0.1", sideOpts{qpn: 0x11, events: la.sink, cqCap: capA})
	b := n.newSide("10.0.0.2", sideOpts{qpn: 0x12, events: lb.sink, cqCap: capB})
	n.connect(a, b, o)
	return n, a, b, la, lb
}

func sameEvents(t *testing.T, who string, got []event.Type, want ...event.Type) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s events %v, want %v", who, got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%s events %v, want %v", who, got, want)
		}
	}
}

// TestCQOverrun: a completion the CQ cannot hold (IBTA 11.4.2: overrun)
// makes the QP raise QP_FATAL and enter ERR, on the responder (receive
// CQ) and on the requester (send CQ); nothing is left armed.
func TestCQOverrun(t *testing.T) {
	t.Run("receive CQ", func(t *testing.T) {
		n, a, b, _, lb := evPair(t, 0, 1, connOpts{retry: 1, timeout: 8})
		b.postRecv(t, RecvWR{WRID: 1, SGL: []SGE{b.sge(0, 64)}}, RecvWR{WRID: 2, SGL: []SGE{b.sge(64, 64)}})
		a.postSend(t, SendWR{WRID: 10, Opcode: WRSend, SGL: []SGE{a.sge(0, 8)}, Flags: SendSignaled},
			SendWR{WRID: 11, Opcode: WRSend, SGL: []SGE{a.sge(0, 8)}, Flags: SendSignaled})
		n.pump()
		sameEvents(t, "responder", lb.types(), event.QPFatal)
		if b.qp.State() != StateErr {
			t.Fatalf("responder state %v", b.qp.State())
		}
		expectWC(t, pollAll(b.rcq), cq.WC{WRID: 1, Opcode: cq.OpRecv, ByteLen: 8})
		// the second SEND was placed and ACKed before its completion was refused
		expectWC(t, pollAll(a.scq), cq.WC{WRID: 10, Opcode: cq.OpSend, ByteLen: 8}, cq.WC{WRID: 11, Opcode: cq.OpSend, ByteLen: 8})
		// the requester's timer may still be pending (armTimerAt is lazy): firing, it finds
		// nothing outstanding and arms nothing
		if dl, ok := n.clk.NextDeadline(); ok {
			n.clk.Advance(dl.Sub(n.clk.Now()))
			n.pump()
		}
		if n.clk.Pending() != 0 {
			t.Fatal("timer armed")
		}
	})
	t.Run("send CQ", func(t *testing.T) {
		n, a, b, la, _ := evPair(t, 1, 0, connOpts{})
		a.postSend(t, a.write(1, 0, 8, b.va(0), b.mr.RKey(), SendSignaled), a.write(2, 0, 8, b.va(0), b.mr.RKey(), SendSignaled),
			a.write(3, 0, 8, b.va(0), b.mr.RKey(), SendSignaled))
		n.pump()
		sameEvents(t, "requester", la.types(), event.QPFatal)
		if a.qp.State() != StateErr || n.clk.Pending() != 0 {
			t.Fatalf("requester state %v, %d timers", a.qp.State(), n.clk.Pending())
		}
		expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpRDMAWrite, ByteLen: 8})
	})
}

// TestResponderErrorEvents: a responder that NAKs and enters ERR raises
// the affiliated event of the error class (IBTA 11.6.3.1): invalid
// request -> QP_REQ_ERR, remote access -> QP_ACCESS_ERR, remote
// operational -> QP_FATAL; the requester reports through its completion.
func TestResponderErrorEvents(t *testing.T) {
	cases := []struct {
		name string
		o    connOpts
		wr   func(a, b *side) SendWR
		ev   event.Type
		st   cq.Status
	}{
		{"invalid request", connOpts{accessB: mr.AccessLocalWrite}, func(a, b *side) SendWR {
			return a.write(1, 0, 8, b.va(0), b.mr.RKey(), SendSignaled)
		}, event.QPReqErr, cq.StatusRemInvReqErr},
		{"remote access", connOpts{}, func(a, b *side) SendWR {
			return a.write(1, 0, 8, b.va(0), b.mr.RKey()^0xFF, SendSignaled)
		}, event.QPAccessErr, cq.StatusRemAccessErr},
		{"remote operational", connOpts{}, func(a, b *side) SendWR {
			b.postRecv(t, RecvWR{WRID: 5, SGL: []SGE{b.sge(0, 64)}})
			return SendWR{WRID: 1, Opcode: WRSendWithInv, SGL: []SGE{a.sge(0, 8)}, Flags: SendSignaled, InvRKey: 0x12345600}
		}, event.QPFatal, cq.StatusRemOpErr},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n, a, b, la, lb := evPair(t, 0, 0, c.o)
			a.postSend(t, c.wr(a, b))
			n.pump()
			expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Status: c.st, Opcode: wcOpcode(c.wr(a, b).Opcode)})
			sameEvents(t, "responder", lb.types(), c.ev)
			sameEvents(t, "requester", la.types())
			if a.qp.State() != StateErr || b.qp.State() != StateErr || n.clk.Pending() != 0 {
				t.Fatalf("states %v %v, %d timers", a.qp.State(), b.qp.State(), n.clk.Pending())
			}
		})
	}
}

// TestLocalProtectionError: a WR whose SGE names no valid lkey completes
// with LOC_PROT_ERR when the requester gathers it (IBTA 10.8.3.1), the QP
// enters ERR, the rest is flushed, no packet of it is sent, and the QP
// can be reset and destroyed cleanly (goleak in TestMain).
func TestLocalProtectionError(t *testing.T) {
	n, a, b := rcPair(t, connOpts{})
	bad := a.sge(0, 8)
	bad.LKey ^= 0xFF
	a.postSend(t, SendWR{WRID: 1, Opcode: WRRDMAWrite, SGL: []SGE{bad}, RemoteAddr: b.va(0), RKey: b.mr.RKey()},
		a.write(2, 0, 8, b.va(0), b.mr.RKey(), SendSignaled))
	if len(a.out.q) != 0 {
		t.Fatalf("%d packets sent", len(a.out.q))
	}
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Status: cq.StatusLocProtErr, Opcode: cq.OpRDMAWrite},
		cq.WC{WRID: 2, Status: cq.StatusWRFlushErr, Opcode: cq.OpRDMAWrite})
	if a.qp.State() != StateErr || n.clk.Pending() != 0 {
		t.Fatalf("state %v, %d timers", a.qp.State(), n.clk.Pending())
	}
	if err := a.qp.Modify(&Attr{State: StateReset}, AttrState); err != nil {
		t.Fatal(err)
	}
	a.qp.Destroy()
	b.qp.Destroy()
	if n.clk.Pending() != 0 {
		t.Fatal("timer armed after Destroy")
	}
	_ = bth.PSN(0)
}
