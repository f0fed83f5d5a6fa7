package cc

import "time"

// Pacer holds a sender to a rate: a token bucket in its virtual-scheduling (GCRA) form. tat is
// the time the next byte may leave at the rate; a packet may leave when tat is not after now,
// and moves tat on by its length's time at the rate. tat never lags now by more than the
// tolerance, the bucket's depth: what a sender woken late may send at once to keep its average
// (a timer fires late; the average must not suffer for it). The tolerance is PacerTolerance,
// but at most PacerMaxBurst bytes' time at the rate (25 µs at 100 Gbit/s, 200 µs at 10).
//
// The pacer counts whole packets: one may leave on a partly refilled bucket and take the
// bucket below empty, so no packet is ever split or held for want of a few bytes and the long
// average is exact. A GSO run is paced packet by packet as it is built (the run ends where the
// pacer stops the requester). Zero allocations; the zero Pacer is unlimited.
type Pacer struct {
	bps  float64       // 0: unlimited
	fs   uint64        // femtoseconds per byte at bps
	tat  time.Time     // when the next byte may leave
	frac uint64        // femtoseconds owed to tat, below one nanosecond
	tol  time.Duration // how far tat may lag now
}

// Pacer bounds.
const (
	// PacerTolerance is how late a paced sender may be woken without losing rate.
	PacerTolerance = 500 * time.Microsecond
	// PacerMaxBurst caps the bytes a sender may send at once after an idle time (and one
	// packet more: a packet is never held for want of a few bytes).
	PacerMaxBurst = 256 << 10
)

// SetRate sets the rate in bit/s; 0 (or below 1 kbit/s) removes the limit.
func (p *Pacer) SetRate(bps float64) {
	if bps < 1000 {
		p.bps, p.fs = 0, 0
		return
	}
	if bps == p.bps {
		return
	}
	p.bps = bps
	p.fs = uint64(8e15 / bps)
	tol := PacerTolerance
	if d := p.byteTime(PacerMaxBurst); d < tol {
		tol = d
	}
	p.tol = tol
}

// Rate returns the rate in bit/s, 0 when unlimited.
func (p *Pacer) Rate() float64 { return p.bps }

// Limited reports whether a rate is set.
func (p *Pacer) Limited() bool { return p.bps != 0 }

// Next reports whether a packet may leave at now; if not, it returns the time it may.
func (p *Pacer) Next(now time.Time) (at time.Time, ok bool) {
	if p.bps == 0 || !p.tat.After(now) {
		return now, true
	}
	return p.tat, false
}

// Sent accounts a packet of n bytes that left at now.
func (p *Pacer) Sent(now time.Time, n int) {
	if p.bps == 0 {
		return
	}
	if floor := now.Add(-p.tol); p.tat.Before(floor) {
		p.tat, p.frac = floor, 0
	}
	f := uint64(n)*p.fs + p.frac
	p.tat = p.tat.Add(time.Duration(f / 1e6))
	p.frac = f % 1e6
}

// Reset forgets the bucket's history (a rate limit set anew, a QP reset).
func (p *Pacer) Reset() {
	p.tat, p.frac = time.Time{}, 0
}

// byteTime returns the time n bytes take at the rate.
func (p *Pacer) byteTime(n int) time.Duration {
	return time.Duration(uint64(n) * p.fs / 1e6)
}
