package qp

import (
	"testing"

	"github.com/softroce/softroce/internal/cq"
)

// refiller is a Config.RecvRefill double: it owns receive WRs accepted but not yet posted (as the
// daemon's post ring holds them) and posts them when the engine asks.
type refiller struct {
	t       *testing.T
	q       *QP
	pending []RecvWR
	calls   int
}

func (r *refiller) refill() {
	r.calls++
	if !r.q.mu.TryLock() {
		r.t.Error("RecvRefill called with the QP lock held")
		return
	}
	r.q.mu.Unlock()
	if len(r.pending) > 0 {
		if _, err := r.q.PostRecv(r.pending); err != nil {
			r.t.Error("PostRecv in RecvRefill:", err)
		}
		r.pending = r.pending[:0]
	}
}

func withRefill(t *testing.T, s *side) *refiller {
	r := &refiller{t: t, q: s.qp}
	s.qp.cfg.RecvRefill = r.refill // before any packet: cfg is read without the lock
	return r
}

// TestRecvRefillRC: an RC SEND that finds the receive queue empty first lets the owner post what
// it holds (RecvRefill, outside the QP lock): no RNR NAK, so with rnr_retry 0 the sender
// completes successfully. Without the hook the responder answers RNR and the sender's WQE ends
// in RNR_RETRY_EXC_ERR.
func TestRecvRefillRC(t *testing.T) {
	n := newNet(t)
	a := n.newSide("10.0.0.1", sideOpts{qpn: 0x11})
	b := n.newSide("10.0.0.2", sideOpts{qpn: 0x12})
	n.connect(a, b, connOpts{mtu: MTU256, rnrRetry: 0})
	r := withRefill(t, b)
	a.fill(0, 600, 1)
	r.pending = append(r.pending, RecvWR{WRID: 7, SGL: []SGE{b.sge(dstOff, 1000)}})
	a.postSend(t, SendWR{WRID: 1, Opcode: WRSendWithImm, Imm: 3, SGL: []SGE{a.sge(0, 600)}, Flags: SendSignaled})
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpSend, ByteLen: 600})
	expectWC(t, pollAll(b.rcq), cq.WC{WRID: 7, Opcode: cq.OpRecv, ByteLen: 600, ImmData: 3, Flags: cq.FlagWithImm})
	eq(t, "send", b.buf[dstOff:dstOff+600], a.buf[:600])
	if s := b.cnt.Snapshot(); s.SendRNRErr != 0 {
		t.Fatalf("send_rnr_err %d", s.SendRNRErr)
	}
	// one call, for the FIRST packet: MIDDLE and LAST continue the message
	if r.calls != 1 {
		t.Fatalf("%d RecvRefill calls for a 3-packet SEND, want 1", r.calls)
	}
	// WRITE without immediate: no receive WQE, no call; WRITE with immediate: one call
	a.postSend(t, SendWR{WRID: 2, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 600)}, RemoteAddr: b.va(0), RKey: b.mr.RKey(), Flags: SendSignaled})
	n.pump()
	if r.calls != 1 {
		t.Fatalf("RecvRefill called for a WRITE without immediate")
	}
	r.pending = append(r.pending, RecvWR{WRID: 8})
	a.postSend(t, SendWR{WRID: 3, Opcode: WRRDMAWriteWithImm, Imm: 4, SGL: []SGE{a.sge(0, 600)}, RemoteAddr: b.va(0), RKey: b.mr.RKey(), Flags: SendSignaled})
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 2, Opcode: cq.OpRDMAWrite, ByteLen: 600}, cq.WC{WRID: 3, Opcode: cq.OpRDMAWrite, ByteLen: 600})
	expectWC(t, pollAll(b.rcq), cq.WC{WRID: 8, Opcode: cq.OpRecvRDMAWithImm, ByteLen: 600, ImmData: 4, Flags: cq.FlagWithImm})
	if r.calls != 2 {
		t.Fatalf("%d RecvRefill calls after a WRITE with immediate, want 2", r.calls)
	}
	// a receive already queued: no call
	b.postRecv(t, RecvWR{WRID: 9, SGL: []SGE{b.sge(dstOff, 100)}})
	a.postSend(t, SendWR{WRID: 4, Opcode: WRSend, SGL: []SGE{a.sge(0, 100)}, Flags: SendSignaled})
	n.pump()
	expectWC(t, pollAll(b.rcq), cq.WC{WRID: 9, Opcode: cq.OpRecv, ByteLen: 100})
	if r.calls != 2 {
		t.Fatalf("RecvRefill called with a receive queued")
	}
	// nothing to refill: the RNR NAK stays (rnr_retry 0: the sender's WQE fails)
	a.postSend(t, SendWR{WRID: 5, Opcode: WRSend, SGL: []SGE{a.sge(0, 100)}, Flags: SendSignaled})
	n.pump()
	if r.calls != 3 || b.cnt.Snapshot().SendRNRErr != 1 {
		t.Fatalf("empty refill: %d calls, send_rnr_err %d", r.calls, b.cnt.Snapshot().SendRNRErr)
	}
	wcs := pollAll(a.scq)
	if len(wcs) != 2 || wcs[0].WRID != 4 || wcs[1].Status != cq.StatusRNRRetryExcErr {
		t.Fatalf("sender completions %+v", wcs)
	}
}

// TestRecvRefillUCUD: UC and UD drop a message that finds no receive WQE; the hook delivers it.
// A QP on an SRQ never calls the hook, and the queue length the hook test reads follows a flush
// and a reset.
func TestRecvRefillUCUD(t *testing.T) {
	n := newNet(t)
	a := n.newSide("10.0.0.1", sideOpts{typ: TypeUC, qpn: 0x21})
	b := n.newSide("10.0.0.2", sideOpts{typ: TypeUC, qpn: 0x22})
	n.connect(a, b, connOpts{})
	r := withRefill(t, b)
	r.pending = append(r.pending, RecvWR{WRID: 1, SGL: []SGE{b.sge(dstOff, 100)}})
	a.postSend(t, SendWR{WRID: 1, Opcode: WRSend, SGL: []SGE{a.sge(0, 100)}, Flags: SendSignaled})
	n.pump()
	expectWC(t, pollAll(b.rcq), cq.WC{WRID: 1, Opcode: cq.OpRecv, ByteLen: 100})

	u := n.newSide("10.0.0.3", sideOpts{typ: TypeUD, qpn: 0x31})
	v := n.newSide("10.0.0.4", sideOpts{typ: TypeUD, qpn: 0x32})
	udUp(t, u, 5)
	udUp(t, v, 5)
	rv := withRefill(t, v)
	rv.pending = append(rv.pending, RecvWR{WRID: 2, SGL: []SGE{v.sge(0, 200)}})
	u.postSend(t, SendWR{WRID: 1, Opcode: WRSend, SGL: []SGE{u.sge(0, 100)}, Flags: SendSignaled,
		AH: &AH{AHAttr: AHAttr{DGID: v.addr}, SGID: u.addr}, RemoteQPN: 0x32, RemoteQKey: 5})
	n.pump()
	expectWC(t, pollAll(v.rcq), cq.WC{WRID: 2, Opcode: cq.OpRecv, ByteLen: 140, Flags: cq.FlagGRH, SrcQP: 0x31})

	// rqLen after ERR (flushed) and RESET: empty again, so the hook is asked
	v.postRecv(t, RecvWR{WRID: 3, SGL: []SGE{v.sge(0, 200)}}, RecvWR{WRID: 4, SGL: []SGE{v.sge(0, 200)}})
	if v.qp.rqLen.Load() != 2 {
		t.Fatalf("rqLen %d after two posts", v.qp.rqLen.Load())
	}
	if err := v.qp.Modify(&Attr{State: StateErr}, AttrState); err != nil {
		t.Fatal(err)
	}
	if v.qp.rqLen.Load() != 0 {
		t.Fatalf("rqLen %d after the flush", v.qp.rqLen.Load())
	}
	if err := v.qp.Modify(&Attr{State: StateReset}, AttrState); err != nil {
		t.Fatal(err)
	}
	udUp(t, v, 5)
	v.postRecv(t, RecvWR{WRID: 5, SGL: []SGE{v.sge(0, 200)}})
	if err := v.qp.Modify(&Attr{State: StateReset}, AttrState); err != nil {
		t.Fatal(err)
	}
	if v.qp.rqLen.Load() != 0 {
		t.Fatalf("rqLen %d after RESET", v.qp.rqLen.Load())
	}

	srq, err := NewSRQ(SRQOptions{MaxWR: 4, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	c := n.newSide("10.0.0.5", sideOpts{qpn: 0x41})
	d := n.newSide("10.0.0.6", sideOpts{qpn: 0x42, srq: srq})
	n.connect(c, d, connOpts{rnrRetry: 7})
	rd := withRefill(t, d)
	if _, err := srq.Post([]RecvWR{{WRID: 6, SGL: []SGE{d.sge(0, 100)}}}); err != nil {
		t.Fatal(err)
	}
	c.postSend(t, SendWR{WRID: 1, Opcode: WRSend, SGL: []SGE{c.sge(0, 50)}, Flags: SendSignaled})
	n.pump()
	expectWC(t, pollAll(d.rcq), cq.WC{WRID: 6, Opcode: cq.OpRecv, ByteLen: 50})
	if rd.calls != 0 {
		t.Fatalf("RecvRefill called %d times on an SRQ QP", rd.calls)
	}
}
