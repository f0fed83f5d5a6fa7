package roce

import (
	"bytes"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/mem"
)

// rxeICRC is kernel rxe's ICRC for pkt as sent from src with IPv4 ID id: the A17.3.3 ICRC
// continued over everything before the ICRC field a second time (what rxe computes for a
// FLUSH, rxeflush.go), whatever the opcode.
func rxeICRC(src netip.AddrPort, dst *end, pkt []byte, id uint16) uint32 {
	ep := bth.Endpoints{Src: src.Addr(), Dst: dst.addr, SrcPort: src.Port(), DstPort: 4791, IPID: id}
	return bth.RxeFlushICRC(bth.ICRC(&ep, pkt), pkt)
}

// flushPkt is a global FLUSH of dst's region range [off, off+n) at psn with the given ICRC
// (nil: the A17.3.3 one, ID 0).
func flushPkt(src netip.AddrPort, dst *end, m *mr.MR, psn uint32, off, n int, icrc func([]byte) uint32) []byte {
	p := make([]byte, rxeFlushSize)
	bth.BTH(p).Encode(&bth.BTHFields{Opcode: bth.OpRCFlush, PKey: 0xffff, DestQP: dst.qp.Num(), AckReq: true, PSN: bth.PSN(psn)})
	bth.FETH(p[bth.BTHSize:]).Encode(&bth.FETHFields{Placement: bth.FlushGlobal, Selectivity: bth.FlushRange})
	bth.RETH(p[bth.BTHSize+bth.FETHSize:]).Encode(&bth.RETHFields{VA: m.IOVA() + uint64(off), RKey: m.RKey(), DMALen: uint32(n)})
	if icrc == nil {
		ep := bth.Endpoints{Src: src.Addr(), Dst: dst.addr, SrcPort: src.Port(), DstPort: 4791}
		bth.SetICRC(p, bth.ICRC(&ep, p))
	} else {
		bth.SetICRC(p, icrc(p))
	}
	return p
}

// flushEnd adds a region with IBV_ACCESS_FLUSH_GLOBAL to b and the flag to its QP.
func flushEnd(t *testing.T, b *end) *mr.MR {
	t.Helper()
	m, err := b.dev.RegMR(b.pd, make([]byte, 4096), 0x7100_0000, mr.AccessLocalWrite|mr.AccessRemoteWrite|mr.AccessFlushGlobal)
	if err != nil {
		t.Fatal(err)
	}
	all := mr.AccessRemoteWrite | mr.AccessRemoteRead | mr.AccessRemoteAtomic | mr.AccessFlushGlobal
	if err := b.qp.Modify(&qp.Attr{AccessFlags: all}, qp.AttrAccessFlags); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestRxeFlushICRC: an RC FLUSH carrying kernel rxe's ICRC (its headers covered twice) is
// served like one carrying the A17.3.3 ICRC: over a UDP socket (the IPv4 ID solved, 0 or
// rxe's counting IDs), with the ID its link saw, and over IPv6. The FLUSH executing shows as
// the next PSN's WRITE executing. rxe's variant computed for another ID, over a changed
// header, or on any other opcode (a WRITE) is dropped, and then the WRITE at the next PSN is
// not executed.
func TestRxeFlushICRC(t *testing.T) {
	da, db, _, _ := polledPair(t, "mem")
	a, b := newEnd(t, da, qp.TypeRC, 1<<12), newEnd(t, db, qp.TypeRC, 1<<12)
	connect(t, a, b, qp.MTU1024, 100, 200) // b expects a's PSN 100
	m := flushEnd(t, b)
	src, dst := netip.AddrPortFrom(a.addr, 0xC001), netip.AddrPortFrom(b.addr, 4791)
	psn := uint32(100)
	// try hands b the FLUSH at the current PSN, then a WRITE at the next: both execute, or
	// the FLUSH is dropped and so is (out of sequence) the WRITE
	try := func(what string, flush link.Datagram, ok bool) {
		t.Helper()
		w0, s0 := b.qp.RemoteWrites(), db.Stats()
		w := superWrite(src, b, psn+1, 0, []byte{byte(psn)}, 0)
		db.pl.mu.Lock()
		db.pl.rx.now = time.Unix(1000, 0)
		db.handle(&db.pl.rx, &flush)
		db.handle(&db.pl.rx, &link.Datagram{Buf: w, Src: src, Dst: dst})
		db.pl.rx.flushPending()
		db.pl.mu.Unlock()
		s := db.Stats()
		drops, writes := s.RcvdDropped-s0.RcvdDropped, b.qp.RemoteWrites()-w0
		if ok && (drops != 0 || writes != 1 || b.buf[0] != byte(psn)) {
			t.Fatalf("%s: %d dropped, %d WRITEs; want the FLUSH served and the WRITE after it executed", what, drops, writes)
		}
		if !ok && (drops != 1 || writes != 0) {
			t.Fatalf("%s: %d dropped, %d WRITEs; want the FLUSH dropped and no WRITE", what, drops, writes)
		}
		if ok {
			psn += 2
		}
		if st := b.qp.State(); st != qp.StateRTS {
			t.Fatalf("%s: QP %v", what, st)
		}
	}
	rxe := func(id uint16) func([]byte) uint32 {
		return func(p []byte) uint32 { return rxeICRC(src, b, p, id) }
	}
	dg := func(buf []byte, known bool, id uint16) link.Datagram {
		return link.Datagram{Buf: buf, Src: src, Dst: dst, HasIPv4ID: known, IPv4ID: id}
	}
	try("the A17.3.3 ICRC", dg(flushPkt(src, b, m, psn, 0, 64, nil), false, 0), true)
	try("rxe's ICRC, ID 0, unknown", dg(flushPkt(src, b, m, psn, 0, 64, rxe(0)), false, 0), true)
	try("rxe's ICRC, ID 0x1234, unknown", dg(flushPkt(src, b, m, psn, 64, 64, rxe(0x1234)), false, 0), true)
	try("rxe's ICRC, ID 0xdf78, known", dg(flushPkt(src, b, m, psn, 0, 4096, rxe(0xdf78)), true, 0xdf78), true)
	try("rxe's ICRC for ID 0xdf79, arrived with 0xdf78", dg(flushPkt(src, b, m, psn, 0, 64, rxe(0xdf79)), true, 0xdf78), false)
	bad := flushPkt(src, b, m, psn, 0, 64, rxe(0))
	bad[bth.BTHSize+bth.FETHSize+3] ^= 0x10 // the RETH's VA, after the ICRC was computed
	try("rxe's ICRC over a changed RETH", dg(bad, false, 0), false)
	short := flushPkt(src, b, m, psn, 0, 64, nil)
	short = append(short[:rxeFlushSize-bth.ICRCSize], 0, 0, 0, 0, 0, 0, 0, 0) // 4 bytes of payload
	bth.SetICRC(short, rxe(0)(short))
	try("rxe's ICRC on a FLUSH with a payload", dg(short, false, 0), false)
	// any other opcode keeps the A17.3.3 check: a WRITE with the headers covered twice
	w := superWrite(src, b, psn, 8, []byte{1, 2, 3, 4}, 0)
	bth.SetICRC(w, rxe(0)(w))
	try("a WRITE with rxe's FLUSH ICRC", dg(w, false, 0), false)
	try("the A17.3.3 ICRC again", dg(flushPkt(src, b, m, psn, 0, 64, nil), false, 0), true)
}

// TestRxeFlushICRCIPv6: the same over IPv6 (no ID: the full check, once unwound).
func TestRxeFlushICRCIPv6(t *testing.T) {
	nw := mem.NewNetwork(mem.Options{QueueDepth: 64})
	a6, b6 := netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
	la, err1 := nw.Attach(a6)
	lb, err2 := nw.Attach(b6)
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	clk := qp.NewManualClock(time.Unix(1000, 0))
	da, err1 := Open(Options{Link: la, Clock: clk, Polled: true})
	db, err2 := Open(Options{Link: lb, Clock: clk, Polled: true})
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	defer da.Close()
	defer db.Close()
	a, b := newEnd(t, da, qp.TypeRC, 1<<12), newEnd(t, db, qp.TypeRC, 1<<12)
	connect(t, a, b, qp.MTU1024, 100, 200)
	m := flushEnd(t, b)
	src, dst := netip.AddrPortFrom(a6, 0xC001), netip.AddrPortFrom(b6, 4791)
	for i, c := range []struct {
		corrupt bool
		ok      bool
	}{{true, false}, {false, true}} {
		p := flushPkt(src, b, m, 100, 0, 64, func(p []byte) uint32 { return rxeICRC(src, b, p, 0) })
		if c.corrupt {
			p[bth.BTHSize] ^= 1 // the FETH's placement type
		}
		s0 := db.Stats()
		db.pl.mu.Lock()
		db.handle(&db.pl.rx, &link.Datagram{Buf: p, Src: src, Dst: dst})
		db.handle(&db.pl.rx, &link.Datagram{Buf: superWrite(src, b, 101, 0, []byte{9}, 0), Src: src, Dst: dst})
		db.pl.rx.flushPending()
		db.pl.mu.Unlock()
		s := db.Stats()
		if got := s.RcvdDropped - s0.RcvdDropped; (got == 0) != c.ok || bytes.Equal(b.buf[:1], []byte{9}) != c.ok {
			t.Fatalf("case %d: %d dropped, byte %d; want served %v", i, got, b.buf[0], c.ok)
		}
	}
}

// captureLink copies every datagram its device sends.
type captureLink struct {
	link.Link
	mu   sync.Mutex
	sent []link.Datagram
}

func (l *captureLink) Send(b []link.Datagram) error {
	l.mu.Lock()
	for _, d := range b {
		d.Buf = append([]byte(nil), d.Buf...)
		l.sent = append(l.sent, d)
	}
	l.mu.Unlock()
	return l.Link.Send(b)
}

// TestRxeFlushICRCSend: with Options.RxeFlushICRC a device's FLUSHes carry kernel rxe's ICRC
// (and its other packets the A17.3.3 one); without it, the spec's. Either way a softroce peer
// serves the FLUSH and the requester completes it.
func TestRxeFlushICRCSend(t *testing.T) {
	for _, rxe := range []bool{false, true} {
		nw := mem.NewNetwork(mem.Options{QueueDepth: 64})
		l1, err1 := nw.Attach(addrA)
		l2, err2 := nw.Attach(addrB)
		if err := errors.Join(err1, err2); err != nil {
			t.Fatal(err)
		}
		la := &captureLink{Link: l1}
		da, err1 := Open(Options{Link: la, RxeFlushICRC: rxe})
		db, err2 := Open(Options{Link: l2})
		if err := errors.Join(err1, err2); err != nil {
			t.Fatal(err)
		}
		a, b := newEnd(t, da, qp.TypeRC, 1<<12), newEnd(t, db, qp.TypeRC, 1<<12)
		connect(t, a, b, qp.MTU1024, 100, 200)
		m := flushEnd(t, b)
		post(t, a, qp.SendWR{WRID: 1, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled, SGL: []qp.SGE{a.sge(0, 64)}, RemoteAddr: m.IOVA(), RKey: m.RKey()})
		post(t, a, qp.SendWR{WRID: 2, Opcode: qp.WRFlush, Flags: qp.SendSignaled, RemoteAddr: m.IOVA(), RKey: m.RKey(),
			FlushLength: 64, FlushType: qp.FlushGlobal, FlushLevel: qp.FlushRange})
		wcs := waitWC(t, a.scq, 2)
		if wcs[0].Status != cq.StatusSuccess || wcs[1].Status != cq.StatusSuccess || wcs[1].Opcode != cq.OpFlush {
			t.Fatalf("RxeFlushICRC %v: completions %+v", rxe, wcs)
		}
		da.Close()
		db.Close()
		flushes := 0
		for _, d := range la.sent {
			ep := bth.Endpoints{Src: d.Src.Addr(), Dst: d.Dst.Addr(), SrcPort: d.Src.Port(), DstPort: d.Dst.Port()}
			spec := bth.VerifyICRC(&ep, d.Buf)
			isFlush := bth.BTH(d.Buf).Opcode() == bth.OpRCFlush
			if isFlush {
				flushes++
				if variant := bth.GetICRC(d.Buf) == bth.RxeFlushICRC(bth.ICRC(&ep, d.Buf), d.Buf); variant != rxe || spec == rxe {
					t.Errorf("RxeFlushICRC %v: a FLUSH with rxe's ICRC %v, the A17.3.3 one %v", rxe, variant, spec)
				}
			} else if !spec {
				t.Errorf("RxeFlushICRC %v: %v without the A17.3.3 ICRC", rxe, bth.BTH(d.Buf).Opcode())
			}
		}
		if flushes == 0 {
			t.Fatalf("RxeFlushICRC %v: no FLUSH sent", rxe)
		}
	}
}
