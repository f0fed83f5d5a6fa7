package qp

import (
	"errors"
	"sync"

	"github.com/softroce/softroce/internal/event"
)

// SRQ errors.
var (
	// ErrSRQFull: Post found no free slot (ibv_post_srq_recv ENOMEM).
	ErrSRQFull = errors.New("qp: SRQ full")
	// ErrSRQArg: an SRQ attribute is out of range (EINVAL).
	ErrSRQArg = errors.New("qp: SRQ attribute out of range")
	// ErrSRQDestroyed: the SRQ was destroyed.
	ErrSRQDestroyed = errors.New("qp: SRQ destroyed")
)

// SRQOptions configures NewSRQ (ibv_srq_init_attr).
type SRQOptions struct {
	MaxWR  int // 1..Device.MaxSRQWR
	MaxSGE int // 1..Device.MaxSRQSGE
	// Limit arms the limit event at creation (0 = not armed); must be <= MaxWR.
	Limit int
	// Events receives SRQ_LIMIT_REACHED. Nil drops it.
	Events event.Sink
	// Device supplies the limits (nil = DefaultDeviceAttr()).
	Device *DeviceAttr
}

// SRQAttr is ibv_srq_attr.
type SRQAttr struct {
	MaxWR    int
	MaxSGE   int
	SRQLimit int
}

// SRQAttrMask selects SRQAttr fields in ModifySRQ (ibv_srq_attr_mask).
type SRQAttrMask uint8

// SRQ attribute mask bits.
const (
	SRQMaxWR SRQAttrMask = 1 // IBV_SRQ_MAX_WR: resize
	SRQLimit SRQAttrMask = 2 // IBV_SRQ_LIMIT: arm the limit event
)

type srqEntry struct {
	wrid uint64
	sge  []SGE // cap == MaxSGE, preallocated
}

// SRQ is a shared receive queue (IBTA 10.2.9). Post and Take hold one short mutex each;
// neither allocates. The engine calls Take when a QP attached to the SRQ needs a receive WQE.
type SRQ struct {
	mu     sync.Mutex
	ring   []srqEntry
	head   int
	n      int
	maxSGE int
	limit  int // armed limit, 0 = disarmed
	dead   bool
	sink   event.Sink
	dev    DeviceAttr
}

// NewSRQ creates an SRQ (ibv_create_srq).
func NewSRQ(o SRQOptions) (*SRQ, error) {
	dev := DefaultDeviceAttr()
	if o.Device != nil {
		dev = *o.Device
	}
	if o.MaxWR < 1 || o.MaxWR > dev.MaxSRQWR || o.MaxSGE < 1 || o.MaxSGE > dev.MaxSRQSGE ||
		o.Limit < 0 || o.Limit > o.MaxWR {
		return nil, ErrSRQArg
	}
	s := &SRQ{maxSGE: o.MaxSGE, limit: o.Limit, sink: o.Events, dev: dev}
	s.ring = newSRQRing(o.MaxWR, o.MaxSGE)
	return s, nil
}

func newSRQRing(n, sge int) []srqEntry {
	r := make([]srqEntry, n)
	backing := make([]SGE, n*sge)
	for i := range r {
		r[i].sge = backing[i*sge : i*sge : (i+1)*sge]
	}
	return r
}

// Post queues receive WRs (ibv_post_srq_recv). It returns how many were queued; on error the
// WR at that index was not queued (ErrWRTooManySGE, ErrWRLength, ErrSRQFull).
func (s *SRQ) Post(wrs []RecvWR) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		return 0, ErrSRQDestroyed
	}
	for i := range wrs {
		if _, err := ValidateRecv(&wrs[i], s.maxSGE); err != nil {
			return i, err
		}
		if s.n == len(s.ring) {
			return i, ErrSRQFull
		}
		j := s.head + s.n
		if j >= len(s.ring) {
			j -= len(s.ring)
		}
		e := &s.ring[j]
		e.wrid = wrs[i].WRID
		e.sge = append(e.sge[:0], wrs[i].SGL...)
		s.n++
	}
	return len(wrs), nil
}

// take removes the oldest WQE and reports whether the limit event fires. Caller holds s.mu.
func (s *SRQ) take() (*srqEntry, bool) {
	if s.n == 0 || s.dead {
		return nil, false
	}
	e := &s.ring[s.head]
	s.head++
	if s.head == len(s.ring) {
		s.head = 0
	}
	s.n--
	fire := false
	// IBTA 10.2.9.4 / ibv_modify_srq: when the WQE count drops below the armed limit, raise
	// SRQ_LIMIT_REACHED once and disarm.
	if s.limit > 0 && s.n < s.limit {
		s.limit = 0
		fire = true
	}
	return e, fire
}

func (s *SRQ) raise(fire bool) {
	if fire && s.sink != nil {
		s.sink(event.Event{Type: event.SRQLimitReached, Object: s})
	}
}

// Take moves the oldest receive WR into dst (reusing dst.SGL's capacity; it allocates only if
// that is smaller than the WR's SGE count) and reports whether there was one. Called by the
// engine for QPs attached to the SRQ. It may raise SRQ_LIMIT_REACHED (after unlocking).
func (s *SRQ) Take(dst *RecvWR) bool {
	s.mu.Lock()
	e, fire := s.take()
	if e != nil {
		dst.WRID = e.wrid
		dst.SGL = append(dst.SGL[:0], e.sge...)
	}
	s.mu.Unlock()
	s.raise(fire)
	return e != nil
}

// Len returns the number of queued WRs.
func (s *SRQ) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// Query returns the attributes (ibv_query_srq); SRQLimit is 0 when disarmed.
func (s *SRQ) Query() SRQAttr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return SRQAttr{MaxWR: len(s.ring), MaxSGE: s.maxSGE, SRQLimit: s.limit}
}

// Modify changes attributes (ibv_modify_srq). SRQLimit arms the limit event (0 disarms; must
// be <= MaxWR). SRQMaxWR resizes the queue (not below the queued count, not above the
// device's MaxSRQWR). As in rxe, an armed limit is checked when a WR is taken, so arming a
// limit above the current count fires at the next Take.
func (s *SRQ) Modify(a SRQAttr, mask SRQAttrMask) error {
	s.mu.Lock()
	if s.dead {
		s.mu.Unlock()
		return ErrSRQDestroyed
	}
	if mask&^(SRQMaxWR|SRQLimit) != 0 {
		s.mu.Unlock()
		return ErrSRQArg
	}
	size := len(s.ring)
	if mask&SRQMaxWR != 0 {
		if a.MaxWR < 1 || a.MaxWR > s.dev.MaxSRQWR || a.MaxWR < s.n {
			s.mu.Unlock()
			return ErrSRQArg
		}
		size = a.MaxWR
	}
	if mask&SRQLimit != 0 && (a.SRQLimit < 0 || a.SRQLimit > size) {
		s.mu.Unlock()
		return ErrSRQArg
	}
	if size != len(s.ring) {
		nr := newSRQRing(size, s.maxSGE)
		for i := 0; i < s.n; i++ {
			e := &s.ring[(s.head+i)%len(s.ring)]
			nr[i].wrid = e.wrid
			nr[i].sge = append(nr[i].sge[:0], e.sge...)
		}
		s.ring, s.head = nr, 0
	}
	if mask&SRQLimit != 0 {
		s.limit = a.SRQLimit
	}
	s.mu.Unlock()
	return nil
}

// Destroy marks the SRQ destroyed; Post and Take then fail.
func (s *SRQ) Destroy() {
	s.mu.Lock()
	s.dead = true
	s.mu.Unlock()
}
