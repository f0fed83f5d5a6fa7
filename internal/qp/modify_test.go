package qp

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

var allTypes = []Type{TypeRC, TypeUC, TypeUD, TypeGSI}

type spec struct{ req, opt AttrMask }

// expectedTable is written out from IBTA 11.2.4.2 / the kernel's qp_state_table, independently
// of modify.go. Key: from, to; value per type. Absent types are illegal for that transition.
func expectedTable() map[[2]State]map[Type]spec {
	const (
		rtsRC  = AttrCurState | AttrAltPath | AttrAccessFlags | AttrMinRNRTimer | AttrPathMigState | AttrRateLimit
		rtsUC  = AttrCurState | AttrAltPath | AttrAccessFlags | AttrPathMigState | AttrRateLimit
		rtsUD  = AttrCurState | AttrQKey | AttrRateLimit
		rtsGSI = AttrCurState | AttrQKey
		sqdAll = AttrEnSQDAsyncNotify
	)
	all := func(s spec) map[Type]spec {
		return map[Type]spec{TypeRC: s, TypeUC: s, TypeUD: s, TypeGSI: s}
	}
	m := map[[2]State]map[Type]spec{
		{StateReset, StateInit}: {
			TypeRC:  {req: AttrPKeyIndex | AttrPort | AttrAccessFlags},
			TypeUC:  {req: AttrPKeyIndex | AttrPort | AttrAccessFlags},
			TypeUD:  {req: AttrPKeyIndex | AttrPort | AttrQKey},
			TypeGSI: {req: AttrPKeyIndex | AttrQKey},
		},
		{StateInit, StateInit}: {
			TypeRC:  {opt: AttrPKeyIndex | AttrPort | AttrAccessFlags},
			TypeUC:  {opt: AttrPKeyIndex | AttrPort | AttrAccessFlags},
			TypeUD:  {opt: AttrPKeyIndex | AttrPort | AttrQKey},
			TypeGSI: {opt: AttrPKeyIndex | AttrQKey},
		},
		{StateInit, StateRTR}: {
			TypeRC: {req: AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRDAtomic | AttrMinRNRTimer,
				opt: AttrAltPath | AttrAccessFlags | AttrPKeyIndex | AttrSelectiveRepeat},
			TypeUC:  {req: AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN, opt: AttrAltPath | AttrAccessFlags | AttrPKeyIndex},
			TypeUD:  {opt: AttrPKeyIndex | AttrQKey},
			TypeGSI: {opt: AttrPKeyIndex | AttrQKey},
		},
		{StateRTR, StateRTS}: {
			TypeRC:  {req: AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrSQPSN | AttrMaxQPRDAtomic, opt: rtsRC | AttrSelectiveRepeat},
			TypeUC:  {req: AttrSQPSN, opt: rtsUC},
			TypeUD:  {req: AttrSQPSN, opt: rtsUD},
			TypeGSI: {req: AttrSQPSN, opt: rtsGSI},
		},
		{StateRTS, StateRTS}: {TypeRC: {opt: rtsRC}, TypeUC: {opt: rtsUC}, TypeUD: {opt: rtsUD}, TypeGSI: {opt: rtsGSI}},
		{StateRTS, StateSQD}: all(spec{opt: sqdAll}),
		{StateSQD, StateRTS}: {TypeRC: {opt: rtsRC}, TypeUC: {opt: rtsUC}, TypeUD: {opt: rtsUD}, TypeGSI: {opt: rtsGSI}},
		{StateSQD, StateSQD}: {
			TypeRC: {opt: AttrPort | AttrAV | AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRDAtomic |
				AttrMaxDestRDAtomic | AttrAltPath | AttrAccessFlags | AttrPKeyIndex | AttrMinRNRTimer | AttrPathMigState},
			TypeUC:  {opt: AttrAV | AttrAltPath | AttrAccessFlags | AttrPKeyIndex | AttrPathMigState},
			TypeUD:  {opt: AttrPKeyIndex | AttrQKey},
			TypeGSI: {opt: AttrPKeyIndex | AttrQKey},
		},
		{StateSQE, StateRTS}: {
			TypeUC:  {opt: AttrCurState | AttrAccessFlags},
			TypeUD:  {opt: AttrCurState | AttrQKey},
			TypeGSI: {opt: AttrCurState | AttrQKey},
		},
	}
	// Any state -> RESET and -> ERR, no attributes (RC never is in SQE).
	for s := StateReset; s <= StateErr; s++ {
		for _, to := range []State{StateReset, StateErr} {
			e := all(spec{})
			if s == StateSQE {
				delete(e, TypeRC)
			}
			m[[2]State{s, to}] = e
		}
	}
	return m
}

func goodAttr(to, cur State) *Attr {
	return &Attr{
		State: to, CurState: cur, PathMTU: MTU1024, QKey: 0x11111111, RQPSN: 0xFFFFFF, SQPSN: 0x123456,
		DestQPN: 0x12, AccessFlags: 7, PKeyIndex: 0, Port: 1,
		AH:      AHAttr{DGID: netip.MustParseAddr("198.18.0.2"), HopLimit: 64, FlowLabel: 0xFFFFF},
		Timeout: 31, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 31, MaxRDAtomic: 128, MaxDestRDAtomic: 128,
		PathMigState: MigArmed,
	}
}

var allBits = func() []AttrMask {
	var b []AttrMask
	for i := 1; i <= 20; i++ {
		b = append(b, 1<<i)
	}
	return append(b, AttrRateLimit, AttrSelectiveRepeat)
}()

func wantModifyErr(t *testing.T, err error, bit AttrMask, reason string, ctx string) {
	t.Helper()
	var me *ModifyError
	if !errors.As(err, &me) || !errors.Is(err, ErrModify) {
		t.Fatalf("%s: got %v, want a ModifyError", ctx, err)
	}
	if me.Attr != bit || me.Reason != reason {
		t.Fatalf("%s: got %q (attr %v), want %q naming %v", ctx, err, me.Attr, reason, bit)
	}
	if bit != 0 && !strings.Contains(err.Error(), bit.String()) {
		t.Fatalf("%s: message %q does not name %v", ctx, err, bit)
	}
}

// Every (from, to, type): legal transitions pass with the minimal mask, each required attribute
// removed is refused by name, each attribute outside required+optional is refused by name, each
// optional attribute is accepted, illegal transitions are refused.
func TestTransitionTable(t *testing.T) {
	exp := expectedTable()
	dev := DefaultDeviceAttr()
	for _, typ := range allTypes {
		for from := StateReset; from <= StateErr; from++ {
			for to := StateReset; to <= StateErr; to++ {
				ctx := typ.String() + " " + from.String() + "->" + to.String()
				sp, legal := exp[[2]State{from, to}][typ]
				a := goodAttr(to, from)
				ok, req, opt := Allowed(typ, from, to)
				if ok != legal || (legal && (req != sp.req || opt != sp.opt)) {
					t.Fatalf("%s: Allowed = %v %v %v, want %v %v %v", ctx, ok, req, opt, legal, sp.req, sp.opt)
				}
				if !legal {
					_, err := CheckModify(typ, from, a, AttrState, &dev)
					wantModifyErr(t, err, 0, "illegal transition", ctx)
					continue
				}
				next, err := CheckModify(typ, from, a, AttrState|sp.req, &dev)
				if err != nil || next != to {
					t.Fatalf("%s: minimal mask %v: next %v err %v", ctx, sp.req, next, err)
				}
				for _, bit := range allBits {
					m := AttrState | sp.req
					switch {
					case sp.req&bit != 0:
						_, err := CheckModify(typ, from, a, m&^bit, &dev)
						wantModifyErr(t, err, bit, "requires", ctx+" without "+bit.String())
					case sp.opt&bit != 0:
						_, err := CheckModify(typ, from, a, m|bit, &dev)
						if bit == AttrAltPath {
							wantModifyErr(t, err, bit, "not supported", ctx+" alt path")
						} else if err != nil {
							t.Fatalf("%s: optional %v refused: %v", ctx, bit, err)
						}
					default:
						_, err := CheckModify(typ, from, a, m|bit, &dev)
						wantModifyErr(t, err, bit, "does not allow", ctx+" with "+bit.String())
					}
				}
			}
		}
	}
}

func TestModifyErrorText(t *testing.T) {
	_, err := CheckModify(TypeRC, StateRTR, goodAttr(StateRTS, StateRTR),
		AttrState|AttrTimeout|AttrRetryCnt|AttrRNRRetry|AttrMaxQPRDAtomic, nil)
	if err == nil || err.Error() != "qp: RTR->RTS for RC requires IBV_QP_SQ_PSN" {
		t.Fatalf("got %q", err)
	}
}

func TestModifyWithoutState(t *testing.T) {
	a := goodAttr(StateReset, StateRTS) // State ignored without AttrState
	next, err := CheckModify(TypeRC, StateRTS, a, AttrMinRNRTimer, nil)
	if err != nil || next != StateRTS {
		t.Fatalf("RTS attribute change: %v %v", next, err)
	}
	_, err = CheckModify(TypeRC, StateRTR, a, AttrMinRNRTimer, nil)
	wantModifyErr(t, err, 0, "illegal transition", "RTR->RTR")
}

func TestCurState(t *testing.T) {
	a := goodAttr(StateRTS, StateRTS)
	if _, err := CheckModify(TypeUD, StateRTS, a, AttrState|AttrCurState, nil); err != nil {
		t.Fatal(err)
	}
	a.CurState = StateSQD
	_, err := CheckModify(TypeUD, StateRTS, a, AttrState|AttrCurState, nil)
	wantModifyErr(t, err, AttrCurState, "out of range", "wrong cur state")
	// CUR_STATE is refused from RESET/INIT/ERR even for -> RESET / -> ERR.
	a = goodAttr(StateErr, StateInit)
	_, err = CheckModify(TypeRC, StateInit, a, AttrState|AttrCurState, nil)
	wantModifyErr(t, err, AttrCurState, "does not allow", "cur state from INIT")
}

func TestRanges(t *testing.T) {
	dev := DefaultDeviceAttr()
	dev.MaxQPRDAtom, dev.MaxQPInitRDAtom = 16, 8
	type rc struct {
		name string
		typ  Type
		from State
		bit  AttrMask
		mut  func(a *Attr)
	}
	rtr := AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRDAtomic | AttrMinRNRTimer
	rts := AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrSQPSN | AttrMaxQPRDAtomic
	init := AttrPKeyIndex | AttrPort | AttrAccessFlags
	mask := map[State]AttrMask{StateReset: init, StateInit: rtr, StateRTR: rts}
	next := map[State]State{StateReset: StateInit, StateInit: StateRTR, StateRTR: StateRTS}
	cases := []rc{
		{"mtu 0", TypeRC, StateInit, AttrPathMTU, func(a *Attr) { a.PathMTU = 0 }},
		{"mtu 6", TypeRC, StateInit, AttrPathMTU, func(a *Attr) { a.PathMTU = 6 }},
		{"min rnr 32", TypeRC, StateInit, AttrMinRNRTimer, func(a *Attr) { a.MinRNRTimer = 32 }},
		{"dest rd atomic", TypeRC, StateInit, AttrMaxDestRDAtomic, func(a *Attr) { a.MaxDestRDAtomic = 17 }},
		{"rq psn", TypeRC, StateInit, AttrRQPSN, func(a *Attr) { a.RQPSN = 1 << 24 }},
		{"dest qpn", TypeRC, StateInit, AttrDestQPN, func(a *Attr) { a.DestQPN = 1 << 24 }},
		{"no dgid", TypeRC, StateInit, AttrAV, func(a *Attr) { a.AH.DGID = netip.Addr{} }},
		{"unspecified dgid", TypeRC, StateInit, AttrAV, func(a *Attr) { a.AH.DGID = netip.IPv4Unspecified() }},
		{"flow label", TypeRC, StateInit, AttrAV, func(a *Attr) { a.AH.FlowLabel = 1 << 20 }},
		{"ah port", TypeRC, StateInit, AttrAV, func(a *Attr) { a.AH.Port = 2 }},
		{"timeout 32", TypeRC, StateRTR, AttrTimeout, func(a *Attr) { a.Timeout = 32 }},
		{"retry 8", TypeRC, StateRTR, AttrRetryCnt, func(a *Attr) { a.RetryCnt = 8 }},
		{"rnr retry 8", TypeRC, StateRTR, AttrRNRRetry, func(a *Attr) { a.RNRRetry = 8 }},
		{"rd atomic", TypeRC, StateRTR, AttrMaxQPRDAtomic, func(a *Attr) { a.MaxRDAtomic = 9 }},
		{"sq psn", TypeUC, StateRTR, AttrSQPSN, func(a *Attr) { a.SQPSN = 1 << 24 }},
		{"port 0", TypeRC, StateReset, AttrPort, func(a *Attr) { a.Port = 0 }},
		{"port 2", TypeRC, StateReset, AttrPort, func(a *Attr) { a.Port = 2 }},
		{"pkey index 1", TypeRC, StateReset, AttrPKeyIndex, func(a *Attr) { a.PKeyIndex = 1 }},
		{"access MW_BIND", TypeRC, StateReset, AttrAccessFlags, func(a *Attr) { a.AccessFlags = 16 }},
	}
	for _, c := range cases {
		a := goodAttr(next[c.from], c.from)
		a.MaxRDAtomic, a.MaxDestRDAtomic = 8, 16 // at the limits: accepted
		m := mask[c.from]
		if c.typ == TypeUC && c.from == StateRTR {
			m = AttrSQPSN
		}
		if _, err := CheckModify(c.typ, c.from, a, AttrState|m, &dev); err != nil {
			t.Fatalf("%s: baseline refused: %v", c.name, err)
		}
		c.mut(a)
		_, err := CheckModify(c.typ, c.from, a, AttrState|m, &dev)
		wantModifyErr(t, err, c.bit, "out of range", c.name)
	}
	// Unknown type / state.
	if _, err := CheckModify(Type(9), StateReset, goodAttr(StateInit, 0), AttrState, nil); err == nil {
		t.Fatal("unknown type accepted")
	}
	if _, err := CheckModify(TypeRC, StateReset, goodAttr(State(7), 0), AttrState, nil); err == nil {
		t.Fatal("unknown state accepted")
	}
}

func TestMTU(t *testing.T) {
	want := map[MTU]int{0: 0, MTU256: 256, MTU512: 512, MTU1024: 1024, MTU2048: 2048, MTU4096: 4096, 6: 0}
	for m, b := range want {
		if m.Bytes() != b || m.Valid() != (b != 0) {
			t.Errorf("MTU %d: %d", m, m.Bytes())
		}
		if b != 0 && MTUFromBytes(b) != m {
			t.Errorf("MTUFromBytes(%d)", b)
		}
	}
	if MTUFromBytes(1500-80) != MTU1024 || MTUFromBytes(9000) != MTU4096 || MTUFromBytes(255) != 0 {
		t.Error("MTUFromBytes")
	}
	if DefaultPortAttr(1500).ActiveMTU != MTU1024 || DefaultPortAttr(9000).ActiveMTU != MTU4096 {
		t.Error("port active MTU (rxe: 1500 -> 1024, 9000 -> 4096)")
	}
}

func TestMaskString(t *testing.T) {
	if s := (AttrState | AttrSQPSN).String(); s != "IBV_QP_STATE|IBV_QP_SQ_PSN" {
		t.Fatal(s)
	}
	if (AttrMask(1<<29)).String() != "bit29" || AttrMask(0).String() != "0" || AttrSelectiveRepeat.String() != "SOFTROCE_QP_SELECTIVE_REPEAT" {
		t.Fatal("unnamed bits")
	}
}
