// Long file: the package's pipeline and concurrency comment and the Device it describes, from
// Open to Close, with the receive loop and the device-level checks of every datagram, in
// reading order.

// Package roce is softroce's device API: a RoCEv2 (InfiniBand transport
// over UDP 4791) software RDMA device in the shape of ibverbs. A Device is
// opened on a link (UDP sockets or the in-memory network); it owns the
// memory-region table, the QP table and one receive goroutine.
//
// Pipeline and concurrency (read this first):
//
//   - one receive goroutine per Device: link.Recv fills a batch; each
//     datagram is parsed (bth.Parse), its destination address checked
//     against the GID table, its ICRC verified (IPv4: with ID 0, else by
//     solving for the sender's IPv4 ID, counted in rcvd_icrc_solved;
//     IPv6: a full check), QPN 0 and the multicast QPN dropped, QPN 1
//     routed to the GSI QP, and the packet handed to its QP through an
//     O(1) table (QPN & mask, confirmed by number). The QP runs its
//     responder/completer under its own mutex and may send from this
//     goroutine (ACKs, READ responses, the next window of requests).
//   - PostSend runs the requester inline on the caller's goroutine under
//     the QP's mutex; each QP has one timer from the Clock (an AfterFunc)
//     for ACK timeouts and RNR waits.
//   - the device mutex guards only object creation and destruction; the
//     QP table is read without it (atomic pointers).
//   - Close closes the link (which ends Recv), waits for the receive
//     goroutine, and destroys every QP (stopping its timer), so no
//     goroutine outlives the Device.
//
// The per-QP rules (which packet a QP accepts) are in internal/qp; see
// docs/engine.md and docs/api.md.
package roce

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/event"
	"github.com/softroce/softroce/internal/gid"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/afxdp"
)

// Errors returned by the device API.
var (
	// ErrClosed: the device was closed.
	ErrClosed = errors.New("roce: device closed")
	// ErrNoLink: Options.Link is nil.
	ErrNoLink = errors.New("roce: no link")
	// ErrLimit: a device limit (max_qp, max_cq, max_ah, ...) was reached.
	ErrLimit = errors.New("roce: device limit reached")
	// ErrBusy: the object is in use (device memory with an MR over it).
	ErrBusy = errors.New("roce: resource busy")
	// ErrBadGIDIndex: an address vector names a GID index the table does not have.
	ErrBadGIDIndex = errors.New("roce: GID index out of range")
	// ErrInvalidArg: a nil or malformed argument.
	ErrInvalidArg = errors.New("roce: invalid argument")
)

// FirstQPN is the lowest QP number handed out (rxe: RXE_MIN_QP_INDEX 16,
// numbers start at 0x11); 0 and 1 are the special QPs (IBTA 9.6.1.1).
const FirstQPN = 0x11

// Options configure Open.
type Options struct {
	// Link moves the datagrams (required). The device owns it: Close closes it.
	Link link.Link
	// Clock drives the transport timers (nil = the real clock).
	Clock qp.Clock
	// Port is the UDP destination port of every packet sent (0 = 4791);
	// tests running on another port set it to the peers' port.
	Port uint16
	// MTU is the port's active MTU (0 = MTU4096 for the link; rxe uses the
	// netdev MTU - 80 rounded down, 1500 -> 1024).
	MTU qp.MTU
	// Attr overrides the device attributes (nil = qp.DefaultDeviceAttr()).
	Attr *qp.DeviceAttr
	// Events receives asynchronous events synchronously (must not block);
	// nil queues them for Device.Events instead.
	Events event.Sink
	// Name is the device name (default "softroce0").
	Name string
	// GIDs is the GID table (nil = gid.FromAddrs of the link's local
	// addresses: index 0 the fe80:: link-local GID, then the IPv4
	// addresses as ::ffff:a.b.c.d, then IPv6, as rxe lays it out).
	GIDs *gid.Table
	// KeyRand is the source of MR/MW key bytes (nil = crypto/rand); tests
	// set it to get deterministic keys.
	KeyRand io.Reader
	// QPNRand is the source of QP numbers (nil = crypto/rand; CreateQP).
	// Tests set it for determinism; a reader of zeros hands the numbers out
	// in order from FirstQPN, as rxe does.
	QPNRand io.Reader
	// CM configures QP1 (the GSI QP) and the Communication Manager on it
	// (gsi.go); the zero value enables both.
	CM CMOptions
	// Shards are more links on the same addresses and port, one per extra
	// receive worker (udp.ListenShards steers datagrams to link
	// DestQP mod (1+len(Shards)), Link being shard 0); QP n sends through
	// the same link. The device owns them (fastpath.go).
	Shards []link.Link
	// Pin locks each receive worker to its own OS thread, pinned to CPU
	// (worker index mod the CPUs this process may use).
	Pin bool
	// Polled starts no receive goroutine: the application receives by
	// calling Device.Poll from its own goroutine, and the packets a Poll
	// makes (ACKs, READ responses, requests) leave at the next post or
	// Poll on their QP (poll.go). Every link must be a link.PollReceiver.
	Polled bool
	// CC is the congestion control of the device's QPs (ECN, CNPs, DCQCN;
	// docs/congestion.md); nil = DefaultCC(). A QP may have its own
	// (QPInit.CC).
	CC *CCParams
	// LineRate is the device's line rate in bit/s, DCQCN's maximum rate
	// (0 = 100 Gbit/s; OpenUDP reads an interface's speed).
	LineRate float64
	// RxeFlushICRC makes the device's QPs send RC FLUSHes with the ICRC kernel rxe computes
	// for them (BTH, FETH and RETH covered twice), which rxe 6.2 up to at least 6.12 needs
	// to answer a FLUSH; a hardware RNIC drops such a FLUSH. Received FLUSHes pass with
	// either ICRC regardless (rxeflush.go).
	RxeFlushICRC bool

	// mac is the hardware address of the interface OpenUDP's addresses are on: with GIDs
	// nil it derives the index-0 GID and the GUIDs, as for a table built from the interface.
	mac net.HardwareAddr
}

// Device is an open softroce device. Its methods are safe for concurrent use.
type Device struct {
	name  string
	link  link.Link
	clock qp.Clock
	port  uint16
	mtu   qp.MTU
	attr  qp.DeviceAttr
	tbl   *mr.Table
	gids  *gid.Table

	cnt      qp.Counters
	atomicMu sync.Mutex

	mu      sync.Mutex
	closed  atomic.Bool
	qpnRand io.Reader
	qpnBuf  [3]byte
	nqp     int
	qps     []atomic.Pointer[QP] // indexed by QPN & qpMask
	qpMask  uint32
	gsi     atomic.Pointer[QP]
	g       *gsi // QP1 and the CM (nil with CMOptions.Disable)
	cqs     map[*cq.CQ]struct{}
	srqs    map[*qp.SRQ]struct{}

	// links[0] is link; the rest are Options.Shards (one receive worker each)
	links []link.Link
	pin   bool
	// scheds[i] is the responder scheduler of worker i (sched.go)
	scheds []*respSched

	events   chan event.Event
	userSink event.Sink
	wg       sync.WaitGroup
	// batchMu is read-held by a receive worker while it handles one batch and flushes it;
	// Close takes it before closing the link, so the ACKs of requests whose completions a
	// program may already have polled leave before the socket goes (IBTA 9.7.5.1).
	batchMu sync.RWMutex

	// pl is the polled mode's receive state (Options.Polled; poll.go); nil otherwise.
	pl *pollState
	// cc is Options.CC (the QPs' default), line Options.LineRate
	cc   CCParams
	line float64
	// rxeFlush: Options.RxeFlushICRC
	rxeFlush bool
	// dm is the device memory and the XDP write responder (devmem.go); nil without
	dm *devMem
}

// QP is a queue pair of a Device: the internal/qp engine object (Modify, Query,
// PostSend, PostRecv, State, Num) plus Destroy.
type QP struct {
	*qp.QP
	dev *Device
}

// Open creates a device on o.Link and starts its receive goroutine.
func Open(o Options) (*Device, error) {
	if o.Link == nil {
		return nil, ErrNoLink
	}
	d := &Device{
		name: o.Name, link: o.Link, clock: o.Clock, port: o.Port, mtu: o.MTU,
		qpnRand: o.QPNRand, userSink: o.Events, pin: o.Pin,
		links: append([]link.Link{o.Link}, o.Shards...),
		cqs:   map[*cq.CQ]struct{}{}, srqs: map[*qp.SRQ]struct{}{},
		events: make(chan event.Event, 256),
	}
	if d.name == "" {
		d.name = "softroce0"
	}
	if d.clock == nil {
		d.clock = qp.RealClock{}
	}
	if d.qpnRand == nil {
		d.qpnRand = rand.Reader
	}
	if d.port == 0 {
		d.port = bth.UDPPort
	}
	if !d.mtu.Valid() {
		d.mtu = qp.MTU4096 // loopback and the in-memory link
		if o.GIDs != nil {
			d.mtu = qp.MTUFromBytes(o.GIDs.ActiveMTU())
		}
	}
	if o.Attr != nil {
		d.attr = *o.Attr
	} else {
		d.attr = qp.DefaultDeviceAttr()
	}
	d.cc = DefaultCC()
	if o.CC != nil {
		d.cc = *o.CC
	}
	d.line = o.LineRate
	d.rxeFlush = o.RxeFlushICRC
	to := d.attr.TableOptions()
	to.Rand = o.KeyRand
	if d.dm = newDevMem(o.Link); d.dm != nil {
		to.OnKey = d.dm.keyChanged
	}
	d.tbl = mr.NewTable(to)
	d.gids = o.GIDs
	if d.gids == nil {
		d.gids = gid.FromAddrs(gid.Options{Addrs: o.Link.LocalAddrs(), MAC: o.mac})
	}
	// A node GUID of 0 (the attributes' default) is the one rxe gives a device: the EUI-64 of
	// its interface's MAC, which is also the index-0 GID's interface identifier, and the same
	// value for the system image GUID (rxe_register_device, rxe_init_device_param).
	if d.attr.NodeGUID == 0 {
		d.attr.NodeGUID = d.gids.GUID()
	}
	if d.attr.SysImageGUID == 0 {
		d.attr.SysImageGUID = d.attr.NodeGUID
	}
	size := uint32(1)
	for size < uint32(d.attr.MaxQP)+FirstQPN && size < 1<<24 {
		size <<= 1
	}
	d.qps = make([]atomic.Pointer[QP], size)
	d.qpMask = size - 1
	if o.Polled {
		if err := d.initPoll(); err != nil {
			return nil, err
		}
	}
	d.scheds = make([]*respSched, len(d.links))
	for i := range d.scheds {
		d.scheds[i] = newRespSched()
	}
	if err := d.openGSI(o.CM); err != nil {
		return nil, err
	}
	for i, l := range d.links {
		if d.pl != nil {
			break // polled mode: the application's Poll reads the links and runs the schedulers
		}
		d.wg.Add(2)
		go d.recvLoop(i, l)
		go d.runSched(d.scheds[i])
	}
	return d, nil
}

// CCParams returns the device's congestion control parameters (Options.CC).
func (d *Device) CCParams() CCParams { return d.cc }

// ccFor returns the congestion control of a new QP: its own, else the device's.
func (d *Device) ccFor(own *CCParams) *CCParams {
	if own != nil {
		c := *own
		return &c
	}
	c := d.cc
	return &c
}

// Name returns the device name.
func (d *Device) Name() string { return d.name }

// Attr returns the device attributes (ibv_query_device).
func (d *Device) Attr() qp.DeviceAttr { return d.attr }

// PortAttr returns the attributes of port 1 (ibv_query_port).
func (d *Device) PortAttr() qp.PortAttr {
	p := qp.DefaultPortAttr(d.mtu.Bytes() + 80)
	return p
}

// GIDTable returns the GID table (internal/gid; immutable).
func (d *Device) GIDTable() *gid.Table { return d.gids }

// GIDs returns the address of every GID table entry, in index order
// (RoCEv2 GIDs are IPv4-mapped or IPv6 addresses, IBTA A17.8): index 0 is
// the link-local GID, which RoCEv2 traffic cannot be sent from.
func (d *Device) GIDs() []netip.Addr {
	es := d.gids.Entries()
	out := make([]netip.Addr, len(es))
	for i, e := range es {
		out[i] = e.Addr
	}
	return out
}

// Addrs returns the addresses the device sends from and receives on
// (the GID table without the link-local entry).
func (d *Device) Addrs() []netip.Addr { return d.gids.Addrs() }

// GID returns the address of GID index i (ibv_query_gid).
func (d *Device) GID(i int) (netip.Addr, error) {
	e, err := d.gids.Entry(i)
	if err != nil {
		return netip.Addr{}, ErrBadGIDIndex
	}
	return e.Addr, nil
}

// GIDIndex returns the index of addr in the GID table, or -1.
func (d *Device) GIDIndex(addr netip.Addr) int {
	i, err := d.gids.Index(addr)
	if err != nil {
		return -1
	}
	return i
}

func (d *Device) hasGID(a netip.Addr) bool {
	_, err := d.gids.Index(a)
	return err == nil
}

// Stats returns a snapshot of the device counters (rxe's names via Map), with
// the link's entropy-port and offload fallback counters (LinkStats).
func (d *Device) Stats() qp.Stats {
	s := d.cnt.Snapshot()
	if ls, ok := d.LinkStats(); ok {
		s.LinkEntropySockets, s.LinkEntropyFallbacks, s.LinkOffloadFallbacks = ls.UDP.EntropySockets, ls.UDP.EntropyFallbacks, ls.UDP.Fallbacks
	}
	return s
}

// Events returns the asynchronous event queue (ibv_get_async_event) used
// when Options.Events is nil. Events are dropped if it is full.
func (d *Device) Events() <-chan event.Event { return d.events }

func (d *Device) sink(e event.Event) {
	if e.Type == event.CommEst && d.g != nil {
		d.g.commEst(e)
	}
	if d.userSink != nil {
		d.userSink(e)
		return
	}
	select {
	case d.events <- e:
	default:
	}
}

// AllocPD allocates a protection domain (ibv_alloc_pd).
func (d *Device) AllocPD() (*mr.PD, error) {
	if d.closed.Load() {
		return nil, ErrClosed
	}
	return d.tbl.AllocPD()
}

// RegMR registers buf as a memory region at iova with the access flags
// (ibv_reg_mr; the Go slice stands for the registered memory, iova is the
// address remote peers and SGEs use).
func (d *Device) RegMR(pd *mr.PD, buf []byte, iova uint64, acc mr.Access) (*mr.MR, error) {
	if d.closed.Load() {
		return nil, ErrClosed
	}
	return d.tbl.RegMR(pd, buf, iova, acc)
}

// RegMRWith is RegMR with options: RegMROptions.Persist makes the region one a FLUSH can make
// durable (AccessFlushPersistent; see FileMemory and docs/objects.md, "Persistence").
func (d *Device) RegMRWith(pd *mr.PD, buf []byte, iova uint64, acc mr.Access, o RegMROptions) (*mr.MR, error) {
	if d.closed.Load() {
		return nil, ErrClosed
	}
	return d.tbl.RegMRWith(pd, buf, iova, acc, o)
}

// RegMemory registers length bytes of memory the device reaches by copying (mr.Memory: the
// softroce daemon's view of a client process's memory) at iova.
func (d *Device) RegMemory(pd *mr.PD, mem mr.Memory, length, iova uint64, acc mr.Access) (*mr.MR, error) {
	if d.closed.Load() {
		return nil, ErrClosed
	}
	return d.tbl.RegMemory(pd, mem, length, iova, acc)
}

// MRTable returns the device's memory-region table (memory windows,
// fast registration and invalidation live there; see internal/mr).
func (d *Device) MRTable() *mr.Table { return d.tbl }

// CreateCQ creates a completion queue of capacity cqe (ibv_create_cq).
func (d *Device) CreateCQ(cqe int) (*cq.CQ, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed.Load() {
		return nil, ErrClosed
	}
	if cqe < 1 || cqe > d.attr.MaxCQE || len(d.cqs) >= d.attr.MaxCQ {
		return nil, ErrLimit
	}
	c, err := cq.New(cq.Options{Capacity: cqe, Events: d.sink})
	if err != nil {
		return nil, err
	}
	d.cqs[c] = struct{}{}
	return c, nil
}

// DestroyCQ destroys a CQ (ibv_destroy_cq).
func (d *Device) DestroyCQ(c *cq.CQ) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.cqs, c)
	c.Destroy()
}

// CreateSRQ creates a shared receive queue (ibv_create_srq).
func (d *Device) CreateSRQ(o qp.SRQOptions) (*qp.SRQ, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed.Load() {
		return nil, ErrClosed
	}
	if len(d.srqs) >= d.attr.MaxSRQ {
		return nil, ErrLimit
	}
	if o.Events == nil {
		o.Events = d.sink
	}
	if o.Device == nil {
		o.Device = &d.attr
	}
	s, err := qp.NewSRQ(o)
	if err != nil {
		return nil, err
	}
	d.srqs[s] = struct{}{}
	return s, nil
}

// QPInit is ibv_qp_init_attr.
type QPInit struct {
	Type   qp.Type
	PD     *mr.PD
	SendCQ *cq.CQ
	RecvCQ *cq.CQ
	SRQ    *qp.SRQ
	Cap    qp.Cap
	// SigAll: every send WR generates a completion (sq_sig_all).
	SigAll bool
	// RecvRefill is qp.Config.RecvRefill: asked on the receive goroutine,
	// with no QP lock held, when a packet that consumes a receive WQE finds
	// the QP's receive queue empty, whether the owner holds receives not yet
	// posted; if so the QP holds the packet until the owner calls
	// QP.Refilled (the daemon's post ring, docs/daemon.md). Must not block.
	// nil = none.
	RecvRefill func(q *QP) bool
	// CC is this QP's congestion control (nil = the device's, Options.CC).
	CC *CCParams
	// Budget bounds the RC request packets in flight over every QP given the same one, on
	// top of each QP's own window (NewBudget; the daemon gives each user one). nil: none.
	Budget *Budget
}

// CreateQP creates a QP in RESET (ibv_create_qp). QP numbers are drawn at
// random from the 24-bit space (newQPN; rxe counts up from 0x11); TypeGSI
// gets QPN 1.
func (d *Device) CreateQP(in QPInit) (*QP, error) {
	if in.PD == nil || in.SendCQ == nil || in.RecvCQ == nil || !in.Type.Valid() {
		return nil, ErrInvalidArg
	}
	c := in.Cap
	if c.MaxSendWR > uint32(d.attr.MaxQPWR) || c.MaxRecvWR > uint32(d.attr.MaxQPWR) ||
		c.MaxSendSGE > uint32(d.attr.MaxSGE) || c.MaxRecvSGE > uint32(d.attr.MaxSGE) ||
		c.MaxInlineData > uint32(d.attr.MaxInlineData) {
		return nil, ErrLimit
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed.Load() {
		return nil, ErrClosed
	}
	if d.nqp >= d.attr.MaxQP {
		return nil, ErrLimit
	}
	var qpn uint32
	if in.Type == qp.TypeGSI {
		if d.gsi.Load() != nil {
			return nil, ErrLimit
		}
		qpn = 1
	} else {
		var err error
		if qpn, err = d.newQPN(); err != nil {
			return nil, err
		}
	}
	q := &QP{dev: d}
	var refill func(*qp.QP) bool
	if in.RecvRefill != nil {
		refill = func(*qp.QP) bool { return in.RecvRefill(q) } // asked only once q is in the table
	}
	eq, err := qp.New(qp.Config{
		Type: in.Type, QPN: qpn, PD: in.PD, MRs: d.tbl, SendCQ: in.SendCQ, RecvCQ: in.RecvCQ,
		SRQ: in.SRQ, Cap: in.Cap, SigAll: in.SigAll, Out: d.links[qpn%uint32(len(d.links))], Clock: d.clock,
		Resolve: d.resolve, DstPort: d.port, Device: &d.attr, Counters: &d.cnt,
		AtomicMu: &d.atomicMu, Events: d.sink, MTU: d.mtu, RecvRefill: refill,
		Writes: d.writesFor(qpn), Schedule: d.scheds[qpn%uint32(len(d.scheds))].add,
		CC: d.ccFor(in.CC), LineRate: d.line, RxeFlushICRC: d.rxeFlush, Budget: in.Budget,
	})
	if err != nil {
		return nil, err
	}
	q.QP = eq
	if qpn == 1 {
		d.gsi.Store(q)
	} else {
		d.qps[qpn&d.qpMask].Store(q)
	}
	d.nqp++
	return q, nil
}

// Destroy destroys the QP (ibv_destroy_qp): it stops receiving, its timer
// is stopped and outstanding WRs are discarded.
func (q *QP) Destroy() error {
	d := q.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	n := q.Num()
	if n == 1 {
		if d.gsi.Load() != q {
			return ErrInvalidArg
		}
		d.gsi.Store(nil)
	} else {
		if d.qps[n&d.qpMask].Load() != q {
			return ErrInvalidArg
		}
		d.qps[n&d.qpMask].Store(nil)
	}
	d.nqp--
	q.QP.Destroy()
	return nil
}

// newQPN draws the number of a new QP (d.mu held). A sender that is not on the path can
// inject packets into a QP only if it guesses its number (and, for a request, a PSN the QP
// accepts, and an R_Key): the numbers are drawn at random from the 24-bit space instead of
// counting up, where the next one is the last one seen plus one (docs/reliability.md,
// "What RoCEv2 cannot protect"). The draw excludes the numbers below FirstQPN (QP0, QP1 and
// the rest rxe reserves) and the multicast QPN 0xFFFFFF; from the drawn number on (wrapping)
// the first whose table slot (QPN & mask) is free is taken, so every live QP has its own
// number and slot. A reader of zeros gives FirstQPN, FirstQPN+1, ... as rxe does.
func (d *Device) newQPN() (uint32, error) {
	if _, err := io.ReadFull(d.qpnRand, d.qpnBuf[:]); err != nil {
		return 0, fmt.Errorf("%w: QP number: %v", ErrLimit, err)
	}
	r := uint32(d.qpnBuf[0])<<16 | uint32(d.qpnBuf[1])<<8 | uint32(d.qpnBuf[2])
	for k := uint32(0); k <= bth.PSNMask; k++ {
		qpn := (r + k) & bth.PSNMask
		if qpn < FirstQPN || qpn == bth.PSNMask {
			continue
		}
		if d.qps[qpn&d.qpMask].Load() == nil {
			return qpn, nil
		}
	}
	return 0, ErrLimit
}

// lookup returns the QP numbered qpn (O(1)), or nil.
func (d *Device) lookup(qpn uint32) *QP {
	if qpn == 1 {
		return d.gsi.Load()
	}
	q := d.qps[qpn&d.qpMask].Load()
	if q == nil || q.Num() != qpn {
		return nil
	}
	return q
}

// resolve maps an address vector to a path: the source from the GID
// table, the destination from the DGID (IBTA A17.4: the GRH becomes the
// IP header). A link-local source GID is usable when the table bound it
// (its address carries the interface as zone, gid.FromInterface).
func (d *Device) resolve(ah *qp.AHAttr) (qp.Path, error) {
	e, err := d.gids.Entry(int(ah.SGIDIndex))
	if err != nil {
		return qp.Path{}, ErrBadGIDIndex
	}
	dst := ah.DGID.Unmap()
	src := e.Addr
	if !dst.IsValid() || src.Is4() != dst.Is4() || src.IsLinkLocalUnicast() && src.Zone() == "" {
		return qp.Path{}, fmt.Errorf("%w: DGID %v from GID %v", ErrInvalidArg, ah.DGID, src)
	}
	return qp.Path{Src: src, Dst: dst, TClass: ah.TrafficClass}, nil
}

// CreateAH creates an address handle for UD sends (ibv_create_ah); the
// source GID is resolved now.
func (d *Device) CreateAH(pd *mr.PD, a qp.AHAttr) (*qp.AH, error) {
	if pd == nil {
		return nil, ErrInvalidArg
	}
	p, err := d.resolve(&a)
	if err != nil {
		return nil, err
	}
	a.DGID = p.Dst
	return &qp.AH{AHAttr: a, SGID: p.Src}, nil
}

// Close stops the device: the link is closed, the receive goroutine ends,
// every QP is destroyed (timers stopped) and every CQ destroyed. Objects
// must not be used afterwards.
func (d *Device) Close() error {
	if d.closed.Swap(true) {
		return nil
	}
	if d.g != nil {
		d.g.mgr.Close()
	}
	d.batchMu.Lock() // a batch being handled flushes its deferred ACKs first
	d.closePoll()    // polled mode: the last Poll's deferred packets leave (poll.go)
	err := d.link.Close()
	for _, l := range d.links[1:] {
		l.Close()
	}
	d.batchMu.Unlock()
	for _, s := range d.scheds {
		close(s.quit)
	}
	d.wg.Wait()
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := range d.qps {
		if q := d.qps[i].Load(); q != nil {
			q.QP.Destroy()
			d.qps[i].Store(nil)
		}
	}
	if q := d.gsi.Load(); q != nil {
		q.QP.Destroy()
		d.gsi.Store(nil)
	}
	for c := range d.cqs {
		c.Destroy()
	}
	d.cqs = map[*cq.CQ]struct{}{}
	return err
}

// recvLoop is receive worker i, reading l: right after each read it
// parses, checks the ICRC and places every packet (QP.Receive) on this
// goroutine, while the data is hot.
func (d *Device) recvLoop(i int, l link.Link) {
	defer d.wg.Done()
	if d.pin {
		pinWorker(i)
	}
	rx := new(rxState)
	recv := l.Recv
	if v, ok := l.(link.ViewReceiver); ok {
		recv = v.RecvView // GRO segments as views: one copy, into the MR (fastpath.go)
	}
	bs := l.BatchSize()
	if bs < 1 {
		bs = 1
	}
	batch := make([]link.Datagram, bs)
	bufs := make([][]byte, bs)
	for i := range bufs {
		bufs[i] = make([]byte, link.MaxDatagram)
	}
	for {
		for i := range batch {
			batch[i].Buf = bufs[i]
		}
		n, err := recv(batch)
		if err != nil {
			if d.closed.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			d.cnt.LinkDowned.Add(1)
			continue
		}
		d.batchMu.RLock()
		rx.now = d.clock.Now() // one clock read per batch (fastpath.go)
		for k := 0; k < n; k++ {
			d.handle(rx, &batch[k])
		}
		rx.flushPending() // one burst per QP per batch (fastpath.go)
		d.batchMu.RUnlock()
	}
}

// handle runs the device-level receive checks of rxe_recv.c in order and
// dispatches the packet to its QP. Failures are silent drops, counted in
// rcvd_dropped.
func (d *Device) handle(rx *rxState, dg *link.Datagram) { d.handleChecked(rx, dg, false) }

// handleChecked is handle; verified: dg is a segment of a split GSO message whose ICRC the
// split checked with its IPv4 ID (superframe.go), not checked again. An argument, not rxState:
// a panic in application code run while handling (recovered by the application, Poll's guard)
// must not leave later datagrams unchecked.
func (d *Device) handleChecked(rx *rxState, dg *link.Datagram, verified bool) {
	p := &rx.pkt
	if err := bth.ParseInto(p, dg.Buf); err != nil { // IBTA 9.2/9.3, TVer 0
		if !rx.splitting && d.splitGSO(rx, dg) { // e.g. [ACK, ACK]: longer than an ACK
			return
		}
		d.cnt.RcvdDropped.Add(1)
		return
	}
	src := netip.AddrPortFrom(dg.Src.Addr().Unmap(), dg.Src.Port())
	dst := netip.AddrPortFrom(dg.Dst.Addr().Unmap(), dg.Dst.Port())
	if !d.hasGID(dst.Addr()) { // destination GID (IBTA A17.4.5)
		d.cnt.RcvdDropped.Add(1)
		return
	}
	ep := bth.Endpoints{Src: src.Addr(), Dst: dst.Addr(), SrcPort: src.Port(), DstPort: dst.Port()}
	if src.Addr().Is4() != dst.Addr().Is4() {
		d.cnt.RcvdDropped.Add(1)
		return
	}
	// ICRC (IBTA A17.3.3). IPv4: the ID the sender's kernel chose is not
	// visible to a UDP socket; ID 0 (DF senders like us) first, then the
	// solver (kernel rxe's counting IDs). The pseudo-header states of the
	// last two (endpoints, length) are reused (per receive worker). A link
	// that saw the IPv4 header (the AF_XDP path) gives its ID: the ICRC is
	// checked with it, all 32 bits, and never solved.
	known := dg.HasIPv4ID && src.Addr().Is4()
	var id uint16
	tried := false // splitGSO already failed on dg
	if known {
		id = dg.IPv4ID
		// longer than its headers allow: an unsegmented GSO message first (superframe.go),
		// without checking an ICRC over the whole that cannot hold
		if e := afxdp.ExpectedLen(dg.Buf); e > 0 && e < len(dg.Buf) && !rx.splitting {
			if d.splitGSO(rx, dg) {
				return
			}
			tried = true
		}
	}
	var diff uint32
	if !verified { // a segment of a split message had its ICRC checked with its ID (splitGSO)
		diff = rx.icrcWithID(&ep, dg.Buf, id) ^ bth.GetICRC(dg.Buf)
	}
	if diff != 0 && !rx.rxeFlushICRC(p, &ep, dg) { // kernel rxe's FLUSH ICRC passes (rxeflush.go)
		if !src.Addr().Is4() {
			d.cnt.RcvdDropped.Add(1)
			return
		}
		if known { // wrong for the ID it came with; or several packets (superframe.go)
			if !rx.splitting && !tried && d.splitGSO(rx, dg) {
				return
			}
			d.cnt.RcvdDropped.Add(1)
			return
		}
		// a GSO run's segment k (ID k < 64) costs no second CRC (fastpath.go)
		if !rx.runID(&ep, len(dg.Buf), diff) {
			if _, ok := bth.SolveIPv4ID(&ep, dg.Buf); !ok {
				if !rx.splitting && d.splitGSO(rx, dg) { // several packets in one datagram (superframe.go)
					return
				}
				d.cnt.RcvdDropped.Add(1)
				return
			}
		}
		d.cnt.RcvdICRCSolved.Add(1)
	}
	qpn := p.BTH.DestQP()
	if qpn == 0 || qpn == bth.PSNMask { // QP0 (no SMI on RoCE) and multicast: not supported
		d.cnt.RcvdDropped.Add(1)
		return
	}
	q := d.lookup(qpn)
	if q == nil {
		d.cnt.RcvdDropped.Add(1)
		return
	}
	d.cnt.RcvdPkts.Add(1)
	if p.Info.Kind == bth.KindCNP { // the reaction point (IBTA A17.9.3, docs/congestion.md)
		q.ReceiveCNP(rx.now, src)
		return
	}
	if dg.CE() { // the notification point: a CE-marked packet (A17.9.1)
		d.cnt.NPECNMarked.Add(1)
		if q.NoteCE(rx.now, src) {
			rx.deferFlush(q.QP)
		}
	}
	if qpn == 1 {
		q.Receive(rx.now, p, src, dst) // QP1: the GSI polls its CQ right after (afterReceive)
	} else if q.ReceiveDeferred(rx.now, p, src, dst) {
		rx.deferFlush(q.QP)
	}
	if d.g != nil {
		d.g.afterReceive(qpn)
	}
}
