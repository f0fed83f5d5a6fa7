package qp

import (
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/pkg/bth"
)

// TestDestroySendsDeferredACK: a SEND received with ReceiveDeferred completes at the responder
// before its ACK leaves (FlushReceived runs after the receive loop's batch). A program that
// polls that completion and destroys the QP at once — pingpong's last echo, then exit — must
// not lose the ACK (IBTA 9.7.5.1: the responder acknowledges a request it executed; rxe sends
// the ACK before the QP can go): Destroy sends what the deferred batch queued, so the
// requester's SEND completes instead of retrying into RETRY_EXC_ERR, and the FlushReceived that
// follows sends nothing more.
func TestDestroySendsDeferredACK(t *testing.T) {
	n := newNet(t)
	a := n.newSide("10.0.0.1", sideOpts{qpn: 0x11, bufSize: 1 << 16})
	b := n.newSide("10.0.0.2", sideOpts{qpn: 0x12, bufSize: 1 << 16})
	n.connect(a, b, connOpts{mtu: MTU1024, psnA: 100})
	b.postRecv(t, RecvWR{WRID: 9, SGL: []SGE{b.sge(0, 256)}})
	a.postSend(t, SendWR{WRID: 1, Opcode: WRSend, SGL: []SGE{a.sge(0, 64)}, Flags: SendSignaled})
	q := a.out.q
	a.out.q = nil
	if len(q) != 1 {
		t.Fatalf("requester queued %d packets, want 1 SEND", len(q))
	}
	p, err := bth.Parse(q[0].Buf)
	if err != nil {
		t.Fatal(err)
	}
	if !b.qp.ReceiveDeferred(n.clk.Now(), &p, q[0].Src, q[0].Dst) {
		t.Fatal("the SEND was dropped")
	}
	if wcs := pollAll(b.rcq); len(wcs) != 1 || wcs[0].Status != cq.StatusSuccess {
		t.Fatalf("responder completions %+v, want the receive", wcs)
	}
	if len(b.out.q) != 0 {
		t.Fatalf("%d packets left before the flush", len(b.out.q))
	}
	b.qp.Destroy()
	if len(b.out.q) != 1 {
		t.Fatalf("Destroy sent %d packets, want the deferred ACK", len(b.out.q))
	}
	b.qp.FlushReceived(n.clk.Now())
	if len(b.out.q) != 1 {
		t.Fatalf("FlushReceived after Destroy: %d packets, want the one ACK", len(b.out.q))
	}
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Status: cq.StatusSuccess, Opcode: cq.OpSend, ByteLen: 64, QPNum: 0x11})
}
