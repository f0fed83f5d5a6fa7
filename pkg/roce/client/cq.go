package client

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/pkg/cq"
	"github.com/softroce/softroce/pkg/daemon/proto"
	"github.com/softroce/softroce/pkg/roce"
)

// cqc is a client CQ: a view of the daemon's completion ring. Poll and
// ReqNotify touch only shared memory; Channel is fed by a goroutine
// waiting on the notify eventfd in the Go poller.
type cqc struct {
	c    *Conn
	h    proto.Handle
	ring *proto.Ring
	mem  []byte

	mu   sync.Mutex // consumer side
	head uint64

	spaceFD    int
	notifyFile *os.File
	ch         chan struct{}
	chOnce     sync.Once
	done       chan struct{}
	destroyed  bool

	notifies atomic.Uint64 // eventfd wakeups (DataPathStats)
}

// CreateCQ is ibv_create_cq: the daemon creates the CQ and its ring and
// passes the ring memfd and both eventfds.
func (c *Conn) CreateCQ(cqe int) (roce.CompletionQueue, error) {
	var r proto.CreateCQResp
	fds, err := c.call(proto.OpCreateCQ, proto.CreateCQReq{CQE: cqe}, &r)
	if err != nil {
		return nil, err
	}
	if len(fds) != 3 {
		proto.CloseFDs(fds)
		return nil, fmt.Errorf("%w: CreateCQ: %d fds", proto.ErrProtocol, len(fds))
	}
	mem, err := unix.Mmap(fds[0], 0, r.Bytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	proto.CloseFD(fds[0])
	if err != nil {
		proto.CloseFDs(fds[1:])
		return nil, fmt.Errorf("mmap completion ring: %w", err)
	}
	ring, ok := proto.NewRing(mem, r.Capacity)
	if !ok {
		proto.Unmap(mem)
		proto.CloseFDs(fds[1:])
		return nil, fmt.Errorf("%w: ring of %d entries in %d bytes", proto.ErrProtocol, r.Capacity, r.Bytes)
	}
	q := &cqc{c: c, h: r.H, ring: ring, mem: mem, spaceFD: fds[2],
		notifyFile: proto.EventFile(fds[1], "softroce-cq-notify"),
		ch:         make(chan struct{}, 1), done: make(chan struct{})}
	q.head = ring.Head()
	c.bmu.Lock()
	c.cqs[q] = struct{}{}
	c.bmu.Unlock()
	return q, nil
}

// Poll moves up to len(dst) completions from the ring into dst. No system
// call unless the daemon waits for ring space (then one eventfd write).
func (q *cqc) Poll(dst []cq.WC) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.destroyed {
		return 0
	}
	tail := q.ring.Tail()
	n := 0
	for q.head != tail && n < len(dst) {
		q.ring.Get(q.head, &dst[n])
		q.head++
		n++
	}
	if n > 0 {
		q.ring.Consume(q.head)
		if q.ring.TakeWaiting() {
			proto.Signal(q.spaceFD)
		}
		q.c.account(dst[:n])
	}
	return n
}

// ReqNotify arms the CQ: the next completion (solicitedOnly: the next
// receive or error completion) sends one event on Channel. Poll after
// arming to close the race, as with ibverbs. No system call.
func (q *cqc) ReqNotify(solicitedOnly bool) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.destroyed {
		return cq.ErrClosed
	}
	q.startNotify()
	kind := uint32(proto.ArmNext)
	if solicitedOnly {
		kind = proto.ArmSolicited
	}
	// Armed sleeping: the notify goroutine waits on the eventfd. (Watching
	// the arm a few microseconds first, awake, was measured: it caught a
	// completion for under 4% of the arms and cost CPU; docs/performance.md.)
	q.ring.Arm(kind, true)
	return nil
}

// raise puts an event on the channel (events coalesce).
func (q *cqc) raise() {
	select {
	case q.ch <- struct{}{}:
	default:
	}
}

// DataPathStats counts a connection's cross-process wakeups (live CQs and
// the post ring, since Dial).
type DataPathStats struct {
	// Notifies: completion events signalled by the daemon (notify eventfd
	// wakeups; writes close together count once).
	Notifies uint64
	// Doorbells: post ring doorbells rung (the daemon's drainer slept).
	Doorbells uint64
}

// DataPathStats returns the connection's wakeup counts.
func (c *Conn) DataPathStats() DataPathStats {
	var s DataPathStats
	c.bmu.Lock()
	for q := range c.cqs {
		s.Notifies += q.notifies.Load()
	}
	c.bmu.Unlock()
	c.mu.Lock()
	if c.pring != nil {
		s.Doorbells = c.pring.Doorbells()
	}
	c.mu.Unlock()
	return s
}

// Channel returns the completion event channel (one buffered event).
func (q *cqc) Channel() <-chan struct{} {
	q.startNotify()
	return q.ch
}

func (q *cqc) startNotify() {
	q.chOnce.Do(func() {
		go func() {
			defer close(q.done)
			// Each daemon signal is an edge in the Go poller; the eventfd
			// is not read (proto.WaitLoop: no system call per event).
			proto.WaitLoop(q.notifyFile, func(woken bool) bool {
				if woken {
					q.notifies.Add(1)
					q.raise()
				}
				return false
			})
		}()
	})
}

// DestroyCQ is ibv_destroy_cq; the ring is unmapped and the eventfds closed.
func (c *Conn) DestroyCQ(x roce.CompletionQueue) error {
	q, ok := x.(*cqc)
	if !ok || q == nil || q.c != c {
		return roce.ErrInvalidArg
	}
	if _, err := c.call(proto.OpDestroyCQ, proto.HandleReq{H: q.h}, nil); err != nil {
		return err
	}
	c.bmu.Lock()
	delete(c.cqs, q)
	c.bmu.Unlock()
	return q.release()
}

// release unmaps the ring and closes the eventfds (ending the notify goroutine).
func (q *cqc) release() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.destroyed {
		return nil
	}
	q.destroyed = true
	q.notifyFile.Close()
	q.chOnce.Do(func() { close(q.done) }) // no reader was started
	<-q.done
	proto.CloseFD(q.spaceFD)
	return proto.Unmap(q.mem)
}

// account credits polled completions to their QPs' queue counts.
func (c *Conn) account(wcs []cq.WC) {
	c.bmu.Lock()
	for i := range wcs {
		if q := c.qps[wcs[i].QPNum]; q != nil {
			q.completed(&wcs[i])
		}
	}
	c.bmu.Unlock()
}
