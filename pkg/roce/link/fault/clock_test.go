package fault

import (
	"testing"
	"time"

	"github.com/softroce/softroce/pkg/clock"
)

func TestAdaptClock(t *testing.T) {
	clk := newManualClock()
	c := AdaptClock(clk) // T inferred as *manualTimer
	fired := 0
	tm := c.AfterFunc(time.Second, func() { fired++ })
	if !c.Now().Equal(clk.Now()) {
		t.Fatal("Now")
	}
	clk.Advance(time.Second - 1)
	if fired != 0 {
		t.Fatal("early")
	}
	tm.Reset(2 * time.Second)
	clk.Advance(time.Second)
	if fired != 0 {
		t.Fatal("Reset ignored")
	}
	clk.Advance(time.Second)
	if fired != 1 || tm.Stop() {
		t.Fatalf("fired %d", fired)
	}
	r := RealClock()
	if d := time.Since(r.Now()); d < 0 || d > time.Minute {
		t.Fatal("RealClock.Now")
	}
	rt := r.AfterFunc(time.Hour, func() {})
	if !rt.Stop() {
		t.Fatal("real timer was not pending")
	}
	// A clock.Clock (the engine's ManualClock) needs no adapter: AdaptClock returns it.
	m := clock.NewManual(time.Unix(0, 0))
	if a := AdaptClock(m); a != Clock(m) {
		t.Fatalf("AdaptClock wrapped a Clock: %T", a)
	}
}

func TestStrings(t *testing.T) {
	if DirSend.String() != "send" || DirRecv.String() != "recv" || Duplicate.String() != "dup" ||
		Discard.String() != "discard" || Action(42).String() != "action(42)" {
		t.Fatal("names")
	}
}
