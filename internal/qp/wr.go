package qp

import (
	"errors"
	"net/netip"
)

// SGE is a scatter/gather element (ibv_sge): Length bytes at virtual address Addr of the MR
// named by LKey (IBTA 10.7.1.1).
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// WROpcode is a send work request opcode in ibv_wr_opcode numbering.
type WROpcode uint8

// Send WR opcodes.
const (
	WRRDMAWrite         WROpcode = 0
	WRRDMAWriteWithImm  WROpcode = 1
	WRSend              WROpcode = 2
	WRSendWithImm       WROpcode = 3
	WRRDMARead          WROpcode = 4
	WRAtomicCmpAndSwp   WROpcode = 5
	WRAtomicFetchAndAdd WROpcode = 6
	WRLocalInv          WROpcode = 7
	WRBindMW            WROpcode = 8
	WRSendWithInv       WROpcode = 9
	// WRFlush is IBV_WR_FLUSH (IBTA 1.5 memory placement, A19.4.1): the responder makes the
	// range (or the whole region) placed with the SendWR's FlushType before it answers. No
	// payload; RC only.
	WRFlush WROpcode = 14
	// WRAtomicWrite is IBV_WR_ATOMIC_WRITE (IBTA 1.5, A19.4.2): the 8 bytes of the SGL (or,
	// with SendInline, of the SGL or of Inline, taken at post time whatever the QP's
	// max_inline_data) are placed at an 8-byte aligned RemoteAddr in one store, after every
	// earlier request of the QP. RC only.
	WRAtomicWrite WROpcode = 15
)

var wrNames = [...]string{
	"RDMA_WRITE", "RDMA_WRITE_WITH_IMM", "SEND", "SEND_WITH_IMM", "RDMA_READ",
	"ATOMIC_CMP_AND_SWP", "ATOMIC_FETCH_AND_ADD", "LOCAL_INV", "BIND_MW", "SEND_WITH_INV",
	14: "FLUSH", 15: "ATOMIC_WRITE",
}

// String returns the ibverbs name without the IBV_WR_ prefix.
func (o WROpcode) String() string {
	if int(o) < len(wrNames) && wrNames[o] != "" {
		return wrNames[o]
	}
	return "UNKNOWN"
}

// Valid reports whether o is a defined opcode.
func (o WROpcode) Valid() bool { return o <= WRSendWithInv || o == WRFlush || o == WRAtomicWrite }

// FlushType is a FLUSH's placement type (ibv_placement_type; FETH bits 3..0, IBTA A19.4.1.1):
// one or both of FlushGlobal and FlushPersistent.
type FlushType uint8

// Placement types.
const (
	// FlushGlobal (IBV_FLUSH_GLOBAL): what was placed before the FLUSH is visible to every
	// observer of the memory. The responder's region needs AccessFlushGlobal.
	FlushGlobal FlushType = 1 << 0
	// FlushPersistent (IBV_FLUSH_PERSISTENT): what was placed before the FLUSH is durable.
	// The responder's region needs AccessFlushPersistent.
	FlushPersistent FlushType = 1 << 1
)

// FlushLevel is a FLUSH's selectivity level (ibv_selectivity_level; FETH bits 5..4, IBTA
// A19.4.1.2).
type FlushLevel uint8

// Selectivity levels.
const (
	// FlushRange (IBV_FLUSH_RANGE): the RemoteAddr and FlushLength range of the region.
	FlushRange FlushLevel = 0
	// FlushMR (IBV_FLUSH_MR): the whole region RKey names; RemoteAddr and FlushLength are
	// carried but not used.
	FlushMR FlushLevel = 1
)

// carriesData reports whether the opcode sends the SGL's data (SEND and RDMA WRITE kinds).
func (o WROpcode) carriesData() bool {
	switch o {
	case WRSend, WRSendWithImm, WRSendWithInv, WRRDMAWrite, WRRDMAWriteWithImm:
		return true
	}
	return false
}

// Local reports whether the opcode is a local memory operation with no wire traffic.
func (o WROpcode) Local() bool { return o == WRLocalInv || o == WRBindMW }

// SendFlags are ibv_send_flags.
type SendFlags uint32

// Send flags.
const (
	SendFence     SendFlags = 1 // IBV_SEND_FENCE: wait for prior READ/atomic to complete (IBTA 10.8.3.3)
	SendSignaled  SendFlags = 2 // IBV_SEND_SIGNALED: generate a completion on success
	SendSolicited SendFlags = 4 // IBV_SEND_SOLICITED: set the BTH SE bit (IBTA 9.2.3)
	SendInline    SendFlags = 8 // IBV_SEND_INLINE: copy the payload at post time
)

// AH is an address handle for UD sends (ibv_ah): the resolved path.
type AH struct {
	AHAttr
	// SGID is the source GID (IP) the device resolved from SGIDIndex; the zero Addr means
	// "let the device resolve it".
	SGID netip.Addr
}

// BindInfo describes a memory window bind (ibv_mw_bind_info) for WRBindMW.
type BindInfo struct {
	// MWRKey is the window's current rkey. NewRKey is the rkey the bind gives it (only its key
	// byte counts): a type 2 window's always; a type 1 window's when not 0 (0: the device
	// draws a key byte; ibv_bind_mw's library picks one, as it returns the new rkey at post).
	MWRKey  uint32
	NewRKey uint32
	// MRLKey names the MR the window is bound to.
	MRLKey uint32
	Addr   uint64
	Length uint64
	Access uint32 // mr.Access bits
}

// SendWR is a send work request (ibv_send_wr).
type SendWR struct {
	WRID   uint64
	Opcode WROpcode
	SGL    []SGE
	Flags  SendFlags
	// Imm is the immediate data for *_WITH_IMM, sent big-endian (ImmDt, IBTA 9.3.7).
	Imm uint32
	// InvRKey is the rkey to invalidate for SEND_WITH_INV (IETH, IBTA 9.3.8) and LOCAL_INV.
	InvRKey uint32
	// RemoteAddr and RKey address the remote buffer for RDMA and atomic operations.
	RemoteAddr uint64
	RKey       uint32
	// CompareAdd and Swap are the atomic operands (compare / add value, swap value).
	CompareAdd uint64
	Swap       uint64
	// AH, RemoteQPN and RemoteQKey address a UD send (ibv_send_wr.wr.ud).
	AH         *AH
	RemoteQPN  uint32
	RemoteQKey uint32
	// Bind describes a WRBindMW.
	Bind *BindInfo
	// FlushLength, FlushType and FlushLevel are a WRFlush's range length, placement type and
	// selectivity level (ibv_wr_flush's len, type and level; the range starts at
	// RemoteAddr).
	FlushLength uint32
	FlushType   FlushType
	FlushLevel  FlushLevel
	// Inline, if not nil, is the payload of an IBV_SEND_INLINE send or write, given by value
	// instead of by SGL (SGL must then be empty): the daemon receives a client's inline data
	// in the post message. It is copied at post time, as inline data from an SGL is.
	Inline []byte
}

// RecvWR is a receive work request (ibv_recv_wr).
type RecvWR struct {
	WRID uint64
	SGL  []SGE
}

// Work request validation errors.
var (
	ErrWRTooManySGE  = errors.New("qp: work request has more SGEs than max_sge")
	ErrWRInlineSize  = errors.New("qp: inline data larger than max_inline_data")
	ErrWRLength      = errors.New("qp: total work request length overflows or exceeds max message size")
	ErrWROpcode      = errors.New("qp: opcode not valid for this QP type")
	ErrWRAtomicAlign = errors.New("qp: atomic remote address not 8-byte aligned")
	ErrWRNoAH        = errors.New("qp: UD send without an address handle")
	ErrWRNoBind      = errors.New("qp: BIND_MW work request without bind information")
)

// TotalLength returns the sum of the SGE lengths and false if it exceeds 2^32-1
// (IBTA 9.4.x: a message is at most 2^31 bytes; the caller compares with max_msg_sz).
func TotalLength(sgl []SGE) (uint32, bool) {
	var t uint64
	for i := range sgl {
		t += uint64(sgl[i].Length)
	}
	if t > 0xFFFFFFFF {
		return 0, false
	}
	return uint32(t), true
}

// CheckSGL checks the SGE count against maxSGE.
func CheckSGL(sgl []SGE, maxSGE int) error {
	if len(sgl) > maxSGE {
		return ErrWRTooManySGE
	}
	return nil
}

// WRLimits are the limits ValidateSend checks a WR against.
type WRLimits struct {
	MaxSGE        int
	MaxInlineData int
	MaxMsgSize    uint32
}

// ValidateSend checks a send WR against the QP type and limits, without touching memory:
// opcode legal for the type (IBTA 9.8.3: UD has SEND and SEND_WITH_IMM only; UC has no READ
// and no atomics), bind information for BIND_MW, SGE count, total length vs MaxMsgSize (UD additionally must fit one MTU;
// the engine checks that), inline size, atomic alignment, UD address handle. It returns the
// total length.
func ValidateSend(t Type, wr *SendWR, lim WRLimits) (uint32, error) {
	if !wr.Opcode.Valid() {
		return 0, ErrWROpcode
	}
	switch t {
	case TypeUD, TypeGSI:
		if wr.Opcode != WRSend && wr.Opcode != WRSendWithImm {
			return 0, ErrWROpcode
		}
		if wr.AH == nil {
			return 0, ErrWRNoAH
		}
	case TypeUC:
		switch wr.Opcode {
		case WRRDMARead, WRAtomicCmpAndSwp, WRAtomicFetchAndAdd, WRFlush, WRAtomicWrite:
			return 0, ErrWROpcode
		}
	case TypeRC:
	default:
		return 0, ErrWROpcode
	}
	if wr.Opcode == WRBindMW && wr.Bind == nil {
		return 0, ErrWRNoBind
	}
	if err := CheckSGL(wr.SGL, lim.MaxSGE); err != nil {
		return 0, err
	}
	if wr.Inline != nil && (len(wr.SGL) > 0 || wr.Flags&SendInline == 0 || !(wr.Opcode.carriesData() || wr.Opcode == WRAtomicWrite)) {
		return 0, ErrBadWR
	}
	n, ok := TotalLength(wr.SGL)
	if wr.Inline != nil {
		n, ok = uint32(len(wr.Inline)), uint64(len(wr.Inline)) <= 0xFFFFFFFF
	}
	if !ok || (lim.MaxMsgSize != 0 && n > lim.MaxMsgSize) {
		return 0, ErrWRLength
	}
	// An ATOMIC WRITE's 8 bytes given inline are its operand (IBTA A19.4.2), kept in the WQE as
	// an atomic's compare and swap values are (rxe's wqe->dma.atomic_wr, which
	// ibv_wr_atomic_write fills whatever the QP's max_inline_data): not inline data.
	if wr.Flags&SendInline != 0 && int(n) > lim.MaxInlineData && wr.Opcode != WRAtomicWrite {
		return 0, ErrWRInlineSize
	}
	switch wr.Opcode {
	case WRAtomicCmpAndSwp, WRAtomicFetchAndAdd, WRAtomicWrite:
		if wr.RemoteAddr&7 != 0 { // IBTA 9.4.5; A19.4.2 for ATOMIC WRITE
			return 0, ErrWRAtomicAlign
		}
		if n != 8 { // IBTA 9.4.5: atomic operations are 8 bytes; oA19-28 ATOMIC WRITE too
			return 0, ErrWRLength
		}
	case WRFlush:
		if n != 0 { // oA19-2: a FLUSH carries no payload
			return 0, ErrWRLength
		}
		// the placement type names at least one defined type and nothing else (A19.4.1.1),
		// the selectivity level is a defined one (A19.4.1.2)
		if wr.FlushType == 0 || wr.FlushType&^(FlushGlobal|FlushPersistent) != 0 || wr.FlushLevel > FlushMR {
			return 0, ErrBadWR
		}
	}
	return n, nil
}

// ValidateRecv checks a receive WR's SGE count and total length.
func ValidateRecv(wr *RecvWR, maxSGE int) (uint32, error) {
	if err := CheckSGL(wr.SGL, maxSGE); err != nil {
		return 0, err
	}
	n, ok := TotalLength(wr.SGL)
	if !ok {
		return 0, ErrWRLength
	}
	return n, nil
}
