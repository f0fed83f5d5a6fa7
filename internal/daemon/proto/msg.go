// Package proto is the wire protocol between the softroce daemon
// (internal/daemon) and its clients (pkg/client): control messages on a
// unix SOCK_SEQPACKET socket (one request, one response, file descriptors
// passed with SCM_RIGHTS), completion rings in shared memfds (ring.go) and
// the memfd helpers (shm_linux.go). It is not a stable API: the client and
// the daemon of one build speak it. See docs/daemon.md.
//
// Framing: a request is [op u8][body]; a response is [status u8][body]
// where status 0 = ok and 1 = error with an ErrorBody (JSON). Control
// bodies are JSON; the data-path requests (post send/recv/srq recv) are
// binary (EncodeSendWRs / EncodeRecvWRs) and their response body is
// [posted u32].
package proto

import (
	"encoding/binary"
	"errors"
	"net/netip"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/qp"
)

// Version is the protocol version exchanged in Hello.
const Version = 2

// MaxMsg is the largest message either side sends or accepts.
const MaxMsg = 256 << 10

// Op is a request opcode.
type Op uint8

// Requests.
const (
	OpHello Op = iota + 1
	OpAllocPD
	OpDeallocPD
	OpRegMR // + 1 fd (the memfd)
	OpDeregMR
	OpCreateCQ // response + 3 fds: ring memfd, notify eventfd, space eventfd
	OpDestroyCQ
	OpCreateSRQ
	OpModifySRQ
	OpQuerySRQ
	OpDestroySRQ
	OpCreateQP
	OpModifyQP
	OpQueryQP
	OpDestroyQP
	OpCreateAH
	OpStats
	OpDebug
	OpPostSend    // binary
	OpPostRecv    // binary
	OpPostSRQRecv // binary
	// OpPostSendAsync and OpPostRecvAsync are posts with no response: the
	// client validated them and knows the queue has room (see
	// pkg/client); should the engine still refuse one, the daemon
	// completes it and every later WR of the request with LOC_QP_OP_ERR.
	OpPostSendAsync
	OpPostRecvAsync
	// OpOpenPostRing creates the connection's post ring (postring.go);
	// response PostRingResp + 2 fds: the ring memfd and the doorbell eventfd.
	OpOpenPostRing
	// OpModifyCQ is ibv_modify_cq (event moderation): ModifyCQReq, no body back.
	OpModifyCQ
	opMax
)

// Valid reports whether op is a known request.
func (op Op) Valid() bool { return (op >= OpHello && op < opMax) || op.IsCM() }

// Response status bytes.
const (
	StatusOK  = 0
	StatusErr = 1
)

// Handle names an object of one client; handles are per client (another
// client's handle numbers name nothing, or that client's own objects).
type Handle uint32

// Hello is the response to OpHello.
type Hello struct {
	Version  int
	Name     string
	Attr     qp.DeviceAttr
	PortAttr qp.PortAttr
	GIDs     []netip.Addr
	// Limit is the per-user limits the client's user is held to (-1 = none).
	Limit Usage
}

// HandleReq names one object.
type HandleReq struct{ H Handle }

// HandleResp returns a new object's handle.
type HandleResp struct{ H Handle }

// RegMRReq registers [Off, Off+Len) of the memfd passed with the request at IOVA.
type RegMRReq struct {
	PD     Handle
	Off    uint64
	Len    int
	IOVA   uint64
	Access uint32
}

// RegMRResp is the new MR.
type RegMRResp struct {
	H          Handle
	LKey, RKey uint32
}

// CreateCQReq is ibv_create_cq.
type CreateCQReq struct{ CQE int }

// CreateCQResp describes the completion ring passed with the response.
type CreateCQResp struct {
	H        Handle
	Capacity int // ring entries (power of two)
	Bytes    int // memfd size
}

// ModifyCQReq is ibv_modify_cq with IBV_CQ_ATTR_MODERATE: the completion event of CQ H
// waits for Mod.Count completions in the ring or Mod.PeriodUS microseconds.
type ModifyCQReq struct {
	H   Handle
	Mod cq.Moderation
}

// PostRingResp describes the post ring passed with the OpOpenPostRing response.
type PostRingResp struct {
	Bytes int // memfd size (PostRingBytes)
}

// CreateSRQReq is ibv_create_srq.
type CreateSRQReq struct{ MaxWR, MaxSGE, Limit int }

// ModifySRQReq is ibv_modify_srq.
type ModifySRQReq struct {
	H    Handle
	Attr qp.SRQAttr
	Mask qp.SRQAttrMask
}

// CreateQPReq is ibv_create_qp (objects by handle; SRQ 0 = none).
type CreateQPReq struct {
	Type               qp.Type
	PD, SendCQ, RecvCQ Handle
	SRQ                Handle
	Cap                qp.Cap
	SigAll             bool
}

// CreateQPResp is the new QP.
type CreateQPResp struct {
	H   Handle
	QPN uint32
}

// ModifyQPReq is ibv_modify_qp.
type ModifyQPReq struct {
	H    Handle
	Attr qp.Attr
	Mask qp.AttrMask
}

// QueryQPResp is ibv_query_qp.
type QueryQPResp struct {
	Attr  qp.Attr
	State qp.State
}

// CreateAHReq is ibv_create_ah.
type CreateAHReq struct {
	PD   Handle
	Attr qp.AHAttr
}

// Debug is the daemon's resource introspection (OpDebug): live object
// counts over all clients, and the process's open fds and goroutines.
type Debug struct {
	Clients, PDs, MRs, CQs, SRQs, QPs int
	CMIDs                             int   // rdma_cm IDs (listening, connecting, connected, pending requests)
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
	Mine struct{ PDs, MRs, CQs, SRQs, QPs, CMIDs int }
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

// ErrorBody is the body of an error response.
type ErrorBody struct {
	Code   int // index into Sentinels (0 = none)
	Msg    string
	Posted int // post requests: WRs posted before the failing one (ibverbs bad_wr)
}

// Protocol errors.
var (
	// ErrNoObject: a handle names no object of this client (or one of another type).
	ErrNoObject = errors.New("softroce daemon: no such object")
	// ErrProtocol: a malformed message.
	ErrProtocol = errors.New("softroce daemon: protocol error")
	// ErrUnsupported: an operation the daemon does not offer (e.g. BIND_MW work requests).
	ErrUnsupported = errors.New("softroce daemon: operation not supported through the daemon")
	// ErrDisconnected: the daemon closed the connection (shutdown or protocol error).
	ErrDisconnected = errors.New("softroce daemon: disconnected")
	// ErrQuota: the request would take the client's user (uid) over one of the daemon's
	// per-user limits, or the daemon over its daemon-wide ceiling; the message names which.
	ErrQuota = errors.New("softroce daemon: limit reached")
	// ErrPermission: the operation is reserved to privileged users (a controlled Q_Key).
	ErrPermission = errors.New("softroce daemon: operation not permitted")
)

// Sentinels are the errors that keep their identity across the socket:
// the daemon sends the index of the first one errors.Is matches and the
// client wraps it back (RemoteError.Unwrap). Append only.
var Sentinels []error

// CodeOf returns the sentinel code of err (0 = none).
func CodeOf(err error) int {
	for i, s := range Sentinels {
		if errors.Is(err, s) {
			return i + 1
		}
	}
	return 0
}

// RemoteError is an error returned by the daemon.
type RemoteError struct {
	Sentinel error // nil if the daemon's error has no shared sentinel
	Msg      string
}

func (e *RemoteError) Error() string { return e.Msg }

// Unwrap returns the sentinel, so errors.Is(err, qp.ErrInvalidState) works across the socket.
func (e *RemoteError) Unwrap() error { return e.Sentinel }

// FromBody rebuilds an error from an ErrorBody.
func FromBody(b ErrorBody) error {
	e := &RemoteError{Msg: b.Msg}
	if b.Code > 0 && b.Code <= len(Sentinels) {
		e.Sentinel = Sentinels[b.Code-1]
	}
	return e
}

// Binary data-path encoding (little endian).
//
//	post send:     [op][h u32][n u32] then n x SendWR
//	SendWR:        wrid u64, opcode u8, nsge u8, sgidx u8, hop u8, flags u32, imm u32, invrkey u32,
//	               raddr u64, rkey u32, rqpn u32, rqkey u32, tc u8, sl u8, hasAH u8, _ u8,
//	               compareadd u64, swap u64, flowlabel u32, dgid [16]byte  = 84 bytes, then nsge x SGE
//	               (IBV_WR_FLUSH: compareadd = the range length, swap = placement type | level << 8)
//	SGE:           addr u64, length u32, lkey u32 = 16 bytes
//	post recv:     [op][h u32][n u32] then n x (wrid u64, nsge u32) + nsge x SGE
const (
	sendWRSize = 84
	recvWRSize = 12
	sgeSize    = 16
	postHdr    = 9
)

var le = binary.LittleEndian

// AppendPostSend encodes a post-send request (op OpPostSend or
// OpPostSendAsync) into dst (reused; no allocation once grown). AH
// addresses are sent by value (the daemon resolves them again).
func AppendPostSend(dst []byte, op Op, h Handle, wrs []qp.SendWR) ([]byte, error) {
	dst = append(dst[:0], byte(op))
	dst = le.AppendUint32(dst, uint32(h))
	dst = le.AppendUint32(dst, uint32(len(wrs)))
	for i := range wrs {
		w := &wrs[i]
		if len(w.SGL) > 255 {
			return dst, qp.ErrWRTooManySGE
		}
		if w.Bind != nil || w.Opcode == qp.WRBindMW {
			return dst, ErrUnsupported
		}
		dst = le.AppendUint64(dst, w.WRID)
		var sgidx, hop, tc, sl, hasAH byte
		var fl uint32
		var dgid [16]byte
		if w.AH != nil {
			hasAH = 1
			sgidx, hop, tc, sl, fl = w.AH.SGIDIndex, w.AH.HopLimit, w.AH.TrafficClass, w.AH.SL, w.AH.FlowLabel
			dgid = w.AH.DGID.As16()
		}
		dst = append(dst, byte(w.Opcode), byte(len(w.SGL)), sgidx, hop)
		dst = le.AppendUint32(dst, uint32(w.Flags))
		dst = le.AppendUint32(dst, w.Imm)
		dst = le.AppendUint32(dst, w.InvRKey)
		dst = le.AppendUint64(dst, w.RemoteAddr)
		dst = le.AppendUint32(dst, w.RKey)
		dst = le.AppendUint32(dst, w.RemoteQPN)
		dst = le.AppendUint32(dst, w.RemoteQKey)
		dst = append(dst, tc, sl, hasAH, 0)
		ca, sw := w.CompareAdd, w.Swap
		if w.Opcode == qp.WRFlush {
			ca, sw = uint64(w.FlushLength), uint64(w.FlushType)|uint64(w.FlushLevel)<<8
		}
		dst = le.AppendUint64(dst, ca)
		dst = le.AppendUint64(dst, sw)
		dst = le.AppendUint32(dst, fl)
		dst = append(dst, dgid[:]...)
		dst = appendSGL(dst, w.SGL)
	}
	if len(dst) > MaxMsg {
		return dst, ErrProtocol
	}
	return dst, nil
}

func appendSGL(dst []byte, sgl []qp.SGE) []byte {
	for _, s := range sgl {
		dst = le.AppendUint64(dst, s.Addr)
		dst = le.AppendUint32(dst, s.Length)
		dst = le.AppendUint32(dst, s.LKey)
	}
	return dst
}

// AppendPostRecv encodes a post-recv (op OpPostRecv or OpPostSRQRecv).
func AppendPostRecv(dst []byte, op Op, h Handle, wrs []qp.RecvWR) ([]byte, error) {
	dst = append(dst[:0], byte(op))
	dst = le.AppendUint32(dst, uint32(h))
	dst = le.AppendUint32(dst, uint32(len(wrs)))
	for i := range wrs {
		dst = le.AppendUint64(dst, wrs[i].WRID)
		dst = le.AppendUint32(dst, uint32(len(wrs[i].SGL)))
		dst = appendSGL(dst, wrs[i].SGL)
	}
	if len(dst) > MaxMsg {
		return dst, ErrProtocol
	}
	return dst, nil
}

// PostHeader reads the handle and count of a post request.
func PostHeader(b []byte) (h Handle, n int, rest []byte, err error) {
	if len(b) < postHdr {
		return 0, 0, nil, ErrProtocol
	}
	return Handle(le.Uint32(b[1:])), int(le.Uint32(b[5:])), b[postHdr:], nil
}

// SendDecoder decodes post-send requests into reused storage (no
// allocation once its buffers have grown to the batch and SGE counts).
type SendDecoder struct {
	WRs []qp.SendWR
	AHs []qp.AH
	sge []qp.SGE
}

// Decode decodes n WRs from b. UD address handles are returned with an
// unresolved SGID, so the engine resolves SGIDIndex against the GID table.
func (d *SendDecoder) Decode(b []byte, n int) ([]qp.SendWR, error) {
	if n < 0 || n > len(b)/sendWRSize {
		return nil, ErrProtocol
	}
	if cap(d.WRs) < n {
		d.WRs = make([]qp.SendWR, n)
		d.AHs = make([]qp.AH, n)
	}
	wrs, ahs := d.WRs[:n], d.AHs[:n]
	// First pass: count SGEs to size the shared SGE buffer.
	total, p := 0, b
	for i := 0; i < n; i++ {
		if len(p) < sendWRSize {
			return nil, ErrProtocol
		}
		ns := int(p[9])
		if len(p) < sendWRSize+ns*sgeSize {
			return nil, ErrProtocol
		}
		total += ns
		p = p[sendWRSize+ns*sgeSize:]
	}
	if len(p) != 0 {
		return nil, ErrProtocol
	}
	if cap(d.sge) < total {
		d.sge = make([]qp.SGE, total)
	}
	sges := d.sge[:total]
	p = b
	for i := 0; i < n; i++ {
		w := &wrs[i]
		ns := int(p[9])
		*w = qp.SendWR{
			WRID:       le.Uint64(p[0:]),
			Opcode:     qp.WROpcode(p[8]),
			Flags:      qp.SendFlags(le.Uint32(p[12:])),
			Imm:        le.Uint32(p[16:]),
			InvRKey:    le.Uint32(p[20:]),
			RemoteAddr: le.Uint64(p[24:]),
			RKey:       le.Uint32(p[32:]),
			RemoteQPN:  le.Uint32(p[36:]),
			RemoteQKey: le.Uint32(p[40:]),
			CompareAdd: le.Uint64(p[48:]),
			Swap:       le.Uint64(p[56:]),
		}
		if w.Opcode == qp.WRBindMW {
			return nil, ErrUnsupported
		}
		if w.Opcode == qp.WRFlush {
			w.FlushLength, w.FlushType, w.FlushLevel = uint32(w.CompareAdd), qp.FlushType(w.Swap), qp.FlushLevel(w.Swap>>8)
			w.CompareAdd, w.Swap = 0, 0
		}
		if p[46] != 0 {
			ah := &ahs[i]
			var g [16]byte
			copy(g[:], p[68:84])
			*ah = qp.AH{AHAttr: qp.AHAttr{
				DGID: netip.AddrFrom16(g).Unmap(), SGIDIndex: p[10], HopLimit: p[11],
				TrafficClass: p[44], SL: p[45], FlowLabel: le.Uint32(p[64:]), Port: 1,
			}}
			w.AH = ah
		}
		p = p[sendWRSize:]
		w.SGL = decodeSGL(sges[:ns:ns], p)
		sges = sges[ns:]
		p = p[ns*sgeSize:]
	}
	return wrs, nil
}

func decodeSGL(dst []qp.SGE, p []byte) []qp.SGE {
	for j := range dst {
		dst[j] = qp.SGE{Addr: le.Uint64(p[j*sgeSize:]), Length: le.Uint32(p[j*sgeSize+8:]), LKey: le.Uint32(p[j*sgeSize+12:])}
	}
	return dst
}

// RecvDecoder decodes post-recv requests into reused storage.
type RecvDecoder struct {
	WRs []qp.RecvWR
	sge []qp.SGE
}

// Decode decodes n receive WRs from b.
func (d *RecvDecoder) Decode(b []byte, n int) ([]qp.RecvWR, error) {
	if n < 0 || n > len(b)/recvWRSize {
		return nil, ErrProtocol
	}
	if cap(d.WRs) < n {
		d.WRs = make([]qp.RecvWR, n)
	}
	total, p := 0, b
	for i := 0; i < n; i++ {
		if len(p) < recvWRSize {
			return nil, ErrProtocol
		}
		ns := int(le.Uint32(p[8:]))
		if ns < 0 || ns > len(p)/sgeSize || len(p) < recvWRSize+ns*sgeSize {
			return nil, ErrProtocol
		}
		total += ns
		p = p[recvWRSize+ns*sgeSize:]
	}
	if len(p) != 0 {
		return nil, ErrProtocol
	}
	if cap(d.sge) < total {
		d.sge = make([]qp.SGE, total)
	}
	sges := d.sge[:total]
	wrs := d.WRs[:n]
	p = b
	for i := 0; i < n; i++ {
		ns := int(le.Uint32(p[8:]))
		wrs[i] = qp.RecvWR{WRID: le.Uint64(p[0:]), SGL: decodeSGL(sges[:ns:ns], p[recvWRSize:])}
		sges = sges[ns:]
		p = p[recvWRSize+ns*sgeSize:]
	}
	return wrs, nil
}

// AppendPosted encodes a successful post response.
func AppendPosted(dst []byte, n int) []byte {
	dst = append(dst[:0], StatusOK)
	return le.AppendUint32(dst, uint32(n))
}

// Posted decodes the count of a post response body.
func Posted(body []byte) (int, error) {
	if len(body) < 4 {
		return 0, ErrProtocol
	}
	return int(le.Uint32(body)), nil
}

// Names are the resources' names in Usage order (conns, fds, ...): the names of the
// daemon's limits (docs/daemon.md).
var usageNames = [...]string{"conns", "fds", "pds", "mrs", "cqs", "srqs", "qps", "cm_ids", "mapped_bytes", "mappings", "engine_bytes"}

// Values returns u's fields in usageNames order.
func (u Usage) Values() [11]int64 {
	return [11]int64{u.Conns, u.FDs, u.PDs, u.MRs, u.CQs, u.SRQs, u.QPs, u.CMIDs, u.MappedBytes, u.Mappings, u.EngineBytes}
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
