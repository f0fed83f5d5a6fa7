// Long file: an rdma_cm ID's state machine is driven from two sides, the application's calls
// (bind, resolve, listen, connect, accept, reject, disconnect, destroy) and the CM events of
// its device (handle, connectRequest), under one lock and one state table; reading one side
// without the other hides half of the transitions.

// Package rdmacm is an rdma_cm-shaped connection API over softroce devices
// (librdmacm's rdma_create_id, rdma_resolve_addr/route, rdma_listen,
// rdma_connect, rdma_accept, rdma_reject, rdma_disconnect and
// rdma_get_cm_event), speaking the IBTA CM protocol (internal/cm) through each
// device's QP1 to any peer, kernel rdma_cm included.
//
// Addressing follows rdma_cm on RoCE (IBTA Annex A11, "RDMA IP CM
// Service"): an ID is bound to an IP address and a port in a port space
// (PSTCP for RC, PSUDP for UD); the service ID is port space << 16 | port;
// the REQ (or SIDR_REQ) private data starts with the 36-byte CMA header
// naming both addresses and the active side's port, followed by the user's
// private data (56 bytes fit in a REQ).
//
// Events go to the EventChannel the ID was created on; CONNECT_REQUEST
// carries a new ID (inheriting the listener's channel) on which the
// application creates a QP and calls Accept or Reject.
//
// Negotiation as librdmacm and the kernel's cma.c do it: the CONNECT_REQUEST
// parameters are shown from the passive side's point of view (its
// responder resources = the REQ's initiator depth and vice versa); Accept
// without parameters answers with those values capped by the device's
// limits, retry and RNR retry 7; 0xFF (MaxDepth) asks for the device limit.
// The REQ's starting PSN is the PSN the passive side sends from (docs/cm.md).
//
// Two modes, one API: IDOptions.Device (or IDOptions.Verbs = Device.Verbs())
// runs rdma_cm in this process on an embedded device; IDOptions.Verbs = a
// softroce daemon client (pkg/client, a Remote) runs it in the daemon,
// bound to the client's own QPs (remote.go). CreateQPVerbs and QueuePair
// work in both modes.
package rdmacm

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/softroce/softroce/internal/cm"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/roce"
)

// EventType is the rdma_cm event type (enum rdma_cm_event_type numbering).
type EventType = cm.EventType

// Event types, re-exported from internal/cm.
const (
	EventAddrResolved    = cm.EventAddrResolved
	EventAddrError       = cm.EventAddrError
	EventRouteResolved   = cm.EventRouteResolved
	EventRouteError      = cm.EventRouteError
	EventConnectRequest  = cm.EventConnectRequest
	EventConnectResponse = cm.EventConnectResponse
	EventConnectError    = cm.EventConnectError
	EventUnreachable     = cm.EventUnreachable
	EventRejected        = cm.EventRejected
	EventEstablished     = cm.EventEstablished
	EventDisconnected    = cm.EventDisconnected
	EventTimewaitExit    = cm.EventTimewaitExit
)

// MaxDepth in ConnParam.ResponderResources or InitiatorDepth asks for the
// device's limit (RDMA_MAX_RESP_RES / RDMA_MAX_INIT_DEPTH).
const MaxDepth = 0xFF

// Errors of the API.
var (
	ErrClosed     = errors.New("rdmacm: event channel closed")
	ErrState      = errors.New("rdmacm: operation not valid in the ID's state")
	ErrInvalidArg = errors.New("rdmacm: invalid argument")
	ErrAddrInUse  = errors.New("rdmacm: address and port already in use")
	ErrNoAddr     = errors.New("rdmacm: no local address for the destination")
	ErrNoQP       = errors.New("rdmacm: the ID has no QP")
	ErrDestroyed  = errors.New("rdmacm: ID destroyed")
)

// ConnParam is rdma_conn_param: what Connect and Accept announce, and what
// CONNECT_REQUEST / ESTABLISHED report about the peer (from the local
// side's point of view).
type ConnParam struct {
	// PrivateData: up to 56 bytes in Connect (after the CMA header), 196 in
	// Accept, 148 in Reject; events carry the peer's whole area.
	PrivateData        []byte
	ResponderResources uint8 // incoming RDMA READ/atomic depth; MaxDepth = device limit
	InitiatorDepth     uint8 // outstanding RDMA READ/atomic we issue; MaxDepth = device limit
	FlowControl        bool
	RetryCount         uint8 // transport retries (3 bits)
	RNRRetryCount      uint8 // RNR retries (7 = infinite)
	SRQ                bool
	QPNum              uint32 // the QP number when the QP was not created through the ID
	QKey               uint32 // UD: the Q_Key (0 = RDMAUDPQKey)
	// SelectiveRepeat, in events only: on CONNECT_REQUEST the peer offers selective repeat
	// (softroce's extension, docs/cm.md), on the active side's ESTABLISHED or CONNECT_RESPONSE
	// the peer accepted it, so the connection uses it. Connect and Accept do not read it: an
	// ID asks with OptionSelectiveRepeat.
	SelectiveRepeat bool
}

// UDParam is what a UD ID learns from SIDR: the remote QP, its Q_Key and an
// address handle to send to it.
type UDParam struct {
	QPN  uint32
	QKey uint32
	AH   *qp.AH
}

// Event is one rdma_cm event (rdma_cm_event).
type Event struct {
	Type EventType
	// ID is the ID the event is about; for CONNECT_REQUEST the new ID.
	ID *ID
	// Listen is, for CONNECT_REQUEST, the listening ID.
	Listen *ID
	// Status: the error for UNREACHABLE, ADDR/ROUTE/CONNECT_ERROR; for
	// REJECTED a *RejectError.
	Status error
	// Param: CONNECT_REQUEST and ESTABLISHED (active side) show the peer's
	// parameters from our side; PrivateData is the peer's (REQ: after the
	// CMA header).
	Param ConnParam
	// UD: ESTABLISHED of a UD ID (SIDR answered), and CONNECT_REQUEST of one.
	UD UDParam
}

// RejectError is the status of a REJECTED event.
type RejectError struct {
	Reason cm.RejectReason
}

// Error names the reject reason (IBTA 12.6.7.2, Table 109).
func (e *RejectError) Error() string {
	return fmt.Sprintf("rdmacm: rejected: %v (%d)", e.Reason, uint16(e.Reason))
}

// Route is the path an ID resolved (rdma_route): the GIDs, the GID index
// of the source, the port's MTU and the hop limit.
type Route struct {
	SGID, DGID   netip.Addr
	SGIDIndex    int
	MTU          qp.MTU
	HopLimit     uint8
	TrafficClass uint8
}

type idState uint8

const (
	stIdle idState = iota
	stBound
	stAddrResolved
	stRouteResolved
	stListen
	stConnectReq // passive, before Accept/Reject
	stConnect    // active, REQ sent
	stAccepting  // passive, REP sent
	stConnected
	stDisconnect
	stDestroyed
)

// IDOptions configure CreateID.
type IDOptions struct {
	// Device is the softroce device the ID lives on (softroce has no
	// global device list; rdma_cm binds IDs to the device owning the
	// address). Device or Verbs is required.
	Device *roce.Device
	// Verbs, when Device is nil, names the device as a roce.Verbs: an
	// embedded device (Device.Verbs) or a client of the softroce daemon
	// (pkg/client.Conn, which implements Remote), whose IDs live in
	// the daemon, bound to this client's QPs (docs/cm.md). A program
	// written against Verbs uses CreateQPVerbs and QueuePair, which work
	// in both modes.
	Verbs roce.Verbs
	// PortSpace: PSTCP (RC, the default) or PSUDP (UD via SIDR).
	PortSpace cm.PortSpace
	// Context is free for the application (rdma_cm_id.context).
	Context any
}

// ID is an rdma_cm_id.
type ID struct {
	// Context is free for the application.
	Context any

	ch *EventChannel
	ds *devState
	ps cm.PortSpace

	mu       sync.Mutex
	state    idState
	local    netip.AddrPort
	remote   netip.AddrPort
	route    Route
	qp       *roce.QP
	pd       *mr.PD // the QP's PD (UD address handles are made in it)
	conn     *cm.Conn
	listener *cm.Listener
	backlog  int
	// queued (listener): children whose CONNECT_REQUEST the application has not taken from
	// the channel yet, oldest first, at most backlog; inQueue (child): in its parent's queued
	// (both guarded by the parent's mu)
	queued   []*ID
	inQueue  bool
	parent   *ID
	reqParam ConnParam
	ownsPort bool
	udRemote UDParam
	attached bool // the QP came from AttachQP: not ours to destroy
	opt      idOptions

	// daemon mode (rem != nil): the ID is handle rh of the client's
	// session; vqp is the QP bound with CreateQPVerbs.
	rem *remState
	rh  uint32
	vqp roce.QueuePair
}

// devState is the per-device rdma_cm state: bound ports and the CM
// connections' IDs.
type devState struct {
	d     *roce.Device
	mu    sync.Mutex
	ports map[portKey]*ID
	refs  int
}

type portKey struct {
	ps   cm.PortSpace
	port uint16
}

var (
	devMu  sync.Mutex
	devMap = map[*roce.Device]*devState{}
)

func acquire(d *roce.Device) (*devState, error) {
	devMu.Lock()
	defer devMu.Unlock()
	ds := devMap[d]
	if ds == nil {
		if d.CM() == nil {
			return nil, roce.ErrNoCM
		}
		ds = &devState{d: d, ports: map[portKey]*ID{}}
		if err := d.SetCMEventHandler(ds.handle); err != nil {
			return nil, err
		}
		devMap[d] = ds
	}
	ds.refs++
	return ds, nil
}

func release(ds *devState) {
	devMu.Lock()
	defer devMu.Unlock()
	ds.refs--
	if ds.refs == 0 {
		_ = ds.d.SetCMEventHandler(nil)
		delete(devMap, ds.d)
	}
}

// CreateID creates an ID on o.Device whose events go to ch (rdma_create_id).
func CreateID(ch *EventChannel, o IDOptions) (*ID, error) {
	if ch == nil {
		return nil, ErrInvalidArg
	}
	if o.Device == nil && o.Verbs != nil {
		o.Device = roce.DeviceOf(o.Verbs)
		if o.Device == nil {
			r, ok := o.Verbs.(Remote)
			if !ok {
				return nil, fmt.Errorf("%w: this Verbs offers no rdma_cm", ErrInvalidArg)
			}
			return createRemote(ch, r, o)
		}
	}
	if o.Device == nil {
		return nil, ErrInvalidArg
	}
	if o.PortSpace == 0 {
		o.PortSpace = cm.PSTCP
	}
	if o.PortSpace != cm.PSTCP && o.PortSpace != cm.PSUDP {
		return nil, fmt.Errorf("%w: port space %#x", ErrInvalidArg, uint16(o.PortSpace))
	}
	ds, err := acquire(o.Device)
	if err != nil {
		return nil, err
	}
	return &ID{Context: o.Context, ch: ch, ds: ds, ps: o.PortSpace}, nil
}

// Device returns the ID's device (nil for an ID in the daemon).
func (id *ID) Device() *roce.Device {
	if id.ds == nil {
		return nil
	}
	return id.ds.d
}

// PortSpace returns the ID's port space.
func (id *ID) PortSpace() cm.PortSpace { return id.ps }

// LocalAddr returns the bound local address and port.
func (id *ID) LocalAddr() netip.AddrPort {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.local
}

// RemoteAddr returns the peer's address and port.
func (id *ID) RemoteAddr() netip.AddrPort {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.remote
}

// Route returns the resolved route.
func (id *ID) Route() Route {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.route
}

// QP returns the QP created with CreateQP or CreateQPVerbs on an embedded
// device (nil if none, and for an ID in the daemon: see QueuePair).
func (id *ID) QP() *roce.QP {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.qp
}

// bindLocked binds ap (port 0 = an ephemeral port) in the ID's port space.
func (id *ID) bindLocked(ap netip.AddrPort) error {
	if id.ownsPort {
		return ErrState
	}
	a := ap.Addr().Unmap()
	if a.IsValid() && !a.IsUnspecified() && id.ds.d.GIDIndex(a) < 1 {
		return fmt.Errorf("%w: %v is not an address of %s", ErrNoAddr, a, id.ds.d.Name())
	}
	ds := id.ds
	ds.mu.Lock()
	defer ds.mu.Unlock()
	port := ap.Port()
	if port == 0 {
		// Linux ip_local_port_range default: 32768..60999
		for i := 0; i < 1<<16; i++ {
			p := uint16(32768 + rand.IntN(60999-32768+1))
			if ds.ports[portKey{id.ps, p}] == nil {
				port = p
				break
			}
		}
		if port == 0 {
			return ErrAddrInUse
		}
	} else if ds.ports[portKey{id.ps, port}] != nil {
		return fmt.Errorf("%w: port %d", ErrAddrInUse, port)
	}
	ds.ports[portKey{id.ps, port}] = id
	id.ownsPort = true
	id.local = netip.AddrPortFrom(a, port)
	return nil
}

// BindAddr binds the ID to a local address and port (rdma_bind_addr); an
// unspecified address listens on all of the device's addresses, port 0
// picks an ephemeral port.
func (id *ID) BindAddr(ap netip.AddrPort) error {
	if id.rem != nil {
		return id.remBind(ap)
	}
	id.mu.Lock()
	defer id.mu.Unlock()
	if id.state != stIdle {
		return ErrState
	}
	if err := id.bindLocked(ap); err != nil {
		return err
	}
	id.state = stBound
	return nil
}

// ResolveAddr resolves the destination to a local source address
// (rdma_resolve_addr): src if valid, else the device address the kernel
// routes dst from (or the device's only address of dst's family). It binds
// an ephemeral port if the ID is not bound and reports ADDR_RESOLVED (or
// ADDR_ERROR) on the channel. RoCE needs no address resolution protocol:
// the GID is the IP address (IBTA A17.8).
func (id *ID) ResolveAddr(src netip.Addr, dst netip.AddrPort, timeout time.Duration) error {
	_ = timeout // resolution is local and immediate
	if id.rem != nil {
		return id.remResolveAddr(src, dst)
	}
	id.mu.Lock()
	defer id.mu.Unlock()
	if id.state != stIdle && id.state != stBound {
		return ErrState
	}
	d := dst.Addr().Unmap()
	if !d.IsValid() || d.IsUnspecified() {
		return fmt.Errorf("%w: destination %v", ErrInvalidArg, dst)
	}
	if !src.IsValid() && id.local.Addr().IsValid() && !id.local.Addr().IsUnspecified() {
		src = id.local.Addr()
	}
	s, err := pickSource(id.ds.d, src.Unmap(), d)
	if err != nil {
		id.ch.push(Event{Type: EventAddrError, ID: id, Status: err})
		return nil
	}
	if !id.ownsPort {
		if err := id.bindLocked(netip.AddrPortFrom(s, 0)); err != nil {
			return err
		}
	}
	id.local = netip.AddrPortFrom(s, id.local.Port())
	id.remote = netip.AddrPortFrom(d, dst.Port())
	id.state = stAddrResolved
	id.ch.push(Event{Type: EventAddrResolved, ID: id})
	return nil
}

// pickSource chooses the local address toward dst.
func pickSource(d *roce.Device, src, dst netip.Addr) (netip.Addr, error) {
	if src.IsValid() && !src.IsUnspecified() {
		if d.GIDIndex(src) < 1 || src.Is4() != dst.Is4() {
			return netip.Addr{}, fmt.Errorf("%w: %v", ErrNoAddr, src)
		}
		return src, nil
	}
	var cands []netip.Addr
	for _, a := range d.Addrs() {
		a = a.Unmap()
		if a.Is4() == dst.Is4() && !a.IsLinkLocalUnicast() {
			if a == dst {
				return a, nil // a local destination: loopback through the device
			}
			cands = append(cands, a)
		}
	}
	switch len(cands) {
	case 0:
		return netip.Addr{}, fmt.Errorf("%w: %v", ErrNoAddr, dst)
	case 1:
		return cands[0], nil
	}
	// connect(2) on a UDP socket only looks the route up: nothing is sent.
	if c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, bth.UDPPort))); err == nil {
		la := c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap()
		c.Close()
		for _, a := range cands {
			if a == la {
				return a, nil
			}
		}
	}
	return cands[0], nil
}

// ResolveRoute resolves the path to the destination (rdma_resolve_route):
// the source GID index, the port's active MTU, hop limit 64 (rdma_cm on
// RoCE; IBTA A17.4 maps the GRH hop limit to the IP TTL). It reports
// ROUTE_RESOLVED.
func (id *ID) ResolveRoute(timeout time.Duration) error {
	_ = timeout
	if id.rem != nil {
		return id.remResolveRoute()
	}
	id.mu.Lock()
	defer id.mu.Unlock()
	if id.state != stAddrResolved {
		return ErrState
	}
	d := id.ds.d
	idx := d.GIDIndex(id.local.Addr())
	if idx < 1 {
		id.ch.push(Event{Type: EventRouteError, ID: id, Status: ErrNoAddr})
		return nil
	}
	mtu := qp.MTUFromBytes(d.PortAttr().ActiveMTU.Bytes())
	if !mtu.Valid() {
		mtu = qp.MTU1024
	}
	id.route = Route{SGID: id.local.Addr(), DGID: id.remote.Addr(), SGIDIndex: idx, MTU: mtu, HopLimit: 64}
	if id.opt.tosSet {
		id.route.TrafficClass = id.opt.tos // cma_resolve_iboe_route: the TOS is the traffic class
	}
	id.state = stRouteResolved
	id.ch.push(Event{Type: EventRouteResolved, ID: id})
	return nil
}

// CreateQP creates the ID's QP on its device (rdma_create_qp): RC/UC QPs
// are moved to INIT (P_Key index 0, port 1, local write and remote
// read/write/atomic access: cma.c grants remote read/atomic when responder
// resources are non-zero, which rping's are); UD QPs go to RTS with the
// rdma_cm Q_Key 0x01234567 (cma_init_ud_qp). Embedded IDs only; an ID of
// any Verbs (the daemon's included) uses CreateQPVerbs.
func (id *ID) CreateQP(pd *mr.PD, in roce.QPInit) (*roce.QP, error) {
	if id.rem != nil {
		return nil, fmt.Errorf("%w: CreateQP on a daemon ID (use CreateQPVerbs)", ErrInvalidArg)
	}
	id.mu.Lock()
	defer id.mu.Unlock()
	if id.qp != nil || id.state == stDestroyed {
		return nil, ErrState
	}
	if pd == nil {
		return nil, ErrInvalidArg
	}
	in.PD = pd
	if in.Type == 0 {
		in.Type = qp.TypeRC
		if id.ps == cm.PSUDP {
			in.Type = qp.TypeUD
		}
	}
	if (in.Type == qp.TypeUD) != (id.ps == cm.PSUDP) {
		return nil, fmt.Errorf("%w: QP type %v in port space %#x", ErrInvalidArg, in.Type, uint16(id.ps))
	}
	q, err := id.ds.d.CreateQP(in)
	if err != nil {
		return nil, err
	}
	if err := initQP(q, in.Type); err != nil {
		q.Destroy()
		return nil, err
	}
	id.qp, id.pd = q, pd
	return q, nil
}

// AttachQP binds an existing QP (in RESET, of the ID's device, created in
// pd) to the ID and moves it as CreateQP does: the softroce daemon binds a
// client's QP to the client's ID with it. DestroyQP and Destroy leave it to
// its creator; DetachQP forgets it.
func (id *ID) AttachQP(q *roce.QP, pd *mr.PD) error {
	if id.ds == nil || q == nil || pd == nil {
		return ErrInvalidArg
	}
	id.mu.Lock()
	defer id.mu.Unlock()
	if id.qp != nil || id.state == stDestroyed {
		return ErrState
	}
	if (q.Type() == qp.TypeUD) != (id.ps == cm.PSUDP) || q.Type() == qp.TypeGSI {
		return fmt.Errorf("%w: QP type %v in port space %#x", ErrInvalidArg, q.Type(), uint16(id.ps))
	}
	if q.State() != qp.StateReset {
		return fmt.Errorf("%w: the QP is not in RESET", ErrState)
	}
	if err := initQP(q, q.Type()); err != nil {
		return err
	}
	id.qp, id.pd, id.attached = q, pd, true
	return nil
}

// DetachQP forgets the ID's QP without destroying it (the daemon calls it
// when a client destroys a QP bound to an ID).
func (id *ID) DetachQP() {
	id.mu.Lock()
	id.qp, id.pd, id.attached = nil, nil, false
	id.mu.Unlock()
}

// qpStep is one modification of a QP.
type qpStep struct {
	a qp.Attr
	m qp.AttrMask
}

// initSteps are the modifications rdma_create_qp makes (cma_init_ib_qp /
// cma_init_ud_qp): RC/UC to INIT, UD through RTS.
func initSteps(typ qp.Type) []qpStep {
	if typ == qp.TypeUD {
		return []qpStep{
			{qp.Attr{State: qp.StateInit, Port: 1, QKey: cm.RDMAUDPQKey}, qp.AttrState | qp.AttrPKeyIndex | qp.AttrPort | qp.AttrQKey},
			{qp.Attr{State: qp.StateRTR}, qp.AttrState},
			{qp.Attr{State: qp.StateRTS, SQPSN: rand.Uint32() & bth.PSNMask}, qp.AttrState | qp.AttrSQPSN},
		}
	}
	acc := mr.AccessLocalWrite | mr.AccessRemoteWrite
	if typ == qp.TypeRC {
		acc |= mr.AccessRemoteRead | mr.AccessRemoteAtomic
	}
	return []qpStep{{qp.Attr{State: qp.StateInit, Port: 1, AccessFlags: acc}, qp.AttrState | qp.AttrPKeyIndex | qp.AttrPort | qp.AttrAccessFlags}}
}

// initQP makes the modifications rdma_create_qp makes.
func initQP(q *roce.QP, typ qp.Type) error {
	steps := initSteps(typ)
	for i := range steps {
		if err := q.Modify(&steps[i].a, steps[i].m); err != nil {
			return err
		}
	}
	return nil
}

// InitQPAttr returns the attributes and mask that move a QP the program made
// itself, and connects through this ID with ConnParam.QPNum, to state
// (rdma_init_qp_attr): INIT as CreateQP moves it (UD: INIT, RTR and RTS with the
// rdma_cm Q_Key), RTR and RTS from the connection's negotiated parameters once
// the peer's REQ (passive side) or REP (active side) arrived (ErrState before).
// The ID's ACK timeout option replaces the RTS timeout. Through the daemon too.
func (id *ID) InitQPAttr(state qp.State) (qp.Attr, qp.AttrMask, error) {
	if id.rem != nil {
		return id.rem.r.CMInitQPAttr(id.rh, state)
	}
	id.mu.Lock()
	typ := qp.TypeRC
	if id.ps == cm.PSUDP {
		typ = qp.TypeUD
	} else if id.qp != nil {
		typ = id.qp.Type()
	}
	c, o := id.conn, id.qpOptions()
	// before Accept, the REP will accept what the REQ offered if the ID asks (Accept)
	beforeAccept, sr := id.state == stConnectReq, id.opt.selectiveRepeat
	var psn uint32
	if state == qp.StateRTR && id.state == stConnectReq && typ != qp.TypeUD {
		// a QP the program moves before Accept: the REP announces the receive PSN its RTR
		// attributes give (cma.c rdma_init_qp_attr: rq_psn = the ID's seq_num, which
		// cma_accept_ib puts in the REP)
		if id.opt.startPSN == 0 {
			id.opt.startPSN = 1 + rand.Uint32N(bth.PSNMask)
		}
		psn = id.opt.startPSN
	}
	id.mu.Unlock()
	steps := initSteps(typ)
	if typ == qp.TypeUD {
		for _, s := range steps {
			if s.a.State == state {
				return s.a, s.m, nil
			}
		}
		return qp.Attr{}, 0, fmt.Errorf("%w: QP state %v", ErrInvalidArg, state)
	}
	switch state {
	case qp.StateInit:
		return steps[0].a, steps[0].m, nil
	case qp.StateRTR, qp.StateRTS:
	default:
		return qp.Attr{}, 0, fmt.Errorf("%w: QP state %v", ErrInvalidArg, state)
	}
	if c == nil {
		return qp.Attr{}, 0, fmt.Errorf("%w: no connection yet", ErrState)
	}
	if c.Transport() == cm.TransportUC {
		typ = qp.TypeUC
	}
	rtr, rts := c.QPParams()
	if beforeAccept {
		rtr.SelectiveRepeat = c.PeerOffersSelectiveRepeat() && sr
	}
	if state == qp.StateRTR {
		a, m := cm.RTRAttr(typ, &rtr, o)
		if psn != 0 {
			a.RQPSN = psn
		}
		return a, m, nil
	}
	a, m := cm.RTSAttr(typ, &rts)
	if o.TimeoutSet && m&qp.AttrTimeout != 0 {
		a.Timeout = o.Timeout // rdma_init_qp_attr: the ID's ACK timeout
	}
	return a, m, nil
}

// DestroyQP destroys the ID's QP (rdma_destroy_qp).
func (id *ID) DestroyQP() error {
	id.mu.Lock()
	q, vq, attached := id.qp, id.vqp, id.attached
	id.qp, id.vqp, id.attached = nil, nil, false
	id.mu.Unlock()
	switch {
	case q != nil && attached:
		return nil
	case q != nil:
		return q.Destroy()
	case vq != nil:
		return vq.Destroy()
	}
	return ErrNoQP
}

// Listen starts listening for connection requests (rdma_listen); an
// unbound ID is bound to the unspecified address and an ephemeral port.
// At most backlog CONNECT_REQUEST events wait in the channel for the
// application to take them (as Linux's ucma counts its backlog); a request
// arriving while backlog wait drops the oldest of them (its connection is
// rejected, its event withdrawn), so a flood of requests cannot keep a new
// one out. A request the application took and leaves unanswered expires
// when its sender must have given up (internal/cm pending.go): the child
// then gets UNREACHABLE.
func (id *ID) Listen(backlog int) error {
	if id.rem != nil {
		return id.remListen(backlog)
	}
	id.mu.Lock()
	defer id.mu.Unlock()
	switch id.state {
	case stIdle:
		if err := id.bindLocked(netip.AddrPortFrom(netip.Addr{}, 0)); err != nil {
			return err
		}
	case stBound:
	default:
		return ErrState
	}
	if backlog <= 0 {
		backlog = 1024
	}
	// the listener is registered with the ID's lock released: the CM may
	// deliver events from inside its calls (never call it under id.mu)
	id.backlog = backlog
	id.state = stListen
	port := id.local.Port()
	id.mu.Unlock()
	l, err := id.ds.d.CM().ListenContext(cm.ServiceID(id.ps, port), id)
	id.mu.Lock()
	if err != nil {
		id.state = stBound
		return err
	}
	id.listener = l
	return nil
}

func (id *ID) qpNum(p *ConnParam) (uint32, *roce.QP, error) {
	if id.qp != nil {
		return id.qp.Num(), id.qp, nil
	}
	if p != nil && p.QPNum != 0 {
		return p.QPNum, nil, nil
	}
	return 0, nil, ErrNoQP
}

func depth(v uint8, max int) uint8 {
	if max > 255 {
		max = 255
	}
	if v == MaxDepth || int(v) > max {
		return uint8(max)
	}
	return v
}

// Connect sends the connection request (rdma_connect): a REQ for RC/UC IDs,
// a SIDR_REQ for UD IDs, after ResolveRoute. The result is ESTABLISHED,
// REJECTED, UNREACHABLE or CONNECT_ERROR on the channel.
func (id *ID) Connect(p ConnParam) error {
	if id.rem != nil {
		return id.rem.r.CMConnect(id.rh, p)
	}
	id.mu.Lock()
	defer id.mu.Unlock()
	if id.state != stRouteResolved {
		return ErrState
	}
	hdr, err := cm.NewCMAHeader(id.local.Addr(), id.remote.Addr(), id.local.Port())
	if err != nil {
		return err
	}
	mgr := id.ds.d.CM()
	sid := cm.ServiceID(id.ps, id.remote.Port())
	if id.ps == cm.PSUDP {
		var pd [cm.SIDRReqPrivateDataSize]byte
		n, err := cm.BuildPrivateData(pd[:], &hdr, p.PrivateData)
		if err != nil {
			return err
		}
		id.state = stConnect
		id.mu.Unlock()
		c, err := mgr.ResolveSIDR(cm.SIDROptions{ServiceID: sid, Peer: cm.Addr{GID: id.remote.Addr()},
			PrivateData: pd[:n], Context: id})
		id.mu.Lock()
		return id.connected1(c, err)
	}
	qpn, q, err := id.qpNum(&p)
	if err != nil {
		return err
	}
	var pd [cm.REQPrivateDataSize]byte
	n, err := cm.BuildPrivateData(pd[:], &hdr, p.PrivateData)
	if err != nil {
		return err
	}
	attr := id.ds.d.Attr()
	o := cm.ConnectOptions{
		ServiceID: sid, Peer: cm.Addr{GID: id.remote.Addr()},
		Path: cm.Path{SGID: id.route.SGID, DGID: id.route.DGID, MTU: uint8(id.route.MTU),
			HopLimit: id.route.HopLimit, TrafficClass: id.route.TrafficClass,
			FlowLabel: bth.CMFlowLabel(id.local.Port(), id.remote.Port())},
		QPN: qpn, Transport: cm.TransportRC,
		ResponderResources: depth(p.ResponderResources, attr.MaxQPRDAtom),
		InitiatorDepth:     depth(p.InitiatorDepth, attr.MaxQPInitRDAtom),
		RetryCount:         p.RetryCount, RNRRetryCount: p.RNRRetryCount,
		FlowControl: p.FlowControl, SRQ: p.SRQ, PrivateData: pd[:n], Context: id,
		SelectiveRepeat: id.opt.selectiveRepeat,
	}
	if q != nil {
		if q.Type() == qp.TypeUC {
			o.Transport = cm.TransportUC
		}
		o.QP = cm.NewQPControl(q.QP, id.qpOptions())
	} else {
		// a QP the program moves itself: CONNECT_RESPONSE, then Establish sends the RTU
		// (librdmacm and the kernel's cma_ib_handler for an ID without a QP)
		o.ManualRTU = true
	}
	id.state = stConnect
	id.mu.Unlock()
	c, err := mgr.Connect(o)
	id.mu.Lock()
	return id.connected1(c, err)
}

// connected1 records the result of a Connect/ResolveSIDR call.
func (id *ID) connected1(c *cm.Conn, err error) error {
	if err != nil {
		if id.state == stConnect {
			id.state = stRouteResolved
		}
		return err
	}
	if id.state == stDestroyed {
		c.Destroy()
		return ErrDestroyed
	}
	id.conn = c
	return nil
}

// Accept answers a CONNECT_REQUEST (rdma_accept): the QP goes to RTR and
// RTS and the REP is sent (UD: the SIDR_REP naming the QP). p nil answers
// with the request's parameters capped by the device (librdmacm). The
// passive side reports ESTABLISHED when the RTU (or the first packet)
// arrives.
func (id *ID) Accept(p *ConnParam) error {
	if id.rem != nil {
		return id.rem.r.CMAccept(id.rh, p)
	}
	id.mu.Lock()
	defer id.mu.Unlock()
	if id.state != stConnectReq {
		return ErrState
	}
	qpn, q, err := id.qpNum(p)
	if err != nil {
		return err
	}
	if id.ps == cm.PSUDP {
		qkey := uint32(cm.RDMAUDPQKey)
		var pdata []byte
		if p != nil {
			pdata = p.PrivateData
			if p.QKey != 0 {
				qkey = p.QKey
			}
		}
		c := id.conn
		id.state = stConnected
		id.mu.Unlock()
		err := c.SIDRReply(cm.SIDRReplyOptions{Status: cm.SIDRSuccess, QPN: qpn, QKey: qkey, PrivateData: pdata})
		id.mu.Lock()
		if err != nil {
			if id.state == stConnected {
				id.state = stConnectReq
			}
			return err
		}
		id.parentDone()
		return nil
	}
	attr := id.ds.d.Attr()
	var o cm.AcceptOptions
	if p == nil {
		o = cm.AcceptOptions{
			ResponderResources: depth(id.reqParam.ResponderResources, attr.MaxQPRDAtom),
			InitiatorDepth:     depth(id.reqParam.InitiatorDepth, attr.MaxQPInitRDAtom),
			RNRRetryCount:      7,
		}
	} else {
		o = cm.AcceptOptions{
			ResponderResources: depth(p.ResponderResources, attr.MaxQPRDAtom),
			InitiatorDepth:     depth(p.InitiatorDepth, attr.MaxQPInitRDAtom),
			RNRRetryCount:      p.RNRRetryCount, FlowControl: p.FlowControl, SRQ: p.SRQ,
			PrivateData: p.PrivateData,
		}
	}
	o.QPN, o.StartingPSN, o.SelectiveRepeat = qpn, id.opt.startPSN, id.opt.selectiveRepeat
	if q != nil {
		o.QP = cm.NewQPControl(q.QP, id.qpOptions())
	}
	c := id.conn
	id.state = stAccepting
	id.mu.Unlock()
	err = c.Accept(o)
	id.mu.Lock()
	if err != nil {
		if id.state == stAccepting {
			id.state = stConnectReq
		}
		return err
	}
	id.parentDone()
	return nil
}

// parentDone detaches the request from its listener (id.mu held): it leaves the backlog if
// its event is still queued.
func (id *ID) parentDone() {
	if p := id.parent; p != nil {
		p.mu.Lock()
		p.unqueue(id)
		p.mu.Unlock()
		id.parent = nil
	}
}

// unqueue removes child from the backlog (listener's mu held).
func (id *ID) unqueue(child *ID) {
	if !child.inQueue {
		return
	}
	child.inQueue = false
	for i, c := range id.queued {
		if c == child {
			copy(id.queued[i:], id.queued[i+1:])
			id.queued[len(id.queued)-1] = nil
			id.queued = id.queued[:len(id.queued)-1]
			return
		}
	}
}

// taken is called when the application takes a CONNECT_REQUEST event for child from the
// channel: it no longer counts against the listener's backlog.
func (id *ID) taken(child *ID) {
	id.mu.Lock()
	id.unqueue(child)
	id.mu.Unlock()
}

// drop forgets a request whose CONNECT_REQUEST the application has not taken: the event is
// withdrawn from the channel and the child destroyed (its connection rejected unless the CM
// gave it up already). false if the application took the event meanwhile (it keeps the
// child).
func (id *ID) drop(rejectConn bool) bool {
	if !id.ch.withdraw(func(e *Event) bool { return e.Type == EventConnectRequest && e.ID == id }) {
		return false
	}
	id.mu.Lock()
	if id.state == stDestroyed {
		id.mu.Unlock()
		return true
	}
	id.state = stDestroyed
	c := id.conn
	id.parentDone()
	id.mu.Unlock()
	if c != nil && rejectConn {
		c.Destroy() // REJ (Consumer Defined), as ib_destroy_cm_id in REQ_RCVD
	}
	release(id.ds)
	return true
}

// Reject refuses a CONNECT_REQUEST with a REJ (reason Consumer Defined,
// as rdma_reject) carrying privateData, or a SIDR_REP(Reject) for UD.
func (id *ID) Reject(privateData []byte) error {
	if id.rem != nil {
		return id.rem.r.CMReject(id.rh, privateData)
	}
	id.mu.Lock()
	defer id.mu.Unlock()
	if id.state != stConnectReq {
		return ErrState
	}
	c := id.conn
	id.state = stIdle
	id.mu.Unlock()
	var err error
	if id.ps == cm.PSUDP {
		err = c.SIDRReply(cm.SIDRReplyOptions{Status: cm.SIDRReject, PrivateData: privateData})
	} else {
		err = c.Reject(cm.RejConsumerDefined, privateData)
	}
	id.mu.Lock()
	if err != nil {
		if id.state == stIdle {
			id.state = stConnectReq
		}
		return err
	}
	id.parentDone()
	return nil
}

// Disconnect releases the connection (rdma_disconnect): the QP goes to
// ERR and a DREQ is sent; DISCONNECTED follows. Answering a received DREQ
// is automatic, and leaves the QP as it was (as the kernel's rdma_cm does):
// work requests whose packets were already on their way still complete.
// Disconnect after the peer's DISCONNECTED moves the QP to ERR.
func (id *ID) Disconnect() error {
	if id.rem != nil {
		return id.rem.r.CMDisconnect(id.rh)
	}
	id.mu.Lock()
	c := id.conn
	st := id.state
	id.mu.Unlock()
	if c == nil || (st != stConnected && st != stAccepting && st != stDisconnect) {
		return ErrState
	}
	// When the peer disconnected first (stDisconnect) the DREP went out
	// already, and this moves the QP to ERR.
	return c.Disconnect(nil)
}

// Destroy releases the ID (rdma_destroy_id): a pending request is
// rejected, a connection disconnected, a listener closed, the port
// released. The QP is not destroyed (DestroyQP). No events follow.
func (id *ID) Destroy() error {
	if id.rem != nil {
		return id.remDestroy()
	}
	id.mu.Lock()
	if id.state == stDestroyed {
		id.mu.Unlock()
		return ErrDestroyed
	}
	id.state = stDestroyed
	c, l := id.conn, id.listener
	id.listener = nil
	id.parentDone()
	id.mu.Unlock()
	if l != nil {
		l.Close()
	}
	if c != nil {
		c.Destroy()
	}
	id.ds.mu.Lock()
	if id.ownsPort && id.ds.ports[portKey{id.ps, id.local.Port()}] == id {
		delete(id.ds.ports, portKey{id.ps, id.local.Port()})
	}
	id.ds.mu.Unlock()
	release(id.ds)
	return nil
}

// handle turns a CM event into an rdma_cm event on the right channel.
func (ds *devState) handle(e cm.Event) {
	if e.Type == cm.EventConnectRequest {
		ds.connectRequest(e)
		return
	}
	if e.Conn == nil {
		return
	}
	// Conn.Context is set when the connection is created (Connect,
	// ResolveSIDR) or in its CONNECT_REQUEST, before any later event
	// (the CM delivers a connection's events in order).
	id, _ := e.Conn.Context.(*ID)
	if id == nil {
		return
	}
	id.mu.Lock()
	if id.state == stDestroyed {
		id.mu.Unlock()
		return
	}
	ev := Event{Type: e.Type, ID: id}
	switch e.Type {
	case cm.EventEstablished:
		id.state = stConnected
		if id.ps == cm.PSUDP {
			pd := id.pd
			if pd == nil {
				ev.Type, ev.Status = cm.EventUnreachable, ErrNoQP
				break
			}
			ah, err := ds.d.CreateAH(pd, qp.AHAttr{DGID: id.remote.Addr(), SGIDIndex: uint8(id.route.SGIDIndex), HopLimit: 64})
			if err != nil {
				ev.Type, ev.Status = cm.EventUnreachable, err
				break
			}
			ev.UD = UDParam{QPN: e.UD.QPN, QKey: e.UD.QKey, AH: ah}
			id.udRemote = ev.UD
			ev.Param.PrivateData = e.PrivateData
			break
		}
		if e.Conn.Active() {
			ev.Param = localView(&e.Remote, e.PrivateData)
		}
	case cm.EventConnectResponse:
		ev.Param = localView(&e.Remote, e.PrivateData) // the state stays stConnect until Establish
	case cm.EventDisconnected:
		id.state = stDisconnect
	case cm.EventTimewaitExit:
		id.state = stIdle
	case cm.EventRejected:
		id.state = stIdle
		ev.Status = &RejectError{Reason: e.Reason}
		ev.Param.PrivateData = e.PrivateData
	case cm.EventUnreachable:
		if id.state == stConnectReq && id.parent != nil {
			// a request left unanswered until its sender gave up (internal/cm pending.go):
			// if the application has not taken its CONNECT_REQUEST, it never hears of it
			id.mu.Unlock()
			if id.drop(false) {
				return
			}
			id.mu.Lock()
			if id.state == stDestroyed {
				id.mu.Unlock()
				return
			}
			id.parentDone()
		}
		id.state = stIdle
		ev.Status = e.Err
		if ev.Status == nil {
			ev.Status = fmt.Errorf("rdmacm: SIDR status %d", e.SIDRStatus)
		}
	case cm.EventConnectError:
		id.state = stIdle
		ev.Status = e.Err
	}
	id.mu.Unlock()
	id.ch.push(ev)
}

// localView converts the peer's announced parameters to the local side's
// point of view (cm_format_req_event / cm_format_rep_event).
func localView(r *cm.ConnParam, pd []byte) ConnParam {
	return ConnParam{
		PrivateData:        pd,
		ResponderResources: r.InitiatorDepth,
		InitiatorDepth:     r.ResponderResources,
		FlowControl:        r.FlowControl,
		RetryCount:         r.RetryCount,
		RNRRetryCount:      r.RNRRetryCount,
		SRQ:                r.SRQ,
		QPNum:              r.QPN,
		SelectiveRepeat:    r.SelectiveRepeat,
	}
}

func (ds *devState) connectRequest(e cm.Event) {
	if e.Conn == nil {
		return
	}
	var lid *ID
	if e.Listener != nil {
		lid, _ = e.Listener.Context.(*ID)
	}
	if lid == nil {
		rejectRaw(e)
		return
	}
	hdr, user, err := cm.ParsePrivateData(e.PrivateData)
	if err != nil {
		rejectRaw(e)
		return
	}
	lid.mu.Lock()
	if lid.state != stListen {
		lid.mu.Unlock()
		rejectRaw(e)
		return
	}
	la, sr := lid.local.Addr(), lid.opt.selectiveRepeat
	dst := hdr.Dst().Unmap()
	// an unspecified address takes every family unless the listener is AFONLY (cma_match_private_data)
	if (la.IsValid() && !la.IsUnspecified() && la != dst) || ds.d.GIDIndex(dst) < 1 ||
		(lid.opt.afOnly && la.IsValid() && la.Is4() != dst.Is4()) {
		lid.mu.Unlock()
		rejectRaw(e)
		return
	}
	// a full backlog drops its oldest untaken request (Listen): the newest get in
	var evict []*ID
	for len(lid.queued) >= lid.backlog {
		old := lid.queued[0]
		lid.unqueue(old)
		evict = append(evict, old)
	}
	_, lport, _ := cm.SplitServiceID(e.Conn.ServiceID())
	child := &ID{ch: lid.ch, ds: ds, ps: lid.ps, Context: lid.Context, state: stConnectReq,
		local: netip.AddrPortFrom(dst, lport), remote: netip.AddrPortFrom(hdr.Src().Unmap(), hdr.SrcPort()),
		parent: lid, conn: e.Conn, inQueue: true, opt: idOptions{selectiveRepeat: sr}}
	lid.queued = append(lid.queued, child)
	lid.mu.Unlock()
	for _, old := range evict {
		old.drop(true) // false: the application took it meanwhile, and keeps it
	}
	mtu := qp.MTU(e.Remote.PathMTU)
	if !mtu.Valid() {
		mtu = qp.MTU1024
	}
	child.route = Route{SGID: dst, DGID: child.remote.Addr(), SGIDIndex: ds.d.GIDIndex(dst), MTU: mtu,
		HopLimit: e.Remote.Path.HopLimit, TrafficClass: e.Remote.Path.TrafficClass}
	child.reqParam = localView(&e.Remote, user)
	devMu.Lock()
	ds.refs++
	devMu.Unlock()
	e.Conn.Context = child
	ev := Event{Type: EventConnectRequest, ID: child, Listen: lid, Param: child.reqParam}
	if lid.ps == cm.PSUDP {
		ev.Param = ConnParam{PrivateData: user}
	}
	lid.ch.push(ev)
}

// rejectRaw refuses a request no ID takes (cma.c: no matching listener or
// a bad CMA header -> REJ / SIDR_REP).
func rejectRaw(e cm.Event) {
	if ps, _, _ := cm.SplitServiceID(e.Conn.ServiceID()); ps == cm.PSUDP {
		_ = e.Conn.SIDRReply(cm.SIDRReplyOptions{Status: cm.SIDRUnsupported})
		return
	}
	_ = e.Conn.Reject(cm.RejConsumerDefined, nil)
}

// UD returns what SIDR resolved for a UD ID (zero before ESTABLISHED).
func (id *ID) UD() UDParam {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.udRemote
}
