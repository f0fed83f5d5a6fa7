package cq

import (
	"errors"
	"sync"
	"testing"
)

// TestResize: a resize keeps the queued completions in order across the ring's wrap, refuses a
// size below them (and out of range, and after Destroy), and the new size bounds later pushes.
func TestResize(t *testing.T) {
	c := mustNew(t, Options{Capacity: 4})
	push := func(id uint64) bool { return c.Push(&WC{WRID: id}, false) }
	for id := uint64(1); id <= 4; id++ {
		push(id)
	}
	var wc [2]WC
	c.Poll(wc[:2]) // head moves: the next pushes wrap
	push(5)
	push(6)
	for _, n := range []int{0, 3, MaxCapacity + 1} {
		if err := c.Resize(n); !errors.Is(err, ErrCapacity) {
			t.Fatalf("resize to %d with 4 queued: %v", n, err)
		}
	}
	if err := c.Resize(4); err != nil || c.Cap() != 4 {
		t.Fatalf("resize to the queued count: %v, cap %d", err, c.Cap())
	}
	if err := c.Resize(6); err != nil || c.Cap() != 6 {
		t.Fatalf("grow: %v, cap %d", err, c.Cap())
	}
	push(7)
	push(8)
	if push(9) || !errors.Is(c.Err(), ErrCQError) {
		t.Fatal("the seventh completion of a 6-entry CQ must overrun it")
	}
	var got [8]WC
	n := c.Poll(got[:])
	for i := 0; i < n; i++ {
		if got[i].WRID != uint64(3+i) {
			t.Fatalf("completion %d is %d, want %d (in order, none lost)", i, got[i].WRID, 3+i)
		}
	}
	if n != 6 {
		t.Fatalf("polled %d, want 6", n)
	}
	swapErr := errors.New("refused")
	if err := c.ResizeFunc(2, func(kept int) error { return swapErr }); err != swapErr || c.Cap() != 6 {
		t.Fatalf("a swap error aborts: %v, cap %d", err, c.Cap())
	}
	c.Destroy()
	if err := c.Resize(8); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Destroy: %v", err)
	}
}

// TestResizeUnderPushes: producers push while the CQ is resized up and down (never below what
// they may have queued); every completion is polled exactly once, in each producer's order.
func TestResizeUnderPushes(t *testing.T) {
	const producers, each = 4, 2000
	c := mustNew(t, Options{Capacity: producers * each})
	var wg sync.WaitGroup
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				if !c.Push(&WC{WRID: uint64(p)<<32 | uint64(i)}, false) {
					t.Error("push refused")
					return
				}
			}
		}(p)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	next := make([]uint64, producers)
	var wc [16]WC
	poll := func() int {
		n := c.Poll(wc[:])
		for _, w := range wc[:n] {
			p, i := w.WRID>>32, w.WRID&0xFFFFFFFF
			if i != next[p] {
				t.Fatalf("producer %d: completion %d, want %d", p, i, next[p])
			}
			next[p]++
		}
		return n
	}
	for k := 0; ; k++ {
		// never below what may be queued: no push overruns, every resize moves entries
		if err := c.Resize(producers*each + k%1000); err != nil {
			t.Fatal(err)
		}
		poll()
		select {
		case <-done:
			for poll() > 0 {
			}
			for p, n := range next {
				if n != each {
					t.Fatalf("producer %d: %d completions polled, want %d", p, n, each)
				}
			}
			return
		default:
		}
	}
}
