package roce

// The verbs types, re-exported: a program using the device or the Verbs API imports this
// package only. Each name is an alias of the engine's own type (internal/qp, internal/mr,
// internal/cq, internal/event, internal/clock, internal/gid), so values pass between the
// two without conversion and the engine's documentation of the type applies. The
// constants keep the engine's names (the ibverbs enumerations: WRSend is IBV_WR_SEND,
// StatusSuccess IBV_WC_SUCCESS, AccessRemoteWrite IBV_ACCESS_REMOTE_WRITE); the
// asynchronous event types take an Event prefix (EventQPFatal is IBV_EVENT_QP_FATAL),
// since the port states already use the Port names. test/layout checks that every
// engine type the public API shows has a name here.

import (
	"time"

	"github.com/softroce/softroce/internal/cc"
	"github.com/softroce/softroce/internal/clock"
	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/event"
	"github.com/softroce/softroce/internal/gid"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
)

// Work requests (ibv_send_wr, ibv_recv_wr, ibv_sge).

// SendWR is qp.SendWR: a send work request (ibv_send_wr): SEND, RDMA WRITE/READ, atomics, local invalidate, memory-window bind.
type SendWR = qp.SendWR

// RecvWR is qp.RecvWR: a receive work request (ibv_recv_wr).
type RecvWR = qp.RecvWR

// SGE is qp.SGE: one scatter/gather element (ibv_sge): an iova range of a registered MR and its L_Key.
type SGE = qp.SGE

// WROpcode is qp.WROpcode: the operation of a SendWR (ibv_wr_opcode).
type WROpcode = qp.WROpcode

// The WROpcode values (qp).
const (
	WRAtomicCmpAndSwp   = qp.WRAtomicCmpAndSwp
	WRAtomicFetchAndAdd = qp.WRAtomicFetchAndAdd
	WRAtomicWrite       = qp.WRAtomicWrite
	WRBindMW            = qp.WRBindMW
	WRFlush             = qp.WRFlush
	WRLocalInv          = qp.WRLocalInv
	WRRDMARead          = qp.WRRDMARead
	WRRDMAWrite         = qp.WRRDMAWrite
	WRRDMAWriteWithImm  = qp.WRRDMAWriteWithImm
	WRSend              = qp.WRSend
	WRSendWithImm       = qp.WRSendWithImm
	WRSendWithInv       = qp.WRSendWithInv
)

// SendFlags is qp.SendFlags: the flags of a SendWR (ibv_send_flags).
type SendFlags = qp.SendFlags

// The SendFlags values (qp).
const (
	SendFence     = qp.SendFence
	SendInline    = qp.SendInline
	SendSignaled  = qp.SendSignaled
	SendSolicited = qp.SendSolicited
)

// BindInfo is qp.BindInfo: the memory-window bind of a WRBindMW work request (ibv_mw_bind_info).
type BindInfo = qp.BindInfo

// FlushType is qp.FlushType: the placement type of a WRFlush (ibv_placement_type).
type FlushType = qp.FlushType

// The FlushType values (qp).
const (
	FlushGlobal     = qp.FlushGlobal
	FlushPersistent = qp.FlushPersistent
)

// FlushLevel is qp.FlushLevel: the selectivity level of a WRFlush (ibv_selectivity_level).
type FlushLevel = qp.FlushLevel

// The FlushLevel values (qp).
const (
	FlushMR    = qp.FlushMR
	FlushRange = qp.FlushRange
)

// Queue pairs (ibv_qp_attr, ibv_qp_cap, ibv_ah_attr).

// QPType is qp.Type: the transport of a QP (ibv_qp_type).
type QPType = qp.Type

// The QPType values (qp).
const (
	TypeGSI = qp.TypeGSI
	TypeRC  = qp.TypeRC
	TypeUC  = qp.TypeUC
	TypeUD  = qp.TypeUD
)

// QPState is qp.State: a QP state (ibv_qp_state).
type QPState = qp.State

// The QPState values (qp).
const (
	StateErr   = qp.StateErr
	StateInit  = qp.StateInit
	StateRTR   = qp.StateRTR
	StateRTS   = qp.StateRTS
	StateReset = qp.StateReset
	StateSQD   = qp.StateSQD
	StateSQE   = qp.StateSQE
)

// QPAttr is qp.Attr: the attributes QueuePair.Modify sets and Query returns (ibv_qp_attr).
type QPAttr = qp.Attr

// QPAttrMask is qp.AttrMask: which QPAttr fields a Modify sets (ibv_qp_attr_mask).
type QPAttrMask = qp.AttrMask

// The QPAttrMask values (qp).
const (
	AttrAV               = qp.AttrAV
	AttrAccessFlags      = qp.AttrAccessFlags
	AttrAltPath          = qp.AttrAltPath
	AttrCap              = qp.AttrCap
	AttrCurState         = qp.AttrCurState
	AttrDestQPN          = qp.AttrDestQPN
	AttrEnSQDAsyncNotify = qp.AttrEnSQDAsyncNotify
	AttrMaxDestRDAtomic  = qp.AttrMaxDestRDAtomic
	AttrMaxQPRDAtomic    = qp.AttrMaxQPRDAtomic
	AttrMinRNRTimer      = qp.AttrMinRNRTimer
	AttrPKeyIndex        = qp.AttrPKeyIndex
	AttrPathMTU          = qp.AttrPathMTU
	AttrPathMigState     = qp.AttrPathMigState
	AttrPort             = qp.AttrPort
	AttrQKey             = qp.AttrQKey
	AttrRNRRetry         = qp.AttrRNRRetry
	AttrRQPSN            = qp.AttrRQPSN
	AttrRateLimit        = qp.AttrRateLimit
	AttrRetryCnt         = qp.AttrRetryCnt
	AttrSQPSN            = qp.AttrSQPSN
	AttrSelectiveRepeat  = qp.AttrSelectiveRepeat
	AttrState            = qp.AttrState
	AttrTimeout          = qp.AttrTimeout
)

// QPCap is qp.Cap: the queue sizes of a QP (ibv_qp_cap).
type QPCap = qp.Cap

// MTU is qp.MTU: a path MTU (ibv_mtu).
type MTU = qp.MTU

// The MTU values (qp).
const (
	MTU1024 = qp.MTU1024
	MTU2048 = qp.MTU2048
	MTU256  = qp.MTU256
	MTU4096 = qp.MTU4096
	MTU512  = qp.MTU512
)

// MigState is qp.MigState: the path migration state (ibv_mig_state).
type MigState = qp.MigState

// The MigState values (qp).
const (
	MigArmed    = qp.MigArmed
	MigMigrated = qp.MigMigrated
	MigRearm    = qp.MigRearm
)

// AHAttr is qp.AHAttr: an address vector (ibv_ah_attr): DGID is the peer's IP address, SGIDIndex the local GID.
type AHAttr = qp.AHAttr

// AH is qp.AH: an address handle for UD sends (ibv_ah).
type AH = qp.AH

// ModifyError is qp.ModifyError: why a Modify was refused (errors.Is(err, ErrModify)).
type ModifyError = qp.ModifyError

// Shared receive queues (ibv_srq_init_attr, ibv_srq_attr).

// SRQ is qp.SRQ: a shared receive queue (ibv_srq).
type SRQ = qp.SRQ

// SRQOptions is qp.SRQOptions: the sizes and limit of a new SRQ (ibv_srq_init_attr).
type SRQOptions = qp.SRQOptions

// SRQAttr is qp.SRQAttr: the attributes of an SRQ (ibv_srq_attr).
type SRQAttr = qp.SRQAttr

// SRQAttrMask is qp.SRQAttrMask: which SRQAttr fields a Modify sets (ibv_srq_attr_mask).
type SRQAttrMask = qp.SRQAttrMask

// The SRQAttrMask values (qp).
const (
	SRQLimit = qp.SRQLimit
	SRQMaxWR = qp.SRQMaxWR
)

// Device and port attributes, counters (ibv_device_attr, ibv_port_attr).

// DeviceAttr is qp.DeviceAttr: the device attributes (ibv_device_attr).
type DeviceAttr = qp.DeviceAttr

// DeviceCapFlags is qp.DeviceCapFlags: DeviceAttr.DeviceCapFlags (ibv_device_cap_flags).
type DeviceCapFlags = qp.DeviceCapFlags

// The DeviceCapFlags values (qp).
const (
	DevCapAutoPathMig     = qp.DevCapAutoPathMig
	DevCapBadPKeyCntr     = qp.DevCapBadPKeyCntr
	DevCapBadQKeyCntr     = qp.DevCapBadQKeyCntr
	DevCapChangePhyPort   = qp.DevCapChangePhyPort
	DevCapAtomicWrite     = qp.DevCapAtomicWrite
	DevCapCurrQPStateMod  = qp.DevCapCurrQPStateMod
	DevCapFlushGlobal     = qp.DevCapFlushGlobal
	DevCapFlushPersistent = qp.DevCapFlushPersistent
	DevCapMemMgtExt       = qp.DevCapMemMgtExt
	DevCapMemWindow       = qp.DevCapMemWindow
	DevCapMemWindowType2A = qp.DevCapMemWindowType2A
	DevCapMemWindowType2B = qp.DevCapMemWindowType2B
	DevCapNMakeFatal      = qp.DevCapNMakeFatal
	DevCapPortActiveEvent = qp.DevCapPortActiveEvent
	DevCapRCRNRNAKGen     = qp.DevCapRCRNRNAKGen
	DevCapRawMulti        = qp.DevCapRawMulti
	DevCapResizeMaxWR     = qp.DevCapResizeMaxWR
	DevCapSRQResize       = qp.DevCapSRQResize
	DevCapShutdownPort    = qp.DevCapShutdownPort
	DevCapSysImageGUID    = qp.DevCapSysImageGUID
	DevCapUDAVPortEnforce = qp.DevCapUDAVPortEnforce
	DevCapUDIPCsum        = qp.DevCapUDIPCsum
	DevCapXRC             = qp.DevCapXRC
)

// AtomicCap is qp.AtomicCap: DeviceAttr.AtomicCap (ibv_atomic_cap).
type AtomicCap = qp.AtomicCap

// The AtomicCap values (qp).
const (
	AtomicGlob = qp.AtomicGlob
	AtomicHCA  = qp.AtomicHCA
	AtomicNone = qp.AtomicNone
)

// PortAttr is qp.PortAttr: the attributes of port 1 (ibv_port_attr).
type PortAttr = qp.PortAttr

// PortState is qp.PortState: PortAttr.State (ibv_port_state).
type PortState = qp.PortState

// The PortState values (qp).
const (
	PortActive      = qp.PortActive
	PortActiveDefer = qp.PortActiveDefer
	PortArmed       = qp.PortArmed
	PortDown        = qp.PortDown
	PortInit        = qp.PortInit
	PortNop         = qp.PortNop
)

// PortCapFlags is qp.PortCapFlags: PortAttr.PortCapFlags (ibv_port_cap_flags).
type PortCapFlags = qp.PortCapFlags

// The PortCapFlags values (qp).
const (
	PortCapIPBasedGIDs = qp.PortCapIPBasedGIDs
)

// LinkLayer is qp.LinkLayer: PortAttr.LinkLayer.
type LinkLayer = qp.LinkLayer

// The LinkLayer values (qp).
const (
	LinkLayerEthernet    = qp.LinkLayerEthernet
	LinkLayerInfiniBand  = qp.LinkLayerInfiniBand
	LinkLayerUnspecified = qp.LinkLayerUnspecified
)

// Stats is qp.Stats: the device counters; Map gives rxe's hw_counters names.
type Stats = qp.Stats

// Memory (ibv_pd, ibv_mr, ibv_access_flags).

// PD is mr.PD: a protection domain (ibv_pd).
type PD = mr.PD

// MR is mr.MR: a memory region (ibv_mr).
type MR = mr.MR

// Access is mr.Access: the access flags of an MR or a QP (ibv_access_flags).
type Access = mr.Access

// The Access values (mr).
const (
	AccessFlushGlobal     = mr.AccessFlushGlobal
	AccessFlushPersistent = mr.AccessFlushPersistent
	AccessLocalWrite      = mr.AccessLocalWrite
	AccessMWBind          = mr.AccessMWBind
	AccessRemoteAtomic    = mr.AccessRemoteAtomic
	AccessRemoteRead      = mr.AccessRemoteRead
	AccessRemoteWrite     = mr.AccessRemoteWrite
	AccessZeroBased       = mr.AccessZeroBased
)

// ReregOptions is mr.ReregOptions: what MR.Rereg changes (ibv_rereg_mr).
type ReregOptions = mr.ReregOptions

// ReregFlags is mr.ReregFlags: the parts of an MR a re-registration changes
// (IBV_REREG_MR_CHANGE_*).
type ReregFlags = mr.ReregFlags

// The ReregFlags values (mr).
const (
	ReregAccess      = mr.ReregAccess
	ReregAll         = mr.ReregAll
	ReregPD          = mr.ReregPD
	ReregTranslation = mr.ReregTranslation
)

// MWType is mr.MWType: a memory window's type (ibv_mw_type).
type MWType = mr.MWType

// The MWType values (mr).
const (
	MWType1 = mr.MWType1
	MWType2 = mr.MWType2
)

// Completions (ibv_cq, ibv_wc).

// CQ is cq.CQ: a completion queue (ibv_cq).
type CQ = cq.CQ

// WC is cq.WC: a work completion (ibv_wc).
type WC = cq.WC

// WCStatus is cq.Status: the status of a WC (ibv_wc_status).
type WCStatus = cq.Status

// The WCStatus values (cq).
const (
	StatusBadRespErr     = cq.StatusBadRespErr
	StatusFatalErr       = cq.StatusFatalErr
	StatusGeneralErr     = cq.StatusGeneralErr
	StatusInvEECNErr     = cq.StatusInvEECNErr
	StatusInvEECStateErr = cq.StatusInvEECStateErr
	StatusLocAccessErr   = cq.StatusLocAccessErr
	StatusLocEECOpErr    = cq.StatusLocEECOpErr
	StatusLocLenErr      = cq.StatusLocLenErr
	StatusLocProtErr     = cq.StatusLocProtErr
	StatusLocQPOpErr     = cq.StatusLocQPOpErr
	StatusLocRDDViolErr  = cq.StatusLocRDDViolErr
	StatusMWBindErr      = cq.StatusMWBindErr
	StatusRNRRetryExcErr = cq.StatusRNRRetryExcErr
	StatusRemAbortErr    = cq.StatusRemAbortErr
	StatusRemAccessErr   = cq.StatusRemAccessErr
	StatusRemInvRDReqErr = cq.StatusRemInvRDReqErr
	StatusRemInvReqErr   = cq.StatusRemInvReqErr
	StatusRemOpErr       = cq.StatusRemOpErr
	StatusRespTimeoutErr = cq.StatusRespTimeoutErr
	StatusRetryExcErr    = cq.StatusRetryExcErr
	StatusSuccess        = cq.StatusSuccess
	StatusWRFlushErr     = cq.StatusWRFlushErr
)

// WCOpcode is cq.Opcode: the operation a WC completes (ibv_wc_opcode).
type WCOpcode = cq.Opcode

// The WCOpcode values (cq).
const (
	OpAtomicWrite     = cq.OpAtomicWrite
	OpBindMW          = cq.OpBindMW
	OpCompSwap        = cq.OpCompSwap
	OpFetchAdd        = cq.OpFetchAdd
	OpFlush           = cq.OpFlush
	OpLocalInv        = cq.OpLocalInv
	OpRDMARead        = cq.OpRDMARead
	OpRDMAWrite       = cq.OpRDMAWrite
	OpRecv            = cq.OpRecv
	OpRecvRDMAWithImm = cq.OpRecvRDMAWithImm
	OpSend            = cq.OpSend
)

// WCFlags is cq.Flags: the flags of a WC (ibv_wc_flags).
type WCFlags = cq.Flags

// The WCFlags values (cq).
const (
	FlagGRH     = cq.FlagGRH
	FlagWithImm = cq.FlagWithImm
	FlagWithInv = cq.FlagWithInv
)

// Moderation is cq.Moderation: CQ moderation (ibv_modify_cq with IBV_CQ_ATTR_MODERATE): the completion event waits for Count completions or PeriodUS microseconds; the zero value turns it off.
type Moderation = cq.Moderation

// Asynchronous events (ibv_async_event).

// Event is event.Event: one asynchronous event (ibv_async_event).
type Event = event.Event

// EventType is event.Type: the type of an Event (ibv_event_type).
type EventType = event.Type

// The EventType values (event).
const (
	EventCQErr            = event.CQErr
	EventClientReregister = event.ClientReregister
	EventCommEst          = event.CommEst
	EventDeviceFatal      = event.DeviceFatal
	EventGIDChange        = event.GIDChange
	EventLIDChange        = event.LIDChange
	EventPKeyChange       = event.PKeyChange
	EventPathMig          = event.PathMig
	EventPathMigErr       = event.PathMigErr
	EventPortActive       = event.PortActive
	EventPortErr          = event.PortErr
	EventQPAccessErr      = event.QPAccessErr
	EventQPFatal          = event.QPFatal
	EventQPLastWQEReached = event.QPLastWQEReached
	EventQPReqErr         = event.QPReqErr
	EventSMChange         = event.SMChange
	EventSQDrained        = event.SQDrained
	EventSRQErr           = event.SRQErr
	EventSRQLimitReached  = event.SRQLimitReached
	EventWQFatal          = event.WQFatal
)

// EventSink is event.Sink: a function that receives events synchronously (Options.Events).
type EventSink = event.Sink

// Time (Options.Clock).

// Clock is clock.Clock: the time source of the transport timers (retry, RNR, ACK coalescing) and CQ moderation.
type Clock = clock.Clock

// Timer is clock.Timer: a timer of a Clock.
type Timer = clock.Timer

// ManualClock is clock.Manual: a Clock that moves only when Advance is called, for tests.
type ManualClock = clock.Manual

// RealClock is clock.Real: the real clock (the default).
type RealClock = clock.Real

// GID table (Options.GIDs, Device.GIDTable).

// GIDTable is gid.Table: an immutable GID table laid out as rxe lays it out.
type GIDTable = gid.Table

// GIDEntry is gid.Entry: one GID table entry.
type GIDEntry = gid.Entry

// GIDOptions is gid.Options: the addresses, MAC and MTU NewGIDTable builds a table from.
type GIDOptions = gid.Options

// GIDType is gid.Type: the type of a GID (RoCEv2 only).
type GIDType = gid.Type

// The GIDType values (gid).
const (
	GIDTypeRoCEv2 = gid.TypeRoCEv2
)

// NewManualClock returns a ManualClock starting at start.
func NewManualClock(start time.Time) *ManualClock { return clock.NewManual(start) }

// NewGIDTable builds a GID table from a list of addresses (index 0 the fe80:: link-local GID
// derived from o.MAC, then the IPv4 addresses as ::ffff:a.b.c.d, then IPv6).
func NewGIDTable(o GIDOptions) *GIDTable { return gid.FromAddrs(o) }

// DefaultDeviceAttr returns the attributes a device has when Options.Attr is nil (rxe's
// limits), for a program that changes a few of them.
func DefaultDeviceAttr() DeviceAttr { return qp.DefaultDeviceAttr() }

// The errors of the verbs objects. They keep their identity through the daemon client, so
// errors.Is works in both modes.
var (
	ErrBadOpcode     = qp.ErrBadOpcode
	ErrBadWR         = qp.ErrBadWR
	ErrDestroyed     = qp.ErrDestroyed
	ErrHasSRQ        = qp.ErrHasSRQ
	ErrInlineTooLong = qp.ErrInlineTooLong
	ErrInvalidState  = qp.ErrInvalidState
	ErrModify        = qp.ErrModify
	ErrMsgTooLong    = qp.ErrMsgTooLong
	ErrQueueFull     = qp.ErrQueueFull
	ErrSRQArg        = qp.ErrSRQArg
	ErrSRQDestroyed  = qp.ErrSRQDestroyed
	ErrSRQFull       = qp.ErrSRQFull
	// ErrSelectiveRepeat: QPAttr.SelectiveRepeat asked of a QP that cannot have it (a daemon
	// client's QP).
	ErrSelectiveRepeat = qp.ErrSelectiveRepeat
	ErrTooManySGE      = qp.ErrTooManySGE
	ErrWRAtomicAlign   = qp.ErrWRAtomicAlign
	ErrWRInlineSize    = qp.ErrWRInlineSize
	ErrWRLength        = qp.ErrWRLength
	ErrWRNoAH          = qp.ErrWRNoAH
	ErrWRNoBind        = qp.ErrWRNoBind
	ErrWROpcode        = qp.ErrWROpcode
	ErrWRTooManySGE    = qp.ErrWRTooManySGE
	// ErrCQClosed is cq.ErrClosed: CompletionQueue.Wait on a destroyed CQ.
	ErrCQClosed = cq.ErrClosed
	ErrCQError  = cq.ErrCQError
	ErrCapacity = cq.ErrCapacity
)

// CCParams are the congestion control parameters of a device or a QP, under mlx5's names
// (Options.CC, QPInit.CC; docs/congestion.md): Set, Get and Parse take the names
// ("rp_ai_rate=1,np_min_time_between_cnps=50"), String writes them.
type CCParams = cc.Params

// DefaultCC returns the default congestion control: ECT(0) on requests, CNPs, DCQCN with
// NVIDIA's defaults.
func DefaultCC() CCParams { return cc.Defaults() }

// CCNames lists the congestion control parameters' names.
func CCNames() []string { return cc.Names() }

// CCUnit returns a congestion control parameter's unit ("us", "Mbit/s", ...).
func CCUnit(name string) string { return cc.Unit(name) }

// Budget is qp.Budget: an in-flight budget shared by a group of RC QPs (QPInit.Budget): the
// request packets they have sent and not seen acknowledged together, on top of each QP's own
// window (docs/engine.md, "In-flight budgets"). The daemon gives each user one.
type Budget = qp.Budget

// NewBudget returns a budget of limit request packets (PSNs) in flight.
func NewBudget(limit int) *Budget { return qp.NewBudget(limit) }

// CCState is a snapshot of a QP's congestion control (QP.CongestionState).
type CCState = qp.CCState
