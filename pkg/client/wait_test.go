package client

import (
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/daemon/proto"
)

// testCQ is a client CQ over a ring of its own (no daemon): the test plays the daemon with
// the ring's Fire and proto.Signal, exactly as internal/daemon's push hook does.
func testCQ(t *testing.T) (*cqc, int) {
	t.Helper()
	const capacity = 8
	memfd, mem, err := proto.NewMemfd("test-cq", proto.RingBytes(capacity))
	if err != nil {
		t.Fatal(err)
	}
	proto.CloseFD(memfd)
	ring, _ := proto.NewRing(mem, capacity)
	notify, err := proto.NewEventFD()
	if err != nil {
		t.Fatal(err)
	}
	daemonSide, err := unix.FcntlInt(uintptr(notify), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	space, err := proto.NewEventFD()
	if err != nil {
		t.Fatal(err)
	}
	q := &cqc{ring: ring, mem: mem, spaceFD: space, notifyFile: proto.EventFile(notify, "test-notify"),
		ch: make(chan struct{}, 1), done: make(chan struct{})}
	if q.rc, err = q.notifyFile.SyscallConn(); err != nil {
		t.Fatal(err)
	}
	q.taken = func(uintptr) bool { return q.ring.Taken() }
	q.never = func(uintptr) bool { return false }
	t.Cleanup(func() { q.release(); proto.CloseFD(daemonSide) })
	return q, daemonSide
}

// fire is the daemon's step for a published completion: take the arm, signal a sleeper.
func fire(q *cqc, fd int) {
	if q.ring.Fire(true) {
		proto.Signal(fd)
	}
}

// waitFor runs Wait in a goroutine and reports its result, or fails the test after limit.
func waitFor(t *testing.T, q *cqc, limit time.Duration) error {
	t.Helper()
	res := make(chan error, 1)
	go func() { res <- q.Wait() }()
	select {
	case err := <-res:
		return err
	case <-time.After(limit):
		t.Fatal("Wait did not return (lost wakeup)")
		return nil
	}
}

// TestWaitInterleavings: the client's Wait in each order against the daemon's arm taking.
// (1) Armed awake, taken before Wait: Wait returns without any eventfd write (it would
// block forever if it slept without the failing compare-and-swap). (2) Wait marks the arm
// sleeping and parks; the daemon takes it and signals: Wait returns. (3) A stale edge (a
// signal no Wait consumed) makes Wait look again, not return while the arm is pending.
// (4) A Wait with no arm since the last event blocks (ibv_get_cq_event), even through a
// stale edge. (5) Destroy ends a parked Wait with cq.ErrClosed.
func TestWaitInterleavings(t *testing.T) {
	q, fd := testCQ(t)
	// (1)
	q.ReqNotify(false)
	if q.ring.Sleeping() {
		t.Fatal("ReqNotify without Channel armed sleeping (every completion would write the eventfd)")
	}
	if q.ring.Fire(true) {
		t.Fatal("daemon saw a sleeping arm")
	}
	if err := waitFor(t, q, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// (2)
	q.ReqNotify(false)
	res := make(chan error, 1)
	go func() { res <- q.Wait() }()
	for deadline := time.Now().Add(10 * time.Second); !q.ring.Sleeping(); {
		if time.Now().After(deadline) {
			t.Fatal("Wait never marked the arm sleeping")
		}
		runtime.Gosched()
	}
	select {
	case <-res:
		t.Fatal("Wait returned with the arm pending")
	default:
	}
	fire(q, fd)
	select {
	case err := <-res:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("signalled Wait did not return")
	}
	// (3) a stale edge, then a pending arm: Wait must not return until it is taken.
	proto.Signal(fd)
	q.ReqNotify(false)
	go func() { res <- q.Wait() }()
	for deadline := time.Now().Add(10 * time.Second); !q.ring.Sleeping(); {
		if time.Now().After(deadline) {
			t.Fatal("Wait never marked the arm sleeping")
		}
		runtime.Gosched()
	}
	for i := 0; i < 100; i++ {
		runtime.Gosched()
	}
	select {
	case <-res:
		t.Fatal("a stale edge ended Wait with the arm pending")
	default:
	}
	fire(q, fd)
	if err := <-res; err != nil {
		t.Fatal(err)
	}
	// (4) no arm: blocks; a signal (stale edge) does not end it.
	go func() { res <- q.Wait() }()
	proto.Signal(fd)
	for i := 0; i < 100; i++ {
		runtime.Gosched()
	}
	select {
	case err := <-res:
		t.Fatalf("Wait without an arm returned (%v)", err)
	default:
	}
	// (5) destroy ends it.
	q.release()
	select {
	case err := <-res:
		if err != cq.ErrClosed {
			t.Fatalf("Wait after destroy: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("destroy did not end Wait")
	}
}

// TestChannelAfterAwakeArm: a program that arms (awake, no Channel yet), and only then
// asks for the Channel, gets the event even if the daemon took the arm in between (it
// was taken without a signal); arms after the first Channel call are sleeping ones.
func TestChannelAfterAwakeArm(t *testing.T) {
	q, fd := testCQ(t)
	q.ReqNotify(false)
	fire(q, fd) // taken awake: no signal
	select {
	case <-q.Channel():
	case <-time.After(10 * time.Second):
		t.Fatal("event of an arm taken before Channel was lost")
	}
	q.ReqNotify(false)
	if !q.ring.Sleeping() {
		t.Fatal("arm after Channel is not sleeping (the goroutine would never be woken)")
	}
	fire(q, fd)
	select {
	case <-q.Channel():
	case <-time.After(10 * time.Second):
		t.Fatal("no channel event")
	}
}

// TestWaitStress: a "daemon" goroutine takes arms as fast as the client makes them while
// the client runs ReqNotify + Wait in a loop; every Wait must return (a lost wakeup fails by
// timeout, it does not hang the suite).
func TestWaitStress(t *testing.T) {
	q, fd := testCQ(t)
	const rounds = 20000
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if q.ring.Armed() != proto.ArmNone {
				fire(q, fd)
			} else {
				runtime.Gosched()
			}
		}
	}()
	done := make(chan error, 1)
	go func() {
		for i := 0; i < rounds; i++ {
			q.ReqNotify(false)
			if err := q.Wait(); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Wait lost a wakeup (stress)")
	}
}

// TestWaitNoAlloc: ReqNotify + Wait (taken awake, and taken sleeping with a signal)
// allocate nothing.
func TestWaitNoAlloc(t *testing.T) {
	q, fd := testCQ(t)
	step := func() {
		q.ReqNotify(false)
		fire(q, fd)
		if err := q.Wait(); err != nil {
			t.Fatal(err)
		}
		q.ReqNotify(false)
		q.ring.Sleep() // as a parked Wait would
		fire(q, fd)
		if err := q.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	step()
	if a := testing.AllocsPerRun(200, step); a != 0 {
		t.Fatalf("%.1f allocations per ReqNotify+Wait", a)
	}
}
