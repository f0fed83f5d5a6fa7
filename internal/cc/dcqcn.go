package cc

import (
	"math"
	"time"
)

// RP is the DCQCN reaction point of one QP: its current rate RC, target rate RT and α, driven
// by the CNPs the QP receives (OnCNP), the bytes it sends (OnSent) and time (Advance). A QP
// starts unlimited; its first CNP limits it, and it is unlimited again once RC has climbed
// back to the maximum rate. Rules (DCQCN, SIGCOMM 2015, section 3.1 and Algorithm 1; the
// mlx5 knob that changes each is named):
//
//   - Cut (a CNP, at most one cut per rp_rate_reduce_monitor_period): RT = RC (always with
//     rp_clamp_tgt_rate; with rp_clamp_tgt_rate_ati only if the timer raised the rate since the
//     last cut; always at the first cut), then RC = RC × (1 − α·1024/2^rp_gd) — with rp_gd 11,
//     RC × (1 − α/2) — but never below rp_min_dec_fac % of RC nor below rp_min_rate. The
//     increase timer, the byte counter and both stage counts restart.
//   - α (every rp_dce_tcp_rtt): α = g'·α + (1 − g') if a CNP arrived in the period, else
//     α = g'·α, with g' = rp_dce_tcp_g/1024. A QP's first CNP sets α = rp_initial_alpha_value/1024.
//   - Increase, at each expiry of the timer (every rp_time_reset; stage count T) and each
//     rp_byte_reset × 64 bytes sent (stage count BC), with F = rp_threshold: fast recovery while
//     max(T, BC) < F (RT unchanged); hyper increase when min(T, BC) > F (RT += (min(T, BC) − F) ×
//     rp_hai_rate); additive increase otherwise (RT += rp_ai_rate); then RC = (RT + RC) / 2. RT
//     is capped at the maximum rate (rp_max_rate, or the line rate when 0), and a RC that
//     reaches it ends the limitation.
//
// Time is evaluated lazily: Advance applies every α period and timer expiry up to now in
// order, so a QP with nothing to send needs no timer of its own. The zero RP is unusable; call
// Init.
type RP struct {
	p       Params
	max     float64 // bit/s: rp_max_rate, or the line rate
	limited bool
	rc, rt  float64 // bit/s
	alpha   float64

	alphaNext time.Time // end of the current α period
	cnpSeen   bool      // a CNP arrived in the current α period
	lastCut   time.Time
	cutOnce   bool      // lastCut is valid
	incNext   time.Time // next expiry of the increase timer
	t, bc     uint32    // timer and byte stage counts
	bytes     uint64    // bytes sent since the last byte stage
	timerInc  bool      // the timer raised the rate since the last cut

	meter meter
}

// maxTimerSteps bounds the timer expiries one Advance applies: after a long idle time a QP
// has long recovered (each expiry adds at least rp_ai_rate), so the rest are skipped and the
// limitation ends.
const maxTimerSteps = 1 << 16

// Init (re)starts the reaction point unlimited, with the parameters p and the line rate (bit/s,
// > 0) that bounds the rate when rp_max_rate is 0.
func (r *RP) Init(p *Params, lineBps float64) {
	*r = RP{p: *p, max: lineBps}
	if p.MaxRate != 0 {
		r.max = mbps(p.MaxRate)
	}
	if r.max <= 0 {
		r.max = math.Inf(1)
	}
}

// Limited reports whether the QP is held to RC.
func (r *RP) Limited() bool { return r.limited }

// Rate returns RC in bit/s, 0 when not limited.
func (r *RP) Rate() float64 {
	if !r.limited {
		return 0
	}
	return r.rc
}

// Target returns RT in bit/s, 0 when not limited.
func (r *RP) Target() float64 {
	if !r.limited {
		return 0
	}
	return r.rt
}

// Alpha returns α (0..1).
func (r *RP) Alpha() float64 { return r.alpha }

// Stages returns the timer and byte stage counts since the last cut.
func (r *RP) Stages() (t, bc uint32) { return r.t, r.bc }

// OnCNP takes a CNP received at now and reports whether the reaction point acted on it (it
// is enabled): the caller counts rp_cnp_handled, else rp_cnp_ignored.
func (r *RP) OnCNP(now time.Time) bool {
	if !r.p.Enabled {
		return false
	}
	r.Advance(now)
	first := !r.limited
	if first {
		start := mbps(r.p.RateToSetOnFirstCNP)
		if start == 0 {
			r.meter.sample(now)
			start = r.meter.rate(now)
		}
		if start == 0 || start > r.max {
			start = r.max
		}
		if math.IsInf(start, 1) {
			// neither a line rate nor a measurement: the least step that still cuts
			start = 1e12
		}
		r.limited = true
		r.rc, r.rt = start, start
		r.alpha = float64(r.p.InitialAlphaValue) / 1024
		r.alphaNext = now.Add(r.alphaPeriod())
		r.cnpSeen = false
		r.cutOnce = false
	}
	r.cnpSeen = true
	if r.cutOnce && now.Sub(r.lastCut) < us(r.p.RateReduceMonitorPeriod) {
		return true // one cut per monitor period; α still counts it
	}
	if first || r.p.ClampTgtRate || r.p.ClampTgtRateATI && r.timerInc {
		r.rt = r.rc
	}
	dec := r.alpha * 1024 / float64(uint64(1)<<r.p.GD)
	if dec > 1 {
		dec = 1
	}
	rc := r.rc * (1 - dec)
	if floor := r.rc * float64(r.p.MinDecFac) / 100; rc < floor {
		rc = floor
	}
	if m := mbps(r.p.MinRate); rc < m {
		rc = m
	}
	r.rc = rc
	r.lastCut, r.cutOnce = now, true
	r.t, r.bc, r.bytes = 0, 0, 0
	r.timerInc = false
	r.incNext = now.Add(us(r.p.TimeReset))
	return true
}

// OnSent accounts n bytes sent: the byte counter of the rate increase, and the rate
// measurement a first CNP starts from (which Sample times; no clock is needed per packet).
func (r *RP) OnSent(n int) {
	r.meter.bytes += uint64(n)
	if !r.limited || r.p.ByteReset == 0 {
		return
	}
	r.bytes += uint64(n)
	unit := uint64(r.p.ByteReset) * 64
	for r.limited && r.bytes >= unit {
		r.bytes -= unit
		r.bc++
		r.increase()
	}
}

// Sample gives the rate measurement the time: the caller calls it whenever it has read its clock
// anyway (a received ACK, a pacing decision), at least every few milliseconds while the QP
// sends.
func (r *RP) Sample(now time.Time) { r.meter.sample(now) }

// Advance applies the α updates and increase-timer expiries due by now.
func (r *RP) Advance(now time.Time) {
	if !r.limited {
		return
	}
	if !now.Before(r.alphaNext) {
		per := r.alphaPeriod()
		n := now.Sub(r.alphaNext)/per + 1 // α periods ended by now
		k := n
		g := float64(r.p.DCETCPG) / 1024
		if r.cnpSeen {
			r.alpha = g*r.alpha + (1 - g)
			k--
		}
		if k > 0 {
			r.alpha *= math.Pow(g, float64(k))
		}
		r.cnpSeen = false
		r.alphaNext = r.alphaNext.Add(per * n)
	}
	tr := us(r.p.TimeReset)
	for i := 0; r.limited && !now.Before(r.incNext); i++ {
		if i == maxTimerSteps {
			r.limited = false
			break
		}
		r.incNext = r.incNext.Add(tr)
		r.t++
		r.timerInc = true
		r.increase()
	}
}

// increase is one rate increase event (the stage counts already advanced).
func (r *RP) increase() {
	f := r.p.Threshold
	switch lo, hi := min(r.t, r.bc), max(r.t, r.bc); {
	case hi < f:
		// fast recovery: toward RT
	case lo > f:
		r.rt += float64(lo-f) * mbps(r.p.HAIRate)
	default:
		r.rt += mbps(r.p.AIRate)
	}
	if r.rt > r.max {
		r.rt = r.max
	}
	r.rc = (r.rt + r.rc) / 2
	if r.rc >= r.max*(1-1e-9) {
		r.limited = false
		r.rc, r.rt = r.max, r.max
	}
}

func (r *RP) alphaPeriod() time.Duration {
	if r.p.DCETCPRTT == 0 {
		return time.Microsecond
	}
	return us(r.p.DCETCPRTT)
}

// meter measures a QP's sending rate over windows of at least meterWindow, from a byte count
// (bytes, counted per packet) and the times sample gives it: the rate of the last full window,
// or of the current one once it is long enough.
type meter struct {
	bytes uint64    // bytes sent, ever
	start time.Time // the current window's start
	at    uint64    // bytes at start
	last  float64   // bit/s of the last full window
}

const (
	meterWindow = time.Millisecond
	meterMin    = 100 * time.Microsecond
)

func (m *meter) sample(now time.Time) {
	if m.start.IsZero() {
		m.start, m.at = now, m.bytes
		return
	}
	if d := now.Sub(m.start); d >= meterWindow {
		m.last = float64(m.bytes-m.at) * 8 / d.Seconds()
		m.start, m.at = now, m.bytes
	}
}

func (m *meter) rate(now time.Time) float64 {
	if d := now.Sub(m.start); !m.start.IsZero() && d >= meterMin && (m.last == 0 || d >= meterWindow) {
		return float64(m.bytes-m.at) * 8 / d.Seconds()
	}
	return m.last
}

// NP is the notification point of one QP: whether a CE-marked packet received now may send a
// CNP (at most one per np_min_time_between_cnps; IBTA A17.9.2 leaves the rate to the
// implementation).
type NP struct {
	last time.Time
	sent bool
}

// Mark reports whether a CE-marked packet received at now sends a CNP under p, and if so
// records it.
func (n *NP) Mark(now time.Time, p *Params) bool {
	if !p.NPEnabled {
		return false
	}
	if n.sent && now.Sub(n.last) < us(p.MinTimeBetweenCNPs) {
		return false
	}
	n.last, n.sent = now, true
	return true
}

// CNPTClass returns the IP TOS / traffic class byte of the CNPs sent under p: np_cnp_dscp
// and ECT(0).
func CNPTClass(p *Params) uint8 { return uint8(p.CNPDSCP)<<2 | ECT0 }

// ECN codepoints (RFC 3168 section 5), the low two bits of the IPv4 TOS / IPv6 traffic class.
const (
	NotECT = 0b00
	ECT1   = 0b01
	ECT0   = 0b10
	CE     = 0b11
)
