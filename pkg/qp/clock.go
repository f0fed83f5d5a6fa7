package qp

import (
	"sort"
	"sync"
	"time"
)

// Clock is the engine's source of time (gVisor tcpip.Clock style). The
// engine never reads the wall clock directly: every protocol decision is a
// function of Clock.Now, and the single per-QP timer comes from AfterFunc,
// so tests drive time with a ManualClock.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// AfterFunc calls f in its own goroutine (or, for a fake clock, in
	// the goroutine advancing time) once d has elapsed.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a stoppable, resettable one-shot timer made by a Clock.
type Timer interface {
	// Stop prevents the timer from firing; it reports whether it was
	// pending.
	Stop() bool
	// Reset re-arms the timer to fire after d; it reports whether it was
	// pending.
	Reset(d time.Duration) bool
}

// RealClock is the Clock backed by package time.
type RealClock struct{}

// Now returns time.Now().
func (RealClock) Now() time.Time { return time.Now() }

// AfterFunc wraps time.AfterFunc.
func (RealClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// ManualClock is a fake Clock for tests (gVisor faketime.ManualClock style):
// time only moves when Advance is called, and due timers run synchronously
// in the goroutine calling Advance, in deadline order. The zero value is not
// usable; use NewManualClock.
type ManualClock struct {
	mu     sync.Mutex
	now    time.Time
	timers map[*manualTimer]struct{}
	seq    uint64
}

// NewManualClock returns a ManualClock starting at start.
func NewManualClock(start time.Time) *ManualClock {
	return &ManualClock{now: start, timers: map[*manualTimer]struct{}{}}
}

// Now returns the clock's current time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc registers f to run when the clock has been advanced past d.
func (c *ManualClock) AfterFunc(d time.Duration, f func()) Timer {
	t := &manualTimer{c: c, f: f}
	t.Reset(d)
	return t
}

// Pending reports how many timers are armed.
func (c *ManualClock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// NextDeadline returns the earliest armed deadline, if any.
func (c *ManualClock) NextDeadline() (time.Time, bool) {
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

// Advance moves time forward by d, running every timer that falls due, in
// deadline order, each with the clock set to its deadline. Callbacks may
// arm new timers; those also run if they fall due within the advance.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		due := make([]*manualTimer, 0, len(c.timers))
		for t := range c.timers {
			if !t.when.After(end) {
				due = append(due, t)
			}
		}
		if len(due) == 0 {
			c.now = end
			c.mu.Unlock()
			return
		}
		sort.Slice(due, func(i, j int) bool {
			if due[i].when.Equal(due[j].when) {
				return due[i].seq < due[j].seq
			}
			return due[i].when.Before(due[j].when)
		})
		t := due[0]
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
	c    *ManualClock
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
