package client

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/pkg/roce"
)

// ErrCQBroken: a resize the daemon carried out could not be completed here (the new
// ring's mapping failed, or the answer was malformed), so the CQ's completions now go
// to a ring this client does not see. Poll returns 0; ReqNotify, Wait and ResizeCQ fail
// with this error; only DestroyCQ is left to do.
var ErrCQBroken = errors.New("softroce client: CQ lost its completion ring in a failed resize")

// mapResized maps the ring a resize moved a CQ to (a variable: a test fails it).
var mapResized = unix.Mmap

// cqc is a client CQ: a view of the daemon's completion ring. Poll and
// ReqNotify touch only shared memory. Wait parks the calling goroutine on
// the notify eventfd in the Go poller; Channel, once used, is fed by a
// goroutine waiting there instead.
type cqc struct {
	c *Conn
	h proto.Handle
	// ring views mem, the shared ring; ResizeCQ replaces both holding mu and ringMu, so
	// Poll, ReqNotify and Channel (under mu) and Wait (under ringMu's read side, never
	// across its block) each see one ring
	ring   *proto.Ring
	mem    []byte
	ringMu sync.RWMutex
	// broken: a resize could not switch to the daemon's new ring (ErrCQBroken); set
	// holding mu and ringMu, read under either
	broken bool

	mu   sync.Mutex // consumer side
	head uint64

	spaceFD    int
	notifyFile *os.File
	ch         chan struct{}
	chOnce     sync.Once
	done       chan struct{}
	destroyed  bool
	// chStarted: Channel was called, its goroutine waits on the eventfd
	// (arms are then sleeping ones); armPending: ReqNotify armed since.
	chStarted  atomic.Bool
	armPending bool

	// Wait: the eventfd's raw conn and readiness check, made once (Wait
	// allocates nothing); waitMu is read-held by a Wait touching the ring,
	// gone is set by release before it closes the eventfd.
	rc     syscall.RawConn
	taken  func(fd uintptr) bool
	never  func(fd uintptr) bool
	waitMu sync.RWMutex
	gone   atomic.Bool
	// armed: ReqNotify armed since the last Wait returned an event (a Wait
	// with no arm blocks, as ibv_get_cq_event does, until the CQ is destroyed).
	armed atomic.Bool

	notifies atomic.Uint64 // eventfd wakeups (DataPathStats)
}

// CreateCQ is ibv_create_cq: the daemon creates the CQ and its ring and
// passes the ring memfd and both eventfds.
func (c *Conn) CreateCQ(cqe int) (roce.CompletionQueue, error) {
	if cqe < 1 {
		return nil, fmt.Errorf("%w: cqe %d", cq.ErrCapacity, cqe)
	}
	var r wire.CreateCQResp
	fds, err := c.call(wire.OpCreateCQ, wire.Bytes(&wire.CreateCQReq{CQE: uint32(min(cqe, 1<<30))}), wire.Bytes(&r))
	if err != nil {
		return nil, err
	}
	if len(fds) != 3 {
		proto.CloseFDs(fds)
		return nil, fmt.Errorf("%w: CreateCQ: %d fds", proto.ErrProtocol, len(fds))
	}
	mem, err := unix.Mmap(fds[0], 0, int(r.Bytes), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	proto.CloseFD(fds[0])
	if err != nil {
		proto.CloseFDs(fds[1:])
		return nil, fmt.Errorf("mmap completion ring: %w", err)
	}
	ring, ok := proto.NewRing(mem, int(r.Entries))
	if !ok {
		proto.Unmap(mem)
		proto.CloseFDs(fds[1:])
		return nil, fmt.Errorf("%w: ring of %d entries in %d bytes", proto.ErrProtocol, r.Entries, r.Bytes)
	}
	q := &cqc{c: c, h: proto.Handle(r.Handle), ring: ring, mem: mem, spaceFD: fds[2],
		notifyFile: proto.EventFile(fds[1], "softroce-cq-notify"),
		ch:         make(chan struct{}, 1), done: make(chan struct{})}
	q.head = ring.Head()
	if q.rc, err = q.notifyFile.SyscallConn(); err != nil {
		q.notifyFile.Close()
		proto.Unmap(mem)
		proto.CloseFD(fds[2])
		return nil, err
	}
	q.taken = func(uintptr) bool { return q.armTaken() || q.lostConn() }
	q.never = func(uintptr) bool { return q.lostConn() || q.isBroken() }
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
	if q.destroyed || q.broken {
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

// clean takes QP qpn's unpolled completions out of the ring (proto.Ring.Clean): the QP moved
// to RESET.
func (q *cqc) clean(qpn uint32) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.destroyed || q.broken {
		return
	}
	if head := q.ring.Clean(q.head, q.ring.Tail(), qpn); head != q.head {
		q.head = head
		q.ring.Consume(head)
		if q.ring.TakeWaiting() {
			proto.Signal(q.spaceFD)
		}
	}
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
	if q.lostConn() {
		return errLost
	}
	if q.broken {
		return ErrCQBroken
	}
	kind := uint32(proto.ArmNext)
	if solicitedOnly {
		kind = proto.ArmSolicited
	}
	// With Channel's goroutine: armed sleeping, it waits on the eventfd.
	// Otherwise armed awake: Wait marks it sleeping (Ring.Sleep) just
	// before it blocks, so an arm the daemon takes while the program still
	// polls costs no eventfd write and no wakeup. (Watching the arm a few
	// microseconds before sleeping was measured not to pay on 2 cores;
	// docs/performance.md.)
	q.ring.Arm(kind, q.chStarted.Load())
	q.armPending = true
	q.armed.Store(true)
	return nil
}

// Wait blocks until the armed event (ibv_get_cq_event): the daemon took
// the arm ReqNotify set. The calling goroutine parks in the Go poller on
// the notify eventfd (no goroutine or channel between): it marks the arm
// sleeping with one compare-and-swap that fails if the arm is already
// taken (then it returns at once), so the daemon either sees the mark and
// writes the eventfd or took the arm before it (proto.Ring). The eventfd
// is never read (every write is an edge; a stale edge only makes the wait
// look at the arm once more). With no ReqNotify since the last event it
// blocks, as ibv_get_cq_event does; it returns cq.ErrClosed once the CQ is
// destroyed, proto.ErrDisconnected once the daemon is gone (the
// connection's watcher writes the eventfd then), and ErrCQBroken once a
// resize broke the CQ (that resize writes it). No allocation.
func (q *cqc) Wait() error {
	if q.chStarted.Load() {
		if q.isBroken() {
			return ErrCQBroken
		}
		select {
		case <-q.ch:
			if q.lostConn() {
				return errLost
			}
			if q.isBroken() {
				return ErrCQBroken
			}
			return nil
		case <-q.done:
			return cq.ErrClosed
		}
	}
	q.waitMu.RLock()
	defer q.waitMu.RUnlock()
	if q.gone.Load() {
		return cq.ErrClosed
	}
	if q.lostConn() {
		return errLost
	}
	if !q.armed.Swap(false) {
		// no event can come: until the CQ is destroyed or broken, or the daemon gone
		q.rc.Read(q.never)
		switch {
		case q.gone.Load():
			return cq.ErrClosed
		case q.lostConn():
			return errLost
		case q.isBroken():
			return ErrCQBroken
		}
		return cq.ErrClosed
	}
	q.ringMu.RLock()
	if q.broken {
		q.ringMu.RUnlock()
		return ErrCQBroken
	}
	sleeping := q.ring.Sleep()
	q.ringMu.RUnlock()
	if !sleeping {
		return nil // taken (or never armed): the completions are in the ring
	}
	if err := q.rc.Read(q.taken); err != nil {
		return cq.ErrClosed
	}
	if q.isBroken() {
		return ErrCQBroken
	}
	if !q.armTaken() && q.lostConn() {
		return errLost
	}
	q.notifies.Add(1)
	return nil
}

// armTaken reports whether the daemon took the arm, or a resize broke the CQ (Wait's
// readiness check).
func (q *cqc) armTaken() bool {
	q.ringMu.RLock()
	defer q.ringMu.RUnlock()
	return q.broken || q.ring.Taken()
}

// isBroken reports whether a resize broke the CQ (for Wait, which holds no q.mu).
func (q *cqc) isBroken() bool {
	q.ringMu.RLock()
	defer q.ringMu.RUnlock()
	return q.broken
}

// lostConn reports whether the daemon is gone (the connection's watcher saw it).
func (q *cqc) lostConn() bool { return q.c != nil && q.c.lost.Load() }

// wakeLost writes the CQ's own notify eventfd once the daemon is gone, so a Wait parked on
// it, or the Channel goroutine, looks again and sees the loss.
func (q *cqc) wakeLost() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.destroyed {
		return
	}
	q.rc.Control(func(fd uintptr) { proto.Signal(int(fd)) })
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

// Channel returns the completion event channel (one buffered event); the
// first call starts the goroutine that feeds it.
func (q *cqc) Channel() <-chan struct{} {
	if !q.chStarted.Load() {
		q.mu.Lock()
		if !q.destroyed && !q.chStarted.Load() {
			q.startNotify()
			q.chStarted.Store(true)
			// An arm set awake before this must now be a sleeping one (the
			// goroutine waits on the eventfd); if the daemon took it
			// already, its event is raised here.
			if q.armPending && !q.ring.Sleep() {
				q.raise()
			}
		}
		q.mu.Unlock()
	}
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

// ModifyCQ is ibv_modify_cq (IBV_CQ_ATTR_MODERATE): one request; the
// daemon moderates the ring's arm (cq.Moderation, "queued" = in the ring,
// not yet polled).
func (c *Conn) ModifyCQ(x roce.CompletionQueue, m cq.Moderation) error {
	q, ok := x.(*cqc)
	if !ok || q == nil || q.c != c {
		return roce.ErrInvalidArg
	}
	_, err := c.call(wire.OpModifyCQ, wire.Bytes(&wire.ModifyCQReq{Handle: uint32(q.h), CQCount: m.Count, CQPeriod: m.PeriodUS}), nil)
	return err
}

// ResizeCQ is ibv_resize_cq: one request; the daemon moves the unpolled completions (and the
// arm) into a new ring at the same counters and passes its memfd, which replaces the CQ's
// mapping before anything polls or arms again (the CQ's lock is held from the request on).
// Once the daemon answered with success it writes only to the new ring: if the answer is
// then unusable or the mapping fails, the CQ is broken (the error wraps ErrCQBroken) rather
// than left polling a ring that never fills again. A refusal changes nothing.
func (c *Conn) ResizeCQ(x roce.CompletionQueue, cqe int) error {
	q, ok := x.(*cqc)
	if !ok || q == nil || q.c != c {
		return roce.ErrInvalidArg
	}
	if cqe < 1 {
		return fmt.Errorf("%w: cqe %d", cq.ErrCapacity, cqe)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.destroyed {
		return cq.ErrClosed
	}
	if q.broken {
		return ErrCQBroken
	}
	q.ringMu.Lock()
	defer q.ringMu.Unlock()
	var r wire.ResizeCQResp
	out := wire.Bytes(&r)
	answered := false // the daemon carried the resize out
	fds, err := c.callFunc(wire.OpResizeCQ, wire.Bytes(&wire.ResizeCQReq{Handle: uint32(q.h), CQE: uint32(min(cqe, 1<<30))}),
		func(b []byte) error {
			answered = true
			if len(b) < len(out) {
				return fmt.Errorf("%w: %d-byte ResizeCQ response, want %d", proto.ErrProtocol, len(b), len(out))
			}
			copy(out, b)
			return nil
		})
	if err != nil {
		if answered {
			return q.breakRing(err)
		}
		return err
	}
	if len(fds) != 1 {
		proto.CloseFDs(fds)
		return q.breakRing(fmt.Errorf("%w: ResizeCQ: %d fds", proto.ErrProtocol, len(fds)))
	}
	mem, err := mapResized(fds[0], 0, int(r.Bytes), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	proto.CloseFD(fds[0])
	if err != nil {
		return q.breakRing(fmt.Errorf("mmap completion ring: %w", err))
	}
	ring, ok := proto.NewRing(mem, int(r.Entries))
	if !ok {
		proto.Unmap(mem)
		return q.breakRing(fmt.Errorf("%w: ring of %d entries in %d bytes", proto.ErrProtocol, r.Entries, r.Bytes))
	}
	old := q.mem
	q.ring, q.mem = ring, mem
	return proto.Unmap(old)
}

// breakRing marks q broken (mu and ringMu held) after a resize the daemon carried out could
// not switch to its ring, and writes the notify eventfd so that a Wait parked on it, or
// Channel's goroutine, looks again; it returns cause wrapped with ErrCQBroken.
func (q *cqc) breakRing(cause error) error {
	q.broken = true
	q.rc.Control(func(fd uintptr) { proto.Signal(int(fd)) })
	return fmt.Errorf("%w: %w", ErrCQBroken, cause)
}

// DestroyCQ is ibv_destroy_cq; the ring is unmapped and the eventfds closed.
func (c *Conn) DestroyCQ(x roce.CompletionQueue) error {
	q, ok := x.(*cqc)
	if !ok || q == nil || q.c != c {
		return roce.ErrInvalidArg
	}
	if err := c.handleOp(wire.OpDestroyCQ, q.h); err != nil {
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
	q.gone.Store(true)
	q.notifyFile.Close() // ends a Wait parked on it
	q.waitMu.Lock()
	//lint:ignore SA2001 the empty section waits for a Wait still looking at the ring
	q.waitMu.Unlock()
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
