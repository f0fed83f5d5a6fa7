package qp

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
)

// copiedPair is rcPair with both sides' buffers registered as copied memory (mr.Memory).
func copiedPair(t testing.TB, o connOpts) (*net, *side, *side) {
	n := newNet(t)
	a := n.newSide("10.0.0.1", sideOpts{qpn: 0x11, copied: true})
	b := n.newSide("10.0.0.2", sideOpts{qpn: 0x12, copied: true})
	n.connect(a, b, o)
	return n, a, b
}

// TestRCOperationsCopiedMemory: every RC operation (SEND, SEND_WITH_IMM, WRITE, WRITE_WITH_IMM
// into several SGEs, READ into five, FETCH_ADD, CMP_SWP) with both ends' memory reached only by
// copies, as the daemon reaches a C program's malloc'd memory: the same bytes and completions as
// over mapped memory, across MTU boundaries.
func TestRCOperationsCopiedMemory(t *testing.T) {
	for _, mtu := range []MTU{MTU1024, MTU4096} {
		m := mtu.Bytes()
		for _, size := range []int{0, 1, m + 1, 3*m + 7, 1 << 18} {
			t.Run(fmt.Sprintf("mtu%d/size%d", m, size), func(t *testing.T) {
				n, a, b := copiedPair(t, connOpts{mtu: mtu, psnA: 100, psnB: 7})
				runOps(t, n, a, b, size, uint32(m))
				if size > 0 && (a.mem.copies.Load() == 0 || b.mem.copies.Load() == 0) {
					t.Fatal("the copied memory was not reached through its copies")
				}
			})
		}
	}
}

// TestCopiedMemoryInline: inline data gathered from copied memory at post time.
func TestCopiedMemoryInline(t *testing.T) {
	n, a, b := copiedPair(t, connOpts{})
	a.fill(0, 100, 5)
	want := append([]byte(nil), a.buf[:100]...)
	b.postRecv(t, RecvWR{WRID: 1, SGL: []SGE{b.sge(dstOff, 200)}})
	a.postSend(t, SendWR{WRID: 2, Opcode: WRSend, SGL: []SGE{a.sge(0, 60), a.sge(60, 40)}, Flags: SendInline | SendSignaled})
	a.fill(0, 100, 9) // after the post: the inline copy must not see this
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 2, Opcode: cq.OpSend, ByteLen: 100})
	expectWC(t, pollAll(b.rcq), cq.WC{WRID: 1, Opcode: cq.OpRecv, ByteLen: 100})
	eq(t, "inline", b.buf[dstOff:dstOff+100], want)
}

// TestCopiedMemoryFault: memory that can no longer be copied (its process unmapped it or
// exited) fails the accesses that touch it with the error the IBTA gives a protection failure,
// never a fault of the device: a send whose SGE cannot be read completes with LOC_PROT_ERR; a
// WRITE into a peer whose memory is gone is NAKed (REM_ACCESS_ERR at the requester); a READ
// response that cannot be read is a remote access NAK; an atomic too; a receive that cannot be
// written completes in error.
func TestCopiedMemoryFault(t *testing.T) {
	t.Run("send gather", func(t *testing.T) {
		n, a, b := copiedPair(t, connOpts{})
		b.postRecv(t, RecvWR{WRID: 1, SGL: []SGE{b.sge(dstOff, 4096)}})
		a.mem.fail.Store(true)
		a.postSend(t, SendWR{WRID: 2, Opcode: WRSend, SGL: []SGE{a.sge(0, 4096)}, Flags: SendSignaled})
		n.pump()
		expectWC(t, pollAll(a.scq), cq.WC{WRID: 2, Opcode: cq.OpSend, Status: cq.StatusLocProtErr})
	})
	for _, op := range []WROpcode{WRRDMAWrite, WRRDMARead, WRAtomicFetchAndAdd} {
		t.Run("responder "+op.String(), func(t *testing.T) {
			n, a, b := copiedPair(t, connOpts{})
			b.mem.fail.Store(true)
			size := 8192
			if op == WRAtomicFetchAndAdd {
				size = 8
			}
			a.postSend(t, SendWR{WRID: 3, Opcode: op, SGL: []SGE{a.sge(0, size)}, Flags: SendSignaled,
				RemoteAddr: b.va(dstOff), RKey: b.mr.RKey(), CompareAdd: 1})
			n.pump()
			wcs := pollAll(a.scq)
			if len(wcs) != 1 || wcs[0].WRID != 3 || wcs[0].Status != cq.StatusRemAccessErr {
				t.Fatalf("%v into memory that is gone: %+v, want REM_ACCESS_ERR", op, wcs)
			}
		})
	}
	t.Run("receive scatter", func(t *testing.T) {
		n, a, b := copiedPair(t, connOpts{})
		b.postRecv(t, RecvWR{WRID: 1, SGL: []SGE{b.sge(dstOff, 4096)}})
		b.mem.fail.Store(true)
		a.postSend(t, SendWR{WRID: 2, Opcode: WRSend, SGL: []SGE{a.sge(0, 100)}, Flags: SendSignaled})
		n.pump()
		wcs := pollAll(b.rcq)
		if len(wcs) != 1 || wcs[0].Status == cq.StatusSuccess {
			t.Fatalf("receive into memory that is gone: %+v", wcs)
		}
	})
	t.Run("READ response scatter", func(t *testing.T) {
		n, a, b := copiedPair(t, connOpts{})
		a.mem.fail.Store(true)
		a.postSend(t, SendWR{WRID: 4, Opcode: WRRDMARead, SGL: []SGE{a.sge(0, 100)}, Flags: SendSignaled,
			RemoteAddr: b.va(dstOff), RKey: b.mr.RKey()})
		n.pump()
		expectWC(t, pollAll(a.scq), cq.WC{WRID: 4, Opcode: cq.OpRDMARead, Status: cq.StatusLocProtErr})
	})
}

// TestCopiedMemoryZeroAlloc: the per-packet path over copied memory (WRITE, READ, SEND, an
// atomic) allocates nothing: the copies go through the engine's own packet buffers.
func TestCopiedMemoryZeroAlloc(t *testing.T) {
	for _, mtu := range []MTU{MTU1024, MTU4096} {
		n := newNet(t)
		a := n.newSide("10.0.0.1", sideOpts{qpn: 0x11, copied: true})
		b := n.newSide("10.0.0.2", sideOpts{qpn: 0x12, copied: true})
		ra, rb := newRingOut(512), newRingOut(512)
		a.qp.cfg.Out, b.qp.cfg.Out = ra, rb
		// READ responses past the first few are built by RunResponder (writeStream calls it)
		a.qp.cfg.Schedule, b.qp.cfg.Schedule = func(*QP) { a.sched = true }, func(*QP) { b.sched = true }
		n.connect(a, b, connOpts{mtu: mtu})
		sa, sb := newRingOut(512), newRingOut(512)
		wcs := make([]cq.WC, 4)
		for _, wr := range [][]SendWR{
			{{WRID: 1, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 64<<10)}, Flags: SendSignaled, RemoteAddr: b.va(dstOff), RKey: b.mr.RKey()}},
			{{WRID: 2, Opcode: WRRDMARead, SGL: []SGE{a.sge(0, 64<<10)}, Flags: SendSignaled, RemoteAddr: b.va(dstOff), RKey: b.mr.RKey()}},
			{{WRID: 3, Opcode: WRAtomicFetchAndAdd, SGL: []SGE{a.sge(64, 8)}, Flags: SendSignaled, RemoteAddr: b.va(dstOff), RKey: b.mr.RKey(), CompareAdd: 1}},
		} {
			writeStream(t, a, b, ra, rb, sa, sb, wr, wcs)
			if allocs := testing.AllocsPerRun(20, func() { writeStream(t, a, b, ra, rb, sa, sb, wr, wcs) }); allocs != 0 {
				t.Fatalf("MTU %v, %v: %.1f allocations over copied memory", mtu, wr[0].Opcode, allocs)
			}
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
			t.Fatalf("MTU %v: %.1f allocations per SEND over copied memory", mtu, allocs)
		}
		if a.mem.copies.Load() == 0 || b.mem.copies.Load() == 0 {
			t.Fatal("no copies")
		}
	}
	var _ mr.Memory = (*copiedMem)(nil)
}

// TestCopiedMemoryPlacement: RDMA ATOMIC WRITE and FLUSH (global) into copied memory, as into
// a C program's own memory: the 8 bytes land through one copy, a FLUSH of a range and of the
// whole region is acknowledged; past the registered length, or into memory that is gone, an
// ATOMIC WRITE is a remote access error; a persistent FLUSH is refused (copied memory has no
// Persister: the region cannot even take the access).
func TestCopiedMemoryPlacement(t *testing.T) {
	acc := allRemote | mr.AccessFlushGlobal
	n := newNet(t)
	a := n.newSide("10.0.0.1", sideOpts{qpn: 0x11, copied: true, access: acc})
	b := n.newSide("10.0.0.2", sideOpts{qpn: 0x12, copied: true, access: acc})
	n.connect(a, b, connOpts{accessA: acc, accessB: acc, retry: 3})
	if _, err := b.tbl.RegMemory(b.pd, b.mem, 4096, 0x900000, acc|mr.AccessFlushPersistent); !errors.Is(err, mr.ErrInvalidArg) {
		t.Fatalf("persistent region over copied memory: %v, want ErrInvalidArg", err)
	}
	word := dstOff + 8*7
	v := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	copy(a.buf[64:], v)
	before := b.mem.copies.Load()
	a.postSend(t, SendWR{WRID: 1, Opcode: WRAtomicWrite, SGL: []SGE{a.sge(64, 8)}, Flags: SendSignaled,
		RemoteAddr: b.va(word), RKey: b.mr.RKey()})
	a.postSend(t, SendWR{WRID: 2, Opcode: WRFlush, Flags: SendSignaled, RemoteAddr: b.va(dstOff), RKey: b.mr.RKey(),
		FlushLength: 4096, FlushType: FlushGlobal})
	a.postSend(t, SendWR{WRID: 3, Opcode: WRFlush, Flags: SendSignaled, RKey: b.mr.RKey(), FlushType: FlushGlobal,
		FlushLevel: FlushMR})
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpAtomicWrite, ByteLen: 8},
		cq.WC{WRID: 2, Opcode: cq.OpFlush, ByteLen: 4096}, cq.WC{WRID: 3, Opcode: cq.OpFlush})
	eq(t, "ATOMIC WRITE into copied memory", b.buf[word:word+8], v)
	if got := b.mem.copies.Load() - before; got != 1 {
		t.Fatalf("%d copies into the responder's memory, want 1 (the 8 bytes)", got)
	}

	t.Run("past the end", func(t *testing.T) {
		a.postSend(t, SendWR{WRID: 4, Opcode: WRAtomicWrite, SGL: []SGE{a.sge(64, 8)}, Flags: SendSignaled,
			RemoteAddr: b.va(len(b.buf)), RKey: b.mr.RKey()})
		n.pump()
		wcs := pollAll(a.scq)
		if len(wcs) != 1 || wcs[0].WRID != 4 || wcs[0].Status != cq.StatusRemAccessErr {
			t.Fatalf("ATOMIC WRITE past the region: %+v, want REM_ACCESS_ERR", wcs)
		}
	})
	t.Run("memory gone", func(t *testing.T) {
		n, a, b := copiedPair(t, connOpts{accessA: acc, accessB: acc, retry: 3})
		b.mem.fail.Store(true)
		a.postSend(t, SendWR{WRID: 5, Opcode: WRAtomicWrite, SGL: []SGE{a.sge(64, 8)}, Flags: SendSignaled,
			RemoteAddr: b.va(dstOff), RKey: b.mr.RKey()})
		n.pump()
		wcs := pollAll(a.scq)
		if len(wcs) != 1 || wcs[0].WRID != 5 || wcs[0].Status != cq.StatusRemAccessErr {
			t.Fatalf("ATOMIC WRITE into memory that is gone: %+v, want REM_ACCESS_ERR", wcs)
		}
	})
}

// TestCopiedMemoryBatched: the bytes of a message move through copied memory in runs, not a
// copy per packet (copybatch.go): a 64 KiB WRITE at MTU 1024 (64 packets) takes one copy out
// of the requester's memory and one into the responder's; a lost packet in the middle (the
// responder's PSN sequence NAK acknowledges what came before it) still places every byte
// once; a second WRITE from the same memory, changed after the first completed, carries the
// new bytes (the read ahead belongs to one WQE); a QP that enters ERR mid-message drops the
// bytes that wait, never placing them later.
func TestCopiedMemoryBatched(t *testing.T) {
	const size = 64 << 10
	n, a, b := copiedPair(t, connOpts{mtu: MTU1024, retry: 3})
	write := func(wrid uint64, seed byte) []cq.WC {
		a.fill(srcOff, size, seed)
		a.postSend(t, SendWR{WRID: wrid, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(srcOff, size)}, Flags: SendSignaled,
			RemoteAddr: b.va(dstOff), RKey: b.mr.RKey()})
		n.pump()
		return pollAll(a.scq)
	}
	ca, cb := a.mem.copies.Load(), b.mem.copies.Load()
	expectWC(t, write(1, 1), cq.WC{WRID: 1, Opcode: cq.OpRDMAWrite, ByteLen: size})
	eq(t, "64 KiB WRITE", b.buf[dstOff:dstOff+size], a.buf[srcOff:srcOff+size])
	if ra, wb := a.mem.copies.Load()-ca, b.mem.copies.Load()-cb; ra != 1 || wb != 1 {
		t.Fatalf("64 packets: %d copies out of the requester's memory, %d into the responder's; want 1 and 1", ra, wb)
	}

	// the same memory, new bytes, a packet lost in the middle
	middles, dropped := 0, false
	n.filter = func(from *side, d *link.Datagram, p *bth.Packet) bool {
		if from == a && p.BTH.Opcode() == bth.OpRCWriteMiddle {
			if middles++; middles == 20 {
				dropped = true
				return false
			}
		}
		return true
	}
	expectWC(t, write(2, 2), cq.WC{WRID: 2, Opcode: cq.OpRDMAWrite, ByteLen: size})
	if !dropped {
		t.Fatal("no packet was dropped")
	}
	eq(t, "WRITE with a lost packet", b.buf[dstOff:dstOff+size], a.buf[srcOff:srcOff+size])
	n.filter = nil

	// a WRITE whose last packet never comes, then the responder's QP in ERR: the bytes that
	// waited are dropped, never placed later
	n.filter = func(from *side, d *link.Datagram, p *bth.Packet) bool {
		return !(from == a && p.BTH.Opcode() == bth.OpRCWriteLast)
	}
	a.fill(srcOff, size, 4)
	clear(b.buf[dstOff : dstOff+size])
	a.postSend(t, SendWR{WRID: 4, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(srcOff, size)}, Flags: SendSignaled,
		RemoteAddr: b.va(dstOff), RKey: b.mr.RKey()})
	n.pump()
	b.qp.mu.Lock()
	waiting := b.qp.resp.behind.n
	b.qp.mu.Unlock()
	if waiting == 0 {
		t.Fatal("no WRITE bytes waiting before the last packet")
	}
	if err := b.qp.Modify(&Attr{State: StateErr}, AttrState); err != nil {
		t.Fatal(err)
	}
	b.qp.mu.Lock()
	waiting = b.qp.resp.behind.n
	b.qp.mu.Unlock()
	if waiting != 0 || !bytes.Equal(b.buf[dstOff:dstOff+size], make([]byte, size)) {
		t.Fatalf("%d bytes still waiting after ERR, or placed", waiting)
	}
	n.filter = nil
}

// TestCopiedMemoryBatchedFault: memory that is gone when the waiting bytes of a WRITE are
// placed fails the WRITE with a remote access error, never an ACK.
func TestCopiedMemoryBatchedFault(t *testing.T) {
	const size = 64 << 10
	n, a, b := copiedPair(t, connOpts{mtu: MTU1024, retry: 3})
	write := func(wrid uint64, seed byte) []cq.WC {
		a.fill(srcOff, size, seed)
		a.postSend(t, SendWR{WRID: wrid, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(srcOff, size)}, Flags: SendSignaled,
			RemoteAddr: b.va(dstOff), RKey: b.mr.RKey()})
		n.pump()
		return pollAll(a.scq)
	}
	b.mem.fail.Store(true)
	wcs := write(3, 3)
	if len(wcs) != 1 || wcs[0].WRID != 3 || wcs[0].Status != cq.StatusRemAccessErr {
		t.Fatalf("WRITE into memory that is gone: %+v, want REM_ACCESS_ERR", wcs)
	}
}
