package cm

import (
	"errors"
	"testing"
	"time"
)

// TestPendingREQExpires: a REQ nobody answers expires on the passive side once its sender must
// have given up — (MaxCMRetries+1) x (RemoteCMResponseTimeout + 2 x PacketLifeTime), IBTA
// 12.4 — with a REJ (Timeout, our CA GUID) and UNREACHABLE (ErrTimeout) to the consumer, and
// the request no longer counts as pending: a late Accept fails. The active side gives up at
// the same moment. Before, the request stayed in REQ_RCVD for good.
func TestPendingREQExpires(t *testing.T) {
	p := newPair(t, Options{})
	p.b.m.Listen(svc)
	ca, err := p.a.m.Connect(p.connectOpts()) // response timeout 12, 3 retries, packet lifetime 10
	if err != nil {
		t.Fatal(err)
	}
	p.flow(p.a, p.b)
	cb := p.b.lastEvent().Conn
	p.b.wantEvents(EventConnectRequest)
	if n := p.b.m.PendingREQs(); n != 1 {
		t.Fatalf("%d pending requests, want 1", n)
	}
	wait := 4 * reqAttempt
	p.clk.Advance(wait - time.Millisecond)
	p.a.take() // the active side's REQ retries, lost
	wantState(t, cb, StateREQRcvd)
	p.b.wantSent()
	p.clk.Advance(2 * time.Millisecond)
	rej := p.b.wantSent(AttrREJ)[0]
	msg, _ := Parse(rej.mad)
	if msg.REJ.Reason() != RejTimeout || msg.REJ.MessageRejected() != MsgREQ {
		t.Fatalf("REJ reason %v for %v, want Timeout for the REQ", msg.REJ.Reason(), msg.REJ.MessageRejected())
	}
	if e := p.b.lastEvent(); e.Type != EventUnreachable || !errors.Is(e.Err, ErrTimeout) || e.Conn != cb {
		t.Fatalf("event %v %v, want UNREACHABLE, ErrTimeout", e.Type, e.Err)
	}
	p.b.events()
	wantState(t, cb, StateIdle)
	if n, st := p.b.m.PendingREQs(), p.b.m.Stats(); n != 0 || st.Expired != 1 {
		t.Fatalf("%d pending, %d expired; want 0, 1", n, st.Expired)
	}
	if err := cb.Accept(AcceptOptions{QPN: 0x22, QP: p.b.qp}); !errors.Is(err, ErrState) {
		t.Fatalf("Accept of an expired request: %v", err)
	}
	// the sender gave up too (its REJ Timeout crosses ours)
	wantState(t, ca, StateIdle)
	p.a.wantEvents(EventUnreachable)
}

// TestPendingREQCapped: a REQ asking for the longest waits (response timeout 31: 2.4 hours,
// 15 retries) expires after Options.MaxREQWait; a SIDR_REQ, which states no timeout, too.
func TestPendingREQCapped(t *testing.T) {
	p := newPair(t, Options{MaxREQWait: time.Second})
	p.b.m.Listen(svc)
	o := p.connectOpts()
	o.RemoteCMResponseTimeout, o.MaxCMRetries = 31, 15
	if _, err := p.a.m.Connect(o); err != nil {
		t.Fatal(err)
	}
	p.flow(p.a, p.b)
	p.b.events()
	if _, err := p.a.m.ResolveSIDR(SIDROptions{ServiceID: svc, Peer: Addr{GID: gidB}}); err != nil {
		t.Fatal(err)
	}
	p.flow(p.a, p.b)
	p.b.wantEvents(EventConnectRequest)
	if n := p.b.m.PendingREQs(); n != 2 {
		t.Fatalf("%d pending, want the REQ and the SIDR_REQ", n)
	}
	p.clk.Advance(time.Second - time.Millisecond)
	if n := p.b.m.PendingREQs(); n != 2 {
		t.Fatalf("%d pending before MaxREQWait", n)
	}
	p.clk.Advance(2 * time.Millisecond)
	p.b.wantSent(AttrREJ) // the SIDR request is only forgotten
	p.b.wantEvents(EventUnreachable, EventUnreachable)
	if n := p.b.m.PendingREQs(); n != 0 {
		t.Fatalf("%d pending after MaxREQWait", n)
	}
}

// TestPendingREQLimit: at most MaxPendingREQs requests wait; a new one expires the oldest first
// (its consumer gets UNREACHABLE, its sender a REJ), so the newest requests are the ones kept.
func TestPendingREQLimit(t *testing.T) {
	p := newPair(t, Options{MaxPendingREQs: 3})
	p.b.m.Listen(svc)
	var conns []*Conn
	for i := 0; i < 5; i++ {
		o := p.connectOpts()
		o.QPN = uint32(0x11 + i)
		if _, err := p.a.m.Connect(o); err != nil {
			t.Fatal(err)
		}
		p.flow(p.a, p.b)
		conns = append(conns, p.b.lastEvent().Conn)
	}
	if got := p.b.events(); len(got) != 7 { // 5 CONNECT_REQUEST, 2 UNREACHABLE
		t.Fatalf("events %v", got)
	}
	p.b.wantSent(AttrREJ, AttrREJ)
	for i, c := range conns {
		want := StateREQRcvd
		if i < 2 {
			want = StateIdle
		}
		wantState(t, c, want)
	}
	if n := p.b.m.PendingREQs(); n != 3 {
		t.Fatalf("%d pending, want 3", n)
	}
	// answering one frees its place
	if err := conns[4].Accept(AcceptOptions{QPN: 0x22, QP: p.b.qp}); err != nil {
		t.Fatal(err)
	}
	if n := p.b.m.PendingREQs(); n != 2 {
		t.Fatalf("%d pending after an Accept, want 2", n)
	}
}

// TestPendingREQMRA: an MRA asks the sender to wait ServiceTimeout more per attempt (IBTA
// 12.6.6), and the pending request's expiry moves with it.
func TestPendingREQMRA(t *testing.T) {
	p := newPair(t, Options{})
	p.b.m.Listen(svc)
	if _, err := p.a.m.Connect(p.connectOpts()); err != nil {
		t.Fatal(err)
	}
	p.flow(p.a, p.b)
	cb := p.b.lastEvent().Conn
	p.b.events()
	const svcTO = 16 // 268 ms: (268 + 8.4) ms x 4 attempts
	if err := cb.SendMRA(svcTO, nil); err != nil {
		t.Fatal(err)
	}
	p.b.take()
	p.clk.Advance(4 * reqAttempt * 2)
	wantState(t, cb, StateMRAREQSent)
	p.clk.Advance(4 * (CMTimeout(svcTO) + 2*CMTimeout(10)))
	wantState(t, cb, StateIdle)
	p.b.wantEvents(EventUnreachable)
}
