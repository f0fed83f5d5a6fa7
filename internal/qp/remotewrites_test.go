package qp

import (
	"testing"

	"github.com/softroce/softroce/internal/cq"
)

// TestRemoteWrites: the target's counter moves once per WRITE message (multi-packet and
// with immediate included) after its data is placed, and not for SEND, READ or on the
// requester.
func TestRemoteWrites(t *testing.T) {
	n := newNet(t)
	a := n.newSide("10.0.0.1", sideOpts{})
	b := n.newSide("10.0.0.2", sideOpts{})
	n.connect(a, b, connOpts{mtu: MTU1024})
	a.fill(0, 3000, 7)
	a.postSend(t, SendWR{WRID: 1, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 3000)}, Flags: SendSignaled,
		RemoteAddr: b.va(8192), RKey: b.mr.RKey()})
	n.pump()
	if got := b.qp.RemoteWrites(); got != 1 {
		t.Fatalf("after one 3-packet WRITE: %d", got)
	}
	if b.buf[8192+2999] != a.buf[2999] {
		t.Fatal("last byte not placed when counted")
	}
	b.postRecv(t, RecvWR{WRID: 9, SGL: []SGE{b.sge(0, 64)}})
	a.postSend(t,
		SendWR{WRID: 2, Opcode: WRRDMAWriteWithImm, SGL: []SGE{a.sge(0, 64)}, Flags: SendSignaled, Imm: 5,
			RemoteAddr: b.va(8192), RKey: b.mr.RKey()},
		SendWR{WRID: 3, Opcode: WRRDMARead, SGL: []SGE{a.sge(4096, 64)}, Flags: SendSignaled,
			RemoteAddr: b.va(8192), RKey: b.mr.RKey()},
		SendWR{WRID: 4, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 0)}, Flags: SendSignaled,
			RemoteAddr: b.va(8192), RKey: b.mr.RKey()})
	n.pump()
	wcs := pollAll(a.scq)
	if len(wcs) != 4 {
		t.Fatalf("completions %+v", wcs)
	}
	for _, w := range wcs {
		if w.Status != cq.StatusSuccess {
			t.Fatalf("completion %+v", w)
		}
	}
	if got := b.qp.RemoteWrites(); got != 3 {
		t.Fatalf("after WRITE, WRITE_WITH_IMM, READ, zero-length WRITE: %d, want 3", got)
	}
	if got := a.qp.RemoteWrites(); got != 0 {
		t.Fatalf("requester's count %d", got)
	}
	// the peer's SEND does not count
	a.postRecv(t, RecvWR{WRID: 10, SGL: []SGE{a.sge(0, 64)}})
	b.postSend(t, SendWR{WRID: 5, Opcode: WRSend, SGL: []SGE{b.sge(0, 64)}, Flags: SendSignaled})
	n.pump()
	if got := a.qp.RemoteWrites(); got != 0 {
		t.Fatalf("after a SEND: %d", got)
	}
}

// TestRemoteWriteNotify: the channel receives once a WRITE is placed, events coalesce, and
// other operations do not signal it.
func TestRemoteWriteNotify(t *testing.T) {
	n := newNet(t)
	a := n.newSide("10.0.0.1", sideOpts{})
	b := n.newSide("10.0.0.2", sideOpts{})
	n.connect(a, b, connOpts{mtu: MTU1024})
	ch := b.qp.RemoteWriteNotify()
	if b.qp.RemoteWriteNotify() != ch {
		t.Fatal("a second call returned another channel")
	}
	pending := func() bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	if pending() {
		t.Fatal("event before any WRITE")
	}
	wr := SendWR{Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 2000)}, Flags: SendSignaled, RemoteAddr: b.va(0), RKey: b.mr.RKey()}
	a.postSend(t, wr, wr)
	n.pump()
	if !pending() || pending() || b.qp.RemoteWrites() != 2 {
		t.Fatalf("after two WRITEs: want one coalesced event and count 2 (count %d)", b.qp.RemoteWrites())
	}
	a.postSend(t, SendWR{Opcode: WRRDMARead, SGL: []SGE{a.sge(0, 64)}, Flags: SendSignaled, RemoteAddr: b.va(0), RKey: b.mr.RKey()})
	n.pump()
	if pending() {
		t.Fatal("event after a READ")
	}
}
