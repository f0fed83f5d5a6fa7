package qp

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/pkg/bth"
)

// countClock counts the reads of a ManualClock.
type countClock struct {
	*ManualClock
	reads atomic.Int64
}

func (c *countClock) Now() time.Time {
	c.reads.Add(1)
	return c.ManualClock.Now()
}

// receiveAll hands every datagram queued by from to to's QP with ReceiveDeferred at the clock's
// time (one receive batch; each ICRC checked) and reports whether a flush is due; it does not
// flush.
func (n *net) receiveAll(from, to *side) bool {
	n.t.Helper()
	q := from.out.q
	from.out.q = nil
	pending := false
	for i := range q {
		d := &q[i]
		ep := bth.Endpoints{Src: d.Src.Addr(), Dst: d.Dst.Addr(), SrcPort: d.Src.Port(), DstPort: d.Dst.Port()}
		if !bth.VerifyICRC(&ep, d.Buf) {
			n.t.Fatalf("bad ICRC from %v", from.addr)
		}
		p, err := bth.Parse(d.Buf)
		if err != nil {
			n.t.Fatalf("parse: %v", err)
		}
		if to.qp.ReceiveDeferred(n.clk.Now(), &p, d.Src, d.Dst) {
			pending = true
		}
	}
	return pending
}

// TestFlushDeferredRNRTimerFromFlushTime: an RNR NAK received (ReceiveDeferred) at t0 sets the
// RNR deadline t0 + RNR timer (IBTA 9.7.5.2.8); FlushDeferred, gap later, resets the QP's timer
// for it from the clock it reads itself: the SEND is resent exactly at the deadline, not
// before and not gap later.
func TestFlushDeferredRNRTimerFromFlushTime(t *testing.T) {
	const code = 14
	d := bth.RNRTimer(code)
	gap := d / 3
	n := newNet(t)
	a := n.newSide("10.0.0.1", sideOpts{qpn: 0x11})
	b := n.newSide("10.0.0.2", sideOpts{qpn: 0x12})
	n.connect(a, b, connOpts{minRNR: code, rnrRetry: 7, timeout: 31})
	a.postSend(t, SendWR{WRID: 1, Opcode: WRSend, SGL: []SGE{a.sge(0, 100)}, Flags: SendSignaled})
	n.deliverDeferred(a, b) // no receive posted: RNR NAK
	if !n.receiveAll(b, a) {
		t.Fatal("the RNR NAK was dropped")
	}
	n.clk.Advance(gap)
	a.qp.FlushDeferred()
	b.postRecv(t, RecvWR{WRID: 9, SGL: []SGE{b.sge(0, 100)}})
	n.clk.Advance(d - gap - time.Nanosecond)
	if len(a.out.q) != 0 {
		t.Fatalf("%d packets before the RNR deadline", len(a.out.q))
	}
	n.clk.Advance(time.Nanosecond)
	if len(a.out.q) != 1 {
		t.Fatalf("%d packets at the RNR deadline, want the SEND again", len(a.out.q))
	}
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpSend, ByteLen: 100})
}

// TestArmTimerReadsClockWhenNeeded: the QP reads its clock for the timer only when the ACK timer
// starts or the runtime timer is reset: a second WRITE posted while the first is outstanding,
// and the flush after the ACK of both, read none; and the ACK timer that did start still
// retransmits one Local ACK Timeout after the first post (IBTA 9.7.6.1.3).
func TestArmTimerReadsClockWhenNeeded(t *testing.T) {
	n := newNet(t)
	a := n.newSide("10.0.0.1", sideOpts{qpn: 0x11})
	b := n.newSide("10.0.0.2", sideOpts{qpn: 0x12})
	n.connect(a, b, connOpts{timeout: 10, retry: 7})
	clk := &countClock{ManualClock: n.clk}
	a.qp.cfg.Clock = clk
	wr := func(id uint64) SendWR {
		return SendWR{WRID: id, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 8)}, Flags: SendSignaled,
			RemoteAddr: b.va(0), RKey: b.mr.RKey()}
	}
	a.postSend(t, wr(1))
	if r := clk.reads.Load(); r != 1 {
		t.Fatalf("first post: %d clock reads, want 1 (the ACK timer starts)", r)
	}
	a.postSend(t, wr(2))
	if r := clk.reads.Load(); r != 1 {
		t.Fatalf("second post: %d clock reads in all, want 1 (the timer runs already)", r)
	}
	n.deliverDeferred(a, b)
	if !n.receiveAll(b, a) {
		t.Fatal("the ACKs were dropped")
	}
	base := clk.reads.Load()
	a.qp.FlushDeferred()
	if r := clk.reads.Load() - base; r != 0 {
		t.Fatalf("flush with nothing outstanding: %d clock reads, want 0", r)
	}
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpRDMAWrite, ByteLen: 8},
		cq.WC{WRID: 2, Opcode: cq.OpRDMAWrite, ByteLen: 8})

	// a WRITE whose ACK is lost: resent at post + timeout, not earlier
	n.clk.Advance(time.Second) // the stale runtime timer fires and finds nothing outstanding
	a.postSend(t, wr(3))
	a.out.q = nil // lost
	to := AckTimeout(10)
	n.clk.Advance(to - time.Nanosecond)
	if len(a.out.q) != 0 {
		t.Fatalf("%d packets before the ACK timeout", len(a.out.q))
	}
	n.clk.Advance(time.Nanosecond)
	if len(a.out.q) != 1 {
		t.Fatalf("%d packets at the ACK timeout, want the WRITE again", len(a.out.q))
	}
}

// TestDeferredACKStopsTimer: an ACK that acknowledges everything, received with ReceiveDeferred,
// stops the ACK timer at once (IBTA 9.7.6.1.3), not at the flush: a WRITE the application posts
// before the flush (a polled application posts before its next Poll) starts the timer afresh
// and is retransmitted one Local ACK Timeout after its post — not one timeout after the ACK,
// which was earlier by the time between the ACK's read and the post.
func TestDeferredACKStopsTimer(t *testing.T) {
	n := newNet(t)
	a := n.newSide("10.0.0.1", sideOpts{qpn: 0x11})
	b := n.newSide("10.0.0.2", sideOpts{qpn: 0x12})
	n.connect(a, b, connOpts{timeout: 10, retry: 7})
	to := AckTimeout(10)
	wr := func(id uint64) SendWR {
		return SendWR{WRID: id, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 8)}, Flags: SendSignaled,
			RemoteAddr: b.va(0), RKey: b.mr.RKey()}
	}
	a.postSend(t, wr(1))
	n.deliverDeferred(a, b)
	n.clk.Advance(time.Millisecond)
	if !n.receiveAll(b, a) { // the ACK of WRITE 1, not flushed
		t.Fatal("the ACK was dropped")
	}
	n.clk.Advance(to / 2)
	a.postSend(t, wr(2))
	if len(a.out.q) != 1 {
		t.Fatalf("%d packets sent by the post, want WRITE 2", len(a.out.q))
	}
	a.out.q = nil // lost
	n.clk.Advance(to - time.Nanosecond)
	if len(a.out.q) != 0 {
		t.Fatalf("WRITE 2 resent within %v of its post, before the ACK timeout %v", to-time.Nanosecond, to)
	}
	n.clk.Advance(time.Nanosecond)
	if len(a.out.q) != 1 {
		t.Fatalf("%d packets one ACK timeout after the post, want WRITE 2 again", len(a.out.q))
	}
	a.qp.FlushDeferred()
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpRDMAWrite, ByteLen: 8},
		cq.WC{WRID: 2, Opcode: cq.OpRDMAWrite, ByteLen: 8})
}
