package qp

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// sgl splits [off, off+n) of s's buffer into k SGEs of uneven length.
func sgl(s *side, off, n, k int) []SGE {
	if n == 0 {
		return nil
	}
	if k > n {
		k = n
	}
	out := make([]SGE, 0, k)
	rest := n
	for i := 0; i < k; i++ {
		l := rest / (k - i)
		if i%2 == 0 && l > 1 && i != k-1 {
			l = l/2 + 1
		}
		if i == k-1 {
			l = rest
		}
		out = append(out, s.sge(off, l))
		off += l
		rest -= l
	}
	return out
}

func rcPair(t testing.TB, o connOpts) (*net, *side, *side) {
	n := newNet(t)
	a := n.newSide("10.0.0.1", sideOpts{qpn: 0x11})
	b := n.newSide("10.0.0.2", sideOpts{qpn: 0x12})
	n.connect(a, b, o)
	return n, a, b
}

const (
	srcOff = 0
	dstOff = 2 << 20
)

// TestRCOperations runs every RC operation over the channel double, for
// the sizes around the MTU boundaries and across several SGEs, for three
// path MTUs, comparing the data byte for byte and the completions field
// by field.
func TestRCOperations(t *testing.T) {
	for _, mtu := range []MTU{MTU256, MTU1024, MTU4096} {
		m := mtu.Bytes()
		sizes := []int{0, 1, m - 1, m, m + 1, 3*m + 7, 1 << 20}
		for _, size := range sizes {
			t.Run(fmt.Sprintf("mtu%d/size%d", m, size), func(t *testing.T) {
				n, a, b := rcPair(t, connOpts{mtu: mtu, psnA: 100, psnB: 0xFFFFFF - 3})
				runOps(t, n, a, b, size, uint32(m))
			})
		}
	}
}

func runOps(t *testing.T, n *net, a, b *side, size int, mtu uint32) {
	seed := byte(size)
	// SEND and SEND_WITH_IMM into 3 receive SGEs, from 4 send SGEs.
	for i, op := range []WROpcode{WRSend, WRSendWithImm} {
		a.fill(srcOff, size, seed+byte(i))
		clear(b.buf[dstOff : dstOff+size+16])
		b.postRecv(t, RecvWR{WRID: 7, SGL: sgl(b, dstOff, size+16, 3)})
		a.postSend(t, SendWR{WRID: 1, Opcode: op, SGL: sgl(a, srcOff, size, 4), Flags: SendSignaled, Imm: 0xA1B2C3D4})
		n.pump()
		expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpSend, ByteLen: uint32(size)})
		want := cq.WC{WRID: 7, Opcode: cq.OpRecv, ByteLen: uint32(size)}
		if op == WRSendWithImm {
			want.ImmData, want.Flags = 0xA1B2C3D4, cq.FlagWithImm
		}
		expectWC(t, pollAll(b.rcq), want)
		eq(t, op.String(), b.buf[dstOff:dstOff+size], a.buf[srcOff:srcOff+size])
	}
	// RDMA WRITE and WRITE_WITH_IMM.
	for i, op := range []WROpcode{WRRDMAWrite, WRRDMAWriteWithImm} {
		a.fill(srcOff, size, seed+byte(10+i))
		clear(b.buf[dstOff : dstOff+size])
		if op == WRRDMAWriteWithImm {
			b.postRecv(t, RecvWR{WRID: 8})
		}
		a.postSend(t, SendWR{WRID: 2, Opcode: op, SGL: sgl(a, srcOff, size, 3), Flags: SendSignaled,
			Imm: 0x01020304, RemoteAddr: b.va(dstOff), RKey: b.mr.RKey()})
		n.pump()
		expectWC(t, pollAll(a.scq), cq.WC{WRID: 2, Opcode: cq.OpRDMAWrite, ByteLen: uint32(size)})
		if op == WRRDMAWriteWithImm {
			expectWC(t, pollAll(b.rcq), cq.WC{WRID: 8, Opcode: cq.OpRecvRDMAWithImm, ByteLen: uint32(size),
				ImmData: 0x01020304, Flags: cq.FlagWithImm})
		} else {
			expectWC(t, pollAll(b.rcq))
		}
		eq(t, op.String(), b.buf[dstOff:dstOff+size], a.buf[srcOff:srcOff+size])
	}
	// RDMA READ into 5 SGEs.
	b.fill(dstOff, size, seed+20)
	clear(a.buf[srcOff : srcOff+size])
	a.postSend(t, SendWR{WRID: 3, Opcode: WRRDMARead, SGL: sgl(a, srcOff, size, 5), Flags: SendSignaled,
		RemoteAddr: b.va(dstOff), RKey: b.mr.RKey()})
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 3, Opcode: cq.OpRDMARead, ByteLen: uint32(size)})
	eq(t, "READ", a.buf[srcOff:srcOff+size], b.buf[dstOff:dstOff+size])

	// Atomics on an 8-aligned word.
	const word = dstOff + 4096
	binary.LittleEndian.PutUint64(b.buf[word:], 1000)
	a.postSend(t,
		SendWR{WRID: 4, Opcode: WRAtomicFetchAndAdd, SGL: []SGE{a.sge(64, 8)}, Flags: SendSignaled,
			RemoteAddr: b.va(word), RKey: b.mr.RKey(), CompareAdd: 5},
		SendWR{WRID: 5, Opcode: WRAtomicCmpAndSwp, SGL: []SGE{a.sge(72, 8)}, Flags: SendSignaled,
			RemoteAddr: b.va(word), RKey: b.mr.RKey(), CompareAdd: 1005, Swap: 77},
		SendWR{WRID: 6, Opcode: WRAtomicCmpAndSwp, SGL: []SGE{a.sge(80, 8)}, Flags: SendSignaled,
			RemoteAddr: b.va(word), RKey: b.mr.RKey(), CompareAdd: 1, Swap: 99})
	n.pump()
	expectWC(t, pollAll(a.scq),
		cq.WC{WRID: 4, Opcode: cq.OpFetchAdd, ByteLen: 8},
		cq.WC{WRID: 5, Opcode: cq.OpCompSwap, ByteLen: 8},
		cq.WC{WRID: 6, Opcode: cq.OpCompSwap, ByteLen: 8})
	if got := binary.LittleEndian.Uint64(a.buf[64:]); got != 1000 {
		t.Fatalf("FETCH_ADD returned %d, want 1000", got)
	}
	if got := binary.LittleEndian.Uint64(a.buf[72:]); got != 1005 {
		t.Fatalf("CMP_SWP returned %d, want 1005", got)
	}
	if got := binary.LittleEndian.Uint64(a.buf[80:]); got != 77 {
		t.Fatalf("failed CMP_SWP returned %d, want 77", got)
	}
	if got := binary.LittleEndian.Uint64(b.buf[word:]); got != 77 {
		t.Fatalf("remote word %d, want 77", got)
	}
	if a.qp.State() != StateRTS || b.qp.State() != StateRTS {
		t.Fatalf("states %v %v", a.qp.State(), b.qp.State())
	}
	_ = mtu
}

// TestPSNWrap starts both directions just below 2^24 so multi-packet
// messages cross the wrap.
func TestPSNWrap(t *testing.T) {
	n, a, b := rcPair(t, connOpts{mtu: MTU256, psnA: 0xFFFFF0, psnB: 0xFFFFFE})
	for i := 0; i < 3; i++ {
		runOps(t, n, a, b, 256*40+3, 256)
	}
	if got := a.qp.req.psn; got.LessThan(bth.PSN(0x10)) || 0xFFFFF0 < uint32(got) {
		t.Fatalf("requester PSN %#x did not wrap", uint32(got))
	}
}

// TestUnsignaledAndInline: only signaled WRs complete on success; inline
// data is copied at post time (changing the buffer afterwards has no
// effect).
func TestUnsignaledAndInline(t *testing.T) {
	n, a, b := rcPair(t, connOpts{})
	a.fill(0, 100, 3)
	want := append([]byte(nil), a.buf[:100]...)
	b.postRecv(t, RecvWR{WRID: 1, SGL: []SGE{b.sge(dstOff, 200)}}, RecvWR{WRID: 2, SGL: []SGE{b.sge(dstOff+200, 200)}})
	a.postSend(t,
		SendWR{WRID: 10, Opcode: WRSend, SGL: []SGE{a.sge(0, 100)}, Flags: SendInline},
		SendWR{WRID: 11, Opcode: WRSend, SGL: []SGE{a.sge(0, 100)}, Flags: SendInline | SendSignaled})
	a.fill(0, 100, 99) // after post: inline copies must not see this
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 11, Opcode: cq.OpSend, ByteLen: 100})
	expectWC(t, pollAll(b.rcq), cq.WC{WRID: 1, Opcode: cq.OpRecv, ByteLen: 100}, cq.WC{WRID: 2, Opcode: cq.OpRecv, ByteLen: 100})
	eq(t, "inline 1", b.buf[dstOff:dstOff+100], want)
	eq(t, "inline 2", b.buf[dstOff+200:dstOff+300], want)
	// too much inline data is refused
	if _, err := a.qp.PostSend([]SendWR{{Opcode: WRSend, SGL: []SGE{a.sge(0, 257)}, Flags: SendInline}}); err == nil {
		t.Fatal("oversized inline accepted")
	}
	// Inline data by value (SendWR.Inline, as the daemon receives a client's): copied at post
	// time, no lkey involved, the caller's buffer free to change once PostSend returned.
	data := []byte("inline data given by value, no SGE")
	b.postRecv(t, RecvWR{WRID: 3, SGL: []SGE{b.sge(dstOff, 200)}})
	a.postSend(t, SendWR{WRID: 12, Opcode: WRSend, Flags: SendInline | SendSignaled, Inline: data})
	sent := append([]byte(nil), data...)
	copy(data, "XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX")
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 12, Opcode: cq.OpSend, ByteLen: uint32(len(sent))})
	expectWC(t, pollAll(b.rcq), cq.WC{WRID: 3, Opcode: cq.OpRecv, ByteLen: uint32(len(sent))})
	eq(t, "inline by value", b.buf[dstOff:dstOff+len(sent)], sent)
}

// TestPostErrors: verbs refused in the wrong state or beyond the caps.
func TestPostErrors(t *testing.T) {
	n := newNet(t)
	a := n.newSide("10.0.0.1", sideOpts{qpn: 0x11, cap: Cap{MaxSendWR: 2, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	b := n.newSide("10.0.0.2", sideOpts{qpn: 0x12})
	wr := SendWR{Opcode: WRSend, SGL: []SGE{a.sge(0, 8)}}
	if _, err := a.qp.PostSend([]SendWR{wr}); err != ErrInvalidState {
		t.Fatalf("PostSend in RESET: %v", err)
	}
	if _, err := a.qp.PostRecv([]RecvWR{{}}); err != ErrInvalidState {
		t.Fatalf("PostRecv in RESET: %v", err)
	}
	n.connect(a, b, connOpts{})
	if _, err := a.qp.PostSend([]SendWR{{Opcode: WRSend, SGL: []SGE{a.sge(0, 1), a.sge(1, 1)}}}); err == nil {
		t.Fatal("too many SGEs accepted")
	}
	if k, err := a.qp.PostRecv([]RecvWR{{WRID: 1}, {WRID: 2}}); err != ErrQueueFull || k != 1 {
		t.Fatalf("PostRecv overflow: %d %v", k, err)
	}
	// no ACKs delivered: the send queue fills
	if k, err := a.qp.PostSend([]SendWR{wr, wr, wr}); err != ErrQueueFull || k != 2 {
		t.Fatalf("PostSend overflow: %d %v", k, err)
	}
	n.pump()
}

// TestFlushOnError: moving to ERR completes every outstanding WR with
// WR_FLUSH_ERR, in order, on both queues; WRs posted in ERR are flushed.
func TestFlushOnError(t *testing.T) {
	n, a, b := rcPair(t, connOpts{})
	_ = b
	for i := 0; i < 3; i++ {
		a.postRecv(t, RecvWR{WRID: uint64(100 + i), SGL: []SGE{a.sge(0, 64)}})
	}
	a.postSend(t, SendWR{WRID: 1, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 64)}, RemoteAddr: b.va(0), RKey: b.mr.RKey()},
		SendWR{WRID: 2, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 64)}, RemoteAddr: b.va(0), RKey: b.mr.RKey()})
	// nothing delivered: both outstanding
	if err := a.qp.Modify(&Attr{State: StateErr}, AttrState); err != nil {
		t.Fatal(err)
	}
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Status: cq.StatusWRFlushErr, Opcode: cq.OpRDMAWrite},
		cq.WC{WRID: 2, Status: cq.StatusWRFlushErr, Opcode: cq.OpRDMAWrite})
	expectWC(t, pollAll(a.rcq), cq.WC{WRID: 100, Status: cq.StatusWRFlushErr, Opcode: cq.OpRecv},
		cq.WC{WRID: 101, Status: cq.StatusWRFlushErr, Opcode: cq.OpRecv},
		cq.WC{WRID: 102, Status: cq.StatusWRFlushErr, Opcode: cq.OpRecv})
	a.postSend(t, SendWR{WRID: 3, Opcode: WRSend})
	a.postRecv(t, RecvWR{WRID: 4})
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 3, Status: cq.StatusWRFlushErr, Opcode: cq.OpSend})
	expectWC(t, pollAll(a.rcq), cq.WC{WRID: 4, Status: cq.StatusWRFlushErr, Opcode: cq.OpRecv})
	n.pump() // stale packets to an ERR QP are dropped
	// RESET then reconnect works again
	if err := a.qp.Modify(&Attr{State: StateReset}, AttrState); err != nil {
		t.Fatal(err)
	}
}

var _ = link.MaxDatagram
var _ = mr.AccessLocalWrite
