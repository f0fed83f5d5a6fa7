package cm

import (
	"bytes"
	"errors"
	mbits "math/bits"
	"testing"
	"time"
)

func TestConnectEstablishDisconnect(t *testing.T) {
	p := newPair(t, Options{})
	l, err := p.b.m.Listen(svc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.b.m.Listen(svc); !errors.Is(err, ErrInUse) {
		t.Fatalf("second Listen: %v", err)
	}
	ca, err := p.a.m.Connect(p.connectOpts())
	if err != nil {
		t.Fatal(err)
	}
	wantState(t, ca, StateREQSent)
	reqs := p.a.wantSent(AttrREQ)
	msg, err := Parse(reqs[0].mad)
	if err != nil {
		t.Fatal(err)
	}
	r := msg.REQ
	if r.LocalCommID() != ca.LocalID() || r.ServiceID() != svc || r.LocalQPN() != 0x11 || r.StartingPSN() != 0x1234 ||
		r.LocalCAGUID() != guidA || r.MaxCMRetries() != 3 || r.RemoteCMResponseTimeout() != testRespTO ||
		r.PathMTU() != 3 || r.Primary().LocalGID() != gidA || r.Primary().RemoteGID() != gidB ||
		r.Primary().FlowLabel() != 0x6007c || r.Primary().LocalLID() != 0xFFFF || r.Primary().HopLimit() != 64 {
		t.Fatalf("REQ fields %+v", r.Fields())
	}
	if msg.MAD.TID() != 1<<32|uint64(mbits.ReverseBytes32(ca.LocalID())) || msg.MAD.Method() != MethodSend {
		t.Fatalf("REQ header %+v", msg.MAD.Fields())
	}
	if reqs[0].dst != (Addr{GID: gidB, QPN: GSIQPN, PKey: 0xFFFF}) {
		t.Fatalf("REQ sent to %+v", reqs[0].dst)
	}

	// Passive side: CONNECT_REQUEST with the REQ's parameters and private data.
	if err := p.b.m.HandleMAD(p.a.addr, reqs[0].mad); err != nil {
		t.Fatal(err)
	}
	ev := p.b.lastEvent()
	p.b.wantEvents(EventConnectRequest)
	cb := ev.Conn
	if ev.Listener != l || ev.Remote.QPN != 0x11 || ev.Remote.StartingPSN != 0x1234 ||
		ev.Remote.ResponderResources != 4 || ev.Remote.InitiatorDepth != 2 || ev.Remote.Path.DGID != gidA ||
		ev.Src.GID != gidA || cb.RemoteID() != ca.LocalID() || cb.Active() {
		t.Fatalf("CONNECT_REQUEST %+v", ev)
	}
	h, user, err := ParsePrivateData(ev.PrivateData)
	if err != nil || h.SrcPort() != 0xb4ca || h.Src() != gidA || string(user[:5]) != "hello" {
		t.Fatalf("private data %v %x", err, ev.PrivateData)
	}
	wantState(t, cb, StateREQRcvd)

	if err := cb.Accept(AcceptOptions{QPN: 0x22, StartingPSN: 0x5678, ResponderResources: 1, InitiatorDepth: 4,
		RNRRetryCount: 5, QP: p.b.qp, PrivateData: []byte("rep")}); err != nil {
		t.Fatal(err)
	}
	wantState(t, cb, StateREPSent)
	// rdma_accept: RTR and RTS before the REP. Linux PSN convention: the
	// passive side sends from the REQ's starting PSN.
	if !eqIDs(p.b.qp.calls, []string{"RTR", "RTS"}) {
		t.Fatalf("passive QP calls %v", p.b.qp.calls)
	}
	if p.b.qp.rtr.DestQPN != 0x11 || p.b.qp.rtr.RQPSN != 0x5678 || p.b.qp.rtr.MaxDestRDAtomic != 1 ||
		p.b.qp.rtr.PathMTU != 3 || p.b.qp.rtr.Path.DGID != gidA || p.b.qp.rtr.Path.FlowLabel != 0x6007c {
		t.Fatalf("passive RTR %+v", p.b.qp.rtr)
	}
	if p.b.qp.rts.SQPSN != 0x1234 || p.b.qp.rts.RetryCnt != 7 || p.b.qp.rts.RNRRetry != 6 ||
		p.b.qp.rts.MaxRDAtomic != 4 || p.b.qp.rts.Timeout != 11 {
		t.Fatalf("passive RTS %+v", p.b.qp.rts)
	}

	if ids := p.flow(p.b, p.a); !eqIDs(ids, []AttrID{AttrREP}) {
		t.Fatalf("passive sent %v", ids)
	}
	ev = p.a.lastEvent()
	p.a.wantEvents(EventEstablished)
	if ev.Remote.QPN != 0x22 || ev.Remote.StartingPSN != 0x5678 || string(ev.PrivateData[:3]) != "rep" {
		t.Fatalf("active ESTABLISHED %+v", ev)
	}
	if !eqIDs(p.a.qp.calls, []string{"RTR", "RTS"}) || p.a.qp.rtr.DestQPN != 0x22 || p.a.qp.rtr.RQPSN != 0x1234 ||
		p.a.qp.rts.SQPSN != 0x5678 || p.a.qp.rts.RNRRetry != 5 || p.a.qp.rts.MaxRDAtomic != 1 ||
		p.a.qp.rtr.MaxDestRDAtomic != 4 {
		t.Fatalf("active QP %v RTR %+v RTS %+v", p.a.qp.calls, p.a.qp.rtr, p.a.qp.rts)
	}
	wantState(t, ca, StateEstablished)
	if ids := p.flow(p.a, p.b); !eqIDs(ids, []AttrID{AttrRTU}) {
		t.Fatalf("active sent %v", ids)
	}
	p.b.wantEvents(EventEstablished)
	wantState(t, cb, StateEstablished)

	// No retransmission once established.
	p.clk.Advance(time.Minute)
	p.a.wantSent()
	p.b.wantSent()

	// Disconnect: DREQ, auto DREP, both TIMEWAIT, then TIMEWAIT_EXIT.
	if err := ca.Disconnect(nil); err != nil {
		t.Fatal(err)
	}
	wantState(t, ca, StateDREQSent)
	if ids := p.flow(p.a, p.b); !eqIDs(ids, []AttrID{AttrDREQ}) {
		t.Fatalf("sent %v", ids)
	}
	p.b.wantEvents(EventDisconnected)
	wantState(t, cb, StateTimewait)
	if ids := p.flow(p.b, p.a); !eqIDs(ids, []AttrID{AttrDREP}) {
		t.Fatalf("sent %v", ids)
	}
	p.a.wantEvents(EventDisconnected)
	wantState(t, ca, StateTimewait)
	// The DREQ's receiver leaves its QP alone (its consumer's Disconnect moves
	// it): an ACK already on its way still completes the last SEND.
	if !eqIDs(p.a.qp.calls, []string{"RTR", "RTS", "ERR"}) || !eqIDs(p.b.qp.calls, []string{"RTR", "RTS"}) {
		t.Fatalf("QP calls %v / %v", p.a.qp.calls, p.b.qp.calls)
	}
	if err := cb.Disconnect(nil); err != nil {
		t.Fatal(err)
	}
	p.b.wantSent()
	if !eqIDs(p.b.qp.calls, []string{"RTR", "RTS", "ERR"}) {
		t.Fatalf("passive QP calls after Disconnect %v", p.b.qp.calls)
	}
	p.clk.Advance(CMTimeout(testPath.LocalACKTimeout) - time.Nanosecond)
	wantState(t, ca, StateTimewait)
	p.clk.Advance(time.Nanosecond)
	p.a.wantEvents(EventTimewaitExit)
	p.b.wantEvents(EventTimewaitExit)
	wantState(t, ca, StateIdle)
	wantState(t, cb, StateIdle)
	if n := p.clk.Pending(); n != 0 {
		t.Fatalf("%d timers still armed", n)
	}
	if len(p.a.m.local)+len(p.a.m.remote)+len(p.a.m.remoteQP)+len(p.b.m.local)+len(p.b.m.remote)+len(p.b.m.byQPN) != 0 {
		t.Fatal("connection tables not empty after TIMEWAIT")
	}
}

func TestLostREQRetriesThenTimeout(t *testing.T) {
	p := newPair(t, Options{})
	ca, err := p.a.m.Connect(p.connectOpts())
	if err != nil {
		t.Fatal(err)
	}
	first := p.a.wantSent(AttrREQ)[0].mad
	for i := 0; i < 3; i++ { // MaxCMRetries = 3
		p.clk.Advance(reqAttempt - time.Nanosecond)
		p.a.wantSent()
		p.clk.Advance(time.Nanosecond)
		if again := p.a.wantSent(AttrREQ)[0].mad; !bytes.Equal(again, first) {
			t.Fatalf("retry %d differs", i)
		}
		p.a.wantEvents()
	}
	p.clk.Advance(reqAttempt)
	rej := p.a.wantSent(AttrREJ)[0].mad
	msg, _ := Parse(rej)
	if msg.REJ.Reason() != RejTimeout || msg.REJ.ARILength() != 8 || be.Uint64(msg.REJ.ARI()) != guidA ||
		msg.REJ.LocalCommID() != ca.LocalID() {
		t.Fatalf("REJ %+v", msg.REJ.Fields())
	}
	ev := p.a.lastEvent()
	p.a.wantEvents(EventUnreachable)
	if !errors.Is(ev.Err, ErrTimeout) || ev.Conn != ca {
		t.Fatalf("event %+v", ev)
	}
	wantState(t, ca, StateIdle)
	if !eqIDs(p.a.qp.calls, []string{"ERR"}) {
		t.Fatalf("QP calls %v", p.a.qp.calls)
	}
	if st := p.a.m.Stats(); st.Retries != 3 || st.Sent != 5 {
		t.Fatalf("stats %+v", st)
	}
	p.clk.Advance(time.Hour)
	p.a.wantSent()
}

func TestLostREPRetried(t *testing.T) {
	p := newPair(t, Options{})
	p.b.m.Listen(svc)
	ca, _ := p.a.m.Connect(p.connectOpts())
	p.flow(p.a, p.b)
	cb := p.b.lastEvent().Conn
	p.b.events()
	if err := cb.Accept(AcceptOptions{QPN: 0x22, StartingPSN: 0x5678, QP: p.b.qp}); err != nil {
		t.Fatal(err)
	}
	rep := p.b.wantSent(AttrREP)[0].mad // lost
	// Passive attempt: 2*PLT (from the REQ's ACK timeout 11 -> PLT 10) + LocalCMResponseTimeout.
	p.clk.Advance(reqAttempt)
	if again := p.b.wantSent(AttrREP)[0].mad; !bytes.Equal(again, rep) {
		t.Fatal("REP retry differs")
	}
	// The active side retried its REQ at the same moment: a duplicate for B,
	// dropped in REP_SENT.
	if ids := p.flow(p.a, p.b); !eqIDs(ids, []AttrID{AttrREQ}) {
		t.Fatalf("active sent %v", ids)
	}
	p.b.wantSent()
	p.b.wantEvents()
	if p.b.m.Stats().Duplicates != 1 {
		t.Fatalf("stats %+v", p.b.m.Stats())
	}
	if err := p.a.m.HandleMAD(p.b.addr, rep); err != nil {
		t.Fatal(err)
	}
	p.a.wantEvents(EventEstablished)
	rtu := p.a.wantSent(AttrRTU)[0].mad
	// A duplicate REP (the retry) gets the RTU again, as cm.c does.
	p.a.m.HandleMAD(p.b.addr, rep)
	if again := p.a.wantSent(AttrRTU)[0].mad; !bytes.Equal(again, rtu) {
		t.Fatal("resent RTU differs")
	}
	p.a.wantEvents()
	p.b.m.HandleMAD(p.a.addr, rtu)
	p.b.wantEvents(EventEstablished)
	p.b.m.HandleMAD(p.a.addr, rtu) // duplicate RTU: nothing
	p.b.wantEvents()
	wantState(t, ca, StateEstablished)
	wantState(t, cb, StateEstablished)
	p.clk.Advance(time.Hour)
	p.a.wantSent()
	p.b.wantSent()
}

func TestLostRTUPassiveTimesOut(t *testing.T) {
	p := newPair(t, Options{})
	p.b.m.Listen(svc)
	ca, _ := p.a.m.Connect(p.connectOpts())
	p.flow(p.a, p.b)
	cb := p.b.lastEvent().Conn
	p.b.events()
	cb.Accept(AcceptOptions{QPN: 0x22, QP: p.b.qp})
	p.flow(p.b, p.a)
	p.a.wantEvents(EventEstablished)
	p.a.wantSent(AttrRTU) // lost
	for i := 0; i < 3; i++ {
		p.clk.Advance(reqAttempt)
		p.flow(p.b, p.a)      // REP retry
		p.a.wantSent(AttrRTU) // RTU again, lost again
	}
	p.clk.Advance(reqAttempt)
	rej := p.b.wantSent(AttrREJ)
	p.b.wantEvents(EventUnreachable)
	wantState(t, cb, StateIdle)
	// The REJ(Timeout) names the passive CA in its ARI: the active side
	// finds its connection through it and leaves ESTABLISHED.
	p.a.m.HandleMAD(p.b.addr, rej[0].mad)
	ev := p.a.lastEvent()
	p.a.wantEvents(EventRejected)
	if ev.Reason != RejTimeout {
		t.Fatalf("reason %v", ev.Reason)
	}
	wantState(t, ca, StateTimewait)
	if !eqIDs(p.a.qp.calls, []string{"RTR", "RTS", "ERR"}) {
		t.Fatalf("QP calls %v", p.a.qp.calls)
	}
}

func TestLostRTUCommEstablished(t *testing.T) {
	p := newPair(t, Options{})
	p.b.m.Listen(svc)
	p.a.m.Connect(p.connectOpts())
	p.flow(p.a, p.b)
	cb := p.b.lastEvent().Conn
	p.b.events()
	cb.Accept(AcceptOptions{QPN: 0x22, QP: p.b.qp})
	p.flow(p.b, p.a)
	rtu := p.a.wantSent(AttrRTU) // lost
	// First data on the QP: the engine reports COMM_EST.
	if p.b.m.CommEstablished(0x99) {
		t.Fatal("unknown QPN matched")
	}
	if !p.b.m.CommEstablished(0x22) {
		t.Fatal("COMM_EST not matched")
	}
	p.b.wantEvents(EventEstablished)
	wantState(t, cb, StateEstablished)
	p.clk.Advance(time.Hour) // no REP retransmission
	p.b.wantSent()
	p.b.m.HandleMAD(p.a.addr, rtu[0].mad) // late RTU: ignored
	p.b.wantEvents()
	if p.b.m.CommEstablished(0x22) {
		t.Fatal("second COMM_EST acted")
	}
}

func TestRejectNoListener(t *testing.T) {
	p := newPair(t, Options{})
	ca, _ := p.a.m.Connect(p.connectOpts())
	if ids := p.flow(p.a, p.b); !eqIDs(ids, []AttrID{AttrREQ}) {
		t.Fatal(ids)
	}
	p.b.wantEvents()
	if ids := p.flow(p.b, p.a); !eqIDs(ids, []AttrID{AttrREJ}) {
		t.Fatalf("passive sent %v", ids)
	}
	ev := p.a.lastEvent()
	p.a.wantEvents(EventRejected)
	if ev.Reason != RejInvalidServiceID || ev.Reason.String() != "invalid service ID" {
		t.Fatalf("reason %v", ev.Reason)
	}
	if n := p.b.m.Stats().NoListener; n != 1 {
		t.Fatalf("NoListener %d, want 1", n)
	}
	wantState(t, ca, StateIdle)
	if !eqIDs(p.a.qp.calls, []string{"ERR"}) {
		t.Fatalf("QP calls %v", p.a.qp.calls)
	}
	p.clk.Advance(time.Hour)
	p.a.wantSent()
}

func TestRejectByConsumer(t *testing.T) {
	p := newPair(t, Options{})
	p.b.m.Listen(svc)
	ca, _ := p.a.m.Connect(p.connectOpts())
	p.flow(p.a, p.b)
	cb := p.b.lastEvent().Conn
	p.b.events()
	if err := cb.Reject(RejConsumerDefined, []byte("busy")); err != nil {
		t.Fatal(err)
	}
	if err := cb.Reject(RejConsumerDefined, nil); !errors.Is(err, ErrState) {
		t.Fatalf("second Reject: %v", err)
	}
	rej := p.b.wantSent(AttrREJ)
	msg, _ := Parse(rej[0].mad)
	// cm_format_rej in REQ_RCVD: local comm ID 0, message REJected = REQ.
	if msg.REJ.LocalCommID() != 0 || msg.REJ.RemoteCommID() != ca.LocalID() || msg.REJ.MessageRejected() != MsgREQ {
		t.Fatalf("REJ %+v", msg.REJ.Fields())
	}
	p.a.m.HandleMAD(p.b.addr, rej[0].mad)
	ev := p.a.lastEvent()
	p.a.wantEvents(EventRejected)
	if ev.Reason != RejConsumerDefined || string(ev.PrivateData[:4]) != "busy" || len(ev.PrivateData) != REJPrivateDataSize {
		t.Fatalf("event %+v", ev)
	}
	wantState(t, ca, StateIdle)
	wantState(t, cb, StateIdle)
}

func TestStaleConnection(t *testing.T) {
	p := newPair(t, Options{})
	_, cb := p.establish(t)
	// The active host restarts (same CA GUID, same QPN) and connects again
	// while B still has the old connection: REJ(stale) and the old one is
	// disconnected.
	a2 := newSide(t, p.clk, gidA, guidA, 99, Options{})
	o := p.connectOpts()
	o.QP = a2.qp
	c2, err := a2.m.Connect(o)
	if err != nil {
		t.Fatal(err)
	}
	p.flow(a2, p.b)
	sent := p.b.wantSent(AttrREJ, AttrDREQ)
	p.b.wantEvents(EventDisconnected)
	wantState(t, cb, StateDREQSent)
	a2.m.HandleMAD(p.b.addr, sent[0].mad)
	ev := a2.lastEvent()
	a2.wantEvents(EventRejected)
	if ev.Reason != RejStaleConn {
		t.Fatalf("reason %v", ev.Reason)
	}
	wantState(t, c2, StateTimewait)
}

func TestDuplicateREQInTimewaitIsStale(t *testing.T) {
	p := newPair(t, Options{})
	ca, cb := p.establish(t)
	// Replay the connection's REQ while B is in TIMEWAIT.
	ca.Disconnect(nil)
	p.flow(p.a, p.b)
	p.flow(p.b, p.a)
	p.a.events()
	p.b.events()
	wantState(t, cb, StateTimewait)
	o := p.connectOpts()
	f := REQFields{LocalCommID: ca.LocalID(), ServiceID: svc, LocalCAGUID: guidA, LocalQPN: o.QPN}
	mad, d := newMAD(AttrREQ, 7)
	REQ(d).Encode(&f)
	p.b.m.HandleMAD(p.a.addr, mad)
	sent := p.b.wantSent(AttrREJ)
	msg, _ := Parse(sent[0].mad)
	if msg.REJ.Reason() != RejStaleConn {
		t.Fatalf("reason %v", msg.REJ.Reason())
	}
	p.b.wantEvents()
}

func TestSimultaneousDREQ(t *testing.T) {
	p := newPair(t, Options{})
	ca, cb := p.establish(t)
	ca.Disconnect(nil)
	cb.Disconnect(nil)
	dreqA := p.a.wantSent(AttrDREQ)
	dreqB := p.b.wantSent(AttrDREQ)
	// The DREQs cross: each side, in DREQ_SENT, answers with a DREP.
	p.b.m.HandleMAD(p.a.addr, dreqA[0].mad)
	p.a.m.HandleMAD(p.b.addr, dreqB[0].mad)
	p.a.wantEvents(EventDisconnected)
	p.b.wantEvents(EventDisconnected)
	wantState(t, ca, StateTimewait)
	wantState(t, cb, StateTimewait)
	if ids := p.flow(p.a, p.b); !eqIDs(ids, []AttrID{AttrDREP}) {
		t.Fatal(ids)
	}
	if ids := p.flow(p.b, p.a); !eqIDs(ids, []AttrID{AttrDREP}) {
		t.Fatal(ids)
	}
	p.a.wantEvents() // DISCONNECTED only once
	p.b.wantEvents()
	p.clk.Advance(time.Second)
	p.a.wantEvents(EventTimewaitExit)
	p.b.wantEvents(EventTimewaitExit)
	p.a.wantSent()
	p.b.wantSent()
}

func TestLostDREQRetriesThenTimewait(t *testing.T) {
	p := newPair(t, Options{TimeWait: time.Second})
	ca, _ := p.establish(t)
	ca.Disconnect([]byte("bye"))
	first := p.a.wantSent(AttrDREQ)[0].mad
	msg, _ := Parse(first)
	if msg.DREQ.RemoteQPN() != 0x22 || string(msg.DREQ.PrivateData()[:3]) != "bye" {
		t.Fatalf("DREQ %+v", msg.DREQ.Fields())
	}
	for i := 0; i < 3; i++ {
		p.clk.Advance(reqAttempt)
		if again := p.a.wantSent(AttrDREQ)[0].mad; !bytes.Equal(again, first) {
			t.Fatal("DREQ retry differs")
		}
	}
	p.a.wantEvents()
	p.clk.Advance(reqAttempt)
	p.a.wantEvents(EventDisconnected)
	wantState(t, ca, StateTimewait)
	p.clk.Advance(time.Second - time.Nanosecond)
	p.a.wantEvents()
	p.clk.Advance(time.Nanosecond)
	p.a.wantEvents(EventTimewaitExit)
	// A late DREQ for the forgotten connection still gets a DREP.
	p.b.m.HandleMAD(p.a.addr, first)
	p.b.wantEvents(EventDisconnected)
	p.b.wantSent(AttrDREP)
}

func TestDuplicateDREQInTimewaitResendsDREP(t *testing.T) {
	p := newPair(t, Options{TimeWait: time.Second})
	ca, cb := p.establish(t)
	ca.Disconnect(nil)
	dreq := p.a.wantSent(AttrDREQ)[0].mad
	p.b.m.HandleMAD(p.a.addr, dreq)
	drep := p.b.wantSent(AttrDREP)[0].mad // lost
	p.b.wantEvents(EventDisconnected)
	p.clk.Advance(reqAttempt)
	p.flow(p.a, p.b) // DREQ retry
	if again := p.b.wantSent(AttrDREP)[0].mad; !bytes.Equal(again, drep) {
		t.Fatal("resent DREP differs")
	}
	p.b.wantEvents()
	wantState(t, cb, StateTimewait)
	p.a.m.HandleMAD(p.b.addr, drep)
	p.a.wantEvents(EventDisconnected)
	wantState(t, ca, StateTimewait)
}

func TestManualDREP(t *testing.T) {
	p := newPair(t, Options{ManualDREP: true})
	ca, cb := p.establish(t)
	ca.Disconnect(nil)
	p.flow(p.a, p.b)
	p.b.wantEvents(EventDisconnected)
	p.b.wantSent()
	wantState(t, cb, StateDREQRcvd)
	if err := cb.Disconnect([]byte("ok")); err != nil {
		t.Fatal(err)
	}
	wantState(t, cb, StateTimewait)
	p.flow(p.b, p.a)
	p.a.wantEvents(EventDisconnected)
}

func TestMRA(t *testing.T) {
	p := newPair(t, Options{})
	p.b.m.Listen(svc)
	ca, _ := p.a.m.Connect(p.connectOpts())
	p.flow(p.a, p.b)
	cb := p.b.lastEvent().Conn
	p.b.events()
	const svcTO = 16 // 268 ms
	if err := cb.SendMRA(svcTO, nil); err != nil {
		t.Fatal(err)
	}
	mra := p.b.wantSent(AttrMRA)[0].mad
	p.a.m.HandleMAD(p.b.addr, mra)
	wantState(t, ca, StateMRAREQRcvd)
	// The REQ's own timeout passes without a retry: the MRA extended it.
	p.clk.Advance(reqAttempt * 2)
	p.a.wantSent()
	// A duplicate REQ to B (crossing the MRA) is answered with the MRA again.
	mad, d := newMAD(AttrREQ, 1)
	f := REQFields{LocalCommID: ca.LocalID(), LocalCAGUID: guidA, ServiceID: svc, LocalQPN: 0x11}
	REQ(d).Encode(&f)
	p.b.m.HandleMAD(p.a.addr, mad)
	if again := p.b.wantSent(AttrMRA)[0].mad; !bytes.Equal(again, mra) {
		t.Fatal("resent MRA differs")
	}
	if err := cb.Accept(AcceptOptions{QPN: 0x22, QP: p.b.qp}); err != nil {
		t.Fatal(err)
	}
	p.flow(p.b, p.a)
	p.a.wantEvents(EventEstablished)
	wantState(t, ca, StateEstablished)
}

func TestMRAExpiryRetries(t *testing.T) {
	p := newPair(t, Options{})
	p.b.m.Listen(svc)
	ca, _ := p.a.m.Connect(p.connectOpts())
	p.flow(p.a, p.b)
	cb := p.b.lastEvent().Conn
	cb.SendMRA(12, nil)
	p.flow(p.b, p.a)
	// After the MRA, each attempt waits ServiceTimeout + PacketLifeTime.
	wait := CMTimeout(12) + CMTimeout(testPath.PacketLifeTime)
	p.clk.Advance(wait - time.Nanosecond)
	p.a.wantSent()
	p.clk.Advance(time.Nanosecond)
	p.a.wantSent(AttrREQ)
	wantState(t, ca, StateMRAREQRcvd)
}

func TestManualRTU(t *testing.T) {
	p := newPair(t, Options{})
	p.b.m.Listen(svc)
	o := p.connectOpts()
	o.ManualRTU = true
	ca, _ := p.a.m.Connect(o)
	p.flow(p.a, p.b)
	cb := p.b.lastEvent().Conn
	cb.Accept(AcceptOptions{QPN: 0x22, QP: p.b.qp})
	p.flow(p.b, p.a)
	ev := p.a.lastEvent()
	p.a.wantEvents(EventConnectResponse)
	if ev.Remote.QPN != 0x22 {
		t.Fatalf("remote %+v", ev.Remote)
	}
	p.a.wantSent()
	wantState(t, ca, StateREPRcvd)
	if len(p.a.qp.calls) != 0 {
		t.Fatalf("QP touched before Establish: %v", p.a.qp.calls)
	}
	if err := ca.Establish(nil); err != nil {
		t.Fatal(err)
	}
	p.flow(p.a, p.b)
	p.b.wantEvents(EventConnectRequest, EventEstablished)
	wantState(t, ca, StateEstablished)
}

func TestQPFailureOnREP(t *testing.T) {
	p := newPair(t, Options{})
	p.b.m.Listen(svc)
	ca, _ := p.a.m.Connect(p.connectOpts())
	p.a.qp.failRTR = errors.New("bad attr")
	p.flow(p.a, p.b)
	cb := p.b.lastEvent().Conn
	cb.Accept(AcceptOptions{QPN: 0x22, QP: p.b.qp})
	p.flow(p.b, p.a)
	ev := p.a.lastEvent()
	p.a.wantEvents(EventConnectError)
	if ev.Err == nil {
		t.Fatal("no error")
	}
	wantState(t, ca, StateIdle)
	// The REJ reaches B in REP_SENT.
	p.flow(p.a, p.b)
	p.b.wantEvents(EventConnectRequest, EventRejected)
	wantState(t, cb, StateIdle)
}

func TestDestroy(t *testing.T) {
	p := newPair(t, Options{})
	p.b.m.Listen(svc)
	ca, _ := p.a.m.Connect(p.connectOpts())
	p.flow(p.a, p.b)
	p.b.events()
	ca.Destroy()
	p.a.wantEvents()
	wantState(t, ca, StateIdle)
	p.flow(p.a, p.b)
	// B's request was withdrawn with REJ(Timeout).
	ev := p.b.lastEvent()
	p.b.wantEvents(EventRejected)
	if ev.Reason != RejTimeout {
		t.Fatalf("reason %v", ev.Reason)
	}

	// Destroying an established connection disconnects it silently.
	p2 := newPair(t, Options{})
	a, _ := p2.establish(t)
	a.Destroy()
	p2.flow(p2.a, p2.b)
	p2.b.wantEvents(EventDisconnected)
	p2.flow(p2.b, p2.a)
	p2.clk.Advance(time.Hour)
	p2.a.wantEvents()
	wantState(t, a, StateIdle)
}

func TestSIDR(t *testing.T) {
	p := newPair(t, Options{})
	const udSvc = 0x0000000001111c06
	p.b.m.Listen(udSvc)
	hf, _ := NewCMAHeader(gidA, gidB, 0xde6c)
	var pd [CMAHeaderSize]byte
	BuildPrivateData(pd[:], &hf, nil)
	ca, err := p.a.m.ResolveSIDR(SIDROptions{ServiceID: udSvc, Peer: p.b.addr, PrivateData: pd[:], Timeout: testRespTO, MaxCMRetries: 2})
	if err != nil {
		t.Fatal(err)
	}
	wantState(t, ca, StateSIDRREQSent)
	req := p.a.wantSent(AttrSIDRReq)[0].mad
	// Lost once: retried.
	p.clk.Advance(CMTimeout(testRespTO))
	if again := p.a.wantSent(AttrSIDRReq)[0].mad; !bytes.Equal(again, req) {
		t.Fatal("SIDR_REQ retry differs")
	}
	p.b.m.HandleMAD(p.a.addr, req)
	ev := p.b.lastEvent()
	p.b.wantEvents(EventConnectRequest)
	p.b.m.HandleMAD(p.a.addr, req) // duplicate while pending: dropped
	p.b.wantEvents()
	cb := ev.Conn
	if h, _, err := ParsePrivateData(ev.PrivateData); err != nil || h.SrcPort() != 0xde6c || ev.Remote.ServiceID != udSvc {
		t.Fatalf("SIDR request %v %+v", err, ev)
	}
	wantState(t, cb, StateSIDRREQRcvd)
	if err := cb.SIDRReply(SIDRReplyOptions{QPN: 0x21, QKey: RDMAUDPQKey}); err != nil {
		t.Fatal(err)
	}
	rep := p.b.wantSent(AttrSIDRRep)[0].mad
	msg, _ := Parse(rep)
	if msg.SIDRRep.RequestID() != ca.LocalID() || msg.SIDRRep.ServiceID() != udSvc || msg.SIDRRep.QPN() != 0x21 {
		t.Fatalf("SIDR_REP %+v", msg.SIDRRep.Fields())
	}
	p.a.m.HandleMAD(p.b.addr, rep)
	ev = p.a.lastEvent()
	p.a.wantEvents(EventEstablished)
	if ev.UD != (UDParam{QPN: 0x21, QKey: RDMAUDPQKey}) {
		t.Fatalf("UD %+v", ev.UD)
	}
	wantState(t, ca, StateIdle)
	p.clk.Advance(time.Hour)
	p.a.wantSent()
}

func TestSIDRUnsupportedAndTimeout(t *testing.T) {
	p := newPair(t, Options{})
	ca, _ := p.a.m.ResolveSIDR(SIDROptions{ServiceID: 0x0000000001110001, Peer: p.b.addr, Timeout: testRespTO, MaxCMRetries: 1})
	p.flow(p.a, p.b)
	p.flow(p.b, p.a)
	ev := p.a.lastEvent()
	p.a.wantEvents(EventUnreachable)
	if ev.SIDRStatus != SIDRUnsupported || ev.Conn != ca {
		t.Fatalf("event %+v", ev)
	}
	c2, _ := p.a.m.ResolveSIDR(SIDROptions{ServiceID: 0x0000000001110001, Peer: p.b.addr, Timeout: testRespTO, MaxCMRetries: 1})
	p.a.take()
	p.clk.Advance(CMTimeout(testRespTO))
	p.a.wantSent(AttrSIDRReq)
	p.clk.Advance(CMTimeout(testRespTO))
	ev = p.a.lastEvent()
	p.a.wantEvents(EventUnreachable)
	if !errors.Is(ev.Err, ErrTimeout) || ev.Conn != c2 {
		t.Fatalf("event %+v", ev)
	}
}

func TestHandleMADMalformed(t *testing.T) {
	p := newPair(t, Options{})
	for _, b := range [][]byte{nil, make([]byte, 255), make([]byte, 257), make([]byte, 256)} {
		var pe *ParseError
		if err := p.a.m.HandleMAD(p.b.addr, b); !errors.As(err, &pe) {
			t.Fatalf("len %d: %v", len(b), err)
		}
	}
	if p.a.m.Stats().Malformed != 4 {
		t.Fatalf("stats %+v", p.a.m.Stats())
	}
	p.a.wantSent()
}

func TestCMTimeout(t *testing.T) {
	if CMTimeout(0) != 4096*time.Nanosecond || CMTimeout(20) != 4294967296*time.Nanosecond || CMTimeout(40) != CMTimeout(31) {
		t.Fatal(CMTimeout(0), CMTimeout(20))
	}
}

// Event handlers may call back into the Manager: accepting from inside the
// CONNECT_REQUEST handler works and effects stay in order.
func TestReentrantAccept(t *testing.T) {
	p := newPair(t, Options{})
	p.b.m.o.Events = func(e Event) {
		p.b.ev = append(p.b.ev, e)
		if e.Type == EventConnectRequest {
			if err := e.Conn.Accept(AcceptOptions{QPN: 0x22, QP: p.b.qp}); err != nil {
				t.Error(err)
			}
		}
	}
	p.b.m.Listen(svc)
	p.a.m.Connect(p.connectOpts())
	p.flow(p.a, p.b)
	p.flow(p.b, p.a)
	p.a.wantEvents(EventEstablished)
	p.flow(p.a, p.b)
	p.b.wantEvents(EventConnectRequest, EventEstablished)
}
