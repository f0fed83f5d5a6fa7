package qp

import (
	"time"

	"github.com/softroce/softroce/internal/clock"
)

// Clock is the engine's source of time (internal/clock's Clock, gVisor tcpip.Clock style). The
// engine never reads the wall clock directly: every protocol decision is a function of
// Clock.Now, and the single per-QP timer comes from AfterFunc, so tests drive time with a
// ManualClock.
type Clock = clock.Clock

// Timer is a stoppable, resettable one-shot timer made by a Clock (internal/clock's Timer).
type Timer = clock.Timer

// RealClock is the Clock backed by package time (internal/clock's Real).
type RealClock = clock.Real

// ManualClock is the fake Clock for tests (internal/clock's Manual): time only moves when Advance
// is called, and due timers run synchronously in the goroutine calling Advance, in deadline
// order. Use NewManualClock.
type ManualClock = clock.Manual

// NewManualClock returns a ManualClock starting at start (clock.NewManual).
func NewManualClock(start time.Time) *ManualClock { return clock.NewManual(start) }
