package qp

import (
	"github.com/softroce/softroce/internal/event"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/pkg/bth"
)

// READ responses (IBTA 9.4.4: the responder returns the data of an RDMA READ in
// response packets FIRST/MIDDLE/LAST or ONLY, one PSN each) are built a burst at a time, as
// rxe's responder works through a responder resource: a READ of 1 GiB is 262144 packets, and
// building them all when the request arrives would hold the receive goroutine, which every QP
// of its worker shares, for as long.
//
//   - The request's arrival builds at most ReadInline packets (a small READ, a latency test's,
//     is answered at once). If more remain, the QP asks its scheduler (Config.Schedule) to come
//     back; the scheduler calls RunResponder from its own goroutine, and each call builds at
//     most one burst (its budget) and sends it, round-robin with the other QPs that have work.
//   - Meanwhile the responder is busy: later requests wait behind the READ (hold.go), so they
//     are executed after it, as IBTA 9.5 orders them, and their ACKs never overtake its
//     responses (a requester takes an ACK beyond an unanswered READ for a lost response).
//   - A duplicate READ (a requester that went back to it after a loss or a timeout) restarts
//     the responses from the PSN it asks for, replacing those in progress, instead of adding a
//     second full set: however many duplicates arrive, the responder sends at most one READ's
//     responses at a time (rxe replays a resource from the duplicate's PSN too).
//   - RESET, ERR and Destroy stop the responses.

// ReadInline is the most READ response packets built on the goroutine that received the
// request; ReadBudget the most a RunResponder call builds (one burst: txBuffers).
const (
	ReadInline = 16
	ReadBudget = txBuffers
)

// readGen is the READ whose responses are being sent (responder.rd).
type readGen struct {
	active bool
	psn    bth.PSN // PSN of response packet 0 (the request's)
	va     uint64
	rkey   uint32
	length uint32
	n      uint32 // packets in all
	i      uint32 // the next packet to build
}

// startRead begins the responses to a READ of length bytes at va, the first carrying psn (a
// new READ, or a duplicate's replay replacing any READ in progress), and builds the first
// ReadInline of them; a replay that replaces responses in progress builds none here (the
// scheduler is coming back anyway: a stream of duplicates costs the receive path nothing
// more than their parsing).
func (q *QP) startRead(psn bth.PSN, va uint64, rkey, length uint32) {
	n := uint32(1)
	if length > q.mtu {
		n = (length + q.mtu - 1) / q.mtu
	}
	inline := ReadInline
	g := readGen{active: true, psn: psn, va: va, rkey: rkey, length: length, n: n}
	if q.resp.rd.active {
		if q.attr.SelectiveRepeat {
			q.srQueueRead(&g) // after the responses in progress, not instead (srread.go)
			return
		}
		inline = 0
	}
	q.resp.rd = g
	if q.cfg.Schedule == nil {
		q.readStep(int(n)) // no scheduler: all at once
		return
	}
	q.readStep(inline)
	if q.resp.rd.active && !q.resp.sched {
		q.resp.sched = true
		q.cfg.Schedule(q)
	}
}

// readStep builds and queues at most max response packets of the READ in progress (IBTA 9.4.4:
// FIRST/MIDDLE/LAST or ONLY; AETH on all but MIDDLE). A key failing in the middle (MR
// deregistered) ends the responses with a remote access NAK.
func (q *QP) readStep(max int) {
	g := &q.resp.rd
	for k := 0; k < max && g.active; k++ {
		i := g.i
		off := i * q.mtu
		sz := g.length - off
		if sz > q.mtu {
			sz = q.mtu
		}
		var op bth.Opcode
		switch {
		case g.n == 1:
			op = bth.OpRCReadRespOnly
		case i == 0:
			op = bth.OpRCReadRespFirst
		case i == g.n-1:
			op = bth.OpRCReadRespLast
		default:
			op = bth.OpRCReadRespMiddle
		}
		buf := q.txBuf()
		h := bth.BTHSize
		if op != bth.OpRCReadRespMiddle {
			bth.AETH(buf[h:]).Encode(&bth.AETHFields{Syndrome: bth.SyndromeACK(0x1F), MSN: q.resp.msn})
			h += bth.AETHSize
		}
		if sz > 0 {
			if err := q.cfg.MRs.CopyOut(q.cfg.PD, q.num, g.rkey, g.va+uint64(off), buf[h:h+int(sz)], mr.OpRemoteRead); err != nil {
				// The key no longer allows the READ (the MR was deregistered or
				// invalidated, e.g. before a duplicate READ is replayed): remote access NAK
				// at the first response not sent, and the QP enters ERR as for any
				// responder class C error (IBTA 9.7.5.2.4, 9.9.3.1; rxe
				// RESPST_ERR_RKEY_VIOLATION).
				psn := g.psn.Add(i)
				*g = readGen{}
				q.resp.rdq.clear()
				q.remoteAccessError()
				q.sendAck(bth.SyndromeNAK(bth.NAKRemoteAccessErr), psn)
				q.raise(event.QPAccessErr)
				q.enterError()
				return
			}
		}
		// not ECN-capable: READ responses are not paced (congestion.go), a CE mark would have
		// nobody to slow down
		q.finishTC(buf, op, false, false, q.attr.DestQPN, g.psn.Add(i), h, int(sz), &q.path, q.path.TClass)
		g.i++
		if g.i == g.n {
			*g = readGen{}
			q.resp.rdq.next(g) // a ranged duplicate READ waiting behind it (srread.go)
		}
	}
}

// RunResponder continues the QP's responder work for its scheduler (Config.Schedule): at most
// budget READ response packets, then the requests that waited behind the READ, if it is done,
// and sends what it built. It reports whether work remains (call again later; the QP does not
// ask its scheduler again meanwhile). Call it with no QP lock held.
func (q *QP) RunResponder(budget int) (more bool) {
	q.mu.Lock()
	if q.dead {
		q.resp.sched = false
		q.mu.Unlock()
		return false
	}
	if q.resp.rd.active {
		q.readStep(budget)
	}
	now := q.cfg.Clock.Now()
	q.runHeld(now) // when the READ is done; the refill hook may run (released lock): no defer
	more = q.resp.rd.active
	q.resp.sched = more
	q.flush()
	q.armTimerAt(now)
	q.mu.Unlock()
	return more
}

// ResponderBusy reports whether the responder has READ responses still to send or requests
// waiting behind them or behind a refill.
func (q *QP) ResponderBusy() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.busy() || q.held != nil
}
