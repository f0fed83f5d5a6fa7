package qp

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
)

// budgetPairs makes two RC connections a1-b1 and a2-b2 whose requesters a1 and a2 share b
// (nil: none), 64 KiB of data in each a to write.
func budgetPairs(t *testing.T, b *Budget) (n *net, a1, a2, b1, b2 *side) {
	n = newNet(t)
	a1 = n.newSide("10.0.0.1", sideOpts{qpn: 0x11, bufSize: 1 << 20, budget: b})
	b1 = n.newSide("10.0.0.2", sideOpts{qpn: 0x12, bufSize: 1 << 20})
	a2 = n.newSide("10.0.0.3", sideOpts{qpn: 0x13, bufSize: 1 << 20, budget: b})
	b2 = n.newSide("10.0.0.4", sideOpts{qpn: 0x14, bufSize: 1 << 20})
	n.connect(a1, b1, connOpts{mtu: MTU1024})
	n.connect(a2, b2, connOpts{mtu: MTU1024})
	a1.fill(0, 64<<10, 3)
	a2.fill(0, 64<<10, 5)
	return
}

func writeAll(t *testing.T, a, b *side) {
	a.postSend(t, SendWR{WRID: 1, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 64<<10)}, Flags: SendSignaled,
		RemoteAddr: b.va(0), RKey: b.mr.RKey()})
}

// run delivers everything and fires the timers due now (a budget's wakeups) until nothing
// moves; it returns the largest in-flight total of b seen between steps.
func runBudget(n *net, b *Budget, sides ...*side) (peak int) {
	for i := 0; i < 1000; i++ {
		queued := 0
		for _, s := range sides {
			queued += len(s.out.q)
		}
		if b != nil {
			peak = max(peak, b.InFlight())
		}
		before := n.delivered
		n.pump()
		n.clk.Advance(0)
		if queued == 0 && n.delivered == before {
			return peak
		}
	}
	n.t.Fatal("no end")
	return
}

// TestBudgetShared: two QPs sharing a budget of 32 PSNs (floor 4) keep 36 packets in flight
// together where, without it, each keeps its own 128-PSN window (here: its whole 64-packet
// WRITE); as ACKs give budget back the waiting QP is woken and both WRITEs complete, byte for
// byte, with nothing left charged.
func TestBudgetShared(t *testing.T) {
	for _, tc := range []struct {
		name         string
		budget       bool
		sent1, sent2 int
	}{
		{"without", false, 64, 64},
		{"with", true, 32, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b *Budget
			if tc.budget {
				b = NewBudget(32)
			}
			n, a1, a2, b1, b2 := budgetPairs(t, b)
			writeAll(t, a1, b1)
			writeAll(t, a2, b2)
			if len(a1.out.q) != tc.sent1 || len(a2.out.q) != tc.sent2 {
				t.Fatalf("in flight: %d and %d packets, want %d and %d", len(a1.out.q), len(a2.out.q), tc.sent1, tc.sent2)
			}
			if b != nil && b.InFlight() != 36 {
				t.Fatalf("budget: %d in flight, want 36", b.InFlight())
			}
			peak := runBudget(n, b, a1, a2, b1, b2)
			for _, s := range []*side{a1, a2} {
				expectWC(t, pollAll(s.scq), cq.WC{WRID: 1, Opcode: cq.OpRDMAWrite, ByteLen: 64 << 10})
			}
			eq(t, "b1", b1.buf[:64<<10], a1.buf[:64<<10])
			eq(t, "b2", b2.buf[:64<<10], a2.buf[:64<<10])
			if b != nil {
				if b.InFlight() != 0 || b.nwait.Load() != 0 {
					t.Fatalf("after: %d in flight, %d waiters", b.InFlight(), b.nwait.Load())
				}
				if peak > 32+2*4 {
					t.Fatalf("peak %d in flight, want at most 40", peak)
				}
			}
		})
	}
}

// budgetWaiting is budgetPairs under a budget of 32 with both WRITEs posted: a1 holds 32
// PSNs, a2 its floor of 4, and both wait.
func budgetWaiting(t *testing.T) (b *Budget, n *net, a1, a2, b1, b2 *side) {
	t.Helper()
	b = NewBudget(32)
	n, a1, a2, b1, b2 = budgetPairs(t, b)
	writeAll(t, a1, b1)
	writeAll(t, a2, b2)
	if len(a2.out.q) != 4 || b.nwait.Load() != 2 {
		t.Fatalf("a2 sent %d, %d waiters; want 4 and 2", len(a2.out.q), b.nwait.Load())
	}
	return
}

// TestBudgetRelease: a QP that leaves RTS (ERR, or destroyed) gives its charge back at once and
// wakes the QP waiting for it, which then fills the budget.
func TestBudgetRelease(t *testing.T) {
	for _, how := range []string{"error", "destroy"} {
		t.Run(how, func(t *testing.T) {
			b, n, a1, a2, _, b2 := budgetWaiting(t)
			if how == "error" {
				if err := a1.qp.Modify(&Attr{State: StateErr}, AttrState); err != nil {
					t.Fatal(err)
				}
			} else {
				a1.qp.Destroy()
			}
			if b.InFlight() != 4 {
				t.Fatalf("after a1 left: %d in flight, want 4", b.InFlight())
			}
			n.clk.Advance(0) // a2's wakeup
			if len(a2.out.q) != 32 || b.InFlight() != 32 {
				t.Fatalf("a2 sent %d, %d in flight; want 32 and 32", len(a2.out.q), b.InFlight())
			}
			a1.out.q = nil
			runBudget(n, b, a2, b2)
			expectWC(t, pollAll(a2.scq), cq.WC{WRID: 1, Opcode: cq.OpRDMAWrite, ByteLen: 64 << 10})
			eq(t, "b2", b2.buf[:64<<10], a2.buf[:64<<10])
			if b.InFlight() != 0 || b.nwait.Load() != 0 {
				t.Fatalf("after: %d in flight, %d waiters", b.InFlight(), b.nwait.Load())
			}
		})
	}
}

// TestBudgetLossyGroup: four connections whose requesters share a budget of 16 PSNs (floor 2)
// each WRITE 128 KiB, then READ 32 KiB back, over a link that drops one packet in 7: the
// go-back-N rewinds and the ACK timeouts give charge back and take it again, every WR
// completes with the right bytes, the WRITEs never take the group over its limit by more than
// a floor per QP nor the READs by more than one chunk, and at the end nothing is charged and
// nobody waits.
func TestBudgetLossyGroup(t *testing.T) {
	b := NewBudget(16)
	n := newNet(t)
	var as, bs []*side
	for i := 0; i < 4; i++ {
		a := n.newSide(fmt.Sprintf("10.0.0.%d", 2*i+1), sideOpts{qpn: uint32(0x21 + 2*i), bufSize: 1 << 20, budget: b})
		p := n.newSide(fmt.Sprintf("10.0.0.%d", 2*i+2), sideOpts{qpn: uint32(0x22 + 2*i), bufSize: 1 << 20})
		n.connect(a, p, connOpts{mtu: MTU1024, retry: 7})
		a.fill(0, 128<<10, byte(i+1))
		p.fill(256<<10, 32<<10, byte(i+11))
		as, bs = append(as, a), append(bs, p)
	}
	// one packet in 7 dropped at random (a fixed seed): a fixed period would hit the same
	// packet of every retry of a lone READ whose exchange is a multiple of it
	r := rand.New(rand.NewPCG(7, 7))
	n.filter = func(*side, *link.Datagram, *bth.Packet) bool { return r.IntN(7) != 0 }
	run := func(want cq.WC) (peak int) {
		t.Helper()
		done := make([][]cq.WC, len(as))
		for step := 0; ; step++ {
			if step == 10000 {
				t.Fatalf("not done: %d in flight, %d waiters", b.InFlight(), b.nwait.Load())
			}
			peak = max(peak, b.InFlight())
			n.pump()
			n.clk.Advance(0)
			all := true
			for i, a := range as {
				done[i] = append(done[i], pollAll(a.scq)...)
				all = all && len(done[i]) == 1
			}
			if all {
				break
			}
			n.clk.Advance(10 * time.Millisecond) // towards the ACK timeouts of lost tails
		}
		for i := range as {
			expectWC(t, done[i], want)
		}
		return peak
	}
	for i, a := range as {
		a.postSend(t, SendWR{WRID: 1, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 128<<10)}, Flags: SendSignaled,
			RemoteAddr: bs[i].va(0), RKey: bs[i].mr.RKey()})
	}
	if peak := run(cq.WC{WRID: 1, Opcode: cq.OpRDMAWrite, ByteLen: 128 << 10}); peak > 16+4*2 {
		t.Fatalf("WRITEs: peak %d in flight, want at most 24", peak)
	}
	for i, a := range as {
		a.postSend(t, SendWR{WRID: 2, Opcode: WRRDMARead, SGL: []SGE{a.sge(256<<10, 32<<10)}, Flags: SendSignaled,
			RemoteAddr: bs[i].va(256 << 10), RKey: bs[i].mr.RKey()})
	}
	if peak := run(cq.WC{WRID: 2, Opcode: cq.OpRDMARead, ByteLen: 32 << 10}); peak > 16+32 {
		t.Fatalf("READs: peak %d in flight, want at most 48 (the limit and one 32-PSN chunk)", peak)
	}
	for i, a := range as {
		eq(t, "written", bs[i].buf[:128<<10], a.buf[:128<<10])
		eq(t, "read", a.buf[256<<10:288<<10], bs[i].buf[256<<10:288<<10])
	}
	if b.InFlight() != 0 || b.nwait.Load() != 0 {
		t.Fatalf("after: %d in flight, %d waiters", b.InFlight(), b.nwait.Load())
	}
}

// TestBudgetZeroAlloc: under a budget the per-packet path still allocates nothing, also when
// the QP waits for the budget and is let go by its ACKs (64 packets per WRITE against 16).
func TestBudgetZeroAlloc(t *testing.T) {
	a, b, ra, rb := benchPair(t, MTU1024)
	bud := NewBudget(16)
	a.qp.cfg.Budget = bud
	sa, sb := newRingOut(512), newRingOut(512)
	wr := []SendWR{{WRID: 1, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 64<<10)}, Flags: SendSignaled,
		RemoteAddr: b.va(dstOff), RKey: b.mr.RKey()}}
	wcs := make([]cq.WC, 4)
	writeStream(t, a, b, ra, rb, sa, sb, wr, wcs)
	if allocs := testing.AllocsPerRun(20, func() { writeStream(t, a, b, ra, rb, sa, sb, wr, wcs) }); allocs != 0 {
		t.Fatalf("%.1f allocations per 64 KiB WRITE", allocs)
	}
	if bud.InFlight() != 0 {
		t.Fatalf("%d in flight after", bud.InFlight())
	}
}

// hookTimer runs hook (once) inside the next Reset with a delay: a waker that runs between a
// QP's rearm looking at its woken flag and re-arming its timer.
type hookTimer struct {
	Timer
	hook func()
}

func (h *hookTimer) Reset(d time.Duration) bool {
	if d > 0 && h.hook != nil {
		f := h.hook
		h.hook = nil
		f()
	}
	return h.Timer.Reset(d)
}

// TestBudgetWakeNotOverridden: a wake that lands while the waiter re-arms its own timer (its
// Reset to the ACK deadline comes after the waker's Reset(0)) still runs the waiter now, not
// at its ACK timeout.
func TestBudgetWakeNotOverridden(t *testing.T) {
	b, n, a1, a2, _, b2 := budgetWaiting(t)
	ht := &hookTimer{Timer: a2.qp.tmr.t}
	a2.qp.mu.Lock()
	a2.qp.tmr.t, a2.qp.bud.t = ht, ht
	ht.Timer.Stop()
	a2.qp.tmr.armed = false // as an expiry leaves it for the rearm after it
	a2.qp.mu.Unlock()
	ht.hook = func() { a1.qp.Destroy() } // a1 gives back 32 and wakes a2 meanwhile
	a2.postSend(t, SendWR{WRID: 2, Opcode: WRRDMAWrite, SGL: []SGE{a2.sge(0, 1024)},
		RemoteAddr: b2.va(0), RKey: b2.mr.RKey()})
	if ht.hook != nil {
		t.Fatal("the waker did not run inside the re-arm")
	}
	n.clk.Advance(0)
	if len(a2.out.q) != 32 {
		t.Fatalf("a2 sent %d after its wake, want 32 (in flight %d)", len(a2.out.q), b.InFlight())
	}
}

// TestBudgetReads: four QPs under a budget of 128 PSNs each READ 128 KiB (one 128-PSN chunk at
// MTU 1024): one READ request leaves, the others wait for its responses, where without a
// budget all four are in flight at once; all complete byte-exact, nothing charged after.
func TestBudgetReads(t *testing.T) {
	for _, tc := range []struct {
		name   string
		budget bool
		sent   int
	}{
		{"without", false, 4},
		{"with", true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b *Budget
			if tc.budget {
				b = NewBudget(128)
			}
			n := newNet(t)
			var as, bs []*side
			for i := 0; i < 4; i++ {
				a := n.newSide(fmt.Sprintf("10.0.0.%d", 2*i+1), sideOpts{qpn: uint32(0x31 + 2*i), bufSize: 1 << 20, budget: b})
				p := n.newSide(fmt.Sprintf("10.0.0.%d", 2*i+2), sideOpts{qpn: uint32(0x32 + 2*i), bufSize: 1 << 20})
				n.connect(a, p, connOpts{mtu: MTU1024})
				p.fill(0, 128<<10, byte(i+21))
				as, bs = append(as, a), append(bs, p)
			}
			for i, a := range as {
				a.postSend(t, SendWR{WRID: 1, Opcode: WRRDMARead, SGL: []SGE{a.sge(0, 128<<10)}, Flags: SendSignaled,
					RemoteAddr: bs[i].va(0), RKey: bs[i].mr.RKey()})
			}
			sent := 0
			for _, a := range as {
				sent += len(a.out.q)
			}
			if sent != tc.sent {
				t.Fatalf("%d READ requests in flight, want %d", sent, tc.sent)
			}
			peak := runBudget(n, b, append(as, bs...)...)
			for i, a := range as {
				expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpRDMARead, ByteLen: 128 << 10})
				eq(t, "read", a.buf[:128<<10], bs[i].buf[:128<<10])
			}
			if b != nil && (peak > 128 || b.InFlight() != 0 || b.nwait.Load() != 0) {
				t.Fatalf("peak %d (want at most 128), after: %d in flight, %d waiters", peak, b.InFlight(), b.nwait.Load())
			}
		})
	}
}
