package cc

import (
	"errors"
	"strings"
	"testing"
)

// TestDefaults: the defaults under mlx5's names are NVIDIA's documented ones (np_min_time_
// between_cnps: the DCQCN paper's 50 µs, see Defaults).
func TestDefaults(t *testing.T) {
	p := Defaults()
	want := map[string]uint32{
		"cc": 1, "np": 1, "ecn": 1,
		"rp_clamp_tgt_rate": 0, "rp_clamp_tgt_rate_ati": 1, "rp_time_reset": 300, "rp_byte_reset": 32767,
		"rp_threshold": 1, "rp_ai_rate": 5, "rp_max_rate": 0, "rp_hai_rate": 50, "rp_min_dec_fac": 50,
		"rp_min_rate": 1, "rp_rate_to_set_on_first_cnp": 0, "rp_dce_tcp_g": 1019, "rp_dce_tcp_rtt": 1,
		"rp_rate_reduce_monitor_period": 4, "rp_initial_alpha_value": 1023, "rp_gd": 11,
		"np_min_time_between_cnps": 50, "np_cnp_dscp": 48,
	}
	if len(Names()) != len(want) {
		t.Fatalf("%d names, want %d", len(Names()), len(want))
	}
	for _, n := range Names() {
		v, err := p.Get(n)
		if err != nil || v != want[n] {
			t.Errorf("%s = %d, %v; want %d", n, v, err, want[n])
		}
	}
}

// TestParamsSetParse: Set checks names and ranges; Parse reads what String writes; on/off.
func TestParamsSetParse(t *testing.T) {
	p := Defaults()
	if err := p.Set("rp_ai_rate", 0); !errors.Is(err, ErrBadValue) {
		t.Fatalf("rp_ai_rate 0: %v", err)
	}
	if err := p.Set("rp_gd", 16); !errors.Is(err, ErrBadValue) {
		t.Fatalf("rp_gd 16: %v", err)
	}
	if err := p.Set("rp_nonsense", 1); !errors.Is(err, ErrUnknownKnob) {
		t.Fatalf("unknown: %v", err)
	}
	if _, err := p.Get("np_cnp_prio"); !errors.Is(err, ErrUnknownKnob) {
		t.Fatalf("np_cnp_prio: %v", err)
	}
	if err := p.Parse("rp_ai_rate=1, rp_time_reset=1000,np_min_time_between_cnps=0x10,off"); err != nil {
		t.Fatal(err)
	}
	if p.AIRate != 1 || p.TimeReset != 1000 || p.MinTimeBetweenCNPs != 16 || p.Enabled || p.NPEnabled || p.ECN {
		t.Fatalf("%+v", p)
	}
	for _, bad := range []string{"rp_ai_rate", "rp_ai_rate=x", "rp_ai_rate=-1", "x=1", "rp_ai_rate=99999999999"} {
		q := Defaults()
		if err := q.Parse(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	var q Params
	if err := q.Parse(p.String()); err != nil || q != p {
		t.Fatalf("round trip: %v\n%+v\n%+v", err, q, p)
	}
	if !strings.Contains(p.String(), "rp_time_reset=1000") || Unit("rp_time_reset") != "us" || Unit("x") != "" {
		t.Fatal(p.String())
	}
}
