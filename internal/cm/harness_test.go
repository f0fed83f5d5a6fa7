package cm

import (
	"errors"
	mrand "math/rand"
	"net/netip"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/qp"
)

// wire records the MADs one Manager sends; tests deliver or lose them.
type wire struct{ sent []sentMAD }

type sentMAD struct {
	dst Addr
	mad []byte
}

func (w *wire) SendMAD(dst Addr, mad []byte) error {
	w.sent = append(w.sent, sentMAD{dst, append([]byte(nil), mad...)})
	return nil
}

// fakeQP records the transitions the CM drives.
type fakeQP struct {
	calls   []string
	rtr     RTRParams
	rts     RTSParams
	failRTR error
}

func (q *fakeQP) ToRTR(p *RTRParams) error {
	q.calls = append(q.calls, "RTR")
	q.rtr = *p
	return q.failRTR
}

func (q *fakeQP) ToRTS(p *RTSParams) error {
	q.calls = append(q.calls, "RTS")
	q.rts = *p
	return nil
}

func (q *fakeQP) ToErr() { q.calls = append(q.calls, "ERR") }

type side struct {
	t    *testing.T
	m    *Manager
	w    *wire
	addr Addr
	ev   []Event
	qp   *fakeQP
}

type pair struct {
	clk  *qp.ManualClock
	a, b *side
}

var (
	gidA = netip.MustParseAddr("198.18.0.1")
	gidB = netip.MustParseAddr("198.18.0.2")
)

const (
	guidA = 0x0200_00ff_fe00_000a
	guidB = 0x0200_00ff_fe00_000b
	svc   = 0x0000000001061c06 // ServiceID(PSTCP, 7174)
)

func newSide(t *testing.T, clk qp.Clock, gid netip.Addr, guid uint64, seed int64, o Options) *side {
	s := &side{t: t, w: &wire{}, addr: Addr{GID: gid, QPN: GSIQPN, PKey: 0xFFFF}, qp: &fakeQP{}}
	o.Transport, o.Clock, o.CAGUID = s.w, clk, guid
	o.Rand = mrand.New(mrand.NewSource(seed))
	o.Events = func(e Event) { s.ev = append(s.ev, e) }
	m, err := NewManager(o)
	if err != nil {
		t.Fatal(err)
	}
	s.m = m
	return s
}

func newPair(t *testing.T, o Options) *pair {
	clk := qp.NewManualClock(time.Unix(1_700_000_000, 0))
	return &pair{clk: clk, a: newSide(t, clk, gidA, guidA, 1, o), b: newSide(t, clk, gidB, guidB, 2, o)}
}

// flow delivers everything from sent to to, returning the attribute IDs.
func (p *pair) flow(from, to *side) []AttrID {
	from.t.Helper()
	var ids []AttrID
	for len(from.w.sent) > 0 {
		s := from.w.sent[0]
		from.w.sent = from.w.sent[1:]
		if s.dst.GID != to.addr.GID {
			from.t.Fatalf("MAD to %v, expected %v", s.dst.GID, to.addr.GID)
		}
		ids = append(ids, MAD(s.mad).AttrID())
		if err := to.m.HandleMAD(from.addr, s.mad); err != nil {
			from.t.Fatalf("HandleMAD: %v", err)
		}
	}
	return ids
}

// take removes and returns what s has sent (lost, or kept to replay).
func (s *side) take() []sentMAD {
	out := s.w.sent
	s.w.sent = nil
	return out
}

func attrs(ms []sentMAD) []AttrID {
	var ids []AttrID
	for _, m := range ms {
		ids = append(ids, MAD(m.mad).AttrID())
	}
	return ids
}

// events removes and returns the event types s has seen.
func (s *side) events() []EventType {
	var out []EventType
	for _, e := range s.ev {
		out = append(out, e.Type)
	}
	s.ev = nil
	return out
}

func (s *side) lastEvent() Event {
	s.t.Helper()
	if len(s.ev) == 0 {
		s.t.Fatal("no event")
	}
	return s.ev[len(s.ev)-1]
}

func eqIDs[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func (s *side) wantSent(want ...AttrID) []sentMAD {
	s.t.Helper()
	got := s.take()
	if !eqIDs(attrs(got), want) {
		s.t.Fatalf("%v sent %v, want %v", s.addr.GID, attrs(got), want)
	}
	return got
}

func (s *side) wantEvents(want ...EventType) {
	s.t.Helper()
	if got := s.events(); !eqIDs(got, want) {
		s.t.Fatalf("%v events %v, want %v", s.addr.GID, got, want)
	}
}

func wantState(t *testing.T, c *Conn, st State) {
	t.Helper()
	if got := c.State(); got != st {
		t.Fatalf("state %v, want %v", got, st)
	}
}

// Short timeouts for tests: packet life time 4.096us*2^10 = 4.19 ms, CM
// response 4.096us*2^12 = 16.8 ms: REQ attempt = 2*4.19 + 16.8 = 25.2 ms.
var testPath = Path{SGID: gidA, DGID: gidB, PacketLifeTime: 10, LocalACKTimeout: 11, MTU: 3, FlowLabel: 0x6007c}

const (
	testRespTO = 12
	reqAttempt = 2*4096*1024*time.Nanosecond + 4096*4096*time.Nanosecond
)

// connectOpts are the active side's options: QPN 0x11, PSN 0x1234.
func (p *pair) connectOpts() ConnectOptions {
	hf, _ := NewCMAHeader(gidA, gidB, 0xb4ca)
	var pd [REQPrivateDataSize]byte
	n, _ := BuildPrivateData(pd[:], &hf, []byte("hello"))
	return ConnectOptions{ServiceID: svc, Path: testPath, QPN: 0x11, StartingPSN: 0x1234,
		ResponderResources: 4, InitiatorDepth: 2, RetryCount: 7, RNRRetryCount: 6,
		RemoteCMResponseTimeout: testRespTO, LocalCMResponseTimeout: testRespTO, MaxCMRetries: 3,
		PrivateData: pd[:n], QP: p.a.qp}
}

// establish runs REQ/REP/RTU to ESTABLISHED on both sides and returns the
// connections (active, passive).
func (p *pair) establish(t *testing.T) (*Conn, *Conn) {
	t.Helper()
	if _, err := p.b.m.Listen(svc); err != nil && !errors.Is(err, ErrInUse) {
		t.Fatal(err)
	}
	ca, err := p.a.m.Connect(p.connectOpts())
	if err != nil {
		t.Fatal(err)
	}
	p.flow(p.a, p.b)
	cb := p.b.lastEvent().Conn
	p.b.wantEvents(EventConnectRequest)
	if err := cb.Accept(AcceptOptions{QPN: 0x22, StartingPSN: 0x5678, ResponderResources: 1, InitiatorDepth: 4,
		RNRRetryCount: 5, QP: p.b.qp}); err != nil {
		t.Fatal(err)
	}
	p.flow(p.b, p.a)
	p.a.wantEvents(EventEstablished)
	p.flow(p.a, p.b)
	p.b.wantEvents(EventEstablished)
	wantState(t, ca, StateEstablished)
	wantState(t, cb, StateEstablished)
	return ca, cb
}
