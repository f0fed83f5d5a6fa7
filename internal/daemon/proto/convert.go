package proto

import (
	"math"
	"net/netip"

	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/rdmacm"
)

// Conversions between the wire structs and the engine's types.

func i32(v int) int32 {
	if v > math.MaxInt32 {
		return math.MaxInt32
	}
	if v < math.MinInt32 {
		return math.MinInt32
	}
	return int32(v)
}

// DeviceAttrToWire converts the device attributes (ints saturate at int32).
func DeviceAttrToWire(d *qp.DeviceAttr) wire.DeviceAttr {
	w := wire.DeviceAttr{NodeGUID: d.NodeGUID, SysImageGUID: d.SysImageGUID, MaxMRSize: d.MaxMRSize,
		PageSizeCap: d.PageSizeCap, VendorID: d.VendorID, VendorPartID: d.VendorPartID, HWVer: d.HWVer,
		MaxQP: i32(d.MaxQP), MaxQPWR: i32(d.MaxQPWR), DeviceCapFlags: uint64(d.DeviceCapFlags),
		MaxSGE: i32(d.MaxSGE), MaxSGERD: i32(d.MaxSGERD), MaxCQ: i32(d.MaxCQ), MaxCQE: i32(d.MaxCQE),
		MaxMR: i32(d.MaxMR), MaxPD: i32(d.MaxPD), MaxQPRDAtom: i32(d.MaxQPRDAtom), MaxEERDAtom: i32(d.MaxEECRDAtom),
		MaxResRDAtom: i32(d.MaxResRDAtom), MaxQPInitRDAtom: i32(d.MaxQPInitRDAtom),
		MaxEEInitRDAtom: i32(d.MaxEEInitRDAtom), AtomicCap: uint32(d.AtomicCap), MaxEE: i32(d.MaxEE),
		MaxRDD: i32(d.MaxRDD), MaxMW: i32(d.MaxMW), MaxRawIPv6QP: i32(d.MaxRawIPv6QP),
		MaxRawEthyQP: i32(d.MaxRawEthyQP), MaxMcastGrp: i32(d.MaxMcastGrp),
		MaxMcastQPAttach: i32(d.MaxMcastQPAttach), MaxTotalMcastQPAttach: i32(d.MaxTotalMcastQPAttach),
		MaxAH: i32(d.MaxAH), MaxSRQ: i32(d.MaxSRQ), MaxSRQWR: i32(d.MaxSRQWR), MaxSRQSGE: i32(d.MaxSRQSGE),
		MaxPKeys: uint16(d.MaxPKeys), LocalCAAckDelay: d.LocalCAAckDelay, PhysPortCnt: d.PhysPortCnt,
		MaxInlineData: uint32(d.MaxInlineData), MaxMsgSize: d.MaxMsgSize,
		MaxCQModerationCount: math.MaxUint16, MaxCQModerationPeriodU: math.MaxUint16}
	wire.CString(w.FWVer[:], d.FWVer)
	return w
}

// DeviceAttrFromWire converts the device attributes back.
func DeviceAttrFromWire(w *wire.DeviceAttr) qp.DeviceAttr {
	return qp.DeviceAttr{FWVer: wire.GoString(w.FWVer[:]), NodeGUID: w.NodeGUID, SysImageGUID: w.SysImageGUID,
		MaxMRSize: w.MaxMRSize, PageSizeCap: w.PageSizeCap, VendorID: w.VendorID, VendorPartID: w.VendorPartID,
		HWVer: w.HWVer, MaxQP: int(w.MaxQP), MaxQPWR: int(w.MaxQPWR), DeviceCapFlags: qp.DeviceCapFlags(w.DeviceCapFlags),
		MaxSGE: int(w.MaxSGE), MaxSGERD: int(w.MaxSGERD), MaxCQ: int(w.MaxCQ), MaxCQE: int(w.MaxCQE),
		MaxMR: int(w.MaxMR), MaxPD: int(w.MaxPD), MaxQPRDAtom: int(w.MaxQPRDAtom), MaxEECRDAtom: int(w.MaxEERDAtom),
		MaxResRDAtom: int(w.MaxResRDAtom), MaxQPInitRDAtom: int(w.MaxQPInitRDAtom),
		MaxEEInitRDAtom: int(w.MaxEEInitRDAtom), AtomicCap: qp.AtomicCap(w.AtomicCap), MaxEE: int(w.MaxEE),
		MaxRDD: int(w.MaxRDD), MaxMW: int(w.MaxMW), MaxRawIPv6QP: int(w.MaxRawIPv6QP),
		MaxRawEthyQP: int(w.MaxRawEthyQP), MaxMcastGrp: int(w.MaxMcastGrp), MaxMcastQPAttach: int(w.MaxMcastQPAttach),
		MaxTotalMcastQPAttach: int(w.MaxTotalMcastQPAttach), MaxAH: int(w.MaxAH), MaxSRQ: int(w.MaxSRQ),
		MaxSRQWR: int(w.MaxSRQWR), MaxSRQSGE: int(w.MaxSRQSGE), MaxPKeys: int(w.MaxPKeys),
		LocalCAAckDelay: w.LocalCAAckDelay, PhysPortCnt: w.PhysPortCnt, MaxInlineData: int(w.MaxInlineData),
		MaxMsgSize: w.MaxMsgSize}
}

// PortAttrToWire converts the port attributes.
func PortAttrToWire(p *qp.PortAttr) wire.PortAttr {
	return wire.PortAttr{State: uint32(p.State), MaxMTU: uint32(p.MaxMTU), ActiveMTU: uint32(p.ActiveMTU),
		GIDTblLen: i32(p.GIDTblLen), PortCapFlags: uint32(p.PortCapFlags), MaxMsgSz: p.MaxMsgSz,
		BadPKeyCntr: p.BadPKeyCntr, QKeyViolCntr: p.QKeyViolCntr, PKeyTblLen: p.PKeyTblLen, LID: p.LID,
		SMLID: p.SMLID, LMC: p.LMC, MaxVLNum: p.MaxVLNum, SMSL: p.SMSL, SubnetTimeout: p.SubnetTimeout,
		ActiveWidth: p.ActiveWidth, ActiveSpeed: p.ActiveSpeed, PhysState: p.PhysState, LinkLayer: uint8(p.LinkLayer)}
}

// PortAttrFromWire converts the port attributes back.
func PortAttrFromWire(w *wire.PortAttr) qp.PortAttr {
	return qp.PortAttr{State: qp.PortState(w.State), MaxMTU: qp.MTU(w.MaxMTU), ActiveMTU: qp.MTU(w.ActiveMTU),
		GIDTblLen: int(w.GIDTblLen), PortCapFlags: qp.PortCapFlags(w.PortCapFlags), MaxMsgSz: w.MaxMsgSz,
		BadPKeyCntr: w.BadPKeyCntr, QKeyViolCntr: w.QKeyViolCntr, PKeyTblLen: w.PKeyTblLen, LID: w.LID,
		SMLID: w.SMLID, LMC: w.LMC, MaxVLNum: w.MaxVLNum, SMSL: w.SMSL, SubnetTimeout: w.SubnetTimeout,
		ActiveWidth: w.ActiveWidth, ActiveSpeed: w.ActiveSpeed, PhysState: w.PhysState, LinkLayer: qp.LinkLayer(w.LinkLayer)}
}

// StatsToWire converts the device counters.
func StatsToWire(s *qp.Stats) wire.Stats {
	return wire.Stats{SentPkts: s.SentPkts, RcvdPkts: s.RcvdPkts, DuplicateRequest: s.DuplicateRequest,
		OutOfSeqRequest: s.OutOfSeqRequest, RcvdRNRErr: s.RcvdRNRErr, SendRNRErr: s.SendRNRErr,
		RcvdSeqErr: s.RcvdSeqErr, AckDeferred: s.AckDeferred, RetryExceededErr: s.RetryExceededErr,
		RetryRNRExceededErr: s.RetryRNRExceededErr, CompleterRetryErr: s.CompleterRetryErr, SendErr: s.SendErr,
		RDMASends: s.RDMASends, RDMARecvs: s.RDMARecvs, LinkDowned: s.LinkDowned, RcvdICRCSolved: s.RcvdICRCSolved,
		RcvdDropped: s.RcvdDropped, RetransPkts: s.RetransPkts, RcvdGSOSplit: s.RcvdGSOSplit,
		LinkEntropySockets: s.LinkEntropySockets, LinkEntropyFallbacks: s.LinkEntropyFallbacks,
		LinkOffloadFallbacks: s.LinkOffloadFallbacks, NPECNMarked: s.NPECNMarked, NPCNPSent: s.NPCNPSent,
		RPCNPHandled: s.RPCNPHandled, RPCNPIgnored: s.RPCNPIgnored}
}

// StatsFromWire converts the device counters back.
func StatsFromWire(w *wire.Stats) qp.Stats {
	return qp.Stats{SentPkts: w.SentPkts, RcvdPkts: w.RcvdPkts, DuplicateRequest: w.DuplicateRequest,
		OutOfSeqRequest: w.OutOfSeqRequest, RcvdRNRErr: w.RcvdRNRErr, SendRNRErr: w.SendRNRErr,
		RcvdSeqErr: w.RcvdSeqErr, AckDeferred: w.AckDeferred, RetryExceededErr: w.RetryExceededErr,
		RetryRNRExceededErr: w.RetryRNRExceededErr, CompleterRetryErr: w.CompleterRetryErr, SendErr: w.SendErr,
		RDMASends: w.RDMASends, RDMARecvs: w.RDMARecvs, LinkDowned: w.LinkDowned, RcvdICRCSolved: w.RcvdICRCSolved,
		RcvdDropped: w.RcvdDropped, RetransPkts: w.RetransPkts, RcvdGSOSplit: w.RcvdGSOSplit,
		LinkEntropySockets: w.LinkEntropySockets, LinkEntropyFallbacks: w.LinkEntropyFallbacks,
		LinkOffloadFallbacks: w.LinkOffloadFallbacks, NPECNMarked: w.NPECNMarked, NPCNPSent: w.NPCNPSent,
		RPCNPHandled: w.RPCNPHandled, RPCNPIgnored: w.RPCNPIgnored}
}

// Debug is the daemon's resource introspection (OpDebug): live object
// counts over all clients, and the process's open fds and goroutines.
type Debug struct {
	Clients, PDs, MRs, CQs, SRQs, QPs int
	CMIDs                             int   // rdma_cm IDs (listening, connecting, connected, pending requests)
	CMChannels                        int   // rdma_cm event channels
	CMListens                         int   // rdma_cm IDs listening
	MappedBytes                       int64 // client memory mapped for MRs, completion rings and post rings
	// FDs counts the daemon process's open file descriptors other than the
	// device link's entropy-port sockets (EntropySockets: the link opens one
	// per source port in use and keeps it, like its main socket; they are the
	// device's, not a client's).
	FDs            int
	EntropySockets int
	Goroutines     int
	// RingPosts counts post messages drained from post rings, SocketPosts
	// post messages read from sockets (both since the daemon started).
	RingPosts, SocketPosts uint64
	// Refills counts the packets the engine held for a client's post ring
	// to be drained: a packet needing a receive WQE found a client QP's
	// receive queue empty while that client's ring had posts not yet
	// handed over (the RecvRefill hook, docs/daemon.md).
	Refills uint64
	// AcceptBackoffs counts the accept errors (out of descriptors or memory) the daemon backed
	// off on and retried instead of stopping.
	AcceptBackoffs uint64
	// DrainYields counts the post-ring drain turns that ended with records left: a busy
	// client's drainer gave the others their turn (docs/daemon.md "Fair service").
	DrainYields uint64
	// BadPosts counts asynchronous post messages and post-ring records the daemon refused
	// (malformed, naming no QP of the client); DroppedEvents the asynchronous events dropped
	// because a client's event ring was full.
	BadPosts, DroppedEvents uint64
	// Mine counts this client's own objects.
	Mine struct{ PDs, MRs, CQs, SRQs, QPs, CMIDs, CMChannels int }
	// UID is the user the daemon counts this client under (SO_PEERCRED); User is what all of
	// that user's connections hold together, UserLimit the per-user limits (-1 = none).
	UID             uint32
	User, UserLimit Usage
	// Refused counts the requests refused over a limit (per-user or daemon-wide), per
	// resource, since the daemon started; RefusedPrivileged those refused as reserved to
	// privileged users (controlled Q_Keys).
	Refused           Usage
	RefusedPrivileged uint64
}

// Usage is an amount of each resource the daemon limits per user (docs/daemon.md "Limits"):
// a holding, a limit (-1 = none) or a count of refusals.
type Usage struct {
	Conns, FDs, PDs, MRs, CQs, SRQs, QPs, CMIDs int64
	MappedBytes, Mappings, EngineBytes          int64
}

// usageNames are the resources' names in Usage order (conns, fds, ...): the names of the
// daemon's limits (docs/daemon.md), in wire.Usage* order.
var usageNames = [wire.UsageCount]string{"conns", "fds", "pds", "mrs", "cqs", "srqs", "qps", "cm_ids", "mapped_bytes", "mappings", "engine_bytes"}

// Values returns u's fields in usageNames order.
func (u Usage) Values() [wire.UsageCount]int64 {
	return [wire.UsageCount]int64{u.Conns, u.FDs, u.PDs, u.MRs, u.CQs, u.SRQs, u.QPs, u.CMIDs, u.MappedBytes, u.Mappings, u.EngineBytes}
}

// UsageFrom is the Usage of values in usageNames order.
func UsageFrom(v [wire.UsageCount]int64) Usage {
	return Usage{Conns: v[0], FDs: v[1], PDs: v[2], MRs: v[3], CQs: v[4], SRQs: v[5], QPs: v[6], CMIDs: v[7],
		MappedBytes: v[8], Mappings: v[9], EngineBytes: v[10]}
}

// UsageNames returns the resource names, in Values order.
func UsageNames() []string { return usageNames[:] }

// Counters returns the daemon's own event counters by name, as `softroce stats --daemon`
// prints them next to the device's: daemon_refused_<limit> (requests refused over each
// limit), daemon_refused_privileged, daemon_bad_posts, daemon_dropped_events, daemon_accept_backoffs.
func (d Debug) Counters() map[string]uint64 {
	m := map[string]uint64{"daemon_bad_posts": d.BadPosts, "daemon_dropped_events": d.DroppedEvents,
		"daemon_accept_backoffs": d.AcceptBackoffs, "daemon_refused_privileged": d.RefusedPrivileged}
	for i, v := range d.Refused.Values() {
		m["daemon_refused_"+usageNames[i]] = uint64(v)
	}
	return m
}

// DebugToWire converts the resource counts.
func DebugToWire(d *Debug) wire.Debug {
	return wire.Debug{Clients: int64(d.Clients), PDs: int64(d.PDs), MRs: int64(d.MRs), CQs: int64(d.CQs),
		SRQs: int64(d.SRQs), QPs: int64(d.QPs), CMIDs: int64(d.CMIDs), MappedBytes: d.MappedBytes,
		FDs: int64(d.FDs), EntropySockets: int64(d.EntropySockets), Goroutines: int64(d.Goroutines),
		RingPosts: d.RingPosts, SocketPosts: d.SocketPosts, Refills: d.Refills, MinePDs: int64(d.Mine.PDs),
		MineMRs: int64(d.Mine.MRs), MineCQs: int64(d.Mine.CQs), MineSRQs: int64(d.Mine.SRQs),
		MineQPs: int64(d.Mine.QPs), MineCMIDs: int64(d.Mine.CMIDs), MineCMChannels: int64(d.Mine.CMChannels),
		CMChannels: int64(d.CMChannels), AcceptBackoffs: d.AcceptBackoffs, BadPosts: d.BadPosts,
		DroppedEvents: d.DroppedEvents, CMListens: int64(d.CMListens), DrainYields: d.DrainYields, UID: d.UID,
		User: d.User.Values(), UserLimit: d.UserLimit.Values(), Refused: d.Refused.Values(),
		RefusedPriv: d.RefusedPrivileged}
}

// DebugFromWire converts the resource counts back.
func DebugFromWire(w *wire.Debug) Debug {
	d := Debug{Clients: int(w.Clients), PDs: int(w.PDs), MRs: int(w.MRs), CQs: int(w.CQs), SRQs: int(w.SRQs),
		QPs: int(w.QPs), CMIDs: int(w.CMIDs), CMChannels: int(w.CMChannels), MappedBytes: w.MappedBytes,
		FDs: int(w.FDs), EntropySockets: int(w.EntropySockets), Goroutines: int(w.Goroutines),
		RingPosts: w.RingPosts, SocketPosts: w.SocketPosts, Refills: w.Refills, AcceptBackoffs: w.AcceptBackoffs,
		BadPosts: w.BadPosts, DroppedEvents: w.DroppedEvents, CMListens: int(w.CMListens), DrainYields: w.DrainYields,
		UID: w.UID, User: UsageFrom(w.User), UserLimit: UsageFrom(w.UserLimit), Refused: UsageFrom(w.Refused),
		RefusedPrivileged: w.RefusedPriv}
	d.Mine.PDs, d.Mine.MRs, d.Mine.CQs = int(w.MinePDs), int(w.MineMRs), int(w.MineCQs)
	d.Mine.SRQs, d.Mine.QPs, d.Mine.CMIDs, d.Mine.CMChannels = int(w.MineSRQs), int(w.MineQPs), int(w.MineCMIDs), int(w.MineCMChannels)
	return d
}

// CapToWire converts QP capacities.
func CapToWire(c *qp.Cap) wire.QPCap {
	return wire.QPCap{MaxSendWR: c.MaxSendWR, MaxRecvWR: c.MaxRecvWR, MaxSendSGE: c.MaxSendSGE,
		MaxRecvSGE: c.MaxRecvSGE, MaxInlineData: c.MaxInlineData}
}

// CapFromWire converts QP capacities back.
func CapFromWire(w *wire.QPCap) qp.Cap {
	return qp.Cap{MaxSendWR: w.MaxSendWR, MaxRecvWR: w.MaxRecvWR, MaxSendSGE: w.MaxSendSGE,
		MaxRecvSGE: w.MaxRecvSGE, MaxInlineData: w.MaxInlineData}
}

// QPAttrToWire converts QP attributes.
func QPAttrToWire(a *qp.Attr) wire.QPAttr {
	var en uint8
	if a.SQDrainEvent {
		en = 1
	}
	return wire.QPAttr{QPState: uint8(a.State), CurQPState: uint8(a.CurState), PathMTU: uint8(a.PathMTU),
		PathMigState: uint8(a.PathMigState), QKey: a.QKey, RQPSN: a.RQPSN, SQPSN: a.SQPSN, DestQPNum: a.DestQPN,
		QPAccessFlags: uint32(a.AccessFlags), Cap: CapToWire(&a.Cap), AHAttr: AHAttrToWire(&a.AH),
		AltAHAttr: AHAttrToWire(&a.AltAH), PKeyIndex: a.PKeyIndex, EnSQDAsyncNotify: en,
		MaxRDAtomic: a.MaxRDAtomic, MaxDestRDAtomic: a.MaxDestRDAtomic, MinRNRTimer: a.MinRNRTimer,
		PortNum: a.Port, Timeout: a.Timeout, RetryCnt: a.RetryCnt, RNRRetry: a.RNRRetry, RateLimit: a.RateLimit}
}

// QPAttrFromWire converts QP attributes back.
func QPAttrFromWire(w *wire.QPAttr) qp.Attr {
	a := qp.Attr{State: qp.State(w.QPState), CurState: qp.State(w.CurQPState), PathMTU: qp.MTU(w.PathMTU),
		PathMigState: qp.MigState(w.PathMigState), QKey: w.QKey, RQPSN: w.RQPSN, SQPSN: w.SQPSN,
		DestQPN: w.DestQPNum, AccessFlags: mr.Access(w.QPAccessFlags), PKeyIndex: w.PKeyIndex, Port: w.PortNum,
		AH: AHAttrFromWire(&w.AHAttr), AltAH: AHAttrFromWire(&w.AltAHAttr), SQDrainEvent: w.EnSQDAsyncNotify != 0,
		Timeout: w.Timeout, RetryCnt: w.RetryCnt, RNRRetry: w.RNRRetry, MinRNRTimer: w.MinRNRTimer,
		MaxRDAtomic: w.MaxRDAtomic, MaxDestRDAtomic: w.MaxDestRDAtomic, Cap: CapFromWire(&w.Cap),
		RateLimit: w.RateLimit}
	return a
}

// AddrPortToWire converts a socket address (the invalid address as family 0).
func AddrPortToWire(ap netip.AddrPort) wire.SockAddr {
	a := ap.Addr()
	if !a.IsValid() {
		return wire.SockAddr{}
	}
	w := wire.SockAddr{Family: wire.AFInet6, Port: ap.Port(), Addr: a.As16()}
	if a.Unmap().Is4() {
		w.Family = wire.AFInet
	}
	if z := a.Zone(); z != "" {
		w.ScopeID = zoneIndex(z)
	}
	return w
}

// AddrPortFromWire converts a socket address back (family 0: the zero AddrPort).
func AddrPortFromWire(w *wire.SockAddr) netip.AddrPort {
	switch w.Family {
	case wire.AFInet:
		return netip.AddrPortFrom(netip.AddrFrom16(w.Addr).Unmap(), w.Port)
	case wire.AFInet6:
		a := netip.AddrFrom16(w.Addr)
		if w.ScopeID != 0 {
			a = a.WithZone(itoa(w.ScopeID))
		}
		return netip.AddrPortFrom(a, w.Port)
	}
	return netip.AddrPort{}
}

// AddrFromWire is the address of a socket address (family 0: invalid).
func AddrFromWire(w *wire.SockAddr) netip.Addr { return AddrPortFromWire(w).Addr() }

func zoneIndex(z string) uint32 {
	var n uint32
	for _, c := range z {
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + uint32(c-'0')
	}
	return n
}

func itoa(v uint32) string {
	if v == 0 {
		return "0"
	}
	var b [10]byte
	i := len(b)
	for v > 0 {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
	}
	return string(b[i:])
}

// RouteToWire converts an rdma_cm route.
func RouteToWire(r *rdmacm.Route) wire.CMRoute {
	return wire.CMRoute{SGID: AddrToGID(r.SGID), DGID: AddrToGID(r.DGID), SGIDIndex: uint32(max(r.SGIDIndex, 0)),
		MTU: uint8(r.MTU), HopLimit: r.HopLimit, TrafficClass: r.TrafficClass}
}

// RouteFromWire converts an rdma_cm route back.
func RouteFromWire(w *wire.CMRoute) rdmacm.Route {
	return rdmacm.Route{SGID: GIDToAddr(w.SGID), DGID: GIDToAddr(w.DGID), SGIDIndex: int(w.SGIDIndex),
		MTU: qp.MTU(w.MTU), HopLimit: w.HopLimit, TrafficClass: w.TrafficClass}
}

// ConnParamToWire converts connection parameters; private data beyond the
// area is ErrProtocol.
func ConnParamToWire(p *rdmacm.ConnParam) (wire.ConnParam, error) {
	w := wire.ConnParam{ResponderResources: p.ResponderResources, InitiatorDepth: p.InitiatorDepth,
		FlowControl: b2u(p.FlowControl), RetryCount: p.RetryCount, RNRRetryCount: p.RNRRetryCount,
		SRQ: b2u(p.SRQ), QPNum: p.QPNum, QKey: p.QKey}
	if len(p.PrivateData) > len(w.PrivateData) {
		return w, ErrProtocol
	}
	w.PrivateDataLen = uint16(copy(w.PrivateData[:], p.PrivateData))
	return w, nil
}

// ConnParamFromWire converts connection parameters back; a length beyond the
// area is ErrProtocol.
func ConnParamFromWire(w *wire.ConnParam) (rdmacm.ConnParam, error) {
	p := rdmacm.ConnParam{ResponderResources: w.ResponderResources, InitiatorDepth: w.InitiatorDepth,
		FlowControl: w.FlowControl != 0, RetryCount: w.RetryCount, RNRRetryCount: w.RNRRetryCount,
		SRQ: w.SRQ != 0, QPNum: w.QPNum, QKey: w.QKey}
	if int(w.PrivateDataLen) > len(w.PrivateData) {
		return p, ErrProtocol
	}
	if w.PrivateDataLen > 0 {
		p.PrivateData = append([]byte(nil), w.PrivateData[:w.PrivateDataLen]...)
	}
	return p, nil
}

func b2u(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}
