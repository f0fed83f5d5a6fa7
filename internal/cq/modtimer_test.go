package cq

import (
	"testing"
	"time"
)

// TestModTimer: the lazy moderation timer on its own. Start makes the event due one period
// later and the callback's Expire reports it exactly then; Stop makes a firing stale; a Start
// whose deadline is later than the scheduled timer does not touch the timer, whose early
// firing re-schedules it for the rest; the first Bind wins; Close stops the timer.
func TestModTimer(t *testing.T) {
	clk := newFakeClock()
	var mt ModTimer
	fired := 0
	mt.Bind(clk, func() {
		if mt.Expire() {
			fired++
		}
	})
	other := newFakeClock()
	mt.Bind(other, func() { t.Fatal("second Bind took effect") })

	mt.Start(100 * time.Microsecond) // t=0: due at 100
	if !mt.Due() || len(clk.timers) != 1 || len(other.timers) != 0 {
		t.Fatalf("due %v timers %d/%d", mt.Due(), len(clk.timers), len(other.timers))
	}
	clk.Advance(99 * time.Microsecond)
	if fired != 0 {
		t.Fatal("fired early")
	}
	clk.Advance(time.Microsecond)
	if fired != 1 || mt.Due() {
		t.Fatalf("at the deadline: fired %d due %v", fired, mt.Due())
	}

	// Stopped: the timer still fires, and finds nothing due.
	mt.Start(100 * time.Microsecond) // t=100: due at 200
	mt.Stop()
	if mt.Due() || clk.armed() != 1 {
		t.Fatal("Stop: due, or the timer was stopped (it stays scheduled)")
	}
	clk.Advance(100 * time.Microsecond)
	if fired != 1 || clk.armed() != 0 {
		t.Fatalf("stale firing: fired %d armed %d", fired, clk.armed())
	}

	// Lazy: t=200 due at 300, stopped; t=250 due at 350 leaves the timer (300) alone.
	mt.Start(100 * time.Microsecond)
	resets := clk.timers[0].resets
	mt.Stop()
	clk.Advance(50 * time.Microsecond)
	mt.Start(100 * time.Microsecond)
	if clk.timers[0].resets != resets {
		t.Fatal("a later deadline moved the scheduled timer")
	}
	clk.Advance(50 * time.Microsecond) // t=300: fires early, re-schedules for 350
	if fired != 1 || !mt.Due() || clk.armed() != 1 {
		t.Fatalf("early firing: fired %d due %v armed %d", fired, mt.Due(), clk.armed())
	}
	clk.Advance(49 * time.Microsecond)
	if fired != 1 {
		t.Fatal("fired before the re-scheduled deadline")
	}
	clk.Advance(time.Microsecond)
	if fired != 2 {
		t.Fatal("no event at the end of the later period")
	}

	// An earlier deadline than the scheduled one does reset the timer.
	mt.Start(time.Second)
	mt.Stop()
	mt.Start(10 * time.Microsecond)
	clk.Advance(10 * time.Microsecond)
	if fired != 3 {
		t.Fatal("an earlier deadline did not move the timer")
	}

	mt.Start(10 * time.Microsecond)
	mt.Close()
	if mt.Due() || clk.armed() != 0 {
		t.Fatal("Close left the event due or the timer armed")
	}
	clk.Advance(time.Second)
	if fired != 3 || len(clk.timers) != 1 {
		t.Fatalf("after Close: fired %d, %d timers made", fired, len(clk.timers))
	}
}

// TestModTimerNoAlloc: once the timer exists, a period (Start, firing, Expire) allocates
// nothing.
func TestModTimerNoAlloc(t *testing.T) {
	clk := newFakeClock()
	var mt ModTimer
	n := 0
	mt.Bind(clk, func() {
		if mt.Expire() {
			n++
		}
	})
	cycle := func() {
		mt.Start(10 * time.Microsecond)
		clk.Advance(10 * time.Microsecond)
	}
	cycle()
	if a := testing.AllocsPerRun(100, cycle); a != 0 {
		t.Fatalf("%.1f allocations per period", a)
	}
	if n != 102 {
		t.Fatalf("%d events for 102 periods", n)
	}
}
