package fault

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ParseDirOptions reads one direction's faults from a one-line text form, for command-line
// flags (e.g. -fault-send, -fault-recv). Items are separated by ',' or ';':
//
//	drop=P  dup=P  reorder=P  corrupt=P      probabilities in [0,1]
//	mark=P                                   ECN CE mark of ECN-capable datagrams, in [0,1]
//	dupdelay=D  reorderdelay=D               DirOptions.DuplicateDelay / ReorderDelay
//	depth=K                                  DirOptions.ReorderDepth
//	delay=D  jitter=D                        link latency (every datagram)
//	region=covered|outside-icrc|anywhere     DirOptions.CorruptRegion
//	ACTION[:KEY=VALUE]...                    a scripted Rule (see ParseRule)
//
// An item whose text before the first '=' contains no ':' is an option; anything else (e.g.
// "drop", "delay:op=READ_REQUEST:delay=5ms") is a rule. Example:
// "drop=0.01,reorder=0.02,depth=3,jitter=50us,drop:op=ACK:nth=2".
func ParseDirOptions(s string) (DirOptions, error) {
	var o DirOptions
	seen := map[string]bool{}
	for _, item := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ';' }) {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		k, v, isOpt := strings.Cut(item, "=")
		if !isOpt || strings.Contains(k, ":") {
			r, err := ParseRule(item)
			if err != nil {
				return DirOptions{}, err
			}
			o.Rules = append(o.Rules, r)
			continue
		}
		k, v = strings.ToLower(strings.TrimSpace(k)), strings.TrimSpace(v)
		if seen[k] {
			return DirOptions{}, fmt.Errorf("%w: %q repeated", ErrRule, k)
		}
		seen[k] = true
		var err error
		switch k {
		case "drop":
			o.Drop, err = parseProb(v)
		case "dup", "duplicate":
			o.Duplicate, err = parseProb(v)
		case "reorder":
			o.Reorder, err = parseProb(v)
		case "corrupt":
			o.Corrupt, err = parseProb(v)
		case "mark", "ce":
			o.Mark, err = parseProb(v)
		case "dupdelay":
			o.DuplicateDelay, err = parseDur(v)
		case "reorderdelay":
			o.ReorderDelay, err = parseDur(v)
		case "delay":
			o.Delay, err = parseDur(v)
		case "jitter":
			o.Jitter, err = parseDur(v)
		case "depth":
			o.ReorderDepth, err = parsePositive(v)
		case "region":
			switch strings.ToLower(v) {
			case "covered":
				o.CorruptRegion = CorruptCovered
			case "outside-icrc":
				o.CorruptRegion = CorruptOutsideICRC
			case "anywhere":
				o.CorruptRegion = CorruptAnywhere
			default:
				err = fmt.Errorf("want covered, outside-icrc or anywhere")
			}
		default:
			return DirOptions{}, fmt.Errorf("%w: unknown option %q", ErrRule, k)
		}
		if err != nil {
			return DirOptions{}, fmt.Errorf("%w: %s=%s: %v", ErrRule, k, v, err)
		}
	}
	if err := o.Validate(); err != nil {
		return DirOptions{}, err
	}
	return o, nil
}

func parseProb(v string) (float64, error) {
	p, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return 0, err
	}
	if !(p >= 0 && p <= 1) {
		return 0, fmt.Errorf("probability %v not in [0,1]", p)
	}
	return p, nil
}

func parseDur(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, err
	}
	if d < 0 {
		return 0, fmt.Errorf("negative duration")
	}
	return d, nil
}

var regionNames = [...]string{"covered", "outside-icrc", "anywhere"}

// String renders the options in the form ParseDirOptions reads (zero fields left out).
func (o DirOptions) String() string {
	var parts []string
	prob := func(k string, p float64) {
		if p != 0 {
			parts = append(parts, k+"="+strconv.FormatFloat(p, 'g', -1, 64))
		}
	}
	dur := func(k string, d time.Duration) {
		if d != 0 {
			parts = append(parts, k+"="+d.String())
		}
	}
	prob("drop", o.Drop)
	prob("dup", o.Duplicate)
	dur("dupdelay", o.DuplicateDelay)
	prob("reorder", o.Reorder)
	if o.ReorderDepth != 0 {
		parts = append(parts, "depth="+strconv.Itoa(o.ReorderDepth))
	}
	dur("reorderdelay", o.ReorderDelay)
	prob("corrupt", o.Corrupt)
	prob("mark", o.Mark)
	if o.CorruptRegion != CorruptCovered && int(o.CorruptRegion) < len(regionNames) {
		parts = append(parts, "region="+regionNames[o.CorruptRegion])
	}
	dur("delay", o.Delay)
	dur("jitter", o.Jitter)
	for _, r := range o.Rules {
		parts = append(parts, r.String())
	}
	return strings.Join(parts, ",")
}
