package rdmacm

import (
	"errors"
	"testing"

	"github.com/softroce/softroce/internal/cm"
	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/roce"
)

// extQP creates a QP on d that no ID owns.
func extQP(t *testing.T, d *roce.Device, s *side) *roce.QP {
	t.Helper()
	q, err := d.CreateQP(roce.QPInit{Type: qp.TypeRC, PD: s.pd, SendCQ: s.cq, RecvCQ: s.cq,
		Cap: qp.Cap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Destroy() })
	return q
}

// moveQP moves a QP the program owns with the ID's rdma_init_qp_attr attributes.
func moveQP(t *testing.T, id *ID, q *roce.QP, s qp.State) {
	t.Helper()
	a, m, err := id.InitQPAttr(s)
	if err != nil {
		t.Fatalf("InitQPAttr(%v): %v", s, err)
	}
	if err := q.Modify(&a, m); err != nil {
		t.Fatalf("to %v: %v", s, err)
	}
}

// TestExternalQPEstablish: a connection between QPs no ID owns (ConnParam.QPNum), as
// rdma-core's test_rdmacm_async_traffic_external_qp makes it: the passive side moves its QP
// to RTS with InitQPAttr before Accept (the REP then announces the receive PSN those RTR
// attributes gave); the active side gets CONNECT_RESPONSE with the peer's parameters (not
// ESTABLISHED), the passive side nothing yet; the active program moves its QP through RTR
// and RTS and calls Establish, which sends the RTU: the passive side reports ESTABLISHED and
// data flows both ways. Establish twice, or on the passive ID, is ErrState. Before, the CM
// sent the RTU itself and reported ESTABLISHED, and the REP announced a PSN of its own.
func TestExternalQPEstablish(t *testing.T) {
	a, b, _ := pair(t, nil, nil)
	srv, cli := newSide(t, b, cm.PSTCP), newSide(t, a, cm.PSTCP)
	listen(t, srv, 4711)
	resolveTo(t, cli, 4711)
	qa := extQP(t, a, cli)
	moveQP(t, cli.id, qa, qp.StateInit)
	if err := cli.id.Establish(); !errors.Is(err, ErrState) {
		t.Fatalf("Establish before connecting: %v", err)
	}
	if err := cli.id.Connect(ConnParam{QPNum: qa.Num(), ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7}); err != nil {
		t.Fatal(err)
	}
	req := next(t, srv.ch, EventConnectRequest)
	qb := extQP(t, b, srv)
	for _, s := range []qp.State{qp.StateInit, qp.StateRTR, qp.StateRTS} {
		moveQP(t, req.ID, qb, s)
	}
	if _, err := qb.PostRecv([]qp.RecvWR{{WRID: 9, SGL: []qp.SGE{{Addr: 0x10000 + 512, Length: 64, LKey: srv.mr.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := qa.PostRecv([]qp.RecvWR{{WRID: 8, SGL: []qp.SGE{{Addr: 0x10000 + 512, Length: 64, LKey: cli.mr.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	if err := req.ID.Accept(&ConnParam{QPNum: qb.Num(), ResponderResources: 1, InitiatorDepth: 1, RNRRetryCount: 7}); err != nil {
		t.Fatal(err)
	}
	resp := next(t, cli.ch, EventConnectResponse)
	if resp.Param.QPNum != qb.Num() {
		t.Fatalf("CONNECT_RESPONSE param %+v, want QP %#x", resp.Param, qb.Num())
	}
	none(t, srv.ch)
	if qa.State() != qp.StateInit {
		t.Fatalf("the program's QP is %v before it moves it", qa.State())
	}
	moveQP(t, cli.id, qa, qp.StateRTR)
	moveQP(t, cli.id, qa, qp.StateRTS)
	if err := cli.id.Establish(); err != nil {
		t.Fatal(err)
	}
	next(t, srv.ch, EventEstablished)
	none(t, cli.ch)
	if err := cli.id.Establish(); !errors.Is(err, ErrState) {
		t.Fatalf("Establish twice: %v", err)
	}
	copy(cli.buf, "external")
	if _, err := qa.PostSend([]qp.SendWR{{WRID: 1, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
		SGL: []qp.SGE{{Addr: 0x10000, Length: 8, LKey: cli.mr.LKey()}}, RemoteAddr: 0x10000, RKey: srv.mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	if wc := cli.wc(t); wc.Status != cq.StatusSuccess || string(srv.buf[:8]) != "external" {
		t.Fatalf("write %+v, target %q", wc, srv.buf[:8])
	}
	// both directions of SEND: each side's PSNs are what the other's QP expects
	for _, d := range []struct {
		from, to *side
		q        *roce.QP
	}{{cli, srv, qa}, {srv, cli, qb}} {
		if _, err := d.q.PostSend([]qp.SendWR{{WRID: 2, Opcode: qp.WRSend, Flags: qp.SendSignaled,
			SGL: []qp.SGE{{Addr: 0x10000, Length: 8, LKey: d.from.mr.LKey()}}}}); err != nil {
			t.Fatal(err)
		}
		if wc := d.to.wc(t); wc.Status != cq.StatusSuccess || wc.Opcode != cq.OpRecv || wc.ByteLen != 8 {
			t.Fatalf("receive %+v", wc)
		}
		if wc := d.from.wc(t); wc.Status != cq.StatusSuccess || wc.Opcode != cq.OpSend {
			t.Fatalf("send %+v", wc)
		}
	}
	if err := req.ID.Establish(); !errors.Is(err, ErrState) {
		t.Fatalf("Establish on the passive ID: %v", err)
	}
	if err := cli.id.Disconnect(); err != nil {
		t.Fatal(err)
	}
	next(t, srv.ch, EventDisconnected)
	next(t, cli.ch, EventDisconnected)
}

// TestAckTimeoutOption: RDMA_OPTION_ID_ACK_TIMEOUT sets the local ACK timeout of the QP at
// RTS on both sides (the CM moving an ID's QP, and InitQPAttr for a program's own); TOS sets
// the route's traffic class, which the active QP's address vector carries. The ACK timeout
// is refused on a UD ID (as rdma_set_ack_timeout), AFONLY and REUSEADDR after binding
// (ErrState), REUSEADDR and unknown options always (ErrUnsupported).
func TestAckTimeoutOption(t *testing.T) {
	a, b, _ := pair(t, nil, nil)
	srv, cli := newSide(t, b, cm.PSTCP), newSide(t, a, cm.PSTCP)
	listen(t, srv, 4712)
	if err := cli.id.SetOption(OptionAckTimeout, 20); err != nil {
		t.Fatal(err)
	}
	if err := cli.id.SetOption(OptionTOS, 0x28); err != nil {
		t.Fatal(err)
	}
	qa := connectTo(t, cli, 4712, ConnParam{RetryCount: 7, RNRRetryCount: 7})
	if tc := cli.id.Route().TrafficClass; tc != 0x28 {
		t.Fatalf("route traffic class %#x", tc)
	}
	req := next(t, srv.ch, EventConnectRequest)
	qb := srv.createQP(t, req.ID)
	if err := req.ID.SetOption(OptionAckTimeout, 17); err != nil {
		t.Fatal(err)
	}
	if err := req.ID.Accept(nil); err != nil {
		t.Fatal(err)
	}
	next(t, cli.ch, EventEstablished)
	next(t, srv.ch, EventEstablished)
	if ta, tb := qa.Query().Timeout, qb.Query().Timeout; ta != 20 || tb != 17 {
		t.Fatalf("QP timeouts %d and %d, want 20 and 17", ta, tb)
	}
	if tc := qa.Query().AH.TrafficClass; tc != 0x28 {
		t.Fatalf("QP traffic class %#x", tc)
	}
	if ra, m, err := cli.id.InitQPAttr(qp.StateRTS); err != nil || m&qp.AttrTimeout == 0 || ra.Timeout != 20 {
		t.Fatalf("InitQPAttr(RTS): timeout %d mask %v: %v", ra.Timeout, m, err)
	}

	ud := newSide(t, a, cm.PSUDP)
	if err := ud.id.SetOption(OptionAckTimeout, 14); !errors.Is(err, ErrInvalidArg) {
		t.Fatalf("ACK timeout on a UD ID: %v", err)
	}
	if err := ud.id.SetOption(OptionReuseAddr, 1); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("REUSEADDR: %v", err)
	}
	if err := ud.id.SetOption(OptionAFOnly, 1); err != nil {
		t.Fatal(err)
	}
	if err := ud.id.SetOption(Option(9), 1); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("option 9: %v", err)
	}
	if err := srv.id.SetOption(OptionAFOnly, 1); !errors.Is(err, ErrState) {
		t.Fatalf("AFONLY on a listening ID: %v", err)
	}
}
