package qp

import (
	"net/netip"
	"testing"

	"github.com/softroce/softroce/internal/cq"
)

// walkTo moves q from RESET along RESET->INIT->RTR->RTS(->SQD) to target with the minimal
// required mask of each transition (Allowed), or straight to ERR.
func walkTo(t *testing.T, q *QP, target State) {
	t.Helper()
	path := map[State][]State{
		StateReset: nil,
		StateInit:  {StateInit},
		StateRTR:   {StateInit, StateRTR},
		StateRTS:   {StateInit, StateRTR, StateRTS},
		StateSQD:   {StateInit, StateRTR, StateRTS, StateSQD},
		StateErr:   {StateErr},
	}[target]
	cur := StateReset
	for _, to := range path {
		ok, req, _ := Allowed(q.Type(), cur, to)
		if !ok {
			t.Fatalf("%v: %v->%v not allowed", q.Type(), cur, to)
		}
		a := goodAttr(to, cur)
		a.MaxRDAtomic, a.MaxDestRDAtomic = 16, 16
		if err := q.Modify(a, AttrState|req); err != nil {
			t.Fatalf("%v: %v->%v: %v", q.Type(), cur, to, err)
		}
		cur = to
	}
	if got := q.Query().State; got != target {
		t.Fatalf("%v: in %v, want %v", q.Type(), got, target)
	}
}

// TestPostInEveryState: ibv_post_send is refused (EINVAL: ErrInvalidState) in RESET, INIT and
// RTR and accepted in RTS and SQD; ibv_post_recv is refused only in RESET (IBTA 10.8.2 / rxe's
// rxe_post_send "qp state < RTS", rxe_post_recv "state < INIT"). In ERR both are accepted and
// the WRs complete at once with WR_FLUSH_ERR (IBTA 10.3.1.x). SQE is not reachable through
// Modify (only a UC/UD send error enters it), so it is covered by the engine tests.
func TestPostInEveryState(t *testing.T) {
	type want struct{ send, recv bool } // accepted?
	wants := map[State]want{
		StateReset: {false, false},
		StateInit:  {false, true},
		StateRTR:   {false, true},
		StateRTS:   {true, true},
		StateSQD:   {true, true},
		StateErr:   {true, true},
	}
	for _, typ := range []Type{TypeRC, TypeUC, TypeUD} {
		for st := StateReset; st <= StateErr; st++ {
			w, ok := wants[st]
			if !ok {
				continue // SQE
			}
			n := newNet(t)
			a := n.newSide("10.0.0.1", sideOpts{qpn: 0x11, typ: typ})
			walkTo(t, a.qp, st)
			ctx := typ.String() + " in " + st.String()
			swr := SendWR{WRID: 7, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 8)}, RemoteAddr: 0x1000, RKey: 0x100, Flags: SendSignaled}
			if typ == TypeUD {
				swr = SendWR{WRID: 7, Opcode: WRSend, SGL: []SGE{a.sge(0, 8)}, Flags: SendSignaled,
					AH: &AH{AHAttr: AHAttr{DGID: netip.MustParseAddr("10.0.0.2"), Port: 1}}, RemoteQPN: 0x12, RemoteQKey: 0x11111111}
			}
			k, err := a.qp.PostSend([]SendWR{swr})
			if w.send != (err == nil) || (!w.send && (err != ErrInvalidState || k != 0)) {
				t.Fatalf("%s: PostSend = %d, %v; want accepted=%v (else ErrInvalidState)", ctx, k, err, w.send)
			}
			k, err = a.qp.PostRecv([]RecvWR{{WRID: 8, SGL: []SGE{a.sge(64, 8)}}})
			if w.recv != (err == nil) || (!w.recv && (err != ErrInvalidState || k != 0)) {
				t.Fatalf("%s: PostRecv = %d, %v; want accepted=%v (else ErrInvalidState)", ctx, k, err, w.recv)
			}
			if st == StateErr {
				op := cq.OpRDMAWrite
				if typ == TypeUD {
					op = cq.OpSend
				}
				expectWC(t, pollAll(a.scq), cq.WC{WRID: 7, Status: cq.StatusWRFlushErr, Opcode: op})
				expectWC(t, pollAll(a.rcq), cq.WC{WRID: 8, Status: cq.StatusWRFlushErr, Opcode: cq.OpRecv})
			}
		}
	}
}

// TestQPModifyRefusesNamingAttr: QP.Modify (the object, not only CheckModify) refuses a
// transition missing a required attribute with a *ModifyError naming it and leaves the QP in
// its state; an illegal transition is refused the same way.
func TestQPModifyRefusesNamingAttr(t *testing.T) {
	for _, typ := range []Type{TypeRC, TypeUC, TypeUD, TypeGSI} {
		n := newNet(t)
		qpn := uint32(0x11)
		if typ == TypeGSI {
			qpn = 1
		}
		a := n.newSide("10.0.0.1", sideOpts{qpn: qpn, typ: typ})
		steps := []struct{ from, to State }{{StateReset, StateInit}, {StateInit, StateRTR}, {StateRTR, StateRTS}}
		for _, s := range steps {
			_, req, _ := Allowed(typ, s.from, s.to)
			for bit := AttrMask(1); bit != 0 && bit <= req; bit <<= 1 {
				if req&bit == 0 {
					continue
				}
				err := a.qp.Modify(goodAttr(s.to, s.from), AttrState|req&^bit)
				wantModifyErr(t, err, bit, "requires", typ.String()+" "+s.from.String()+"->"+s.to.String())
				if got := a.qp.Query().State; got != s.from {
					t.Fatalf("%v: refused modify moved the QP to %v", typ, got)
				}
			}
			// RESET -> RTS (skipping states) is illegal.
			if s.from == StateReset {
				wantModifyErr(t, a.qp.Modify(goodAttr(StateRTS, s.from), AttrState), 0, "illegal transition", typ.String()+" RESET->RTS")
			}
			ga := goodAttr(s.to, s.from)
			ga.MaxRDAtomic, ga.MaxDestRDAtomic = 16, 16
			if err := a.qp.Modify(ga, AttrState|req); err != nil {
				t.Fatalf("%v %v->%v minimal mask: %v", typ, s.from, s.to, err)
			}
		}
	}
}
