package cc

import (
	"errors"
	"strconv"
	"strings"
	"time"
)

// Params are the congestion control parameters of a device or a QP, under the names mlx5
// exposes them (debugfs cc_params, drivers/infiniband/hw/mlx5/cong.c; the units and defaults
// are NVIDIA's DCQCN parameter table for ConnectX-4 and later). Defaults returns them; Set and
// Get read and write them by name; the zero value is not useful.
type Params struct {
	// Enabled turns the reaction point on: CNPs cut the QP's rate. Off, CNPs are counted as
	// rp_cnp_ignored and the QP is paced only by its rate limit. ("cc", softroce's switch; a
	// ConnectX enables DCQCN per priority.)
	Enabled bool
	// NPEnabled turns the notification point on: a CE-marked packet makes the QP send a CNP.
	NPEnabled bool
	// ECN makes the QP's data packets ECN-capable, ECT(0) in the IP header's ECN field (IBTA
	// A17.9.1), so an AQM marks them instead of dropping them. ("ecn", softroce's; a ConnectX
	// sets ECT on the priorities with DCQCN.)
	ECN bool

	// rp_clamp_tgt_rate: on every CNP the target rate becomes the current rate.
	ClampTgtRate bool
	// rp_clamp_tgt_rate_ati: on a CNP the target rate becomes the current rate if the timer
	// raised the rate since the last cut (not only the byte counter).
	ClampTgtRateATI bool
	// rp_time_reset: the rate increase timer's period (µs).
	TimeReset uint32
	// rp_byte_reset: the rate increase byte counter's period, in 64-byte units (0: no byte
	// counter).
	ByteReset uint32
	// rp_threshold: increase events of the timer or the byte counter before the reaction point
	// leaves fast recovery (DCQCN's F).
	Threshold uint32
	// rp_ai_rate: the additive increase step of the target rate (Mbit/s).
	AIRate uint32
	// rp_max_rate: the rate at which the QP stops being limited (Mbit/s); 0: the line rate.
	MaxRate uint32
	// rp_hai_rate: the hyper increase step of the target rate (Mbit/s).
	HAIRate uint32
	// rp_min_dec_fac: the least fraction (%) of its rate a QP keeps in one cut.
	MinDecFac uint32
	// rp_min_rate: the rate no cut goes below (Mbit/s).
	MinRate uint32
	// rp_rate_to_set_on_first_cnp: the current and target rate a QP not limited yet gets on its
	// first CNP, before the cut (Mbit/s); 0: the rate the QP was sending at (a software
	// sender's line rate; softroce's choice where a ConnectX takes the port's speed).
	RateToSetOnFirstCNP uint32
	// rp_dce_tcp_g: α's gain, g = (1024 - value) / 1024.
	DCETCPG uint32
	// rp_dce_tcp_rtt: α's update period (µs).
	DCETCPRTT uint32
	// rp_rate_reduce_monitor_period: the least time between two cuts of one QP (µs).
	RateReduceMonitorPeriod uint32
	// rp_initial_alpha_value: α at a QP's first CNP, /1024.
	InitialAlphaValue uint32
	// rp_gd: the cut is RC × (1 − α·1024 / 2^rp_gd): 11 halves at α = 1.
	GD uint32
	// np_min_time_between_cnps: the least time between two CNPs one QP sends (µs). mlx5's is
	// per port; softroce's is per QP.
	MinTimeBetweenCNPs uint32
	// np_cnp_dscp: the DSCP of the CNPs sent (the IP header's 6 high bits of the TOS / traffic
	// class; the ECN bits carry ECT(0), as ConnectX's CNPs do).
	CNPDSCP uint32
}

// Defaults returns the parameters a device starts with: DCQCN and CNPs on, NVIDIA's defaults,
// except np_min_time_between_cnps (50 µs, the DCQCN paper's per-flow CNP interval, where mlx5's
// per-port knob defaults to 0).
func Defaults() Params {
	return Params{
		Enabled:                 true,
		NPEnabled:               true,
		ECN:                     true,
		ClampTgtRate:            false,
		ClampTgtRateATI:         true,
		TimeReset:               300,
		ByteReset:               32767,
		Threshold:               1,
		AIRate:                  5,
		MaxRate:                 0,
		HAIRate:                 50,
		MinDecFac:               50,
		MinRate:                 1,
		RateToSetOnFirstCNP:     0,
		DCETCPG:                 1019,
		DCETCPRTT:               1,
		RateReduceMonitorPeriod: 4,
		InitialAlphaValue:       1023,
		GD:                      11,
		MinTimeBetweenCNPs:      50,
		CNPDSCP:                 48,
	}
}

// knob is one named parameter: its field, its range and its unit.
type knob struct {
	name     string
	unit     string
	min, max uint32
	field    func(*Params) *uint32
	flag     func(*Params) *bool
}

// knobs lists every parameter by its mlx5 name (np_cnp_prio and np_cnp_prio_mode, the 802.1p
// priority of CNPs, have no meaning on an IP socket and are not offered).
var knobs = []knob{
	{name: "cc", unit: "0/1", max: 1, flag: func(p *Params) *bool { return &p.Enabled }},
	{name: "np", unit: "0/1", max: 1, flag: func(p *Params) *bool { return &p.NPEnabled }},
	{name: "ecn", unit: "0/1", max: 1, flag: func(p *Params) *bool { return &p.ECN }},
	{name: "rp_clamp_tgt_rate", unit: "0/1", max: 1, flag: func(p *Params) *bool { return &p.ClampTgtRate }},
	{name: "rp_clamp_tgt_rate_ati", unit: "0/1", max: 1, flag: func(p *Params) *bool { return &p.ClampTgtRateATI }},
	{name: "rp_time_reset", unit: "us", min: 1, max: 131071, field: func(p *Params) *uint32 { return &p.TimeReset }},
	{name: "rp_byte_reset", unit: "64B", max: 32767, field: func(p *Params) *uint32 { return &p.ByteReset }},
	{name: "rp_threshold", unit: "", min: 1, max: 31, field: func(p *Params) *uint32 { return &p.Threshold }},
	{name: "rp_ai_rate", unit: "Mbit/s", min: 1, max: maxMbps, field: func(p *Params) *uint32 { return &p.AIRate }},
	{name: "rp_max_rate", unit: "Mbit/s", max: maxMbps, field: func(p *Params) *uint32 { return &p.MaxRate }},
	{name: "rp_hai_rate", unit: "Mbit/s", min: 1, max: maxMbps, field: func(p *Params) *uint32 { return &p.HAIRate }},
	{name: "rp_min_dec_fac", unit: "%", max: 100, field: func(p *Params) *uint32 { return &p.MinDecFac }},
	{name: "rp_min_rate", unit: "Mbit/s", min: 1, max: maxMbps, field: func(p *Params) *uint32 { return &p.MinRate }},
	{name: "rp_rate_to_set_on_first_cnp", unit: "Mbit/s", max: maxMbps, field: func(p *Params) *uint32 { return &p.RateToSetOnFirstCNP }},
	{name: "rp_dce_tcp_g", unit: "/1024", max: 1023, field: func(p *Params) *uint32 { return &p.DCETCPG }},
	{name: "rp_dce_tcp_rtt", unit: "us", min: 1, max: 131071, field: func(p *Params) *uint32 { return &p.DCETCPRTT }},
	{name: "rp_rate_reduce_monitor_period", unit: "us", max: 1 << 24, field: func(p *Params) *uint32 { return &p.RateReduceMonitorPeriod }},
	{name: "rp_initial_alpha_value", unit: "/1024", max: 1023, field: func(p *Params) *uint32 { return &p.InitialAlphaValue }},
	{name: "rp_gd", unit: "log2", min: 1, max: 15, field: func(p *Params) *uint32 { return &p.GD }},
	{name: "np_min_time_between_cnps", unit: "us", max: 1 << 24, field: func(p *Params) *uint32 { return &p.MinTimeBetweenCNPs }},
	{name: "np_cnp_dscp", unit: "", max: 63, field: func(p *Params) *uint32 { return &p.CNPDSCP }},
}

// maxMbps bounds the rate knobs: 1 Tbit/s.
const maxMbps = 1_000_000

// Errors of Set and Parse.
var (
	// ErrUnknownKnob: no parameter has this name.
	ErrUnknownKnob = errors.New("cc: unknown parameter")
	// ErrBadValue: the value is not a number in the parameter's range.
	ErrBadValue = errors.New("cc: value out of range")
)

// Names lists the parameter names in a fixed order.
func Names() []string {
	out := make([]string, len(knobs))
	for i := range knobs {
		out[i] = knobs[i].name
	}
	return out
}

func find(name string) *knob {
	for i := range knobs {
		if knobs[i].name == name {
			return &knobs[i]
		}
	}
	return nil
}

// Unit returns the unit of a parameter ("us", "Mbit/s", ...), "" for a count or an unknown name.
func Unit(name string) string {
	if k := find(name); k != nil {
		return k.unit
	}
	return ""
}

// Get returns a parameter's value by name (flags as 0 or 1).
func (p *Params) Get(name string) (uint32, error) {
	k := find(name)
	if k == nil {
		return 0, ErrUnknownKnob
	}
	if k.flag != nil {
		if *k.flag(p) {
			return 1, nil
		}
		return 0, nil
	}
	return *k.field(p), nil
}

// Set sets a parameter by name, checking its range.
func (p *Params) Set(name string, v uint32) error {
	k := find(name)
	if k == nil {
		return errors.Join(ErrUnknownKnob, errors.New(name))
	}
	if v < k.min || v > k.max {
		return errors.Join(ErrBadValue, errors.New(name+"="+strconv.FormatUint(uint64(v), 10)+
			": want "+strconv.FormatUint(uint64(k.min), 10)+".."+strconv.FormatUint(uint64(k.max), 10)))
	}
	if k.flag != nil {
		*k.flag(p) = v != 0
	} else {
		*k.field(p) = v
	}
	return nil
}

// Parse applies a comma-separated list of name=value settings ("rp_ai_rate=1,rp_time_reset=
// 1000"); "on" and "off" alone turn the reaction point, the notification point and ECT marking
// all on or all off.
func (p *Params) Parse(s string) error {
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		switch f {
		case "":
			continue
		case "on", "off":
			p.Enabled, p.NPEnabled, p.ECN = f == "on", f == "on", f == "on"
			continue
		}
		name, val, ok := strings.Cut(f, "=")
		if !ok {
			return errors.Join(ErrBadValue, errors.New(f+": want name=value"))
		}
		v, err := strconv.ParseUint(strings.TrimSpace(val), 0, 32)
		if err != nil {
			return errors.Join(ErrBadValue, errors.New(f))
		}
		if err := p.Set(strings.TrimSpace(name), uint32(v)); err != nil {
			return err
		}
	}
	return nil
}

// String lists every parameter as name=value, comma-separated, in Names order (Parse reads it
// back).
func (p *Params) String() string {
	var b strings.Builder
	for i, n := range Names() {
		if i > 0 {
			b.WriteByte(',')
		}
		v, _ := p.Get(n)
		b.WriteString(n)
		b.WriteByte('=')
		b.WriteString(strconv.FormatUint(uint64(v), 10))
	}
	return b.String()
}

func us(v uint32) time.Duration { return time.Duration(v) * time.Microsecond }

// mbps converts Mbit/s to bit/s.
func mbps(v uint32) float64 { return float64(v) * 1e6 }
