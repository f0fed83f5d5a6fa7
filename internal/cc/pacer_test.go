package cc

import (
	"math/rand/v2"
	"testing"
	"time"
)

// pace runs a sender that always has packets of size bytes and wakes when the pacer says it
// may send, late by up to maxLate (a timer's lateness), for the simulated duration d. It
// returns the achieved rate in bit/s.
func pace(p *Pacer, size int, d, maxLate time.Duration, r *rand.Rand) float64 {
	now := t0
	var bytes int
	for now.Sub(t0) < d {
		at, ok := p.Next(now)
		if !ok {
			now = at
			if maxLate > 0 {
				now = now.Add(time.Duration(r.Int64N(int64(maxLate))))
			}
			continue
		}
		p.Sent(now, size)
		bytes += size
	}
	return float64(bytes) * 8 / now.Sub(t0).Seconds()
}

// TestPacerAccuracy: the pacer holds a sender within ±5% of the rate at 1, 10 and 100 Mbit/s
// and at line rates (10, 100 Gbit/s), with packets of 64 bytes (up to 100 Mbit/s) to 4 KiB, woken on time or
// late by up to its tolerance (200 µs below 10 Gbit/s, 25 µs at 100 Gbit/s).
func TestPacerAccuracy(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, bps := range []float64{1e6, 10e6, 100e6, 10e9, 100e9} {
		for _, size := range []int{64, 1024 + 60, 4096 + 60} {
			if size == 64 && bps > 1e9 {
				continue // 200 million packets a second: not a software sender's case
			}
			var p Pacer
			p.SetRate(bps)
			for _, late := range []time.Duration{0, min(200*time.Microsecond, p.tol)} {
				// at least 500 packets, and 40 tolerances (the first burst weighs 2.5%)
				d := max(time.Duration(float64(size*8*500)/bps*float64(time.Second)), 40*p.tol)
				p = Pacer{}
				p.SetRate(bps)
				got := pace(&p, size, d, late, r)
				if got < bps*0.95 || got > bps*1.05 {
					t.Errorf("rate %g, %d-byte packets, late up to %v: %g (%.1f%%)", bps, size, late, got, 100*got/bps)
				}
			}
		}
	}
}

// TestPacerBurst: after an idle time a sender may send at most the tolerance's worth at once
// (and never less than one packet), then it is paced again.
func TestPacerBurst(t *testing.T) {
	var p Pacer
	p.SetRate(100e6) // 12.5 bytes/µs: tolerance 500 µs = 6250 bytes
	now := t0
	p.Sent(now, 1000)
	now = now.Add(time.Second)
	n := 0
	for {
		if _, ok := p.Next(now); !ok {
			break
		}
		p.Sent(now, 1000)
		n++
	}
	if n != 7 { // 6250 bytes of credit: 7 packets leave (the last on a partly filled bucket)
		t.Fatalf("%d packets at once after idle, want 7", n)
	}
	// 7000 bytes sent on 6250 of credit: the next in 750 bytes' time, 60 µs
	if at, ok := p.Next(now); ok || at.Sub(now) != 60*time.Microsecond {
		t.Fatalf("next at %v after", at.Sub(now))
	}

	// at 10 Gbit/s the burst is capped at PacerMaxBurst bytes
	p = Pacer{}
	p.SetRate(10e9)
	p.Sent(now, 1000)
	now = now.Add(time.Second)
	bytes := 0
	for {
		if _, ok := p.Next(now); !ok {
			break
		}
		p.Sent(now, 4096)
		bytes += 4096
	}
	if bytes < PacerMaxBurst || bytes > PacerMaxBurst+4096 {
		t.Fatalf("%d bytes at once at 10 Gbit/s, want about %d", bytes, PacerMaxBurst)
	}
}

// TestPacerUnlimited: the zero pacer and a rate of 0 never hold a packet.
func TestPacerUnlimited(t *testing.T) {
	var p Pacer
	for i := 0; i < 100; i++ {
		if _, ok := p.Next(t0); !ok {
			t.Fatal("zero pacer held a packet")
		}
		p.Sent(t0, 65536)
	}
	p.SetRate(1e6)
	p.Sent(t0, 65536)
	if _, ok := p.Next(t0); ok {
		t.Fatal("1 Mbit/s let a second packet go at once")
	}
	p.SetRate(0)
	if _, ok := p.Next(t0); !ok || p.Limited() {
		t.Fatal("rate 0 still limits")
	}
}

// TestPacerNoAlloc: pacing allocates nothing.
func TestPacerNoAlloc(t *testing.T) {
	var p Pacer
	p.SetRate(1e9)
	now := t0
	n := testing.AllocsPerRun(1000, func() {
		if at, ok := p.Next(now); ok {
			p.Sent(now, 1500)
		} else {
			now = at
		}
	})
	if n != 0 {
		t.Fatalf("%v allocations", n)
	}
}
