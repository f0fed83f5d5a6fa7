package daemon_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/roce"
)

// TestResizeCQUnderTraffic: while a stream of signaled RDMA WRITEs completes into A's CQ, a
// goroutine resizes that CQ again and again (up, down, to exactly the stream's window) as the
// program's consumer polls it and sleeps in Wait on its notify eventfd: every completion is
// polled exactly once, in posting order, none is lost, none doubled, and no Wait hangs on an
// arm left in a replaced ring.
func TestResizeCQUnderTraffic(t *testing.T) {
	da, db := memPair(t)
	ca := da.dial(t)
	const window, total = 8, 3000
	a := newEnd(t, ca, 1<<16, window, rcAccess)
	b := newEnd(t, db.dial(t), 1<<16, window, rcAccess)
	a.connect(t, ipB, b.q.Num(), 1)
	b.connect(t, ipA, a.q.Num(), 1)

	credits := make(chan struct{}, window)
	for i := 0; i < window; i++ {
		credits <- struct{}{}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // the sender: one WRITE per completion polled
		defer wg.Done()
		for id := uint64(0); id < total; id++ {
			select {
			case <-credits:
			case <-stop:
				return
			}
			if _, err := a.q.PostSend([]qp.SendWR{{WRID: id, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
				SGL:        []qp.SGE{{Addr: a.iova + id%64*64, Length: 64, LKey: a.m.LKey()}},
				RemoteAddr: b.iova + id%64*64, RKey: b.m.RKey()}}); err != nil {
				t.Error("PostSend:", err)
				return
			}
		}
	}()
	var resizes atomic.Int64
	go func() { // the resizer: never below the window, so every resize succeeds
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := ca.ResizeCQ(a.cq, window+i%(5*window)); err != nil {
				t.Error("ResizeCQ:", err)
				return
			}
			resizes.Add(1)
		}
	}()
	var timedOut atomic.Bool
	watchdog := time.AfterFunc(waitLimit, func() { timedOut.Store(true); ca.Close() }) // ends a hung Wait
	defer watchdog.Stop()
	var wcs [4]cq.WC
	for next := uint64(0); next < total; {
		n := a.cq.Poll(wcs[:])
		if n == 0 {
			if err := a.cq.ReqNotify(false); err != nil {
				t.Fatal(err)
			}
			if n = a.cq.Poll(wcs[:]); n == 0 {
				if err := a.cq.Wait(); err != nil || timedOut.Load() {
					close(stop)
					wg.Wait()
					t.Fatalf("Wait at completion %d of %d: %v (timed out: %v)", next, total, err, timedOut.Load())
				}
				continue
			}
		}
		for _, wc := range wcs[:n] {
			if wc.Status != cq.StatusSuccess || wc.WRID != next {
				close(stop)
				wg.Wait()
				t.Fatalf("completion %+v, want WRID %d (in order, once each)", wc, next)
			}
			next++
			credits <- struct{}{}
		}
	}
	close(stop)
	wg.Wait()
	if n := a.cq.Poll(wcs[:]); n != 0 {
		t.Fatalf("%d completions beyond the %d posted", n, total)
	}
	if resizes.Load() < 10 {
		t.Fatalf("only %d resizes ran during the traffic", resizes.Load())
	}
	t.Logf("%d completions, %d resizes", total, resizes.Load())
}

// TestResizeCQErrors: through the client, sizes out of range and below what the CQ holds are
// EINVAL (cq.ErrCapacity, code CQ_CAPACITY), a CQ of another connection is not the client's,
// and a size of exactly what it holds keeps every completion.
func TestResizeCQErrors(t *testing.T) {
	da, _ := memPair(t)
	c := da.dial(t)
	e := newEnd(t, c, 1<<16, 4, rcAccess)
	e.connect(t, ipA, e.q.Num(), 1) // to itself
	for _, n := range []int{0, da.dev.Attr().MaxCQE + 1} {
		if err := c.ResizeCQ(e.cq, n); !errors.Is(err, cq.ErrCapacity) {
			t.Fatalf("resize to %d: %v", n, err)
		}
	}
	if err := da.dial(t).ResizeCQ(e.cq, 8); !errors.Is(err, roce.ErrInvalidArg) {
		t.Fatalf("another connection resized this client's CQ: %v", err)
	}
	// The event waits for 3 unpolled completions: when Wait returns, the CQ holds 3.
	if err := c.ModifyCQ(e.cq, cq.Moderation{Count: 3}); err != nil {
		t.Fatal(err)
	}
	if err := e.cq.ReqNotify(false); err != nil {
		t.Fatal(err)
	}
	for i := uint64(0); i < 3; i++ {
		e.write(t, i, 0, 8, e, 64)
	}
	if err := e.cq.Wait(); err != nil {
		t.Fatal(err)
	}
	err := c.ResizeCQ(e.cq, 2)
	if !errors.Is(err, cq.ErrCapacity) || !errors.Is(err, syscall.EINVAL) || proto.CodeOf(err) != wire.CodeCQCapacity {
		t.Fatalf("resize below the 3 held completions: %v (code %d)", err, proto.CodeOf(err))
	}
	if err := c.ResizeCQ(e.cq, 3); err != nil {
		t.Fatal("resize to exactly the held completions:", err)
	}
	for i, wc := range e.wait(t, 3) {
		if wc.Status != cq.StatusSuccess || wc.WRID != uint64(i) {
			t.Fatalf("completion %d after the resize: %+v", i, wc)
		}
	}
}
