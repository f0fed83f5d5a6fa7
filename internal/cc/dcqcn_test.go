package cc

import (
	"math"
	"testing"
	"time"
)

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-6*math.Max(math.Abs(a), math.Abs(b)) }

func at(d time.Duration) time.Time { return t0.Add(d) }

// newRP returns a reaction point with p, line rate 10 Gbit/s.
func newRP(p Params) *RP {
	r := new(RP)
	r.Init(&p, 10e9)
	return r
}

// firstCut gives r its first CNP at now with a known starting rate (rp_rate_to_set_on_first_cnp).
func firstCut(t *testing.T, p Params, startMbps uint32, now time.Time) *RP {
	t.Helper()
	p.RateToSetOnFirstCNP = startMbps
	r := newRP(p)
	if !r.OnCNP(now) {
		t.Fatal("CNP not handled")
	}
	return r
}

// TestRPStartsUnlimited: a QP without CNPs is not limited, whatever it sends and however long.
func TestRPStartsUnlimited(t *testing.T) {
	r := newRP(Defaults())
	for i := 0; i < 1000; i++ {
		r.OnSent(4096)
		r.Sample(at(time.Duration(i) * time.Microsecond))
		r.Advance(at(time.Duration(i) * time.Microsecond))
	}
	if r.Limited() || r.Rate() != 0 || r.Target() != 0 {
		t.Fatalf("limited %v rate %v", r.Limited(), r.Rate())
	}
}

// TestRPFirstCNP: the first CNP limits the QP from the rate it was sending at (measured), with
// α = rp_initial_alpha_value/1024, and cuts RC to RC × (1 − α/2) (rp_gd 11); RT keeps the start.
func TestRPFirstCNP(t *testing.T) {
	r := newRP(Defaults())
	// 1 Gbit/s: 125 000 bytes per ms, 1250 bytes every 10 µs, for 3 ms
	for i := 0; i <= 300; i++ {
		r.Sample(at(time.Duration(i) * 10 * time.Microsecond))
		r.OnSent(1250)
	}
	now := at(3 * time.Millisecond)
	if !r.OnCNP(now) {
		t.Fatal("not handled")
	}
	alpha := 1023.0 / 1024
	start := 1e9
	if !r.Limited() || math.Abs(r.Target()-start)/start > 0.02 {
		t.Fatalf("RT %v, want about %v", r.Target(), start)
	}
	if got, want := r.Rate(), r.Target()*(1-alpha/2); !near(got, want) {
		t.Fatalf("RC %v, want %v", got, want)
	}
	if !near(r.Alpha(), alpha) {
		t.Fatalf("alpha %v", r.Alpha())
	}

	// rp_rate_to_set_on_first_cnp overrides the measurement
	p := Defaults()
	r = firstCut(t, p, 400, now)
	if !near(r.Target(), 400e6) || !near(r.Rate(), 400e6*(1-alpha/2)) {
		t.Fatalf("RT %v RC %v", r.Target(), r.Rate())
	}
	// nothing measured and no setting: the line rate
	r = newRP(p)
	r.OnCNP(now)
	if !near(r.Target(), 10e9) {
		t.Fatalf("RT %v, want the line rate", r.Target())
	}
	// rp_max_rate bounds the start
	p.MaxRate = 2000
	r = newRP(p)
	r.OnCNP(now)
	if !near(r.Target(), 2e9) {
		t.Fatalf("RT %v, want rp_max_rate", r.Target())
	}
}

// TestRPDisabled: with CC off a CNP is ignored (rp_cnp_ignored) and nothing is limited.
func TestRPDisabled(t *testing.T) {
	p := Defaults()
	p.Enabled = false
	r := newRP(p)
	if r.OnCNP(t0) || r.Limited() {
		t.Fatal("disabled RP reacted")
	}
}

// TestRPMonitorPeriod: at most one cut per rp_rate_reduce_monitor_period; a CNP inside it is
// handled (α counts it) but does not cut.
func TestRPMonitorPeriod(t *testing.T) {
	p := Defaults()
	p.RateReduceMonitorPeriod = 100
	p.DCETCPRTT = 1000 // keep α fixed over the test
	r := firstCut(t, p, 1000, t0)
	rc := r.Rate()
	if !r.OnCNP(at(50*time.Microsecond)) || r.Rate() != rc {
		t.Fatalf("cut inside the monitor period: %v -> %v", rc, r.Rate())
	}
	if !r.OnCNP(at(100*time.Microsecond)) || !near(r.Rate(), rc*(1-r.Alpha()/2)) {
		t.Fatalf("no cut after the monitor period: %v -> %v", rc, r.Rate())
	}
}

// TestRPAlpha: α rises toward 1 in every rp_dce_tcp_rtt period with a CNP (α = g'α + 1 − g')
// and decays by g' in every period without one.
func TestRPAlpha(t *testing.T) {
	p := Defaults()
	p.DCETCPRTT = 10
	p.TimeReset = 1 << 17 // no increase
	p.ByteReset = 0
	r := firstCut(t, p, 1000, t0)
	g := 1019.0 / 1024
	a := 1023.0 / 1024
	if !near(r.Alpha(), a) {
		t.Fatal(r.Alpha())
	}
	// the first period had a CNP
	a = g*a + (1 - g)
	r.Advance(at(10 * time.Microsecond))
	if !near(r.Alpha(), a) {
		t.Fatalf("after a period with a CNP: %v, want %v", r.Alpha(), a)
	}
	// 7 periods without
	a *= math.Pow(g, 7)
	r.Advance(at(80 * time.Microsecond))
	if !near(r.Alpha(), a) {
		t.Fatalf("after 7 periods without: %v, want %v", r.Alpha(), a)
	}
	// a CNP in the next period (no cut: inside the monitor period? it is 4 µs, so a cut), then its end
	rc := r.Rate()
	r.OnCNP(at(85 * time.Microsecond))
	if !near(r.Rate(), rc*(1-a/2)) {
		t.Fatalf("cut with α %v: %v -> %v", a, rc, r.Rate())
	}
	a = g*a + (1 - g)
	r.Advance(at(90 * time.Microsecond))
	if !near(r.Alpha(), a) {
		t.Fatalf("after a period with a CNP: %v, want %v", r.Alpha(), a)
	}
	// in pieces or at once: the same
	r2 := *r
	for d := 91 * time.Microsecond; d <= 5*time.Millisecond; d += 7 * time.Microsecond {
		r2.Advance(at(d))
	}
	r2.Advance(at(5 * time.Millisecond))
	r.Advance(at(5 * time.Millisecond))
	if !near(r.Alpha(), r2.Alpha()) {
		t.Fatalf("α stepwise %v, at once %v", r2.Alpha(), r.Alpha())
	}
}

// TestRPCutBounds: rp_gd sets the cut (10: RC × (1 − α)), rp_min_dec_fac bounds it, rp_min_rate
// floors it.
func TestRPCutBounds(t *testing.T) {
	p := Defaults()
	p.GD = 10
	p.InitialAlphaValue = 512 // α = 0.5: RC × 0.5 with rp_gd 10
	p.MinDecFac = 25
	r := firstCut(t, p, 1000, t0)
	if !near(r.Rate(), 500e6) {
		t.Fatalf("rp_gd 10, α 0.5: %v", r.Rate())
	}
	p.InitialAlphaValue = 1023 // RC × 1/1024 without the bound
	r = firstCut(t, p, 1000, t0)
	if !near(r.Rate(), 250e6) {
		t.Fatalf("rp_min_dec_fac 25: %v, want 250e6", r.Rate())
	}
	p.MinDecFac = 100
	r = firstCut(t, p, 1000, t0)
	if !near(r.Rate(), 1000e6) {
		t.Fatalf("rp_min_dec_fac 100 cuts nothing: %v", r.Rate())
	}
	p = Defaults()
	p.MinRate = 300
	r = firstCut(t, p, 400, t0)
	if !near(r.Rate(), 300e6) {
		t.Fatalf("rp_min_rate 300: %v", r.Rate())
	}
}

// TestRPIncreaseStages: with rp_threshold F = 3, each timer expiry is fast recovery (RC =
// (RT + RC)/2, RT unchanged) while max(T, BC) < F, additive increase (RT += rp_ai_rate) once
// one count reaches F, hyper increase (RT += (min(T, BC) − F) × rp_hai_rate) once both exceed F.
func TestRPIncreaseStages(t *testing.T) {
	p := Defaults()
	p.Threshold = 3
	p.TimeReset = 100
	p.ByteReset = 100 // 6400 bytes
	p.AIRate = 10
	p.HAIRate = 40
	p.DCETCPRTT = 1 << 17
	r := firstCut(t, p, 1000, t0)
	rt, rc := r.Target(), r.Rate()
	step := func(name string, wantRT float64) {
		t.Helper()
		rc = (wantRT + rc) / 2
		if !near(r.Target(), wantRT) || !near(r.Rate(), rc) {
			ts, bs := r.Stages()
			t.Fatalf("%s (T %d BC %d): RT %v RC %v, want %v %v", name, ts, bs, r.Target(), r.Rate(), wantRT, rc)
		}
	}
	r.Advance(at(100 * time.Microsecond)) // T=1
	step("fast recovery 1", rt)
	r.Advance(at(250 * time.Microsecond)) // T=2
	step("fast recovery 2", rt)
	r.Advance(at(300 * time.Microsecond)) // T=3: max = F
	rt += 10e6
	step("additive", rt)
	for i := 0; i < 4; i++ { // BC 1..4
		r.OnSent(6400)
		ts, bs := r.Stages()
		if min(ts, bs) > 3 {
			rt += float64(min(ts, bs)-3) * 40e6
		} else {
			rt += 10e6
		}
		step("byte stage", rt)
	}
	r.Advance(at(400 * time.Microsecond)) // T=4, BC=4: hyper, i = 1
	rt += 40e6
	step("hyper 1", rt)
	r.Advance(at(500 * time.Microsecond)) // T=5, BC=4: i = 1
	rt += 40e6
	step("hyper 2", rt)
	r.OnSent(6400) // BC=5: i = 2
	rt += 80e6
	step("hyper 3", rt)
	// a cut restarts the stages
	r.OnCNP(at(501 * time.Microsecond))
	if ts, bs := r.Stages(); ts != 0 || bs != 0 {
		t.Fatalf("stages after a cut: %d %d", ts, bs)
	}
	rt, rc = r.Target(), r.Rate()
	r.Advance(at(600 * time.Microsecond)) // not yet: the timer restarted at 501
	if r.Rate() != rc {
		t.Fatal("timer did not restart at the cut")
	}
	r.Advance(at(601 * time.Microsecond))
	step("fast recovery after the cut", rt)
}

// TestRPClampTarget: at a cut, RT becomes RC if the timer raised the rate since the last cut
// (rp_clamp_tgt_rate_ati), not if only the byte counter did; always with rp_clamp_tgt_rate.
func TestRPClampTarget(t *testing.T) {
	p := Defaults()
	p.TimeReset = 100
	p.ByteReset = 10
	p.DCETCPRTT = 1 << 17
	p.InitialAlphaValue = 512
	r := firstCut(t, p, 1000, t0)
	r.OnSent(640) // a byte stage only
	rc := r.Rate()
	rt := r.Target()
	r.OnCNP(at(20 * time.Microsecond))
	if !near(r.Target(), rt) {
		t.Fatalf("RT changed after a byte-counter increase: %v -> %v", rt, r.Target())
	}
	if !near(r.Rate(), rc*(1-r.Alpha()/2)) {
		t.Fatalf("cut: %v -> %v", rc, r.Rate())
	}
	r.Advance(at(120 * time.Microsecond)) // a timer stage
	rc = r.Rate()
	r.OnCNP(at(130 * time.Microsecond))
	if !near(r.Target(), rc) {
		t.Fatalf("RT %v, want RC %v after a timer increase", r.Target(), rc)
	}

	p.ClampTgtRateATI = false
	r = firstCut(t, p, 1000, t0)
	r.Advance(at(100 * time.Microsecond))
	rt = r.Target()
	r.OnCNP(at(110 * time.Microsecond))
	if !near(r.Target(), rt) {
		t.Fatal("RT clamped with both clamps off")
	}
	p.ClampTgtRate = true
	r = firstCut(t, p, 1000, t0)
	r.OnSent(640)
	rc = r.Rate()
	r.OnCNP(at(20 * time.Microsecond))
	if !near(r.Target(), rc) {
		t.Fatal("rp_clamp_tgt_rate: RT not clamped")
	}
}

// TestRPRecovers: without CNPs the rate climbs back to the maximum and the QP is unlimited
// again; a long idle time is applied at once.
func TestRPRecovers(t *testing.T) {
	p := Defaults()
	p.MaxRate = 1000
	r := firstCut(t, p, 1000, t0)
	prev := r.Rate()
	for d := 300 * time.Microsecond; r.Limited(); d += 300 * time.Microsecond {
		r.Advance(at(d))
		if r.Limited() && r.Rate() < prev {
			t.Fatalf("rate fell without a CNP: %v -> %v", prev, r.Rate())
		}
		prev = r.Rate()
		if d > time.Second {
			t.Fatalf("still limited at %v: %v", d, r.Rate())
		}
	}
	if r.Rate() != 0 {
		t.Fatal("unlimited but a rate")
	}
	r = firstCut(t, p, 1000, t0)
	r.Advance(at(time.Hour))
	if r.Limited() {
		t.Fatal("still limited after an hour")
	}
}

// TestRPNoAlloc: the reaction point allocates nothing.
func TestRPNoAlloc(t *testing.T) {
	r := newRP(Defaults())
	now := t0
	n := testing.AllocsPerRun(1000, func() {
		now = now.Add(3 * time.Microsecond)
		r.OnSent(1024)
		r.Sample(now)
		r.Advance(now)
		if now.Nanosecond()%7 == 0 {
			r.OnCNP(now)
		}
	})
	if n != 0 {
		t.Fatalf("%v allocations", n)
	}
}

// TestNPInterval: at most one CNP per np_min_time_between_cnps; none when the NP is off.
func TestNPInterval(t *testing.T) {
	p := Defaults()
	p.MinTimeBetweenCNPs = 50
	var np NP
	sent := 0
	for d := time.Duration(0); d < time.Millisecond; d += 3 * time.Microsecond {
		if np.Mark(at(d), &p) {
			sent++
		}
	}
	// marks every 3 µs: one CNP each 51 µs (the first mark at or after 50 µs)
	if sent < 19 || sent > 20 {
		t.Fatalf("%d CNPs in 1 ms at one per 50 µs", sent)
	}
	p.MinTimeBetweenCNPs = 0
	np = NP{}
	for i := 0; i < 3; i++ {
		if !np.Mark(t0, &p) {
			t.Fatalf("interval 0: mark %d sent no CNP", i)
		}
	}
	p.NPEnabled = false
	if np.Mark(at(time.Second), &p) {
		t.Fatal("NP off sent a CNP")
	}
	if CNPTClass(&p) != 0xC2 {
		t.Fatalf("CNP TOS %#x, want DSCP 48 with ECT(0)", CNPTClass(&p))
	}
}
