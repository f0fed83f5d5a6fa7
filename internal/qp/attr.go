package qp

import (
	"net/netip"

	"github.com/softroce/softroce/internal/mr"
)

// Type is a QP transport service type (IBTA 9.8.1; ibv_qp_type for RC, UC, UD).
type Type uint8

// QP types.
const (
	TypeRC  Type = 2 // IBV_QPT_RC: reliable connected
	TypeUC  Type = 3 // IBV_QPT_UC: unreliable connected
	TypeUD  Type = 4 // IBV_QPT_UD: unreliable datagram
	TypeGSI Type = 1 // IB_QPT_GSI: QP1, the general services interface (a UD QP, IBTA 13.4.3)
)

// String names the type like ibverbs ("RC", "UC", "UD", "GSI").
func (t Type) String() string {
	switch t {
	case TypeRC:
		return "RC"
	case TypeUC:
		return "UC"
	case TypeUD:
		return "UD"
	case TypeGSI:
		return "GSI"
	}
	return "unknown"
}

// Valid reports whether t is one of the defined types.
func (t Type) Valid() bool { return t >= TypeGSI && t <= TypeUD }

// Datagram reports whether t is UD or GSI.
func (t Type) Datagram() bool { return t == TypeUD || t == TypeGSI }

// State is a QP state (IBTA 10.3.1; ibv_qp_state numbering).
type State uint8

// QP states.
const (
	StateReset State = 0 // IBV_QPS_RESET
	StateInit  State = 1 // IBV_QPS_INIT
	StateRTR   State = 2 // IBV_QPS_RTR: ready to receive
	StateRTS   State = 3 // IBV_QPS_RTS: ready to send
	StateSQD   State = 4 // IBV_QPS_SQD: send queue drain
	StateSQE   State = 5 // IBV_QPS_SQE: send queue error (UC/UD only)
	StateErr   State = 6 // IBV_QPS_ERR
)

var stateNames = [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"}

// String returns "RESET", "INIT", "RTR", "RTS", "SQD", "SQE" or "ERR".
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "UNKNOWN"
}

// Valid reports whether s is a defined state.
func (s State) Valid() bool { return s <= StateErr }

// MTU is a path MTU enum (IBTA 9.4 / ibv_mtu): 1=256 ... 5=4096.
type MTU uint8

// MTU values.
const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes returns the MTU in bytes (256 << (m-1)), or 0 for an invalid enum.
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << m
}

// Valid reports whether m is 1..5.
func (m MTU) Valid() bool { return m >= MTU256 && m <= MTU4096 }

// String returns the byte count as text ("1024") or "invalid".
func (m MTU) String() string {
	switch m {
	case MTU256:
		return "256"
	case MTU512:
		return "512"
	case MTU1024:
		return "1024"
	case MTU2048:
		return "2048"
	case MTU4096:
		return "4096"
	}
	return "invalid"
}

// MTUFromBytes returns the largest MTU enum not above n bytes (0 if n < 256).
func MTUFromBytes(n int) MTU {
	switch {
	case n >= 4096:
		return MTU4096
	case n >= 2048:
		return MTU2048
	case n >= 1024:
		return MTU1024
	case n >= 512:
		return MTU512
	case n >= 256:
		return MTU256
	}
	return 0
}

// MigState is the path migration state (ibv_mig_state).
type MigState uint8

// Path migration states.
const (
	MigMigrated MigState = 0
	MigRearm    MigState = 1
	MigArmed    MigState = 2
)

// AHAttr is an address vector for RoCEv2 (ibv_ah_attr with its GRH; IBTA 8.3 / A17.4): the
// GRH fields that become the IP header, and the source GID index.
type AHAttr struct {
	// DGID is the destination GID as an IP address: an IPv4 address (or IPv4-mapped IPv6,
	// which is treated as IPv4) or an IPv6 address. The destination IP of every packet.
	DGID netip.Addr
	// SGIDIndex selects the source GID (and so the source IP) in the port's GID table.
	SGIDIndex uint8
	// HopLimit becomes the IPv4 TTL / IPv6 hop limit.
	HopLimit uint8
	// TrafficClass becomes the IPv4 TOS / IPv6 traffic class.
	TrafficClass uint8
	// FlowLabel is the 20-bit IPv6 flow label (0 = derive from the QPN pair).
	FlowLabel uint32
	// SL is the service level (carried only for completeness on Ethernet).
	SL uint8
	// Port is the port number (1).
	Port uint8
}

// Attr is the ibv_qp_attr set. Only fields selected by the AttrMask are read.
type Attr struct {
	State           State    // AttrState: the requested next state
	CurState        State    // AttrCurState: the state the caller believes the QP is in
	PathMTU         MTU      // AttrPathMTU
	PathMigState    MigState // AttrPathMigState
	QKey            uint32   // AttrQKey
	RQPSN           uint32   // AttrRQPSN: 24-bit expected receive PSN
	SQPSN           uint32   // AttrSQPSN: 24-bit first send PSN
	DestQPN         uint32   // AttrDestQPN: 24-bit remote QP number
	AccessFlags     mr.Access
	PKeyIndex       uint16 // AttrPKeyIndex: must be 0 (one P_Key, 0xFFFF)
	Port            uint8  // AttrPort: must be 1
	AH              AHAttr // AttrAV: primary path
	AltAH           AHAttr // AttrAltPath: alternate path (not supported on RoCE)
	SQDrainEvent    bool   // AttrEnSQDAsyncNotify: raise SQ_DRAINED when SQD is reached
	Timeout         uint8  // AttrTimeout: local ACK timeout, 4.096 us * 2^Timeout (0 = infinite), 0..31
	RetryCnt        uint8  // AttrRetryCnt: 0..7
	RNRRetry        uint8  // AttrRNRRetry: 0..7, 7 = infinite
	MinRNRTimer     uint8  // AttrMinRNRTimer: RNR NAK timer code 0..31
	MaxRDAtomic     uint8  // AttrMaxQPRDAtomic: outstanding RDMA READ/atomic as initiator
	MaxDestRDAtomic uint8  // AttrMaxDestRDAtomic: responder resources
	Cap             Cap    // AttrCap
	RateLimit       uint32 // AttrRateLimit: kbit/s, 0 = none (ibv_modify_qp_rate_limit; congestion.go)
	// SelectiveRepeat (AttrSelectiveRepeat, RC only, INIT->RTR or RTR->RTS): the peer is a
	// softroce QP that has it on too, so both ends use selective repeat instead of IBTA's
	// go-back-N (selective.go, docs/reliability.md). softroce's own; no ibverbs equivalent.
	SelectiveRepeat bool
}

// Cap is a QP's queue capacity (ibv_qp_cap).
type Cap struct {
	MaxSendWR, MaxRecvWR   uint32
	MaxSendSGE, MaxRecvSGE uint32
	MaxInlineData          uint32
}

// AttrMask selects Attr fields (ibv_qp_attr_mask bit numbering).
type AttrMask uint32

// Attribute mask bits.
const (
	AttrState            AttrMask = 1 << 0
	AttrCurState         AttrMask = 1 << 1
	AttrEnSQDAsyncNotify AttrMask = 1 << 2
	AttrAccessFlags      AttrMask = 1 << 3
	AttrPKeyIndex        AttrMask = 1 << 4
	AttrPort             AttrMask = 1 << 5
	AttrQKey             AttrMask = 1 << 6
	AttrAV               AttrMask = 1 << 7
	AttrPathMTU          AttrMask = 1 << 8
	AttrTimeout          AttrMask = 1 << 9
	AttrRetryCnt         AttrMask = 1 << 10
	AttrRNRRetry         AttrMask = 1 << 11
	AttrRQPSN            AttrMask = 1 << 12
	AttrMaxQPRDAtomic    AttrMask = 1 << 13
	AttrAltPath          AttrMask = 1 << 14
	AttrMinRNRTimer      AttrMask = 1 << 15
	AttrSQPSN            AttrMask = 1 << 16
	AttrMaxDestRDAtomic  AttrMask = 1 << 17
	AttrPathMigState     AttrMask = 1 << 18
	AttrCap              AttrMask = 1 << 19
	AttrDestQPN          AttrMask = 1 << 20
	AttrRateLimit        AttrMask = 1 << 25
	// AttrSelectiveRepeat selects Attr.SelectiveRepeat: softroce's own bit, above every
	// ibv_qp_attr_mask bit.
	AttrSelectiveRepeat AttrMask = 1 << 30
)

var maskNames = [...]string{
	0: "IBV_QP_STATE", 1: "IBV_QP_CUR_STATE", 2: "IBV_QP_EN_SQD_ASYNC_NOTIFY",
	3: "IBV_QP_ACCESS_FLAGS", 4: "IBV_QP_PKEY_INDEX", 5: "IBV_QP_PORT", 6: "IBV_QP_QKEY",
	7: "IBV_QP_AV", 8: "IBV_QP_PATH_MTU", 9: "IBV_QP_TIMEOUT", 10: "IBV_QP_RETRY_CNT",
	11: "IBV_QP_RNR_RETRY", 12: "IBV_QP_RQ_PSN", 13: "IBV_QP_MAX_QP_RD_ATOMIC",
	14: "IBV_QP_ALT_PATH", 15: "IBV_QP_MIN_RNR_TIMER", 16: "IBV_QP_SQ_PSN",
	17: "IBV_QP_MAX_DEST_RD_ATOMIC", 18: "IBV_QP_PATH_MIG_STATE", 19: "IBV_QP_CAP",
	20: "IBV_QP_DEST_QPN", 25: "IBV_QP_RATE_LIMIT", 30: "SOFTROCE_QP_SELECTIVE_REPEAT",
}

// String returns the ibverbs names of the set bits joined by "|" ("0" if none).
func (m AttrMask) String() string {
	if m == 0 {
		return "0"
	}
	s := ""
	for b := 0; b < 32; b++ {
		if m&(1<<b) == 0 {
			continue
		}
		n := ""
		if b < len(maskNames) {
			n = maskNames[b]
		}
		if n == "" {
			n = "bit" + itoa(b)
		}
		if s != "" {
			s += "|"
		}
		s += n
	}
	return s
}

func itoa(v int) string {
	if v == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for v > 0 {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
	}
	return string(b[i:])
}
