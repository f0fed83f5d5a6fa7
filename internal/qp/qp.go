// Long file: the QP object and everything QP.mu guards outside the three roles
// (configuration, state, the send and receive queues, posting, flush-on-error, the counters):
// the subject of the package's concurrency comment, kept together so the locking is reviewed
// in one place.

package qp

import (
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softroce/softroce/internal/cc"
	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/event"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
)

// Output is the engine's only way out: a batch of datagrams, plus the UDP
// source port a send from a local address will carry (it is covered by the
// ICRC). link.Link satisfies it.
type Output interface {
	// Send transmits the batch in order and does not retain the buffers.
	Send(batch []link.Datagram) error
	// SourcePort returns the UDP source port of a send from local, given
	// the RoCE entropy port (IBTA A17.3.2).
	SourcePort(local netip.Addr, entropy uint16) uint16
}

// Path is a resolved address vector: the local and the remote IP address,
// and the traffic class the packets carry (AHAttr.TrafficClass; IBTA
// A17.4.5: the GRH TClass is the IP TOS / Traffic Class byte).
type Path struct {
	Src, Dst netip.Addr
	TClass   uint8
}

// Resolver turns an address vector into a Path (the device resolves
// SGIDIndex through its GID table).
type Resolver func(ah *AHAttr) (Path, error)

// Errors returned by the verbs (ibverbs returns errno values; these wrap
// the same conditions with typed errors).
var (
	// ErrInvalidState: the verb is not allowed in the QP's current state
	// (EINVAL from ibv_post_send/ibv_post_recv).
	ErrInvalidState = errors.New("qp: operation not allowed in the current QP state")
	// ErrQueueFull: the work queue has no free slot (ENOMEM).
	ErrQueueFull = errors.New("qp: work queue full")
	// ErrTooManySGE: the WR has more SGEs than max_send_sge/max_recv_sge (EINVAL).
	ErrTooManySGE = errors.New("qp: too many scatter/gather entries")
	// ErrInlineTooLong: inline data exceeds max_inline_data (EINVAL).
	ErrInlineTooLong = errors.New("qp: inline data exceeds max_inline_data")
	// ErrMsgTooLong: message longer than the device maximum, or longer
	// than the path MTU on UD (EINVAL).
	ErrMsgTooLong = errors.New("qp: message too long")
	// ErrBadOpcode: the WR opcode is not supported on this QP type (EINVAL).
	ErrBadOpcode = errors.New("qp: work request opcode not supported on this QP type")
	// ErrBadWR: other malformed work request (missing AH on UD, ...).
	ErrBadWR = errors.New("qp: malformed work request")
	// ErrHasSRQ: PostRecv on a QP attached to an SRQ.
	ErrHasSRQ = errors.New("qp: QP uses an SRQ; post receives to the SRQ")
	// ErrDestroyed: the QP was destroyed.
	ErrDestroyed = errors.New("qp: destroyed")
	// ErrSelectiveRepeat: selective repeat asked of a QP whose receives reach the engine
	// through Config.RecvRefill (the daemon's QPs), which its reorder buffer does not serve
	// (EOPNOTSUPP).
	ErrSelectiveRepeat = errors.New("qp: selective repeat is not supported on this QP")
)

// Config creates a QP. The device fills it.
type Config struct {
	Type   Type
	QPN    uint32
	PD     *mr.PD
	MRs    *mr.Table
	SendCQ *cq.CQ
	RecvCQ *cq.CQ
	SRQ    *SRQ // nil: the QP has its own receive queue
	Cap    Cap
	// SigAll makes every send WR signaled (ibv_qp_init_attr.sq_sig_all).
	SigAll bool
	Out    Output
	Clock  Clock
	// Resolve maps the RC/UC address vector to a Path at RTR.
	Resolve Resolver
	// DstPort is the UDP destination port of every packet (4791; tests
	// may use another).
	DstPort uint16
	// RxeFlushICRC sends RC FLUSHes with the ICRC kernel rxe computes for them (the headers
	// covered twice) instead of the one IBTA A17.3.3 defines: rxe (6.2 up to at least 6.12)
	// drops the spec's. Every other packet keeps the spec's ICRC.
	RxeFlushICRC bool
	// Device holds the limits for CheckModify (nil = DefaultDeviceAttr()).
	Device *DeviceAttr
	// Counters is the device-wide counter set (nil = private).
	Counters *Counters
	// AtomicMu serializes atomics device-wide (nil = private).
	AtomicMu *sync.Mutex
	// Events receives affiliated asynchronous events (nil drops them).
	Events event.Sink
	// MTU is the port's active MTU: the UD message limit and the RC/UC
	// default before a path MTU is set (0 = MTU1024).
	MTU MTU
	// RecvRefill, if set, is asked by Receive and ReceiveDeferred, on the
	// receiving goroutine with no QP lock held, when a packet that passed the
	// QP's checks and consumes a receive WQE (SEND FIRST/ONLY, RDMA WRITE with
	// immediate LAST/ONLY) is next to execute while the QP's own receive queue
	// is empty: whether the owner holds receives it accepted (PostRecv
	// returned) but has not handed to the engine yet. It must not block (the
	// goroutine serves other QPs) nor take this QP's lock. true: the QP holds
	// the packet, and the request packets after it, until the owner has posted
	// those receives from its own goroutine and calls Refilled; false: the
	// packet is executed now (refill.go). Not called on QPs with an SRQ.
	RecvRefill func(q *QP) bool
	// Writes, if set, executes RC WRITE Only requests outside the engine (writes.go).
	Writes WriteResponder
	// Schedule, if set, is called (with the QP lock held; it must not block nor take the
	// QP's lock) when the responder has more READ responses to send than it builds on the
	// goroutine that received the request: the scheduler is to call RunResponder from its
	// own goroutine until it reports no more work (readresp.go). nil: every response is
	// built at once.
	Schedule func(q *QP)
	// CC holds the QP's congestion control parameters (congestion.go, docs/congestion.md; nil:
	// cc.Defaults(), DCQCN, CNPs and ECT(0) on). The QP keeps a copy.
	CC *cc.Params
	// LineRate is the device's line rate in bit/s, DCQCN's maximum rate when rp_max_rate is 0
	// (0: DefaultLineRate).
	LineRate float64
	// Budget, if set, bounds the request packets in flight over a group of RC QPs, this one
	// among them, besides the QP's own window (budget.go). nil: the window alone.
	Budget *Budget
}

// Engine tunables (rxe values: RXE_MAX_UNACKED_PSNS, RXE_MAX_PKT_PER_ACK).
const (
	// MaxUnackedPSNs bounds the PSNs in flight (requester window).
	MaxUnackedPSNs = 128
	// PktsPerAck: the requester sets AckReq at least every this many packets.
	PktsPerAck = 64
	// txBuffers is the number of send buffers of one burst (a txSet taken
	// from a pool while the QP sends, fastpath.go): one sendmmsg call, up
	// to 4 GSO messages of 4 KiB packets or one of 1 KiB packets.
	txBuffers = 64
	// txBufSize fits the largest packet: headers, 4096 payload, pad, ICRC.
	txBufSize = 4096 + 128
)

// sendWQE is one send queue slot.
type sendWQE struct {
	wr     SendWR
	sge    []SGE  // backing array for wr.SGL (cap MaxSendSGE)
	inline []byte // backing for inline data (cap MaxInlineData)
	length uint32
	path   Path // UD destination
	dqpn   uint32
	qkey   uint32

	started  bool
	sentAll  bool
	sentOnce bool // every packet has left at least once (a rewind clears sentAll, not this)
	done     bool
	status   cq.Status
	firstPSN bth.PSN
	lastPSN  bth.PSN
	npsn     uint32
	nextPkt  uint32 // index of the next packet to build (SEND/WRITE)
	readDone uint32 // READ bytes received
	readReq  uint32 // READ response packets requested so far (readChunk)
	// srr: the READ responses placed ahead of readDone (srread.go; nil until the QP's first
	// out-of-order READ response, then kept through reset)
	srr      *srReadBits
	isInline bool
	// hasOperand: an inline ATOMIC WRITE, whose 8 bytes are operand (not the SGL's)
	hasOperand bool
	operand    [8]byte
	rdAtomic   bool // counts against max_rd_atomic while outstanding
	bind       BindInfo
}

// recvWQE is one receive queue slot.
type recvWQE struct {
	wrid uint64
	sge  []SGE
	n    int
}

// QP is a queue pair with its transport engine (requester, responder,
// completer, timers). All methods are safe for concurrent use.
type QP struct {
	mu     sync.Mutex
	cfg    Config
	wo     WriteState  // the write responder's shared state (writes.go), nil without
	woInfo WriteQPInfo // what wo was attached with
	// woHeld: the QP holds wo paused (its responder ran, or what it queued is not sent yet);
	// woResponding: inside respondShared (a flush there must not publish)
	woHeld, woResponding bool
	num                  uint32
	typ                  Type
	state                State
	attr                 Attr
	path                 Path
	mtu                  uint32
	dev                  *DeviceAttr
	cnt                  *Counters
	atomicMu             *sync.Mutex
	dead                 bool

	// send queue ring: head (oldest not retired) <= req (next to transmit) <= tail
	sq               []sendWQE
	sqHead, sqReq    uint32
	sqTail           uint32
	rq               []recvWQE
	rqHead, rqTail   uint32
	rdAtomicInFlight int

	req  requester
	resp responder
	comp completer
	tmr  timers
	cc   congestion
	bud  budgetState // in the group's in-flight budget (budget.go)

	// output: the current burst (nil when idle; fastpath.go) and the
	// Output's GSO run and pair interfaces (nil if it has none)
	out   *txSet
	runs  link.RunSender
	pairs link.PairSender
	icrc  [2]icrcCache // most recent first (pseudoHeader, fastpath.go)
	// resN is the number of responder resources (max_dest_rd_atomic) to
	// allocate at the first READ/atomic
	resN int

	// held: request packets waiting for the responder (hold.go; nil: none); waitRefill: for
	// the owner's Refilled, asking: the refill hook is running, refillGen counts Refilled
	// calls (refill.go)
	held       *heldQueue
	waitRefill bool
	asking     bool
	refillGen  uint64

	// remoteAccessErrs counts this QP's share of Counters.RespRemoteAccessErrors
	remoteAccessErrs atomic.Uint64
}

// icrcCache holds the pseudo-header CRC state of one (endpoints, length)
// a packet was sent with.
type icrcCache struct {
	ep    bth.Endpoints
	n     int
	state uint32
	ok    bool
}

// New creates a QP in the RESET state.
func New(c Config) (*QP, error) {
	if !c.Type.Valid() {
		return nil, ErrBadWR
	}
	if c.Out == nil || c.Clock == nil || c.MRs == nil || c.SendCQ == nil || c.RecvCQ == nil {
		return nil, ErrBadWR
	}
	if c.Counters == nil {
		c.Counters = new(Counters)
	}
	if c.AtomicMu == nil {
		c.AtomicMu = new(sync.Mutex)
	}
	if c.Device == nil {
		d := DefaultDeviceAttr()
		c.Device = &d
	}
	if c.DstPort == 0 {
		c.DstPort = bth.UDPPort
	}
	if c.Cap.MaxSendWR == 0 {
		c.Cap.MaxSendWR = 1
	}
	if c.Cap.MaxSendSGE == 0 {
		c.Cap.MaxSendSGE = 1
	}
	if c.Cap.MaxRecvSGE == 0 {
		c.Cap.MaxRecvSGE = 1
	}
	q := &QP{cfg: c, num: c.QPN & bth.PSNMask, typ: c.Type, cnt: c.Counters, atomicMu: c.AtomicMu, dev: c.Device}
	// the send and receive rings are allocated when first posted to
	// (ensureSQ, ensureRQ in fastpath.go): an idle QP stays small
	q.runs, _ = c.Out.(link.RunSender)
	if q.runs != nil {
		q.pairs, _ = c.Out.(link.PairSender)
	}
	q.initCC()
	q.resetLocked()
	q.tmr.t = c.Clock.AfterFunc(time.Hour, q.onTimerFire)
	q.bud.t = q.tmr.t // (a waker's copy, never rewritten: budget.go)
	q.tmr.t.Stop()
	return q, nil
}

// Num returns the QP number.
func (q *QP) Num() uint32 { return q.num }

// Type returns the QP type.
func (q *QP) Type() Type { return q.typ }

// State returns the current state.
func (q *QP) State() State {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.state
}

// Query returns the current attributes (ibv_query_qp): the values last set
// by Modify, with State, CurState and Cap filled in.
func (q *QP) Query() Attr {
	q.mu.Lock()
	defer q.mu.Unlock()
	a := q.attr
	a.State = q.state
	a.CurState = q.state
	a.Cap = q.cfg.Cap
	return a
}

// Modify changes attributes and state (ibv_modify_qp, IBTA 10.3.1 / 11.2.5).
// The transition and the mask are validated by CheckModify; attributes are
// then applied and the engine reacts to the new state (RESET clears the
// queues, ERR flushes them, RTR/RTS load the PSNs).
func (q *QP) Modify(a *Attr, mask AttrMask) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead {
		return ErrDestroyed
	}
	defer q.syncWrites()
	next, err := CheckModify(q.typ, q.state, a, mask, q.dev)
	if err != nil {
		return err
	}
	var path Path
	if mask&AttrAV != 0 && !q.typ.Datagram() {
		if q.cfg.Resolve == nil {
			return ErrBadWR
		}
		if path, err = q.cfg.Resolve(&a.AH); err != nil {
			return err
		}
		path.Src, path.Dst = path.Src.Unmap(), path.Dst.Unmap()
	}
	if mask&AttrSelectiveRepeat != 0 && a.SelectiveRepeat && q.cfg.RecvRefill != nil {
		return ErrSelectiveRepeat
	}
	q.applyAttr(a, mask)
	if mask&AttrAV != 0 && !q.typ.Datagram() {
		q.path = path
	}
	prev := q.state
	if next == prev {
		return nil
	}
	switch next {
	case StateReset:
		q.state = StateReset
		q.resetLocked()
	case StateRTR:
		q.state = StateRTR
		q.resp.epsn = bth.PSN(q.attr.RQPSN & bth.PSNMask)
	case StateRTS:
		q.state = StateRTS
		if prev == StateRTR {
			q.req.psn = bth.PSN(q.attr.SQPSN & bth.PSNMask)
			q.comp.psn = q.req.psn
			q.req.next = q.req.psn
			q.req.sentEnd = q.req.psn
			q.tmr.retryLeft = q.attr.RetryCnt
			q.tmr.rnrLeft = q.attr.RNRRetry
		}
		q.runRequester()
		q.flush()
		q.armTimer()
	case StateErr:
		q.enterError()
		q.flush()
	case StateSQD:
		q.state = StateSQD
		q.maybeDrained()
	default:
		q.state = next
	}
	return nil
}

func (q *QP) applyAttr(a *Attr, m AttrMask) {
	t := &q.attr
	if m&AttrPathMTU != 0 {
		t.PathMTU = a.PathMTU
		if !q.typ.Datagram() {
			q.mtu = uint32(a.PathMTU.Bytes())
		}
	}
	if m&AttrPathMigState != 0 {
		t.PathMigState = a.PathMigState
	}
	if m&AttrQKey != 0 {
		t.QKey = a.QKey
	}
	if m&AttrRQPSN != 0 {
		t.RQPSN = a.RQPSN & bth.PSNMask
	}
	if m&AttrSQPSN != 0 {
		t.SQPSN = a.SQPSN & bth.PSNMask
	}
	if m&AttrDestQPN != 0 {
		t.DestQPN = a.DestQPN & bth.PSNMask
	}
	if m&AttrAccessFlags != 0 {
		t.AccessFlags = a.AccessFlags
	}
	if m&AttrPKeyIndex != 0 {
		t.PKeyIndex = a.PKeyIndex
	}
	if m&AttrPort != 0 {
		t.Port = a.Port
	}
	if m&AttrAV != 0 {
		t.AH = a.AH
	}
	if m&AttrAltPath != 0 {
		t.AltAH = a.AltAH
	}
	if m&AttrEnSQDAsyncNotify != 0 {
		t.SQDrainEvent = a.SQDrainEvent
	}
	if m&AttrTimeout != 0 {
		t.Timeout = a.Timeout
	}
	if m&AttrRetryCnt != 0 {
		t.RetryCnt = a.RetryCnt
		q.tmr.retryLeft = a.RetryCnt
	}
	if m&AttrRNRRetry != 0 {
		t.RNRRetry = a.RNRRetry
		q.tmr.rnrLeft = a.RNRRetry
	}
	if m&AttrMinRNRTimer != 0 {
		t.MinRNRTimer = a.MinRNRTimer
	}
	if m&AttrMaxQPRDAtomic != 0 {
		t.MaxRDAtomic = a.MaxRDAtomic
	}
	if m&AttrMaxDestRDAtomic != 0 {
		t.MaxDestRDAtomic = a.MaxDestRDAtomic
		n := int(a.MaxDestRDAtomic)
		if n < 1 {
			n = 1
		}
		if q.resN != n {
			// allocated at the first READ/atomic (newResource)
			q.resN = n
			q.resp.res = nil
			q.resp.resNext = 0
		}
	}
	if m&AttrSelectiveRepeat != 0 {
		t.SelectiveRepeat = a.SelectiveRepeat && q.typ == TypeRC
	}
	if m&AttrRateLimit != 0 {
		// ibv_modify_qp_rate_limit: kbit/s, 0 removes the limit (congestion.go)
		t.RateLimit = a.RateLimit
		q.cc.limit = float64(a.RateLimit) * 1000
		q.ccRate()
	}
}

// resetLocked returns the QP to its just-created state (IBTA 10.3.1: a
// transition to RESET empties both work queues without completions).
func (q *QP) resetLocked() {
	q.detachWrites()
	for i := range q.sq {
		q.sq[i].reset()
	}
	q.sqHead, q.sqReq, q.sqTail = 0, 0, 0
	q.rqHead, q.rqTail = 0, 0
	q.dropHeld()
	q.rdAtomicInFlight = 0
	q.req = requester{sr: q.req.sr, srr: q.req.srr}
	q.req.sr.clear()
	res, sge, sr, rdq := q.resp.res, q.resp.wqe.sge, q.resp.sr, q.resp.rdq
	for i := range res {
		res[i] = resource{}
	}
	sr.clear()
	// res, the receive WQE's SGL and the reorder buffer are allocated when first needed
	// (newResource, popRecv, srStore)
	rdq.clear()
	q.resp = responder{res: res, wqe: recvWQE{sge: sge[:0]}, sr: sr, rdq: rdq}
	q.comp = completer{}
	q.budgetRelease()
	if q.tmr.t != nil {
		q.tmr.t.Stop()
	}
	q.tmr = timers{t: q.tmr.t}
	q.resetCC()
	q.releaseTx()
	q.mtu = uint32(q.attr.PathMTU.Bytes())
	if q.mtu == 0 || q.typ.Datagram() {
		q.mtu = uint32(q.cfg.MTU.Bytes())
	}
	if q.mtu == 0 {
		q.mtu = 1024
	}
}

func (w *sendWQE) reset() {
	sge, inl := w.sge[:0], w.inline
	if inl != nil {
		inl = inl[:0]
	}
	*w = sendWQE{sge: sge, inline: inl, srr: w.srr}
}

// Destroy stops the QP's timer and marks it destroyed (ibv_destroy_qp).
// Outstanding WRs are discarded without completions.
func (q *QP) Destroy() {
	q.mu.Lock()
	defer q.mu.Unlock()
	// A deferred receive (ReceiveDeferred) completed its requests before their ACKs leave at
	// FlushReceived: send them now, the program may destroy the QP as soon as it polled.
	q.flush()
	q.detachWrites()
	q.dropHeld()
	q.dead = true
	q.state = StateReset
	q.budgetRelease()
	if q.tmr.t != nil {
		q.tmr.t.Stop()
		q.tmr.armed = false
	}
}

// enterError moves the QP to ERR and flushes both work queues in order
// with WR_FLUSH_ERR (IBTA 10.3.1 "Error"; completions with WR_FLUSH_ERR).
// WQEs already completed with an error status keep it.
func (q *QP) enterError() {
	if q.state == StateErr {
		q.flushQueues()
		return
	}
	q.state = StateErr
	q.budgetRelease()
	q.detachWrites()
	q.resp.rd = readGen{} // no more READ responses (readresp.go)
	q.resp.rdq.clear()
	// a WRITE that was still arriving never completes: its unplaced bytes are dropped, never
	// placed later into memory its program may have reused (copybatch.go)
	q.resp.behind.n = 0
	q.req.ahead.w = nil
	q.dropHeld()
	q.resp.sr.clear() // nor requests held out of order (selective.go)
	q.tmr.t.Stop()
	q.tmr.armed = false
	q.tmr.rnrWait = false
	q.flushQueues()
	if q.cfg.SRQ != nil && q.cfg.Events != nil {
		q.cfg.Events(event.Event{Type: event.QPLastWQEReached, Object: q, QPN: q.num})
	}
}

func (q *QP) flushQueues() {
	for q.sqHead != q.sqTail {
		w := q.slot(q.sqHead)
		var wc cq.WC
		wc.WRID = w.wr.WRID
		wc.QPNum = q.num
		wc.Opcode = wcOpcode(w.wr.Opcode)
		if w.done && w.status != cq.StatusSuccess {
			wc.Status = w.status
		} else if w.done {
			wc.Status = cq.StatusSuccess
		} else {
			wc.Status = cq.StatusWRFlushErr
		}
		if wc.Status != cq.StatusSuccess || w.signaled(q.cfg.SigAll) {
			q.cfg.SendCQ.Push(&wc, false)
		}
		w.reset()
		q.sqHead++
	}
	q.sqReq = q.sqHead
	q.rdAtomicInFlight = 0
	for q.rqHead != q.rqTail {
		r := &q.rq[q.rqHead%uint32(len(q.rq))]
		wc := cq.WC{WRID: r.wrid, Status: cq.StatusWRFlushErr, Opcode: cq.OpRecv, QPNum: q.num}
		q.cfg.RecvCQ.Push(&wc, false)
		q.rqHead++
	}
	if q.resp.haveWQE && q.cfg.SRQ != nil {
		wc := cq.WC{WRID: q.resp.wqe.wrid, Status: cq.StatusWRFlushErr, Opcode: cq.OpRecv, QPNum: q.num}
		q.cfg.RecvCQ.Push(&wc, false)
	}
	q.resp.haveWQE = false
}

func (q *QP) slot(i uint32) *sendWQE { return &q.sq[i%uint32(len(q.sq))] }

func (w *sendWQE) signaled(all bool) bool { return all || w.wr.Flags&SendSignaled != 0 }

// PostSend queues send work requests (ibv_post_send, IBTA 11.4.1.1) and
// runs the requester. On error it returns the index of the first WR not
// posted (like ibverbs' bad_wr). In ERR the WRs are accepted and flushed.
func (q *QP) PostSend(wrs []SendWR) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead {
		return 0, ErrDestroyed
	}
	switch q.state {
	case StateRTS, StateSQD, StateErr, StateSQE:
	default:
		return 0, ErrInvalidState
	}
	for i := range wrs {
		if err := q.enqueueSend(&wrs[i]); err != nil {
			q.afterPost()
			return i, err
		}
	}
	q.afterPost()
	return len(wrs), nil
}

func (q *QP) afterPost() {
	switch q.state {
	case StateErr:
		q.flushQueues()
	case StateRTS:
		q.runRequester()
		q.flush()
		q.armTimer()
	}
}

func (q *QP) enqueueSend(wr *SendWR) error {
	q.ensureSQ()
	if q.sqTail-q.sqHead >= uint32(len(q.sq)) {
		return ErrQueueFull
	}
	if wr.Opcode.Local() {
		// LOCAL_INV and BIND_MW (IBTA 10.6.7): memory operations run by
		// the requester in send-queue order, completed in order.
		if q.typ.Datagram() || (wr.Opcode == WRBindMW && wr.Bind == nil) {
			return ErrBadOpcode
		}
		w := q.slot(q.sqTail)
		w.reset()
		w.wr = *wr
		w.wr.SGL, w.wr.AH, w.wr.Bind = nil, nil, nil
		if wr.Bind != nil {
			w.bind = *wr.Bind
		}
		q.sqTail++
		return nil
	}
	total, err := ValidateSend(q.typ, wr, WRLimits{
		MaxSGE:        int(q.cfg.Cap.MaxSendSGE),
		MaxInlineData: int(q.cfg.Cap.MaxInlineData),
		MaxMsgSize:    q.dev.MaxMsgSize,
	})
	if err != nil {
		return err
	}
	k := kindOf(wr.Opcode)
	inline := wr.Flags&SendInline != 0 && (k == kindSend || k == kindWrite)
	w := q.slot(q.sqTail)
	w.reset()
	if q.typ.Datagram() {
		if total > q.mtu {
			return ErrMsgTooLong // IBTA 9.8.3: a UD message is one packet
		}
		p := Path{Src: wr.AH.SGID.Unmap(), Dst: wr.AH.DGID.Unmap(), TClass: wr.AH.TrafficClass}
		if !p.Src.IsValid() {
			if q.cfg.Resolve == nil {
				return ErrWRNoAH
			}
			if p, err = q.cfg.Resolve(&wr.AH.AHAttr); err != nil {
				return err
			}
		}
		w.path = p
		w.dqpn = wr.RemoteQPN & bth.PSNMask
		w.qkey = wr.RemoteQKey
		if w.qkey&0x80000000 != 0 {
			// IBTA 10.2.5 (Q_Key rules): a WR Q_Key with the high-order
			// bit set means "use the QP's own Q_Key".
			w.qkey = q.attr.QKey
		}
	}
	w.wr = *wr
	w.wr.AH = nil
	w.wr.Bind = nil
	w.wr.Inline = nil // the caller's buffer: copied below
	if k == kindAtomicWrite && wr.Flags&SendInline != 0 {
		// The operand, taken now (IBTA 11.4.1.1) into the WQE's own 8 bytes (ValidateSend).
		n := copy(w.operand[:], wr.Inline)
		for _, s := range wr.SGL {
			if err := q.cfg.MRs.CopyOut(q.cfg.PD, mr.NoQPN, s.LKey, s.Addr, w.operand[n:n+int(s.Length)], mr.OpLocalRead); err != nil {
				return err
			}
			n += int(s.Length)
		}
		w.wr.SGL, w.hasOperand = nil, true
	} else if inline {
		// IBTA 11.4.1.1 (inline data): the data is copied at post time
		// from the addresses in the SGL (or given by value: SendWR.Inline).
		buf := append(w.inline[:0], wr.Inline...)
		for _, s := range wr.SGL {
			if s.Length == 0 {
				continue
			}
			n := len(buf)
			buf = append(buf, make([]byte, s.Length)...) // within cap: total <= MaxInlineData
			if err := q.cfg.MRs.CopyOut(q.cfg.PD, mr.NoQPN, s.LKey, s.Addr, buf[n:], mr.OpLocalRead); err != nil {
				return err
			}
		}
		w.inline = buf
		w.wr.SGL = nil
		w.isInline = true
	} else {
		w.sge = append(w.sge[:0], wr.SGL...)
		w.wr.SGL = w.sge
	}
	w.length = total
	if k == kindFlush {
		w.length = wr.FlushLength // its completion's byte_len, as rxe reports it
	}
	q.sqTail++
	return nil
}

// PostRecv queues receive work requests (ibv_post_recv, IBTA 11.4.1.2).
// It returns the index of the first WR not posted on error. In ERR the WRs
// are accepted and flushed.
func (q *QP) PostRecv(wrs []RecvWR) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead {
		return 0, ErrDestroyed
	}
	if q.cfg.SRQ != nil {
		return 0, ErrHasSRQ
	}
	if q.state == StateReset {
		return 0, ErrInvalidState
	}
	q.ensureRQ()
	for i := range wrs {
		wr := &wrs[i]
		if q.rqTail-q.rqHead >= uint32(len(q.rq)) {
			return i, ErrQueueFull
		}
		if uint32(len(wr.SGL)) > q.cfg.Cap.MaxRecvSGE {
			return i, ErrTooManySGE
		}
		r := &q.rq[q.rqTail%uint32(len(q.rq))]
		r.wrid = wr.WRID
		r.n = copy(r.sge, wr.SGL)
		q.rqTail++
	}
	if q.state == StateErr {
		q.flushQueues()
	}
	return len(wrs), nil
}

// popRecv takes the next receive WQE from the RQ or the SRQ into dst.
func (q *QP) popRecv(dst *recvWQE) bool {
	if q.cfg.SRQ != nil {
		wr := RecvWR{SGL: dst.sge[:0]}
		if !q.cfg.SRQ.Take(&wr) {
			return false
		}
		dst.wrid = wr.WRID
		dst.sge = wr.SGL
		dst.n = len(wr.SGL)
		return true
	}
	if q.rqHead == q.rqTail {
		return false
	}
	r := &q.rq[q.rqHead%uint32(len(q.rq))]
	dst.wrid = r.wrid
	if cap(dst.sge) < r.n {
		dst.sge = make([]SGE, r.n)
	}
	dst.sge = dst.sge[:cap(dst.sge)]
	dst.n = copy(dst.sge, r.sge[:r.n])
	q.rqHead++
	return true
}

// maybeDrained raises SQ_DRAINED once SQD has no outstanding WQEs.
func (q *QP) maybeDrained() {
	if q.state != StateSQD || q.sqHead != q.sqReq || q.sqReq != q.sqTail && q.slot(q.sqReq).started {
		return
	}
	if q.attr.SQDrainEvent && q.cfg.Events != nil && !q.req.drainSignaled {
		q.req.drainSignaled = true
		q.cfg.Events(event.Event{Type: event.SQDrained, Object: q, QPN: q.num})
	}
}

// Counters are the device's transport counters, named as rxe's
// (rxe_hw_counters.c). Updated atomically; read them through Snapshot.
type Counters struct {
	SentPkts, RcvdPkts                      atomic.Uint64
	DuplicateRequest, OutOfSeqRequest       atomic.Uint64
	RcvdRNRErr, SendRNRErr, RcvdSeqErr      atomic.Uint64
	AckDeferred, RetryExceededErr           atomic.Uint64
	RetryRNRExceededErr, CompleterRetryErr  atomic.Uint64
	SendErr, RDMASends, RDMARecvs           atomic.Uint64
	LinkDowned, RcvdICRCSolved, RcvdDropped atomic.Uint64
	// RetransPkts counts request packets sent again (go-back-N after a
	// timeout, a NAK or a response gap; READ resumes): softroce's own
	// counter, "retransmitted_pkts".
	RetransPkts atomic.Uint64
	// RcvdGSOSplit counts datagrams that arrived as an unsegmented UDP GSO message
	// (an AF_XDP link on a veth or loopback sees the sender's whole GSO buffer) and
	// were split back into their packets: softroce's own, "rcvd_gso_split".
	RcvdGSOSplit atomic.Uint64
	// Congestion control, under mlx5's names (docs/congestion.md): CE-marked RoCE packets
	// received (np_ecn_marked_roce_packets), CNPs sent (np_cnp_sent), CNPs DCQCN acted on
	// (rp_cnp_handled) and CNPs received but not acted on (rp_cnp_ignored).
	NPECNMarked, NPCNPSent, RPCNPHandled, RPCNPIgnored atomic.Uint64
	// RespRemoteAccessErrors counts requests the responder refused for their R_Key:
	// unknown or invalidated key, out of bounds, or without the right (NAKed with a
	// remote access error on RC, dropped on UC; IBTA 9.7.4.1.5, C9-88): each is a
	// wrong or guessed key. mlx5's name, "resp_remote_access_errors"; per QP:
	// QP.RemoteAccessErrors.
	RespRemoteAccessErrors atomic.Uint64
	// Selective repeat (selective.go), softroce's own: SACKs a responder sent
	// (sent_sack), SACKs a requester acted on (rcvd_sack), and request packets it resent
	// one by one for them (selective_retrans_pkts, also in retransmitted_pkts).
	SentSACK, RcvdSACK, SelectiveRetrans atomic.Uint64
}

// Stats is a snapshot of Counters.
type Stats struct {
	SentPkts, RcvdPkts                      uint64
	DuplicateRequest, OutOfSeqRequest       uint64
	RcvdRNRErr, SendRNRErr, RcvdSeqErr      uint64
	AckDeferred, RetryExceededErr           uint64
	RetryRNRExceededErr, CompleterRetryErr  uint64
	SendErr, RDMASends, RDMARecvs           uint64
	LinkDowned, RcvdICRCSolved, RcvdDropped uint64
	RetransPkts                             uint64
	RcvdGSOSplit                            uint64
	NPECNMarked, NPCNPSent                  uint64
	RPCNPHandled, RPCNPIgnored              uint64
	RespRemoteAccessErrors                  uint64
	SentSACK, RcvdSACK, SelectiveRetrans    uint64
	// Link counters, which the device fills from its UDP link (roce.Device.Stats;
	// Counters.Snapshot leaves them 0): send-only entropy-port sockets open
	// (IBTA A17.3.2), entropy ports that fell back to the main socket (port
	// taken or pool full), GSO/GRO offloads turned off after the kernel
	// refused them. Map: link_entropy_sockets, link_entropy_fallbacks,
	// link_offload_fallbacks.
	LinkEntropySockets, LinkEntropyFallbacks, LinkOffloadFallbacks uint64
}

// Snapshot reads every counter.
func (c *Counters) Snapshot() Stats {
	return Stats{
		SentPkts: c.SentPkts.Load(), RcvdPkts: c.RcvdPkts.Load(),
		DuplicateRequest: c.DuplicateRequest.Load(), OutOfSeqRequest: c.OutOfSeqRequest.Load(),
		RcvdRNRErr: c.RcvdRNRErr.Load(), SendRNRErr: c.SendRNRErr.Load(), RcvdSeqErr: c.RcvdSeqErr.Load(),
		AckDeferred: c.AckDeferred.Load(), RetryExceededErr: c.RetryExceededErr.Load(),
		RetryRNRExceededErr: c.RetryRNRExceededErr.Load(), CompleterRetryErr: c.CompleterRetryErr.Load(),
		SendErr: c.SendErr.Load(), RDMASends: c.RDMASends.Load(), RDMARecvs: c.RDMARecvs.Load(),
		LinkDowned: c.LinkDowned.Load(), RcvdICRCSolved: c.RcvdICRCSolved.Load(), RcvdDropped: c.RcvdDropped.Load(),
		RetransPkts: c.RetransPkts.Load(), RcvdGSOSplit: c.RcvdGSOSplit.Load(),
		NPECNMarked: c.NPECNMarked.Load(), NPCNPSent: c.NPCNPSent.Load(),
		RPCNPHandled: c.RPCNPHandled.Load(), RPCNPIgnored: c.RPCNPIgnored.Load(),
		RespRemoteAccessErrors: c.RespRemoteAccessErrors.Load(),
		SentSACK:               c.SentSACK.Load(), RcvdSACK: c.RcvdSACK.Load(), SelectiveRetrans: c.SelectiveRetrans.Load(),
	}
}

// Map returns the snapshot keyed by rxe's counter names (plus
// softroce's own: rcvd_icrc_solved, rcvd_dropped, retransmitted_pkts, rcvd_gso_split,
// sent_sack, rcvd_sack, selective_retrans_pkts; and
// mlx5's: np_ecn_marked_roce_packets, np_cnp_sent, rp_cnp_handled, rp_cnp_ignored,
// resp_remote_access_errors).
func (s Stats) Map() map[string]uint64 {
	return map[string]uint64{
		"sent_pkts": s.SentPkts, "rcvd_pkts": s.RcvdPkts,
		"duplicate_request": s.DuplicateRequest, "out_of_seq_request": s.OutOfSeqRequest,
		"rcvd_rnr_err": s.RcvdRNRErr, "send_rnr_err": s.SendRNRErr, "rcvd_seq_err": s.RcvdSeqErr,
		"ack_deferred": s.AckDeferred, "retry_exceeded_err": s.RetryExceededErr,
		"retry_rnr_exceeded_err": s.RetryRNRExceededErr, "completer_retry_err": s.CompleterRetryErr,
		"send_err": s.SendErr, "rdma_sends": s.RDMASends, "rdma_recvs": s.RDMARecvs,
		"link_downed": s.LinkDowned, "rcvd_icrc_solved": s.RcvdICRCSolved, "rcvd_dropped": s.RcvdDropped,
		"retransmitted_pkts": s.RetransPkts, "rcvd_gso_split": s.RcvdGSOSplit,
		"np_ecn_marked_roce_packets": s.NPECNMarked, "np_cnp_sent": s.NPCNPSent,
		"rp_cnp_handled": s.RPCNPHandled, "rp_cnp_ignored": s.RPCNPIgnored,
		"resp_remote_access_errors": s.RespRemoteAccessErrors,
		"sent_sack":                 s.SentSACK, "rcvd_sack": s.RcvdSACK, "selective_retrans_pkts": s.SelectiveRetrans,
		"link_entropy_sockets": s.LinkEntropySockets, "link_entropy_fallbacks": s.LinkEntropyFallbacks,
		"link_offload_fallbacks": s.LinkOffloadFallbacks,
	}
}
