package cm

import (
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// Addr is a CM peer: the GSI QP its MADs come from and go to.
type Addr struct {
	GID  netip.Addr // the peer's RoCEv2 GID, i.e. its IP address
	QPN  uint32     // the peer's CM QP: GSIQPN (1) unless redirected
	PKey uint16     // P_Key for the BTH (0xFFFF, the default partition)
}

// Transport carries CM MADs. The engine implements it on QP1 (GSI): a UD
// SEND ONLY with a DETH (Q_Key GSIQKey, source QP 1) whose payload is the
// 256-byte MAD; received QP1 payloads go to Manager.HandleMAD.
type Transport interface {
	// SendMAD sends one MAD to dst. mad is valid only during the call. The
	// Manager never holds its lock while calling SendMAD. An error is
	// counted (Stats.SendErrors) and otherwise treated as a lost MAD:
	// retransmission covers it.
	SendMAD(dst Addr, mad []byte) error
}

// QPControl is what the CM needs from the transport engine: the QP state
// transitions that rdma_cm performs when a connection is established or torn
// down (rdma_init_qp_attr / ib_cm_init_qp_attr). The engine implements it
// per QP. ToRTR and ToRTS are called with the Manager's lock held and must
// not call back into the Manager; ToErr is called after the lock is released.
type QPControl interface {
	// ToRTR moves the QP from INIT to RTR (IBTA 10.3.1, Table 93).
	ToRTR(p *RTRParams) error
	// ToRTS moves the QP from RTR to RTS.
	ToRTS(p *RTSParams) error
	// ToErr moves the QP to ERR (on REJ, timeout and disconnection).
	ToErr()
}

// RTRParams are the attributes of the RTR transition, from the CM exchange.
type RTRParams struct {
	DestQPN         uint32 // the remote QPN
	RQPSN           uint32 // the PSN our receive queue expects (24 bits)
	PathMTU         uint8  // IBTA MTU code, 1=256 .. 5=4096
	MaxDestRDAtomic uint8  // incoming RDMA READ/atomic depth (our responder resources)
	MinRNRTimer     uint8  // RNR NAK timer code (0 = 655.36 ms); rdma_cm leaves 0
	Path            Path   // address vector: GIDs, flow label, hop limit, traffic class, SL
	// SelectiveRepeat: both sides asked for selective repeat in the REQ and REP (softroce's
	// extension, ext.go); RC only.
	SelectiveRepeat bool
}

// RTSParams are the attributes of the RTS transition.
type RTSParams struct {
	SQPSN       uint32 // the PSN our send queue starts at (24 bits)
	Timeout     uint8  // local ACK timeout code (4.096 us * 2^n)
	RetryCnt    uint8  // transport retries (3 bits)
	RNRRetry    uint8  // RNR retries (7 = infinite)
	MaxRDAtomic uint8  // outstanding RDMA READ/atomic we initiate
}

// Path describes the route of a connection, as an SA PathRecord does on
// InfiniBand; rdma_cm builds it from the IP route on RoCE.
type Path struct {
	SGID, DGID      netip.Addr // local and remote GIDs (IP addresses)
	SLID, DLID      uint16     // 0 = 0xFFFF (permissive; RoCE has no LIDs)
	PKey            uint16     // 0 = 0xFFFF
	FlowLabel       uint32     // 20 bits; rdma_cm: bth.CMFlowLabel(sport, dport)
	TrafficClass    uint8
	HopLimit        uint8 // 0 = 64
	SL              uint8
	MTU             uint8 // IBTA MTU code; 0 = 3 (1024)
	PacketRate      uint8
	PacketLifeTime  uint8 // code (4.096 us * 2^n); 0 = 18, as rdma_cm uses on RoCE
	LocalACKTimeout uint8 // code; 0 = PacketLifeTime+1
	SubnetLocal     bool
}

func (p *Path) withDefaults() Path {
	q := *p
	if q.SLID == 0 {
		q.SLID = 0xFFFF
	}
	if q.DLID == 0 {
		q.DLID = 0xFFFF
	}
	if q.PKey == 0 {
		q.PKey = 0xFFFF
	}
	if q.HopLimit == 0 {
		q.HopLimit = 64
	}
	if q.MTU == 0 {
		q.MTU = 3
	}
	if q.PacketLifeTime == 0 {
		q.PacketLifeTime = DefaultPacketLifeTime
	}
	if q.LocalACKTimeout == 0 {
		q.LocalACKTimeout = q.PacketLifeTime + 1
	}
	return q
}

// Defaults as rdma_cm uses them (cma.c).
const (
	DefaultCMResponseTimeout = 20         // CMA_CM_RESPONSE_TIMEOUT: 4.096 us * 2^20 = 4.29 s
	DefaultMaxCMRetries      = 15         // CMA_MAX_CM_RETRIES
	DefaultPacketLifeTime    = 18         // CMA_IBOE_PACKET_LIFETIME
	RDMAUDPQKey              = 0x01234567 // RDMA_UDP_QKEY, the Q_Key of rdma_cm UD IDs
)

// CMTimeout converts a 5-bit CM timeout code to a duration: 4.096 us *
// 2^code (IBTA 12.6.5 "Remote/Local CM Response Timeout"; the same
// encoding serves packet life time, local ACK timeout and MRA service
// timeout). Codes above 31 are taken as 31.
func CMTimeout(code uint8) time.Duration {
	if code > 31 {
		code = 31
	}
	return time.Duration(4096) << code * time.Nanosecond
}

// State is a CM connection state (IBTA 12.9 state diagrams; numbering of
// enum ib_cm_state).
type State uint8

// CM states.
const (
	StateIdle State = iota
	StateListen
	StateREQSent
	StateREQRcvd
	StateMRAREQSent
	StateMRAREQRcvd
	StateREPSent
	StateREPRcvd
	StateMRAREPSent
	StateMRAREPRcvd
	StateEstablished
	StateDREQSent
	StateDREQRcvd
	StateTimewait
	StateSIDRREQSent
	StateSIDRREQRcvd
)

var stateNames = [...]string{"IDLE", "LISTEN", "REQ_SENT", "REQ_RCVD", "MRA_REQ_SENT", "MRA_REQ_RCVD",
	"REP_SENT", "REP_RCVD", "MRA_REP_SENT", "MRA_REP_RCVD", "ESTABLISHED", "DREQ_SENT", "DREQ_RCVD",
	"TIMEWAIT", "SIDR_REQ_SENT", "SIDR_REQ_RCVD"}

// String returns the IBTA state name, e.g. "REQ_SENT".
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// EventType is an rdma_cm event type (enum rdma_cm_event_type numbering).
// The CM produces CONNECT_REQUEST through TIMEWAIT_EXIT; the address and
// route events belong to the rdma_cm layer above.
type EventType uint8

// rdma_cm event types.
const (
	EventAddrResolved EventType = iota
	EventAddrError
	EventRouteResolved
	EventRouteError
	EventConnectRequest
	EventConnectResponse
	EventConnectError
	EventUnreachable
	EventRejected
	EventEstablished
	EventDisconnected
	EventDeviceRemoval
	EventMulticastJoin
	EventMulticastError
	EventAddrChange
	EventTimewaitExit
)

var eventNames = [...]string{"ADDR_RESOLVED", "ADDR_ERROR", "ROUTE_RESOLVED", "ROUTE_ERROR",
	"CONNECT_REQUEST", "CONNECT_RESPONSE", "CONNECT_ERROR", "UNREACHABLE", "REJECTED", "ESTABLISHED",
	"DISCONNECTED", "DEVICE_REMOVAL", "MULTICAST_JOIN", "MULTICAST_ERROR", "ADDR_CHANGE", "TIMEWAIT_EXIT"}

// String returns the rdma_event_str text, e.g. "RDMA_CM_EVENT_ESTABLISHED".
func (e EventType) String() string {
	if int(e) < len(eventNames) {
		return "RDMA_CM_EVENT_" + eventNames[e]
	}
	return fmt.Sprintf("EventType(%d)", uint8(e))
}

// ConnParam is what the remote side announced in its REQ or REP (the
// rdma_conn_param / ib_cm_req_event_param view).
type ConnParam struct {
	ServiceID          uint64
	CAGUID             uint64
	QPN                uint32
	StartingPSN        uint32
	Transport          TransportType
	ResponderResources uint8
	InitiatorDepth     uint8
	RetryCount         uint8
	RNRRetryCount      uint8
	FlowControl        bool
	SRQ                bool
	PathMTU            uint8
	Path               Path // REQ only: the primary path, seen from the receiver
	// SelectiveRepeat (softroce's extension, ext.go): a REQ offers selective repeat; a REP
	// accepts the offer (false when no offer was made).
	SelectiveRepeat bool
}

// UDParam is the result of a SIDR exchange: the remote UD QP and its Q_Key.
type UDParam struct {
	QPN  uint32
	QKey uint32
}

// Event is one CM event, delivered to Options.Events in order, never with
// the Manager's lock held (a handler may call back into the Manager).
type Event struct {
	Type        EventType
	Conn        *Conn
	Listener    *Listener    // CONNECT_REQUEST: the listener matched
	Reason      RejectReason // REJECTED: the REJ reason
	SIDRStatus  SIDRStatus   // UNREACHABLE after a SIDR_REP: its status
	Err         error        // UNREACHABLE: ErrTimeout; CONNECT_ERROR: the QP error
	PrivateData []byte       // a copy of the message's whole private data area
	ARI         []byte       // REJECTED: additional reject information
	Remote      ConnParam    // CONNECT_REQUEST, CONNECT_RESPONSE, ESTABLISHED (active)
	UD          UDParam      // ESTABLISHED after SIDR
	Src         Addr         // CONNECT_REQUEST: where the request came from
}

// Errors of the Manager API.
var (
	ErrTimeout = errors.New("cm: no response after the maximum CM retries")
	ErrState   = errors.New("cm: operation not valid in the connection's state")
	ErrInUse   = errors.New("cm: service ID already has a listener")
	ErrOptions = errors.New("cm: invalid options")
	ErrClosed  = errors.New("cm: manager closed")
	ErrNoIDs   = errors.New("cm: could not allocate a communication ID")
)
