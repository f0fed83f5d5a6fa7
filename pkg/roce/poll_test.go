package roce

import (
	"errors"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/netnstest"

	"go.uber.org/goleak"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/afxdp"
	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/link/udp"
)

// pollLink records the opcodes of every Send batch and passes TryRecv through (with the
// happens-before edge hbLink gives the race detector for UDP sockets).
type pollLink struct {
	link.Link
	record  bool // set before traffic: record the opcodes of each Send
	mu      sync.Mutex
	batches [][]bth.Opcode
	// dropSend > 0 loses the dropSend-th Send (counted from 1) after it is set
	dropSend, nsend int
	runSends        int // SendRuns calls (pollRunLink)
}

func (l *pollLink) Send(b []link.Datagram) error {
	if l.dropSend > 0 {
		l.nsend++
		if l.nsend == l.dropSend {
			return nil
		}
	}
	if !l.record {
		wire.Add(1)
		return l.Link.Send(b)
	}
	ops := make([]bth.Opcode, 0, len(b))
	for i := range b {
		if len(b[i].Buf) > 0 {
			ops = append(ops, bth.Opcode(b[i].Buf[0]))
		}
	}
	l.mu.Lock()
	l.batches = append(l.batches, ops)
	l.mu.Unlock()
	wire.Add(1)
	return l.Link.Send(b)
}

func (l *pollLink) TryRecv(b []link.Datagram) (int, error) {
	n, err := l.Link.(link.PollReceiver).TryRecv(b)
	wire.Load()
	return n, err
}

// runLink is a link's GSO runs and pairs (link.RunSender, link.PairSender).
type runLink interface {
	link.RunSender
	link.PairSender
}

// pollRunLink is a pollLink that is also a link.RunSender (its link's GSO runs).
type pollRunLink struct {
	*pollLink
	u runLink
}

func (l *pollRunLink) RunGSO(a netip.Addr) bool { return l.u.RunGSO(a) }

func (l *pollRunLink) PairGSO(a netip.Addr) bool { return l.u.PairGSO(a) }

func (l *pollRunLink) SendRuns(b []link.Datagram, runs []uint8) error {
	if l.dropSend > 0 {
		l.nsend++
		if l.nsend == l.dropSend {
			return nil
		}
	}
	l.runSends++
	wire.Add(1)
	return l.u.SendRuns(b, runs)
}

// sends returns the Send batches so far and forgets them.
func (l *pollLink) sends() [][]bth.Opcode {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.batches
	l.batches = nil
	return b
}

// polledPair opens two polled devices ("mem": the in-memory network; "udp": udp.Listen on
// 127.0.0.1 / 127.0.0.2) on a manual clock (no timer fires unless a test advances it).
func polledPair(t testing.TB, kind string) (a, b *Device, la, lb *pollLink) {
	t.Helper()
	var l1, l2 link.Link
	var port uint16
	switch kind {
	case "mem", "mem-gso":
		// a short ring: every slot keeps the buffer of the first datagram it held, so a
		// few round trips reach the steady state TestPolledZeroAlloc measures
		nw := mem.NewNetwork(mem.Options{QueueDepth: 16})
		var err error
		if l1, err = nw.Attach(addrA); err != nil {
			t.Fatal(err)
		}
		if l2, err = nw.Attach(addrB); err != nil {
			t.Fatal(err)
		}
		if kind == "mem-gso" { // each Send of several datagrams delivered as one unsegmented
			// GSO message, as generic XDP on a veth sees it (superframe_test.go)
			l1, l2 = &gsoMergeLink{Link: l1}, &gsoMergeLink{Link: l2}
		}
	case "udp", "udp-gso":
		l1, l2, port = listenPair(t, true, addrA, addrB, listenUDP)
	case "xdp", "gso-xdp", "xdp-pairs": // the AF_XDP path, between two namespaces on a veth
		// pair (root); gso-xdp: a on the UDP socket path with its GSO runs, b on the AF_XDP
		// path, which sees each of a's GSO messages whole (superframe.go); xdp-pairs: both on
		// the AF_XDP path with its GSO pairs (link.PairSender)
		x, y := netnstest.Veth(t, "srpa", "198.18.7.1/24", "srpb", "198.18.7.2/24", 1500)
		for _, s := range []struct {
			th  *netnstest.Thread
			l   *link.Link
			a   string
			xdp bool
		}{{x, &l1, "198.18.7.1", kind != "gso-xdp"}, {y, &l2, "198.18.7.2", true}} {
			if err := s.th.Do(func() (err error) {
				uo := udp.Options{Addrs: []netip.Addr{netip.MustParseAddr(s.a)}}
				if s.xdp {
					*s.l, err = afxdp.Open(afxdp.Options{UDP: uo})
				} else {
					*s.l, err = udp.Listen(uo)
				}
				return err
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	la, lb = &pollLink{Link: l1}, &pollLink{Link: l2}
	var oa, ob link.Link = la, lb
	if kind == "udp-gso" { // the links keep their GSO runs (qp's pairRun)
		oa, ob = &pollRunLink{la, l1.(runLink)}, &pollRunLink{lb, l2.(runLink)}
	}
	if kind == "gso-xdp" { // a's runs: GSO messages to b's AF_XDP socket
		oa = &pollRunLink{la, l1.(runLink)}
	}
	if kind == "xdp-pairs" {
		oa, ob = &pollRunLink{la, l1.(runLink)}, &pollRunLink{lb, l2.(runLink)}
	}
	clk := qp.NewManualClock(time.Unix(1000, 0))
	var err error
	if a, err = Open(Options{Link: oa, Port: port, Name: "a", Clock: clk, Polled: true}); err != nil {
		t.Fatal(err)
	}
	if b, err = Open(Options{Link: ob, Port: port, Name: "b", Clock: clk, Polled: true}); err != nil {
		a.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.Close()
		b.Close()
	})
	return a, b, la, lb
}

// pollUntil polls the devices in turn (the test's goroutine is the only one receiving) until
// done holds; it fails after many rounds without it.
func pollUntil(t *testing.T, done func() bool, devs ...*Device) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; !done(); i++ {
		for _, d := range devs {
			if _, err := d.Poll(); err != nil {
				t.Fatalf("Poll: %v", err)
			}
		}
		if i%1024 == 1023 && time.Now().After(deadline) {
			t.Fatal("condition not reached by polling")
		}
	}
}

// pollWC polls the devices until c has a completion and returns it.
func pollWC(t *testing.T, c *cq.CQ, devs ...*Device) cq.WC {
	t.Helper()
	var wc [1]cq.WC
	pollUntil(t, func() bool { return c.Poll(wc[:]) == 1 }, devs...)
	return wc[0]
}

// writeWR is an 8-byte RDMA WRITE from e's offset off to the same offset at peer.
func writeWR(e, peer *end, id uint64, off int) qp.SendWR {
	return qp.SendWR{WRID: id, Opcode: qp.WRRDMAWrite, SGL: []qp.SGE{e.sge(off, 8)}, Flags: qp.SendSignaled,
		RemoteAddr: peer.va(off), RKey: peer.mr.RKey()}
}

// TestPolledPingPong: ib_write_lat's loop on two polled devices, both ways, over the in-memory
// link and UDP loopback: each side waits for the peer's WRITE by polling (RemoteWrites), then
// writes back. The data arrives, every WRITE completes, and from the second WRITE on each one
// leaves in the same Send batch as the ACK of the WRITE it answers (the ACK first): the ACK
// the responder's Poll deferred waits for the application's next post.
func TestPolledPingPong(t *testing.T) {
	for _, kind := range []string{"mem", "udp", "xdp", "mem-gso", "gso-xdp", "xdp-pairs"} {
		t.Run(kind, func(t *testing.T) {
			da, db, la, lb := polledPair(t, kind)
			la.record, lb.record = true, true
			a, b := newEnd(t, da, qp.TypeRC, 1<<12), newEnd(t, db, qp.TypeRC, 1<<12)
			connect(t, a, b, qp.MTU1024, 100, 200)
			const iters = 50
			for i := 1; i <= iters; i++ {
				off := 8 * (i % 64)
				a.fill(off, 8, byte(i))
				post(t, a, writeWR(a, b, uint64(i), off)) // from i = 2 with a's ACK of b's WRITE i-1
				want := b.qp.RemoteWrites() + 1
				pollUntil(t, func() bool { return b.qp.RemoteWrites() == want }, db)
				same(t, "a->b", b.buf[off:off+8], a.buf[off:off+8])
				if i > 1 {
					if w := pollWC(t, b.scq, db); w.Status != cq.StatusSuccess || w.WRID != uint64(i-1) {
						t.Fatalf("b's completion %+v at iteration %d", w, i)
					}
				}
				b.fill(2048+off, 8, byte(i)^0x5a)
				post(t, b, writeWR(b, a, uint64(i), 2048+off)) // with b's ACK of a's WRITE i
				want = a.qp.RemoteWrites() + 1
				pollUntil(t, func() bool { return a.qp.RemoteWrites() == want }, da)
				same(t, "b->a", a.buf[2048+off:2048+off+8], b.buf[2048+off:2048+off+8])
				if w := pollWC(t, a.scq, da); w.Status != cq.StatusSuccess || w.WRID != uint64(i) {
					t.Fatalf("a's completion %+v at iteration %d", w, i)
				}
			}
			// a's next Poll sends the ACK of b's last WRITE
			if w := pollWC(t, b.scq, db, da); w.Status != cq.StatusSuccess || w.WRID != iters {
				t.Fatalf("b's last completion %+v", w)
			}
			for _, l := range []*pollLink{la, lb} {
				pairsOn := kind == "xdp-pairs" && l.Link.(afxdp.StatsLink).XDPStats().PairsOff == 0
				if l == la && kind == "gso-xdp" || pairsOn { // the pairs went as GSO runs (qp's pairRun), not Sends
					if l.runSends < iters-1 {
						t.Fatalf("%d GSO runs sent, want >= %d", l.runSends, iters-1)
					}
					continue
				}
				joined, other := 0, 0
				for _, s := range l.sends() {
					if len(s) == 2 && s[0] == bth.OpRCAck && s[1] == bth.OpRCWriteOnly {
						joined++
					} else {
						other++
					}
				}
				want := iters - 1
				if kind == "xdp-pairs" {
					want-- // pairs refused: the first pair went through SendRuns, as frames
				}
				if joined < want || other > 2 {
					t.Fatalf("%d Sends carried an ACK and the next WRITE, %d others; want >= %d and <= 2", joined, other, want)
				}
			}
			if kind == "mem-gso" || kind == "gso-xdp" { // b (and a on mem-gso) received [WRITE, ACK] messages whole, and split them
				for i, d := range []*Device{db, da} {
					st := d.Stats()
					if want := uint64(iters - 1); (i == 0 || kind == "mem-gso") && st.RcvdGSOSplit < want || st.RcvdDropped != 0 || st.RetransPkts != 0 {
						t.Fatalf("device %d: %d GSO messages split (want >= %d on the receiving side), %d dropped, %d retransmitted", i, st.RcvdGSOSplit, want, st.RcvdDropped, st.RetransPkts)
					}
				}
			}
			if kind == "xdp-pairs" { // one GSO frame per pair where the kernel takes them (6.2+), else ring frames
				for i, l := range []*pollLink{la, lb} {
					st := l.Link.(afxdp.StatsLink).XDPStats()
					if st.PairsOff == 0 || xdpPairsKernel(t) { // a kernel may have them before 6.2 (a backport)
						if st.Pairs < iters-1 || st.PairsOff != 0 {
							t.Fatalf("link %d stats %+v: want >= %d pairs as one frame", i, st, iters-1)
						}
						if ds := []*Device{da, db}[i].Stats(); ds.RcvdGSOSplit < iters-1 || ds.RcvdDropped != 0 || ds.RetransPkts != 0 {
							t.Fatalf("device %d: %d GSO pairs split (want >= %d), %d dropped, %d retransmitted", i, ds.RcvdGSOSplit, iters-1, ds.RcvdDropped, ds.RetransPkts)
						}
					} else if st.Pairs != 0 || st.PairsOff != 1 || st.Sent < 2*iters-2 {
						t.Fatalf("link %d stats %+v: want pairs refused once, then ring frames", i, st)
					}
				}
			}
			if kind == "xdp" { // through the rings; only a's first WRITE (b's MAC not yet known) took the socket
				for i, l := range []*pollLink{la, lb} {
					st := l.Link.(afxdp.StatsLink).XDPStats()
					if st.Sent < 2*iters-2 || st.Received < 2*iters-1 || st.Fallbacks > 1-uint64(i) {
						t.Fatalf("link %d stats %+v: want the ping-pong through the AF_XDP rings", i, st)
					}
				}
			}
		})
	}
}

// TestPolledNothingWithoutPoll: a polled device reads nothing by itself — a WRITE sent to it
// stays in its link until its Poll reads it — and starts no goroutine (goleak: none beyond
// those running before the devices opened). The deferred ACK leaves at the responder's next
// Poll when the application posts nothing, and only then does the requester complete.
func TestPolledNothingWithoutPoll(t *testing.T) {
	opts := goleak.IgnoreCurrent()
	da, db, _, lb := polledPair(t, "mem")
	lb.record = true
	if err := goleak.Find(opts); err != nil {
		t.Fatalf("polled devices started goroutines: %v", err)
	}
	a, b := newEnd(t, da, qp.TypeRC, 1<<12), newEnd(t, db, qp.TypeRC, 1<<12)
	connect(t, a, b, qp.MTU1024, 1, 2)
	a.fill(0, 8, 9)
	post(t, a, writeWR(a, b, 1, 0))
	if b.qp.RemoteWrites() != 0 || b.buf[0] != 0 || b.buf[7] != 0 {
		t.Fatal("the WRITE was placed without Poll")
	}
	if n, err := db.Poll(); n != 1 || err != nil {
		t.Fatalf("b's Poll read %d datagrams (%v), want the 1 WRITE still queued", n, err)
	}
	same(t, "written", b.buf[:8], a.buf[:8])
	if s := lb.sends(); len(s) != 0 {
		t.Fatalf("b sent %v during the Poll that read the WRITE; its ACK must wait", s)
	}
	for i := 0; i < 3; i++ { // a polls: nothing to read, no completion
		if n, err := da.Poll(); n != 0 || err != nil {
			t.Fatalf("a's Poll read %d (%v) before b's ACK left", n, err)
		}
	}
	var wc [1]cq.WC
	if a.scq.Poll(wc[:]) != 0 {
		t.Fatal("a's WRITE completed before b sent its ACK")
	}
	if n, err := db.Poll(); n != 0 || err != nil { // nothing to read; sends the deferred ACK
		t.Fatalf("b's second Poll: %d, %v", n, err)
	}
	if s := lb.sends(); len(s) != 1 || len(s[0]) != 1 || s[0][0] != bth.OpRCAck {
		t.Fatalf("b's second Poll sent %v, want one batch with the ACK", s)
	}
	if w := pollWC(t, a.scq, da); w.Status != cq.StatusSuccess || w.WRID != 1 {
		t.Fatalf("a's completion %+v", w)
	}
}

// TestPolledCloseAndDestroySendDeferredACK: the ACK a Poll deferred leaves when the application
// destroys the QP or closes the device instead of polling again (IBTA 9.7.5.1: the requester's
// WRITE completes successfully).
func TestPolledCloseAndDestroySendDeferredACK(t *testing.T) {
	for _, how := range []string{"destroy", "close"} {
		t.Run(how, func(t *testing.T) {
			da, db, _, lb := polledPair(t, "mem")
			lb.record = true
			a, b := newEnd(t, da, qp.TypeRC, 1<<12), newEnd(t, db, qp.TypeRC, 1<<12)
			connect(t, a, b, qp.MTU1024, 1, 2)
			post(t, a, writeWR(a, b, 1, 0))
			if n, err := db.Poll(); n != 1 || err != nil {
				t.Fatalf("b's Poll: %d, %v", n, err)
			}
			if s := lb.sends(); len(s) != 0 {
				t.Fatalf("ACK sent at once: %v", s)
			}
			if how == "destroy" {
				if err := b.qp.Destroy(); err != nil {
					t.Fatal(err)
				}
			} else if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			if w := pollWC(t, a.scq, da); w.Status != cq.StatusSuccess || w.WRID != 1 {
				t.Fatalf("a's completion %+v", w)
			}
			if how == "close" {
				if _, err := db.Poll(); !errors.Is(err, ErrClosed) {
					t.Fatalf("Poll after Close: %v, want ErrClosed", err)
				}
			}
		})
	}
}

// TestPollNotPolled: Poll on a device with a receive goroutine is refused, and a link that
// cannot be polled is refused at Open.
func TestPollNotPolled(t *testing.T) {
	nw := mem.NewNetwork(mem.Options{})
	l, err := nw.Attach(addrA)
	if err != nil {
		t.Fatal(err)
	}
	d, err := Open(Options{Link: l})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.Poll(); !errors.Is(err, ErrNotPolled) || d.Polled() {
		t.Fatalf("Poll without polled mode: %v", err)
	}
	l2, err := nw.Attach(addrB)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	if _, err := Open(Options{Link: hbLink{l2}, Polled: true}); !errors.Is(err, ErrInvalidArg) {
		t.Fatalf("polled Open on a link without TryRecv: %v", err)
	}
}

// TestPolledZeroAlloc: a polled WRITE round trip (post, Poll the peer until it lands, write
// back, Poll until it lands, reap both completions) allocates nothing.
func TestPolledZeroAlloc(t *testing.T) {
	da, db, _, _ := polledPair(t, "mem")
	a, b := newEnd(t, da, qp.TypeRC, 1<<12), newEnd(t, db, qp.TypeRC, 1<<12)
	connect(t, a, b, qp.MTU1024, 1, 2)
	wa, wb := []qp.SendWR{writeWR(a, b, 1, 0)}, []qp.SendWR{writeWR(b, a, 2, 64)}
	var wc [4]cq.WC
	var failed error
	poll := func(d *Device) {
		if _, err := d.Poll(); err != nil && failed == nil {
			failed = err
		}
	}
	round := func() {
		if _, err := a.qp.PostSend(wa); err != nil && failed == nil {
			failed = err
		}
		w := b.qp.RemoteWrites() + 1
		for i := 0; b.qp.RemoteWrites() != w && i < 1000; i++ {
			poll(db)
		}
		if _, err := b.qp.PostSend(wb); err != nil && failed == nil {
			failed = err
		}
		w = a.qp.RemoteWrites() + 1
		for i := 0; a.qp.RemoteWrites() != w && i < 1000; i++ {
			poll(da)
		}
		poll(da) // the ACK of b's WRITE
		for i := 0; a.scq.Poll(wc[:]) == 0 && i < 1000; i++ {
			poll(da)
		}
		for i := 0; b.scq.Poll(wc[:]) == 0 && i < 1000; i++ {
			poll(db)
		}
	}
	for i := 0; i < 20; i++ {
		round()
	}
	n := testing.AllocsPerRun(100, round)
	if failed != nil {
		t.Fatal(failed)
	}
	if a.qp.RemoteWrites() != 121 || b.qp.RemoteWrites() != 121 {
		t.Fatalf("remote writes %d / %d, want 121 each (20 + a warm-up run + 100)", a.qp.RemoteWrites(), b.qp.RemoteWrites())
	}
	if n != 0 {
		t.Fatalf("%v allocations per polled round trip, want 0", n)
	}
}

// BenchmarkPolledRoundTrip: one 8-byte WRITE each way between two polled devices on the
// in-memory link (the user-space work of ib_write_lat's round trip, without system calls).
func BenchmarkPolledRoundTrip(b *testing.B) {
	nw := mem.NewNetwork(mem.Options{QueueDepth: 16})
	l1, _ := nw.Attach(addrA)
	l2, _ := nw.Attach(addrB)
	da, err := Open(Options{Link: l1, Polled: true})
	if err != nil {
		b.Fatal(err)
	}
	defer da.Close()
	db, err := Open(Options{Link: l2, Polled: true})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	x, y := newEnd(b, da, qp.TypeRC, 1<<12), newEnd(b, db, qp.TypeRC, 1<<12)
	connect(b, x, y, qp.MTU1024, 1, 2)
	wx, wy := []qp.SendWR{writeWR(x, y, 1, 0)}, []qp.SendWR{writeWR(y, x, 2, 64)}
	var wc [4]cq.WC
	b.ReportAllocs()
	cpu0 := cpuTime()
	b.ResetTimer()
	defer func() { b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op") }()
	for i := 0; i < b.N; i++ {
		pingPongRound(b, i, x, y, da, db, wx, wy, wc[:])
	}
}

// cpuTime is the process's user + system CPU time (less sensitive to a loaded machine than
// the wall time per op).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestPseudoHeaderCache: the receive path's pseudo-header CRC cache returns
// bth.PseudoHeaderCRC for every (endpoints, length) and keeps the last two, so a ping-pong's
// alternating WRITE and ACK lengths both hit it.
func TestPseudoHeaderCache(t *testing.T) {
	var rx rxState
	e1 := bth.Endpoints{Src: addrA, Dst: addrB, SrcPort: 0xC001, DstPort: 4791}
	e2 := e1
	e2.SrcPort = 0xC002
	cases := []struct {
		ep *bth.Endpoints
		n  int
	}{{&e1, 48}, {&e1, 20}, {&e1, 48}, {&e1, 20}, {&e2, 20}, {&e1, 20}, {&e2, 48}}
	for i, c := range cases {
		if got, want := rx.pseudoHeader(c.ep, c.n), bth.PseudoHeaderCRC(c.ep, c.n); got != want {
			t.Fatalf("case %d: %#x, want %#x", i, got, want)
		}
		if rx.phc[0].ep != *c.ep || rx.phc[0].n != c.n {
			t.Fatalf("case %d: most recent entry %+v", i, rx.phc[0])
		}
		if i > 0 {
			p := cases[i-1]
			if (*p.ep != *c.ep || p.n != c.n) && (rx.phc[1].ep != *p.ep || rx.phc[1].n != p.n) {
				t.Fatalf("case %d: the previous (endpoints, length) was not kept: %+v", i, rx.phc[1])
			}
		}
	}
}

// TestPolledRecovery: polled ping-pong in which one side's [ACK, WRITE] send is lost: the peers
// recover by retransmission (ACK timeout on the manual clock) and finish.
func TestPolledRecovery(t *testing.T) {
	for _, c := range []struct {
		kind string
		drop int
	}{{"mem", 1}, {"mem", 2}, {"mem", 3}, {"udp-gso", 1}, {"udp-gso", 2}, {"udp-gso", 3}, {"udp-gso", 5}} {
		drop := c.drop
		da, db, la, _ := polledPair(t, c.kind)
		clk := da.clock.(*qp.ManualClock)
		a, b := newEnd(t, da, qp.TypeRC, 1<<12), newEnd(t, db, qp.TypeRC, 1<<12)
		connect(t, a, b, qp.MTU1024, 100, 200)
		la.dropSend = drop // a's drop-th Send vanishes
		for i := 1; i <= 20; i++ {
			off := 8 * (i % 64)
			post(t, a, writeWR(a, b, uint64(i), off))
			want := b.qp.RemoteWrites() + 1
			pollAdvance(t, clk, func() bool { return b.qp.RemoteWrites() >= want }, da, db)
			if i > 1 {
				if w := pollWCAdvance(t, clk, b.scq, da, db); w.Status != cq.StatusSuccess {
					t.Fatalf("drop %d: b's completion %+v at %d", drop, w, i)
				}
			}
			post(t, b, writeWR(b, a, uint64(i), 2048+off))
			want = a.qp.RemoteWrites() + 1
			pollAdvance(t, clk, func() bool { return a.qp.RemoteWrites() >= want }, da, db)
			if w := pollWCAdvance(t, clk, a.scq, da, db); w.Status != cq.StatusSuccess {
				t.Fatalf("drop %d: a's completion %+v at %d", drop, w, i)
			}
		}
		if c.kind == "udp-gso" && la.runSends == 0 {
			t.Fatalf("%s: no [WRITE, ACK] GSO run was sent", c.kind)
		}
		if s := da.Stats(); s.RetransPkts == 0 {
			t.Fatalf("%s drop %d: nothing was retransmitted (the loss was not exercised)", c.kind, drop)
		}
	}
}

// pollAdvance polls both devices until done; when a round of polls reads nothing it advances
// the manual clock by 10 ms (timers: retransmission).
func pollAdvance(t *testing.T, clk *qp.ManualClock, done func() bool, devs ...*Device) {
	t.Helper()
	for i := 0; !done(); i++ {
		got := 0
		for _, d := range devs {
			n, err := d.Poll()
			if err != nil {
				t.Fatal(err)
			}
			got += n
		}
		if got == 0 && i%4 == 3 {
			clk.Advance(10 * time.Millisecond)
		}
		if i > 100000 {
			t.Fatal("no progress")
		}
	}
}

func pollWCAdvance(t *testing.T, clk *qp.ManualClock, c *cq.CQ, devs ...*Device) cq.WC {
	t.Helper()
	var wc [1]cq.WC
	pollAdvance(t, clk, func() bool { return c.Poll(wc[:]) == 1 }, devs...)
	return wc[0]
}

// xdpPairsKernel reports whether the kernel must take the AF_XDP path's GSO pairs
// (VIRTIO_NET_HDR_GSO_UDP_L4 in an AF_PACKET virtio-net header: Linux 6.2; an older kernel
// with it backported may take them too).
func xdpPairsKernel(t *testing.T) bool { return netnstest.KernelAtLeast(t, 6, 2) }
