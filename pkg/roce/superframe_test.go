package roce

import (
	"bytes"
	"cmp"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/afxdp"
	"github.com/softroce/softroce/pkg/link/mem"
)

// gsoMergeLink sends each batch of two or more datagrams of one flow as one datagram, as a
// receiver's generic XDP hook on a veth or loopback sees a UDP GSO message (superframe.go), and
// receives like the AF_XDP path (each datagram with its IPv4 ID, 0 as our senders send):
// the segments concatenated longest first (GSO's equal segments and a shorter last one; an
// ACK and a request are ordered independently, IBTA 9.7.1, as qp's pairRun does), segment k's
// ICRC computed with IPv4 ID k as the sender's kernel numbers GSO segments. Batches that
// could not be one GSO message go out unchanged.
type gsoMergeLink struct {
	link.Link
	merged int
	off    bool // send batches unchanged
}

func (l *gsoMergeLink) Send(b []link.Datagram) error {
	if len(b) < 2 || l.off {
		return l.Link.Send(b)
	}
	segs := slices.Clone(b)
	slices.SortStableFunc(segs, func(x, y link.Datagram) int { return cmp.Compare(len(y.Buf), len(x.Buf)) })
	for i := range segs {
		if segs[i].Src != b[0].Src || segs[i].Dst != b[0].Dst || i > 0 && i < len(segs)-1 && len(segs[i].Buf) != len(segs[0].Buf) {
			return l.Link.Send(b)
		}
	}
	var out []byte
	for k, d := range segs {
		seg := slices.Clone(d.Buf)
		ep := bth.Endpoints{Src: d.Src.Addr(), Dst: d.Dst.Addr(), SrcPort: d.Src.Port(), DstPort: d.Dst.Port(), IPID: uint16(k)}
		bth.SetICRC(seg, bth.ICRC(&ep, seg))
		out = append(out, seg...)
	}
	l.merged++
	return l.Link.Send([]link.Datagram{{Buf: out, Src: b[0].Src, Dst: b[0].Dst}})
}

func (l *gsoMergeLink) TryRecv(b []link.Datagram) (int, error) {
	n, err := l.Link.(link.PollReceiver).TryRecv(b)
	for i := range n {
		b[i].HasIPv4ID, b[i].IPv4ID = true, 0
	}
	return n, err
}

// superWrite builds an RC RDMA WRITE Only to dst's buffer at off (IBTA 9.4.3) with the ICRC
// of IPv4 ID id between src and dst's address (port 4791).
func superWrite(src netip.AddrPort, dst *end, psn uint32, off int, payload []byte, id uint16) []byte {
	p := make([]byte, bth.BTHSize+bth.RETHSize+len(payload)+bth.ICRCSize)
	bth.BTH(p).Encode(&bth.BTHFields{Opcode: bth.OpRCWriteOnly, PKey: 0xffff, DestQP: dst.qp.Num(), AckReq: true, PSN: bth.PSN(psn)})
	bth.RETH(p[bth.BTHSize:]).Encode(&bth.RETHFields{VA: dst.va(off), RKey: dst.mr.RKey(), DMALen: uint32(len(payload))})
	copy(p[bth.BTHSize+bth.RETHSize:], payload)
	ep := bth.Endpoints{Src: src.Addr(), Dst: dst.addr, SrcPort: src.Port(), DstPort: 4791, IPID: id}
	bth.SetICRC(p, bth.ICRC(&ep, p))
	return p
}

// TestSplitGSO: a datagram of the AF_XDP path that holds a GSO message's packets is split and
// each packet executed; one whose segments do not all pass the ICRC check with the message's
// IPv4 ID + k is dropped whole, and so is a GSO message from a link that cannot have delivered
// one (a UDP socket: the ID unknown); a valid packet whose payload looks like a second packet
// of the same flow is never split, and the same packet with a wrong ICRC is dropped.
func TestSplitGSO(t *testing.T) {
	da, db, la, lb := polledPair(t, "mem-gso") // b receives as the AF_XDP path does
	a, b := newEnd(t, da, qp.TypeRC, 1<<12), newEnd(t, db, qp.TypeRC, 1<<12)
	connect(t, a, b, qp.MTU1024, 100, 200) // b expects a's PSN 100
	src := netip.AddrPortFrom(a.addr, 0xC001)
	deliver := func(what string, buf []byte, writes, splits, drops uint64) {
		t.Helper()
		w0, s0 := b.qp.RemoteWrites(), db.Stats()
		if err := la.Link.Send([]link.Datagram{{Buf: buf, Src: src, Dst: netip.AddrPortFrom(b.addr, 4791)}}); err != nil {
			t.Fatal(err)
		}
		if n, err := db.Poll(); n != 1 || err != nil {
			t.Fatalf("%s: b's Poll read %d (%v)", what, n, err)
		}
		s := db.Stats()
		if w := b.qp.RemoteWrites() - w0; w != writes || s.RcvdGSOSplit-s0.RcvdGSOSplit != splits || s.RcvdDropped-s0.RcvdDropped != drops {
			t.Fatalf("%s: %d WRITEs executed, %d split, %d dropped; want %d, %d, %d", what, w,
				s.RcvdGSOSplit-s0.RcvdGSOSplit, s.RcvdDropped-s0.RcvdDropped, writes, splits, drops)
		}
	}
	p1, p2 := bytes.Repeat([]byte{0x11}, 8), bytes.Repeat([]byte{0x22}, 8)
	deliver("two equal segments", slices.Concat(superWrite(src, b, 100, 0, p1, 0), superWrite(src, b, 101, 64, p2, 1)), 2, 1, 0)
	same(t, "segment 0", b.buf[0:8], p1)
	same(t, "segment 1", b.buf[64:72], p2)

	bad := slices.Concat(superWrite(src, b, 102, 128, p1, 0), superWrite(src, b, 103, 192, p2, 1))
	bad[len(bad)-1] ^= 1
	deliver("second segment's ICRC wrong", bad, 0, 0, 1)
	deliver("second segment's ICRC for ID 2", slices.Concat(superWrite(src, b, 102, 128, p1, 0), superWrite(src, b, 103, 192, p2, 2)), 0, 0, 1)
	if b.buf[128] != 0 || b.buf[192] != 0 {
		t.Fatal("a segment of a rejected message was executed")
	}
	s0 := db.Stats()
	db.pl.mu.Lock()
	db.pl.rx.now = time.Unix(1000, 0)
	sock := link.Datagram{Buf: slices.Concat(superWrite(src, b, 102, 128, p1, 0), superWrite(src, b, 103, 192, p2, 1)), Src: src, Dst: netip.AddrPortFrom(b.addr, 4791)}
	db.handle(&db.pl.rx, &sock) // from a UDP socket (the kernel segments GSO messages for it)
	db.pl.mu.Unlock()
	if s := db.Stats(); s.RcvdGSOSplit != s0.RcvdGSOSplit || s.RcvdDropped != s0.RcvdDropped+1 || b.buf[128] != 0 {
		t.Fatalf("a socket datagram holding two packets: %d split, %d dropped; want 0, 1", s.RcvdGSOSplit-s0.RcvdGSOSplit, s.RcvdDropped-s0.RcvdDropped)
	}

	// a 32-byte payload that holds, at a 4-byte boundary, a BTH of the same P_Key and QP
	look := make([]byte, 32)
	copy(look[4:], superWrite(src, b, 103, 0, make([]byte, 4), 0)[:bth.BTHSize])
	deliver("lookalike payload", superWrite(src, b, 102, 256, look, 0), 1, 0, 0)
	same(t, "lookalike payload", b.buf[256:288], look)
	w := superWrite(src, b, 103, 320, look, 0)
	w[len(w)-2] ^= 0x40
	deliver("lookalike payload, ICRC wrong", w, 0, 0, 1)

	// a message whose IPv4 ID is not 0 (kernel rxe's counting IDs, a connected sender's):
	// segment k checks with ID + k, from the cached ID-0 pseudo-header (bth.IPv4IDDelta)
	s0 = db.Stats()
	db.pl.mu.Lock()
	db.pl.rx.now = time.Unix(1000, 0)
	msg := link.Datagram{Buf: slices.Concat(superWrite(src, b, 103, 384, p1, 0x8001), superWrite(src, b, 104, 448, p2, 0x8002)),
		Src: src, Dst: netip.AddrPortFrom(b.addr, 4791), HasIPv4ID: true, IPv4ID: 0x8001}
	db.handle(&db.pl.rx, &msg)
	db.pl.rx.flushPending()
	db.pl.mu.Unlock()
	if s := db.Stats(); s.RcvdGSOSplit != s0.RcvdGSOSplit+1 || s.RcvdDropped != s0.RcvdDropped {
		t.Fatalf("a message of IDs 0x8001, 0x8002: %d split, %d dropped; want 1, 0", s.RcvdGSOSplit-s0.RcvdGSOSplit, s.RcvdDropped-s0.RcvdDropped)
	}
	same(t, "ID 0x8001", b.buf[384:392], p1)
	same(t, "ID 0x8002", b.buf[448:456], p2)
	da.Poll()
	db.Poll()

	// the split allocates nothing (here: a message of two duplicates, each re-ACKed; b's link
	// sends its ACKs as they are, the merge being the test's own allocation)
	lb.Link.(*gsoMergeLink).off = true
	dup := slices.Concat(superWrite(src, b, 100, 0, p1, 0), superWrite(src, b, 101, 64, p2, 1))
	split0 := db.Stats().RcvdGSOSplit
	allocs := testing.AllocsPerRun(50, func() {
		db.pl.mu.Lock()
		db.pl.rx.now = time.Unix(1000, 0)
		dg := link.Datagram{Buf: dup, Src: src, Dst: netip.AddrPortFrom(b.addr, 4791), HasIPv4ID: true}
		db.handle(&db.pl.rx, &dg)
		db.pl.rx.flushPending()
		db.pl.mu.Unlock()
		da.Poll()
	})
	if allocs != 0 || db.Stats().RcvdGSOSplit-split0 < 50 {
		t.Fatalf("%v allocations per split message (%d split)", allocs, db.Stats().RcvdGSOSplit-split0)
	}

	// a WRITE Only longer than its DMA length with a right ICRC is one packet, not a message
	// (no second packet where its DMA length ends): executed as ever, which is a NAK (IBTA
	// 9.7.4.1.4 length: the responder's QP enters ERR), not a split and not a silent drop
	long := superWrite(src, b, 105, 512, bytes.Repeat([]byte{0x33}, 12), 0)
	bth.RETH(long[bth.BTHSize:]).SetDMALen(8)
	ep := bth.Endpoints{Src: src.Addr(), Dst: b.addr, SrcPort: src.Port(), DstPort: 4791}
	bth.SetICRC(long, bth.ICRC(&ep, long))
	s0 = db.Stats()
	w0 := b.qp.RemoteWrites()
	db.pl.mu.Lock()
	dg := link.Datagram{Buf: long, Src: src, Dst: netip.AddrPortFrom(b.addr, 4791), HasIPv4ID: true}
	db.handle(&db.pl.rx, &dg)
	db.pl.rx.flushPending()
	db.pl.mu.Unlock()
	if s := db.Stats(); s.RcvdGSOSplit != s0.RcvdGSOSplit || s.RcvdDropped != s0.RcvdDropped || b.qp.RemoteWrites() != w0 || b.qp.State() != qp.StateErr || b.buf[512] != 0 {
		t.Fatalf("a WRITE Only 4 bytes longer than its DMA length: %d split, %d dropped, %d executed, responder %v; want a NAK",
			s.RcvdGSOSplit-s0.RcvdGSOSplit, s.RcvdDropped-s0.RcvdDropped, b.qp.RemoteWrites()-w0, b.qp.State())
	}
}

// FuzzSplitGSO: any datagram handed to the receive path (the split of GSO messages included),
// with its IPv4 ID known (the first byte's parity: the AF_XDP path) or not, neither panics nor
// executes anything a split could not justify: a split only happens for a datagram of the
// AF_XDP path of at least two minimal packets and at most afxdp.MaxFrame bytes, a multiple of 4.
func FuzzSplitGSO(f *testing.F) {
	nw := mem.NewNetwork(mem.Options{QueueDepth: 16})
	var devs [2]*Device
	for i, addr := range []netip.Addr{addrA, addrB} {
		l, err := nw.Attach(addr)
		if err != nil {
			f.Fatal(err)
		}
		if devs[i], err = Open(Options{Link: l, Polled: true, Clock: qp.NewManualClock(time.Unix(1000, 0))}); err != nil {
			f.Fatal(err)
		}
		f.Cleanup(func() { devs[i].Close() })
	}
	da, db := devs[0], devs[1]
	a, b := newEnd(f, da, qp.TypeRC, 1<<12), newEnd(f, db, qp.TypeRC, 1<<12)
	connect(f, a, b, qp.MTU1024, 100, 200)
	src := netip.AddrPortFrom(a.addr, 0xC001)
	p := bytes.Repeat([]byte{7}, 8)
	f.Add(slices.Concat(superWrite(src, b, 100, 0, p, 0), superWrite(src, b, 101, 64, p, 1)))
	f.Add(slices.Concat(superWrite(src, b, 102, 0, make([]byte, 16), 0), superWrite(src, b, 103, 64, p, 1)))
	f.Add(superWrite(src, b, 100, 0, make([]byte, 32), 0))
	// a shorter last segment, found from the first packet's DMA length (afxdp.ExpectedLen)
	f.Add(slices.Concat(superWrite(src, b, 100, 0, p, 0), superWrite(src, b, 101, 64, p[:4], 1)))
	dst := netip.AddrPortFrom(b.addr, 4791)
	f.Fuzz(func(t *testing.T, data []byte) {
		before := db.Stats().RcvdGSOSplit
		db.pl.mu.Lock()
		known := len(data) > 0 && data[0]&1 == 0
		dg := link.Datagram{Buf: data, Src: src, Dst: dst, HasIPv4ID: known}
		db.handle(&db.pl.rx, &dg)
		db.pl.rx.flushPending()
		db.pl.mu.Unlock()
		if db.Stats().RcvdGSOSplit != before && (!known || len(data) < 2*(bth.BTHSize+bth.ICRCSize) || len(data) > afxdp.MaxFrame || len(data)%4 != 0) {
			t.Fatalf("split a %d-byte datagram (IPv4 ID known: %v)", len(data), known)
		}
	})
}

// TestICRCKnownIPv4ID: a datagram whose IPv4 ID its link saw (the AF_XDP path) has its ICRC
// checked with that ID, all 32 bits, with nothing solved; one whose ICRC holds only for another
// ID is dropped, where a UDP socket's datagram (ID unknown) is accepted through the solver.
func TestICRCKnownIPv4ID(t *testing.T) {
	da, db, _, _ := polledPair(t, "mem")
	a, b := newEnd(t, da, qp.TypeRC, 1<<12), newEnd(t, db, qp.TypeRC, 1<<12)
	connect(t, a, b, qp.MTU1024, 100, 200)
	src, dst := netip.AddrPortFrom(a.addr, 0xC001), netip.AddrPortFrom(b.addr, 4791)
	hand := func(what string, dg link.Datagram, writes, solved, drops uint64) {
		t.Helper()
		w0, s0 := b.qp.RemoteWrites(), db.Stats()
		db.pl.mu.Lock()
		db.pl.rx.now = time.Unix(1000, 0)
		db.handle(&db.pl.rx, &dg)
		db.pl.rx.flushPending()
		db.pl.mu.Unlock()
		s := db.Stats()
		if w := b.qp.RemoteWrites() - w0; w != writes || s.RcvdICRCSolved-s0.RcvdICRCSolved != solved || s.RcvdDropped-s0.RcvdDropped != drops {
			t.Fatalf("%s: %d WRITEs, %d solved, %d dropped; want %d, %d, %d", what, w,
				s.RcvdICRCSolved-s0.RcvdICRCSolved, s.RcvdDropped-s0.RcvdDropped, writes, solved, drops)
		}
	}
	p := bytes.Repeat([]byte{5}, 8)
	hand("ID 0xdf78, known", link.Datagram{Buf: superWrite(src, b, 100, 0, p, 0xdf78), Src: src, Dst: dst, HasIPv4ID: true, IPv4ID: 0xdf78}, 1, 0, 0)
	hand("ID 0, known", link.Datagram{Buf: superWrite(src, b, 101, 8, p, 0), Src: src, Dst: dst, HasIPv4ID: true}, 1, 0, 0)
	hand("ICRC for 0xdf79, arrived with 0xdf78", link.Datagram{Buf: superWrite(src, b, 102, 16, p, 0xdf79), Src: src, Dst: dst, HasIPv4ID: true, IPv4ID: 0xdf78}, 0, 0, 1)
	hand("ICRC for 0x0007, arrived with 0", link.Datagram{Buf: superWrite(src, b, 102, 16, p, 7), Src: src, Dst: dst, HasIPv4ID: true}, 0, 0, 1)
	hand("ICRC for 0xdf79, ID unknown", link.Datagram{Buf: superWrite(src, b, 102, 16, p, 0xdf79), Src: src, Dst: dst}, 1, 1, 0)
}

// TestSplitPanicRecovered: application code runs while a split message's segments are handled
// (here a RecvRefill that panics on the SEND segment); after the application recovers from the
// panic and keeps polling, a datagram with a wrong ICRC is still dropped (the segments' "ICRC
// already checked" never outlives them) and the next GSO message is split again.
func TestSplitPanicRecovered(t *testing.T) {
	da, db, la, _ := polledPair(t, "mem-gso")
	a, b := newEnd(t, da, qp.TypeRC, 1<<12), newEnd(t, db, qp.TypeRC, 1<<12)
	if err := b.qp.Destroy(); err != nil {
		t.Fatal(err)
	}
	refill := true
	var err error
	if b.qp, err = db.CreateQP(QPInit{Type: qp.TypeRC, PD: b.pd, SendCQ: b.scq, RecvCQ: b.rcq,
		Cap: qp.Cap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1},
		RecvRefill: func(*QP) bool {
			if refill {
				refill = false
				panic("application refill")
			}
			return false
		}}); err != nil {
		t.Fatal(err)
	}
	connect(t, a, b, qp.MTU1024, 100, 200)
	src, dst := netip.AddrPortFrom(a.addr, 0xC001), netip.AddrPortFrom(b.addr, 4791)
	send := make([]byte, bth.BTHSize+8+bth.ICRCSize) // a SEND Only: b has no receive WQE, RecvRefill runs
	bth.BTH(send).Encode(&bth.BTHFields{Opcode: bth.OpRCSendOnly, PKey: 0xffff, DestQP: b.qp.Num(), PSN: 101})
	ep := bth.Endpoints{Src: src.Addr(), Dst: b.addr, SrcPort: src.Port(), DstPort: 4791, IPID: 1}
	bth.SetICRC(send, bth.ICRC(&ep, send))
	if err := la.Link.Send([]link.Datagram{{Buf: slices.Concat(superWrite(src, b, 100, 0, bytes.Repeat([]byte{1}, 8), 0), send), Src: src, Dst: dst}}); err != nil {
		t.Fatal(err)
	}
	panicked := false
	func() {
		defer func() { panicked = recover() != nil }()
		db.Poll()
	}()
	if !panicked || db.pl.rx.splitting {
		t.Fatalf("panicked %v, split state left set %v; want a recovered panic and the state cleared", panicked, db.pl.rx.splitting)
	}
	w := superWrite(src, b, 101, 256, bytes.Repeat([]byte{7}, 8), 0)
	w[len(w)-1] ^= 1
	w0, s0 := b.qp.RemoteWrites(), db.Stats()
	if err := la.Link.Send([]link.Datagram{{Buf: w, Src: src, Dst: dst}}); err != nil {
		t.Fatal(err)
	}
	db.Poll()
	if s := db.Stats(); s.RcvdDropped != s0.RcvdDropped+1 || b.qp.RemoteWrites() != w0 || b.buf[256] != 0 {
		t.Fatalf("a WRITE with a wrong ICRC after the recovered panic: %d dropped, %d executed", s.RcvdDropped-s0.RcvdDropped, b.qp.RemoteWrites()-w0)
	}
	// the next message is split (PSN 101 again: the SEND's never executed)
	msg := slices.Concat(superWrite(src, b, 101, 320, bytes.Repeat([]byte{2}, 8), 0), superWrite(src, b, 102, 384, bytes.Repeat([]byte{3}, 8), 1))
	s1 := db.Stats()
	if err := la.Link.Send([]link.Datagram{{Buf: msg, Src: src, Dst: dst}}); err != nil {
		t.Fatal(err)
	}
	db.Poll()
	if s := db.Stats(); s.RcvdGSOSplit != s1.RcvdGSOSplit+1 || b.buf[320] != 2 || b.buf[384] != 3 {
		t.Fatalf("the next GSO message: %d split, bytes %d %d; want split and both WRITEs executed", s.RcvdGSOSplit-s1.RcvdGSOSplit, b.buf[320], b.buf[384])
	}
}
