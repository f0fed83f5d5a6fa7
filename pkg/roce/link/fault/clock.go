package fault

import "time"

// Clock is the fault injector's source of time (gVisor tcpip.Clock style). Delayed, reordered
// and delayed-duplicate datagrams are released by timers from AfterFunc, so a test driving a
// fake clock sees every release without sleeping. Its method set matches pkg/qp's Clock except
// for the Timer type; AdaptClock converts one (or any similar clock) into this one.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// AfterFunc calls f once d has elapsed: in its own goroutine for real time, or, for a fake
	// clock, in the goroutine advancing time.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a stoppable, resettable one-shot timer made by a Clock (as *time.Timer).
type Timer interface {
	// Stop prevents the timer from firing; it reports whether it was pending.
	Stop() bool
	// Reset re-arms the timer to fire after d; it reports whether it was pending.
	Reset(d time.Duration) bool
}

// realClock is the Clock backed by package time.
type realClock struct{}

func (realClock) Now() time.Time                            { return time.Now() }
func (realClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// RealClock returns the Clock backed by package time (the default when Options.Clock is nil).
func RealClock() Clock { return realClock{} }

// TimerClock is any clock whose AfterFunc returns its own timer type T, such as pkg/qp's Clock
// (T = qp.Timer) or *qp.ManualClock.
type TimerClock[T Timer] interface {
	Now() time.Time
	AfterFunc(d time.Duration, f func()) T
}

// AdaptClock makes a Clock of c, so the fault injector and the engine can share one fake clock:
// fault.AdaptClock(qpManualClock) (T is inferred from c's AfterFunc).
func AdaptClock[T Timer](c TimerClock[T]) Clock { return adapted[T]{c} }

type adapted[T Timer] struct{ c TimerClock[T] }

func (a adapted[T]) Now() time.Time                            { return a.c.Now() }
func (a adapted[T]) AfterFunc(d time.Duration, f func()) Timer { return a.c.AfterFunc(d, f) }
