package daemon

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/internal/mr"
)

// cqObj is a client CQ: the engine's cq.CQ plus the shared completion ring
// its push hook writes completions into as the engine produces them.
type cqObj struct {
	c *cq.CQ
	// ring views mem, the shared ring; a resize replaces both (resizeCQ), under the engine CQ's
	// lock and modMu, so deliver (under the former) and expire (under the latter) see one ring
	ring *proto.Ring
	mem  []byte
	cqe  int
	tail atomic.Uint64 // published tail (written under the engine CQ's lock)
	wake atomic.Bool   // deliver took a sleeping client's arm: signal it outside the lock
	refs int
	cost usage

	notifyFD  int      // daemon -> client: completions (when armed)
	spaceFile *os.File // client -> daemon: ring space after a full ring
	spaceDone chan struct{}

	// Event moderation (OpModifyCQ, ibv_modify_cq): moderated tells deliver to take the
	// client's arm through moderate. modMu guards the rest; deliver takes it under the
	// engine CQ's lock, the period timer on its own. clock: the period's time source (bound
	// to timer by setModeration); timer: the lazy period timer, as in internal/cq (Due = a
	// moderated event is due); trig: a matching completion arrived since the client armed
	// and did not fire the event; closed: the CQ is being released (the timer must not
	// signal).
	moderated atomic.Bool
	modMu     sync.Mutex
	mod       cq.Moderation
	clock     cq.Clock
	timer     cq.ModTimer
	trig      bool
	closed    bool
}

// createCQ creates the engine CQ, the ring memfd and both eventfds. The
// returned fds (memfd, notify, space) are sent to the client and then
// closed here (the daemon keeps its mapping and its own eventfd copies).
func (ss *session) createCQ(cqe int) (wire.CreateCQResp, []int, error) {
	var resp wire.CreateCQResp
	if cqe < 1 || cqe > ss.s.dev.Attr().MaxCQE {
		return resp, nil, fmt.Errorf("%w: cqe %d", cq.ErrCapacity, cqe)
	}
	capacity := proto.RingCapacity(cqe)
	size := proto.RingBytes(capacity)
	cost := usage{resCQs: 1, resFDs: 2}.plus(ringCost(cqe))
	if err := ss.charge(cost); err != nil {
		return resp, nil, err
	}
	ok := false
	defer func() {
		if !ok {
			ss.release(cost)
		}
	}()
	memfd, mem, err := proto.NewMemfd("softroce-cq", size)
	if err != nil {
		return resp, nil, err
	}
	ring, _ := proto.NewRing(mem, capacity)
	notify, err := proto.NewEventFD()
	if err != nil {
		proto.CloseFD(memfd)
		proto.Unmap(mem)
		return resp, nil, err
	}
	space, err := proto.NewEventFD()
	if err != nil {
		proto.CloseFD(memfd)
		proto.CloseFD(notify)
		proto.Unmap(mem)
		return resp, nil, err
	}
	// Duplicates for the client: the daemon keeps notify and space.
	fdsOut, err := dupAll(memfd, notify, space)
	proto.CloseFD(memfd)
	if err != nil {
		proto.CloseFD(notify)
		proto.CloseFD(space)
		proto.Unmap(mem)
		return resp, nil, err
	}
	c, err := ss.s.dev.CreateCQ(cqe)
	if err != nil {
		proto.CloseFDs(fdsOut)
		proto.CloseFD(notify)
		proto.CloseFD(space)
		proto.Unmap(mem)
		return resp, nil, err
	}
	ok = true
	o := &cqObj{c: c, ring: ring, mem: mem, cqe: cqe, notifyFD: notify, clock: ss.s.cqClock, cost: cost,
		spaceFile: proto.EventFile(space, "softroce-cq-space"),
		spaceDone: make(chan struct{})}
	c.SetPushHooks(o.onPush, o.afterPush)
	go o.readSpace()
	ss.s.nCQ.Add(1)
	ss.s.mapped.Add(int64(len(mem)))
	h := ss.add(o)
	ss.s.own(c, owner{ss, h, proto.EventOnCQ})
	resp = wire.CreateCQResp{Handle: uint32(h), CQE: uint32(cqe), Entries: uint32(capacity), Bytes: uint32(size)}
	return resp, fdsOut, nil
}

// handleCQ serves the CQ requests (the session's dispatch, after the OK header): the
// response body goes to wbuf, the fds to send come back as rights.
func (ss *session) handleCQ(op wire.Op, body []byte) (rights []byte, err error) {
	switch op {
	case wire.OpCreateCQ:
		var r wire.CreateCQReq
		if r, err = req[wire.CreateCQReq](body); err != nil {
			return nil, err
		}
		resp, fdsOut, err := ss.createCQ(int(min(r.CQE, 1<<30)))
		if err != nil {
			return nil, err
		}
		reply(ss, &resp)
		return proto.Rights(fdsOut...), nil
	case wire.OpResizeCQ:
		var r wire.ResizeCQReq
		if r, err = req[wire.ResizeCQReq](body); err != nil {
			return nil, err
		}
		resp, fdsOut, err := ss.resizeCQ(r)
		if err != nil {
			return nil, err
		}
		reply(ss, &resp)
		return proto.Rights(fdsOut...), nil
	case wire.OpModifyCQ:
		var r wire.ModifyCQReq
		if r, err = req[wire.ModifyCQReq](body); err != nil {
			return nil, err
		}
		o, err := get[*cqObj](ss, proto.Handle(r.Handle))
		if err != nil {
			return nil, err
		}
		return nil, o.setModeration(cq.Moderation{Count: r.CQCount, PeriodUS: r.CQPeriod})
	default: // OpDestroyCQ
		var r wire.Handle
		if r, err = req[wire.Handle](body); err != nil {
			return nil, err
		}
		return nil, ss.destroyCQ(proto.Handle(r.Handle))
	}
}

// ringCost is what a CQ of cqe entries maps and allocates: its shared ring (one mapping) and
// the engine CQ that keeps completions while the ring is full.
func ringCost(cqe int) usage {
	size := int64(proto.RingBytes(proto.RingCapacity(cqe)))
	return usage{resMappings: 1, resMappedBytes: size, resEngineBytes: size + cq.Footprint(cqe)}
}

// resizeCQ is OpResizeCQ (ibv_resize_cq): a new ring for cqe entries, into which the unpolled
// completions move, under the engine CQ's lock (cq.CQ.ResizeFunc: no completion is delivered
// meanwhile) and the moderation lock (the period timer takes arms there): the entries from the
// client's head to the daemon's tail, at the same counters, and the arm word, so a client
// blocked on the notify eventfd (which stays the same, as the space eventfd does) is woken by
// the next completion as before. The completions the engine CQ kept for a full ring follow,
// in order. cqe below the completions the CQ holds (the ring's unpolled ones and the kept
// ones), or out of 1..max_cqe, is EINVAL (cq.ErrCapacity). The client holds its CQ's lock from
// the request until it has swapped its mapping for the returned memfd, so it neither polls nor
// arms the old ring after the move.
func (ss *session) resizeCQ(r wire.ResizeCQReq) (wire.ResizeCQResp, []int, error) {
	var resp wire.ResizeCQResp
	o, err := get[*cqObj](ss, proto.Handle(r.Handle))
	if err != nil {
		return resp, nil, err
	}
	cqe := int(min(r.CQE, 1<<30))
	if cqe < 1 || cqe > ss.s.dev.Attr().MaxCQE {
		return resp, nil, fmt.Errorf("%w: cqe %d", cq.ErrCapacity, cqe)
	}
	capacity := proto.RingCapacity(cqe)
	size := proto.RingBytes(capacity)
	cost := ringCost(cqe)
	if err := ss.charge(cost); err != nil { // both rings, until the old one is unmapped
		return resp, nil, err
	}
	memfd, mem, err := proto.NewMemfd("softroce-cq", size)
	if err != nil {
		ss.release(cost)
		return resp, nil, err
	}
	fdOut, err := dupCloexec(memfd)
	proto.CloseFD(memfd)
	if err != nil {
		proto.Unmap(mem)
		ss.release(cost)
		return resp, nil, err
	}
	ring, _ := proto.NewRing(mem, capacity)
	err = o.c.ResizeFunc(cqe, func(kept int) error {
		o.modMu.Lock()
		defer o.modMu.Unlock()
		tail := o.tail.Load()
		if n := o.ring.Used(tail); n > uint64(o.ring.Capacity()) || n+uint64(kept) > uint64(cqe) {
			return fmt.Errorf("%w: cqe %d, the CQ holds %d completions", cq.ErrCapacity, cqe, n+uint64(kept))
		}
		// the client writes the head: one moved since the check above (or not believable)
		// leaves the old ring in place, as if the resize was never asked
		if !ring.MoveFrom(o.ring, tail) {
			return fmt.Errorf("%w: the CQ's head moved during the resize", proto.ErrProtocol)
		}
		o.ring = ring
		return nil
	})
	if err != nil {
		proto.CloseFD(fdOut)
		proto.Unmap(mem)
		ss.release(cost)
		return resp, nil, err
	}
	old := o.mem
	o.mem = mem
	proto.Unmap(old)
	ss.s.mapped.Add(int64(len(mem) - len(old)))
	ss.release(ringCost(o.cqe))
	o.cqe = cqe
	o.cost = usage{resCQs: 1, resFDs: 2}.plus(cost)
	o.moveKept() // the kept completions, if the new ring has room (else later, as before)
	return wire.ResizeCQResp{CQE: uint32(cqe), Entries: uint32(capacity), Bytes: uint32(size)}, []int{fdOut}, nil
}

func dupAll(fds ...int) ([]int, error) {
	out := make([]int, 0, len(fds))
	for _, fd := range fds {
		d, err := dupCloexec(fd)
		if err != nil {
			proto.CloseFDs(out)
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

func (ss *session) destroyCQ(h proto.Handle) error {
	o, err := get[*cqObj](ss, h)
	if err != nil {
		return err
	}
	if o.refs > 0 {
		return fmt.Errorf("%w: CQ still used by %d QPs", mr.ErrBusy, o.refs)
	}
	ss.releaseCQ(o)
	ss.del(h)
	return nil
}

func (ss *session) releaseCQ(o *cqObj) {
	ss.s.disown(o.c)
	o.c.SetPushHooks(nil, nil) // no hook or afterPush call runs after this
	o.modMu.Lock()             // and no period timer signals after this
	o.closed = true
	o.timer.Close()
	o.modMu.Unlock()
	o.spaceFile.Close()
	<-o.spaceDone
	ss.s.dev.DestroyCQ(o.c)
	proto.CloseFD(o.notifyFD)
	proto.Unmap(o.mem)
	ss.s.mapped.Add(-int64(len(o.mem)))
	ss.s.nCQ.Add(-1)
	ss.release(o.cost)
}

// readSpace waits for the client's space signals (it read entries from a
// ring the daemon found full) and moves the completions the engine CQ kept
// meanwhile into the ring; it ends when spaceFile is closed.
func (o *cqObj) readSpace() {
	defer close(o.spaceDone)
	var b [8]byte
	for {
		if _, err := o.spaceFile.Read(b[:]); err != nil {
			return
		}
		o.moveKept()
	}
}

// moveKept moves the completions the engine CQ kept (the ring was full)
// into the ring, then signals the client if one of them took its arm.
func (o *cqObj) moveKept() {
	// The Solicited bit of a stored completion is not kept: a receive
	// or an error completion counts as solicited here (a superset).
	o.c.PollFunc(func(wc *cq.WC) bool {
		return o.deliver(wc, wc.Status != cq.StatusSuccess || wc.Opcode >= cq.OpRecv)
	})
	o.afterPush()
}

// afterPush writes the client's notify eventfd if deliver asked for it;
// the engine CQ calls it after a push the hook took, with the CQ's lock
// released (cq.CQ.SetPushHooks), so the system call (and the wakeup of
// another process it costs) does not hold the lock.
func (o *cqObj) afterPush() {
	if o.wake.Load() && o.wake.Swap(false) {
		proto.Signal(o.notifyFD)
	}
}

// onPush is the engine CQ's push hook: the completion goes straight into
// the client's ring (no goroutine, no copy through the engine CQ). A full
// ring refuses it; the engine CQ then keeps it (and the later ones, in
// order) until the client makes room, and overruns (CQ_ERR) as a CQ of cqe
// entries would.
func (o *cqObj) onPush(wc *cq.WC, solicited bool) bool {
	// IBTA 11.4.2.2: solicited-only arming fires for a solicited or an
	// unsuccessful completion.
	return o.deliver(wc, solicited || wc.Status != cq.StatusSuccess)
}

// deliver writes wc at the ring's tail and publishes it, then takes the
// client's arm if the completion matches it; afterPush signals outside the
// lock. Callers hold the engine CQ's lock (push hook, PollFunc), so there
// is one producer at a time.
func (o *cqObj) deliver(wc *cq.WC, solicited bool) bool {
	tail := o.tail.Load()
	if o.ring.Space(tail) == 0 {
		// Ask for a space signal, then look again: the client either sees
		// the flag after consuming or consumed before this second look.
		o.ring.SetWaiting(1)
		if o.ring.Space(tail) == 0 {
			return false
		}
		o.ring.SetWaiting(0)
	}
	o.ring.Put(tail, wc)
	tail++
	o.ring.Publish(tail)
	o.tail.Store(tail)
	// Take the arm after publishing (the client arms, then re-reads the
	// tail): one of the two sides sees the other, so no wakeup is lost.
	// The eventfd is written only if the client sleeps on it; an awake
	// client sees the arm taken (proto.Ring's notification rule).
	if o.moderated.Load() {
		o.moderate(tail, solicited)
	} else if o.ring.Fire(solicited) {
		o.wake.Store(true)
	}
	return true
}

// setModeration is OpModifyCQ (ibv_modify_cq): the engine CQ records it (and refuses it
// once destroyed), and deliver applies it to the client's ring arm from the next completion
// on — the same rule as cq.Moderation on an embedded CQ, with "queued" meaning in the ring
// and not yet consumed by the client.
func (o *cqObj) setModeration(m cq.Moderation) error {
	if err := o.c.SetModeration(m); err != nil {
		return err
	}
	o.modMu.Lock()
	o.mod = m
	o.timer.Bind(o.clock, o.expire) // the first call binds; the timer is made on first use
	if !m.Active() || m.PeriodUS == 0 {
		o.timer.Stop()
	}
	if !m.Active() && o.trig {
		// A moderated arm already triggered: unmoderated, it fires now.
		o.trig = false
		if o.ring.Fire(true) {
			o.wake.Store(true)
		}
	}
	o.moderated.Store(m.Active())
	o.modMu.Unlock()
	o.afterPush()
	return nil
}

// moderate is deliver's arm step under moderation (cq.Moderation): a completion matching
// the client's arm (solicited: an unsolicited success does not) starts the moderation; the
// arm is taken once the ring holds Count unconsumed completions, or by the period timer.
// Called under the engine CQ's lock after the completion at tail-1 was published.
func (o *cqObj) moderate(tail uint64, solicited bool) {
	o.modMu.Lock()
	defer o.modMu.Unlock()
	if !o.mod.Active() { // turned off meanwhile
		if o.ring.Fire(solicited) {
			o.wake.Store(true)
		}
		return
	}
	switch o.ring.Armed() {
	case proto.ArmNone:
		return
	case proto.ArmNext:
		o.trig = true
	default:
		o.trig = o.trig || solicited
	}
	if !o.trig {
		return
	}
	queued := tail - o.ring.Head() // the client's head is not trusted: a corrupt one reads as full
	if queued >= uint64(o.mod.Count) {
		o.trig = false
		o.timer.Stop()
		if o.ring.Fire(true) {
			o.wake.Store(true)
		}
		return
	}
	if o.mod.PeriodUS > 0 && !o.timer.Due() {
		o.timer.Start(o.mod.Period())
	}
}

// expire is the period timer: the moderated event is due; it takes the client's arm and
// writes the notify eventfd if the client sleeps. The write happens under modMu, so
// releaseCQ (which sets closed under modMu before closing the eventfd) never races it. A
// stale call (the count fired first, or the period is not over: cq.ModTimer.Expire
// re-schedules) changes nothing.
func (o *cqObj) expire() {
	o.modMu.Lock()
	defer o.modMu.Unlock()
	if o.closed || !o.timer.Expire() {
		return
	}
	if !o.trig {
		return
	}
	o.trig = false
	if o.ring.Fire(true) {
		proto.Signal(o.notifyFD)
	}
}

func dupCloexec(fd int) (int, error) {
	return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
}
