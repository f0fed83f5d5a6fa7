package daemon

import (
	"fmt"
	"os"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/pkg/cq"
	"github.com/softroce/softroce/pkg/daemon/proto"
)

// cqObj is a client CQ: the engine's cq.CQ plus the shared completion ring
// a pump goroutine copies it into.
type cqObj struct {
	c    *cq.CQ
	ring *proto.Ring
	mem  []byte
	tail atomic.Uint64 // published tail (the pump's own copy)
	refs int

	notifyFD  int      // daemon -> client: completions (when armed)
	spaceFile *os.File // client -> daemon: ring space after a full ring
	spaceCh   chan struct{}
	stop      chan struct{}
	done      chan struct{}
	spaceDone chan struct{}
}

// createCQ creates the engine CQ, the ring memfd and both eventfds. The
// returned fds (memfd, notify, space) are sent to the client and then
// closed here (the daemon keeps its mapping and its own eventfd copies).
func (ss *session) createCQ(r proto.CreateCQReq) (proto.CreateCQResp, []int, error) {
	var resp proto.CreateCQResp
	if r.CQE < 1 || r.CQE > ss.s.dev.Attr().MaxCQE {
		return resp, nil, fmt.Errorf("%w: cqe %d", cq.ErrCapacity, r.CQE)
	}
	capacity := proto.RingCapacity(r.CQE)
	size := proto.RingBytes(capacity)
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
	c, err := ss.s.dev.CreateCQ(r.CQE)
	if err != nil {
		proto.CloseFDs(fdsOut)
		proto.CloseFD(notify)
		proto.CloseFD(space)
		proto.Unmap(mem)
		return resp, nil, err
	}
	o := &cqObj{c: c, ring: ring, mem: mem, notifyFD: notify,
		spaceFile: proto.EventFile(space, "softroce-cq-space"),
		spaceCh:   make(chan struct{}, 1), stop: make(chan struct{}),
		done: make(chan struct{}), spaceDone: make(chan struct{})}
	go o.readSpace()
	go o.pump()
	ss.s.nCQ.Add(1)
	ss.s.mapped.Add(int64(len(mem)))
	resp = proto.CreateCQResp{H: ss.add(o), Capacity: capacity, Bytes: size}
	return resp, fdsOut, nil
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
		return fmt.Errorf("%w: CQ still used by %d QPs", cq.ErrCQError, o.refs)
	}
	ss.releaseCQ(o)
	ss.del(h)
	return nil
}

func (ss *session) releaseCQ(o *cqObj) {
	close(o.stop)
	<-o.done
	o.spaceFile.Close()
	<-o.spaceDone
	ss.s.dev.DestroyCQ(o.c)
	proto.CloseFD(o.notifyFD)
	proto.Unmap(o.mem)
	ss.s.mapped.Add(-int64(len(o.mem)))
	ss.s.nCQ.Add(-1)
}

// readSpace turns space-eventfd signals into spaceCh sends; it ends when
// spaceFile is closed.
func (o *cqObj) readSpace() {
	defer close(o.spaceDone)
	var b [8]byte
	for {
		if _, err := o.spaceFile.Read(b[:]); err != nil {
			return
		}
		select {
		case o.spaceCh <- struct{}{}:
		default:
		}
	}
}

// pump copies completions from the engine CQ into the ring, in order, and
// signals the client's eventfd when it armed the ring. A full ring stops
// the pump (the engine CQ then fills and overruns as a real CQ would) until
// the client consumes and signals space.
func (o *cqObj) pump() {
	defer close(o.done)
	var buf [64]cq.WC
	tail := uint64(0)
	for {
		space := o.ring.Space(tail)
		if space == 0 {
			o.ring.SetWaiting(1)
			if o.ring.Space(tail) == 0 {
				select {
				case <-o.spaceCh:
				case <-o.stop:
					return
				}
			}
			o.ring.SetWaiting(0)
			continue
		}
		n := o.c.Poll(buf[:min(space, len(buf))])
		if n == 0 {
			armErr := o.c.ReqNotify(false)
			n = o.c.Poll(buf[:min(space, len(buf))])
			if n == 0 {
				if armErr != nil {
					// CQ overrun (error state): nothing more will arrive.
					<-o.stop
					return
				}
				select {
				case <-o.c.Channel():
				case <-o.stop:
					return
				}
				continue
			}
		}
		qual := false
		for i := 0; i < n; i++ {
			o.ring.Put(tail, &buf[i])
			tail++
			// Solicited-only arming: the Solicited bit is not in the WC, so
			// every receive completion and every error fires (a superset).
			if buf[i].Status != cq.StatusSuccess || buf[i].Opcode >= cq.OpRecv {
				qual = true
			}
		}
		o.ring.Publish(tail)
		o.tail.Store(tail)
		// Read the arm after publishing (the client arms, then re-reads the
		// tail): one of the two sides sees the other, so no wakeup is lost.
		if arm := o.ring.Armed(); arm == proto.ArmNext || (arm == proto.ArmSolicited && qual) {
			if o.ring.TakeArm() != proto.ArmNone {
				proto.Signal(o.notifyFD)
			}
		}
	}
}

func dupCloexec(fd int) (int, error) {
	return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
}
