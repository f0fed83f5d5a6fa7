// Long file: the client side of every verbs object (Conn, PD, MR, SRQ, QP and their posts),
// each a thin request over the same connection; read together they show which operations
// cross the socket and which stay in shared memory.

// Package client connects a program to the softroce daemon (internal/daemon):
// Dial returns a roce.Verbs, the same device API an embedded device offers
// through (*roce.Device).Verbs, so a program switches with one line:
//
//	v := dev.Verbs()                        // embedded: the engine runs in this process
//	v, err := client.Dial(client.DefaultSocket) // daemon: the engine runs in softroce daemon
//
// Control operations (PD, MR, CQ, QP, SRQ, AH, modify, query, destroy) are
// requests on the daemon's unix socket. Data does not cross it: memory from
// AllocBuffer is a sealed memfd the daemon maps too, so RDMA lands directly
// in the buffer, and completions arrive in a shared-memory ring (Poll reads
// memory; no system call) with an eventfd for blocking waits. Work
// requests the client can vouch for (see qpc) are written into the
// connection's post ring in shared memory, with an eventfd doorbell rung
// only while the daemon's drainer sleeps; others are a request/response on
// the socket. Asynchronous events come through an event ring (Events).
// See docs/daemon.md.
package client

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/internal/event"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/roce"
)

// DefaultSocket is the daemon's default socket path.
const DefaultSocket = wire.DefaultSocket

// Conn is a connection to the daemon; it implements roce.Verbs. Its methods
// are safe for concurrent use (requests are serialized on the socket).
type Conn struct {
	mu     sync.Mutex // one request at a time
	sock   *net.UnixConn
	wbuf   []byte
	rbuf   []byte
	oob    []byte
	closed bool

	// The device, as of Dial (fixed while the daemon runs).
	name     string
	attr     qp.DeviceAttr
	portAttr qp.PortAttr
	gids     []netip.Addr

	// The post ring (nil if the daemon offered none): asynchronous posts
	// are written here under mu, the doorbell rung only when the drainer sleeps.
	pring    *proto.PostRing
	pringMem []byte
	bell     int

	// Asynchronous events: the event ring (in the post ring's memfd), its
	// eventfd and the goroutine moving events to the events channel.
	evRing *proto.EventRing
	evFile *os.File
	events chan event.Event
	evDone chan struct{}

	bmu  sync.Mutex
	bufs map[uintptr]*buffer // by base address
	cqs  map[*cqc]struct{}   // live CQs (released by Close)
	qps  map[uint32]*qpc     // by QPN, for completion accounting
	srqs map[proto.Handle]*srq

	cm clientCM // rdma_cm (cm.go)

	memMu       sync.Mutex
	memAttached bool // SR_OP_ATTACH_MEM done: memory not from AllocBuffer can be registered

	limit proto.Usage // this user's limits (Debug.UserLimit at Dial; 0: none)

	// The daemon's hang-up watcher (watch.go): lost is set, and lostCh closed, once the
	// daemon died or dropped the connection.
	lost      atomic.Bool
	lostCh    chan struct{}
	watchFile *os.File
	watchDup  int
	watchDone chan struct{}
}

var _ roce.Verbs = (*Conn)(nil)

// buffer is one AllocBuffer allocation: a sealed memfd mapped here.
type buffer struct {
	fd  int
	mem []byte
}

// Dial connects to the daemon listening on path.
func Dial(path string) (*Conn, error) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	cn := &Conn{sock: c, rbuf: make([]byte, proto.MaxMsg), oob: make([]byte, unix.CmsgSpace(4*8)),
		bufs: map[uintptr]*buffer{}, cqs: map[*cqc]struct{}{}, qps: map[uint32]*qpc{},
		srqs: map[proto.Handle]*srq{}, events: make(chan event.Event, proto.EventRingCap), lostCh: make(chan struct{})}
	if err := cn.hello(); err != nil {
		c.Close()
		return nil, err
	}
	if err := cn.startWatch(); err != nil {
		c.Close()
		return nil, err
	}
	if err := cn.openPostRing(); err != nil {
		cn.Close()
		return nil, err
	}
	return cn, nil
}

// hello opens the session (HELLO) and reads the device's attributes, port and GIDs, and the
// user's limits.
func (c *Conn) hello() error {
	var h wire.HelloResp
	if _, err := c.call(wire.OpHello, wire.Bytes(&wire.HelloReq{Magic: wire.Magic, Version: wire.Version}), wire.Bytes(&h)); err != nil {
		return err
	}
	if h.Magic != wire.Magic || h.Version != wire.Version {
		return fmt.Errorf("%w: daemon protocol %d, client %d", proto.ErrVersion, h.Version, wire.Version)
	}
	c.name = wire.GoString(h.DevName[:])
	var da wire.DeviceAttr
	if _, err := c.call(wire.OpQueryDevice, nil, wire.Bytes(&da)); err != nil {
		return err
	}
	c.attr = proto.DeviceAttrFromWire(&da)
	var pa wire.PortAttr
	port := wire.PortReq{Port: 1}
	if _, err := c.call(wire.OpQueryPort, wire.Bytes(&port), wire.Bytes(&pa)); err != nil {
		return err
	}
	c.portAttr = proto.PortAttrFromWire(&pa)
	_, err := c.callFunc(wire.OpQueryGIDs, wire.Bytes(&port), func(b []byte) error {
		var r wire.GIDsResp
		b, ok := wire.Read(b, &r)
		if !ok || uint64(r.Count) > uint64(len(b)/wire.Size[wire.GIDEntry]()) {
			return proto.ErrProtocol
		}
		c.gids = make([]netip.Addr, r.Count)
		var e wire.GIDEntry
		for i := range c.gids {
			b, _ = wire.Read(b, &e)
			c.gids[i] = proto.GIDToAddr(e.GID)
		}
		return nil
	})
	if err != nil {
		return err
	}
	d, err := c.Debug()
	c.limit = d.UserLimit
	return err
}

// openPostRing maps the connection's post ring (proto.PostRing).
func (c *Conn) openPostRing() error {
	var r wire.OpenRingsResp
	fds, err := c.call(wire.OpOpenRings, nil, wire.Bytes(&r))
	if err != nil {
		return err
	}
	if len(fds) != 3 || r.Bytes < proto.EventRingOff+proto.EventRingBytes {
		proto.CloseFDs(fds)
		return fmt.Errorf("%w: post ring: %d fds, %d bytes", proto.ErrProtocol, len(fds), r.Bytes)
	}
	mem, err := unix.Mmap(fds[0], 0, int(r.Bytes), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	proto.CloseFD(fds[0])
	if err != nil {
		proto.CloseFDs(fds[1:])
		return fmt.Errorf("mmap post ring: %w", err)
	}
	c.pring, _ = proto.NewPostRing(mem, true)
	c.pringMem, c.bell = mem, fds[1]
	c.evRing, _ = proto.NewEventRing(mem[proto.EventRingOff:], false)
	c.evFile = proto.EventFile(fds[2], "softroce-events")
	c.evDone = make(chan struct{})
	go c.readEvents()
	return nil
}

// Events returns the asynchronous event channel (ibv_get_async_event):
// QP, CQ and SRQ events of this client's objects (Object is this client's
// roce.QueuePair, roce.CompletionQueue or roce.SharedReceiveQueue) and the
// device's port events, forwarded by the daemon. Events are dropped if the
// channel is full.
func (c *Conn) Events() <-chan event.Event { return c.events }

// readEvents moves events from the event ring to the channel whenever the
// daemon signals; it ends when Close closes the eventfd.
func (c *Conn) readEvents() {
	defer close(c.evDone)
	var b [8]byte
	var e proto.Event
	for {
		if _, err := c.evFile.Read(b[:]); err != nil {
			return
		}
		for c.evRing.Get(&e) {
			ev := event.Event{Type: e.Type, QPN: e.QPN, Port: e.Port}
			c.bmu.Lock()
			switch e.Kind {
			case proto.EventOnQP:
				if q := c.qps[e.QPN]; q != nil {
					ev.Object = roce.QueuePair(q)
				}
			case proto.EventOnCQ:
				for q := range c.cqs {
					if q.h == e.Handle {
						ev.Object = roce.CompletionQueue(q)
					}
				}
			case proto.EventOnSRQ:
				if s := c.srqs[e.Handle]; s != nil {
					ev.Object = roce.SharedReceiveQueue(s)
				}
			}
			c.bmu.Unlock()
			select {
			case c.events <- ev:
			default:
			}
		}
	}
}

// sendAsync hands the asynchronous post in c.wbuf to the daemon (c.mu
// held): through the post ring (no system call while the daemon drains,
// else one eventfd write), or over the socket when the ring is full or the
// post too large. The daemon drains the ring before serving any socket
// request, so the order of posts holds either way.
func (c *Conn) sendAsync() error {
	if c.lost.Load() {
		return errLost
	}
	if c.pring != nil {
		if ok, ring := c.pring.Write(c.wbuf); ok {
			if ring {
				proto.Signal(c.bell)
			}
			if c.pring.Closed() { // read after publishing: the daemon may not have taken it
				return fmt.Errorf("%w: post ring stopped", proto.ErrDisconnected)
			}
			if c.lost.Load() { // likewise: a daemon that died may not have taken it
				return errLost
			}
			return nil
		}
	}
	return c.send()
}

// call sends a request (body: the op's struct, nil for none; fds) and
// copies the response body into out (a struct's wire.Bytes, nil for none);
// it returns the fds that came with the response (the caller owns them).
func (c *Conn) call(op wire.Op, body, out []byte, fds ...int) ([]int, error) {
	return c.callFunc(op, body, func(b []byte) error {
		if len(b) < len(out) {
			return fmt.Errorf("%w: %d-byte response to op %d, want %d", proto.ErrProtocol, len(b), op, len(out))
		}
		copy(out, b)
		return nil
	}, fds...)
}

// callFunc is call with the response body handed to fn (under the
// connection's lock; b is valid only during the call).
func (c *Conn) callFunc(op wire.Op, body []byte, fn func(b []byte) error, fds ...int) ([]int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, roce.ErrClosed
	}
	c.wbuf = proto.AppendRequest(c.wbuf, op, body)
	if _, _, err := c.sock.WriteMsgUnix(c.wbuf, proto.Rights(fds...), nil); err != nil {
		return nil, fmt.Errorf("%w: %v", proto.ErrDisconnected, err)
	}
	n, oobn, _, _, err := c.sock.ReadMsgUnix(c.rbuf, c.oob)
	if err != nil || n == 0 {
		return nil, fmt.Errorf("%w: %v", proto.ErrDisconnected, err)
	}
	var got []int
	if oobn > 0 {
		got = proto.ParseRights(c.oob[:oobn])
	}
	h, b, ok := proto.ParseHdr(c.rbuf[:n])
	switch {
	case !ok || h.Op != op:
		err = fmt.Errorf("%w: response to op %d for op %d", proto.ErrProtocol, h.Op, op)
	case h.Status != 0:
		_, err = proto.ResponseError(h, b)
	default:
		err = fn(b)
	}
	if err != nil {
		proto.CloseFDs(got)
		return nil, err
	}
	return got, nil
}

// send sends the request in c.wbuf without waiting for a response (c.mu held).
func (c *Conn) send() error {
	if _, err := c.sock.Write(c.wbuf); err != nil {
		return fmt.Errorf("%w: %v", proto.ErrDisconnected, err)
	}
	return nil
}

// post sends a binary post request already encoded in c.wbuf (c.mu held).
func (c *Conn) post() (int, error) {
	if err := c.send(); err != nil {
		return 0, err
	}
	n, err := c.sock.Read(c.rbuf)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("%w: %v", proto.ErrDisconnected, err)
	}
	h, b, ok := proto.ParseHdr(c.rbuf[:n])
	if !ok {
		return 0, proto.ErrProtocol
	}
	if h.Status != 0 {
		bad, err := proto.ResponseError(h, b)
		return bad, err
	}
	return proto.Posted(b)
}

// Name is the daemon device's name.
func (c *Conn) Name() string { return c.name }

// Attr is the daemon device's attributes (as of Dial).
func (c *Conn) Attr() qp.DeviceAttr { return c.attr }

// PortAttr is the daemon device's port 1 attributes (as of Dial).
func (c *Conn) PortAttr() qp.PortAttr { return c.portAttr }

// GIDs is the daemon device's GID table (as of Dial).
func (c *Conn) GIDs() []netip.Addr { return append([]netip.Addr(nil), c.gids...) }

// GIDIndex returns the GID index of addr, or -1.
func (c *Conn) GIDIndex(addr netip.Addr) int {
	addr = addr.Unmap()
	for i, g := range c.gids {
		if g.Unmap() == addr {
			return i
		}
	}
	return -1
}

// Stats fetches the device counters (zero on error).
func (c *Conn) Stats() qp.Stats {
	var s wire.Stats
	c.call(wire.OpStats, nil, wire.Bytes(&s))
	return proto.StatsFromWire(&s)
}

// Debug fetches the daemon's resource counts (introspection for tests and
// operators).
func (c *Conn) Debug() (proto.Debug, error) {
	var d wire.Debug
	_, err := c.call(wire.OpDebug, nil, wire.Bytes(&d))
	return proto.DebugFromWire(&d), err
}

// Close disconnects; the daemon destroys every object of this client.
// Buffers from AllocBuffer stay mapped here until FreeBuffer.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	err := c.sock.Close()
	c.stopWatch() // after it, no lose() runs; the socket's last fd closes (the daemon sees EOF)
	if c.pring != nil {
		c.evFile.Close()
		<-c.evDone
		proto.CloseFD(c.bell)
		proto.Unmap(c.pringMem)
		c.pring, c.pringMem = nil, nil
	}
	c.mu.Unlock()
	c.cmClose()
	c.bmu.Lock()
	cqs := c.cqs
	c.cqs = map[*cqc]struct{}{}
	c.bmu.Unlock()
	for q := range cqs {
		q.release()
	}
	return err
}

// AllocBuffer allocates n bytes of daemon-shareable memory: a memfd (size
// sealed, so neither side can truncate it under the other) mapped shared.
// Register it (or any sub-slice) with RegMR; the daemon maps the same
// pages, so RDMA reads and writes it directly. Release it with FreeBuffer.
func (c *Conn) AllocBuffer(n int) ([]byte, error) {
	if n <= 0 {
		return nil, roce.ErrInvalidArg
	}
	fd, mem, err := proto.NewMemfd("softroce-buf", n)
	if err != nil {
		return nil, err
	}
	c.bmu.Lock()
	c.bufs[uintptr(unsafe.Pointer(&mem[0]))] = &buffer{fd: fd, mem: mem}
	c.bmu.Unlock()
	return mem[:n:n], nil
}

// FreeBuffer unmaps a buffer from AllocBuffer. MRs on it should be
// deregistered first (the daemon's mapping otherwise keeps the memory
// alive until they are).
func (c *Conn) FreeBuffer(b []byte) error {
	if len(b) == 0 {
		return roce.ErrInvalidArg
	}
	c.bmu.Lock()
	base := uintptr(unsafe.Pointer(&b[0]))
	bf, ok := c.bufs[base]
	if ok {
		delete(c.bufs, base)
	}
	c.bmu.Unlock()
	if !ok {
		return fmt.Errorf("%w: not the start of a buffer from AllocBuffer", proto.ErrNotShareable)
	}
	proto.CloseFD(bf.fd)
	return proto.Unmap(bf.mem)
}

// find returns the allocation holding b and b's offset in it.
func (c *Conn) find(b []byte) (*buffer, uint64, bool) {
	if len(b) == 0 {
		return nil, 0, false
	}
	p := uintptr(unsafe.Pointer(&b[0]))
	c.bmu.Lock()
	defer c.bmu.Unlock()
	for base, bf := range c.bufs {
		if p >= base && p+uintptr(len(b)) <= base+uintptr(len(bf.mem)) {
			return bf, uint64(p - base), true
		}
	}
	return nil, 0, false
}

// pd is a client PD.
type pd struct {
	c *Conn
	h proto.Handle
}

// AllocPD is ibv_alloc_pd.
func (c *Conn) AllocPD() (roce.ProtectionDomain, error) {
	var r wire.Handle
	if _, err := c.call(wire.OpAllocPD, nil, wire.Bytes(&r)); err != nil {
		return nil, err
	}
	return &pd{c: c, h: proto.Handle(r.Handle)}, nil
}

// Dealloc is ibv_dealloc_pd.
func (p *pd) Dealloc() error { return p.c.handleOp(wire.OpDeallocPD, p.h) }

// handleOp sends a request whose body names one object and whose response is empty.
func (c *Conn) handleOp(op wire.Op, h proto.Handle) error {
	_, err := c.call(op, wire.Bytes(&wire.Handle{Handle: uint32(h)}), nil)
	return err
}

func (c *Conn) handleOf(x any) (proto.Handle, error) {
	switch o := x.(type) {
	case *pd:
		if o != nil && o.c == c {
			return o.h, nil
		}
	case *cqc:
		if o != nil && o.c == c {
			return o.h, nil
		}
	case *srq:
		if o != nil && o.c == c {
			return o.h, nil
		}
	}
	return 0, fmt.Errorf("%w: object of another connection or device", roce.ErrInvalidArg)
}

// CreateAH is ibv_create_ah (resolved by the daemon against its GID table).
func (c *Conn) CreateAH(p roce.ProtectionDomain, a qp.AHAttr) (*qp.AH, error) {
	h, err := c.handleOf(p)
	if err != nil {
		return nil, err
	}
	var r wire.CreateAHResp
	req := wire.CreateAHReq{PD: uint32(h), Attr: proto.AHAttrToWire(&a)}
	if _, err := c.call(wire.OpCreateAH, wire.Bytes(&req), wire.Bytes(&r)); err != nil {
		return nil, err
	}
	return &qp.AH{AHAttr: proto.AHAttrFromWire(&r.Attr), SGID: proto.GIDToAddr(r.SGID)}, nil
}

// srq is a client SRQ.
type srq struct {
	c *Conn
	h proto.Handle
}

// CreateSRQ is ibv_create_srq (o.Events and o.Device are not used).
func (c *Conn) CreateSRQ(o qp.SRQOptions) (roce.SharedReceiveQueue, error) {
	if o.MaxWR < 0 || o.MaxSGE < 0 || o.Limit < 0 {
		return nil, fmt.Errorf("%w: SRQ options %+v", qp.ErrSRQArg, o)
	}
	var r wire.CreateSRQResp
	req := wire.CreateSRQReq{MaxWR: uint32(o.MaxWR), MaxSGE: uint32(o.MaxSGE), SRQLimit: uint32(o.Limit)}
	if _, err := c.call(wire.OpCreateSRQ, wire.Bytes(&req), wire.Bytes(&r)); err != nil {
		return nil, err
	}
	s := &srq{c: c, h: proto.Handle(r.Handle)}
	c.bmu.Lock()
	c.srqs[s.h] = s
	c.bmu.Unlock()
	return s, nil
}

// DestroySRQ is ibv_destroy_srq.
func (c *Conn) DestroySRQ(s roce.SharedReceiveQueue) error {
	h, err := c.handleOf(s)
	if err != nil {
		return err
	}
	if err = c.handleOp(wire.OpDestroySRQ, h); err == nil {
		c.bmu.Lock()
		delete(c.srqs, h)
		c.bmu.Unlock()
	}
	return err
}

// Post is ibv_post_srq_recv.
func (s *srq) Post(wrs []qp.RecvWR) (int, error) {
	return s.c.postRecv(wire.OpPostSRQRecv, s.h, wrs)
}

// Modify is ibv_modify_srq.
func (s *srq) Modify(a qp.SRQAttr, mask qp.SRQAttrMask) error {
	if a.MaxWR < 0 || a.SRQLimit < 0 {
		return fmt.Errorf("%w: SRQ attributes %+v", qp.ErrSRQArg, a)
	}
	req := wire.ModifySRQReq{Handle: uint32(s.h), AttrMask: uint32(mask), MaxWR: uint32(a.MaxWR), SRQLimit: uint32(a.SRQLimit)}
	_, err := s.c.call(wire.OpModifySRQ, wire.Bytes(&req), nil)
	return err
}

// Query is ibv_query_srq (zero on error).
func (s *srq) Query() qp.SRQAttr {
	var a wire.SRQAttr
	s.c.call(wire.OpQuerySRQ, wire.Bytes(&wire.Handle{Handle: uint32(s.h)}), wire.Bytes(&a))
	return qp.SRQAttr{MaxWR: int(a.MaxWR), MaxSGE: int(a.MaxSGE), SRQLimit: int(a.SRQLimit)}
}

func (c *Conn) postRecv(op wire.Op, h proto.Handle, wrs []qp.RecvWR) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, roce.ErrClosed
	}
	var err error
	if c.wbuf, err = proto.AppendPostRecv(c.wbuf, op, h, wrs); err != nil {
		return 0, err
	}
	return c.post()
}

// qpc is a client QP.
//
// Posts are asynchronous (written into the post ring, no response) when the client can
// tell the engine will accept them: an RC/UC QP it last moved to RTS
// (receives: INIT, RTR or RTS), WRs that pass qp.ValidateSend /
// qp.ValidateRecv, not inline (the engine reads inline data at post time),
// every send WR signaled (so each produces exactly one completion), no
// SRQ, and room in the queue by the client's count: WRs posted minus
// completions for this QP polled from its CQs. Otherwise the post is a
// round trip and the engine's answer is returned.
type qpc struct {
	c      *Conn
	h      proto.Handle
	num    uint32
	typ    qp.Type
	caps   qp.Cap
	sigAll bool
	srq    bool
	lim    qp.WRLimits
	// sendCQ, recvCQ: cleaned of the QP's completions when it moves to RESET
	sendCQ, recvCQ *cqc

	sendOK, recvOK atomic.Bool  // states by the client's own Modify calls
	sqOut, rqOut   atomic.Int64 // posted minus completions polled
	unsignaled     atomic.Bool  // an unsignaled send WR was posted: sends stay synchronous
}

// CreateQP is ibv_create_qp.
func (c *Conn) CreateQP(in roce.VerbsQPInit) (roce.QueuePair, error) {
	var h [4]proto.Handle
	var err error
	if h[0], err = c.handleOf(in.PD); err != nil {
		return nil, err
	}
	if h[1], err = c.handleOf(in.SendCQ); err != nil {
		return nil, err
	}
	if h[2], err = c.handleOf(in.RecvCQ); err != nil {
		return nil, err
	}
	if in.SRQ != nil {
		if h[3], err = c.handleOf(in.SRQ); err != nil {
			return nil, err
		}
	}
	req := wire.CreateQPReq{PD: uint32(h[0]), SendCQ: uint32(h[1]), RecvCQ: uint32(h[2]), SRQ: uint32(h[3]),
		QPType: uint8(in.Type), Cap: proto.CapToWire(&in.Cap)}
	if in.SigAll {
		req.SQSigAll = 1
	}
	var r wire.CreateQPResp
	if _, err := c.call(wire.OpCreateQP, wire.Bytes(&req), wire.Bytes(&r)); err != nil {
		return nil, err
	}
	q := &qpc{c: c, h: proto.Handle(r.Handle), num: r.QPN, typ: in.Type, caps: in.Cap, sigAll: in.SigAll, srq: in.SRQ != nil,
		lim:    qp.WRLimits{MaxSGE: int(in.Cap.MaxSendSGE), MaxInlineData: int(in.Cap.MaxInlineData), MaxMsgSize: c.attr.MaxMsgSize},
		sendCQ: in.SendCQ.(*cqc), recvCQ: in.RecvCQ.(*cqc)}
	c.bmu.Lock()
	c.qps[q.num] = q
	c.bmu.Unlock()
	return q, nil
}

// completed accounts one polled completion of this QP.
func (q *qpc) completed(wc *cq.WC) {
	if wc.Opcode >= cq.OpRecv {
		q.rqOut.Add(-1)
	} else {
		q.sqOut.Add(-1)
	}
}

func (q *qpc) Num() uint32   { return q.num }
func (q *qpc) Type() qp.Type { return q.typ }

// State is the QP state (one request; ErrState reads as StateErr).
func (q *qpc) State() qp.State {
	a, err := q.query()
	if err != nil {
		return qp.StateErr
	}
	return qp.State(a.QPState)
}

// Query is ibv_query_qp (its State field is the current state).
func (q *qpc) Query() qp.Attr {
	a, _ := q.query()
	return proto.QPAttrFromWire(&a)
}

func (q *qpc) query() (wire.QPAttr, error) {
	var a wire.QPAttr
	_, err := q.c.call(wire.OpQueryQP, wire.Bytes(&wire.QueryQPReq{Handle: uint32(q.h), AttrMask: ^uint32(0)}), wire.Bytes(&a))
	return a, err
}

// Modify is ibv_modify_qp.
func (q *qpc) Modify(a *qp.Attr, mask qp.AttrMask) error {
	if a == nil {
		return roce.ErrInvalidArg
	}
	if mask&qp.AttrSelectiveRepeat != 0 {
		// softroce's own attribute: the daemon's QPs do not offer it (qp.ErrSelectiveRepeat)
		return fmt.Errorf("%w: %w", roce.ErrSelectiveRepeat, proto.ErrUnsupported)
	}
	q.sendOK.Store(false) // while the state is in flux, posts are synchronous
	q.recvOK.Store(false)
	req := wire.ModifyQPReq{Handle: uint32(q.h), AttrMask: uint32(mask), Attr: proto.QPAttrToWire(a)}
	_, err := q.c.call(wire.OpModifyQP, wire.Bytes(&req), nil)
	if err == nil && mask&qp.AttrState != 0 && !q.typ.Datagram() {
		q.sendOK.Store(a.State == qp.StateRTS)
		q.recvOK.Store(a.State == qp.StateInit || a.State == qp.StateRTR || a.State == qp.StateRTS)
	}
	if err == nil && mask&qp.AttrState != 0 && a.State == qp.StateReset {
		// IBTA 10.3.1: a QP in Reset has no work requests; its completions still in its CQs
		// go too (as rdma-core's mlx4 and mlx5 providers and softroce's libibverbs do), so a
		// QP restarted from RESET does not poll the flushes of its past.
		q.recvCQ.clean(q.num)
		if q.sendCQ != q.recvCQ {
			q.sendCQ.clean(q.num)
		}
		q.sqOut.Store(0)
		q.rqOut.Store(0)
	}
	return err
}

// Destroy is ibv_destroy_qp.
func (q *qpc) Destroy() error {
	q.sendOK.Store(false)
	q.recvOK.Store(false)
	err := q.c.handleOp(wire.OpDestroyQP, q.h)
	if err == nil {
		q.c.bmu.Lock()
		delete(q.c.qps, q.num)
		q.c.bmu.Unlock()
	}
	return err
}

// PostSend is ibv_post_send: a record in the post ring when the client
// can vouch for the WRs (see qpc; the socket if the ring is full), else a
// round trip. It does not allocate.
func (q *qpc) PostSend(wrs []qp.SendWR) (int, error) {
	c := q.c
	async := q.sendOK.Load() && !q.unsignaled.Load()
	for i := range wrs {
		if !async {
			break
		}
		w := &wrs[i]
		if w.Flags&qp.SendInline != 0 || w.AH != nil || w.Bind != nil || w.Opcode == qp.WRBindMW {
			async = false
		} else if w.Opcode.Local() {
			async = w.Opcode.Valid()
		} else if _, err := qp.ValidateSend(q.typ, w, q.lim); err != nil {
			async = false
		}
		if w.Flags&qp.SendSignaled == 0 && !q.sigAll {
			q.unsignaled.Store(true) // completions no longer map 1:1 to WRs
			async = false
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, roce.ErrClosed
	}
	// The room check is under c.mu: posts of concurrent goroutines count in turn.
	async = async && q.sqOut.Load()+int64(len(wrs)) <= int64(q.caps.MaxSendWR)
	op := wire.OpPostSend
	if async {
		op = wire.OpPostSendAsync
	}
	var err error
	if c.wbuf, err = proto.AppendPostSend(c.wbuf, op, q.h, wrs); err != nil {
		return 0, err
	}
	if async {
		q.sqOut.Add(int64(len(wrs)))
		if err := c.sendAsync(); err != nil {
			q.sqOut.Add(-int64(len(wrs)))
			return 0, err
		}
		return len(wrs), nil
	}
	n, err := c.post()
	q.sqOut.Add(int64(n))
	return n, err
}

// PostRecv is ibv_post_recv (asynchronous like PostSend when it can be).
func (q *qpc) PostRecv(wrs []qp.RecvWR) (int, error) {
	async := q.recvOK.Load() && !q.srq
	for i := 0; async && i < len(wrs); i++ {
		if _, err := qp.ValidateRecv(&wrs[i], int(q.caps.MaxRecvSGE)); err != nil {
			async = false
		}
	}
	c := q.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, roce.ErrClosed
	}
	async = async && q.rqOut.Load()+int64(len(wrs)) <= int64(q.caps.MaxRecvWR)
	op := wire.OpPostRecv
	if async {
		op = wire.OpPostRecvAsync
	}
	var err error
	if c.wbuf, err = proto.AppendPostRecv(c.wbuf, op, q.h, wrs); err != nil {
		return 0, err
	}
	if async {
		q.rqOut.Add(int64(len(wrs)))
		if err := c.sendAsync(); err != nil {
			q.rqOut.Add(-int64(len(wrs)))
			return 0, err
		}
		return len(wrs), nil
	}
	n, err := c.post()
	q.rqOut.Add(int64(n))
	return n, err
}
