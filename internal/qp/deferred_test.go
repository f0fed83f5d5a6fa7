package qp

import (
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
)

// countOut counts the Output's Send calls (one per burst handed to the link).
type countOut struct {
	*chanOut
	sends int
}

func (c *countOut) Send(batch []link.Datagram) error {
	c.sends++
	return c.chanOut.Send(batch)
}

// deliverDeferred hands every datagram queued by from to its peer's QP with ReceiveDeferred, as
// the device's receive loop does for one batch, then flushes that QP once.
func (n *net) deliverDeferred(from, to *side) {
	n.t.Helper()
	if n.receiveAll(from, to) {
		to.qp.FlushReceived(n.clk.Now())
	}
}

// TestDeferredReceiveACKsInOneSend: a batch of 8 WRITE ONLY requests, each asking for an ACK,
// received with ReceiveDeferred is answered by the same 8 ACKs as with Receive (PSN k, MSN k: rxe
// does not coalesce them either) handed to the Output in one Send instead of 8; they complete all
// 8 WRITEs. Also with GSO runs on the responder (the ACKs then form one run).
func TestDeferredReceiveACKsInOneSend(t *testing.T) {
	for _, tc := range []struct {
		name     string
		deferred bool
		gso      bool
		sends    int
	}{
		{"per-packet", false, false, 8},
		{"deferred", true, false, 1},
		{"deferred-gso", true, true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNet(t)
			a := n.newSide("10.0.0.1", sideOpts{qpn: 0x11, bufSize: 1 << 20})
			var sends *int
			var b *side
			if tc.gso {
				b = n.newSide("10.0.0.2", sideOpts{qpn: 0x12, bufSize: 1 << 20})
				ro := &runOut{t: t, gso: true}
				b.qp.cfg.Out, b.qp.runs = ro, ro
				b.out = &ro.chanOut
				sends = &ro.sendRuns
			} else {
				var co *countOut
				b = n.newSide("10.0.0.2", sideOpts{qpn: 0x12, bufSize: 1 << 20,
					out: func(c *chanOut) Output { co = &countOut{chanOut: c}; return co }})
				sends = &co.sends
			}
			n.connect(a, b, connOpts{mtu: MTU1024, psnA: 100})
			a.fill(0, 8<<10, 3)
			for i := 0; i < 8; i++ {
				a.postSend(t, SendWR{WRID: uint64(i), Opcode: WRRDMAWrite, SGL: []SGE{a.sge(i<<10, 1024)},
					Flags: SendSignaled, RemoteAddr: b.va(i << 10), RKey: b.mr.RKey()})
			}
			if len(a.out.q) != 8 {
				t.Fatalf("requester queued %d packets, want 8", len(a.out.q))
			}
			if tc.deferred {
				n.deliverDeferred(a, b)
			} else {
				q := a.out.q
				a.out.q = nil
				for i := range q {
					n.deliver(a, &q[i])
				}
			}
			if *sends != tc.sends || len(b.out.q) != 8 {
				t.Fatalf("responder: %d sends with %d packets, want %d sends with 8 ACKs", *sends, len(b.out.q), tc.sends)
			}
			for k, d := range b.out.q {
				p, err := bth.Parse(d.Buf)
				if err != nil {
					t.Fatal(err)
				}
				if p.BTH.Opcode() != bth.OpRCAck || p.BTH.PSN() != bth.PSN(100+k) || p.AETH.Fields().MSN != uint32(k+1) ||
					bth.SyndromeType(p.AETH.Fields().Syndrome) != bth.AckTypeACK {
					t.Fatalf("ACK %d: opcode %v PSN %d AETH %+v, want ACK PSN %d MSN %d", k, p.BTH.Opcode(), p.BTH.PSN(), p.AETH.Fields(), 100+k, k+1)
				}
			}
			n.pump() // the ACKs to the requester, ICRC checked
			var want []cq.WC
			for i := 0; i < 8; i++ {
				want = append(want, cq.WC{WRID: uint64(i), Status: cq.StatusSuccess, Opcode: cq.OpRDMAWrite, ByteLen: 1024, QPNum: 0x11})
			}
			expectWC(t, pollAll(a.scq), want...)
			eq(t, "written data", b.buf[:8<<10], a.buf[:8<<10])
		})
	}
}

// TestDeferredReceiveOneBurst: ACKs that each open the requester window by one 16-packet
// message, delivered as one batch with ReceiveDeferred, release the waiting WRITEs in bursts of
// up to 64 packets (2 sends for 8 messages) instead of one send per ACK (8 with Receive).
func TestDeferredReceiveOneBurst(t *testing.T) {
	for _, tc := range []struct {
		name     string
		deferred bool
		sends    int
	}{
		{"per-packet", false, 8},
		{"deferred", true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNet(t)
			var co *countOut
			a := n.newSide("10.0.0.1", sideOpts{qpn: 0x11, bufSize: 1 << 20,
				out: func(c *chanOut) Output { co = &countOut{chanOut: c}; return co }})
			b := n.newSide("10.0.0.2", sideOpts{qpn: 0x12, bufSize: 1 << 20})
			n.connect(a, b, connOpts{mtu: MTU1024})
			const msgs, size = 16, 16 << 10 // 16 packets each: the window (128 PSNs) holds 8
			a.fill(0, msgs*size, 9)
			for i := 0; i < msgs; i++ {
				a.postSend(t, SendWR{WRID: uint64(i), Opcode: WRRDMAWrite, SGL: []SGE{a.sge(i*size, size)},
					Flags: SendSignaled, RemoteAddr: b.va(i * size), RKey: b.mr.RKey()})
			}
			if got := len(a.out.q); got != MaxUnackedPSNs {
				t.Fatalf("%d packets before the window closed, want %d", got, MaxUnackedPSNs)
			}
			// the responder ACKs each message on its own (per-packet Receive): 8 ACKs
			q := a.out.q
			a.out.q = nil
			for i := range q {
				n.deliver(a, &q[i])
			}
			if len(b.out.q) != 8 {
				t.Fatalf("responder sent %d ACKs, want 8", len(b.out.q))
			}
			co.sends = 0
			if tc.deferred {
				n.deliverDeferred(b, a)
			} else {
				q := b.out.q
				b.out.q = nil
				for i := range q {
					n.deliver(b, &q[i])
				}
			}
			if co.sends != tc.sends || len(a.out.q) != MaxUnackedPSNs {
				t.Fatalf("requester: %d sends with %d packets, want %d sends with %d", co.sends, len(a.out.q), tc.sends, MaxUnackedPSNs)
			}
			n.pump()
			if got := len(pollAll(a.scq)); got != msgs {
				t.Fatalf("%d completions, want %d", got, msgs)
			}
			eq(t, "written data", b.buf[:msgs*size], a.buf[:msgs*size])
		})
	}
}
