package roce

import (
	"sync"
	"sync/atomic"

	"github.com/softroce/softroce/internal/qp"
)

// The responder scheduler (one per receive worker; qp.Config.Schedule, internal/qp
// readresp.go). A READ's responses are not all built on the receive goroutine that got the
// request: past the first few, the QP asks its worker's scheduler to come back, and the
// scheduler's goroutine serves the QPs that have responses to send round-robin, one burst
// (qp.ReadBudget packets, one sendmmsg or GSO send) per QP per turn, until each says it is
// done. So a 1 GiB READ costs its QP's turns, not the receive loop of every other QP, and two
// QPs reading at once share the scheduler evenly. In polled mode (Options.Polled) Poll gives
// every waiting QP one turn instead of a goroutine.

// respSched is one worker's queue of QPs with responder work (a FIFO ring, no allocation
// once grown to the number of QPs that wait at once).
type respSched struct {
	mu    sync.Mutex
	ring  []*qp.QP
	head  int
	n     int
	count atomic.Int32 // n, readable without mu (Poll's empty check)
	wake  chan struct{}
	quit  chan struct{}
}

func newRespSched() *respSched {
	return &respSched{ring: make([]*qp.QP, 16), wake: make(chan struct{}, 1), quit: make(chan struct{})}
}

// add queues q (qp.Config.Schedule: called with q's lock held, never blocks).
func (s *respSched) add(q *qp.QP) {
	s.mu.Lock()
	s.push(q)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// push appends q (s.mu held).
func (s *respSched) push(q *qp.QP) {
	if s.n == len(s.ring) {
		r := make([]*qp.QP, 2*len(s.ring))
		for i := 0; i < s.n; i++ {
			r[i] = s.ring[(s.head+i)%len(s.ring)]
		}
		s.ring, s.head = r, 0
	}
	s.ring[(s.head+s.n)%len(s.ring)] = q
	s.n++
	s.count.Store(int32(s.n))
}

// pop takes the first QP, or nil.
func (s *respSched) pop() *qp.QP {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == 0 {
		return nil
	}
	q := s.ring[s.head]
	s.ring[s.head] = nil
	s.head = (s.head + 1) % len(s.ring)
	s.n--
	s.count.Store(int32(s.n))
	return q
}

// turn gives q one turn and queues it again if it has more to send.
func (s *respSched) turn(q *qp.QP) {
	if q.RunResponder(qp.ReadBudget) {
		s.mu.Lock()
		s.push(q)
		s.mu.Unlock()
	}
}

// runSched is the scheduler goroutine of a receive worker (Close stops it).
func (d *Device) runSched(s *respSched) {
	defer d.wg.Done()
	for {
		select {
		case <-s.quit:
			return
		default:
		}
		if q := s.pop(); q != nil {
			s.turn(q)
			continue
		}
		select {
		case <-s.wake:
		case <-s.quit:
			return
		}
	}
}

// round gives each QP waiting now one turn (polled mode, on Poll's goroutine).
func (s *respSched) round() {
	for k := s.count.Load(); k > 0; k-- {
		q := s.pop()
		if q == nil {
			return
		}
		s.turn(q)
	}
}
