// Long file: the communication ID's state machine of IBTA 12.9 (REQ/REP/RTU, MRA, REJ,
// DREQ/DREP, TIMEWAIT, SIDR) with its timers, so the transitions read as one state table.

package cm

import (
	"sync"
	"time"

	"github.com/softroce/softroce/internal/qp"
)

// Conn is one communication ID (an ib_cm_id): an RC/UC connection, either
// side, or a SIDR exchange.
type Conn struct {
	m        *Manager
	state    State
	active   bool
	ud       bool // SIDR
	localID  uint32
	remoteID uint32
	tid      uint64
	service  uint64
	peer     Addr
	path     Path
	typ      TransportType

	localQPN, remoteQPN uint32
	remoteGUID          uint64
	sqPSN, rqPSN        uint32
	respRes, initDepth  uint8 // ours: responder resources (incoming), initiator depth (outgoing)
	retryCount, rnrOut  uint8 // transport retries; RNR retries we use when sending
	maxCMRetries        uint8
	respTimeout         time.Duration // per-attempt wait for a response
	manualRTU           bool
	// srOffer: selective repeat was offered (active: by us, passive: by the REQ); sr: both
	// sides asked, so the QP gets it at RTR (ext.go)
	srOffer, sr bool
	qp          QPControl
	qpErred     bool      // ToErr is queued or done
	qpErrOnce   sync.Once // runs ToErr: the queued effect or Disconnect, whichever is first
	inserted    bool      // in m.remote / m.remoteQP

	// Retransmission and the single timer.
	pending     []byte // the MAD being retransmitted
	retriesLeft int
	timeout     time.Duration // per-attempt timeout of pending
	tmr         qp.Timer
	armed       bool
	deadline    time.Time

	lastResp         []byte // MRA / RTU / DREP kept for duplicates
	req              ConnParam
	disconnectedSent bool
	destroyed        bool

	// a received request waiting for its consumer (pending.go)
	pendIn             bool
	pendPrev, pendNext *Conn

	// Context is free for the owner.
	Context any
}

// State returns the connection's CM state.
func (c *Conn) State() State {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.state
}

// LocalID returns the local communication ID (the SIDR request ID for UD).
func (c *Conn) LocalID() uint32 { return c.localID }

// RemoteID returns the remote communication ID (0 until known).
func (c *Conn) RemoteID() uint32 {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.remoteID
}

// Active reports whether this side sent the REQ (or SIDR_REQ).
func (c *Conn) Active() bool { return c.active }

// Peer returns the remote CM address.
func (c *Conn) Peer() Addr { return c.peer }

// ServiceID returns the service ID of the connection.
func (c *Conn) ServiceID() uint64 { return c.service }

// arm (re)starts the connection's timer.
func (m *Manager) arm(c *Conn, d time.Duration) {
	c.armed = true
	c.deadline = m.clock.Now().Add(d)
	if c.tmr == nil {
		c.tmr = m.clock.AfterFunc(d, func() { m.fire(c) })
		return
	}
	c.tmr.Stop()
	c.tmr.Reset(d)
}

func (m *Manager) cancel(c *Conn) {
	c.pending = nil
	if c.armed {
		c.armed = false
		c.tmr.Stop()
	}
}

// sendRetried sends mad and arms retransmission: up to retries resends, each
// after timeout without a response.
func (m *Manager) sendRetried(c *Conn, mad []byte, timeout time.Duration, retries int) {
	c.pending, c.timeout, c.retriesLeft = mad, timeout, retries
	m.send(c.peer, mad)
	m.arm(c, timeout)
}

func (m *Manager) fire(c *Conn) {
	m.mu.Lock()
	if !c.armed {
		m.mu.Unlock()
		return
	}
	if now := m.clock.Now(); now.Before(c.deadline) {
		// A stale expiry of a timer re-armed since: wait for the rest.
		c.tmr.Reset(c.deadline.Sub(now))
		m.mu.Unlock()
		return
	}
	c.armed = false
	m.expire(c)
	m.unlock()
}

// expire handles a timer expiry (IBTA 12.9: CM response timeout; TIMEWAIT; a received
// request unanswered, pending.go).
func (m *Manager) expire(c *Conn) {
	switch c.state {
	case StateREQRcvd, StateMRAREQSent, StateSIDRREQRcvd:
		if c.pendIn {
			m.expireREQ(c)
		}
		return
	case StateTimewait:
		m.toIdle(c)
		m.event(c, Event{Type: EventTimewaitExit})
		return
	case StateREQSent, StateMRAREQRcvd, StateREPSent, StateMRAREPRcvd, StateDREQSent, StateSIDRREQSent:
	default:
		return
	}
	if c.pending != nil && c.retriesLeft > 0 {
		c.retriesLeft--
		m.stats.Retries++
		m.send(c.peer, c.pending)
		m.arm(c, c.timeout)
		return
	}
	c.pending = nil
	switch c.state {
	case StateREQSent, StateMRAREQRcvd, StateREPSent, StateMRAREPRcvd:
		// IBTA 12.9 / cm.c: give up, tell the peer with REJ(Timeout)
		// whose ARI is our CA GUID, and report UNREACHABLE.
		var ari [8]byte
		be.PutUint64(ari[:], m.o.CAGUID)
		m.sendREJ(c, RejTimeout, ari[:], nil)
		m.qpErr(c)
		m.toIdle(c)
		m.event(c, Event{Type: EventUnreachable, Err: ErrTimeout})
	case StateDREQSent:
		m.enterTimewait(c)
		m.disconnected(c, nil)
	case StateSIDRREQSent:
		m.toIdle(c)
		m.event(c, Event{Type: EventUnreachable, Err: ErrTimeout})
	}
}

// toIdle forgets the connection.
func (m *Manager) toIdle(c *Conn) {
	m.cancel(c)
	m.unpend(c)
	c.state = StateIdle
	if m.local[c.localID] == c {
		delete(m.local, c.localID)
	}
	if c.inserted {
		if m.remote[remoteKey{c.remoteID, c.remoteGUID}] == c {
			delete(m.remote, remoteKey{c.remoteID, c.remoteGUID})
		}
		if m.remoteQP[remoteKey{c.remoteQPN, c.remoteGUID}] == c {
			delete(m.remoteQP, remoteKey{c.remoteQPN, c.remoteGUID})
		}
		c.inserted = false
	}
	if !c.ud && m.byQPN[c.localQPN] == c {
		delete(m.byQPN, c.localQPN)
	}
	if c.ud {
		if k := (sidrKey{c.remoteID, c.peer.GID}); m.sidr[k] == c {
			delete(m.sidr, k)
		}
	}
}

// enterTimewait moves to TIMEWAIT (IBTA 12.9 state diagrams): the remote IDs stay
// registered, so a REQ from the same remote QP is rejected as stale, until
// the timer ends it.
func (m *Manager) enterTimewait(c *Conn) {
	m.cancel(c)
	m.unpend(c)
	c.state = StateTimewait
	d := m.o.TimeWait
	if d == 0 {
		d = CMTimeout(c.path.LocalACKTimeout)
	}
	m.arm(c, d)
}

func (m *Manager) disconnected(c *Conn, pd []byte) {
	if c.disconnectedSent {
		return
	}
	c.disconnectedSent = true
	m.event(c, Event{Type: EventDisconnected, PrivateData: pd})
}

// insertRemote registers the remote IDs (duplicate and stale detection).
func (m *Manager) insertRemote(c *Conn) {
	m.remote[remoteKey{c.remoteID, c.remoteGUID}] = c
	m.remoteQP[remoteKey{c.remoteQPN, c.remoteGUID}] = c
	c.inserted = true
}

// ConnectOptions are the parameters of an active connection request
// (ib_cm_req_param / rdma_conn_param).
type ConnectOptions struct {
	ServiceID          uint64
	Peer               Addr // Peer.QPN 0 = GSIQPN; Peer.PKey 0 = Path.PKey; Peer.GID zero = Path.DGID
	Path               Path
	QPN                uint32 // the local QP to connect
	Transport          TransportType
	StartingPSN        uint32 // PSN our receive queue expects; 0 = random
	ResponderResources uint8
	InitiatorDepth     uint8
	RetryCount         uint8 // transport retries (3 bits)
	RNRRetryCount      uint8 // RNR retries the peer uses toward us (3 bits)
	FlowControl        bool
	SRQ                bool
	// CM timeouts (codes) and retries; 0 = DefaultCMResponseTimeout / DefaultMaxCMRetries.
	RemoteCMResponseTimeout uint8
	LocalCMResponseTimeout  uint8
	MaxCMRetries            uint8
	PrivateData             []byte    // up to REQPrivateDataSize (rdma_cm: CMA header + user data)
	QP                      QPControl // moved to RTR/RTS when the REP arrives; nil = none
	// ManualRTU reports CONNECT_RESPONSE on the REP and waits for
	// Conn.Establish (rdma_cm with a user-managed QP); otherwise the QP goes
	// to RTR and RTS, the RTU is sent and ESTABLISHED is reported.
	ManualRTU bool
	// SelectiveRepeat offers selective repeat in the REQ (softroce's extension, ext.go; RC
	// only): the QP gets it at RTR if the REP accepts, which only a softroce peer asking for it
	// does.
	SelectiveRepeat bool
	Context         any
}

// Connect sends a REQ (IBTA 12.6.5) and returns the connection in REQ_SENT.
// The REQ is retransmitted every 2*PacketLifeTime + RemoteCMResponseTimeout
// up to MaxCMRetries times; then a REJ(Timeout) is sent and UNREACHABLE
// reported.
func (m *Manager) Connect(o ConnectOptions) (*Conn, error) {
	if len(o.PrivateData) > REQPrivateDataSize {
		return nil, ErrTooLong
	}
	if o.Transport != TransportRC && o.Transport != TransportUC {
		return nil, ErrOptions
	}
	if !o.Peer.GID.IsValid() && !o.Path.DGID.IsValid() {
		return nil, ErrOptions
	}
	m.mu.Lock()
	defer m.unlock()
	if m.closed {
		return nil, ErrClosed
	}
	id, err := m.newLocalID()
	if err != nil {
		return nil, err
	}
	p := o.Path.withDefaults()
	c := &Conn{m: m, state: StateREQSent, active: true, localID: id, service: o.ServiceID, path: p,
		typ: o.Transport, localQPN: o.QPN & 0xFFFFFF, rqPSN: o.StartingPSN & 0xFFFFFF,
		respRes: o.ResponderResources, initDepth: o.InitiatorDepth, retryCount: o.RetryCount & 7,
		qp: o.QP, manualRTU: o.ManualRTU, srOffer: o.SelectiveRepeat && o.Transport == TransportRC,
		Context: o.Context}
	if c.rqPSN == 0 {
		c.rqPSN = m.newPSN()
	}
	c.peer = o.Peer
	if c.peer.QPN == 0 {
		c.peer.QPN = GSIQPN
	}
	if c.peer.PKey == 0 {
		c.peer.PKey = p.PKey
	}
	if !c.peer.GID.IsValid() {
		c.peer.GID = p.DGID
	}
	remoteTO, localTO := o.RemoteCMResponseTimeout, o.LocalCMResponseTimeout
	if remoteTO == 0 {
		remoteTO = DefaultCMResponseTimeout
	}
	if localTO == 0 {
		localTO = DefaultCMResponseTimeout
	}
	c.maxCMRetries = o.MaxCMRetries
	if c.maxCMRetries == 0 {
		c.maxCMRetries = DefaultMaxCMRetries
	}
	c.maxCMRetries &= 0xF
	c.respTimeout = 2*CMTimeout(p.PacketLifeTime) + CMTimeout(remoteTO)
	c.tid = m.newTID(id)

	mad, d := newMAD(AttrREQ, c.tid)
	f := REQFields{
		LocalCommID: id, ServiceID: o.ServiceID, LocalCAGUID: m.o.CAGUID, LocalQPN: c.localQPN,
		ResponderResources: o.ResponderResources, InitiatorDepth: o.InitiatorDepth,
		RemoteCMResponseTimeout: remoteTO, TransportServiceType: o.Transport, EndToEndFlowControl: o.FlowControl,
		StartingPSN: c.rqPSN, LocalCMResponseTimeout: localTO, RetryCount: o.RetryCount & 7, PKey: p.PKey,
		PathMTU: p.MTU, RNRRetryCount: o.RNRRetryCount & 7, MaxCMRetries: c.maxCMRetries, SRQ: o.SRQ,
		Primary: PathFields{LocalLID: p.SLID, RemoteLID: p.DLID, LocalGID: AddrGID(p.SGID),
			RemoteGID: AddrGID(p.DGID), FlowLabel: p.FlowLabel, PacketRate: p.PacketRate,
			TrafficClass: p.TrafficClass, HopLimit: p.HopLimit, SL: p.SL, SubnetLocal: p.SubnetLocal,
			LocalACKTimeout: p.LocalACKTimeout},
	}
	if c.srOffer {
		f.Resv24 = ExtOffer(ExtSelectiveRepeat) // reserved in IBTA 12.6.5 (ext.go)
	}
	copy(f.PrivateData[:], o.PrivateData)
	REQ(d).Encode(&f)
	m.local[id] = c
	if c.localQPN != 0 {
		m.byQPN[c.localQPN] = c
	}
	m.sendRetried(c, mad, c.respTimeout, int(c.maxCMRetries))
	return c, nil
}

// AcceptOptions are the passive side's answer to a REQ (ib_cm_rep_param).
type AcceptOptions struct {
	QPN                uint32
	StartingPSN        uint32 // PSN our receive queue expects; 0 = random
	ResponderResources uint8
	InitiatorDepth     uint8
	RNRRetryCount      uint8 // RNR retries the peer uses toward us
	FailoverAccepted   uint8
	TargetACKDelay     uint8
	FlowControl        bool
	SRQ                bool
	QKey               uint32
	PrivateData        []byte    // up to REPPrivateDataSize
	QP                 QPControl // moved to RTR and RTS before the REP is sent; nil = none
	// SelectiveRepeat accepts selective repeat if the REQ offered it (softroce's extension,
	// ext.go): then the QP gets it at RTR and the REP says so; otherwise it changes nothing.
	SelectiveRepeat bool
}

// Accept answers a CONNECT_REQUEST with a REP (IBTA 12.6.8), after moving
// the QP to RTR and RTS as rdma_accept does. The REP is retransmitted until
// the RTU (or first data, NotifyEstablished) arrives.
func (c *Conn) Accept(o AcceptOptions) error {
	if len(o.PrivateData) > REPPrivateDataSize {
		return ErrTooLong
	}
	m := c.m
	m.mu.Lock()
	defer m.unlock()
	if c.state != StateREQRcvd && c.state != StateMRAREQSent || c.ud {
		return ErrState
	}
	c.localQPN, c.qp = o.QPN&0xFFFFFF, o.QP
	c.rqPSN = o.StartingPSN & 0xFFFFFF
	if c.rqPSN == 0 {
		c.rqPSN = m.newPSN()
	}
	c.respRes, c.initDepth = o.ResponderResources, o.InitiatorDepth
	c.sr = c.srOffer && o.SelectiveRepeat
	if err := m.qpUp(c); err != nil {
		m.sendREJ(c, RejConsumerDefined, nil, nil)
		m.qpErr(c)
		m.toIdle(c)
		return err
	}
	mad, d := newMAD(AttrREP, c.tid)
	f := REPFields{LocalCommID: c.localID, RemoteCommID: c.remoteID, LocalQKey: o.QKey, LocalQPN: c.localQPN,
		StartingPSN: c.rqPSN, ResponderResources: o.ResponderResources, InitiatorDepth: o.InitiatorDepth,
		TargetACKDelay: o.TargetACKDelay, FailoverAccepted: o.FailoverAccepted, EndToEndFlowControl: o.FlowControl,
		RNRRetryCount: o.RNRRetryCount & 7, SRQ: o.SRQ, LocalCAGUID: m.o.CAGUID}
	if c.sr {
		f.Resv4 = ExtSelectiveRepeat // reserved in IBTA 12.6.8 (ext.go)
	}
	copy(f.PrivateData[:], o.PrivateData)
	REP(d).Encode(&f)
	if c.localQPN != 0 {
		m.byQPN[c.localQPN] = c
	}
	m.unpend(c) // answered: no longer a pending request
	c.state = StateREPSent
	m.sendRetried(c, mad, c.respTimeout, int(c.maxCMRetries))
	return nil
}

// qpUp performs the RTR and RTS transitions with the negotiated attributes.
func (m *Manager) qpUp(c *Conn) error {
	if c.qp == nil {
		return nil
	}
	rtr, rts := c.qpParams()
	if err := c.qp.ToRTR(&rtr); err != nil {
		return err
	}
	return c.qp.ToRTS(&rts)
}

// qpParams are the negotiated attributes of the RTR and RTS transitions (m.mu held).
func (c *Conn) qpParams() (RTRParams, RTSParams) {
	return RTRParams{DestQPN: c.remoteQPN, RQPSN: c.rqPSN, PathMTU: c.path.MTU, MaxDestRDAtomic: c.respRes, Path: c.path,
			SelectiveRepeat: c.sr},
		RTSParams{SQPSN: c.sqPSN, Timeout: c.path.LocalACKTimeout, RetryCnt: c.retryCount, RNRRetry: c.rnrOut,
			MaxRDAtomic: c.initDepth}
}

// QPParams returns the negotiated attributes the RTR and RTS transitions take
// (ib_cm_init_qp_attr), for a QP its consumer moves itself (rdma_init_qp_attr).
// They are complete once the peer's REQ (passive side) or REP (active side) arrived.
func (c *Conn) QPParams() (RTRParams, RTSParams) {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.qpParams()
}

// SelectiveRepeat reports whether the connection uses selective repeat: both sides asked
// (softroce's extension, ext.go). Known on the active side when the REP arrived, on the
// passive side at Accept; PeerOffersSelectiveRepeat tells the passive side before.
func (c *Conn) SelectiveRepeat() bool {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.sr
}

// PeerOffersSelectiveRepeat reports, on the passive side, whether the REQ offered selective
// repeat (on the active side: whether we offered it).
func (c *Conn) PeerOffersSelectiveRepeat() bool { return c.srOffer }

// Transport returns the connection's transport (RC or UC).
func (c *Conn) Transport() TransportType { return c.typ }

// Reject answers a REQ (or, with ManualRTU, a REP) with a REJ (IBTA 12.6.7).
func (c *Conn) Reject(reason RejectReason, privateData []byte) error {
	if len(privateData) > REJPrivateDataSize {
		return ErrTooLong
	}
	m := c.m
	m.mu.Lock()
	defer m.unlock()
	switch c.state {
	case StateREQRcvd, StateMRAREQSent, StateREPRcvd, StateMRAREPSent:
	default:
		return ErrState
	}
	m.sendREJ(c, reason, nil, privateData)
	m.qpErr(c)
	m.toIdle(c)
	return nil
}

// SendMRA acknowledges a REQ (passive, REQ_RCVD) or a REP (active with
// ManualRTU, REP_RCVD) and asks the peer to wait CMTimeout(serviceTimeout)
// more (IBTA 12.6.6). Duplicates of the acknowledged message get the MRA again.
func (c *Conn) SendMRA(serviceTimeout uint8, privateData []byte) error {
	if len(privateData) > MRAPrivateDataSize {
		return ErrTooLong
	}
	m := c.m
	m.mu.Lock()
	defer m.unlock()
	var which MsgType
	switch c.state {
	case StateREQRcvd:
		which, c.state = MsgREQ, StateMRAREQSent
		// the active side now waits ServiceTimeout + 2 x PacketLifeTime per attempt (IBTA
		// 12.6.6): the pending request expires accordingly (pending.go)
		if c.pendIn {
			if d := m.reqWait(serviceTimeout&31, c.maxCMRetries, c.path.PacketLifeTime); !c.armed || m.clock.Now().Add(d).After(c.deadline) {
				m.arm(c, d)
			}
		}
	case StateREPRcvd:
		which, c.state = MsgREP, StateMRAREPSent
	default:
		return ErrState
	}
	mad, d := newMAD(AttrMRA, c.tid)
	f := MRAFields{LocalCommID: c.localID, RemoteCommID: c.remoteID, MessageMRAed: which, ServiceTimeout: serviceTimeout & 31}
	copy(f.PrivateData[:], privateData)
	MRA(d).Encode(&f)
	c.lastResp = mad
	m.send(c.peer, mad)
	return nil
}

// Establish completes a ManualRTU connection after CONNECT_RESPONSE: the
// QP goes to RTR and RTS and the RTU is sent (ib_send_cm_rtu).
func (c *Conn) Establish(privateData []byte) error {
	if len(privateData) > RTUPrivateDataSize {
		return ErrTooLong
	}
	m := c.m
	m.mu.Lock()
	defer m.unlock()
	if c.state != StateREPRcvd && c.state != StateMRAREPSent {
		return ErrState
	}
	return m.establishActive(c, privateData)
}

func (m *Manager) establishActive(c *Conn, privateData []byte) error {
	if err := m.qpUp(c); err != nil {
		m.sendREJ(c, RejConsumerDefined, nil, nil)
		m.qpErr(c)
		m.toIdle(c)
		m.event(c, Event{Type: EventConnectError, Err: err})
		return err
	}
	mad, d := newMAD(AttrRTU, c.tid)
	f := RTUFields{LocalCommID: c.localID, RemoteCommID: c.remoteID}
	copy(f.PrivateData[:], privateData)
	RTU(d).Encode(&f)
	c.lastResp = mad
	c.state = StateEstablished
	m.send(c.peer, mad)
	return nil
}

// NotifyEstablished tells the CM that the QP received a packet before the
// RTU arrived (IB_EVENT_COMM_EST, ib_cm_notify): a passive side in REP_SENT
// becomes ESTABLISHED without the RTU (IBTA 12.9, COMM_EST).
func (c *Conn) NotifyEstablished() {
	m := c.m
	m.mu.Lock()
	defer m.unlock()
	m.commEst(c)
}

// CommEstablished is NotifyEstablished by local QP number, for the engine's
// COMM_EST event (event.CommEst). It reports whether a connection matched.
func (m *Manager) CommEstablished(localQPN uint32) bool {
	m.mu.Lock()
	defer m.unlock()
	c := m.byQPN[localQPN&0xFFFFFF]
	if c == nil {
		return false
	}
	return m.commEst(c)
}

func (m *Manager) commEst(c *Conn) bool {
	if c.state != StateREPSent && c.state != StateMRAREPRcvd {
		return false
	}
	m.cancel(c)
	c.state = StateEstablished
	m.event(c, Event{Type: EventEstablished})
	return true
}

// Disconnect releases an established connection with a DREQ (IBTA 12.6.10),
// moving the QP to ERR; in DREQ_RCVD (ManualDREP) it moves the QP and sends
// the DREP. After the peer's DREQ was answered (TIMEWAIT) it only moves the
// QP, as rdma_disconnect does on the side that received the DREQ.
func (c *Conn) Disconnect(privateData []byte) error {
	if len(privateData) > DREQPrivateDataSize {
		return ErrTooLong
	}
	m := c.m
	m.mu.Lock()
	err := m.disconnect(c, privateData)
	q, erred := c.qp, c.qpErred
	m.unlock()
	if q != nil && erred {
		// The queued ToErr runs on whichever goroutine drains the effects, maybe after
		// unlock returned here: the QP is in ERR when Disconnect returns (rdma_disconnect).
		c.qpErrOnce.Do(q.ToErr)
	}
	return err
}

func (m *Manager) disconnect(c *Conn, privateData []byte) error {
	switch c.state {
	case StateEstablished:
		m.sendDREQ(c, privateData)
		return nil
	case StateDREQRcvd:
		m.qpErr(c)
		m.sendDREP(c, privateData)
		m.enterTimewait(c)
		return nil
	case StateTimewait:
		m.qpErr(c)
		return nil
	}
	return ErrState
}

func (m *Manager) sendDREQ(c *Conn, privateData []byte) {
	m.qpErr(c)
	c.tid = m.newTID(c.localID)
	mad, d := newMAD(AttrDREQ, c.tid)
	f := DREQFields{LocalCommID: c.localID, RemoteCommID: c.remoteID, RemoteQPN: c.remoteQPN}
	copy(f.PrivateData[:], privateData)
	DREQ(d).Encode(&f)
	c.state = StateDREQSent
	m.sendRetried(c, mad, c.respTimeout, int(c.maxCMRetries))
}

func (m *Manager) sendDREP(c *Conn, privateData []byte) {
	mad, d := newMAD(AttrDREP, c.tid)
	f := DREPFields{LocalCommID: c.localID, RemoteCommID: c.remoteID}
	if len(privateData) > DREPPrivateDataSize {
		privateData = privateData[:DREPPrivateDataSize]
	}
	copy(f.PrivateData[:], privateData)
	DREP(d).Encode(&f)
	c.lastResp = mad
	m.send(c.peer, mad)
}

// sendREJ sends a REJ for c, filling Message REJected and the local comm ID
// from the state as cm.c's cm_format_rej does.
func (m *Manager) sendREJ(c *Conn, reason RejectReason, ari, privateData []byte) {
	mad, d := newMAD(AttrREJ, c.tid)
	f := REJFields{LocalCommID: c.localID, RemoteCommID: c.remoteID, Reason: reason, MessageRejected: MsgOther}
	switch c.state {
	case StateREQRcvd:
		f.LocalCommID, f.MessageRejected = 0, MsgREQ
	case StateMRAREQSent:
		f.MessageRejected = MsgREQ
	case StateREPRcvd, StateMRAREPSent:
		f.MessageRejected = MsgREP
	}
	f.ARILength = uint8(copy(f.ARI[:], ari))
	copy(f.PrivateData[:], privateData)
	REJ(d).Encode(&f)
	m.send(c.peer, mad)
}

// Destroy releases the communication ID as ib_destroy_cm_id does: a pending
// request is rejected (REJ Timeout for an active REQ, Consumer Defined
// otherwise), an established connection is disconnected, and TIMEWAIT runs
// its course. No events are reported for c afterwards.
func (c *Conn) Destroy() {
	m := c.m
	m.mu.Lock()
	defer m.unlock()
	c.destroyed = true
	switch c.state {
	case StateREQSent, StateMRAREQRcvd:
		var ari [8]byte
		be.PutUint64(ari[:], m.o.CAGUID)
		m.sendREJ(c, RejTimeout, ari[:], nil)
		m.qpErr(c)
		m.toIdle(c)
	case StateREQRcvd, StateMRAREQSent, StateREPRcvd, StateMRAREPSent:
		m.sendREJ(c, RejConsumerDefined, nil, nil)
		m.qpErr(c)
		m.toIdle(c)
	case StateREPSent, StateMRAREPRcvd:
		m.sendREJ(c, RejConsumerDefined, nil, nil)
		m.qpErr(c)
		m.enterTimewait(c)
	case StateEstablished:
		m.sendDREQ(c, nil)
	case StateDREQRcvd:
		m.sendDREP(c, nil)
		m.enterTimewait(c)
	case StateSIDRREQRcvd:
		m.sendSIDRRep(c, &SIDRReplyOptions{Status: SIDRReject})
		m.toIdle(c)
	case StateSIDRREQSent:
		m.toIdle(c)
	}
}

// SIDROptions are the parameters of a service ID resolution (ib_cm_sidr_req_param).
type SIDROptions struct {
	ServiceID    uint64
	Peer         Addr   // Peer.QPN 0 = GSIQPN; Peer.PKey 0 = 0xFFFF
	PrivateData  []byte // up to SIDRReqPrivateDataSize (rdma_cm: the CMA header)
	Timeout      uint8  // per-attempt timeout code; 0 = DefaultCMResponseTimeout
	MaxCMRetries uint8  // 0 = DefaultMaxCMRetries
	Context      any
}

// ResolveSIDR sends a SIDR_REQ (IBTA 12.11.1). The SIDR_REP produces
// ESTABLISHED with Event.UD (status Success) or UNREACHABLE (Event.SIDRStatus);
// no answer after the retries produces UNREACHABLE with ErrTimeout.
func (m *Manager) ResolveSIDR(o SIDROptions) (*Conn, error) {
	if len(o.PrivateData) > SIDRReqPrivateDataSize {
		return nil, ErrTooLong
	}
	if !o.Peer.GID.IsValid() {
		return nil, ErrOptions
	}
	m.mu.Lock()
	defer m.unlock()
	if m.closed {
		return nil, ErrClosed
	}
	id, err := m.newLocalID()
	if err != nil {
		return nil, err
	}
	c := &Conn{m: m, state: StateSIDRREQSent, active: true, ud: true, localID: id, service: o.ServiceID,
		peer: o.Peer, Context: o.Context}
	if c.peer.QPN == 0 {
		c.peer.QPN = GSIQPN
	}
	if c.peer.PKey == 0 {
		c.peer.PKey = 0xFFFF
	}
	to, retries := o.Timeout, o.MaxCMRetries
	if to == 0 {
		to = DefaultCMResponseTimeout
	}
	if retries == 0 {
		retries = DefaultMaxCMRetries
	}
	c.tid = m.newTID(id)
	mad, d := newMAD(AttrSIDRReq, c.tid)
	f := SIDRReqFields{RequestID: id, PKey: c.peer.PKey, ServiceID: o.ServiceID}
	copy(f.PrivateData[:], o.PrivateData)
	SIDRReq(d).Encode(&f)
	m.local[id] = c
	m.sendRetried(c, mad, CMTimeout(to), int(retries))
	return c, nil
}

// SIDRReplyOptions answer a SIDR CONNECT_REQUEST (ib_cm_sidr_rep_param).
type SIDRReplyOptions struct {
	Status      SIDRStatus
	QPN         uint32
	QKey        uint32
	AddInfo     []byte // up to SIDRRepAddInfoSize (ClassPortInfo on redirect)
	PrivateData []byte // up to SIDRRepPrivateDataSize
}

// SIDRReply sends the SIDR_REP (IBTA 12.11.2) and ends the exchange.
func (c *Conn) SIDRReply(o SIDRReplyOptions) error {
	if len(o.PrivateData) > SIDRRepPrivateDataSize || len(o.AddInfo) > SIDRRepAddInfoSize {
		return ErrTooLong
	}
	m := c.m
	m.mu.Lock()
	defer m.unlock()
	if c.state != StateSIDRREQRcvd {
		return ErrState
	}
	m.sendSIDRRep(c, &o)
	m.toIdle(c)
	return nil
}

func (m *Manager) sendSIDRRep(c *Conn, o *SIDRReplyOptions) {
	mad, d := newMAD(AttrSIDRRep, c.tid)
	f := SIDRRepFields{RequestID: c.remoteID, Status: o.Status, QPN: o.QPN & 0xFFFFFF, ServiceID: c.service, QKey: o.QKey}
	f.AddInfoLength = uint8(copy(f.AddInfo[:], o.AddInfo))
	copy(f.PrivateData[:], o.PrivateData)
	SIDRRep(d).Encode(&f)
	m.send(c.peer, mad)
}
