package cq

import (
	"testing"
)

// TestPushHook: the hook takes completions while it accepts them (the CQ stores nothing and
// fires no event); once it refuses, completions queue in the CQ and the hook is not offered
// later ones until PollFunc drained the queue, so order is kept end to end.
func TestPushHook(t *testing.T) {
	var taken []uint64
	var sol []bool
	room := 2
	c := mustNew(t, Options{Capacity: 4, OnPush: func(wc *WC, solicited bool) bool {
		if room == 0 {
			return false
		}
		room--
		taken = append(taken, wc.WRID)
		sol = append(sol, solicited)
		return true
	}})
	if err := c.ReqNotify(false); err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 5; i++ {
		if !c.Push(&WC{WRID: i}, i == 2) {
			t.Fatalf("push %d refused", i)
		}
	}
	if len(taken) != 2 || taken[0] != 1 || taken[1] != 2 || sol[0] || !sol[1] {
		t.Fatalf("hook took %v (solicited %v), want [1 2] [false true]", taken, sol)
	}
	if c.Len() != 3 {
		t.Fatalf("queued %d, want 3", c.Len())
	}
	select {
	case <-c.Channel():
		// WRs 3..5 were stored: the armed CQ fired for the first of them.
	default:
		t.Fatal("stored completion did not fire the armed CQ")
	}
	// Room again: the hook must still not be offered a new completion ahead of the queue.
	room = 10
	c.Push(&WC{WRID: 6}, false)
	if len(taken) != 2 || c.Len() != 4 {
		t.Fatalf("hook bypassed the queue: taken %v, queued %d", taken, c.Len())
	}
	// PollFunc moves the queue in order and stops when f refuses.
	var moved []uint64
	if k := c.PollFunc(func(wc *WC) bool {
		if len(moved) == 2 {
			return false
		}
		moved = append(moved, wc.WRID)
		return true
	}); k != 2 || moved[0] != 3 || moved[1] != 4 {
		t.Fatalf("PollFunc took %d %v, want 2 [3 4]", k, moved)
	}
	c.PollFunc(func(wc *WC) bool { moved = append(moved, wc.WRID); return true })
	if len(moved) != 4 || moved[2] != 5 || moved[3] != 6 || c.Len() != 0 {
		t.Fatalf("moved %v, queued %d", moved, c.Len())
	}
	// Queue empty: the hook takes the next one, and no event fires for it.
	if err := c.ReqNotify(false); err != nil {
		t.Fatal(err)
	}
	c.Push(&WC{WRID: 7}, false)
	if taken[len(taken)-1] != 7 || c.Len() != 0 {
		t.Fatalf("hook not used after drain: %v", taken)
	}
	select {
	case <-c.Channel():
		t.Fatal("a completion the hook took fired the CQ's own channel")
	default:
	}
	// Removed hook: completions are stored again.
	c.SetOnPush(nil)
	c.Push(&WC{WRID: 8}, false)
	if c.Len() != 1 {
		t.Fatal("SetOnPush(nil) did not remove the hook")
	}
}

// TestPushHookOverrun: a refusing hook leaves the CQ's own overrun rule in force.
func TestPushHookOverrun(t *testing.T) {
	c := mustNew(t, Options{Capacity: 1, OnPush: func(*WC, bool) bool { return false }})
	if !c.Push(&WC{WRID: 1}, false) {
		t.Fatal("first push refused")
	}
	if c.Push(&WC{WRID: 2}, false) {
		t.Fatal("overrun accepted")
	}
	if c.Err() == nil {
		t.Fatal("no CQ error after overrun")
	}
}

// TestPushHookNoAlloc: with a hook, Push does not make the caller's WC escape.
func TestPushHookNoAlloc(t *testing.T) {
	c := mustNew(t, Options{Capacity: 4, OnPush: func(*WC, bool) bool { return true }})
	if n := testing.AllocsPerRun(100, func() {
		wc := WC{WRID: 1}
		c.Push(&wc, false)
	}); n != 0 {
		t.Fatalf("%.1f allocations per push", n)
	}
}
