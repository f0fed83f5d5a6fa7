package fault

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/softroce/softroce/pkg/bth"
)

// Action is what a fault does to a datagram. The same values name the events in the log
// (Event.Kind), where Release and Discard are added.
type Action uint8

const (
	// None is the zero Action: no fault.
	None Action = iota
	// Drop discards the datagram.
	Drop
	// Duplicate delivers the datagram twice: the copy right after it, or after a delay.
	Duplicate
	// Reorder holds the datagram back until some later datagrams have passed it (or a bounded
	// delay expires), then releases it.
	Reorder
	// Corrupt flips one bit, so the ICRC (IBTA A17.3.3) no longer matches.
	Corrupt
	// Delay holds the datagram for a duration, then releases it.
	Delay
	// Release (events only): a held datagram (delayed, reordered, delayed duplicate) was let go.
	Release
	// Discard (events only): Close freed a held datagram that was never released.
	Discard
	// Mark marks an ECN-capable datagram Congestion Experienced (its TClass's ECN field, RFC
	// 3168), as a switch does instead of dropping; a not-ECT datagram is left alone.
	Mark
)

var actionNames = [...]string{"none", "drop", "dup", "reorder", "corrupt", "delay", "release", "discard", "mark"}

// String returns the action's name as written in rules ("drop", "dup", "reorder", "corrupt",
// "delay", "mark"), or "release"/"discard" for those events.
func (a Action) String() string {
	if int(a) < len(actionNames) {
		return actionNames[a]
	}
	return "action(" + strconv.Itoa(int(a)) + ")"
}

// Match selects which fields of a Rule must match the packet (a bit set).
type Match uint8

const (
	// MatchOp: the BTH opcode equals Rule.Op (IBTA 9.2.1 table 36).
	MatchOp Match = 1 << iota
	// MatchPSN: the BTH PSN equals Rule.PSN (IBTA 9.2; 24 bits).
	MatchPSN
	// MatchQPN: the BTH destination QP equals Rule.QPN (IBTA 9.2; 24 bits).
	MatchQPN
)

// Rule is a scripted fault: when a datagram's parsed BTH matches (every field named in Match;
// no field = every datagram), the rule counts a match, and it fires on the Nth match (Nth >= 1)
// or on every match (Nth == 0). Datagrams that bth.ParseInto rejects match only rules with an
// empty Match. Text form: see ParseRule.
type Rule struct {
	// Action is Drop, Duplicate, Reorder, Corrupt, Delay or Mark.
	Action Action
	// Match says which of Op, PSN and QPN are compared.
	Match Match
	// Op is the BTH opcode to match (with MatchOp).
	Op bth.Opcode
	// PSN is the BTH PSN to match (with MatchPSN).
	PSN bth.PSN
	// QPN is the BTH destination QP to match (with MatchQPN).
	QPN uint32
	// Nth fires the rule only on the Nth matching datagram (1-based); 0 fires on every match.
	Nth int
	// Delay: for Delay, how long the datagram is held (must be > 0); for Duplicate, how long
	// the copy is held (0 = it follows the original directly); for Reorder, the longest hold
	// (0 = DirOptions.ReorderDelay).
	Delay time.Duration
	// Hold (Reorder only) is how many later datagrams pass the held one before it is released;
	// 0 means 1.
	Hold int
}

// ErrRule is wrapped by every error about a rule or an option (ParseRule, ParseRules,
// ParseDirOptions, Options.Validate).
var ErrRule = errors.New("fault: invalid rule")

// Validate checks the rule's fields.
func (r *Rule) Validate() error {
	switch r.Action {
	case Drop, Duplicate, Reorder, Corrupt, Delay, Mark:
	default:
		return fmt.Errorf("%w: action %v", ErrRule, r.Action)
	}
	if r.Match&^(MatchOp|MatchPSN|MatchQPN) != 0 {
		return fmt.Errorf("%w: match bits %#x", ErrRule, uint8(r.Match))
	}
	if r.Match&MatchOp != 0 && !r.Op.Valid() {
		return fmt.Errorf("%w: opcode %#02x is not defined", ErrRule, uint8(r.Op))
	}
	if r.PSN > bth.PSNMask {
		return fmt.Errorf("%w: psn %d exceeds 24 bits", ErrRule, r.PSN)
	}
	if r.QPN > bth.PSNMask {
		return fmt.Errorf("%w: qpn %#x exceeds 24 bits", ErrRule, r.QPN)
	}
	if r.Nth < 0 {
		return fmt.Errorf("%w: nth %d", ErrRule, r.Nth)
	}
	if r.Delay < 0 {
		return fmt.Errorf("%w: negative delay", ErrRule)
	}
	if r.Delay != 0 && r.Action != Duplicate && r.Action != Reorder && r.Action != Delay {
		return fmt.Errorf("%w: delay given to %v", ErrRule, r.Action)
	}
	if r.Action == Delay && r.Delay == 0 {
		return fmt.Errorf("%w: delay needs delay=DURATION > 0", ErrRule)
	}
	if r.Hold < 0 || (r.Hold != 0 && r.Action != Reorder) {
		return fmt.Errorf("%w: hold %d (reorder only, >= 0)", ErrRule, r.Hold)
	}
	return nil
}

// matches reports whether the parsed packet (ok = parsed) satisfies the rule's Match.
func (r *Rule) matches(h bth.BTH, ok bool) bool {
	if r.Match == 0 {
		return true
	}
	if !ok {
		return false
	}
	if r.Match&MatchOp != 0 && h.Opcode() != r.Op {
		return false
	}
	if r.Match&MatchPSN != 0 && h.PSN() != r.PSN {
		return false
	}
	if r.Match&MatchQPN != 0 && h.DestQP() != r.QPN {
		return false
	}
	return true
}

// String renders the rule in the text form ParseRule reads (canonical: keys in the order op,
// psn, qpn, nth, hold, delay; opcode by name; QPN in hex).
func (r Rule) String() string {
	var b strings.Builder
	b.WriteString(r.Action.String())
	if r.Match&MatchOp != 0 {
		b.WriteString(":op=")
		b.WriteString(OpcodeName(r.Op))
	}
	if r.Match&MatchPSN != 0 {
		b.WriteString(":psn=")
		b.WriteString(strconv.FormatUint(uint64(r.PSN), 10))
	}
	if r.Match&MatchQPN != 0 {
		b.WriteString(":qpn=0x")
		b.WriteString(strconv.FormatUint(uint64(r.QPN), 16))
	}
	if r.Nth != 0 {
		b.WriteString(":nth=")
		b.WriteString(strconv.Itoa(r.Nth))
	}
	if r.Hold != 0 {
		b.WriteString(":hold=")
		b.WriteString(strconv.Itoa(r.Hold))
	}
	if r.Delay != 0 {
		b.WriteString(":delay=")
		b.WriteString(r.Delay.String())
	}
	return b.String()
}

// ParseRule reads the one-line text form of a Rule:
//
//	ACTION[:KEY=VALUE]...
//
// ACTION is drop, dup (or duplicate), reorder, corrupt, delay or mark (ECN CE). KEYs:
//
//	op=NAME|NUMBER   BTH opcode: a name such as READ_RESPONSE_MIDDLE, ACK, SEND_ONLY_IMM,
//	                 UD_SEND_ONLY, CNP (see OpcodeName; RC is the default transport), or a
//	                 number (0x0e, 14)
//	psn=N            BTH PSN (24 bits)
//	qpn=N            BTH destination QP (24 bits; 0x12 or 18)
//	nth=N            fire on the Nth match only (1-based); absent = every match
//	delay=DURATION   Go duration (10ms, 250us): hold time for delay, copy delay for dup,
//	                 longest hold for reorder
//	hold=K           reorder: release after K later datagrams
//
// Examples: "drop:op=READ_RESPONSE_MIDDLE:nth=3", "dup:op=ACK:psn=5", "corrupt:qpn=0x12:nth=1",
// "reorder:op=WRITE_MIDDLE:hold=2", "delay:op=READ_REQUEST:delay=5ms". Keys and names are
// case-insensitive.
func ParseRule(s string) (Rule, error) {
	var r Rule
	parts := strings.Split(strings.TrimSpace(s), ":")
	switch strings.ToLower(strings.TrimSpace(parts[0])) {
	case "drop":
		r.Action = Drop
	case "dup", "duplicate":
		r.Action = Duplicate
	case "reorder":
		r.Action = Reorder
	case "corrupt":
		r.Action = Corrupt
	case "delay":
		r.Action = Delay
	case "mark", "ce":
		r.Action = Mark
	default:
		return Rule{}, fmt.Errorf("%w: %q: unknown action %q", ErrRule, s, parts[0])
	}
	seen := map[string]bool{}
	for _, kv := range parts[1:] {
		k, v, ok := strings.Cut(kv, "=")
		k = strings.ToLower(strings.TrimSpace(k))
		v = strings.TrimSpace(v)
		if !ok || v == "" {
			return Rule{}, fmt.Errorf("%w: %q: want KEY=VALUE, got %q", ErrRule, s, kv)
		}
		if seen[k] {
			return Rule{}, fmt.Errorf("%w: %q: key %q repeated", ErrRule, s, k)
		}
		seen[k] = true
		var err error
		switch k {
		case "op", "opcode":
			r.Op, err = ParseOpcode(v)
			r.Match |= MatchOp
		case "psn":
			var n uint64
			n, err = strconv.ParseUint(v, 0, 24)
			r.PSN = bth.PSN(n)
			r.Match |= MatchPSN
		case "qpn", "qp", "dqpn":
			var n uint64
			n, err = strconv.ParseUint(v, 0, 24)
			r.QPN = uint32(n)
			r.Match |= MatchQPN
		case "nth":
			r.Nth, err = parsePositive(v)
		case "hold":
			r.Hold, err = parsePositive(v)
		case "delay":
			r.Delay, err = time.ParseDuration(v)
		default:
			return Rule{}, fmt.Errorf("%w: %q: unknown key %q", ErrRule, s, k)
		}
		if err != nil {
			return Rule{}, fmt.Errorf("%w: %q: %s: %v", ErrRule, s, k, err)
		}
	}
	if err := r.Validate(); err != nil {
		return Rule{}, fmt.Errorf("%q: %w", s, err)
	}
	return r, nil
}

func parsePositive(v string) (int, error) {
	n, err := strconv.ParseUint(v, 0, 31)
	if err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, errors.New("must be >= 1")
	}
	return int(n), nil
}

// ParseRules reads a list of rules separated by ',' or ';' (empty items are ignored).
func ParseRules(s string) ([]Rule, error) {
	var out []Rule
	for _, item := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ';' }) {
		if strings.TrimSpace(item) == "" {
			continue
		}
		r, err := ParseRule(item)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// RuleList is a flag.Value collecting rules: each Set parses a ParseRules list and appends it,
// so a command can take a repeatable -fault-send flag.
type RuleList []Rule

// String joins the rules' text forms with ','.
func (l *RuleList) String() string {
	if l == nil {
		return ""
	}
	s := make([]string, len(*l))
	for i, r := range *l {
		s[i] = r.String()
	}
	return strings.Join(s, ",")
}

// Set appends the rules parsed from s.
func (l *RuleList) Set(s string) error {
	rs, err := ParseRules(s)
	if err != nil {
		return err
	}
	*l = append(*l, rs...)
	return nil
}

// Opcode names for rules: the Wireshark-style name of pkg/bth (IBTA 9.2.1 table 36) in upper
// case with '_' between words and "RDMA" left out; the RC transport prefix is implied.
var (
	opByName map[string]bth.Opcode
	opNames  [256]string
)

func init() {
	opByName = make(map[string]bth.Opcode)
	for i := 0; i < 256; i++ {
		op := bth.Opcode(i)
		if !op.Valid() {
			continue
		}
		words := strings.Fields(strings.ToUpper(op.String()))
		kept := words[:0]
		for _, w := range words {
			if w != "RDMA" {
				kept = append(kept, w)
			}
		}
		if len(kept) > 1 && kept[0] == "RC" {
			kept = kept[1:]
		}
		name := strings.Join(kept, "_")
		opNames[i] = name
		opByName[name] = op
	}
}

// aliases expands abbreviations in opcode names (ib_pack.h and perftest spellings).
var aliases = map[string]string{
	"ACK": "ACKNOWLEDGE", "RESP": "RESPONSE", "REQ": "REQUEST", "IMM": "IMMEDIATE",
	"INV": "INVALIDATE", "CMP": "COMPARE",
}

// OpcodeName returns the rule-syntax name of op (e.g. READ_RESPONSE_MIDDLE, ACKNOWLEDGE,
// UD_SEND_ONLY, CNP), or its hex number (0x15) if op is not defined.
func OpcodeName(op bth.Opcode) string {
	if n := opNames[op]; n != "" {
		return n
	}
	return fmt.Sprintf("%#02x", uint8(op))
}

// ParseOpcode reads an opcode name as OpcodeName writes it, or a number. Case is ignored; '-'
// and ' ' may stand for '_'; the words RDMA and WITH are ignored; ACK, RESP, REQ, IMM, INV and
// CMP abbreviate ACKNOWLEDGE, RESPONSE, REQUEST, IMMEDIATE, INVALIDATE and COMPARE; a leading
// RC_ is optional. Opcodes that IBTA leaves undefined are refused.
func ParseOpcode(s string) (bth.Opcode, error) {
	if n, err := strconv.ParseUint(s, 0, 8); err == nil {
		if !bth.Opcode(n).Valid() {
			return 0, fmt.Errorf("%w: opcode %#02x is not defined", ErrRule, n)
		}
		return bth.Opcode(n), nil
	}
	words := strings.FieldsFunc(strings.ToUpper(s), func(r rune) bool { return r == '_' || r == '-' || r == ' ' })
	kept := make([]string, 0, len(words))
	for _, w := range words {
		if w == "RDMA" || w == "WITH" {
			continue
		}
		if a, ok := aliases[w]; ok {
			w = a
		}
		kept = append(kept, w)
	}
	if len(kept) > 1 && kept[0] == "RC" {
		kept = kept[1:]
	}
	if op, ok := opByName[strings.Join(kept, "_")]; ok {
		return op, nil
	}
	return 0, fmt.Errorf("%w: unknown opcode %q", ErrRule, s)
}
