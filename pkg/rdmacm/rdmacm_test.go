package rdmacm

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/softroce/softroce/internal/cm"
	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/link/fault"
	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/roce"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	addrA = netip.MustParseAddr("198.18.0.1")
	addrB = netip.MustParseAddr("198.18.0.2")
)

// pair opens two devices on the in-memory network sharing a manual clock
// (CM and transport timers fire only when the test advances it); the
// fault rules apply to what a and b send.
func pair(t *testing.T, sendA, sendB []fault.Rule) (*roce.Device, *roce.Device, *qp.ManualClock) {
	return pairOn(t, addrA, addrB, sendA, sendB)
}

func pairOn(t *testing.T, aa, ab netip.Addr, sendA, sendB []fault.Rule) (*roce.Device, *roce.Device, *qp.ManualClock) {
	t.Helper()
	clk := qp.NewManualClock(time.Unix(1000, 0))
	nw := mem.NewNetwork(mem.Options{})
	la, err := nw.Attach(aa)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := nw.Attach(ab)
	if err != nil {
		t.Fatal(err)
	}
	if sendA != nil {
		la = fault.Wrap(la, fault.Options{Send: fault.DirOptions{Rules: sendA}})
	}
	if sendB != nil {
		lb = fault.Wrap(lb, fault.Options{Send: fault.DirOptions{Rules: sendB}})
	}
	a, err := roce.Open(roce.Options{Link: la, Clock: clk, Name: "a", CM: roce.CMOptions{TimeWait: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := roce.Open(roce.Options{Link: lb, Clock: clk, Name: "b", CM: roce.CMOptions{TimeWait: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.Close()
		b.Close()
	})
	return a, b, clk
}

func next(t *testing.T, ch *EventChannel, want EventType) Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e, err := ch.Get(ctx)
	if err != nil {
		t.Fatalf("waiting for %v: %v", want, err)
	}
	if e.Type != want {
		t.Fatalf("event %v (status %v), want %v", e.Type, e.Status, want)
	}
	return e
}

func none(t *testing.T, ch *EventChannel) {
	t.Helper()
	if e, ok := ch.TryGet(); ok {
		t.Fatalf("unexpected event %v (status %v)", e.Type, e.Status)
	}
}

// side is one application: an ID, a PD, a CQ, a registered buffer.
type side struct {
	ch  *EventChannel
	id  *ID
	pd  *mr.PD
	cq  *cq.CQ
	buf []byte
	mr  *mr.MR
}

func newSide(t *testing.T, d *roce.Device, ps cm.PortSpace) *side {
	t.Helper()
	s := &side{ch: NewEventChannel(), buf: make([]byte, 4096)}
	var err error
	if s.id, err = CreateID(s.ch, IDOptions{Device: d, PortSpace: ps}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.id.Destroy() })
	if s.pd, err = d.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if s.cq, err = d.CreateCQ(64); err != nil {
		t.Fatal(err)
	}
	if s.mr, err = d.RegMR(s.pd, s.buf, 0x10000, mr.AccessLocalWrite|mr.AccessRemoteWrite|mr.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *side) createQP(t *testing.T, id *ID) *roce.QP {
	t.Helper()
	q, err := id.CreateQP(s.pd, roce.QPInit{SendCQ: s.cq, RecvCQ: s.cq,
		Cap: qp.Cap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func (s *side) wc(t *testing.T) cq.WC {
	t.Helper()
	wc := make([]cq.WC, 1)
	deadline := time.Now().Add(5 * time.Second)
	for s.cq.Poll(wc) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no completion")
		}
		select {
		case <-s.cq.Channel():
		case <-time.After(10 * time.Millisecond):
		}
	}
	return wc[0]
}

// resolveTo resolves the client's address and route to addrB:port.
func resolveTo(t *testing.T, c *side, port uint16) {
	t.Helper()
	if err := c.id.ResolveAddr(netip.Addr{}, netip.AddrPortFrom(addrB, port), time.Second); err != nil {
		t.Fatal(err)
	}
	next(t, c.ch, EventAddrResolved)
	if err := c.id.ResolveRoute(time.Second); err != nil {
		t.Fatal(err)
	}
	next(t, c.ch, EventRouteResolved)
}

// connectTo resolves and connects the client to addrB:port.
func connectTo(t *testing.T, c *side, port uint16, p ConnParam) *roce.QP {
	t.Helper()
	resolveTo(t, c, port)
	q := c.createQP(t, c.id)
	if err := c.id.Connect(p); err != nil {
		t.Fatal(err)
	}
	return q
}

func listen(t *testing.T, s *side, port uint16) {
	t.Helper()
	if err := s.id.BindAddr(netip.AddrPortFrom(netip.Addr{}, port)); err != nil {
		t.Fatal(err)
	}
	if err := s.id.Listen(4); err != nil {
		t.Fatal(err)
	}
}

// TestConnectAcceptData: listen / resolve / connect with private data and
// RDMA depths / CONNECT_REQUEST shows them from the passive side / accept
// with private data / ESTABLISHED on both / an RDMA WRITE and a SEND flow /
// disconnect gives DISCONNECTED on both, then TIMEWAIT_EXIT.
func TestConnectAcceptData(t *testing.T) {
	a, b, clk := pair(t, nil, nil)
	srv, cli := newSide(t, b, cm.PSTCP), newSide(t, a, cm.PSTCP)
	listen(t, srv, 7174)
	qa := connectTo(t, cli, 7174, ConnParam{PrivateData: []byte("hello"), ResponderResources: 2,
		InitiatorDepth: 3, RetryCount: 7, RNRRetryCount: 7})

	req := next(t, srv.ch, EventConnectRequest)
	if req.Listen != srv.id || req.ID == srv.id {
		t.Fatal("CONNECT_REQUEST IDs")
	}
	child := req.ID
	if !bytes.HasPrefix(req.Param.PrivateData, []byte("hello")) || len(req.Param.PrivateData) != 56 {
		t.Fatalf("private data %q (%d bytes)", req.Param.PrivateData, len(req.Param.PrivateData))
	}
	// the passive side's view: its responder resources are the initiator depth asked for
	if req.Param.ResponderResources != 3 || req.Param.InitiatorDepth != 2 || req.Param.QPNum != qa.Num() {
		t.Fatalf("param %+v", req.Param)
	}
	if got := child.RemoteAddr(); got != cli.id.LocalAddr() || child.LocalAddr() != netip.AddrPortFrom(addrB, 7174) {
		t.Fatalf("child addresses %v -> %v, client %v", got, child.LocalAddr(), cli.id.LocalAddr())
	}
	qb := srv.createQP(t, child)
	if _, err := qb.PostRecv([]qp.RecvWR{{WRID: 5, SGL: []qp.SGE{{Addr: 0x10000, Length: 64, LKey: srv.mr.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	if err := child.Accept(&ConnParam{PrivateData: []byte("welcome"), ResponderResources: 3, InitiatorDepth: 2, RNRRetryCount: 7}); err != nil {
		t.Fatal(err)
	}
	est := next(t, cli.ch, EventEstablished)
	if !bytes.HasPrefix(est.Param.PrivateData, []byte("welcome")) || est.Param.QPNum != qb.Num() {
		t.Fatalf("ESTABLISHED param %+v", est.Param)
	}
	next(t, srv.ch, EventEstablished)
	if qa.State() != qp.StateRTS || qb.State() != qp.StateRTS {
		t.Fatalf("QP states %v %v", qa.State(), qb.State())
	}
	if a1, b1 := qa.Query(), qb.Query(); a1.SQPSN != b1.RQPSN || b1.SQPSN != a1.RQPSN || a1.MaxRDAtomic != 3 || a1.MaxDestRDAtomic != 2 || b1.MaxDestRDAtomic != 3 || b1.MaxRDAtomic != 2 {
		t.Fatalf("PSNs/depths a %+v b %+v", a1, b1)
	}

	copy(cli.buf, "written by RDMA")
	if _, err := qa.PostSend([]qp.SendWR{{WRID: 1, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
		SGL: []qp.SGE{{Addr: 0x10000, Length: 15, LKey: cli.mr.LKey()}}, RemoteAddr: 0x10000 + 100, RKey: srv.mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	if wc := cli.wc(t); wc.Status != cq.StatusSuccess || wc.Opcode != cq.OpRDMAWrite {
		t.Fatalf("write %+v", wc)
	}
	if string(srv.buf[100:115]) != "written by RDMA" {
		t.Fatalf("target %q", srv.buf[100:115])
	}
	if _, err := qa.PostSend([]qp.SendWR{{WRID: 2, Opcode: qp.WRSend, Flags: qp.SendSignaled,
		SGL: []qp.SGE{{Addr: 0x10000, Length: 7, LKey: cli.mr.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	if wc := srv.wc(t); wc.Status != cq.StatusSuccess || wc.WRID != 5 || wc.ByteLen != 7 {
		t.Fatalf("recv %+v", wc)
	}
	cli.wc(t)

	if err := cli.id.Disconnect(); err != nil {
		t.Fatal(err)
	}
	next(t, srv.ch, EventDisconnected)
	next(t, cli.ch, EventDisconnected)
	// The side that received the DREQ keeps its QP until it disconnects too.
	if qa.State() != qp.StateErr || qb.State() != qp.StateRTS {
		t.Fatalf("QP states after the peer's disconnect %v %v", qa.State(), qb.State())
	}
	if err := child.Disconnect(); err != nil {
		t.Fatal(err)
	}
	if qb.State() != qp.StateErr {
		t.Fatalf("QP state after disconnect %v", qb.State())
	}
	clk.Advance(2 * time.Second)
	next(t, cli.ch, EventTimewaitExit)
	next(t, srv.ch, EventTimewaitExit)
	if err := child.Disconnect(); !errors.Is(err, ErrState) {
		t.Fatalf("disconnect after TIMEWAIT: %v", err)
	}
}

// TestAcceptDefaults: Accept(nil) answers with the request's depths capped
// by the device (librdmacm), and the active side's QP gets them.
func TestAcceptDefaults(t *testing.T) {
	a, b, _ := pair(t, nil, nil)
	srv, cli := newSide(t, b, cm.PSTCP), newSide(t, a, cm.PSTCP)
	listen(t, srv, 1)
	qa := connectTo(t, cli, 1, ConnParam{ResponderResources: 1, InitiatorDepth: MaxDepth, RetryCount: 7, RNRRetryCount: 7})
	req := next(t, srv.ch, EventConnectRequest)
	max := uint8(a.Attr().MaxQPInitRDAtom)
	if req.Param.ResponderResources != max || req.Param.InitiatorDepth != 1 {
		t.Fatalf("param %+v", req.Param)
	}
	qb := srv.createQP(t, req.ID)
	if err := req.ID.Accept(nil); err != nil {
		t.Fatal(err)
	}
	next(t, cli.ch, EventEstablished)
	next(t, srv.ch, EventEstablished)
	if qb.Query().MaxDestRDAtomic != max || qb.Query().MaxRDAtomic != 1 || qa.Query().MaxRDAtomic != max {
		t.Fatalf("depths a %+v b %+v", qa.Query(), qb.Query())
	}
}

// TestReject: Reject with private data reaches the client as REJECTED,
// reason Consumer Defined (28), with the data; the QP goes to ERR.
func TestReject(t *testing.T) {
	a, b, _ := pair(t, nil, nil)
	srv, cli := newSide(t, b, cm.PSTCP), newSide(t, a, cm.PSTCP)
	listen(t, srv, 9)
	qa := connectTo(t, cli, 9, ConnParam{RetryCount: 7})
	req := next(t, srv.ch, EventConnectRequest)
	if err := req.ID.Reject([]byte("go away")); err != nil {
		t.Fatal(err)
	}
	e := next(t, cli.ch, EventRejected)
	var rj *RejectError
	if !errors.As(e.Status, &rj) || rj.Reason != cm.RejConsumerDefined {
		t.Fatalf("status %v", e.Status)
	}
	if !bytes.HasPrefix(e.Param.PrivateData, []byte("go away")) {
		t.Fatalf("private data %q", e.Param.PrivateData)
	}
	if qa.State() != qp.StateErr {
		t.Fatalf("QP %v", qa.State())
	}
	none(t, srv.ch)
}

// TestNoListener: a REQ for a port nobody listens on is rejected by the
// CM (REJ Invalid Service ID, 8), as rdma_cm reports it.
func TestNoListener(t *testing.T) {
	a, b, _ := pair(t, nil, nil)
	_ = b
	cli := newSide(t, a, cm.PSTCP)
	connectTo(t, cli, 4242, ConnParam{})
	e := next(t, cli.ch, EventRejected)
	var rj *RejectError
	if !errors.As(e.Status, &rj) || rj.Reason != cm.RejInvalidServiceID {
		t.Fatalf("status %v", e.Status)
	}
}

// TestBacklogAndBind: a second listener on a bound port fails; the backlog holds the
// CONNECT_REQUEST events the application has not taken yet, and a request beyond it drops the
// oldest untaken one (its client is REJECTED, Consumer Defined) rather than being refused: the
// newest requests get in. A taken event frees its place.
func TestBacklogAndBind(t *testing.T) {
	a, b, _ := pair(t, nil, nil)
	srv := newSide(t, b, cm.PSTCP)
	listen(t, srv, 77)
	other := newSide(t, b, cm.PSTCP)
	if err := other.id.BindAddr(netip.AddrPortFrom(netip.Addr{}, 77)); !errors.Is(err, ErrAddrInUse) {
		t.Fatalf("second bind: %v", err)
	}
	if err := other.id.BindAddr(netip.AddrPortFrom(netip.MustParseAddr("10.9.9.9"), 78)); !errors.Is(err, ErrNoAddr) {
		t.Fatalf("foreign address: %v", err)
	}
	var clis []*side
	for i := 0; i < 5; i++ {
		c := newSide(t, a, cm.PSTCP)
		connectTo(t, c, 77, ConnParam{})
		clis = append(clis, c)
	}
	e := next(t, clis[0].ch, EventRejected)
	if e.Status.(*RejectError).Reason != cm.RejConsumerDefined {
		t.Fatalf("over backlog: %v", e.Status)
	}
	for i := 1; i < 5; i++ {
		req := next(t, srv.ch, EventConnectRequest)
		if req.ID.RemoteAddr() != clis[i].id.LocalAddr() {
			t.Fatalf("request %d from %v, want client %d (%v)", i, req.ID.RemoteAddr(), i, clis[i].id.LocalAddr())
		}
	}
	none(t, srv.ch)
	// the four taken requests no longer count: four more fit, nobody is dropped
	for i := 0; i < 4; i++ {
		c := newSide(t, a, cm.PSTCP)
		connectTo(t, c, 77, ConnParam{})
		clis = append(clis, c)
	}
	for i := 5; i < 9; i++ {
		if req := next(t, srv.ch, EventConnectRequest); req.ID.RemoteAddr() != clis[i].id.LocalAddr() {
			t.Fatalf("request from %v, want client %d", req.ID.RemoteAddr(), i)
		}
	}
	for _, c := range clis[1:] {
		none(t, c.ch)
	}
}

// TestLostREQ: every MAD from a is dropped; the CM resends the REQ at each
// timeout (2 x packet life time + remote CM response timeout) up to 15
// times, then reports UNREACHABLE (cm.ErrTimeout).
func TestLostREQ(t *testing.T) {
	a, b, clk := pair(t, []fault.Rule{{Action: fault.Drop, Match: fault.MatchQPN, QPN: 1}}, nil)
	srv, cli := newSide(t, b, cm.PSTCP), newSide(t, a, cm.PSTCP)
	listen(t, srv, 7)
	connectTo(t, cli, 7, ConnParam{})
	step := 2*cm.CMTimeout(cm.DefaultPacketLifeTime) + cm.CMTimeout(cm.DefaultCMResponseTimeout)
	for i := 0; i < cm.DefaultMaxCMRetries; i++ {
		clk.Advance(step)
		none(t, cli.ch)
	}
	if s := a.CM().Stats(); s.Retries != cm.DefaultMaxCMRetries {
		t.Fatalf("retries %d", s.Retries)
	}
	clk.Advance(step)
	e := next(t, cli.ch, EventUnreachable)
	if !errors.Is(e.Status, cm.ErrTimeout) {
		t.Fatalf("status %v", e.Status)
	}
	none(t, srv.ch)
}

// TestLostREP: the server's first REP is dropped; the REP is
// retransmitted after the passive timeout (2 x packet life time + the REQ's
// local CM response timeout) and both sides establish.
func TestLostREP(t *testing.T) {
	a, b, clk := pair(t, nil, []fault.Rule{{Action: fault.Drop, Match: fault.MatchQPN, QPN: 1, Nth: 1}})
	srv, cli := newSide(t, b, cm.PSTCP), newSide(t, a, cm.PSTCP)
	listen(t, srv, 8)
	connectTo(t, cli, 8, ConnParam{RetryCount: 7})
	req := next(t, srv.ch, EventConnectRequest)
	srv.createQP(t, req.ID)
	if err := req.ID.Accept(nil); err != nil {
		t.Fatal(err)
	}
	none(t, cli.ch)
	clk.Advance(2*cm.CMTimeout(cm.DefaultPacketLifeTime) + cm.CMTimeout(cm.DefaultCMResponseTimeout) + time.Millisecond)
	next(t, cli.ch, EventEstablished)
	next(t, srv.ch, EventEstablished)
}

// TestLostRTU: the client's RTU is dropped; the server stays unconnected
// until its REP timeout resends the REP, which the client answers with
// another RTU.
func TestLostRTU(t *testing.T) {
	a, b, clk := pair(t, []fault.Rule{{Action: fault.Drop, Match: fault.MatchQPN, QPN: 1, Nth: 2}}, nil) // REQ, RTU(lost)
	srv, cli := newSide(t, b, cm.PSTCP), newSide(t, a, cm.PSTCP)
	listen(t, srv, 8)
	connectTo(t, cli, 8, ConnParam{RetryCount: 7})
	req := next(t, srv.ch, EventConnectRequest)
	srv.createQP(t, req.ID)
	if err := req.ID.Accept(nil); err != nil {
		t.Fatal(err)
	}
	next(t, cli.ch, EventEstablished)
	none(t, srv.ch)
	clk.Advance(2*cm.CMTimeout(cm.DefaultPacketLifeTime) + cm.CMTimeout(cm.DefaultCMResponseTimeout) + time.Millisecond)
	next(t, srv.ch, EventEstablished)
	none(t, cli.ch)
}

// TestSIDR: a UD ID resolves a UD service through SIDR: the server accepts
// with its UD QP, the client learns its QPN and Q_Key (rdma_cm's
// 0x01234567) and a UD send reaches it.
func TestSIDR(t *testing.T) {
	a, b, _ := pair(t, nil, nil)
	srv, cli := newSide(t, b, cm.PSUDP), newSide(t, a, cm.PSUDP)
	listen(t, srv, 7174)
	qa := connectTo(t, cli, 7174, ConnParam{PrivateData: []byte("ud?")})
	req := next(t, srv.ch, EventConnectRequest)
	if !bytes.HasPrefix(req.Param.PrivateData, []byte("ud?")) {
		t.Fatalf("private data %q", req.Param.PrivateData)
	}
	qb := srv.createQP(t, req.ID)
	if qb.State() != qp.StateRTS || qb.Query().QKey != cm.RDMAUDPQKey {
		t.Fatalf("UD QP %v %+v", qb.State(), qb.Query())
	}
	if _, err := qb.PostRecv([]qp.RecvWR{{WRID: 3, SGL: []qp.SGE{{Addr: 0x10000, Length: 1024, LKey: srv.mr.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	if err := req.ID.Accept(nil); err != nil {
		t.Fatal(err)
	}
	e := next(t, cli.ch, EventEstablished)
	if e.UD.QPN != qb.Num() || e.UD.QKey != cm.RDMAUDPQKey || e.UD.AH == nil {
		t.Fatalf("UD %+v", e.UD)
	}
	copy(cli.buf, "datagram")
	if _, err := qa.PostSend([]qp.SendWR{{WRID: 1, Opcode: qp.WRSend, Flags: qp.SendSignaled, AH: e.UD.AH,
		RemoteQPN: e.UD.QPN, RemoteQKey: e.UD.QKey, SGL: []qp.SGE{{Addr: 0x10000, Length: 8, LKey: cli.mr.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	if wc := srv.wc(t); wc.Status != cq.StatusSuccess || wc.ByteLen != 40+8 || string(srv.buf[40:48]) != "datagram" {
		t.Fatalf("UD recv %+v %q", wc, srv.buf[40:48])
	}
}

// TestSIDRNoListener: SIDR to a port nobody serves: UNREACHABLE.
func TestSIDRNoListener(t *testing.T) {
	a, _, _ := pair(t, nil, nil)
	cli := newSide(t, a, cm.PSUDP)
	connectTo(t, cli, 5, ConnParam{})
	next(t, cli.ch, EventUnreachable)
}

// TestDestroyPending: destroying a passive ID before answering rejects the
// request (rdma_destroy_id), and the client sees REJECTED.
func TestDestroyPending(t *testing.T) {
	a, b, _ := pair(t, nil, nil)
	srv, cli := newSide(t, b, cm.PSTCP), newSide(t, a, cm.PSTCP)
	listen(t, srv, 3)
	connectTo(t, cli, 3, ConnParam{})
	req := next(t, srv.ch, EventConnectRequest)
	if err := req.ID.Destroy(); err != nil {
		t.Fatal(err)
	}
	next(t, cli.ch, EventRejected)
	if err := req.ID.Accept(nil); !errors.Is(err, ErrState) {
		t.Fatalf("accept after destroy: %v", err)
	}
}

// TestIPv6: the CMA header carries IPv6 addresses (IP version 6), the GIDs are the IPv6
// addresses themselves, and the connection carries data.
func TestIPv6(t *testing.T) {
	a6, b6 := netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
	a, b, _ := pairOn(t, a6, b6, nil, nil)
	srv, cli := newSide(t, b, cm.PSTCP), newSide(t, a, cm.PSTCP)
	listen(t, srv, 7174)
	if err := cli.id.ResolveAddr(netip.Addr{}, netip.AddrPortFrom(b6, 7174), time.Second); err != nil {
		t.Fatal(err)
	}
	next(t, cli.ch, EventAddrResolved)
	if cli.id.LocalAddr().Addr() != a6 {
		t.Fatalf("source %v", cli.id.LocalAddr())
	}
	if err := cli.id.ResolveRoute(time.Second); err != nil {
		t.Fatal(err)
	}
	next(t, cli.ch, EventRouteResolved)
	qa := cli.createQP(t, cli.id)
	if err := cli.id.Connect(ConnParam{RetryCount: 7, RNRRetryCount: 7}); err != nil {
		t.Fatal(err)
	}
	req := next(t, srv.ch, EventConnectRequest)
	if req.ID.RemoteAddr() != cli.id.LocalAddr() || req.ID.LocalAddr().Addr() != b6 {
		t.Fatalf("child %v <- %v", req.ID.LocalAddr(), req.ID.RemoteAddr())
	}
	qb := srv.createQP(t, req.ID)
	if _, err := qb.PostRecv([]qp.RecvWR{{WRID: 1, SGL: []qp.SGE{{Addr: 0x10000, Length: 64, LKey: srv.mr.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	if err := req.ID.Accept(nil); err != nil {
		t.Fatal(err)
	}
	next(t, cli.ch, EventEstablished)
	next(t, srv.ch, EventEstablished)
	copy(cli.buf, "six")
	if _, err := qa.PostSend([]qp.SendWR{{WRID: 2, Opcode: qp.WRSend, SGL: []qp.SGE{{Addr: 0x10000, Length: 3, LKey: cli.mr.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	if wc := srv.wc(t); wc.Status != cq.StatusSuccess || string(srv.buf[:3]) != "six" {
		t.Fatalf("recv %+v %q", wc, srv.buf[:3])
	}
}

// TestDestroyConnected: destroying a connected ID disconnects (DREQ): the peer sees
// DISCONNECTED; the destroyed ID reports nothing more. A closed channel fails Get.
func TestDestroyConnected(t *testing.T) {
	a, b, _ := pair(t, nil, nil)
	srv, cli := newSide(t, b, cm.PSTCP), newSide(t, a, cm.PSTCP)
	listen(t, srv, 11)
	connectTo(t, cli, 11, ConnParam{})
	req := next(t, srv.ch, EventConnectRequest)
	srv.createQP(t, req.ID)
	if err := req.ID.Accept(nil); err != nil {
		t.Fatal(err)
	}
	next(t, cli.ch, EventEstablished)
	next(t, srv.ch, EventEstablished)
	if err := cli.id.Destroy(); err != nil {
		t.Fatal(err)
	}
	next(t, srv.ch, EventDisconnected)
	none(t, cli.ch)
	if err := cli.id.Destroy(); !errors.Is(err, ErrDestroyed) {
		t.Fatalf("second destroy: %v", err)
	}
	cli.ch.Close()
	if _, err := cli.ch.Get(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("closed channel: %v", err)
	}
}
