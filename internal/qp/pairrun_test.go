package qp

import (
	"net/netip"
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/pkg/bth"
)

// pairSides connects a (QPN 0x11) and b (0x12), b sending through a runOut (GSO runs or not).
func pairSides(t *testing.T, gso bool) (*net, *side, *side, *runOut) {
	n := newNet(t)
	a := n.newSide("10.0.0.1", sideOpts{qpn: 0x11, bufSize: 1 << 16})
	b := n.newSide("10.0.0.2", sideOpts{qpn: 0x12, bufSize: 1 << 16})
	ro := &runOut{t: t, gso: gso}
	b.qp.cfg.Out, b.qp.runs = ro, ro
	b.out = &ro.chanOut
	n.connect(a, b, connOpts{mtu: MTU1024})
	return n, a, b, ro
}

// writeDeferred has a post an 8-byte WRITE (wrid, a's and b's buffers at off) and b receive it
// with ReceiveDeferred: b's ACK stays queued in its burst (a polled device between two Polls).
func writeDeferred(t *testing.T, n *net, a, b *side, wrid uint64, off int) {
	t.Helper()
	a.fill(off, 8, byte(wrid))
	a.postSend(t, SendWR{WRID: wrid, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(off, 8)}, Flags: SendSignaled,
		RemoteAddr: b.va(off), RKey: b.mr.RKey()})
	if len(a.out.q) != 1 {
		t.Fatalf("a sent %d datagrams", len(a.out.q))
	}
	d := a.out.q[0]
	a.out.q = nil
	p, err := bth.Parse(d.Buf)
	if err != nil {
		t.Fatal(err)
	}
	if !b.qp.ReceiveDeferred(n.clk.Now(), &p, d.Src, d.Dst) {
		t.Fatal("ReceiveDeferred dropped the WRITE")
	}
}

// TestPairRun: a responder whose ACK is still queued (ReceiveDeferred, before FlushReceived:
// a polled device between two Polls) and that then posts a WRITE sends both as ONE GSO run —
// the WRITE first (segment 0, ICRC for IPv4 ID 0), the shorter ACK last (ICRC for ID 1; runOut
// checks both) — and the peer gets both: its WRITE completes and the data lands. Two requests
// posted together keep their order (no swap), and a response alone stays plain.
func TestPairRun(t *testing.T) {
	n, a, b, ro := pairSides(t, true)

	// a -> b: one 8-byte WRITE, received deferred (its ACK stays queued)
	writeDeferred(t, n, a, b, 1, 0)
	if ro.sendRuns != 0 || ro.plain != 0 || len(ro.q) != 0 {
		t.Fatal("the deferred ACK left before FlushReceived or the next post")
	}
	// b -> a: its WRITE takes the queued ACK along, as one run [WRITE, ACK]
	postPairRun(t, a, b, ro, 2, 100)
	b.qp.FlushReceived(n.clk.Now()) // nothing left to send
	if ro.sendRuns != 1 || ro.plain != 0 {
		t.Fatalf("FlushReceived sent again: %d runs, %d plain", ro.sendRuns, ro.plain)
	}
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Status: cq.StatusSuccess, Opcode: cq.OpRDMAWrite, ByteLen: 8, QPNum: 0x11})
	expectWC(t, pollAll(b.scq), cq.WC{WRID: 2, Status: cq.StatusSuccess, Opcode: cq.OpRDMAWrite, ByteLen: 8, QPNum: 0x12})
	eq(t, "a's WRITE", b.buf[:8], a.buf[:8])
	eq(t, "b's WRITE", a.buf[100:108], b.buf[100:108])

	// two requests, the second longer: PSN order stays (two plain datagrams)
	twoRequests(t, n, a, b, ro, 3, 200, 92)
}

// TestPairPlain: without GSO (the AF_XDP path's frames, a link that refused UDP_SEGMENT) the
// deferred ACK and the WRITE posted next leave in one Send as two plain datagrams in the order
// built, the ACK first (pairRun: request first was tried and was slower), each with its ICRC for
// IPv4 ID 0 (runOut's Send checks), and both reach the peer. A response alone and two requests
// keep their order.
func TestPairPlain(t *testing.T) {
	n, a, b, ro := pairSides(t, false)

	writeDeferred(t, n, a, b, 1, 0)
	b.fill(100, 8, 2)
	b.postSend(t, SendWR{WRID: 2, Opcode: WRRDMAWrite, SGL: []SGE{b.sge(100, 8)}, Flags: SendSignaled,
		RemoteAddr: a.va(100), RKey: a.mr.RKey()})
	if ro.sendRuns != 0 || ro.plain != 1 || len(ro.q) != 2 {
		t.Fatalf("SendRuns %d, plain Sends %d of %d datagrams; want one plain Send of 2", ro.sendRuns, ro.plain, len(ro.q))
	}
	if op0, op1 := bth.BTH(ro.q[0].Buf).Opcode(), bth.BTH(ro.q[1].Buf).Opcode(); op0 != bth.OpRCAck || op1 != bth.OpRCWriteOnly {
		t.Fatalf("order %v, %v; want the ACK, then the WRITE", op0, op1)
	}
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Status: cq.StatusSuccess, Opcode: cq.OpRDMAWrite, ByteLen: 8, QPNum: 0x11})
	expectWC(t, pollAll(b.scq), cq.WC{WRID: 2, Status: cq.StatusSuccess, Opcode: cq.OpRDMAWrite, ByteLen: 8, QPNum: 0x12})
	eq(t, "a's WRITE", b.buf[:8], a.buf[:8])
	eq(t, "b's WRITE", a.buf[100:108], b.buf[100:108])

	// a response alone (the flush of a deferred ACK with nothing posted) stays as it is
	ro.plain = 0
	writeDeferred(t, n, a, b, 3, 200)
	b.qp.FlushReceived(n.clk.Now())
	if ro.plain != 1 || len(ro.q) != 1 || bth.BTH(ro.q[0].Buf).Opcode() != bth.OpRCAck {
		t.Fatalf("a lone ACK: %d plain Sends of %d datagrams", ro.plain, len(ro.q))
	}
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 3, Status: cq.StatusSuccess, Opcode: cq.OpRDMAWrite, ByteLen: 8, QPNum: 0x11})

	// two requests keep their PSN order
	twoRequests(t, n, a, b, ro, 4, 300, 92)
}

// pairOut is a runOut without GSO runs (RunGSO false) that is a link.PairSender: the AF_XDP
// path's GSO pairs.
type pairOut struct {
	*runOut
	pairs bool
}

func (p *pairOut) PairGSO(netip.Addr) bool { return p.pairs }

// TestPairGSOOnly: an Output that sends no GSO runs but GSO pairs (link.PairSender: the AF_XDP
// path's) gets the deferred ACK and the WRITE posted next as one run [WRITE, ACK], the ACK's
// ICRC for IPv4 ID 1 (runOut checks), and both reach the peer; two requests stay plain and in
// order. Once the Output's pairs are off, the pair goes plain, the ACK first, ICRCs for ID 0.
func TestPairGSOOnly(t *testing.T) {
	n, a, b, ro := pairSides(t, false)
	po := &pairOut{runOut: ro, pairs: true}
	b.qp.pairs = po

	writeDeferred(t, n, a, b, 1, 0)
	postPairRun(t, a, b, ro, 2, 100)
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Status: cq.StatusSuccess, Opcode: cq.OpRDMAWrite, ByteLen: 8, QPNum: 0x11})
	expectWC(t, pollAll(b.scq), cq.WC{WRID: 2, Status: cq.StatusSuccess, Opcode: cq.OpRDMAWrite, ByteLen: 8, QPNum: 0x12})
	eq(t, "b's WRITE", a.buf[100:108], b.buf[100:108])

	// two requests of one length: no GSO run for them (RunGSO false), plain and in PSN order
	twoRequests(t, n, a, b, ro, 3, 200, 8)

	// pairs off (the kernel refused one): the pair is plain again, the ACK first
	po.pairs = false
	ro.runs, ro.sendRuns, ro.plain = nil, 0, 0
	writeDeferred(t, n, a, b, 5, 300)
	b.fill(400, 8, 6)
	b.postSend(t, SendWR{WRID: 6, Opcode: WRRDMAWrite, SGL: []SGE{b.sge(400, 8)}, Flags: SendSignaled,
		RemoteAddr: a.va(400), RKey: a.mr.RKey()})
	if ro.sendRuns != 0 || ro.plain != 1 || len(ro.q) != 2 || bth.BTH(ro.q[0].Buf).Opcode() != bth.OpRCAck {
		t.Fatalf("pairs off: %d runs, %d plain Sends of %d datagrams; want one plain Send, the ACK first", ro.sendRuns, ro.plain, len(ro.q))
	}
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 5, Status: cq.StatusSuccess, Opcode: cq.OpRDMAWrite, ByteLen: 8, QPNum: 0x11})
	expectWC(t, pollAll(b.scq), cq.WC{WRID: 6, Status: cq.StatusSuccess, Opcode: cq.OpRDMAWrite, ByteLen: 8, QPNum: 0x12})
}

// twoRequests has b post two WRITEs to a (8 bytes at off, then second bytes, the second
// signaled; WRIDs wrid, wrid+1) and checks that they leave as one plain Send of two datagrams
// in PSN order, and that the data lands and the second completes.
func twoRequests(t *testing.T, n *net, a, b *side, ro *runOut, wrid uint64, off, second int) {
	t.Helper()
	ro.runs, ro.sendRuns, ro.plain = nil, 0, 0
	b.fill(off, 8+second, byte(wrid))
	b.postSend(t,
		SendWR{WRID: wrid, Opcode: WRRDMAWrite, SGL: []SGE{b.sge(off, 8)}, RemoteAddr: a.va(off), RKey: a.mr.RKey()},
		SendWR{WRID: wrid + 1, Opcode: WRRDMAWrite, SGL: []SGE{b.sge(off+8, second)}, Flags: SendSignaled,
			RemoteAddr: a.va(off + 8), RKey: a.mr.RKey()})
	if ro.sendRuns != 0 || ro.plain != 1 || len(ro.q) != 2 {
		t.Fatalf("two requests: %d runs %v, %d plain Sends of %d datagrams", ro.sendRuns, ro.runs, ro.plain, len(ro.q))
	}
	if p0, p1 := bth.BTH(ro.q[0].Buf).PSN(), bth.BTH(ro.q[1].Buf).PSN(); p1 != p0.Add(1) {
		t.Fatalf("requests reordered: PSN %v then %v", p0, p1)
	}
	n.pump()
	expectWC(t, pollAll(b.scq), cq.WC{WRID: wrid + 1, Status: cq.StatusSuccess, Opcode: cq.OpRDMAWrite, ByteLen: uint32(second), QPNum: 0x12})
	eq(t, "b's two WRITEs", a.buf[off:off+8+second], b.buf[off:off+8+second])
}

// postPairRun has b, whose ACK of a's last WRITE is still queued, post an 8-byte WRITE (wrid,
// at off) and checks that both leave as one run of two through SendRuns, the WRITE first.
func postPairRun(t *testing.T, a, b *side, ro *runOut, wrid uint64, off int) {
	t.Helper()
	b.fill(off, 8, byte(wrid))
	b.postSend(t, SendWR{WRID: wrid, Opcode: WRRDMAWrite, SGL: []SGE{b.sge(off, 8)}, Flags: SendSignaled,
		RemoteAddr: a.va(off), RKey: a.mr.RKey()})
	if ro.sendRuns != 1 || ro.plain != 0 || len(ro.runs) != 1 || ro.runs[0] != 2 {
		t.Fatalf("SendRuns %d (runs %v), plain Sends %d; want one run of 2", ro.sendRuns, ro.runs, ro.plain)
	}
	if op0, op1 := bth.BTH(ro.q[0].Buf).Opcode(), bth.BTH(ro.q[1].Buf).Opcode(); op0 != bth.OpRCWriteOnly || op1 != bth.OpRCAck {
		t.Fatalf("run order %v, %v; want the WRITE, then the ACK", op0, op1)
	}
}
