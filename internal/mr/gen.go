package mr

import (
	"context"
	"sync/atomic"
	"time"
)

// gen is one registration of an MR (RegMR, then one per Rereg): the accesses that passed a
// check of its mappings and have not called done.
type gen struct {
	users    atomic.Int64
	draining atomic.Bool
	drain    chan struct{}
	doneFn   func()
}

func newGen() *gen {
	g := &gen{drain: make(chan struct{}, 1)}
	g.doneFn = g.release
	return g
}

func (g *gen) release() {
	if g.users.Add(-1) == 0 && g.draining.Load() {
		select {
		case g.drain <- struct{}{}:
		default:
		}
	}
}

// waitGens waits until no access of the registrations gens is in flight, bounded by o; it
// reports whether they all drained.
func waitGens(gens []*gen, o DeregOptions) bool {
	for _, g := range gens {
		g.draining.Store(true) // before the first look at users: a release to 0 then signals
	}
	defer func() {
		for _, g := range gens {
			g.draining.Store(false)
		}
	}()
	ctx := o.Context
	if ctx == nil {
		ctx = context.Background()
	}
	var tc <-chan time.Time
	for _, g := range gens {
		for g.users.Load() != 0 {
			if tc == nil && o.Timeout >= 0 {
				d := o.Timeout
				if d == 0 {
					d = DefaultDeregTimeout
				}
				tm := time.NewTimer(d)
				defer tm.Stop()
				tc = tm.C
			}
			select {
			case <-g.drain:
			case <-ctx.Done():
				return g.users.Load() == 0 && drained(gens)
			case <-tc:
				return g.users.Load() == 0 && drained(gens)
			}
		}
	}
	return true
}

// drained reports whether no access of gens is in flight.
func drained(gens []*gen) bool {
	for _, g := range gens {
		if g.users.Load() != 0 {
			return false
		}
	}
	return true
}
