package cq

import "time"

// ModTimer is the lazy one-shot timer of completion event moderation (Moderation.PeriodUS):
// it makes an event due one period after Start and calls its owner back when the period is
// over. The CQ uses one for its own event, and the softroce daemon one per client ring arm.
//
// It is lazy: Stop only cancels the due event and leaves the underlying Timer scheduled,
// and a Start whose deadline comes after the time the Timer is already scheduled for does
// not move it (Expire, called early, re-schedules it for the rest), so a busy CQ pays about
// one Timer operation per period instead of a Reset and a Stop per event (each may wake the
// runtime's poller). The Timer is made by the first Start and reset afterwards: a ModTimer
// allocates nothing per event.
//
// A ModTimer is not safe for concurrent use: the owner's lock guards every call, including
// the Expire call of the owner's callback (which takes that lock itself). The zero value is
// ready for Bind.
type ModTimer struct {
	clock    Clock
	expire   func()
	timer    Timer
	deadline time.Time // when the due event fires
	timerAt  time.Time // when the Timer is scheduled for (if timerSet)
	due      bool      // an event is due at deadline
	timerSet bool      // the Timer is scheduled
}

// Bind sets the clock and the callback the Timer runs (without the owner's lock held; it
// takes the lock and calls Expire). Only the first Bind counts: later calls change nothing,
// so an owner may bind where it turns moderation on. Bind must precede Start.
func (t *ModTimer) Bind(c Clock, expire func()) {
	if t.expire == nil {
		t.clock, t.expire = c, expire
	}
}

// Due reports whether an event is due (started and neither stopped nor expired).
func (t *ModTimer) Due() bool { return t.due }

// Start makes the event due d from now. The Timer is made once (the first Start) and reset
// afterwards, and only if it is not already scheduled to fire by the new deadline.
func (t *ModTimer) Start(d time.Duration) {
	t.deadline = t.clock.Now().Add(d)
	t.due = true
	if t.timerSet && !t.timerAt.After(t.deadline) {
		return // fires by then; Expire re-schedules for the rest
	}
	t.timerSet, t.timerAt = true, t.deadline
	if t.timer == nil {
		t.timer = t.clock.AfterFunc(d, t.expire)
		return
	}
	t.timer.Reset(d)
}

// Stop cancels the due event. The Timer stays scheduled and its callback finds nothing to
// do (Expire returns false).
func (t *ModTimer) Stop() { t.due = false }

// Expire is for the owner's callback, under the owner's lock: it reports whether the due
// event has come, and if so clears it. A call before the deadline re-schedules the Timer for
// the rest of the period and returns false; a stale call (the event was stopped) returns
// false and changes nothing else.
func (t *ModTimer) Expire() bool {
	t.timerSet = false
	if !t.due {
		return false
	}
	if now := t.clock.Now(); now.Before(t.deadline) {
		t.timerSet, t.timerAt = true, t.deadline
		t.timer.Reset(t.deadline.Sub(now))
		return false
	}
	t.due = false
	return true
}

// Close cancels the due event and stops the Timer, for an owner being destroyed.
func (t *ModTimer) Close() {
	t.due = false
	if t.timer != nil {
		t.timer.Stop()
		t.timerSet = false
	}
}
