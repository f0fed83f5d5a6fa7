package roce

import (
	"net/netip"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/event"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
)

// Verbs is the device API shared by the embedded device (Device.Verbs) and
// a client of the softroce daemon (pkg/client.Dial): a program written
// against Verbs switches between the two with one line. Objects are
// interfaces; an object must be used only with the Verbs that created it.
//
// Memory: register only buffers from AllocBuffer. The embedded device
// accepts any []byte, but the daemon can only reach memory it can map (a
// sealed memfd, see docs/daemon.md), so portable programs allocate with
// AllocBuffer.
type Verbs interface {
	// Name is the device name (ibv_get_device_name).
	Name() string
	// Attr is ibv_query_device.
	Attr() DeviceAttr
	// PortAttr is ibv_query_port for port 1.
	PortAttr() PortAttr
	// GIDs lists the GID table as addresses, in index order (ibv_query_gid).
	GIDs() []netip.Addr
	// GIDIndex returns the GID index of addr, or -1.
	GIDIndex(addr netip.Addr) int
	// Stats returns the device counters (rxe names via Stats.Map).
	Stats() Stats
	// Events delivers the asynchronous events of this device's objects
	// (ibv_get_async_event: QP fatal, CQ error, SRQ limit, port events);
	// through the daemon, those of this client's objects only.
	Events() <-chan Event

	// AllocBuffer returns n bytes of zeroed memory that RegMR accepts.
	AllocBuffer(n int) ([]byte, error)
	// FreeBuffer releases a buffer from AllocBuffer (after its MRs are
	// deregistered); the buffer must not be used afterwards.
	FreeBuffer(b []byte) error

	// AllocPD is ibv_alloc_pd.
	AllocPD() (ProtectionDomain, error)
	// RegMR is ibv_reg_mr: buf (from AllocBuffer) at iova with the access flags.
	RegMR(pd ProtectionDomain, buf []byte, iova uint64, acc Access) (MemoryRegion, error)
	// CreateCQ is ibv_create_cq.
	CreateCQ(cqe int) (CompletionQueue, error)
	// ModifyCQ is ibv_modify_cq with IBV_CQ_ATTR_MODERATE: c's completion
	// event waits for m.Count queued completions or m.PeriodUS
	// microseconds after the first matching one (Moderation; the zero
	// value turns moderation off).
	ModifyCQ(c CompletionQueue, m Moderation) error
	// ResizeCQ is ibv_resize_cq: c holds cqe completions from now on, every unpolled
	// completion kept in order; cqe below the completions it holds, or out of 1..max_cqe, is
	// ErrCapacity (ibverbs EINVAL).
	ResizeCQ(c CompletionQueue, cqe int) error
	// DestroyCQ is ibv_destroy_cq.
	DestroyCQ(c CompletionQueue) error
	// CreateSRQ is ibv_create_srq (SRQOptions.Events and .Device are
	// ignored by the daemon client).
	CreateSRQ(o SRQOptions) (SharedReceiveQueue, error)
	// DestroySRQ is ibv_destroy_srq.
	DestroySRQ(s SharedReceiveQueue) error
	// CreateQP is ibv_create_qp.
	CreateQP(in VerbsQPInit) (QueuePair, error)
	// CreateAH is ibv_create_ah; the source GID is resolved now.
	CreateAH(pd ProtectionDomain, a AHAttr) (*AH, error)
	// Close releases the device (embedded: Device.Close; client: every
	// object of this client is destroyed by the daemon).
	Close() error
}

// ProtectionDomain is an ibv_pd (*PD in embedded mode).
type ProtectionDomain interface {
	// Dealloc is ibv_dealloc_pd; it fails while objects remain.
	Dealloc() error
}

// MemoryRegion is an ibv_mr (*MR in embedded mode).
type MemoryRegion interface {
	LKey() uint32
	RKey() uint32
	IOVA() uint64
	Len() int
	// Dereg is ibv_dereg_mr.
	Dereg() error
}

// CompletionQueue is an ibv_cq (*CQ in embedded mode): Poll never
// blocks; ReqNotify arms the CQ's event for the next completion, which
// Wait (ibv_get_cq_event, in the calling goroutine) or Channel delivers.
// Use Wait or Channel for a CQ, not both at once.
type CompletionQueue interface {
	Poll(dst []WC) int
	ReqNotify(solicitedOnly bool) error
	Channel() <-chan struct{}
	// Wait blocks until the event ReqNotify armed (ErrCQClosed once the
	// CQ is destroyed). Through the daemon the calling goroutine itself
	// waits on the notify eventfd (no goroutine, no channel between).
	Wait() error
}

// SharedReceiveQueue is an ibv_srq (*SRQ in embedded mode).
type SharedReceiveQueue interface {
	Post(wrs []RecvWR) (int, error)
	Modify(a SRQAttr, mask SRQAttrMask) error
	Query() SRQAttr
}

// QueuePair is an ibv_qp (*roce.QP in embedded mode).
type QueuePair interface {
	Num() uint32
	Type() QPType
	State() QPState
	Query() QPAttr
	Modify(a *QPAttr, mask QPAttrMask) error
	PostSend(wrs []SendWR) (int, error)
	PostRecv(wrs []RecvWR) (int, error)
	Destroy() error
}

// VerbsQPInit is ibv_qp_init_attr for Verbs.CreateQP (QPInit with the
// objects as interfaces).
type VerbsQPInit struct {
	Type   QPType
	PD     ProtectionDomain
	SendCQ CompletionQueue
	RecvCQ CompletionQueue
	SRQ    SharedReceiveQueue // nil = none
	Cap    QPCap
	// SigAll: every send WR generates a completion (sq_sig_all).
	SigAll bool
}

// Verbs returns the device as a Verbs (embedded mode). Its objects are the
// engine's own (*PD, *MR, *CQ, *SRQ, *QP).
func (d *Device) Verbs() Verbs { return embedded{d} }

// embedded adapts a Device to Verbs.
type embedded struct{ d *Device }

var (
	_ ProtectionDomain   = (*mr.PD)(nil)
	_ MemoryRegion       = (*mr.MR)(nil)
	_ CompletionQueue    = (*cq.CQ)(nil)
	_ SharedReceiveQueue = (*qp.SRQ)(nil)
	_ QueuePair          = (*QP)(nil)
)

func (e embedded) Name() string                 { return e.d.Name() }
func (e embedded) Attr() qp.DeviceAttr          { return e.d.Attr() }
func (e embedded) PortAttr() qp.PortAttr        { return e.d.PortAttr() }
func (e embedded) GIDs() []netip.Addr           { return e.d.GIDs() }
func (e embedded) GIDIndex(addr netip.Addr) int { return e.d.GIDIndex(addr) }
func (e embedded) Stats() qp.Stats              { return e.d.Stats() }
func (e embedded) Close() error                 { return e.d.Close() }
func (e embedded) Events() <-chan event.Event   { return e.d.Events() }
func (e embedded) FreeBuffer(b []byte) error    { return nil }
func (e embedded) AllocPD() (ProtectionDomain, error) {
	pd, err := e.d.AllocPD()
	if err != nil {
		return nil, err
	}
	return pd, nil
}

// AllocDM and FreeDM are Device.AllocDM and FreeDM (device memory: the AF_XDP path's write
// responder, devmem.go); an embedded device's RegMR takes device memory like any buffer.
func (e embedded) AllocDM(n int) ([]byte, error) { return e.d.AllocDM(n) }
func (e embedded) FreeDM(b []byte) error         { return e.d.FreeDM(b) }

func (e embedded) AllocBuffer(n int) ([]byte, error) {
	if n <= 0 {
		return nil, ErrInvalidArg
	}
	return make([]byte, n), nil
}

func (e embedded) RegMR(pd ProtectionDomain, buf []byte, iova uint64, acc mr.Access) (MemoryRegion, error) {
	p, ok := pd.(*mr.PD)
	if !ok || p == nil {
		return nil, ErrInvalidArg
	}
	m, err := e.d.RegMR(p, buf, iova, acc)
	if err != nil {
		return nil, err
	}
	return m, nil
}

func (e embedded) CreateCQ(cqe int) (CompletionQueue, error) {
	c, err := e.d.CreateCQ(cqe)
	if err != nil {
		return nil, err
	}
	return c, nil
}

func (e embedded) ModifyCQ(c CompletionQueue, m cq.Moderation) error {
	x, ok := c.(*cq.CQ)
	if !ok || x == nil {
		return ErrInvalidArg
	}
	return x.SetModeration(m)
}

func (e embedded) ResizeCQ(c CompletionQueue, cqe int) error {
	x, ok := c.(*cq.CQ)
	if !ok || x == nil {
		return ErrInvalidArg
	}
	if cqe > e.d.Attr().MaxCQE {
		return cq.ErrCapacity
	}
	return x.Resize(cqe)
}

func (e embedded) DestroyCQ(c CompletionQueue) error {
	x, ok := c.(*cq.CQ)
	if !ok || x == nil {
		return ErrInvalidArg
	}
	e.d.DestroyCQ(x)
	return nil
}

func (e embedded) CreateSRQ(o qp.SRQOptions) (SharedReceiveQueue, error) {
	s, err := e.d.CreateSRQ(o)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func (e embedded) DestroySRQ(s SharedReceiveQueue) error {
	x, ok := s.(*qp.SRQ)
	if !ok || x == nil {
		return ErrInvalidArg
	}
	e.d.mu.Lock()
	delete(e.d.srqs, x)
	e.d.mu.Unlock()
	x.Destroy()
	return nil
}

func (e embedded) CreateQP(in VerbsQPInit) (QueuePair, error) {
	pd, ok1 := in.PD.(*mr.PD)
	scq, ok2 := in.SendCQ.(*cq.CQ)
	rcq, ok3 := in.RecvCQ.(*cq.CQ)
	if !ok1 || !ok2 || !ok3 {
		return nil, ErrInvalidArg
	}
	var srq *qp.SRQ
	if in.SRQ != nil {
		s, ok := in.SRQ.(*qp.SRQ)
		if !ok {
			return nil, ErrInvalidArg
		}
		srq = s
	}
	q, err := e.d.CreateQP(QPInit{Type: in.Type, PD: pd, SendCQ: scq, RecvCQ: rcq, SRQ: srq, Cap: in.Cap, SigAll: in.SigAll})
	if err != nil {
		return nil, err
	}
	return q, nil
}

func (e embedded) CreateAH(pd ProtectionDomain, a qp.AHAttr) (*qp.AH, error) {
	p, ok := pd.(*mr.PD)
	if !ok || p == nil {
		return nil, ErrInvalidArg
	}
	return e.d.CreateAH(p, a)
}
