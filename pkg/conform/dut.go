package conform

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/pkg/bth"
)

// QPType is the transport service of a DUT QP (IBTA 9.8.1). Its values are the
// ibv_qp_type numbers, which the control protocol carries.
type QPType uint8

// QP types.
const (
	RC QPType = 2 // reliable connected
	UC QPType = 3 // unreliable connected
	UD QPType = 4 // unreliable datagram
)

// String returns "RC", "UC" or "UD".
func (t QPType) String() string {
	switch t {
	case RC:
		return "RC"
	case UC:
		return "UC"
	case UD:
		return "UD"
	}
	return fmt.Sprintf("QPType(%d)", uint8(t))
}

// QPConfig creates and connects a DUT QP to the bench: every parameter the scenarios
// depend on is explicit (the ibv_modify_qp attributes of INIT, RTR and RTS).
type QPConfig struct {
	Type QPType
	// BenchAddr is the bench's IP address: the QP's address vector (DGID ::ffff:BenchAddr).
	BenchAddr netip.Addr
	// BenchQPN is the bench's QPN (dest_qp_num; ignored for UD).
	BenchQPN uint32
	// BenchPSN is the first PSN the bench sends (the DUT's rq_psn).
	BenchPSN bth.PSN
	// DUTPSN is the DUT's first send PSN (sq_psn).
	DUTPSN bth.PSN
	// MTU is the path MTU in bytes (256..4096).
	MTU int
	// MinRNRTimer is the RNR NAK timer code the DUT's responder sends (IBTA 9.7.5.2.8).
	MinRNRTimer uint8
	// Timeout, RetryCnt and RNRRetry are the requester's ACK timeout code and retry counts.
	Timeout, RetryCnt, RNRRetry uint8
	// MaxDestRDAtomic is the number of responder resources for READ/atomic (IBTA 9.7.5.1.3).
	MaxDestRDAtomic uint8
	// MaxRDAtomic is the requester's outstanding READ/atomic limit.
	MaxRDAtomic uint8
	// Access is the QP's remote access flags (IBV_ACCESS_REMOTE_*).
	Access mr.Access
	// QKey is the UD QP's Q_Key (IBTA 10.2.4).
	QKey uint32
}

// MRConfig registers a DUT memory region.
type MRConfig struct {
	Size   int
	Access mr.Access
}

// MRInfo describes a registered DUT memory region.
type MRInfo struct {
	// ID names the region in later DUT calls.
	ID   int
	RKey uint32
	LKey uint32
	// VA is the address the bench puts in RETH/AtomicETH headers.
	VA   uint64
	Size int
}

// RecvConfig posts Count receive WRs, each one SGE of Len bytes at Off in region MR.
type RecvConfig struct {
	MR    int
	Off   int
	Len   int
	Count int
	// WRID is the first WR's ID; the next ones count up.
	WRID uint64
}

// SendOp is a send WR opcode (ibv_wr_opcode numbering).
type SendOp uint8

// Send WR opcodes the DUTs support.
const (
	SendWrite    SendOp = 0
	SendWriteImm SendOp = 1
	SendSend     SendOp = 2
	SendSendImm  SendOp = 3
	SendRead     SendOp = 4
	SendCmpSwap  SendOp = 5
	SendFetchAdd SendOp = 6
)

// SendConfig posts one signaled send WR on a DUT QP (the DUT as requester).
type SendConfig struct {
	Op SendOp
	// MR, Off and Len give the local buffer (one SGE; Len 0 = no SGE).
	MR, Off, Len int
	// RemoteVA and RKey address the bench's memory for RDMA and atomics.
	RemoteVA uint64
	RKey     uint32
	Imm      uint32
	// CompareAdd and Swap are the atomic operands.
	CompareAdd, Swap uint64
	WRID             uint64
	// RemoteQPN and RemoteQKey address a UD send.
	RemoteQPN, RemoteQKey uint32
}

// Completion is one work completion read from a DUT CQ (ibv_wc).
type Completion struct {
	WRID    uint64
	Status  cq.Status
	Opcode  cq.Opcode
	ByteLen uint32
	// Imm is the immediate data as read big-endian from the wire.
	Imm   uint32
	Flags cq.Flags
	SrcQP uint32
}

// String formats the completion for logs and diffs.
func (c Completion) String() string {
	return fmt.Sprintf("{wrid=%d status=%v opcode=%d len=%d imm=%#x flags=%d src_qp=%#x}",
		c.WRID, c.Status, c.Opcode, c.ByteLen, c.Imm, c.Flags, c.SrcQP)
}

// QPState is a QP state (ibv_qp_state numbering, IBTA 10.3.1).
type QPState uint8

// QP states the scenarios check.
const (
	StateReset QPState = 0
	StateInit  QPState = 1
	StateRTR   QPState = 2
	StateRTS   QPState = 3
	StateSQD   QPState = 4
	StateSQE   QPState = 5
	StateErr   QPState = 6
)

var stateNames = [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"}

// String returns the state's name ("RTS", "ERR", ...).
func (s QPState) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("QPState(%d)", uint8(s))
}

// DUT is the device under test: what the bench needs to set up a scenario and read back
// its effects. Implementations: the softroce in-process DUT (NewSoftroce), and Client, which
// speaks the line protocol (proto.go) to an agent: the C agent against libibverbs that runs
// in the rxe lab guest (test/conform/agent), or Serve in front of any DUT.
// Methods are called from one goroutine at a time.
type DUT interface {
	// Name identifies the DUT ("softroce", "rxe", an agent address).
	Name() string
	// Addr is the DUT's RoCEv2 endpoint: the address and UDP port the bench sends to.
	Addr() netip.AddrPort
	RegMR(c MRConfig) (MRInfo, error)
	WriteMR(id, off int, data []byte) error
	ReadMR(id, off, n int) ([]byte, error)
	DeregMR(id int) error
	// CreateQP creates a QP and moves it to RTS (RC/UC: connected to the bench QP;
	// UD: RTS with QKey). It returns the DUT's QPN.
	CreateQP(c QPConfig) (uint32, error)
	PostRecv(qpn uint32, r RecvConfig) error
	PostSend(qpn uint32, s SendConfig) error
	// Poll waits up to wait for max completions on the QP's CQ (send and receive share
	// one) and returns those it got (possibly none).
	Poll(qpn uint32, max int, wait time.Duration) ([]Completion, error)
	State(qpn uint32) (QPState, error)
	DestroyQP(qpn uint32) error
	Close() error
}

// ErrDUT wraps an error the DUT reported (a failed verb, an unknown object).
var ErrDUT = errors.New("conform: DUT error")

// ErrProto reports a malformed control-protocol line.
var ErrProto = errors.New("conform: control protocol error")

func accessString(a mr.Access) string {
	var s []string
	for _, f := range []struct {
		b mr.Access
		n string
	}{{mr.AccessLocalWrite, "LW"}, {mr.AccessRemoteWrite, "RW"}, {mr.AccessRemoteRead, "RR"}, {mr.AccessRemoteAtomic, "RA"}, {mr.AccessFlushGlobal, "FG"}, {mr.AccessFlushPersistent, "FP"}} {
		if a&f.b != 0 {
			s = append(s, f.n)
		}
	}
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, "|")
}
