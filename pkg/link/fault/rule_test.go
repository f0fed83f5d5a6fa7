package fault

import (
	"errors"
	"flag"
	"slices"
	"testing"
	"time"

	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
)

func mustRules(t *testing.T, s string) []Rule {
	t.Helper()
	rs, err := ParseRules(s)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// "drop the 3rd packet whose opcode is RC READ response Middle"
func TestRuleDropNthReadResponseMiddle(t *testing.T) {
	a, b := memPair(t)
	log := newEventLog()
	f := Wrap(a, Options{OnEvent: log.add, Send: DirOptions{Rules: mustRules(t, "drop:op=READ_RESPONSE_MIDDLE:nth=3")}})
	ops := []bth.Opcode{bth.OpRCReadRespFirst, bth.OpRCReadRespMiddle, bth.OpRCAck, bth.OpRCReadRespMiddle,
		bth.OpRCWriteMiddle, bth.OpRCReadRespMiddle, bth.OpRCReadRespMiddle, bth.OpRCReadRespLast}
	var batch []link.Datagram
	for i, op := range ops {
		batch = append(batch, dg(pkt(t, op, 0x33, bth.PSN(100+i), 256)))
	}
	if err := f.Send(batch); err != nil {
		t.Fatal(err)
	}
	got := psns(recvN(t, b, len(ops)-1))
	if want := []uint32{100, 101, 102, 103, 104, 106, 107}; !slices.Equal(got, want) {
		t.Fatalf("got %v want %v (PSN 105 is the 3rd READ response middle)", got, want)
	}
	ev := log.all()
	if len(ev) != 1 || ev[0].Kind != Drop || ev[0].Seq != 5 || ev[0].Rule != 0 || !ev[0].Parsed ||
		ev[0].Op != bth.OpRCReadRespMiddle || ev[0].PSN != 105 || ev[0].QPN != 0x33 || ev[0].Dir != DirSend {
		t.Fatalf("events %+v", ev)
	}
}

// "duplicate every ACK with PSN 5"
func TestRuleDupEveryAckPSN5(t *testing.T) {
	a, b := memPair(t)
	f := Wrap(a, Options{Send: DirOptions{Rules: mustRules(t, "dup:op=ACK:psn=5")}})
	var sent []uint32
	for round := 0; round < 3; round++ {
		for psn := 3; psn <= 7; psn++ {
			if err := f.Send([]link.Datagram{dg(pkt(t, bth.OpRCAck, 9, bth.PSN(psn), 0))}); err != nil {
				t.Fatal(err)
			}
			sent = append(sent, uint32(psn))
			if psn == 5 {
				sent = append(sent, 5)
			}
		}
		// a SEND with PSN 5 is not an ACK: untouched
		if err := f.Send([]link.Datagram{dg(pkt(t, bth.OpRCSendOnly, 9, 5, 4))}); err != nil {
			t.Fatal(err)
		}
		sent = append(sent, 5)
	}
	if got := psns(recvN(t, b, len(sent))); !slices.Equal(got, sent) {
		t.Fatalf("got %v want %v", got, sent)
	}
	if s := f.Stats().Send; s.Duplicated != 3 || s.RuleFired != 3 {
		t.Fatalf("stats %+v", s)
	}
}

// "corrupt the first packet to QPN 0x12"
func TestRuleCorruptFirstToQPN(t *testing.T) {
	a, b := memPair(t)
	f := Wrap(a, Options{Seed1: 1, Send: DirOptions{Rules: mustRules(t, "corrupt:qpn=0x12:nth=1")}})
	qpns := []uint32{0x11, 0x13, 0x12, 0x12, 0x11, 0x12}
	for i, q := range qpns {
		if err := f.Send([]link.Datagram{dg(pkt(t, bth.OpRCSendOnly, q, bth.PSN(i), 32))}); err != nil {
			t.Fatal(err)
		}
	}
	for i, p := range recvN(t, b, len(qpns)) {
		if ok := bth.VerifyICRC(endpoints(), p); ok == (i == 2) {
			t.Fatalf("datagram %d (QPN %#x): ICRC ok=%v", i, qpns[i], ok)
		}
	}
}

func TestRuleOrderAndCounting(t *testing.T) {
	a, b := memPair(t)
	log := newEventLog()
	// Both rules match every SEND ONLY; each counts its own matches, the first that fires wins.
	f := Wrap(a, Options{OnEvent: log.add, Send: DirOptions{Drop: 1, // random drop never applies when a rule fires
		Rules: mustRules(t, "dup:op=SEND_ONLY:nth=2; drop:op=SEND_ONLY:nth=2, dup:op=send_only:nth=3")}})
	sendPSNs(t, f, 0, 4)
	// PSN 0: no rule fires -> random Drop=1. PSN 1: rule 0 (dup) fires; rule 1 (its 2nd match)
	// would fire too but rule 0 is first. PSN 2: rule 2 fires. PSN 3: no rule -> dropped.
	if got := psns(recvN(t, b, 4)); !slices.Equal(got, []uint32{1, 1, 2, 2}) {
		t.Fatalf("got %v", got)
	}
	var kinds []Action
	var rules []int
	for _, e := range log.all() {
		kinds, rules = append(kinds, e.Kind), append(rules, e.Rule)
	}
	if !slices.Equal(kinds, []Action{Drop, Duplicate, Duplicate, Drop}) || !slices.Equal(rules, []int{-1, 0, 2, -1}) {
		t.Fatalf("kinds %v rules %v", kinds, rules)
	}
}

func TestRuleDelayAndUnparsed(t *testing.T) {
	clk := newManualClock()
	a, b := memPair(t)
	f := Wrap(a, Options{Clock: AdaptClock(clk), Send: DirOptions{Rules: []Rule{
		{Action: Delay, Match: MatchOp, Op: bth.OpRCReadRequest, Delay: 5 * time.Millisecond},
		{Action: Drop, Match: MatchQPN, QPN: 0}, // never matches garbage
	}}})
	garbage := dg([]byte{0xFF, 0xFF, 0xFF})
	req := dg(pkt(t, bth.OpRCReadRequest, 1, 1, 0))
	if err := f.Send([]link.Datagram{req, garbage}); err != nil {
		t.Fatal(err)
	}
	if got := recvN(t, b, 1); len(got[0]) != 3 {
		t.Fatal("garbage should pass first")
	}
	clk.Advance(5 * time.Millisecond)
	if got := psns(recvN(t, b, 1)); got[0] != 1 {
		t.Fatal("read request not released")
	}
}

func TestParseRule(t *testing.T) {
	good := []struct {
		in   string
		want Rule
		text string
	}{
		{"drop:op=READ_RESPONSE_MIDDLE:nth=3", Rule{Action: Drop, Match: MatchOp, Op: bth.OpRCReadRespMiddle, Nth: 3}, "drop:op=READ_RESPONSE_MIDDLE:nth=3"},
		{"dup:op=ACK:psn=5", Rule{Action: Duplicate, Match: MatchOp | MatchPSN, Op: bth.OpRCAck, PSN: 5}, "dup:op=ACKNOWLEDGE:psn=5"},
		{"corrupt:qpn=0x12:nth=1", Rule{Action: Corrupt, Match: MatchQPN, QPN: 0x12, Nth: 1}, "corrupt:qpn=0x12:nth=1"},
		{" Duplicate : OP = rc-rdma-read-resp-first : delay=2ms ", Rule{Action: Duplicate, Match: MatchOp, Op: bth.OpRCReadRespFirst, Delay: 2 * time.Millisecond}, "dup:op=READ_RESPONSE_FIRST:delay=2ms"},
		{"reorder:op=0x0e:hold=2:delay=1ms", Rule{Action: Reorder, Match: MatchOp, Op: bth.OpRCReadRespMiddle, Hold: 2, Delay: time.Millisecond}, "reorder:op=READ_RESPONSE_MIDDLE:hold=2:delay=1ms"},
		{"delay:op=UD_SEND_ONLY_IMM:delay=250us", Rule{Action: Delay, Match: MatchOp, Op: bth.OpUDSendOnlyImm, Delay: 250 * time.Microsecond}, "delay:op=UD_SEND_ONLY_IMMEDIATE:delay=250µs"},
		{"drop:op=SEND_LAST_WITH_IMMEDIATE", Rule{Action: Drop, Match: MatchOp, Op: bth.OpRCSendLastImm}, "drop:op=SEND_LAST_IMMEDIATE"},
		{"drop:op=cmp_swap", Rule{Action: Drop, Match: MatchOp, Op: bth.OpRCCmpSwap}, "drop:op=COMPARE_SWAP"},
		{"drop:op=ATOMIC_ACK", Rule{Action: Drop, Match: MatchOp, Op: bth.OpRCAtomicAck}, "drop:op=ATOMIC_ACKNOWLEDGE"},
		{"drop:op=CNP", Rule{Action: Drop, Match: MatchOp, Op: bth.OpCNP}, "drop:op=CNP"},
		{"drop:op=UC_WRITE_ONLY", Rule{Action: Drop, Match: MatchOp, Op: bth.OpUCWriteOnly}, "drop:op=UC_WRITE_ONLY"},
		{"drop", Rule{Action: Drop}, "drop"},
		{"corrupt:psn=16777215", Rule{Action: Corrupt, Match: MatchPSN, PSN: bth.PSNMask}, "corrupt:psn=16777215"},
	}
	for _, c := range good {
		r, err := ParseRule(c.in)
		if err != nil {
			t.Fatalf("%q: %v", c.in, err)
		}
		if r != c.want || r.String() != c.text {
			t.Fatalf("%q: %+v %q, want %+v %q", c.in, r, r.String(), c.want, c.text)
		}
		back, err := ParseRule(r.String())
		if err != nil || back != r {
			t.Fatalf("round trip %q: %+v %v", r.String(), back, err)
		}
	}
	bad := []string{"", "explode", "drop:", "drop:op", "drop:op=", "drop:op=NOPE", "drop:op=0x15",
		"drop:op=300", "drop:psn=16777216", "drop:qpn=0x1000000", "drop:nth=0", "drop:nth=-1",
		"drop:nth=x", "drop:delay=1ms", "delay", "delay:delay=0s", "delay:delay=-1ms", "drop:hold=2",
		"reorder:hold=0", "drop:color=red", "drop:psn=1:psn=2", "dup:delay=banana"}
	for _, s := range bad {
		if _, err := ParseRule(s); !errors.Is(err, ErrRule) {
			t.Fatalf("%q: err %v", s, err)
		}
	}
}

func TestOpcodeNamesRoundTrip(t *testing.T) {
	names := map[string]bool{}
	for i := 0; i < 256; i++ {
		op := bth.Opcode(i)
		name := OpcodeName(op)
		got, err := ParseOpcode(name)
		if !op.Valid() {
			if err == nil {
				t.Fatalf("undefined opcode %#x parsed from %q", i, name)
			}
			continue
		}
		if err != nil || got != op {
			t.Fatalf("%#x -> %q -> %v %v", i, name, got, err)
		}
		if names[name] {
			t.Fatalf("name %q twice", name)
		}
		names[name] = true
	}
}

func TestRuleListFlag(t *testing.T) {
	var l RuleList
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.Var(&l, "fault", "rules")
	if err := fs.Parse([]string{"-fault", "drop:op=ACK:nth=2,dup:psn=5", "-fault", "corrupt:qpn=7"}); err != nil {
		t.Fatal(err)
	}
	if len(l) != 3 || l.String() != "drop:op=ACKNOWLEDGE:nth=2,dup:psn=5,corrupt:qpn=0x7" {
		t.Fatalf("%d rules: %s", len(l), l.String())
	}
	if err := fs.Parse([]string{"-fault", "drop:nth=0"}); err == nil {
		t.Fatal("bad rule accepted")
	}
}

func TestValidateAndClamp(t *testing.T) {
	bad := []DirOptions{{Drop: -0.1}, {Corrupt: 1.5}, {Delay: -1}, {ReorderDepth: -1}, {CorruptRegion: 9},
		{Rules: []Rule{{Action: Release}}}, {Rules: []Rule{{Action: Drop, Match: MatchOp, Op: 0x15}}}}
	for i, o := range bad {
		opts := Options{Recv: o}
		if err := opts.Validate(); !errors.Is(err, ErrRule) {
			t.Fatalf("case %d: %v", i, err)
		}
	}
	ok := Options{Send: DirOptions{Drop: 1, Rules: mustRules(t, "dup:op=ACK")}}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	// Wrap clamps: a probability above 1 drops everything, an invalid rule is ignored.
	a, _ := memPair(t)
	f := Wrap(a, Options{Send: DirOptions{Drop: 7, Delay: -time.Second, Rules: []Rule{{Action: 99}}}})
	sendPSNs(t, f, 0, 3)
	if s := f.Stats().Send; s.Dropped != 3 || s.RuleFired != 0 || s.Held != 0 {
		t.Fatalf("stats %+v", s)
	}
}
