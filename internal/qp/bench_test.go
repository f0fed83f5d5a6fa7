package qp

import (
	"net/netip"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
)

// ringOut is an allocation-free Output: datagrams are copied into
// preallocated slots and delivered by drain.
type ringOut struct {
	bufs [][]byte
	meta []link.Datagram
	n    int
}

func newRingOut(slots int) *ringOut {
	r := &ringOut{bufs: make([][]byte, slots), meta: make([]link.Datagram, slots)}
	for i := range r.bufs {
		r.bufs[i] = make([]byte, txBufSize)
	}
	return r
}

func (r *ringOut) Send(batch []link.Datagram) error {
	for _, d := range batch {
		if r.n == len(r.bufs) {
			return nil // full: drop like a network
		}
		m := &r.meta[r.n]
		*m = d
		m.Buf = r.bufs[r.n][:copy(r.bufs[r.n], d.Buf)]
		r.n++
	}
	return nil
}

func (r *ringOut) SourcePort(_ netip.Addr, e uint16) uint16 { return e }

// drain delivers every queued datagram to q (after parsing and checking
// the ICRC, as the device does), into a scratch ring so q's responses
// can queue meanwhile.
func drain(from, scratch *ringOut, q *QP, now func() bth.PSN) int {
	from.bufs, scratch.bufs = scratch.bufs, from.bufs
	from.meta, scratch.meta = scratch.meta, from.meta
	k := from.n
	from.n = 0
	for i := 0; i < k; i++ {
		d := &scratch.meta[i]
		var ep bth.Endpoints
		ep.Src, ep.Dst, ep.SrcPort, ep.DstPort = d.Src.Addr(), d.Dst.Addr(), d.Src.Port(), d.Dst.Port()
		if !bth.VerifyICRC(&ep, d.Buf) {
			panic("icrc")
		}
		p, err := bth.Parse(d.Buf)
		if err != nil {
			panic(err)
		}
		if p.Info.Kind == bth.KindCNP {
			q.ReceiveCNP(q.cfg.Clock.Now(), d.Src)
			continue
		}
		q.Receive(q.cfg.Clock.Now(), &p, d.Src, d.Dst)
	}
	return k
}

// benchPair builds two connected RC QPs whose Outputs are ringOuts.
func benchPair(tb testing.TB, mtu MTU) (a, b *side, ra, rb *ringOut) {
	n := newNet(tb)
	a = n.newSide("10.0.0.1", sideOpts{qpn: 0x11})
	b = n.newSide("10.0.0.2", sideOpts{qpn: 0x12})
	ra, rb = newRingOut(512), newRingOut(512)
	a.qp.cfg.Out, b.qp.cfg.Out = ra, rb
	// READ responses past the first few are built by RunResponder (writeStream calls it)
	a.qp.cfg.Schedule, b.qp.cfg.Schedule = func(*QP) { a.sched = true }, func(*QP) { b.sched = true }
	n.connect(a, b, connOpts{mtu: mtu})
	return
}

// writeStream posts one signaled 64 KiB WRITE, moves every packet and
// polls the completion.
func writeStream(tb testing.TB, a, b *side, ra, rb, sa, sb *ringOut, wr []SendWR, wcs []cq.WC) {
	if _, err := a.qp.PostSend(wr); err != nil {
		tb.Fatal(err)
	}
	for {
		for _, s := range [2]*side{a, b} {
			if s.sched {
				s.sched = s.qp.RunResponder(ReadBudget)
			}
		}
		moved := drain(ra, sa, b.qp, nil) + drain(rb, sb, a.qp, nil)
		if moved == 0 && !a.sched && !b.sched {
			break
		}
	}
	if a.scq.Poll(wcs) != 1 || wcs[0].Status != cq.StatusSuccess {
		tb.Fatalf("completion %+v", wcs[0])
	}
}

// TestDataPathZeroAlloc proves the per-packet path (segmentation, ICRC,
// send, receive, placement, ACK, completion) allocates nothing.
func TestDataPathZeroAlloc(t *testing.T) {
	for _, mtu := range []MTU{MTU1024, MTU4096} {
		a, b, ra, rb := benchPair(t, mtu)
		sa, sb := newRingOut(512), newRingOut(512)
		wr := []SendWR{{WRID: 1, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 64<<10)}, Flags: SendSignaled,
			RemoteAddr: b.va(dstOff), RKey: b.mr.RKey()}}
		wcs := make([]cq.WC, 4)
		writeStream(t, a, b, ra, rb, sa, sb, wr, wcs)
		allocs := testing.AllocsPerRun(20, func() { writeStream(t, a, b, ra, rb, sa, sb, wr, wcs) })
		if allocs != 0 {
			t.Fatalf("MTU %v: %.1f allocations per 64 KiB WRITE", mtu, allocs)
		}
		// READ and SEND paths too
		rd := []SendWR{{WRID: 2, Opcode: WRRDMARead, SGL: []SGE{a.sge(0, 64<<10)}, Flags: SendSignaled,
			RemoteAddr: b.va(dstOff), RKey: b.mr.RKey()}}
		if allocs := testing.AllocsPerRun(20, func() { writeStream(t, a, b, ra, rb, sa, sb, rd, wcs) }); allocs != 0 {
			t.Fatalf("MTU %v: %.1f allocations per 64 KiB READ", mtu, allocs)
		}
		rwr := []RecvWR{{WRID: 3, SGL: []SGE{b.sge(dstOff, 64<<10)}}}
		sd := []SendWR{{WRID: 4, Opcode: WRSend, SGL: []SGE{a.sge(0, 64<<10)}, Flags: SendSignaled}}
		rwcs := make([]cq.WC, 4)
		if allocs := testing.AllocsPerRun(20, func() {
			if _, err := b.qp.PostRecv(rwr); err != nil {
				t.Fatal(err)
			}
			writeStream(t, a, b, ra, rb, sa, sb, sd, wcs)
			b.rcq.Poll(rwcs)
		}); allocs != 0 {
			t.Fatalf("MTU %v: %.1f allocations per 64 KiB SEND", mtu, allocs)
		}
	}
}

// BenchmarkWriteStream measures the engine alone (no sockets): 64 KiB
// RDMA WRITEs, both QPs on this goroutine; bytes/op is the payload.
func BenchmarkWriteStream(b *testing.B) {
	for _, mtu := range []MTU{MTU1024, MTU4096} {
		b.Run("mtu"+mtu.String(), func(bb *testing.B) {
			a, r, ra, rb := benchPair(bb, mtu)
			sa, sb := newRingOut(512), newRingOut(512)
			wr := []SendWR{{WRID: 1, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 64<<10)}, Flags: SendSignaled,
				RemoteAddr: r.va(dstOff), RKey: r.mr.RKey()}}
			wcs := make([]cq.WC, 4)
			bb.SetBytes(64 << 10)
			bb.ReportAllocs()
			bb.ResetTimer()
			for i := 0; i < bb.N; i++ {
				writeStream(bb, a, r, ra, rb, sa, sb, wr, wcs)
			}
		})
	}
}

// BenchmarkReadStream is BenchmarkWriteStream for 64 KiB RDMA READs: the responder builds 16
// (MTU 4096) or 64 (MTU 1024) responses per READ, past ReadInline through RunResponder.
func BenchmarkReadStream(b *testing.B) {
	for _, mtu := range []MTU{MTU1024, MTU4096} {
		b.Run("mtu"+mtu.String(), func(bb *testing.B) {
			a, r, ra, rb := benchPair(bb, mtu)
			sa, sb := newRingOut(512), newRingOut(512)
			wr := []SendWR{{WRID: 1, Opcode: WRRDMARead, SGL: []SGE{a.sge(0, 64<<10)}, Flags: SendSignaled,
				RemoteAddr: r.va(dstOff), RKey: r.mr.RKey()}}
			wcs := make([]cq.WC, 4)
			bb.SetBytes(64 << 10)
			bb.ReportAllocs()
			bb.ResetTimer()
			for i := 0; i < bb.N; i++ {
				writeStream(bb, a, r, ra, rb, sa, sb, wr, wcs)
			}
		})
	}
}

// TestPacedZeroAlloc: a paced requester (a rate limit, and DCQCN after a CNP) and a notification
// point answering CE marks allocate nothing either: the pacer's pauses, the timer that ends
// them, the CNPs.
func TestPacedZeroAlloc(t *testing.T) {
	a, b, ra, rb := benchPair(t, MTU1024)
	sa, sb := newRingOut(512), newRingOut(512)
	clk := a.qp.cfg.Clock.(*ManualClock)
	if err := a.qp.Modify(&Attr{RateLimit: 10_000_000}, AttrRateLimit); err != nil { // 10 Gbit/s
		t.Fatal(err)
	}
	a.qp.ReceiveCNP(clk.Now(), netip.AddrPortFrom(b.addr, 0xC000))
	if !a.qp.CongestionState().Limited {
		t.Fatal("no DCQCN limit after a CNP")
	}
	wr := []SendWR{{WRID: 1, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 64<<10)}, Flags: SendSignaled,
		RemoteAddr: b.va(dstOff), RKey: b.mr.RKey()}}
	wcs := make([]cq.WC, 4)
	paced := func() {
		if _, err := a.qp.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		for a.scq.Poll(wcs) == 0 {
			for i := 0; i < ra.n; i++ {
				ra.meta[i].TClass |= link.ECNCE // every request marked: CNPs back, at most one per interval
			}
			if ra.n > 0 && b.qp.NoteCE(clk.Now(), ra.meta[0].Src) {
				b.qp.FlushDeferred()
			}
			if drain(ra, sa, b.qp, nil)+drain(rb, sb, a.qp, nil) == 0 {
				clk.Advance(20 * time.Microsecond)
			}
		}
		if wcs[0].Status != cq.StatusSuccess {
			t.Fatalf("completion %+v", wcs[0])
		}
	}
	paced()
	if n := testing.AllocsPerRun(20, paced); n != 0 {
		t.Fatalf("%.1f allocations per paced 64 KiB WRITE", n)
	}
	if b.cnt.NPCNPSent.Load() == 0 || a.cnt.RPCNPHandled.Load() < 2 {
		t.Fatalf("CNPs sent %d, handled %d", b.cnt.NPCNPSent.Load(), a.cnt.RPCNPHandled.Load())
	}
}
