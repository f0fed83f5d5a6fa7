package cq

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestAfterPushOutsideLock: AfterPush runs after a completion the hook took, with the CQ's
// lock released (the daemon writes its client's eventfd there, not under the lock): calling
// Len from it would deadlock if the lock were still held. It does not run for a completion
// the hook refused, nor for one the CQ stored.
func TestAfterPushOutsideLock(t *testing.T) {
	room := 1
	var afters int
	var c *CQ
	c = mustNew(t, Options{Capacity: 4,
		OnPush:    func(*WC, bool) bool { room--; return room >= 0 },
		AfterPush: func() { afters++; _ = c.Len() }})
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Push(&WC{WRID: 1}, false) // taken: AfterPush
		c.Push(&WC{WRID: 2}, false) // refused: stored, no AfterPush
		c.Push(&WC{WRID: 3}, false) // not offered (the CQ holds one): stored
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("AfterPush ran with the CQ's lock held (deadlock)")
	}
	if afters != 1 || c.Len() != 2 {
		t.Fatalf("AfterPush ran %d times (want 1), %d stored (want 2)", afters, c.Len())
	}
}

// TestSetPushHooksWaitsForAfter: when SetPushHooks returns, no AfterPush call of the previous
// hooks is running (the daemon closes the eventfd AfterPush writes right after removing the
// hooks). Producers push concurrently while the hooks are removed and installed again.
func TestSetPushHooksWaitsForAfter(t *testing.T) {
	c := mustNew(t, Options{Capacity: 1 << 10})
	var running atomic.Int32
	var calls atomic.Int64
	hook := func(*WC, bool) bool { return true }
	after := func() {
		running.Add(1)
		for i := 0; i < 200; i++ { // a system call's worth of work
			calls.Add(0)
		}
		calls.Add(1)
		running.Add(-1)
	}
	c.SetPushHooks(hook, after)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := 0; g < 2; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]WC, 4)
			for {
				select {
				case <-stop:
					return
				default:
				}
				c.Push(&WC{}, false)
				if c.Len() > 0 { // stored while the hooks were off
					c.Poll(buf)
				}
			}
		}()
	}
	for i := 0; i < 300; i++ {
		c.SetPushHooks(nil, nil)
		if n := running.Load(); n != 0 {
			close(stop)
			wg.Wait()
			t.Fatalf("iteration %d: %d AfterPush calls still running after SetPushHooks(nil, nil)", i, n)
		}
		c.SetPushHooks(hook, after)
		// let the producers through the new hooks before removing them again
		for n, deadline := calls.Load(), time.Now().Add(10*time.Second); calls.Load() == n; {
			if time.Now().After(deadline) {
				close(stop)
				wg.Wait()
				t.Fatal("producers stalled")
			}
			runtime.Gosched()
		}
	}
	close(stop)
	wg.Wait()
	if calls.Load() == 0 {
		t.Fatal("AfterPush never ran")
	}
}
