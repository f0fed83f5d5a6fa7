// Long file: the Go twin of clib/include/softroce/proto.h, struct for struct in the header's
// order, so the two read side by side; TestWireLayoutMatchesC checks every offset, size and
// constant.

// Package wire is the Go twin of clib/include/softroce/proto.h: the daemon
// protocol's messages and shared-memory layouts as fixed-layout structs, field
// for field and byte for byte (TestWireLayoutMatchesC compiles the header
// and compares every offset, size and constant). docs/daemon-protocol.md is
// the spec.
//
// Every field sits at its natural alignment and every padding byte is a named
// blank field, so Go and C lay the structs out identically and a struct is
// sent as its memory (Append, Read): host byte order, which is little-endian
// on every platform softroce builds for. Wire structs hold only integers and
// byte arrays, so any byte pattern decodes to a valid value; the receiver
// checks ranges.
package wire

import "unsafe"

// Protocol identity.
const (
	Magic   = 0x31505253 // "SRP1" in memory
	Version = 3
	MaxMsg  = 256 << 10
)

// Socket defaults.
const (
	DefaultSocket = "/run/softroce/softroce.sock"
	SocketEnv     = "SOFTROCE_SOCKET"
)

// Op is a request opcode (sr_op).
type Op uint16

// Requests.
const (
	OpHello       Op = 1
	OpOpenRings   Op = 2
	OpAttachMem   Op = 3
	OpQueryDevice Op = 4
	OpQueryPort   Op = 5
	OpQueryGIDs   Op = 6
	OpQueryPKey   Op = 7
	OpStats       Op = 8
	OpDebug       Op = 9

	OpAllocPD    Op = 16
	OpDeallocPD  Op = 17
	OpRegMR      Op = 18
	OpDeregMR    Op = 19
	OpCreateCQ   Op = 20
	OpModifyCQ   Op = 21
	OpDestroyCQ  Op = 22
	OpCreateSRQ  Op = 23
	OpModifySRQ  Op = 24
	OpQuerySRQ   Op = 25
	OpDestroySRQ Op = 26
	OpCreateQP   Op = 27
	OpModifyQP   Op = 28
	OpQueryQP    Op = 29
	OpDestroyQP  Op = 30
	OpCreateAH   Op = 31
	OpAllocMW    Op = 32
	OpDeallocMW  Op = 33
	OpResizeCQ   Op = 34
	OpReregMR    Op = 35

	OpPostSend      Op = 48
	OpPostRecv      Op = 49
	OpPostSRQRecv   Op = 50
	OpPostSendAsync Op = 51
	OpPostRecvAsync Op = 52

	OpCMCreateChannel  Op = 64
	OpCMDestroyChannel Op = 65
	OpCMCreateID       Op = 66
	OpCMMigrateID      Op = 67
	OpCMDestroyID      Op = 68
	OpCMBindAddr       Op = 69
	OpCMResolveAddr    Op = 70
	OpCMResolveRoute   Op = 71
	OpCMSetQP          Op = 72
	OpCMInitQPAttr     Op = 73
	OpCMListen         Op = 74
	OpCMConnect        Op = 75
	OpCMAccept         Op = 76
	OpCMReject         Op = 77
	OpCMDisconnect     Op = 78
	OpCMGetEvents      Op = 79
	OpCMQueryID        Op = 80
	OpCMSetOption      Op = 81
	OpCMEstablish      Op = 82
)

// Hdr starts every message (sr_hdr).
type Hdr struct {
	Op     Op     `c:"op"`
	Flags  uint16 `c:"flags"`
	Status int32  `c:"status"` // responses: 0 or a positive errno value
}

// Err is the body of a failed response (sr_err); a message follows.
type Err struct {
	Code  uint32 `c:"code"`
	BadWR uint32 `c:"bad_wr"`
}

// Handle is a body naming one object (sr_handle).
type Handle struct {
	Handle uint32 `c:"handle"`
	_      uint32 `c:"reserved"`
}

// HelloReq is sr_hello_req.
type HelloReq struct {
	Magic   uint32 `c:"magic"`
	Version uint32 `c:"version"`
	Flags   uint32 `c:"flags"`
	_       uint32 `c:"reserved"`
}

// HelloResp is sr_hello_resp.
type HelloResp struct {
	Magic        uint32   `c:"magic"`
	Version      uint32   `c:"version"`
	MaxMsg       uint32   `c:"max_msg"`
	PhysPortCnt  uint32   `c:"phys_port_cnt"`
	NodeGUID     uint64   `c:"node_guid"`
	SysImageGUID uint64   `c:"sys_image_guid"`
	DevName      [64]byte `c:"dev_name"`
}

// OpenRingsResp is sr_open_rings_resp.
type OpenRingsResp struct {
	Bytes     uint32 `c:"bytes"`
	PostData  uint32 `c:"post_data"`
	EventOff  uint32 `c:"event_off"`
	EventCap  uint32 `c:"event_cap"`
	MaxRecord uint32 `c:"max_record"`
	_         uint32 `c:"reserved"`
}

// PortReq is sr_port_req.
type PortReq struct {
	Port uint32 `c:"port"`
	_    uint32 `c:"reserved"`
}

// DeviceAttr is sr_device_attr.
type DeviceAttr struct {
	FWVer                  [64]byte `c:"fw_ver"`
	NodeGUID               uint64   `c:"node_guid"`
	SysImageGUID           uint64   `c:"sys_image_guid"`
	MaxMRSize              uint64   `c:"max_mr_size"`
	PageSizeCap            uint64   `c:"page_size_cap"`
	VendorID               uint32   `c:"vendor_id"`
	VendorPartID           uint32   `c:"vendor_part_id"`
	HWVer                  uint32   `c:"hw_ver"`
	MaxQP                  int32    `c:"max_qp"`
	MaxQPWR                int32    `c:"max_qp_wr"`
	_                      uint32   `c:"reserved0"`
	DeviceCapFlags         uint64   `c:"device_cap_flags"`
	MaxSGE                 int32    `c:"max_sge"`
	MaxSGERD               int32    `c:"max_sge_rd"`
	MaxCQ                  int32    `c:"max_cq"`
	MaxCQE                 int32    `c:"max_cqe"`
	MaxMR                  int32    `c:"max_mr"`
	MaxPD                  int32    `c:"max_pd"`
	MaxQPRDAtom            int32    `c:"max_qp_rd_atom"`
	MaxEERDAtom            int32    `c:"max_ee_rd_atom"`
	MaxResRDAtom           int32    `c:"max_res_rd_atom"`
	MaxQPInitRDAtom        int32    `c:"max_qp_init_rd_atom"`
	MaxEEInitRDAtom        int32    `c:"max_ee_init_rd_atom"`
	AtomicCap              uint32   `c:"atomic_cap"`
	MaxEE                  int32    `c:"max_ee"`
	MaxRDD                 int32    `c:"max_rdd"`
	MaxMW                  int32    `c:"max_mw"`
	MaxRawIPv6QP           int32    `c:"max_raw_ipv6_qp"`
	MaxRawEthyQP           int32    `c:"max_raw_ethy_qp"`
	MaxMcastGrp            int32    `c:"max_mcast_grp"`
	MaxMcastQPAttach       int32    `c:"max_mcast_qp_attach"`
	MaxTotalMcastQPAttach  int32    `c:"max_total_mcast_qp_attach"`
	MaxAH                  int32    `c:"max_ah"`
	MaxSRQ                 int32    `c:"max_srq"`
	MaxSRQWR               int32    `c:"max_srq_wr"`
	MaxSRQSGE              int32    `c:"max_srq_sge"`
	MaxPKeys               uint16   `c:"max_pkeys"`
	LocalCAAckDelay        uint8    `c:"local_ca_ack_delay"`
	PhysPortCnt            uint8    `c:"phys_port_cnt"`
	MaxInlineData          uint32   `c:"max_inline_data"`
	MaxMsgSize             uint32   `c:"max_msg_size"`
	MaxCQModerationCount   uint16   `c:"max_cq_moderation_count"`
	MaxCQModerationPeriodU uint16   `c:"max_cq_moderation_period"`
}

// PortAttr is sr_port_attr.
type PortAttr struct {
	State         uint32 `c:"state"`
	MaxMTU        uint32 `c:"max_mtu"`
	ActiveMTU     uint32 `c:"active_mtu"`
	GIDTblLen     int32  `c:"gid_tbl_len"`
	PortCapFlags  uint32 `c:"port_cap_flags"`
	MaxMsgSz      uint32 `c:"max_msg_sz"`
	BadPKeyCntr   uint32 `c:"bad_pkey_cntr"`
	QKeyViolCntr  uint32 `c:"qkey_viol_cntr"`
	PKeyTblLen    uint16 `c:"pkey_tbl_len"`
	LID           uint16 `c:"lid"`
	SMLID         uint16 `c:"sm_lid"`
	LMC           uint8  `c:"lmc"`
	MaxVLNum      uint8  `c:"max_vl_num"`
	SMSL          uint8  `c:"sm_sl"`
	SubnetTimeout uint8  `c:"subnet_timeout"`
	InitTypeReply uint8  `c:"init_type_reply"`
	ActiveWidth   uint8  `c:"active_width"`
	ActiveSpeed   uint8  `c:"active_speed"`
	PhysState     uint8  `c:"phys_state"`
	LinkLayer     uint8  `c:"link_layer"`
	Flags         uint8  `c:"flags"`
	PortCapFlags2 uint16 `c:"port_cap_flags2"`
	_             uint16 `c:"reserved"`
	ActiveSpeedEx uint32 `c:"active_speed_ex"`
}

// GIDsResp is sr_gids_resp; Count GIDEntry values follow.
type GIDsResp struct {
	Count uint32 `c:"count"`
	_     uint32 `c:"reserved"`
}

// GID types (ibv_gid_type).
const GIDTypeRoCEv2 = 2

// GIDEntry is sr_gid_entry.
type GIDEntry struct {
	GID         [16]byte `c:"gid"`
	GIDIndex    uint32   `c:"gid_index"`
	PortNum     uint32   `c:"port_num"`
	GIDType     uint32   `c:"gid_type"`
	NdevIfindex uint32   `c:"ndev_ifindex"`
	NdevName    [16]byte `c:"ndev_name"`
}

// PKeyReq is sr_pkey_req.
type PKeyReq struct {
	Port  uint32 `c:"port"`
	Index uint32 `c:"index"`
}

// PKeyResp is sr_pkey_resp.
type PKeyResp struct {
	PKey uint16 `c:"pkey"`
	_    uint16 `c:"reserved"`
	_    uint32 `c:"reserved2"`
}

// Stats is sr_stats.
type Stats struct {
	SentPkts             uint64 `c:"sent_pkts"`
	RcvdPkts             uint64 `c:"rcvd_pkts"`
	DuplicateRequest     uint64 `c:"duplicate_request"`
	OutOfSeqRequest      uint64 `c:"out_of_seq_request"`
	RcvdRNRErr           uint64 `c:"rcvd_rnr_err"`
	SendRNRErr           uint64 `c:"send_rnr_err"`
	RcvdSeqErr           uint64 `c:"rcvd_seq_err"`
	AckDeferred          uint64 `c:"ack_deferred"`
	RetryExceededErr     uint64 `c:"retry_exceeded_err"`
	RetryRNRExceededErr  uint64 `c:"retry_rnr_exceeded_err"`
	CompleterRetryErr    uint64 `c:"completer_retry_err"`
	SendErr              uint64 `c:"send_err"`
	RDMASends            uint64 `c:"rdma_sends"`
	RDMARecvs            uint64 `c:"rdma_recvs"`
	LinkDowned           uint64 `c:"link_downed"`
	RcvdICRCSolved       uint64 `c:"rcvd_icrc_solved"`
	RcvdDropped          uint64 `c:"rcvd_dropped"`
	RetransPkts          uint64 `c:"retransmitted_pkts"`
	RcvdGSOSplit         uint64 `c:"rcvd_gso_split"`
	LinkEntropySockets   uint64 `c:"link_entropy_sockets"`
	LinkEntropyFallbacks uint64 `c:"link_entropy_fallbacks"`
	LinkOffloadFallbacks uint64 `c:"link_offload_fallbacks"`
	NPECNMarked          uint64 `c:"np_ecn_marked_roce_packets"`
	NPCNPSent            uint64 `c:"np_cnp_sent"`
	RPCNPHandled         uint64 `c:"rp_cnp_handled"`
	RPCNPIgnored         uint64 `c:"rp_cnp_ignored"`
}

// Debug is sr_debug.
type Debug struct {
	Clients        int64             `c:"clients"`
	PDs            int64             `c:"pds"`
	MRs            int64             `c:"mrs"`
	CQs            int64             `c:"cqs"`
	SRQs           int64             `c:"srqs"`
	QPs            int64             `c:"qps"`
	CMIDs          int64             `c:"cm_ids"`
	MappedBytes    int64             `c:"mapped_bytes"`
	FDs            int64             `c:"fds"`
	EntropySockets int64             `c:"entropy_sockets"`
	Goroutines     int64             `c:"goroutines"`
	RingPosts      uint64            `c:"ring_posts"`
	SocketPosts    uint64            `c:"socket_posts"`
	Refills        uint64            `c:"refills"`
	MinePDs        int64             `c:"mine_pds"`
	MineMRs        int64             `c:"mine_mrs"`
	MineCQs        int64             `c:"mine_cqs"`
	MineSRQs       int64             `c:"mine_srqs"`
	MineQPs        int64             `c:"mine_qps"`
	MineCMIDs      int64             `c:"mine_cm_ids"`
	MineCMChannels int64             `c:"mine_cm_channels"`
	CMChannels     int64             `c:"cm_channels"`
	AcceptBackoffs uint64            `c:"accept_backoffs"`
	BadPosts       uint64            `c:"bad_posts"`
	DroppedEvents  uint64            `c:"dropped_events"`
	CMListens      int64             `c:"cm_listens"`
	DrainYields    uint64            `c:"drain_yields"`
	UID            uint32            `c:"uid"`
	_              uint32            `c:"reserved"`
	User           [UsageCount]int64 `c:"user"`
	UserLimit      [UsageCount]int64 `c:"user_limit"`
	Refused        [UsageCount]int64 `c:"refused"`
	RefusedPriv    uint64            `c:"refused_privileged"`
}

// The resources the daemon limits per user, in the order of Debug's arrays (sr_usage).
const (
	UsageConns       = 0
	UsageFDs         = 1
	UsagePDs         = 2
	UsageMRs         = 3
	UsageCQs         = 4
	UsageSRQs        = 5
	UsageQPs         = 6
	UsageCMIDs       = 7
	UsageMappedBytes = 8
	UsageMappings    = 9
	UsageEngineBytes = 10
	UsageCount       = 11
)

// Memory sources of RegMRReq (sr_mr_source).
const (
	MRProcess = 1
	MRMemfd   = 2
)

// RegMRReq is sr_reg_mr_req.
type RegMRReq struct {
	PD     uint32 `c:"pd"`
	Access uint32 `c:"access"`
	Addr   uint64 `c:"addr"`
	Length uint64 `c:"length"`
	IOVA   uint64 `c:"iova"`
	Offset uint64 `c:"offset"`
	Source uint32 `c:"source"`
	_      uint32 `c:"reserved"`
}

// RegMRResp is sr_reg_mr_resp.
type RegMRResp struct {
	Handle uint32 `c:"handle"`
	LKey   uint32 `c:"lkey"`
	RKey   uint32 `c:"rkey"`
	_      uint32 `c:"reserved"`
}

// ReregMRReq is sr_rereg_mr_req.
type ReregMRReq struct {
	Handle uint32 `c:"handle"`
	Flags  uint32 `c:"flags"`
	PD     uint32 `c:"pd"`
	Access uint32 `c:"access"`
	Addr   uint64 `c:"addr"`
	Length uint64 `c:"length"`
	IOVA   uint64 `c:"iova"`
	Offset uint64 `c:"offset"`
	Source uint32 `c:"source"`
	_      uint32 `c:"reserved"`
}

// ReregMRResp is sr_rereg_mr_resp.
type ReregMRResp struct {
	LKey uint32 `c:"lkey"`
	RKey uint32 `c:"rkey"`
}

// AllocMWReq is sr_alloc_mw_req (ibv_alloc_mw).
type AllocMWReq struct {
	PD   uint32 `c:"pd"`
	Type uint32 `c:"type"` // IBV_MW_TYPE_1 or IBV_MW_TYPE_2
}

// AllocMWResp is sr_alloc_mw_resp.
type AllocMWResp struct {
	Handle uint32 `c:"handle"`
	RKey   uint32 `c:"rkey"`
}

// CreateCQReq is sr_create_cq_req.
type CreateCQReq struct {
	CQE uint32 `c:"cqe"`
	_   uint32 `c:"reserved"`
}

// CreateCQResp is sr_create_cq_resp.
type CreateCQResp struct {
	Handle  uint32 `c:"handle"`
	CQE     uint32 `c:"cqe"`
	Entries uint32 `c:"entries"`
	Bytes   uint32 `c:"bytes"`
}

// ResizeCQReq is sr_resize_cq_req.
type ResizeCQReq struct {
	Handle uint32 `c:"handle"`
	CQE    uint32 `c:"cqe"`
}

// ResizeCQResp is sr_resize_cq_resp.
type ResizeCQResp struct {
	CQE     uint32 `c:"cqe"`
	Entries uint32 `c:"entries"`
	Bytes   uint32 `c:"bytes"`
	_       uint32 `c:"reserved"`
}

// ModifyCQReq is sr_modify_cq_req.
type ModifyCQReq struct {
	Handle   uint32 `c:"handle"`
	CQCount  uint16 `c:"cq_count"`
	CQPeriod uint16 `c:"cq_period"`
}

// CreateSRQReq is sr_create_srq_req.
type CreateSRQReq struct {
	PD       uint32 `c:"pd"`
	MaxWR    uint32 `c:"max_wr"`
	MaxSGE   uint32 `c:"max_sge"`
	SRQLimit uint32 `c:"srq_limit"`
}

// CreateSRQResp is sr_create_srq_resp.
type CreateSRQResp struct {
	Handle uint32 `c:"handle"`
	MaxWR  uint32 `c:"max_wr"`
	MaxSGE uint32 `c:"max_sge"`
	_      uint32 `c:"reserved"`
}

// ModifySRQReq is sr_modify_srq_req.
type ModifySRQReq struct {
	Handle   uint32 `c:"handle"`
	AttrMask uint32 `c:"attr_mask"`
	MaxWR    uint32 `c:"max_wr"`
	SRQLimit uint32 `c:"srq_limit"`
}

// SRQAttr is sr_srq_attr.
type SRQAttr struct {
	MaxWR    uint32 `c:"max_wr"`
	MaxSGE   uint32 `c:"max_sge"`
	SRQLimit uint32 `c:"srq_limit"`
	_        uint32 `c:"reserved"`
}

// QPCap is sr_qp_cap.
type QPCap struct {
	MaxSendWR     uint32 `c:"max_send_wr"`
	MaxRecvWR     uint32 `c:"max_recv_wr"`
	MaxSendSGE    uint32 `c:"max_send_sge"`
	MaxRecvSGE    uint32 `c:"max_recv_sge"`
	MaxInlineData uint32 `c:"max_inline_data"`
	_             uint32 `c:"reserved"`
}

// AHAttr is sr_ah_attr.
type AHAttr struct {
	DGID         [16]byte `c:"dgid"`
	FlowLabel    uint32   `c:"flow_label"`
	SGIDIndex    uint8    `c:"sgid_index"`
	HopLimit     uint8    `c:"hop_limit"`
	TrafficClass uint8    `c:"traffic_class"`
	SL           uint8    `c:"sl"`
	PortNum      uint8    `c:"port_num"`
	_            [7]byte  `c:"reserved"`
}

// QPAttr is sr_qp_attr.
type QPAttr struct {
	QPState          uint8  `c:"qp_state"`
	CurQPState       uint8  `c:"cur_qp_state"`
	PathMTU          uint8  `c:"path_mtu"`
	PathMigState     uint8  `c:"path_mig_state"`
	QKey             uint32 `c:"qkey"`
	RQPSN            uint32 `c:"rq_psn"`
	SQPSN            uint32 `c:"sq_psn"`
	DestQPNum        uint32 `c:"dest_qp_num"`
	QPAccessFlags    uint32 `c:"qp_access_flags"`
	Cap              QPCap  `c:"cap"`
	AHAttr           AHAttr `c:"ah_attr"`
	AltAHAttr        AHAttr `c:"alt_ah_attr"`
	PKeyIndex        uint16 `c:"pkey_index"`
	AltPKeyIndex     uint16 `c:"alt_pkey_index"`
	EnSQDAsyncNotify uint8  `c:"en_sqd_async_notify"`
	SQDraining       uint8  `c:"sq_draining"`
	MaxRDAtomic      uint8  `c:"max_rd_atomic"`
	MaxDestRDAtomic  uint8  `c:"max_dest_rd_atomic"`
	MinRNRTimer      uint8  `c:"min_rnr_timer"`
	PortNum          uint8  `c:"port_num"`
	Timeout          uint8  `c:"timeout"`
	RetryCnt         uint8  `c:"retry_cnt"`
	RNRRetry         uint8  `c:"rnr_retry"`
	AltPortNum       uint8  `c:"alt_port_num"`
	AltTimeout       uint8  `c:"alt_timeout"`
	_                uint8  `c:"reserved"`
	RateLimit        uint32 `c:"rate_limit"`
	_                uint32 `c:"reserved2"`
}

// CreateQPReq is sr_create_qp_req.
type CreateQPReq struct {
	PD       uint32 `c:"pd"`
	SendCQ   uint32 `c:"send_cq"`
	RecvCQ   uint32 `c:"recv_cq"`
	SRQ      uint32 `c:"srq"`
	QPType   uint8  `c:"qp_type"`
	SQSigAll uint8  `c:"sq_sig_all"`
	_        uint16 `c:"reserved"`
	_        uint32 `c:"reserved2"`
	Cap      QPCap  `c:"cap"`
}

// CreateQPResp is sr_create_qp_resp.
type CreateQPResp struct {
	Handle uint32 `c:"handle"`
	QPN    uint32 `c:"qpn"`
	Cap    QPCap  `c:"cap"`
}

// ModifyQPReq is sr_modify_qp_req.
type ModifyQPReq struct {
	Handle   uint32 `c:"handle"`
	AttrMask uint32 `c:"attr_mask"`
	Attr     QPAttr `c:"attr"`
}

// QueryQPReq is sr_query_qp_req.
type QueryQPReq struct {
	Handle   uint32 `c:"handle"`
	AttrMask uint32 `c:"attr_mask"`
}

// CreateAHReq is sr_create_ah_req.
type CreateAHReq struct {
	PD   uint32 `c:"pd"`
	_    uint32 `c:"reserved"`
	Attr AHAttr `c:"attr"`
}

// CreateAHResp is sr_create_ah_resp.
type CreateAHResp struct {
	Attr AHAttr   `c:"attr"`
	SGID [16]byte `c:"sgid"`
}

// Post heads a post message's body (sr_post).
type Post struct {
	Handle uint32 `c:"handle"`
	NumWR  uint32 `c:"num_wr"`
}

// SGE is sr_sge (ibv_sge).
type SGE struct {
	Addr   uint64 `c:"addr"`
	Length uint32 `c:"length"`
	LKey   uint32 `c:"lkey"`
}

// SendWR is sr_send_wr.
type SendWR struct {
	WRID           uint64 `c:"wr_id"`
	Opcode         uint8  `c:"opcode"`
	NumSGE         uint8  `c:"num_sge"`
	InlineLen      uint16 `c:"inline_len"`
	SendFlags      uint32 `c:"send_flags"`
	ImmData        uint32 `c:"imm_data"`
	InvalidateRKey uint32 `c:"invalidate_rkey"`
	RemoteAddr     uint64 `c:"remote_addr"`
	RKey           uint32 `c:"rkey"`
	RemoteQPN      uint32 `c:"remote_qpn"`
	RemoteQKey     uint32 `c:"remote_qkey"`
	HasAH          uint32 `c:"has_ah"`
	CompareAdd     uint64 `c:"compare_add"`
	Swap           uint64 `c:"swap"`
	AH             AHAttr `c:"ah"`
}

// A BIND_MW SendWR carries no SGEs and no inline data; its fields are the bind's:
// InvalidateRKey the window's current R_Key, RKey the R_Key the bind gives it, ImmData the MR's
// lkey (0: none, a type 1 unbind), RemoteAddr and CompareAdd the range, Swap the window's
// access. LOCAL_INV and SEND_WITH_INV name their R_Key in InvalidateRKey.

// FlushLevelShift places an IBV_WR_FLUSH's selectivity level in SendWR.Swap (bits 15..8; the
// placement type is bits 7..0; SendWR.CompareAdd is the range's length).
const FlushLevelShift = 8

// RecvWR is sr_recv_wr.
type RecvWR struct {
	WRID   uint64 `c:"wr_id"`
	NumSGE uint32 `c:"num_sge"`
	_      uint32 `c:"reserved"`
}

// PostResp is sr_post_resp.
type PostResp struct {
	Posted uint32 `c:"posted"`
	_      uint32 `c:"reserved"`
}

// CMPrivateDataMax is the private data area of ConnParam and CMRejectReq.
const CMPrivateDataMax = 256

// SockAddr is sr_sockaddr.
type SockAddr struct {
	Family  uint16   `c:"family"`
	Port    uint16   `c:"port"`
	ScopeID uint32   `c:"scope_id"`
	Addr    [16]byte `c:"addr"`
}

// Address families of SockAddr.
const (
	AFInet  = 2
	AFInet6 = 10
)

// CMRoute is sr_cm_route.
type CMRoute struct {
	SGID         [16]byte `c:"sgid"`
	DGID         [16]byte `c:"dgid"`
	SGIDIndex    uint32   `c:"sgid_index"`
	MTU          uint8    `c:"mtu"`
	HopLimit     uint8    `c:"hop_limit"`
	TrafficClass uint8    `c:"traffic_class"`
	_            uint8    `c:"reserved"`
}

// ConnParam is sr_conn_param.
type ConnParam struct {
	ResponderResources uint8                  `c:"responder_resources"`
	InitiatorDepth     uint8                  `c:"initiator_depth"`
	FlowControl        uint8                  `c:"flow_control"`
	RetryCount         uint8                  `c:"retry_count"`
	RNRRetryCount      uint8                  `c:"rnr_retry_count"`
	SRQ                uint8                  `c:"srq"`
	PrivateDataLen     uint16                 `c:"private_data_len"`
	QPNum              uint32                 `c:"qp_num"`
	QKey               uint32                 `c:"qkey"`
	PrivateData        [CMPrivateDataMax]byte `c:"private_data"`
}

// CMCreateIDReq is sr_cm_create_id_req.
type CMCreateIDReq struct {
	Channel   uint32 `c:"channel"`
	PortSpace uint16 `c:"port_space"`
	QPType    uint8  `c:"qp_type"`
	_         uint8  `c:"reserved"`
}

// CMMigrateReq is sr_cm_migrate_req.
type CMMigrateReq struct {
	ID      uint32 `c:"id"`
	Channel uint32 `c:"channel"`
}

// CMBindReq is sr_cm_bind_req.
type CMBindReq struct {
	ID   uint32   `c:"id"`
	_    uint32   `c:"reserved"`
	Addr SockAddr `c:"addr"`
}

// CMResolveAddrReq is sr_cm_resolve_addr_req.
type CMResolveAddrReq struct {
	ID        uint32   `c:"id"`
	TimeoutMS uint32   `c:"timeout_ms"`
	Src       SockAddr `c:"src"`
	Dst       SockAddr `c:"dst"`
}

// CMAddrResp is sr_cm_addr_resp.
type CMAddrResp struct {
	Local  SockAddr `c:"local"`
	Remote SockAddr `c:"remote"`
}

// CMResolveRouteReq is sr_cm_resolve_route_req.
type CMResolveRouteReq struct {
	ID        uint32 `c:"id"`
	TimeoutMS uint32 `c:"timeout_ms"`
}

// CMSetQPReq is sr_cm_set_qp_req.
type CMSetQPReq struct {
	ID uint32 `c:"id"`
	QP uint32 `c:"qp"`
}

// CMSetOptionReq is sr_cm_set_option_req.
type CMSetOptionReq struct {
	ID      uint32 `c:"id"`
	Level   uint32 `c:"level"`
	OptName uint32 `c:"optname"`
	Value   uint32 `c:"value"`
}

// CMInitQPAttrReq is sr_cm_init_qp_attr_req.
type CMInitQPAttrReq struct {
	ID      uint32 `c:"id"`
	QPState uint32 `c:"qp_state"`
}

// CMInitQPAttrResp is sr_cm_init_qp_attr_resp.
type CMInitQPAttrResp struct {
	AttrMask uint32 `c:"attr_mask"`
	_        uint32 `c:"reserved"`
	Attr     QPAttr `c:"attr"`
}

// CMListenReq is sr_cm_listen_req.
type CMListenReq struct {
	ID      uint32 `c:"id"`
	Backlog int32  `c:"backlog"`
}

// CMConnReq is sr_cm_conn_req.
type CMConnReq struct {
	ID       uint32    `c:"id"`
	HasParam uint32    `c:"has_param"`
	Param    ConnParam `c:"param"`
}

// CMRejectReq is sr_cm_reject_req.
type CMRejectReq struct {
	ID             uint32                 `c:"id"`
	PrivateDataLen uint32                 `c:"private_data_len"`
	PrivateData    [CMPrivateDataMax]byte `c:"private_data"`
}

// CMGetEventsReq is sr_cm_get_events_req.
type CMGetEventsReq struct {
	Channel uint32 `c:"channel"`
	Max     uint32 `c:"max"`
}

// CMEventsResp is sr_cm_events_resp; Count CMEvent values follow.
type CMEventsResp struct {
	Count uint32 `c:"count"`
	More  uint32 `c:"more"`
}

// CMEventUD is a CMEvent flag: AHAttr, Param.QPNum and Param.QKey name the UD peer.
const CMEventUD = 1

// CMEvent is sr_cm_event.
type CMEvent struct {
	Event    uint32    `c:"event"`
	Status   int32     `c:"status"`
	ID       uint32    `c:"id"`
	ListenID uint32    `c:"listen_id"`
	Code     uint32    `c:"code"`
	Flags    uint32    `c:"flags"`
	Param    ConnParam `c:"param"`
	AHAttr   AHAttr    `c:"ah_attr"`
	Local    SockAddr  `c:"local"`
	Remote   SockAddr  `c:"remote"`
	Route    CMRoute   `c:"route"`
}

// CMQueryIDResp is sr_cm_query_id_resp.
type CMQueryIDResp struct {
	Local   SockAddr `c:"local"`
	Remote  SockAddr `c:"remote"`
	Route   CMRoute  `c:"route"`
	QP      uint32   `c:"qp"`
	Channel uint32   `c:"channel"`
}

// Completion ring layout (byte offsets).
const (
	CQTail      = 0
	CQHead      = 64
	CQArmed     = 128
	CQWait      = 132
	CQEntries   = 256
	CQEntrySize = 64
)

// Arm word values.
const (
	ArmNone      = 0
	ArmNext      = 1
	ArmSolicited = 2
	ArmKind      = 3
	ArmSleeping  = 4
)

// WC is a completion ring entry (sr_wc; its first 46 bytes are struct ibv_wc's).
type WC struct {
	WRID         uint64   `c:"wr_id"`
	Status       uint32   `c:"status"`
	Opcode       uint32   `c:"opcode"`
	VendorErr    uint32   `c:"vendor_err"`
	ByteLen      uint32   `c:"byte_len"`
	ImmData      uint32   `c:"imm_data"`
	QPNum        uint32   `c:"qp_num"`
	SrcQP        uint32   `c:"src_qp"`
	WCFlags      uint32   `c:"wc_flags"`
	PKeyIndex    uint16   `c:"pkey_index"`
	SLID         uint16   `c:"slid"`
	SL           uint8    `c:"sl"`
	DLIDPathBits uint8    `c:"dlid_path_bits"`
	_            [18]byte `c:"reserved"`
}

// Post ring layout.
const (
	PostTail       = 0
	PostHead       = 64
	PostAwake      = 128
	PostData       = 256
	PostRingData   = 256 << 10
	MaxPostRecord  = PostRingData / 4
	AwakeAsleep    = 0
	AwakeDraining  = 1
	AwakeStopped   = 2
	RecordPost     = 1
	RecordPad      = 2
	EventRingOff   = PostData + PostRingData
	EventRingBytes = 4096
	EventTail      = 0
	EventHead      = 64
	EventEntries   = 128
	EventRingCap   = 64
	EventOnDevice  = 0
	EventOnQP      = 1
	EventOnCQ      = 2
	EventOnSRQ     = 3
)

// PostRecord heads a post ring record (sr_post_record).
type PostRecord struct {
	Len  uint32 `c:"len"`
	Kind uint32 `c:"kind"`
}

// AsyncEvent is an event ring entry (sr_async_event).
type AsyncEvent struct {
	Type   uint8  `c:"type"`
	Kind   uint8  `c:"kind"`
	Port   uint8  `c:"port"`
	_      uint8  `c:"reserved"`
	Handle uint32 `c:"handle"`
	QPN    uint32 `c:"qpn"`
	_      uint32 `c:"reserved2"`
}

// Struct is the set of wire structs: Append and Read take only these.
type Struct interface {
	Hdr | Err | Handle | HelloReq | HelloResp | OpenRingsResp | PortReq | DeviceAttr | PortAttr |
		GIDsResp | GIDEntry | PKeyReq | PKeyResp | Stats | Debug | RegMRReq | RegMRResp | ReregMRReq | ReregMRResp |
		AllocMWReq | AllocMWResp | CreateCQReq | CreateCQResp | ResizeCQReq | ResizeCQResp | ModifyCQReq |
		CreateSRQReq | CreateSRQResp | ModifySRQReq |
		SRQAttr | QPCap | AHAttr | QPAttr | CreateQPReq | CreateQPResp | ModifyQPReq | QueryQPReq |
		CreateAHReq | CreateAHResp | Post | SGE | SendWR | RecvWR | PostResp | SockAddr | CMRoute |
		ConnParam | CMCreateIDReq | CMMigrateReq | CMBindReq | CMResolveAddrReq | CMAddrResp |
		CMResolveRouteReq | CMSetQPReq | CMSetOptionReq | CMInitQPAttrReq | CMInitQPAttrResp | CMListenReq |
		CMConnReq | CMRejectReq | CMGetEventsReq | CMEventsResp | CMEvent | CMQueryIDResp | WC |
		PostRecord | AsyncEvent
}

// Size is the wire size of a T.
func Size[T Struct]() int {
	var v T
	return int(unsafe.Sizeof(v))
}

// Bytes is the memory of *v as the wire carries it (it aliases v).
func Bytes[T Struct](v *T) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(v)), unsafe.Sizeof(*v))
}

// Append appends the wire bytes of *v to dst.
func Append[T Struct](dst []byte, v *T) []byte { return append(dst, Bytes(v)...) }

// Read copies the T at the start of b into *v and returns the rest of b; ok
// is false (and *v unchanged) if b is shorter than a T.
func Read[T Struct](b []byte, v *T) (rest []byte, ok bool) {
	n := int(unsafe.Sizeof(*v))
	if len(b) < n {
		return b, false
	}
	copy(Bytes(v), b[:n])
	return b[n:], true
}

// CString copies s into a NUL-terminated fixed array (truncated to fit).
func CString(dst []byte, s string) {
	clear(dst)
	if len(dst) == 0 {
		return
	}
	copy(dst[:len(dst)-1], s)
}

// GoString reads a NUL-terminated fixed array.
func GoString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
