package fault

import (
	"time"

	"github.com/softroce/softroce/internal/clock"
)

// Clock is the fault injector's source of time (internal/clock's Clock, the same type as qp.Clock
// and cq.Clock). Delayed, reordered and delayed-duplicate datagrams are released by timers
// from AfterFunc, so a test driving a fake clock (clock.Manual, qp.ManualClock) sees every
// release without sleeping.
type Clock = clock.Clock

// Timer is a stoppable, resettable one-shot timer made by a Clock (internal/clock's Timer).
type Timer = clock.Timer

// RealClock returns the Clock backed by package time (the default when Options.Clock is nil).
func RealClock() Clock { return clock.Real{} }

// TimerClock is any clock whose AfterFunc returns some timer type T of its own; a Clock
// (T = Timer) is one.
type TimerClock[T Timer] interface {
	Now() time.Time
	AfterFunc(d time.Duration, f func()) T
}

// AdaptClock makes a Clock of c (T is inferred from c's AfterFunc). A c that is already a
// Clock, such as *clock.Manual or *qp.ManualClock, is returned as it is: pass those to
// Options.Clock directly. AdaptClock remains for clocks whose AfterFunc returns a concrete
// timer type.
func AdaptClock[T Timer](c TimerClock[T]) Clock {
	if cc, ok := any(c).(Clock); ok {
		return cc
	}
	return adapted[T]{c}
}

type adapted[T Timer] struct{ c TimerClock[T] }

func (a adapted[T]) Now() time.Time                            { return a.c.Now() }
func (a adapted[T]) AfterFunc(d time.Duration, f func()) Timer { return a.c.AfterFunc(d, f) }
