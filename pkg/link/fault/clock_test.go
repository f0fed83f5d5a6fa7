package fault

import (
	"testing"
	"time"

	"github.com/softroce/softroce/internal/clock"
)

// boxedClock is a clock whose AfterFunc returns a timer type of its own (not Timer).
type boxedClock struct{ m *clock.Manual }

type boxedTimer struct{ clock.Timer }

func (c boxedClock) Now() time.Time { return c.m.Now() }
func (c boxedClock) AfterFunc(d time.Duration, f func()) boxedTimer {
	return boxedTimer{c.m.AfterFunc(d, f)}
}

// TestAdaptClock: a clock.Clock passes through as it is; a clock with its own timer type is
// adapted (T inferred), its Now, AfterFunc and timers reaching the underlying clock.
func TestAdaptClock(t *testing.T) {
	m := newManualClock()
	if a := AdaptClock(m); a != Clock(m) {
		t.Fatalf("AdaptClock wrapped a Clock: %T", a)
	}
	c := AdaptClock(boxedClock{m})
	if _, same := c.(*clock.Manual); same || !c.Now().Equal(m.Now()) {
		t.Fatal("adapted clock: not wrapped, or Now differs")
	}
	fired := 0
	tm := c.AfterFunc(time.Second, func() { fired++ })
	if !tm.Reset(2*time.Second) || m.Pending() != 1 {
		t.Fatal("Reset through the adapter")
	}
	m.Advance(time.Second)
	if fired != 0 {
		t.Fatal("Reset ignored")
	}
	m.Advance(time.Second)
	if fired != 1 || tm.Stop() {
		t.Fatalf("fired %d", fired)
	}
	r := RealClock()
	if _, ok := r.(clock.Real); !ok {
		t.Fatalf("RealClock is %T", r)
	}
}

func TestStrings(t *testing.T) {
	if DirSend.String() != "send" || DirRecv.String() != "recv" || Duplicate.String() != "dup" ||
		Discard.String() != "discard" || Action(42).String() != "action(42)" {
		t.Fatal("names")
	}
}
