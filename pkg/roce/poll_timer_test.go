package roce

import (
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/qp"
)

// TestPolledFlushRearmsAtPollTime: the packets a Poll read wait on their QPs for the next Poll,
// which flushes them and re-arms the QP's ACK timer (IBTA 9.7.6.1.3: the local ACK timeout
// runs from the last forward progress). That re-arm must use the time of the flushing Poll,
// not the time of the read: an ACK read at t1 that leaves a WRITE outstanding moves the
// deadline to t1 + timeout, and a flush 30 ms later must keep it there. With the read's time
// the timer was set to fire one timeout after the flush instead, late by the gap between the
// two Polls (an application that polls rarely retransmitted that much later).
func TestPolledFlushRearmsAtPollTime(t *testing.T) {
	da, db, _, _ := polledPair(t, "mem")
	clk := da.clock.(*qp.ManualClock)
	a, b := newEnd(t, da, qp.TypeRC, 1<<12), newEnd(t, db, qp.TypeRC, 1<<12)
	connect(t, a, b, qp.MTU1024, 100, 200)
	to := qp.AckTimeout(14) // connect's Timeout

	post(t, a, writeWR(a, b, 1, 0))
	pollUntil(t, func() bool { return b.qp.RemoteWrites() == 1 }, db)
	if _, err := db.Poll(); err != nil { // sends b's deferred ACK of WRITE 1
		t.Fatal(err)
	}
	post(t, a, writeWR(a, b, 2, 8)) // stays unread in b's link: outstanding until the timer
	clk.Advance(time.Millisecond)   // t1
	if w := pollWC(t, a.scq, da); w.Status != cq.StatusSuccess || w.WRID != 1 {
		t.Fatalf("a's first completion %+v", w)
	}
	// the ACK was read at t1 (progress); the next Poll, 30 ms later, flushes a's QP
	const gap = 30 * time.Millisecond
	clk.Advance(gap)
	if n, err := da.Poll(); err != nil || n != 0 {
		t.Fatalf("flushing Poll: %d, %v", n, err)
	}
	base := da.Stats().RetransPkts
	clk.Advance(to - gap - time.Millisecond) // t1 + timeout - 1 ms: not yet
	if got := da.Stats().RetransPkts - base; got != 0 {
		t.Fatalf("%d retransmissions before the ACK timeout ran out (t1 + %v)", got, to-time.Millisecond)
	}
	clk.Advance(2 * time.Millisecond) // t1 + timeout + 1 ms
	if got := da.Stats().RetransPkts - base; got != 1 {
		t.Fatalf("%d retransmissions at t1 + timeout + 1 ms (%v after the flush), want 1: the timer was re-armed from the read's time, not the flush's", got, to+time.Millisecond-gap)
	}
}
