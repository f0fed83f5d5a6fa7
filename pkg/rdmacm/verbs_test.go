package rdmacm

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/softroce/softroce/internal/cm"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/roce"
)

// TestVerbsEmbedded: IDOptions.Verbs with an embedded device gives an embedded ID
// (Device() set); CreateQPVerbs takes the engine's objects as interfaces and moves the QP to
// INIT as CreateQP does; QueuePair and QP return it; DestroyQP destroys it; a Verbs that is
// neither embedded nor a Remote is refused.
func TestVerbsEmbedded(t *testing.T) {
	a, _, _ := pair(t, nil, nil)
	v := a.Verbs()
	ch := NewEventChannel()
	id, err := CreateID(ch, IDOptions{Verbs: v})
	if err != nil {
		t.Fatal(err)
	}
	defer id.Destroy()
	if id.Device() != a || id.Handle() != 0 {
		t.Fatalf("Device %p (want %p), Handle %d", id.Device(), a, id.Handle())
	}
	pd, _ := v.AllocPD()
	c, _ := v.CreateCQ(8)
	q, err := id.CreateQPVerbs(pd, roce.VerbsQPInit{SendCQ: c, RecvCQ: c, Cap: qp.Cap{MaxSendWR: 2, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if q.Type() != qp.TypeRC || q.State() != qp.StateInit {
		t.Fatalf("QP %v in %v, want RC in INIT", q.Type(), q.State())
	}
	if id.QueuePair() != q || roce.QueuePair(id.QP()) != q {
		t.Fatal("QueuePair/QP do not return the QP")
	}
	if _, err := id.CreateQPVerbs(pd, roce.VerbsQPInit{SendCQ: c, RecvCQ: c}); !errors.Is(err, ErrState) {
		t.Fatalf("second QP: %v, want ErrState", err)
	}
	if err := id.DestroyQP(); err != nil {
		t.Fatal(err)
	}
	if q.State() != qp.StateErr && !errors.Is(q.Modify(&qp.Attr{State: qp.StateReset}, qp.AttrState), qp.ErrDestroyed) {
		t.Fatal("DestroyQP left the QP alive")
	}
	if id.QueuePair() != nil {
		t.Fatal("QueuePair after DestroyQP")
	}
	if _, err := CreateID(ch, IDOptions{Verbs: otherVerbs{v}}); !errors.Is(err, ErrInvalidArg) {
		t.Fatalf("CreateID on a foreign Verbs: %v, want ErrInvalidArg", err)
	}
}

type otherVerbs struct{ roce.Verbs }

// TestAttachQP: AttachQP binds a RESET QP of the caller's (the daemon's) and moves it;
// DestroyQP and Destroy leave it alive (its creator's); a QP not in RESET, or of the wrong
// type for the port space, is refused; DetachQP forgets it.
func TestAttachQP(t *testing.T) {
	a, _, _ := pair(t, nil, nil)
	s := newSide(t, a, cm.PSTCP)
	q, err := a.CreateQP(roce.QPInit{Type: qp.TypeRC, PD: s.pd, SendCQ: s.cq, RecvCQ: s.cq, Cap: qp.Cap{MaxSendWR: 2, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Destroy()
	ud, err := a.CreateQP(roce.QPInit{Type: qp.TypeUD, PD: s.pd, SendCQ: s.cq, RecvCQ: s.cq, Cap: qp.Cap{MaxSendWR: 2, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer ud.Destroy()
	if err := s.id.AttachQP(ud, s.pd); !errors.Is(err, ErrInvalidArg) {
		t.Fatalf("UD QP on a TCP ID: %v", err)
	}
	if err := s.id.AttachQP(q, s.pd); err != nil {
		t.Fatal(err)
	}
	if q.State() != qp.StateInit || s.id.QP() != q {
		t.Fatalf("attached QP in %v", q.State())
	}
	if err := s.id.DestroyQP(); err != nil {
		t.Fatal(err)
	}
	if q.State() != qp.StateInit {
		t.Fatalf("DestroyQP touched an attached QP: %v", q.State())
	}
	if err := s.id.AttachQP(q, s.pd); !errors.Is(err, ErrState) {
		t.Fatalf("QP in INIT attached: %v, want ErrState", err)
	}
	s.id.DetachQP()
	if s.id.QP() != nil {
		t.Fatal("DetachQP kept the QP")
	}
}

// fakeRemote is a Remote that records calls and lets the test deliver events.
type fakeRemote struct {
	roce.Verbs
	h      func(RemoteEvent)
	next   uint32
	calls  []string
	failOn string
}

func (f *fakeRemote) CMSetEventHandler(h func(RemoteEvent)) { f.h = h }
func (f *fakeRemote) call(name string) error {
	f.calls = append(f.calls, name)
	if name == f.failOn {
		return ErrState
	}
	return nil
}
func (f *fakeRemote) CMCreateID(cm.PortSpace) (uint32, error) {
	f.next++
	return f.next, f.call("create")
}
func (f *fakeRemote) CMBindAddr(h uint32, ap netip.AddrPort) (netip.AddrPort, error) {
	return netip.AddrPortFrom(ap.Addr(), 40000), f.call("bind")
}
func (f *fakeRemote) CMResolveAddr(h uint32, src netip.Addr, dst netip.AddrPort) (netip.AddrPort, netip.AddrPort, error) {
	return netip.MustParseAddrPort("198.18.0.1:33000"), dst, f.call("resolve")
}
func (f *fakeRemote) CMResolveRoute(h uint32) (Route, error) {
	return Route{SGIDIndex: 1, MTU: qp.MTU1024, HopLimit: 64}, f.call("route")
}
func (f *fakeRemote) CMSetQP(h uint32, q roce.QueuePair) error { return f.call("setqp") }
func (f *fakeRemote) CMListen(h uint32, b int) (netip.AddrPort, error) {
	return netip.AddrPort{}, f.call("listen")
}
func (f *fakeRemote) CMConnect(h uint32, p ConnParam) error { return f.call("connect") }
func (f *fakeRemote) CMAccept(h uint32, p *ConnParam) error { return f.call("accept") }
func (f *fakeRemote) CMReject(h uint32, pd []byte) error    { return f.call("reject") }
func (f *fakeRemote) CMDisconnect(h uint32) error           { return f.call("disconnect") }
func (f *fakeRemote) CMDestroy(h uint32) error              { return f.call("destroy") }
func (f *fakeRemote) CMEstablish(h uint32) error            { return f.call("establish") }
func (f *fakeRemote) CMSetOption(h uint32, o Option, v uint32) error {
	return f.call("option")
}
func (f *fakeRemote) CMInitQPAttr(h uint32, s qp.State) (qp.Attr, qp.AttrMask, error) {
	return qp.Attr{State: s}, qp.AttrState, f.call("initqpattr")
}

// TestRemoteDispatch: an ID on a Remote forwards every call, caches the addresses and route
// the Remote returns, turns a CONNECT_REQUEST into a new ID on the listener's channel
// (context inherited), delivers later events to that ID, drops events of destroyed or
// unknown IDs, and removes the Remote's handler when its last ID is destroyed.
func TestRemoteDispatch(t *testing.T) {
	a, _, _ := pair(t, nil, nil)
	f := &fakeRemote{Verbs: a.Verbs()}
	ch := NewEventChannel()
	l, err := CreateID(ch, IDOptions{Verbs: f, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	if l.Device() != nil || l.Handle() != 1 || f.h == nil {
		t.Fatalf("remote ID: device %v handle %d handler %v", l.Device(), l.Handle(), f.h != nil)
	}
	if err := l.BindAddr(netip.MustParseAddrPort("198.18.0.1:0")); err != nil || l.LocalAddr().Port() != 40000 {
		t.Fatalf("BindAddr: %v, local %v", err, l.LocalAddr())
	}
	if err := l.Listen(1); err != nil {
		t.Fatal(err)
	}
	if _, err := l.CreateQP(nil, roce.QPInit{}); !errors.Is(err, ErrInvalidArg) {
		t.Fatalf("CreateQP on a remote ID: %v", err)
	}
	f.h(RemoteEvent{Type: EventConnectRequest, ID: 7, Listen: 1, Param: ConnParam{PrivateData: []byte("pd")},
		Remote: netip.MustParseAddrPort("198.18.0.2:5000"), Route: Route{MTU: qp.MTU4096}})
	e := next(t, ch, EventConnectRequest)
	if e.Listen != l || e.ID == nil || e.ID.Handle() != 7 || e.ID.Context != "ctx" || string(e.Param.PrivateData) != "pd" ||
		e.ID.RemoteAddr().Port() != 5000 || e.ID.Route().MTU != qp.MTU4096 {
		t.Fatalf("CONNECT_REQUEST %+v (ID %+v)", e, e.ID)
	}
	child := e.ID
	if err := child.SetOption(OptionAckTimeout, 20); err != nil {
		t.Fatal(err)
	}
	if a, _, err := child.InitQPAttr(qp.StateRTR); err != nil || a.State != qp.StateRTR {
		t.Fatalf("InitQPAttr: %v %v", a.State, err)
	}
	if err := child.Accept(nil); err != nil {
		t.Fatal(err)
	}
	if err := child.Establish(); err != nil {
		t.Fatal(err)
	}
	f.h(RemoteEvent{Type: EventEstablished, ID: 7})
	if e := next(t, ch, EventEstablished); e.ID != child {
		t.Fatal("ESTABLISHED not on the child")
	}
	f.h(RemoteEvent{Type: EventDisconnected, ID: 99}) // unknown handle
	none(t, ch)
	f.failOn = "disconnect"
	if err := child.Disconnect(); !errors.Is(err, ErrState) {
		t.Fatalf("Disconnect error not returned: %v", err)
	}
	if err := child.Destroy(); err != nil {
		t.Fatal(err)
	}
	f.h(RemoteEvent{Type: EventDisconnected, ID: 7}) // after Destroy: no events follow
	none(t, ch)
	if err := child.Destroy(); !errors.Is(err, ErrDestroyed) {
		t.Fatalf("second Destroy: %v", err)
	}
	if err := l.Destroy(); err != nil {
		t.Fatal(err)
	}
	if f.h != nil {
		t.Fatal("the handler stayed installed after the last ID")
	}
	want := "create bind listen option initqpattr accept establish disconnect destroy destroy"
	if got := joinCalls(f.calls); got != want {
		t.Fatalf("calls %q, want %q", got, want)
	}
}

func joinCalls(c []string) string {
	s := ""
	for i, x := range c {
		if i > 0 {
			s += " "
		}
		s += x
	}
	return s
}

// TestEventChannelFunc: the push hook runs once per queued event, after it is queued.
func TestEventChannelFunc(t *testing.T) {
	var ch *EventChannel
	seen := 0
	ch = NewEventChannelFunc(func() {
		if _, ok := ch.TryGet(); ok {
			seen++
		}
	})
	ch.push(Event{Type: EventAddrResolved})
	ch.push(Event{Type: EventRouteResolved})
	if seen != 2 {
		t.Fatalf("hook saw %d queued events, want 2", seen)
	}
	ch.Close()
	ch.push(Event{Type: EventEstablished})
	if seen != 2 {
		t.Fatal("hook ran for an event pushed after Close")
	}
}
