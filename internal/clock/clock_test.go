package clock

import (
	"testing"
	"time"
)

var t0 = time.Unix(1_700_000_000, 0)

func TestManualOrderAndNow(t *testing.T) {
	c := NewManual(t0)
	var got []string
	var at []time.Duration
	rec := func(s string) func() {
		return func() { got = append(got, s); at = append(at, c.Now().Sub(t0)) }
	}
	c.AfterFunc(3*time.Second, rec("c"))
	c.AfterFunc(1*time.Second, rec("a"))
	c.AfterFunc(2*time.Second, rec("b1"))
	c.AfterFunc(2*time.Second, rec("b2")) // same deadline: armed later, runs later
	if c.Pending() != 4 {
		t.Fatalf("pending %d", c.Pending())
	}
	if d, ok := c.NextDeadline(); !ok || !d.Equal(t0.Add(time.Second)) {
		t.Fatalf("next deadline %v %v", d, ok)
	}
	c.Advance(2500 * time.Millisecond)
	want := []string{"a", "b1", "b2"}
	if len(got) != len(want) {
		t.Fatalf("ran %v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("ran %v, want %v", got, want)
		}
	}
	if at[0] != time.Second || at[1] != 2*time.Second || at[2] != 2*time.Second {
		t.Fatalf("callbacks saw %v", at)
	}
	if c.Now().Sub(t0) != 2500*time.Millisecond || c.Pending() != 1 {
		t.Fatalf("now %v pending %d", c.Now().Sub(t0), c.Pending())
	}
}

func TestManualStopResetAndChained(t *testing.T) {
	c := NewManual(t0)
	fired := 0
	tm := c.AfterFunc(time.Second, func() { fired++ })
	c.Advance(time.Second - 1)
	if fired != 0 {
		t.Fatal("early")
	}
	if !tm.Reset(2 * time.Second) { // re-armed from now: due at 3s-1ns
		t.Fatal("Reset: was pending")
	}
	c.Advance(time.Second)
	if fired != 0 {
		t.Fatal("Reset ignored")
	}
	c.Advance(time.Second)
	if fired != 1 || tm.Stop() {
		t.Fatalf("fired %d", fired)
	}
	if tm.Reset(time.Second) || !tm.Stop() {
		t.Fatal("Reset of a fired timer / Stop of a pending one")
	}
	c.Advance(time.Hour)
	if fired != 1 {
		t.Fatal("stopped timer fired")
	}
	if _, ok := c.NextDeadline(); ok {
		t.Fatal("deadline with no timer")
	}
	// A callback arming a timer that falls due within the same Advance runs too.
	n := 0
	var step func()
	step = func() {
		n++
		if n < 3 {
			c.AfterFunc(time.Millisecond, step)
		}
	}
	c.AfterFunc(time.Millisecond, step)
	c.Advance(10 * time.Millisecond)
	if n != 3 || c.Pending() != 0 {
		t.Fatalf("chained %d pending %d", n, c.Pending())
	}
}

func TestManualAdvanceZeroAlloc(t *testing.T) {
	c := NewManual(t0)
	f := func() {}
	tm := c.AfterFunc(time.Millisecond, f)
	if a := testing.AllocsPerRun(100, func() {
		tm.Reset(time.Millisecond)
		c.Advance(time.Millisecond)
	}); a != 0 {
		t.Fatalf("%v allocs per Reset+Advance", a)
	}
}

func TestReal(t *testing.T) {
	var r Clock = Real{}
	if d := time.Since(r.Now()); d < 0 || d > time.Minute {
		t.Fatal("Real.Now")
	}
	tm := r.AfterFunc(time.Hour, func() {})
	if !tm.Stop() {
		t.Fatal("real timer was not pending")
	}
}

// TestRealNow: Real.Now (one monotonic read added to a base) lies between two time.Now
// readings taken around it, by the monotonic clock and by the wall clock (nothing steps the
// test machine's clock within microseconds), keeps a monotonic reading, and moves.
func TestRealNow(t *testing.T) {
	var c Clock = Real{}
	for i := 0; i < 1000; i++ {
		a := time.Now()
		r := c.Now()
		b := time.Now()
		if r.Before(a) || r.After(b) {
			t.Fatalf("Real.Now %v outside [%v, %v]", r, a, b)
		}
		if r.Round(0) == r { // Round(0) strips the monotonic reading
			t.Fatalf("Real.Now %v has no monotonic reading", r)
		}
		if w := r.Round(0).Sub(a.Round(0)); w < -time.Second || w > time.Second+b.Sub(a) {
			t.Fatalf("Real.Now's wall reading %v is %v from time.Now's", r, w)
		}
	}
	r1 := c.Now()
	for !c.Now().After(r1) {
	}
}

// BenchmarkRealNow: Real.Now (one vDSO clock read) against time.Now (two).
func BenchmarkRealNow(b *testing.B) {
	var c Clock = Real{}
	for i := 0; i < b.N; i++ {
		_ = c.Now()
	}
}

// BenchmarkTimeNow is time.Now, BenchmarkRealNow's reference.
func BenchmarkTimeNow(b *testing.B) {
	for i := 0; i < b.N; i++ {
		_ = time.Now()
	}
}
