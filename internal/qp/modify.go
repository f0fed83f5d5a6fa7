package qp

import (
	"errors"

	"github.com/softroce/softroce/internal/mr"
)

// The modify-QP transition table (IBTA 11.2.4.2 "Modify Queue Pair" tables 95-97 / ibverbs
// ibv_modify_qp). For each (current, next) state pair: whether the transition is legal, and per
// QP type the attributes it requires and those it additionally allows. AttrState is always
// allowed. "Any state -> RESET" and "any state -> ERR" need no attributes (IBTA 10.3.1).

type transition struct {
	valid bool
	req   [numTypes]AttrMask
	opt   [numTypes]AttrMask
}

const numTypes = 4

// typeIndex maps a Type to the table column (GSI=0, RC=1, UC=2, UD=3).
func typeIndex(t Type) int { return int(t) - 1 }

// perType builds a column set in the order RC, UC, UD, GSI.
func perType(rc, uc, ud, gsi AttrMask) [numTypes]AttrMask {
	var a [numTypes]AttrMask
	a[typeIndex(TypeRC)] = rc
	a[typeIndex(TypeUC)] = uc
	a[typeIndex(TypeUD)] = ud
	a[typeIndex(TypeGSI)] = gsi
	return a
}

// The rate limit (ibv_modify_qp_rate_limit) may be set on the way to RTS and in RTS on RC, UC
// and UD QPs: the kernel's table has IB_QP_RATE_LIMIT for raw packet QPs, whose place softroce's
// QPs take for packet pacing (docs/congestion.md); QP1 is not paced.
const (
	optRTSRC  = AttrCurState | AttrAltPath | AttrAccessFlags | AttrMinRNRTimer | AttrPathMigState | AttrRateLimit
	optRTSUC  = AttrCurState | AttrAltPath | AttrAccessFlags | AttrPathMigState | AttrRateLimit
	optRTSUD  = AttrCurState | AttrQKey | AttrRateLimit
	optRTSGSI = AttrCurState | AttrQKey
)

var stateTable = func() (tb [StateErr + 1][StateErr + 1]transition) {
	for s := StateReset; s <= StateErr; s++ {
		tb[s][StateReset].valid = true
		tb[s][StateErr].valid = true
	}
	tb[StateReset][StateInit] = transition{valid: true, req: perType(
		AttrPKeyIndex|AttrPort|AttrAccessFlags,
		AttrPKeyIndex|AttrPort|AttrAccessFlags,
		AttrPKeyIndex|AttrPort|AttrQKey,
		AttrPKeyIndex|AttrQKey)}
	tb[StateInit][StateInit] = transition{valid: true, opt: perType(
		AttrPKeyIndex|AttrPort|AttrAccessFlags,
		AttrPKeyIndex|AttrPort|AttrAccessFlags,
		AttrPKeyIndex|AttrPort|AttrQKey,
		AttrPKeyIndex|AttrQKey)}
	tb[StateInit][StateRTR] = transition{valid: true,
		req: perType(
			AttrAV|AttrPathMTU|AttrDestQPN|AttrRQPSN|AttrMaxDestRDAtomic|AttrMinRNRTimer,
			AttrAV|AttrPathMTU|AttrDestQPN|AttrRQPSN,
			0, 0),
		opt: perType(
			AttrAltPath|AttrAccessFlags|AttrPKeyIndex|AttrSelectiveRepeat,
			AttrAltPath|AttrAccessFlags|AttrPKeyIndex,
			AttrPKeyIndex|AttrQKey,
			AttrPKeyIndex|AttrQKey)}
	tb[StateRTR][StateRTS] = transition{valid: true,
		req: perType(
			AttrTimeout|AttrRetryCnt|AttrRNRRetry|AttrSQPSN|AttrMaxQPRDAtomic,
			AttrSQPSN, AttrSQPSN, AttrSQPSN),
		opt: perType(optRTSRC|AttrSelectiveRepeat, optRTSUC, optRTSUD, optRTSGSI)}
	tb[StateRTS][StateRTS] = transition{valid: true, opt: perType(optRTSRC, optRTSUC, optRTSUD, optRTSGSI)}
	tb[StateRTS][StateSQD] = transition{valid: true, opt: perType(
		AttrEnSQDAsyncNotify, AttrEnSQDAsyncNotify, AttrEnSQDAsyncNotify, AttrEnSQDAsyncNotify)}
	tb[StateSQD][StateRTS] = transition{valid: true, opt: perType(optRTSRC, optRTSUC, optRTSUD, optRTSGSI)}
	tb[StateSQD][StateSQD] = transition{valid: true, opt: perType(
		AttrPort|AttrAV|AttrTimeout|AttrRetryCnt|AttrRNRRetry|AttrMaxQPRDAtomic|
			AttrMaxDestRDAtomic|AttrAltPath|AttrAccessFlags|AttrPKeyIndex|AttrMinRNRTimer|
			AttrPathMigState,
		AttrAV|AttrAltPath|AttrAccessFlags|AttrPKeyIndex|AttrPathMigState,
		AttrPKeyIndex|AttrQKey,
		AttrPKeyIndex|AttrQKey)}
	// SQE exists only for UC and UD (IBTA 10.3.1.x: an RC send error goes to ERR).
	tb[StateSQE][StateRTS] = transition{valid: true, opt: perType(
		0, AttrCurState|AttrAccessFlags, AttrCurState|AttrQKey, AttrCurState|AttrQKey)}
	return tb
}()

// Allowed returns whether cur -> next is a legal transition for t, and its required and
// optional attributes (AttrState excluded). Exposed for docs and tests.
func Allowed(t Type, cur, next State) (ok bool, req, opt AttrMask) {
	if !t.Valid() || !cur.Valid() || !next.Valid() {
		return false, 0, 0
	}
	if t == TypeRC && (cur == StateSQE || next == StateSQE) {
		return false, 0, 0
	}
	tr := &stateTable[cur][next]
	i := typeIndex(t)
	return tr.valid, tr.req[i], tr.opt[i]
}

// ErrModify is matched (errors.Is) by every *ModifyError.
var ErrModify = errors.New("qp: invalid modify")

// ModifyError explains why CheckModify refused a modify request.
type ModifyError struct {
	Type     Type
	From, To State
	// Attr is the offending attribute bit (0 for an illegal transition).
	Attr AttrMask
	// Reason is "requires", "does not allow", "illegal transition", "out of range", or
	// "not supported".
	Reason string
}

// Error reads like "qp: RTR->RTS for RC requires IBV_QP_SQ_PSN".
func (e *ModifyError) Error() string {
	s := "qp: " + e.From.String() + "->" + e.To.String() + " for " + e.Type.String() + " "
	if e.Attr == 0 {
		return s + e.Reason
	}
	return s + e.Reason + " " + e.Attr.String()
}

// Is makes errors.Is(err, ErrModify) true.
func (e *ModifyError) Is(target error) bool { return target == ErrModify }

// Limits CheckModify enforces (IBTA 9.7.6.1.x, 9.7.5.2.8, 11.2.4.2).
const (
	MaxTimeout     = 31
	MaxRetryCnt    = 7
	MaxRNRRetry    = 7
	MaxMinRNRTimer = 31
	MaxPSN         = 0xFFFFFF
	MaxQPN         = 0xFFFFFF
	// MaxFlowLabel is the largest 20-bit IPv6 flow label.
	MaxFlowLabel = 0xFFFFF
	qpAccessBits = mr.AccessLocalWrite | mr.AccessRemoteWrite | mr.AccessRemoteRead | mr.AccessRemoteAtomic |
		mr.AccessFlushGlobal | mr.AccessFlushPersistent // the FLUSH placement types the responder takes
)

// CheckModify validates an ibv_modify_qp request for a QP of type t in state cur and returns
// the state the QP moves to. Without AttrState the request modifies attributes in the
// current state (cur -> cur must then be legal). It enforces the transition table (required
// attributes present, no attribute outside required+optional), AttrCurState only from
// RTR/RTS/SQD/SQE and equal to cur, and value ranges: PathMTU 1..5, Timeout/MinRNRTimer
// 0..31, RetryCnt/RNRRetry 0..7, MaxRDAtomic <= MaxQPInitRDAtom, MaxDestRDAtomic <=
// MaxQPRDAtom, 24-bit PSNs and QPN, Port 1, PKeyIndex < MaxPKeys, access flags, a valid DGID.
// The alternate path is refused (RoCE has no automatic path migration; the kernel refuses
// IB_QP_ALT_PATH on RoCE too). dev nil means DefaultDeviceAttr().
func CheckModify(t Type, cur State, a *Attr, mask AttrMask, dev *DeviceAttr) (next State, err error) {
	if dev == nil {
		d := DefaultDeviceAttr()
		dev = &d
	}
	next = cur
	if mask&AttrState != 0 {
		next = a.State
	}
	fail := func(bit AttrMask, why string) (State, error) {
		return cur, &ModifyError{Type: t, From: cur, To: next, Attr: bit, Reason: why}
	}
	if !t.Valid() {
		return fail(0, "unknown QP type")
	}
	if !cur.Valid() || !next.Valid() {
		return fail(AttrState, "out of range")
	}
	ok, req, opt := Allowed(t, cur, next)
	if !ok {
		return fail(0, "illegal transition")
	}
	if mask&AttrCurState != 0 {
		if cur != StateRTR && cur != StateRTS && cur != StateSQD && cur != StateSQE {
			return fail(AttrCurState, "does not allow")
		}
		if a.CurState != cur {
			return fail(AttrCurState, "out of range")
		}
	}
	if missing := req &^ mask; missing != 0 {
		return fail(lowestBit(missing), "requires")
	}
	if extra := mask &^ (req | opt | AttrState); extra != 0 {
		return fail(lowestBit(extra), "does not allow")
	}
	return next, checkRanges(t, cur, next, a, mask, dev)
}

func lowestBit(m AttrMask) AttrMask { return m & -m }

func checkRanges(t Type, cur, next State, a *Attr, m AttrMask, dev *DeviceAttr) error {
	bad := func(bit AttrMask, why string) error {
		return &ModifyError{Type: t, From: cur, To: next, Attr: bit, Reason: why}
	}
	if m&AttrAltPath != 0 {
		return bad(AttrAltPath, "not supported")
	}
	if m&AttrPathMTU != 0 && !a.PathMTU.Valid() {
		return bad(AttrPathMTU, "out of range")
	}
	if m&AttrTimeout != 0 && a.Timeout > MaxTimeout {
		return bad(AttrTimeout, "out of range")
	}
	if m&AttrRetryCnt != 0 && a.RetryCnt > MaxRetryCnt {
		return bad(AttrRetryCnt, "out of range")
	}
	if m&AttrRNRRetry != 0 && a.RNRRetry > MaxRNRRetry {
		return bad(AttrRNRRetry, "out of range")
	}
	if m&AttrMinRNRTimer != 0 && a.MinRNRTimer > MaxMinRNRTimer {
		return bad(AttrMinRNRTimer, "out of range")
	}
	if m&AttrMaxQPRDAtomic != 0 && int(a.MaxRDAtomic) > dev.MaxQPInitRDAtom {
		return bad(AttrMaxQPRDAtomic, "out of range")
	}
	if m&AttrMaxDestRDAtomic != 0 && int(a.MaxDestRDAtomic) > dev.MaxQPRDAtom {
		return bad(AttrMaxDestRDAtomic, "out of range")
	}
	if m&AttrRQPSN != 0 && a.RQPSN > MaxPSN {
		return bad(AttrRQPSN, "out of range")
	}
	if m&AttrSQPSN != 0 && a.SQPSN > MaxPSN {
		return bad(AttrSQPSN, "out of range")
	}
	if m&AttrDestQPN != 0 && a.DestQPN > MaxQPN {
		return bad(AttrDestQPN, "out of range")
	}
	if m&AttrPort != 0 && a.Port != 1 {
		return bad(AttrPort, "out of range")
	}
	if m&AttrPKeyIndex != 0 && int(a.PKeyIndex) >= max(dev.MaxPKeys, 1) {
		return bad(AttrPKeyIndex, "out of range")
	}
	if m&AttrAccessFlags != 0 && a.AccessFlags&^qpAccessBits != 0 {
		return bad(AttrAccessFlags, "out of range")
	}
	if m&AttrPathMigState != 0 && a.PathMigState > MigArmed {
		return bad(AttrPathMigState, "out of range")
	}
	if m&AttrAV != 0 {
		ah := &a.AH
		if !ah.DGID.IsValid() || ah.DGID.IsUnspecified() || ah.FlowLabel > MaxFlowLabel ||
			(ah.Port != 0 && ah.Port != 1) {
			return bad(AttrAV, "out of range")
		}
	}
	return nil
}
