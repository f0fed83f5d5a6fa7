package qp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/fault"
)

// Selective repeat (selective.go): exact resends, the fallbacks to go-back-N, the reorder
// buffer's bounds, and byte-exact data and exactly-once atomics under loss, reordering and
// duplication.

// srResult is what one scripted run shows.
type srResult struct {
	resent, selective, sacks, seqNAKs, retries uint64
}

// srExact posts two 64 KiB WRITEs (128 packets at MTU 1024: the whole window) from a to b with
// each PSN in drop lost once, and runs them to completion on the wire alone (no timer expires):
// the data arrives intact.
func srExact(t *testing.T, srA, srB bool, drop []int) srResult {
	t.Helper()
	rules := ""
	for _, p := range drop {
		rules += fmt.Sprintf("drop:psn=%d:nth=1,", p)
	}
	w := faultPair(t, connOpts{srA: srA, srB: srB, retry: 7}, rules, "")
	a, b := w.a, w.b
	a.fill(0, 128<<10, 3)
	a.postSend(t, a.write(1, 0, 64<<10, b.va(0), b.mr.RKey(), SendSignaled),
		a.write(2, 64<<10, 64<<10, b.va(64<<10), b.mr.RKey(), SendSignaled))
	w.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpRDMAWrite, ByteLen: 64 << 10},
		cq.WC{WRID: 2, Opcode: cq.OpRDMAWrite, ByteLen: 64 << 10})
	eq(t, "WRITE data", b.buf[:128<<10], a.buf[:128<<10])
	sa, sb := a.cnt.Snapshot(), b.cnt.Snapshot()
	return srResult{resent: sa.RetransPkts, selective: sa.SelectiveRetrans, sacks: sb.SentSACK,
		seqNAKs: sa.RcvdSeqErr, retries: sa.CompleterRetryErr}
}

// TestSelectiveRepeatExactResend: with selective repeat on both sides each lost packet costs
// exactly one resend, and no retry; go-back-N resends from the first lost PSN on.
func TestSelectiveRepeatExactResend(t *testing.T) {
	for _, c := range []struct {
		drop      []int
		gbnResent uint64
	}{
		{[]int{10}, 118},
		{[]int{63}, 65},
		{[]int{10, 40, 63, 100}, 118},
		{[]int{0, 1, 2, 3, 126}, 128},
	} {
		t.Run(fmt.Sprint(c.drop), func(t *testing.T) {
			sr := srExact(t, true, true, c.drop)
			gbn := srExact(t, false, false, c.drop)
			t.Logf("lost %d of 128 packets: selective repeat resent %d (%d SACKs), go-back-N resent %d",
				len(c.drop), sr.resent, sr.sacks, gbn.resent)
			if n := uint64(len(c.drop)); sr.resent != n || sr.selective != n || sr.retries != 0 || sr.seqNAKs != 0 {
				t.Fatalf("selective repeat: %+v, want exactly %d resends and no retry", sr, n)
			}
			if gbn.resent != c.gbnResent || gbn.sacks != 0 || gbn.selective != 0 {
				t.Fatalf("go-back-N: %+v, want %d resends", gbn, c.gbnResent)
			}
		})
	}
}

// TestSelectiveRepeatFallbacks: a requester with selective repeat and a responder without gets
// plain NAKs and goes back N; a requester without it reads a SACK as the standard PSN sequence
// error NAK (IBTA 9.7.5.2.1) and goes back N too, once per gap. Data intact both ways.
func TestSelectiveRepeatFallbacks(t *testing.T) {
	r := srExact(t, true, false, []int{10})
	if r.sacks != 0 || r.selective != 0 || r.seqNAKs != 1 || r.resent != 118 {
		t.Fatalf("selective requester, plain responder: %+v, want one NAK and go-back-N", r)
	}
	r = srExact(t, false, true, []int{10})
	if r.sacks == 0 || r.selective != 0 || r.seqNAKs != r.sacks || r.retries != 1 || r.resent != 118 {
		t.Fatalf("plain requester, selective responder: %+v, want SACKs read as NAKs and one go-back-N", r)
	}
}

// TestSelectiveRepeatLostResend: a resend lost too is resent again as soon as a SACK triggered
// by a packet sent after it shows it still missing (no timeout); a lost SACK costs nothing
// while later ones follow.
func TestSelectiveRepeatLostResend(t *testing.T) {
	w := faultPair(t, connOpts{srA: true, srB: true, retry: 7}, "drop:psn=5:nth=1,drop:psn=5:nth=2", "drop:op=ACK:nth=1")
	a, b := w.a, w.b
	a.fill(0, 256<<10, 9)
	for i := 0; i < 4; i++ {
		a.postSend(t, a.write(uint64(i), i<<16, 64<<10, b.va(i<<16), b.mr.RKey(), SendSignaled))
	}
	w.pump()
	if got := len(pollAll(a.scq)); got != 4 {
		t.Fatalf("%d completions, want 4", got)
	}
	eq(t, "WRITE data", b.buf[:256<<10], a.buf[:256<<10])
	s := a.cnt.Snapshot()
	if s.CompleterRetryErr != 0 || s.RetransPkts != 2 || s.SelectiveRetrans != 2 {
		t.Fatalf("counters %+v: want PSN 5 resent twice, no retry", s)
	}
}

// srLossRun moves msgs 64 KiB WRITEs from a to b, 4 outstanding, through drop on both
// sides' sends, and returns the request packets sent per packet needed.
func srLossRun(t *testing.T, sr bool, drop float64, msgs int, seed uint64) (ratio float64, sa, sb Stats) {
	t.Helper()
	n := newNet(t)
	fo := fault.DirOptions{Drop: drop}
	mk := func(addr string, qpn uint32, s2 uint64) *side {
		ip := netip.MustParseAddr(addr)
		return n.newSide(addr, sideOpts{qpn: qpn, out: func(c *chanOut) Output {
			fl := fault.Wrap(chanLink{c, ip}, fault.Options{Seed1: seed, Seed2: s2, Clock: n.clk, Send: fo})
			t.Cleanup(func() { fl.Close() })
			return fl
		}})
	}
	a, b := mk("10.0.0.1", 0x11, 1), mk("10.0.0.2", 0x12, 2)
	n.connect(a, b, connOpts{srA: sr, srB: sr, retry: 7})
	a.fill(0, 1<<20, 5)
	posted, done := 0, 0
	for done < msgs {
		for posted < msgs && posted-done < 4 {
			off := (posted % 16) << 16
			a.postSend(t, a.write(uint64(posted), off, 64<<10, b.va(off), b.mr.RKey(), SendSignaled))
			posted++
		}
		n.pump()
		wcs := pollAll(a.scq)
		for _, wc := range wcs {
			if wc.Status != cq.StatusSuccess || wc.WRID != uint64(done) {
				t.Fatalf("completion %+v, want WR %d", wc, done)
			}
			done++
		}
		if len(wcs) == 0 {
			dl, ok := n.clk.NextDeadline()
			if !ok {
				t.Fatalf("stuck at %d/%d with no timer", done, msgs)
			}
			n.clk.Advance(dl.Sub(n.clk.Now()))
		}
	}
	eq(t, "WRITE data", b.buf[:1<<20], a.buf[:1<<20])
	sa, sb = a.cnt.Snapshot(), b.cnt.Snapshot()
	need := float64(msgs * 64)
	return (need + float64(sa.RetransPkts)) / need, sa, sb
}

// TestSelectiveRepeatLoss: at 5% random loss on both directions, 64 KiB WRITEs cost at most
// 1.15 request packets per packet needed with selective repeat (go-back-N: about 3).
func TestSelectiveRepeatLoss(t *testing.T) {
	msgs := 300
	if testing.Short() {
		msgs = 100
	}
	for seed := uint64(1); seed <= 3; seed++ {
		sr, sa, sb := srLossRun(t, true, 0.05, msgs, seed)
		gbn, ga, _ := srLossRun(t, false, 0.05, msgs, seed)
		t.Logf("seed %d, %d x 64 KiB WRITE at 5%% loss: selective repeat %.3f packets sent per packet needed "+
			"(resent %d, %d one by one, %d SACKs, %d timeouts); go-back-N %.3f (resent %d, %d retries)",
			seed, msgs, sr, sa.RetransPkts, sa.SelectiveRetrans, sb.SentSACK, sa.CompleterRetryErr,
			gbn, ga.RetransPkts, ga.CompleterRetryErr)
		if sr > 1.15 {
			t.Fatalf("seed %d: selective repeat sent %.3f packets per packet needed, want <= 1.15", seed, sr)
		}
	}
}

// TestSelectiveRepeatSoak: the fake-clock soak (SEND, WRITE, WRITE_WITH_IMM, READ, FETCH_ADD,
// CMP_SWP both ways through 10% drop, 5% duplication, 5% reordering: every byte and every
// atomic result checked) with selective repeat on both QPs, and on one of them only (each
// direction then has one of the fallback pairings).
func TestSelectiveRepeatSoak(t *testing.T) {
	for _, c := range []struct {
		name     string
		srA, srB bool
	}{{"both", true, true}, {"a-only", true, false}, {"b-only", false, true}} {
		for seed := uint64(1); seed <= 3; seed++ {
			t.Run(fmt.Sprint(c.name, "/", seed), func(t *testing.T) {
				fakeSoakOpts(t, seed, 1500, connOpts{srA: c.srA, srB: c.srB})
			})
		}
	}
}

// srCapture builds a's packets for a burst of requests (a 16 KiB WRITE, a 4 KiB SEND with
// immediate, a FETCH_ADD, an 8 KiB WRITE with immediate: 29 PSNs) to a b that never answers;
// it returns the net, the sides and the packets as sent.
func srCapture(t testing.TB) (*net, *side, *side, []link.Datagram) {
	n := newNet(t)
	a := n.newSide("10.0.0.1", sideOpts{qpn: 0x11})
	b := n.newSide("10.0.0.2", sideOpts{qpn: 0x12})
	n.connect(a, b, connOpts{srA: true, srB: true, psnA: 0xFFFFF0})
	a.fill(0, 64<<10, 1)
	b.postRecv(t, RecvWR{WRID: 7, SGL: []SGE{b.sge(1<<20, 8<<10)}}, RecvWR{WRID: 8, SGL: []SGE{b.sge(1<<20+8<<10, 8<<10)}})
	binary.LittleEndian.PutUint64(b.buf[2<<20:], 100)
	a.postSend(t, a.write(1, 0, 16<<10, b.va(0), b.mr.RKey(), 0),
		SendWR{WRID: 2, Opcode: WRSendWithImm, SGL: []SGE{a.sge(16<<10, 4<<10)}, Imm: 0xAB},
		SendWR{WRID: 3, Opcode: WRAtomicFetchAndAdd, SGL: []SGE{a.sge(60<<10, 8)}, RemoteAddr: b.va(2 << 20),
			RKey: b.mr.RKey(), CompareAdd: 5},
		SendWR{WRID: 4, Opcode: WRRDMAWriteWithImm, SGL: []SGE{a.sge(20<<10, 8<<10)}, Imm: 0xCD,
			RemoteAddr: b.va(32 << 10), RKey: b.mr.RKey(), Flags: SendSignaled})
	pk := a.out.q
	a.out.q = nil
	if len(pk) != 29 {
		t.Fatalf("%d packets, want 29", len(pk))
	}
	return n, a, b, pk
}

// srCheck verifies that b executed every request of srCapture exactly once.
func srCheck(t testing.TB, a, b *side) {
	t.Helper()
	eq(t, "WRITE", b.buf[:16<<10], a.buf[:16<<10])
	eq(t, "WRITE_WITH_IMM", b.buf[32<<10:40<<10], a.buf[20<<10:28<<10])
	eq(t, "SEND", b.buf[1<<20:1<<20+4<<10], a.buf[16<<10:20<<10])
	if v := binary.LittleEndian.Uint64(b.buf[2<<20:]); v != 105 {
		t.Fatalf("FETCH_ADD word %d, want 105 (executed once)", v)
	}
	expectWC(t, pollAll(b.rcq), cq.WC{WRID: 7, Opcode: cq.OpRecv, ByteLen: 4 << 10, ImmData: 0xAB, Flags: cq.FlagWithImm},
		cq.WC{WRID: 8, Opcode: cq.OpRecvRDMAWithImm, ByteLen: 8 << 10, ImmData: 0xCD, Flags: cq.FlagWithImm})
	if st := b.qp.State(); st != StateRTS {
		t.Fatalf("responder in %v", st)
	}
}

// TestSelectiveRepeatPermutations: the responder executes a burst delivered in any order, with
// any packet repeated, exactly once and in PSN order (across the PSN wrap): data, the receive
// completions and the FETCH_ADD as if it had arrived in order.
func TestSelectiveRepeatPermutations(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	for trial := 0; trial < 200; trial++ {
		n, a, b, pk := srCapture(t)
		order := r.Perm(len(pk))
		for i := r.IntN(20); i > 0; i-- {
			order = append(order, r.IntN(len(pk)))
			k := r.IntN(len(order))
			order[k], order[len(order)-1] = order[len(order)-1], order[k]
		}
		for _, i := range order {
			n.deliver(a, &pk[i])
		}
		srCheck(t, a, b)
		if s := b.cnt.Snapshot(); s.SentSACK == 0 && order[0] != 0 {
			t.Fatalf("trial %d: no SACK", trial)
		}
	}
}

// TestSelectiveRepeatRandomPSNs: an SR responder fed the burst with random PSNs (ahead, behind,
// far outside the window, duplicates) never panics and never writes outside the region; what
// it executes is a protocol matter (it may NAK and enter ERR).
func TestSelectiveRepeatRandomPSNs(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	for trial := 0; trial < 300; trial++ {
		n, a, b, pk := srCapture(t)
		for k := 0; k < 80; k++ {
			d := pk[r.IntN(len(pk))]
			d.Buf = append([]byte(nil), d.Buf...)
			h := bth.BTH(d.Buf)
			switch r.IntN(4) {
			case 0:
				h.SetPSN(h.PSN().Add(uint32(r.IntN(300))))
			case 1:
				h.SetPSN(h.PSN().Add(bth.PSNMask - uint32(r.IntN(300))))
			case 2:
				h.SetPSN(bth.PSN(r.Uint32() & bth.PSNMask))
			}
			reencode(&d)
			n.deliver(a, &d)
		}
		if st := b.qp.State(); st != StateRTS && st != StateErr {
			t.Fatalf("trial %d: responder in %v", trial, st)
		}
	}
}

// TestSelectiveRepeatWindow: a packet beyond the window (expected PSN + MaxUnackedPSNs) is
// dropped, not held; one at its last PSN is held (and stays held: it is still ahead); the burst,
// delivered backwards, then completes intact.
func TestSelectiveRepeatWindow(t *testing.T) {
	n, a, b, pk := srCapture(t)
	far := pk[5]
	far.Buf = append([]byte(nil), far.Buf...)
	bth.BTH(far.Buf).SetPSN(bth.BTH(far.Buf).PSN().Add(MaxUnackedPSNs - 5)) // epsn + 128
	reencode(&far)
	edge := pk[6]
	edge.Buf = append([]byte(nil), edge.Buf...)
	bth.BTH(edge.Buf).SetPSN(bth.BTH(edge.Buf).PSN().Add(MaxUnackedPSNs - 7)) // epsn + 127
	reencode(&edge)
	n.deliver(a, &far)
	if s := b.cnt.Snapshot(); s.RcvdDropped != 1 || b.qp.resp.sr != nil && b.qp.resp.sr.n != 0 {
		t.Fatalf("beyond the window: dropped %d", s.RcvdDropped)
	}
	n.deliver(a, &edge)
	if b.qp.resp.sr == nil || b.qp.resp.sr.n != 1 {
		t.Fatal("the window's last PSN is not held")
	}
	for i := len(pk) - 1; i >= 0; i-- {
		n.deliver(a, &pk[i])
	}
	srCheck(t, a, b)
	if b.qp.resp.sr.n != 1 { // the edge copy: still ahead of the expected PSN
		t.Fatalf("%d packets held, want the edge copy only", b.qp.resp.sr.n)
	}
}

// srRings connects two RC QPs with selective repeat on both ends whose Outputs are ringOuts
// (ra, rb), and returns them with two more rings (sa, sb) for drain to send through.
func srRings(t *testing.T) (a, b *side, ra, rb, sa, sb *ringOut) {
	n := newNet(t)
	a = n.newSide("10.0.0.1", sideOpts{qpn: 0x11})
	b = n.newSide("10.0.0.2", sideOpts{qpn: 0x12})
	ra, rb = newRingOut(512), newRingOut(512)
	a.qp.cfg.Out, b.qp.cfg.Out = ra, rb
	n.connect(a, b, connOpts{srA: true, srB: true})
	return a, b, ra, rb, newRingOut(512), newRingOut(512)
}

// TestSelectiveRepeatZeroAlloc: once the reorder buffer and the resend record exist, reordered
// packets, SACKs, drains and selective resends allocate nothing.
func TestSelectiveRepeatZeroAlloc(t *testing.T) {
	a, b, ra, rb, sa, sb := srRings(t)
	wr := []SendWR{{WRID: 1, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 64<<10)}, Flags: SendSignaled,
		RemoteAddr: b.va(dstOff), RKey: b.mr.RKey()}}
	wcs := make([]cq.WC, 4)
	run := func() {
		if _, err := a.qp.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		for first := true; ; first = false {
			if first && ra.n > 40 {
				ra.meta[3], ra.meta[30] = ra.meta[30], ra.meta[3] // 30 early, 3 late
			}
			if drain(ra, sa, b.qp, nil)+drain(rb, sb, a.qp, nil) == 0 {
				break
			}
		}
		if a.scq.Poll(wcs) != 1 || wcs[0].Status != cq.StatusSuccess {
			t.Fatalf("completion %+v", wcs[0])
		}
	}
	run()
	if allocs := testing.AllocsPerRun(20, run); allocs != 0 {
		t.Fatalf("%.1f allocations per reordered 64 KiB WRITE", allocs)
	}
	if s := b.cnt.Snapshot(); s.SentSACK == 0 {
		t.Fatal("no SACK: nothing was reordered")
	}
}

// TestSelectiveRepeatRefused: a QP whose receives come through the refill hook (the daemon's)
// refuses selective repeat; UC ignores it; Query reports what was set.
func TestSelectiveRepeatRefused(t *testing.T) {
	n := newNet(t)
	a := n.newSide("10.0.0.1", sideOpts{qpn: 0x11})
	a.qp.cfg.RecvRefill = func(*QP) bool { return false }
	if err := a.qp.Modify(&Attr{State: StateInit, Port: 1, AccessFlags: 7}, AttrState|AttrPKeyIndex|AttrPort|AttrAccessFlags); err != nil {
		t.Fatal(err)
	}
	m := AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRDAtomic | AttrMinRNRTimer | AttrSelectiveRepeat
	at := &Attr{State: StateRTR, AH: AHAttr{DGID: netip.MustParseAddr("10.0.0.2")}, PathMTU: MTU1024, DestQPN: 0x12,
		MaxDestRDAtomic: 1, SelectiveRepeat: true}
	if err := a.qp.Modify(at, m); !errors.Is(err, ErrSelectiveRepeat) {
		t.Fatalf("with a refill hook: %v, want ErrSelectiveRepeat", err)
	}
	a.qp.cfg.RecvRefill = nil
	if err := a.qp.Modify(at, m); err != nil || !a.qp.Query().SelectiveRepeat {
		t.Fatalf("without: %v %v", err, a.qp.Query().SelectiveRepeat)
	}
	u := n.newSide("10.0.0.3", sideOpts{qpn: 0x13, typ: TypeUC})
	if err := u.qp.Modify(&Attr{State: StateInit, Port: 1, AccessFlags: 7}, AttrState|AttrPKeyIndex|AttrPort|AttrAccessFlags); err != nil {
		t.Fatal(err)
	}
	m = AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrSelectiveRepeat
	if err := u.qp.Modify(at, m); !errors.Is(err, ErrModify) {
		t.Fatalf("UC: %v, want ErrModify (RC only)", err)
	}
}
