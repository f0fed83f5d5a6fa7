package qp

import "github.com/softroce/softroce/internal/mr"

// DeviceCapFlags are ibv_device_cap_flags bits.
type DeviceCapFlags uint64

// Device capability flags (ibv_device_cap_flags / ib_device_cap_flags values).
const (
	DevCapResizeMaxWR     DeviceCapFlags = 1 << 0
	DevCapBadPKeyCntr     DeviceCapFlags = 1 << 1
	DevCapBadQKeyCntr     DeviceCapFlags = 1 << 2
	DevCapRawMulti        DeviceCapFlags = 1 << 3
	DevCapAutoPathMig     DeviceCapFlags = 1 << 4
	DevCapChangePhyPort   DeviceCapFlags = 1 << 5
	DevCapUDAVPortEnforce DeviceCapFlags = 1 << 6
	DevCapCurrQPStateMod  DeviceCapFlags = 1 << 7
	DevCapShutdownPort    DeviceCapFlags = 1 << 8
	DevCapPortActiveEvent DeviceCapFlags = 1 << 10
	DevCapSysImageGUID    DeviceCapFlags = 1 << 11
	DevCapRCRNRNAKGen     DeviceCapFlags = 1 << 12
	DevCapSRQResize       DeviceCapFlags = 1 << 13
	DevCapNMakeFatal      DeviceCapFlags = 1 << 14
	DevCapMemWindow       DeviceCapFlags = 1 << 17
	DevCapUDIPCsum        DeviceCapFlags = 1 << 18
	DevCapXRC             DeviceCapFlags = 1 << 20
	DevCapMemMgtExt       DeviceCapFlags = 1 << 21
	DevCapMemWindowType2A DeviceCapFlags = 1 << 23
	DevCapMemWindowType2B DeviceCapFlags = 1 << 24
	// The memory placement capabilities (IBTA 1.5 Annex A19) of device_cap_flags_ex, in the
	// kernel's numbering (IB_UVERBS_DEVICE_FLUSH_GLOBAL, _FLUSH_PERSISTENT, _ATOMIC_WRITE),
	// which rxe reports: FLUSH with each placement type, and RDMA ATOMIC WRITE. Beyond the 32
	// bits of ibv_device_attr.device_cap_flags.
	DevCapFlushGlobal     DeviceCapFlags = 1 << 38
	DevCapFlushPersistent DeviceCapFlags = 1 << 39
	DevCapAtomicWrite     DeviceCapFlags = 1 << 40
)

// AtomicCap is ibv_atomic_cap.
type AtomicCap uint8

// Atomic capabilities.
const (
	AtomicNone AtomicCap = 0 // IBV_ATOMIC_NONE
	AtomicHCA  AtomicCap = 1 // IBV_ATOMIC_HCA: atomic only among this device's QPs
	AtomicGlob AtomicCap = 2 // IBV_ATOMIC_GLOB: atomic with respect to the CPU too
)

// DeviceAttr is the ibv_query_device attribute set (ibv_device_attr + the max inline size).
type DeviceAttr struct {
	FWVer                 string
	NodeGUID              uint64
	SysImageGUID          uint64
	MaxMRSize             uint64
	PageSizeCap           uint64
	VendorID              uint32
	VendorPartID          uint32
	HWVer                 uint32
	MaxQP                 int
	MaxQPWR               int
	DeviceCapFlags        DeviceCapFlags
	MaxSGE                int
	MaxSGERD              int
	MaxCQ                 int
	MaxCQE                int
	MaxMR                 int
	MaxPD                 int
	MaxQPRDAtom           int
	MaxEECRDAtom          int
	MaxResRDAtom          int
	MaxQPInitRDAtom       int
	MaxEEInitRDAtom       int
	AtomicCap             AtomicCap
	MaxEE                 int
	MaxRDD                int
	MaxMW                 int
	MaxRawIPv6QP          int
	MaxRawEthyQP          int
	MaxMcastGrp           int
	MaxMcastQPAttach      int
	MaxTotalMcastQPAttach int
	MaxAH                 int
	MaxSRQ                int
	MaxSRQWR              int
	MaxSRQSGE             int
	MaxPKeys              int
	LocalCAAckDelay       uint8
	PhysPortCnt           uint8
	// MaxInlineData is the largest IBV_SEND_INLINE payload (ibv_qp_cap.max_inline_data bound).
	MaxInlineData int
	// MaxMsgSize is the largest message (port max_msg_sz).
	MaxMsgSize uint32
}

// Defaults: what kernel rxe 6.1 (rxe_param.h with DEFAULT_MAX_VALUE = 1<<20, as the lab
// kernel reports it) sets, except MaxQP (a device preallocates its QPN table: 1 MiB at 64 Ki
// QPs, 8 MiB at rxe's 1 Mi) and MaxPKeys (one P_Key table entry, as rxe's pkey_tbl_len);
// docs/objects.md explains each.
const (
	DefaultMaxQP         = 0x10000
	DefaultMaxQPWR       = 0x100000
	DefaultMaxInlineData = 512
	DefaultMaxSGE        = 32
	DefaultMaxCQ         = 0x100000
	DefaultMaxCQE        = 1<<15 - 1
	DefaultMaxMR         = 0x7ffff
	DefaultMaxPD         = 0x100000
	DefaultMaxQPRDAtom   = 128
	DefaultMaxResRDAtom  = 0x3f000
	DefaultMaxMW         = 0x7ffff
	DefaultMaxSRQ        = 0xdffff
	DefaultMaxSRQWR      = 0x100000
	DefaultMaxSRQSGE     = 27
	DefaultMaxPKeys      = 1
	DefaultMaxMsgSize    = 0x800000
	DefaultMaxAH         = 0x8000
	// VendorID is the IEEE OUI rdma-core reports for software devices (0xFFFFFF).
	VendorID = 0xFFFFFF
)

// DefaultDeviceAttr returns the device attributes softroce reports, no smaller than rxe's.
func DefaultDeviceAttr() DeviceAttr {
	return DeviceAttr{
		FWVer:        "0.0.0",
		MaxMRSize:    ^uint64(0),
		PageSizeCap:  0xfffff000,
		VendorID:     VendorID,
		VendorPartID: 0,
		HWVer:        0,
		MaxQP:        DefaultMaxQP,
		MaxQPWR:      DefaultMaxQPWR,
		DeviceCapFlags: DevCapBadPKeyCntr | DevCapBadQKeyCntr | DevCapAutoPathMig |
			DevCapChangePhyPort | DevCapUDAVPortEnforce | DevCapPortActiveEvent |
			DevCapSysImageGUID | DevCapRCRNRNAKGen | DevCapSRQResize | DevCapMemMgtExt |
			DevCapMemWindow | DevCapMemWindowType2B |
			DevCapFlushGlobal | DevCapFlushPersistent | DevCapAtomicWrite,
		MaxSGE:                DefaultMaxSGE,
		MaxSGERD:              DefaultMaxSGE,
		MaxCQ:                 DefaultMaxCQ,
		MaxCQE:                DefaultMaxCQE,
		MaxMR:                 DefaultMaxMR,
		MaxPD:                 DefaultMaxPD,
		MaxQPRDAtom:           DefaultMaxQPRDAtom,
		MaxEECRDAtom:          0,
		MaxResRDAtom:          DefaultMaxResRDAtom,
		MaxQPInitRDAtom:       DefaultMaxQPRDAtom,
		AtomicCap:             AtomicGlob,
		MaxMW:                 DefaultMaxMW,
		MaxMcastGrp:           0, // no multicast groups (multicast QPN dropped, attach EOPNOTSUPP); rxe 8192
		MaxMcastQPAttach:      0, // rxe 56
		MaxTotalMcastQPAttach: 0, // rxe 0x70000
		MaxAH:                 DefaultMaxAH,
		MaxSRQ:                DefaultMaxSRQ,
		MaxSRQWR:              DefaultMaxSRQWR,
		MaxSRQSGE:             DefaultMaxSRQSGE,
		MaxPKeys:              DefaultMaxPKeys,
		LocalCAAckDelay:       15,
		PhysPortCnt:           1,
		MaxInlineData:         DefaultMaxInlineData,
		MaxMsgSize:            DefaultMaxMsgSize,
	}
}

// TableOptions returns the internal/mr table limits matching the device attributes.
func (d *DeviceAttr) TableOptions() mr.TableOptions {
	return mr.TableOptions{MaxMR: d.MaxMR, MaxPD: d.MaxPD, MaxMW: d.MaxMW}
}

// PortState is ibv_port_state.
type PortState uint8

// Port states.
const (
	PortNop         PortState = 0
	PortDown        PortState = 1
	PortInit        PortState = 2
	PortArmed       PortState = 3
	PortActive      PortState = 4
	PortActiveDefer PortState = 5
)

// LinkLayer is the port link layer (IBV_LINK_LAYER_*).
type LinkLayer uint8

// Link layers.
const (
	LinkLayerUnspecified LinkLayer = 0
	LinkLayerInfiniBand  LinkLayer = 1
	LinkLayerEthernet    LinkLayer = 2
)

// PortCapFlags are ibv_port_cap_flags bits.
type PortCapFlags uint32

// Port capability flags used by softroce.
const (
	PortCapIPBasedGIDs PortCapFlags = 1 << 26 // IBV_PORT_IP_BASED_GIDS
)

// PortAttr is the ibv_query_port attribute set.
type PortAttr struct {
	State         PortState
	MaxMTU        MTU
	ActiveMTU     MTU
	GIDTblLen     int
	PortCapFlags  PortCapFlags
	MaxMsgSz      uint32
	BadPKeyCntr   uint32
	QKeyViolCntr  uint32
	PKeyTblLen    uint16
	LID           uint16
	SMLID         uint16
	LMC           uint8
	MaxVLNum      uint8
	SMSL          uint8
	SubnetTimeout uint8
	ActiveWidth   uint8 // IB_WIDTH_1X = 1
	ActiveSpeed   uint8 // 1 = SDR
	PhysState     uint8 // 5 = LinkUp, 2 = Polling
	LinkLayer     LinkLayer
}

// DefaultPortAttr returns the port attributes for a link with the given IP MTU: active MTU =
// the largest IB MTU <= netMTU - 80 (rxe: headers), capped at 4096 (1500 -> 1024).
func DefaultPortAttr(netMTU int) PortAttr {
	act := MTUFromBytes(netMTU - 80)
	st := PortActive
	if act == 0 {
		act = MTU256
		st = PortDown
	}
	return PortAttr{
		State:        st,
		MaxMTU:       MTU4096,
		ActiveMTU:    act,
		GIDTblLen:    1024,
		PortCapFlags: PortCapIPBasedGIDs,
		MaxMsgSz:     DefaultMaxMsgSize,
		PKeyTblLen:   1,
		MaxVLNum:     1,
		ActiveWidth:  1,
		ActiveSpeed:  1,
		PhysState:    5,
		LinkLayer:    LinkLayerEthernet,
	}
}
