package client

import (
	"errors"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/link/mem"
)

// failResizeMaps makes every mapping of a resized ring fail with ENOMEM until the test ends
// (or the returned func restores it); *calls counts the tries.
func failResizeMaps(t *testing.T) (calls *int, restore func()) {
	calls = new(int)
	mapResized = func(int, int64, int, int, int) ([]byte, error) {
		*calls++
		return nil, unix.ENOMEM
	}
	restore = func() { mapResized = unix.Mmap }
	t.Cleanup(restore)
	return calls, restore
}

// send posts a signaled 16-byte SEND on s's QP; recv posts a receive.
func (s *side) send(t *testing.T, id uint64) {
	t.Helper()
	if _, err := s.q.PostSend([]qp.SendWR{{WRID: id, Opcode: qp.WRSend, Flags: qp.SendSignaled,
		SGL: []qp.SGE{{Addr: 0, Length: 16, LKey: s.m.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
}

func (s *side) recv(t *testing.T, id uint64) {
	t.Helper()
	if _, err := s.q.PostRecv([]qp.RecvWR{{WRID: id, SGL: []qp.SGE{{Addr: 4096, Length: 64, LKey: s.m.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
}

// TestResizeMapFailureBreaksCQ: a resize the daemon carried out but whose new ring the client
// cannot map leaves the CQ broken, not silently polling the old ring: ResizeCQ's error, a
// parked Wait, ReqNotify, a later Wait and ResizeCQ are ErrCQBroken, Poll is 0 although a
// completion went to the new ring, and DestroyCQ works; the QP's other CQ on the same
// connection goes on. Before that, a resize the daemon refuses maps nothing and keeps the
// CQ's completions.
func TestResizeMapFailureBreaksCQ(t *testing.T) {
	nw := mem.NewNetwork(mem.Options{})
	la, _ := nw.Attach(netip.MustParseAddr("10.8.0.1"))
	lb, _ := nw.Attach(netip.MustParseAddr("10.8.0.2"))
	b := open(t, serve(t, lb), 8)
	// a: sends complete on x (the CQ this test breaks), receives on y.
	a, y := openCQs(t, serve(t, la), 8, 8, 16)
	c, x := a.c, a.cq
	other := &side{cq: y}
	a.rts(t, netip.MustParseAddr("10.8.0.2"), b.q.Num(), 14)
	b.rts(t, netip.MustParseAddr("10.8.0.1"), a.q.Num(), 14)

	// A refused resize: x holds two completions, 1 is below them.
	calls, restore := failResizeMaps(t)
	b.recv(t, 1)
	b.recv(t, 2)
	a.send(t, 1)
	a.send(t, 2)
	for range 2 {
		if wc := b.waitWC(t); wc.Status != cq.StatusSuccess {
			t.Fatalf("b's receive: %+v", wc)
		}
	}
	waitHeld(t, a.cq, 2)
	if err := c.ResizeCQ(x, 1); !errors.Is(err, cq.ErrCapacity) || errors.Is(err, ErrCQBroken) || *calls != 0 {
		t.Fatalf("resize below the completions held: %v (%d mappings)", err, *calls)
	}
	wcs := make([]cq.WC, 4)
	if n := a.cq.Poll(wcs); n != 2 || wcs[0].WRID != 1 || wcs[1].WRID != 2 {
		t.Fatalf("after the refused resize polled %d: %+v", n, wcs[:n])
	}

	// Armed, a Wait parked on x (it marked the arm sleeping); the resize's mapping fails.
	if err := a.cq.ReqNotify(false); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- a.cq.Wait() }()
	for deadline := time.Now().Add(10 * time.Second); !a.cq.ring.Sleeping(); {
		if time.Now().After(deadline) {
			t.Fatal("Wait never marked the arm sleeping")
		}
		runtime.Gosched()
	}
	err := c.ResizeCQ(x, 32)
	if !errors.Is(err, ErrCQBroken) || !errors.Is(err, unix.ENOMEM) || *calls != 1 {
		t.Fatalf("resize whose mapping fails: %v (%d mappings)", err, *calls)
	}
	restore()
	select {
	case err := <-waited:
		if !errors.Is(err, ErrCQBroken) {
			t.Fatalf("parked Wait: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a Wait parked on the broken CQ did not return")
	}

	// A completion of x goes to the ring the client could not map: Poll stays 0, the arm and
	// the wait report the loss, a resize is refused without a request.
	b.recv(t, 3)
	a.send(t, 3)
	if wc := b.waitWC(t); wc.Status != cq.StatusSuccess {
		t.Fatalf("b's receive: %+v", wc)
	}
	if n := a.cq.Poll(wcs); n != 0 {
		t.Fatalf("broken CQ polled %d", n)
	}
	if err := a.cq.ReqNotify(false); !errors.Is(err, ErrCQBroken) {
		t.Fatalf("ReqNotify: %v", err)
	}
	if err := a.cq.Wait(); !errors.Is(err, ErrCQBroken) {
		t.Fatalf("Wait: %v", err)
	}
	if err := c.ResizeCQ(x, 64); !errors.Is(err, ErrCQBroken) {
		t.Fatalf("second resize: %v", err)
	}
	a.cq.Channel() // Wait through the channel's goroutine: the same
	if err := waitFor(t, a.cq, 10*time.Second); !errors.Is(err, ErrCQBroken) {
		t.Fatalf("Wait with Channel: %v", err)
	}

	// y, on the same connection and QP, goes on, resizes included.
	a.recv(t, 4)
	b.send(t, 4)
	if wc := other.waitWC(t); wc.WRID != 4 || wc.Status != cq.StatusSuccess {
		t.Fatalf("y: %+v", wc)
	}
	if err := c.ResizeCQ(y, 32); err != nil {
		t.Fatal(err)
	}
	a.recv(t, 5)
	b.send(t, 5)
	if wc := other.waitWC(t); wc.WRID != 5 || wc.Status != cq.StatusSuccess {
		t.Fatalf("y after its resize: %+v", wc)
	}

	// The QP moves to RESET (cleaning both CQs) and goes; then both CQs.
	if err := a.q.Modify(&qp.Attr{State: qp.StateReset}, qp.AttrState); err != nil {
		t.Fatal(err)
	}
	if err := a.q.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := c.DestroyCQ(x); err != nil {
		t.Fatal("DestroyCQ of the broken CQ:", err)
	}
	if err := c.DestroyCQ(y); err != nil {
		t.Fatal(err)
	}
	if d, err := c.Debug(); err != nil || d.CQs != 0 || d.QPs != 0 {
		t.Fatalf("the daemon still holds objects of the connection: %+v %v", d, err)
	}
}

// waitHeld waits (10 s at most for each event) until q's ring holds n unpolled
// completions, through arms and Wait.
func waitHeld(t *testing.T, q *cqc, n uint64) {
	t.Helper()
	for q.ring.Tail()-q.head < n {
		if err := q.ReqNotify(false); err != nil {
			t.Fatal(err)
		}
		if q.ring.Tail()-q.head >= n {
			return
		}
		if err := waitFor(t, q, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
}
