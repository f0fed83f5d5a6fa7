package daemon

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/qp"
)

// modRing is a cqObj on a heap ring with a real notify eventfd and a fake clock.
func modRing(t *testing.T, capacity int) (*cqObj, *cq.CQ, *qp.ManualClock, func() bool) {
	t.Helper()
	mem := make([]byte, proto.RingBytes(capacity))
	ring, _ := proto.NewRing(mem, capacity)
	fd, err := proto.NewEventFD()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proto.CloseFD(fd) })
	clk := qp.NewManualClock(time.Unix(1000, 0))
	c, _ := cq.New(cq.Options{Capacity: capacity})
	o := &cqObj{c: c, ring: ring, notifyFD: fd, clock: clk}
	c.SetPushHooks(o.onPush, o.afterPush)
	b := make([]byte, 8) // made once: a local array escapes under the race detector
	signalled := func() bool {
		n, _ := unix.Read(fd, b)
		return n == 8
	}
	return o, c, clk, signalled
}

// TestModerateRing: the daemon side of OpModifyCQ on a client's ring. A sleeping arm is
// taken (and the eventfd written) when the ring holds Count unconsumed completions, or when
// the period has passed since the first matching completion; what the client consumed does
// not count; a solicited arm is not started by unsolicited successes; without moderation
// every completion takes the arm as before.
func TestModerateRing(t *testing.T) {
	o, c, clk, signalled := modRing(t, 16)
	if err := o.setModeration(cq.Moderation{Count: 4, PeriodUS: 100}); err != nil {
		t.Fatal(err)
	}
	o.ring.Arm(proto.ArmNext, true)
	for i := 1; i <= 3; i++ {
		c.Push(&cq.WC{WRID: uint64(i)}, false)
		if signalled() || o.ring.Armed() != proto.ArmNext {
			t.Fatalf("arm taken at %d completions (Count 4)", i)
		}
	}
	c.Push(&cq.WC{WRID: 4}, false)
	if !signalled() || o.ring.Armed() != proto.ArmNone {
		t.Fatal("arm not taken at 4 completions in the ring")
	}
	clk.Advance(time.Second) // the lazy timer, still scheduled, fires nothing
	if signalled() {
		t.Fatal("a signal after the count fired, without a new arm")
	}

	// Period: the client consumed everything; 2 completions, then time.
	o.ring.Consume(o.ring.Tail())
	o.ring.Arm(proto.ArmNext, true)
	c.Push(&cq.WC{WRID: 5}, false)
	clk.Advance(60 * time.Microsecond)
	c.Push(&cq.WC{WRID: 6}, false)
	clk.Advance(39 * time.Microsecond)
	if signalled() || o.ring.Armed() == proto.ArmNone {
		t.Fatal("arm taken before the period")
	}
	clk.Advance(time.Microsecond)
	if !signalled() || o.ring.Armed() != proto.ArmNone {
		t.Fatal("arm not taken at the period")
	}

	// Consumed completions do not count: 3 in, 3 consumed, 3 more = 3 queued < 4.
	o.ring.Consume(o.ring.Tail())
	o.ring.Arm(proto.ArmNext, true)
	for i := 0; i < 3; i++ {
		c.Push(&cq.WC{WRID: 7}, false)
	}
	o.ring.Consume(o.ring.Tail())
	for i := 0; i < 3; i++ {
		c.Push(&cq.WC{WRID: 8}, false)
	}
	if signalled() {
		t.Fatal("consumed completions counted towards Count")
	}
	c.Push(&cq.WC{WRID: 9}, false)
	if !signalled() {
		t.Fatal("no signal at 4 unconsumed")
	}

	// Solicited arm: unsolicited successes neither count as trigger nor start the period.
	o.ring.Consume(o.ring.Tail())
	o.ring.Arm(proto.ArmSolicited, true)
	for i := 0; i < 5; i++ {
		c.Push(&cq.WC{WRID: 10, Opcode: cq.OpRecv}, false)
	}
	clk.Advance(time.Second)
	if signalled() || o.ring.Armed() != proto.ArmSolicited {
		t.Fatal("unsolicited completions took a solicited arm")
	}
	c.Push(&cq.WC{WRID: 11, Opcode: cq.OpRecv}, true) // 6 unconsumed >= 4: fires at once
	if !signalled() || o.ring.Armed() != proto.ArmNone {
		t.Fatal("solicited completion with Count reached did not take the arm")
	}

	// An awake arm is taken without a signal (the client watches the word).
	o.ring.Consume(o.ring.Tail())
	o.ring.Arm(proto.ArmNext, false)
	for i := 0; i < 4; i++ {
		c.Push(&cq.WC{WRID: 12}, false)
	}
	if signalled() || o.ring.Armed() != proto.ArmNone {
		t.Fatal("awake arm: signalled, or not taken")
	}

	// Turning moderation off with a triggered arm pending takes it at once.
	o.ring.Consume(o.ring.Tail())
	o.ring.Arm(proto.ArmNext, true)
	c.Push(&cq.WC{WRID: 13}, false)
	if err := o.setModeration(cq.Moderation{}); err != nil {
		t.Fatal(err)
	}
	if !signalled() || o.ring.Armed() != proto.ArmNone {
		t.Fatal("moderation off: the triggered arm was not taken")
	}
	o.ring.Consume(o.ring.Tail())
	o.ring.Arm(proto.ArmNext, true)
	c.Push(&cq.WC{WRID: 14}, false)
	if !signalled() {
		t.Fatal("unmoderated: the next completion did not signal")
	}
}

// TestModerateReleasedNoSignal: once the CQ is released (closed under modMu), a period
// timer that comes due writes no eventfd (the daemon closed it; its number may be reused).
func TestModerateReleasedNoSignal(t *testing.T) {
	o, c, clk, signalled := modRing(t, 16)
	if err := o.setModeration(cq.Moderation{Count: 4, PeriodUS: 100}); err != nil {
		t.Fatal(err)
	}
	o.ring.Arm(proto.ArmNext, true)
	c.Push(&cq.WC{WRID: 1}, false)
	o.modMu.Lock()
	o.closed = true
	o.modMu.Unlock()
	o.expire() // as if the timer had already fired when releaseCQ stopped it
	clk.Advance(time.Second)
	if signalled() {
		t.Fatal("a released CQ's period timer wrote the eventfd")
	}
}

// TestModerateNoAlloc: a moderated completion and its period event allocate nothing once
// the timer exists.
func TestModerateNoAlloc(t *testing.T) {
	o, c, clk, signalled := modRing(t, 16)
	if err := o.setModeration(cq.Moderation{Count: 3, PeriodUS: 10}); err != nil {
		t.Fatal(err)
	}
	wc := cq.WC{WRID: 1}
	cycle := func() {
		o.ring.Consume(o.ring.Tail())
		o.ring.Arm(proto.ArmNext, true)
		c.Push(&wc, false)
		clk.Advance(10 * time.Microsecond)
		if !signalled() {
			t.Fatal("no period signal")
		}
	}
	cycle()
	if a := testing.AllocsPerRun(100, cycle); a != 0 {
		t.Fatalf("%.1f allocations per moderated event", a)
	}
}
