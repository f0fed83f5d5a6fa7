package cq

import (
	"sync"
	"testing"
	"time"
)

// fakeClock is a manual Clock: time moves only in Advance, which runs due timers in the
// calling goroutine.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
	due    []*fakeTimer // Advance's scratch (reused: the clock allocates nothing per call)
}

type fakeTimer struct {
	c      *fakeClock
	f      func()
	when   time.Time
	armed  bool
	resets int // Reset calls (AfterFunc's first arming included)
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) Timer {
	t := &fakeTimer{c: c, f: f}
	c.mu.Lock()
	c.timers = append(c.timers, t)
	c.mu.Unlock()
	t.Reset(d)
	return t
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.armed
	t.armed = false
	return was
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.armed
	t.armed, t.when = true, t.c.now.Add(d)
	t.resets++
	return was
}

// Advance moves time by d and runs every timer due by then, in deadline order.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	due := c.due[:0]
	for _, t := range c.timers {
		if t.armed && !t.when.After(c.now) {
			t.armed = false
			due = append(due, t)
		}
	}
	for i := 1; i < len(due); i++ { // deadline order (insertion sort: no allocation)
		for j := i; j > 0 && due[j].when.Before(due[j-1].when); j-- {
			due[j], due[j-1] = due[j-1], due[j]
		}
	}
	c.due = due
	c.mu.Unlock()
	for _, t := range due {
		t.f()
	}
}

// armed reports how many of the clock's timers are pending.
func (c *fakeClock) armed() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, t := range c.timers {
		if t.armed {
			n++
		}
	}
	return n
}

func modCQ(t *testing.T, m Moderation) (*CQ, *fakeClock) {
	t.Helper()
	clk := newFakeClock()
	c := mustNew(t, Options{Capacity: 64, Clock: clk})
	if err := c.SetModeration(m); err != nil {
		t.Fatal(err)
	}
	return c, clk
}

// TestModerationCount: with Count 4 an armed CQ fires at the push that makes 4 completions
// queued, not before; the period timer is stopped then.
func TestModerationCount(t *testing.T) {
	c, clk := modCQ(t, Moderation{Count: 4, PeriodUS: 100})
	c.ReqNotify(false)
	for i := 1; i <= 3; i++ {
		c.Push(&WC{WRID: uint64(i)}, false)
		if pending(c) {
			t.Fatalf("event after %d completions (Count 4)", i)
		}
	}
	if clk.armed() != 1 {
		t.Fatalf("%d period timers armed, want 1", clk.armed())
	}
	c.Push(&WC{WRID: 4}, false)
	if !pending(c) {
		t.Fatal("no event at 4 queued completions")
	}
	clk.Advance(time.Second) // the lazy timer, still scheduled, fires nothing
	if pending(c) {
		t.Fatal("a second event without a new arm")
	}
}

// TestModerationPeriod: fewer than Count completions fire the event when the period has
// passed since the first one, not earlier; a later completion does not restart the period.
func TestModerationPeriod(t *testing.T) {
	c, clk := modCQ(t, Moderation{Count: 8, PeriodUS: 50})
	c.ReqNotify(false)
	c.Push(&WC{WRID: 1}, false)
	clk.Advance(30 * time.Microsecond)
	c.Push(&WC{WRID: 2}, false)
	clk.Advance(19 * time.Microsecond)
	if pending(c) {
		t.Fatal("event before the period passed")
	}
	clk.Advance(1 * time.Microsecond)
	if !pending(c) {
		t.Fatal("no event once the period passed since the first completion")
	}
	// Disarmed now: more completions and time fire nothing.
	c.Push(&WC{WRID: 3}, false)
	clk.Advance(time.Millisecond)
	if pending(c) {
		t.Fatal("event without an arm")
	}
	// The next arm starts a new period at its first completion.
	var got [8]WC
	c.Poll(got[:])
	c.ReqNotify(false)
	clk.Advance(time.Millisecond) // no completion: no timer, no event
	if pending(c) {
		t.Fatal("event with no completion")
	}
	c.Push(&WC{WRID: 4}, false)
	clk.Advance(49 * time.Microsecond)
	if pending(c) {
		t.Fatal("event before the new period passed")
	}
	clk.Advance(time.Microsecond)
	if !pending(c) {
		t.Fatal("no event for the second arm")
	}
}

// TestModerationSolicited: armed for solicited, unsolicited successful completions neither
// fire nor start the period; the first solicited one starts it, and from then on every
// completion counts towards Count.
func TestModerationSolicited(t *testing.T) {
	c, clk := modCQ(t, Moderation{Count: 3, PeriodUS: 10})
	c.ReqNotify(true)
	c.Push(&WC{WRID: 1}, false)
	c.Push(&WC{WRID: 2}, false)
	c.Push(&WC{WRID: 3}, false)
	clk.Advance(time.Second)
	if pending(c) || clk.armed() != 0 {
		t.Fatal("unsolicited completions fired or started the period")
	}
	var got [8]WC
	c.Poll(got[:])
	c.Push(&WC{WRID: 4, Opcode: OpRecv}, true) // solicited: trigger, 1 queued
	if pending(c) {
		t.Fatal("event at 1 queued completion (Count 3)")
	}
	c.Push(&WC{WRID: 5}, false)
	c.Push(&WC{WRID: 6}, false) // 3 queued
	if !pending(c) {
		t.Fatal("no event at 3 queued completions after a solicited one")
	}
	// An error completion triggers too (IBTA 11.4.2.2), then the period fires.
	c.Poll(got[:])
	c.ReqNotify(true)
	c.Push(&WC{WRID: 7, Status: StatusRemAccessErr}, false)
	clk.Advance(10 * time.Microsecond)
	if !pending(c) {
		t.Fatal("no event for an error completion after the period")
	}
}

// TestModerationOffUnchanged: Count 0 and Count 1 keep the unmoderated semantics (first
// matching completion fires; solicited mode ignores unsolicited successes; queued
// completions do not fire a new arm) and never start a timer.
func TestModerationOffUnchanged(t *testing.T) {
	for _, m := range []Moderation{{}, {Count: 1, PeriodUS: 100}, {Count: 0, PeriodUS: 5}} {
		c, clk := modCQ(t, m)
		c.Push(&WC{WRID: 1}, false) // queued before the arm
		c.ReqNotify(false)
		if pending(c) {
			t.Fatalf("%+v: queued completion fired a new arm", m)
		}
		c.Push(&WC{WRID: 2}, false)
		if !pending(c) {
			t.Fatalf("%+v: next completion did not fire", m)
		}
		c.ReqNotify(true)
		c.Push(&WC{WRID: 3}, false)
		if pending(c) {
			t.Fatalf("%+v: unsolicited success fired a solicited arm", m)
		}
		c.Push(&WC{WRID: 4}, true)
		if !pending(c) {
			t.Fatalf("%+v: solicited completion did not fire", m)
		}
		if clk.armed() != 0 || len(clk.timers) != 0 {
			t.Fatalf("%+v: moderation off made a timer", m)
		}
	}
}

// TestModerationStaleTimer: a period timer whose event the count already fired, or that
// was reset for a later arm, fires nothing early.
func TestModerationStaleTimer(t *testing.T) {
	c, clk := modCQ(t, Moderation{Count: 2, PeriodUS: 100})
	c.ReqNotify(false)
	c.Push(&WC{WRID: 1}, false)
	// Run the timer's function directly, as a timer already firing when the count fired
	// would: it must see the event is not due.
	c.Push(&WC{WRID: 2}, false)
	if !pending(c) {
		t.Fatal("no event at Count")
	}
	c.expire()
	var got [4]WC
	c.Poll(got[:])
	c.ReqNotify(false)
	c.Push(&WC{WRID: 3}, false) // new period from now
	clk.Advance(50 * time.Microsecond)
	c.expire() // stale call before the deadline
	if pending(c) {
		t.Fatal("stale timer call fired the event early")
	}
	clk.Advance(50 * time.Microsecond)
	if !pending(c) {
		t.Fatal("no event at the period")
	}
}

// TestModerationLazyTimer: an event the count fires leaves the timer scheduled, and the next
// arm's period (ending later) does not move it: the timer, firing early, re-schedules itself
// for the rest, and the event still comes exactly at the end of the new period. Many events
// by count within one period cost one timer operation, not two each.
func TestModerationLazyTimer(t *testing.T) {
	c, clk := modCQ(t, Moderation{Count: 2, PeriodUS: 100})
	var got [8]WC
	c.ReqNotify(false)
	c.Push(&WC{WRID: 1}, false) // t=0: timer for t=100
	c.Push(&WC{WRID: 2}, false) // count: event
	if !pending(c) {
		t.Fatal("no event at Count")
	}
	c.Poll(got[:])
	for i := 0; i < 20; i++ { // 20 events by count, 1 us apart
		clk.Advance(time.Microsecond)
		c.ReqNotify(false)
		c.Push(&WC{WRID: 3}, false)
		c.Push(&WC{WRID: 4}, false)
		if !pending(c) {
			t.Fatalf("event %d: none at Count", i)
		}
		c.Poll(got[:])
	}
	if r := clk.timers[0].resets; r != 1 {
		t.Fatalf("%d timer operations for 21 events by count within one period, want 1", r)
	}
	// t=50: a new arm's period ends at t=150; the timer (t=100) must not fire it early.
	clk.Advance(30 * time.Microsecond)
	c.ReqNotify(false)
	c.Push(&WC{WRID: 5}, false)
	clk.Advance(50 * time.Microsecond) // t=100: the timer fires, re-schedules
	if pending(c) {
		t.Fatal("event before the period ended (timer scheduled for an earlier period)")
	}
	clk.Advance(49 * time.Microsecond)
	if pending(c) {
		t.Fatal("event before the period ended")
	}
	clk.Advance(time.Microsecond)
	if !pending(c) {
		t.Fatal("no event at the end of the period")
	}
}

// TestWaitReturnsEventAndClosed: Wait consumes the armed event, and Destroy ends a Wait.
func TestWaitReturnsEventAndClosed(t *testing.T) {
	c := mustNew(t, Options{Capacity: 4})
	c.ReqNotify(false)
	c.Push(&WC{WRID: 1}, false)
	if err := c.Wait(); err != nil {
		t.Fatal(err)
	}
	if pending(c) {
		t.Fatal("Wait did not consume the event")
	}
	res := make(chan error, 1)
	go func() { res <- c.Wait() }()
	c.Destroy()
	select {
	case err := <-res:
		if err != ErrClosed {
			t.Fatalf("Wait after Destroy: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Destroy did not end Wait")
	}
	if err := c.SetModeration(Moderation{Count: 2}); err != ErrClosed {
		t.Fatalf("SetModeration after Destroy: %v", err)
	}
}

// TestModerationNoAlloc: moderated pushes, timer resets and events allocate nothing once the
// timer exists.
func TestModerationNoAlloc(t *testing.T) {
	c, clk := modCQ(t, Moderation{Count: 4, PeriodUS: 10})
	wc := WC{WRID: 1}
	var got [8]WC
	cycle := func() {
		c.ReqNotify(false)
		c.Push(&wc, false)
		clk.Advance(10 * time.Microsecond)
		<-c.Channel()
		c.Poll(got[:])
	}
	cycle() // makes the timer
	if a := testing.AllocsPerRun(200, cycle); a != 0 {
		t.Fatalf("%.1f allocations per moderated event", a)
	}
}
