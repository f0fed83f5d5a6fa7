package qp

import (
	"time"

	"github.com/softroce/softroce/internal/cq"
)

// Timers (IBTA 9.7.6.1.3 transport timer, 9.7.6.1.5 RNR timer), quic-go
// "now in, deadline out" style: the protocol computes the next deadline
// from its state, and the QP's one Timer is kept pending no later than the
// earliest one. Lazily: a pending timer that fires early (the deadline moved
// later, or nothing is outstanding any more) is left to fire, and the expiry
// re-checks the state and re-arms; only a deadline earlier than the pending
// one resets it (a ping-pong otherwise resets and stops a timer per message).
//
//   - ACK timeout: 4.096 us * 2^Timeout after the last forward progress
//     while anything is outstanding (Timeout 0 = infinite, no timer). On
//     expiry the requester goes back to the oldest unacknowledged PSN
//     (go-back-N) and resends, up to RetryCnt times in a row without
//     progress; then the oldest WQE completes with RETRY_EXC_ERR and the QP
//     enters ERR. RetryCnt 7 means 7 retries, as IBTA specifies (rxe treats
//     7 as infinite; we follow the spec so a dead peer is always detected).
//   - RNR wait: after an RNR NAK the requester is silent until the RNR
//     timer of the NAK's timer code expires, then resends from the NAKed
//     PSN. RNRRetry 7 = infinite (IBTA); otherwise RNRRetry consecutive
//     RNR NAKs end in RNR_RETRY_EXC_ERR.

// timers is the QP's timer state.
type timers struct {
	t            Timer
	armed        bool
	deadline     time.Time
	active       bool // the ACK timer runs (something outstanding)
	lastProgress time.Time
	// lastPaced is when the pacer last let a request packet go (congestion.go's paceSent):
	// while a QP is paced the ACK timer runs from the later of it and lastProgress, as kernel
	// rxe restarts its retransmission timer with every request packet it sends.
	lastPaced   time.Time
	retryLeft   uint8
	rnrLeft     uint8
	rnrWait     bool
	rnrDeadline time.Time
}

// AckTimeout returns the local ACK timeout for the 5-bit code:
// 4.096 us * 2^code; 0 means infinite (returned as 0).
func AckTimeout(code uint8) time.Duration {
	if code == 0 {
		return 0
	}
	return time.Duration(4096) << (code & 31) * time.Nanosecond
}

// outstanding reports whether a started WQE awaits a response (RC).
func (q *QP) outstanding() bool {
	return q.typ == TypeRC && q.sqHead != q.sqTail && q.slot(q.sqHead).started && !q.slot(q.sqHead).done
}

// armTimer recomputes the next deadline and (re)arms the QP's timer, reading the clock only
// when the time is needed: when the ACK timer starts (its start is the time of the last
// forward progress) or the runtime timer is reset (its duration runs from now). A ping-pong's
// flush after the application's next post, which already started the timer, reads none.
func (q *QP) armTimer() { q.rearm(time.Time{}, false) }

// armTimerAt is armTimer with the time read by the caller.
func (q *QP) armTimerAt(now time.Time) { q.rearm(now, true) }

// rearm is armTimer and armTimerAt: now is valid if have, else read from the clock when needed.
func (q *QP) rearm(now time.Time, have bool) {
	q.budgetSync() // (budget.go)
	q.budgetPass()
	if q.bud.woken.Load() && (q.state == StateRTS || q.state == StateSQD) {
		// a waker's request for the requester, or one budgetOK left: the timer runs it now
		q.tmr.armed = true
		q.tmr.deadline = time.Time{}
		q.tmr.t.Reset(0)
		return
	}
	var dl time.Time
	on := false
	if q.state == StateRTS || q.state == StateSQD {
		if q.tmr.rnrWait {
			dl, on = q.tmr.rnrDeadline, true
		} else if q.outstanding() {
			if !q.tmr.active {
				if !have {
					now, have = q.cfg.Clock.Now(), true
				}
				q.tmr.active = true
				q.tmr.lastProgress = now
			}
			if to := AckTimeout(q.attr.Timeout); to > 0 && !q.cc.held {
				dl, on = q.ackSince().Add(to), true
			}
		} else {
			q.tmr.active = false
		}
		if q.cc.held && (!on || q.cc.paceAt.Before(dl)) {
			dl, on = q.cc.paceAt, true // the pacer lets the requester go on (congestion.go)
		}
	}
	// Lazy: a pending timer that fires no later than needed stays (nothing to wait for, or a
	// later deadline); onTimerFire re-checks the state and re-arms for what is due then. A
	// ping-pong's every post and ACK would otherwise Reset and Stop a runtime timer.
	if !on || q.tmr.armed && !q.tmr.deadline.After(dl) {
		return
	}
	if !have {
		now = q.cfg.Clock.Now()
	}
	q.tmr.armed = true
	q.tmr.deadline = dl
	d := dl.Sub(now)
	if d < 0 {
		d = 0
	}
	q.tmr.t.Reset(d)
	if q.bud.woken.Load() {
		// a waker's Reset(0) (budget.go) that came after the check above: this Reset undid it.
		// The waker sets woken before its Reset, so one of the two sees the other.
		q.tmr.deadline = time.Time{}
		q.tmr.t.Reset(0)
	}
}

// onTimerFire is the Timer callback.
func (q *QP) onTimerFire() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.tmr.armed = false
	if q.dead {
		return
	}
	now := q.cfg.Clock.Now()
	q.onTimer(now)
	q.flush()
	q.armTimerAt(now)
}

// onTimer handles an expiry at now.
func (q *QP) onTimer(now time.Time) {
	if q.state != StateRTS && q.state != StateSQD {
		return
	}
	if q.cc.held && !now.Before(q.cc.paceAt) {
		q.cc.held = false
		q.runRequester()
	}
	if q.budgetWoken() { // the group's budget has room again (budget.go)
		// An expiry for the wake, not for the ACK timer: a QP that waited with nothing in flight
		// has no ACK timer running, and the requests it sends now start one (rearm); a timeout
		// due meanwhile fires right after.
		q.runRequester()
		return
	}
	if q.tmr.rnrWait {
		if now.Before(q.tmr.rnrDeadline) {
			return
		}
		q.tmr.rnrWait = false
		q.tmr.lastProgress = now
		q.rewind()
		q.runRequester()
		return
	}
	// A requester the pacer holds has packets it has not sent yet (after a go-back-N rewind,
	// the oldest unacknowledged one among them): the ACK timer waits for them to leave, so a
	// slow pace does not use up the retries of a window it never got to send (IBTA 9.7.6.1.3:
	// the timer covers requests sent; held ones were not).
	to := AckTimeout(q.attr.Timeout)
	if q.cc.held || !q.outstanding() || to == 0 || now.Before(q.ackSince().Add(to)) {
		return
	}
	q.comp.seqRetried = false
	q.retryOrFail(now, true)
}

// ackSince is when the ACK timer started: the last forward progress, or the last request
// packet the pacer let go if that came later.
func (q *QP) ackSince() time.Time {
	if q.tmr.lastPaced.After(q.tmr.lastProgress) {
		return q.tmr.lastPaced
	}
	return q.tmr.lastProgress
}

// retryOrFail consumes one retry (if counted) and goes back to the oldest
// unacknowledged PSN, or fails the oldest WQE with RETRY_EXC_ERR.
func (q *QP) retryOrFail(now time.Time, counted bool) {
	if counted {
		if q.tmr.retryLeft == 0 {
			q.cnt.RetryExceededErr.Add(1)
			q.failOldest(cq.StatusRetryExcErr)
			return
		}
		q.tmr.retryLeft--
		q.cnt.CompleterRetryErr.Add(1)
		q.comp.gapRetried = false
	}
	q.goBack(now)
}

// goBack rewinds and resends now (go-back-N, IBTA 9.7.6.1.3).
func (q *QP) goBack(now time.Time) {
	q.tmr.lastProgress = now
	q.req.sr.clear() // everything is sent again: no selective resend is outstanding
	q.rewind()
	q.runRequester()
}

// rewind resets the requester to resend from q.comp.psn: every started,
// not yet done WQE keeps its PSN range and is rebuilt from the packet at
// comp.psn (a READ resumes after the bytes already received).
func (q *QP) rewind() {
	first := true
	for i := q.sqHead; i != q.sqTail; i++ {
		w := q.slot(i)
		if !w.started {
			break
		}
		if w.done {
			continue
		}
		if first {
			q.sqReq = i
			first = false
		}
		w.sentAll = false
		w.nextPkt = 0
		w.readReq = 0 // a READ asks again from its first missing byte
		if d := q.comp.psn.Sub(w.firstPSN); d > 0 && uint32(d) < w.npsn {
			switch kindOf(w.wr.Opcode) {
			case kindSend, kindWrite:
				w.nextPkt = uint32(d)
			}
		}
	}
	if first {
		return
	}
	q.req.psn = q.comp.psn
	q.req.noAck = 0
}
