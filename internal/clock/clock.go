// Package clock is softroce's one source of injected time (gVisor tcpip.Clock style): the
// transport engine (internal/qp), completion queue moderation (internal/cq, internal/daemon) and the fault
// injector (pkg/link/fault) read time only through a Clock and schedule work only through
// its AfterFunc, so tests drive all of them with one Manual clock and never sleep.
//
// internal/qp, internal/cq and pkg/link/fault keep their own names for these types as aliases
// (qp.Clock = clock.Clock, qp.ManualClock = clock.Manual, ...), so one value serves them all.
// The package uses the standard library only.
package clock

import (
	"sync"
	"time"
)

// Clock is a source of time. Every time-dependent decision is a function of Now, and timers
// come from AfterFunc, so a fake clock controls both.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// AfterFunc calls f in its own goroutine (or, for a fake clock, in the goroutine
	// advancing time) once d has elapsed.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a stoppable, resettable one-shot timer made by a Clock (*time.Timer is one).
type Timer interface {
	// Stop prevents the timer from firing; it reports whether it was pending.
	Stop() bool
	// Reset re-arms the timer to fire after d; it reports whether it was pending.
	Reset(d time.Duration) bool
}

// Real is the Clock backed by package time.
type Real struct{}

// realBase is Real's reference reading (wall and monotonic clock, at package initialisation).
var realBase = time.Now()

// Now returns the current time with one clock read: the monotonic clock's time since realBase
// added to realBase (time.Since reads only the monotonic clock; time.Now reads the wall clock
// too, which costs a second vDSO call per read — two per message on the polled path, ~150 ns
// each in the lab's emulated guest, docs/lab.md). Its monotonic reading is exactly
// time.Now's, so Sub, Before, After and Equal with any time.Now value or deadline are as
// precise as with time.Now (they use the monotonic readings); its wall reading is the wall
// clock of the process's start plus the time elapsed, so it does not follow later steps of
// the system clock (for timestamps meant for people, use time.Now).
func (Real) Now() time.Time { return realBase.Add(time.Since(realBase)) }

// AfterFunc wraps time.AfterFunc.
func (Real) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// Manual is a fake Clock for tests (gVisor faketime.ManualClock style): time only moves when
// Advance is called, and due timers run synchronously in the goroutine calling Advance, in
// deadline order (ties: in the order they were armed). The zero value is not usable; use
// NewManual.
type Manual struct {
	mu     sync.Mutex
	now    time.Time
	timers map[*manualTimer]struct{}
	seq    uint64
}

// NewManual returns a Manual clock starting at start.
func NewManual(start time.Time) *Manual {
	return &Manual{now: start, timers: map[*manualTimer]struct{}{}}
}

// Now returns the clock's current time.
func (c *Manual) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc registers f to run when the clock has been advanced past d.
func (c *Manual) AfterFunc(d time.Duration, f func()) Timer {
	t := &manualTimer{c: c, f: f}
	t.Reset(d)
	return t
}

// Pending reports how many timers are armed.
func (c *Manual) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// NextDeadline returns the earliest armed deadline, if any.
func (c *Manual) NextDeadline() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var best time.Time
	ok := false
	for t := range c.timers {
		if !ok || t.when.Before(best) {
			best, ok = t.when, true
		}
	}
	return best, ok
}

// Advance moves time forward by d, running every timer that falls due, in deadline order,
// each with the clock set to its deadline. Callbacks may arm new timers; those also run if
// they fall due within the advance. Advance itself allocates nothing.
func (c *Manual) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		var t *manualTimer // the earliest due timer (ties: armed first)
		for x := range c.timers {
			if !x.when.After(end) && (t == nil || x.when.Before(t.when) ||
				(x.when.Equal(t.when) && x.seq < t.seq)) {
				t = x
			}
		}
		if t == nil {
			c.now = end
			c.mu.Unlock()
			return
		}
		delete(c.timers, t)
		if t.when.After(c.now) {
			c.now = t.when
		}
		f := t.f
		c.mu.Unlock()
		f()
	}
}

type manualTimer struct {
	c    *Manual
	f    func()
	when time.Time
	seq  uint64
}

func (t *manualTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	_, ok := t.c.timers[t]
	delete(t.c.timers, t)
	return ok
}

func (t *manualTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	_, ok := t.c.timers[t]
	t.when = t.c.now.Add(d)
	t.c.seq++
	t.seq = t.c.seq
	t.c.timers[t] = struct{}{}
	return ok
}
