package qp

import (
	"net/netip"
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/pkg/bth"
)

// refiller is a Config.RecvRefill double: it owns receive WRs accepted but not yet posted (as the
// daemon's post ring holds them). Synchronous, it posts them inside the hook and calls Refilled
// (an owner that is quick); asynchronous, the hook only answers whether it holds any, and the
// test posts them later with deliver (an owner whose goroutine is busy).
type refiller struct {
	t       *testing.T
	q       *QP
	async   bool
	pending []RecvWR
	calls   int
	asked   bool // an asynchronous call answered true and deliver has not run since
}

func (r *refiller) refill(q *QP) bool {
	r.calls++
	if q != r.q {
		r.t.Error("RecvRefill called with another QP")
	}
	if !r.q.mu.TryLock() {
		r.t.Error("RecvRefill called with the QP lock held")
		return false
	}
	r.q.mu.Unlock()
	if len(r.pending) == 0 {
		return false
	}
	if r.async {
		r.asked = true
		return true
	}
	r.post()
	r.q.Refilled()
	return true
}

func (r *refiller) post() {
	if _, err := r.q.PostRecv(r.pending); err != nil {
		r.t.Error("PostRecv in RecvRefill:", err)
	}
	r.pending = r.pending[:0]
}

// deliver is the asynchronous owner's goroutine: post what it holds, then Refilled.
func (r *refiller) deliver() {
	r.asked = false
	r.post()
	r.q.Refilled()
}

func withRefill(t *testing.T, s *side) *refiller {
	r := &refiller{t: t, q: s.qp}
	s.qp.cfg.RecvRefill = r.refill // before any packet: cfg is read without the lock
	return r
}

// TestRecvRefillRC: an RC SEND that finds the receive queue empty first asks the owner
// (RecvRefill, outside the QP lock), which posts what it holds: no RNR NAK, so with rnr_retry 0
// the sender completes successfully. Without the hook the responder answers RNR and the sender's
// WQE ends in RNR_RETRY_EXC_ERR. Both owners: one that posts inside the hook, one that posts
// later on its own goroutine (the QP holds the packets meanwhile).
func TestRecvRefillRC(t *testing.T) {
	for _, async := range []bool{false, true} {
		name := "sync"
		if async {
			name = "async"
		}
		t.Run(name, func(t *testing.T) { testRecvRefillRC(t, async) })
	}
}

func testRecvRefillRC(t *testing.T, async bool) {
	n := newNet(t)
	a := n.newSide("10.0.0.1", sideOpts{qpn: 0x11})
	b := n.newSide("10.0.0.2", sideOpts{qpn: 0x12})
	n.connect(a, b, connOpts{mtu: MTU256, rnrRetry: 0})
	r := withRefill(t, b)
	r.async = async
	pump := func() {
		t.Helper()
		n.pump()
		if r.asked {
			r.deliver()
			n.pump()
		}
	}
	a.fill(0, 600, 1)
	r.pending = append(r.pending, RecvWR{WRID: 7, SGL: []SGE{b.sge(dstOff, 1000)}})
	a.postSend(t, SendWR{WRID: 1, Opcode: WRSendWithImm, Imm: 3, SGL: []SGE{a.sge(0, 600)}, Flags: SendSignaled})
	pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpSend, ByteLen: 600})
	expectWC(t, pollAll(b.rcq), cq.WC{WRID: 7, Opcode: cq.OpRecv, ByteLen: 600, ImmData: 3, Flags: cq.FlagWithImm})
	eq(t, "send", b.buf[dstOff:dstOff+600], a.buf[:600])
	if s := b.cnt.Snapshot(); s.SendRNRErr != 0 || s.RcvdDropped != 0 {
		t.Fatalf("send_rnr_err %d, rcvd_dropped %d", s.SendRNRErr, s.RcvdDropped)
	}
	// one call, for the FIRST packet: MIDDLE and LAST continue the message
	if r.calls != 1 {
		t.Fatalf("%d RecvRefill calls for a 3-packet SEND, want 1", r.calls)
	}
	// WRITE without immediate: no receive WQE, no call; WRITE with immediate: one call
	a.postSend(t, SendWR{WRID: 2, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 600)}, RemoteAddr: b.va(0), RKey: b.mr.RKey(), Flags: SendSignaled})
	pump()
	if r.calls != 1 {
		t.Fatalf("RecvRefill called for a WRITE without immediate")
	}
	r.pending = append(r.pending, RecvWR{WRID: 8})
	a.postSend(t, SendWR{WRID: 3, Opcode: WRRDMAWriteWithImm, Imm: 4, SGL: []SGE{a.sge(0, 600)}, RemoteAddr: b.va(0), RKey: b.mr.RKey(), Flags: SendSignaled})
	pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 2, Opcode: cq.OpRDMAWrite, ByteLen: 600}, cq.WC{WRID: 3, Opcode: cq.OpRDMAWrite, ByteLen: 600})
	expectWC(t, pollAll(b.rcq), cq.WC{WRID: 8, Opcode: cq.OpRecvRDMAWithImm, ByteLen: 600, ImmData: 4, Flags: cq.FlagWithImm})
	if r.calls != 2 {
		t.Fatalf("%d RecvRefill calls after a WRITE with immediate, want 2", r.calls)
	}
	// a receive already queued: no call
	b.postRecv(t, RecvWR{WRID: 9, SGL: []SGE{b.sge(dstOff, 100)}})
	a.postSend(t, SendWR{WRID: 4, Opcode: WRSend, SGL: []SGE{a.sge(0, 100)}, Flags: SendSignaled})
	pump()
	expectWC(t, pollAll(b.rcq), cq.WC{WRID: 9, Opcode: cq.OpRecv, ByteLen: 100})
	if r.calls != 2 {
		t.Fatalf("RecvRefill called with a receive queued")
	}
	// nothing to refill: the RNR NAK stays (rnr_retry 0: the sender's WQE fails)
	a.postSend(t, SendWR{WRID: 5, Opcode: WRSend, SGL: []SGE{a.sge(0, 100)}, Flags: SendSignaled})
	pump()
	if r.calls != 3 || b.cnt.Snapshot().SendRNRErr != 1 {
		t.Fatalf("empty refill: %d calls, send_rnr_err %d", r.calls, b.cnt.Snapshot().SendRNRErr)
	}
	wcs := pollAll(a.scq)
	if len(wcs) != 2 || wcs[0].WRID != 4 || wcs[1].Status != cq.StatusRNRRetryExcErr {
		t.Fatalf("sender completions %+v", wcs)
	}
}

// TestRecvRefillChecksFirst: the hook is asked only for a packet the QP would execute next: not
// for a packet to a QP in RESET or INIT, from an address other than the path's, with a P_Key
// other than the default, a duplicate or a PSN ahead of the expected one (RC), nor for a
// response. Each of those is dropped or answered exactly as without a hook.
func TestRecvRefillChecksFirst(t *testing.T) {
	n := newNet(t)
	a := n.newSide("10.0.0.1", sideOpts{qpn: 0x11})
	b := n.newSide("10.0.0.2", sideOpts{qpn: 0x12})
	r := withRefill(t, b)
	r.pending = []RecvWR{{WRID: 1, SGL: []SGE{b.sge(dstOff, 100)}}}
	send := func(psn bth.PSN, pkey uint16) *bth.Packet {
		t.Helper()
		buf := make([]byte, bth.BTHSize+8+bth.ICRCSize)
		bth.BTH(buf).Encode(&bth.BTHFields{Opcode: bth.OpRCSendOnly, PKey: pkey, DestQP: 0x12, PSN: psn, AckReq: true})
		p, err := bth.Parse(buf)
		if err != nil {
			t.Fatal(err)
		}
		return &p
	}
	deliver := func(p *bth.Packet, from string) {
		t.Helper()
		b.qp.Receive(n.clk.Now(), p, netip.AddrPortFrom(netip.MustParseAddr(from), 0xC000),
			netip.AddrPortFrom(b.addr, bth.UDPPort))
	}
	// RESET, then INIT: dropped before the hook
	deliver(send(0, 0xFFFF), "10.0.0.1")
	if err := b.qp.Modify(&Attr{State: StateInit, Port: 1, AccessFlags: 0}, AttrState|AttrPKeyIndex|AttrPort|AttrAccessFlags); err != nil {
		t.Fatal(err)
	}
	deliver(send(0, 0xFFFF), "10.0.0.1")
	if r.calls != 0 {
		t.Fatalf("RecvRefill asked %d times for packets to a QP in RESET or INIT", r.calls)
	}
	if err := b.qp.Modify(&Attr{State: StateReset}, AttrState); err != nil {
		t.Fatal(err)
	}
	n.connect(a, b, connOpts{psnA: 100, psnB: 200})
	// another source address, another P_Key, a duplicate PSN, a PSN ahead: no hook
	deliver(send(100, 0xFFFF), "10.0.0.9")
	deliver(send(100, 0x1234), "10.0.0.1")
	deliver(send(99, 0xFFFF), "10.0.0.1")
	deliver(send(105, 0xFFFF), "10.0.0.1")
	if r.calls != 0 {
		t.Fatalf("RecvRefill asked %d times for packets the QP does not execute next", r.calls)
	}
	s := b.cnt.Snapshot()
	if s.RcvdDropped != 4 || s.DuplicateRequest != 1 || s.OutOfSeqRequest != 1 {
		t.Fatalf("counters %+v: want 4 dropped (RESET, INIT, address, P_Key), a duplicate and one out of sequence", s)
	}
	// the expected PSN from the path's address: asked once, and delivered
	deliver(send(100, 0xFFFF), "10.0.0.1")
	if r.calls != 1 {
		t.Fatalf("RecvRefill asked %d times for the expected SEND, want 1", r.calls)
	}
	expectWC(t, pollAll(b.rcq), cq.WC{WRID: 1, Opcode: cq.OpRecv, ByteLen: 8})
}

// TestRecvRefillHoldsInOrder: while the owner has not posted, the QP holds the SEND and every
// request after it (the rest of a multi-packet SEND, a WRITE), sends nothing for them and lets
// responses through; Refilled executes them in order on the owner's goroutine, and the requester
// sees every message complete with no retry.
func TestRecvRefillHoldsInOrder(t *testing.T) {
	n := newNet(t)
	a := n.newSide("10.0.0.1", sideOpts{qpn: 0x11})
	b := n.newSide("10.0.0.2", sideOpts{qpn: 0x12})
	n.connect(a, b, connOpts{mtu: MTU256, rnrRetry: 0})
	r := withRefill(t, b)
	r.async = true
	a.fill(0, 1000, 3)
	r.pending = []RecvWR{{WRID: 7, SGL: []SGE{b.sge(dstOff, 1000)}}}
	a.postSend(t, SendWR{WRID: 1, Opcode: WRSend, SGL: []SGE{a.sge(0, 1000)}, Flags: SendSignaled},
		SendWR{WRID: 2, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 512)}, RemoteAddr: b.va(0), RKey: b.mr.RKey(), Flags: SendSignaled})
	// b's own requests: its READ's responses arrive while b holds a's requests
	b.postSend(t, SendWR{WRID: 3, Opcode: WRRDMARead, SGL: []SGE{b.sge(8192, 300)}, RemoteAddr: a.va(0), RKey: a.mr.RKey(), Flags: SendSignaled})
	n.pump()
	if !r.asked || r.calls != 1 {
		t.Fatalf("asked %v, %d calls: want one call answered true", r.asked, r.calls)
	}
	if got := pollAll(a.scq); len(got) != 0 {
		t.Fatalf("a's messages completed while b holds them: %+v", got)
	}
	if b.buf[0] != 0 {
		t.Fatal("the WRITE behind the held SEND was executed")
	}
	expectWC(t, pollAll(b.scq), cq.WC{WRID: 3, Opcode: cq.OpRDMARead, ByteLen: 300})
	eq(t, "READ while holding", b.buf[8192:8192+300], a.buf[:300])
	r.deliver()
	n.pump()
	expectWC(t, pollAll(b.rcq), cq.WC{WRID: 7, Opcode: cq.OpRecv, ByteLen: 1000})
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpSend, ByteLen: 1000}, cq.WC{WRID: 2, Opcode: cq.OpRDMAWrite, ByteLen: 512})
	eq(t, "send", b.buf[dstOff:dstOff+1000], a.buf[:1000])
	eq(t, "write", b.buf[:512], a.buf[:512])
	if s := a.cnt.Snapshot(); s.RetransPkts != 0 || s.RcvdRNRErr != 0 {
		t.Fatalf("requester retransmitted %d, rnr %d", s.RetransPkts, s.RcvdRNRErr)
	}
	if s := b.cnt.Snapshot(); s.RcvdDropped != 0 || s.SendRNRErr != 0 {
		t.Fatalf("responder dropped %d, rnr %d", s.RcvdDropped, s.SendRNRErr)
	}
}

// TestRecvRefillParkFull: the QP holds at most heldPackets request packets; the rest are
// dropped, and after the held ones execute one PSN sequence error NAK makes the requester resend
// at once (no ACK timeout: the manual clock never moves). Every message then completes.
func TestRecvRefillParkFull(t *testing.T) {
	n := newNet(t)
	a := n.newSide("10.0.0.1", sideOpts{qpn: 0x11})
	b := n.newSide("10.0.0.2", sideOpts{qpn: 0x12})
	n.connect(a, b, connOpts{mtu: MTU256, rnrRetry: 0, retry: 3}) // the NAK counts as a retry (IBTA 9.7.5.2.1)
	r := withRefill(t, b)
	r.async = true
	const size = 256 * 100 // 100 packets: more than the QP holds
	a.fill(0, size, 5)
	r.pending = []RecvWR{{WRID: 7, SGL: []SGE{b.sge(dstOff, size)}}}
	a.postSend(t, SendWR{WRID: 1, Opcode: WRSend, SGL: []SGE{a.sge(0, size)}, Flags: SendSignaled})
	n.pump()
	dropped := b.cnt.Snapshot().RcvdDropped
	if !r.asked || dropped != 100-heldPackets {
		t.Fatalf("asked %v, %d dropped: want %d held and the rest dropped", r.asked, dropped, heldPackets)
	}
	r.deliver()
	n.pump()
	expectWC(t, pollAll(b.rcq), cq.WC{WRID: 7, Opcode: cq.OpRecv, ByteLen: size})
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpSend, ByteLen: size})
	eq(t, "send", b.buf[dstOff:dstOff+size], a.buf[:size])
	if s := a.cnt.Snapshot(); s.RcvdSeqErr != 1 {
		t.Fatalf("requester saw %d PSN sequence NAKs, want 1", s.RcvdSeqErr)
	}
}

// TestRecvRefillDestroyDrops: packets held when the QP is reset or destroyed are dropped, and a
// later Refilled is harmless.
func TestRecvRefillDestroyDrops(t *testing.T) {
	n := newNet(t)
	a := n.newSide("10.0.0.1", sideOpts{qpn: 0x11})
	b := n.newSide("10.0.0.2", sideOpts{qpn: 0x12})
	n.connect(a, b, connOpts{})
	r := withRefill(t, b)
	r.async = true
	r.pending = []RecvWR{{WRID: 7, SGL: []SGE{b.sge(dstOff, 100)}}}
	a.postSend(t, SendWR{WRID: 1, Opcode: WRSend, SGL: []SGE{a.sge(0, 100)}, Flags: SendSignaled})
	n.pump()
	if !r.asked || b.qp.held == nil {
		t.Fatal("nothing held")
	}
	if err := b.qp.Modify(&Attr{State: StateReset}, AttrState); err != nil {
		t.Fatal(err)
	}
	if b.qp.held != nil || b.cnt.Snapshot().RcvdDropped != 1 {
		t.Fatalf("RESET kept the held packet (dropped %d)", b.cnt.Snapshot().RcvdDropped)
	}
	b.qp.Refilled()
	b.qp.Destroy()
	b.qp.Refilled()
	if got := pollAll(b.rcq); len(got) != 0 {
		t.Fatalf("completions after RESET: %+v", got)
	}
}

// TestRecvRefillUCUD: UC and UD drop a message that finds no receive WQE; the hook delivers it.
// A QP on an SRQ never calls the hook.
func TestRecvRefillUCUD(t *testing.T) {
	for _, async := range []bool{false, true} {
		n := newNet(t)
		a := n.newSide("10.0.0.1", sideOpts{typ: TypeUC, qpn: 0x21})
		b := n.newSide("10.0.0.2", sideOpts{typ: TypeUC, qpn: 0x22})
		n.connect(a, b, connOpts{})
		r := withRefill(t, b)
		r.async = async
		r.pending = append(r.pending, RecvWR{WRID: 1, SGL: []SGE{b.sge(dstOff, 100)}})
		a.postSend(t, SendWR{WRID: 1, Opcode: WRSend, SGL: []SGE{a.sge(0, 100)}, Flags: SendSignaled})
		n.pump()
		if r.asked {
			r.deliver()
		}
		expectWC(t, pollAll(b.rcq), cq.WC{WRID: 1, Opcode: cq.OpRecv, ByteLen: 100})

		u := n.newSide("10.0.0.3", sideOpts{typ: TypeUD, qpn: 0x31})
		v := n.newSide("10.0.0.4", sideOpts{typ: TypeUD, qpn: 0x32})
		udUp(t, u, 5)
		udUp(t, v, 5)
		rv := withRefill(t, v)
		rv.async = async
		rv.pending = append(rv.pending, RecvWR{WRID: 2, SGL: []SGE{v.sge(0, 200)}})
		u.postSend(t, SendWR{WRID: 1, Opcode: WRSend, SGL: []SGE{u.sge(0, 100)}, Flags: SendSignaled,
			AH: &AH{AHAttr: AHAttr{DGID: v.addr}, SGID: u.addr}, RemoteQPN: 0x32, RemoteQKey: 5})
		n.pump()
		if rv.asked {
			rv.deliver()
		}
		expectWC(t, pollAll(v.rcq), cq.WC{WRID: 2, Opcode: cq.OpRecv, ByteLen: 140, Flags: cq.FlagGRH, SrcQP: 0x31})
		// a wrong Q_Key is dropped before the hook
		calls := rv.calls
		u.postSend(t, SendWR{WRID: 2, Opcode: WRSend, SGL: []SGE{u.sge(0, 100)}, Flags: SendSignaled,
			AH: &AH{AHAttr: AHAttr{DGID: v.addr}, SGID: u.addr}, RemoteQPN: 0x32, RemoteQKey: 6})
		n.pump()
		if rv.calls != calls {
			t.Fatal("RecvRefill asked for a UD packet with the wrong Q_Key")
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
}
