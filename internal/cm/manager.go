package cm

import (
	"crypto/rand"
	"encoding/binary"
	"io"
	mbits "math/bits"
	"net/netip"
	"sync"
	"time"

	"github.com/softroce/softroce/internal/qp"
)

// Locking and delivery. One mutex (Manager.mu) guards every connection. API
// calls, received MADs and timer expiries take it, change state, and append
// their effects (MADs to send, QP ToErr calls, events) to Manager.queue.
// Before returning, the caller drains the queue with the lock released, in
// order: a single drainer at a time, so effects leave in the order they were
// decided even when event handlers or Transport.SendMAD re-enter the
// Manager (their effects join the same queue).
//
// Time comes only from Options.Clock. Each connection has at most one timer
// (retransmission, MRA wait, or TIMEWAIT), re-armed with its deadline.

// Options configure a Manager.
type Options struct {
	Transport Transport   // required
	Clock     qp.Clock    // nil = qp.RealClock{}
	Rand      io.Reader   // comm IDs and starting PSNs; nil = crypto/rand
	CAGUID    uint64      // local CA (node) GUID, sent in REQ/REP and as REJ timeout ARI
	Events    func(Event) // event handler; nil drops events
	// TimeWait overrides the TIMEWAIT duration; 0 = the connection's local
	// ACK timeout, CMTimeout(LocalACKTimeout), as the Linux CM waits.
	TimeWait time.Duration
	// TIDHigh is the high half of the transaction IDs this CM originates
	// (the kernel's MAD agent hi_tid); 0 = 1.
	TIDHigh uint32
	// ManualDREP makes a received DREQ wait in DREQ_RCVD for Conn.Disconnect
	// to send the DREP; by default the DREP is sent at once.
	ManualDREP bool
	// MaxREQWait caps how long a received request waits for its consumer's answer
	// (0 = DefaultMaxREQWait); MaxPendingREQs bounds how many wait at once, the
	// oldest expiring first (0 = DefaultMaxPendingREQs). See pending.go.
	MaxREQWait     time.Duration
	MaxPendingREQs int
}

// Stats counts the Manager's traffic. Expired counts received requests given up
// unanswered (pending.go); NoListener the REQs rejected because nothing listened on
// their service ID (REJ reason 8).
type Stats struct {
	Sent, Retries, Received, Duplicates, Dropped, Malformed, SendErrors uint64
	Expired, NoListener                                                 uint64
}

// Manager is the CM of one port: it owns the communication IDs, listeners
// and connection state machines.
type Manager struct {
	mu       sync.Mutex
	o        Options
	clock    qp.Clock
	rand     io.Reader
	local    map[uint32]*Conn
	remote   map[remoteKey]*Conn
	remoteQP map[remoteKey]*Conn
	sidr     map[sidrKey]*Conn
	byQPN    map[uint32]*Conn
	listen   map[uint64]*Listener
	stats    Stats

	queue    []effect
	draining bool
	closed   bool

	// pending passive requests, oldest first (pending.go)
	pendHead, pendTail *Conn
	npend              int
}

type remoteKey struct {
	id   uint32 // remote comm ID or remote QPN
	guid uint64
}

type sidrKey struct {
	id  uint32
	gid netip.Addr
}

type effectKind uint8

const (
	effSend effectKind = iota
	effEvent
	effQPErr
)

type effect struct {
	kind effectKind
	dst  Addr
	mad  []byte
	ev   Event
	qp   QPControl
	conn *Conn // effQPErr: qp's Conn (its qpErrOnce)
}

// Listener receives CONNECT_REQUEST events for one service ID.
type Listener struct {
	m         *Manager
	serviceID uint64
	// Context is free for the owner.
	Context any
}

// ServiceID returns the service ID listened on.
func (l *Listener) ServiceID() uint64 { return l.serviceID }

// NewManager returns a Manager.
func NewManager(o Options) (*Manager, error) {
	if o.Transport == nil {
		return nil, ErrOptions
	}
	m := &Manager{o: o, clock: o.Clock, rand: o.Rand,
		local: map[uint32]*Conn{}, remote: map[remoteKey]*Conn{}, remoteQP: map[remoteKey]*Conn{},
		sidr: map[sidrKey]*Conn{}, byQPN: map[uint32]*Conn{}, listen: map[uint64]*Listener{}}
	if m.clock == nil {
		m.clock = qp.RealClock{}
	}
	if m.rand == nil {
		m.rand = rand.Reader
	}
	return m, nil
}

// Stats returns the traffic counters.
func (m *Manager) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stats
}

// Close stops every timer and forgets all connections and listeners without
// sending anything (the port is going away); later calls fail with
// ErrClosed and received MADs are ignored.
func (m *Manager) Close() {
	m.mu.Lock()
	defer m.unlock()
	m.closed = true
	for _, c := range m.local {
		m.cancel(c)
	}
	for _, c := range m.remote {
		m.cancel(c)
	}
	m.local, m.remote, m.remoteQP = map[uint32]*Conn{}, map[remoteKey]*Conn{}, map[remoteKey]*Conn{}
	m.sidr, m.byQPN, m.listen = map[sidrKey]*Conn{}, map[uint32]*Conn{}, map[uint64]*Listener{}
	for c := m.pendHead; c != nil; {
		next := c.pendNext
		c.pendPrev, c.pendNext, c.pendIn = nil, nil, false
		c = next
	}
	m.pendHead, m.pendTail, m.npend = nil, nil, 0
}

// Listen registers a listener for serviceID (e.g. ServiceID(PSTCP, port)).
// REQs and SIDR_REQs for it produce CONNECT_REQUEST events.
func (m *Manager) Listen(serviceID uint64) (*Listener, error) {
	return m.ListenContext(serviceID, nil)
}

// ListenContext is Listen with the listener's Context set before it is
// registered, so a REQ that arrives at once already sees it.
func (m *Manager) ListenContext(serviceID uint64, context any) (*Listener, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	if _, ok := m.listen[serviceID]; ok {
		return nil, ErrInUse
	}
	l := &Listener{m: m, serviceID: serviceID, Context: context}
	m.listen[serviceID] = l
	return l, nil
}

// Close stops listening; connections already requested are unaffected.
func (l *Listener) Close() {
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	if l.m.listen[l.serviceID] == l {
		delete(l.m.listen, l.serviceID)
	}
}

// unlock releases m.mu and delivers the queued effects.
func (m *Manager) unlock() {
	if m.draining {
		m.mu.Unlock()
		return
	}
	m.draining = true
	for len(m.queue) > 0 {
		e := m.queue[0]
		m.queue[0] = effect{}
		m.queue = m.queue[1:]
		m.mu.Unlock()
		var err error
		switch e.kind {
		case effSend:
			err = m.o.Transport.SendMAD(e.dst, e.mad)
		case effEvent:
			if m.o.Events != nil {
				m.o.Events(e.ev)
			}
		case effQPErr:
			e.conn.qpErrOnce.Do(e.qp.ToErr)
		}
		m.mu.Lock()
		if err != nil {
			m.stats.SendErrors++
		}
	}
	m.queue = nil
	m.draining = false
	m.mu.Unlock()
}

func (m *Manager) send(dst Addr, mad []byte) {
	m.stats.Sent++
	m.queue = append(m.queue, effect{kind: effSend, dst: dst, mad: mad})
}

func (m *Manager) event(c *Conn, ev Event) {
	if c != nil {
		if c.destroyed {
			return
		}
		ev.Conn = c
	}
	m.queue = append(m.queue, effect{kind: effEvent, ev: ev})
}

func (m *Manager) qpErr(c *Conn) {
	if c.qp != nil && !c.qpErred {
		c.qpErred = true
		m.queue = append(m.queue, effect{kind: effQPErr, qp: c.qp, conn: c})
	}
}

func (m *Manager) randUint32() uint32 {
	var b [4]byte
	if _, err := io.ReadFull(m.rand, b[:]); err != nil {
		return 0
	}
	return binary.BigEndian.Uint32(b[:])
}

// newLocalID allocates a nonzero communication ID not in use.
func (m *Manager) newLocalID() (uint32, error) {
	for i := 0; i < 64; i++ {
		id := m.randUint32()
		if id == 0 {
			continue
		}
		if _, used := m.local[id]; !used {
			return id, nil
		}
	}
	return 0, ErrNoIDs
}

func (m *Manager) newPSN() uint32 { return m.randUint32() & 0xFFFFFF }

// newTID forms a connection's transaction ID as the Linux CM does
// (cm_form_tid): the MAD agent's ID in the high 32 bits and the local comm ID
// in the low 32, byte-swapped (the kernel stores the big-endian comm ID in a
// little-endian u64). It is constant per connection: REQ and DREQ share it.
func (m *Manager) newTID(localID uint32) uint64 {
	hi := m.o.TIDHigh
	if hi == 0 {
		hi = 1
	}
	return uint64(hi)<<32 | uint64(mbits.ReverseBytes32(localID))
}

// newMAD allocates a MAD with the CM header for attr and returns it and its
// data area.
func newMAD(attr AttrID, tid uint64) (MAD, []byte) {
	b := make([]byte, MADSize)
	h := CMHeader(attr, tid)
	MAD(b).Encode(&h)
	return MAD(b), b[MADHeaderSize:]
}

func copyBytes(b []byte) []byte { return append([]byte(nil), b...) }
