package qp

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
)

// TestAckReqEveryNAndCoalescing: the requester sets AckReq on the last
// packet of a message and at least every PktsPerAck packets (IBTA 9.2 BTH
// A bit; rxe RXE_MAX_PKT_PER_ACK), and the responder ACKs only those
// packets, coalescing the rest (IBTA 9.7.5.1.1).
func TestAckReqEveryNAndCoalescing(t *testing.T) {
	n, a, b := rcPair(t, connOpts{mtu: MTU256})
	const pkts = 2*PktsPerAck + 10
	var sent, acks int
	var ackReqAt []int // 1-based packet numbers carrying AckReq
	n.filter = func(from *side, _ *link.Datagram, p *bth.Packet) bool {
		switch {
		case from == a:
			sent++
			if p.BTH.AckReq() {
				ackReqAt = append(ackReqAt, sent)
			}
		case from == b && p.BTH.Opcode() == bth.OpRCAck:
			acks++
		}
		return true
	}
	a.fill(0, pkts*256, 3)
	a.postSend(t, SendWR{WRID: 1, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, pkts*256)}, Flags: SendSignaled,
		RemoteAddr: b.va(dstOff), RKey: b.mr.RKey()})
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpRDMAWrite, ByteLen: pkts * 256})
	eq(t, "write", b.buf[dstOff:dstOff+pkts*256], a.buf[:pkts*256])
	if sent != pkts {
		t.Fatalf("sent %d packets, want %d (no retransmission expected)", sent, pkts)
	}
	if want := fmt.Sprint([]int{PktsPerAck, 2 * PktsPerAck, pkts}); fmt.Sprint(ackReqAt) != want {
		t.Fatalf("AckReq on packets %v, want %s", ackReqAt, want)
	}
	if acks != 3 {
		t.Fatalf("responder sent %d ACKs for %d packets, want 3 (one per AckReq)", acks, pkts)
	}
	if got := b.cnt.Snapshot().AckDeferred; got != pkts-3 {
		t.Fatalf("ack_deferred %d, want %d", got, pkts-3)
	}
	// A message of one packet is ACKed on its own.
	acks, sent, ackReqAt = 0, 0, nil
	a.postSend(t, SendWR{WRID: 2, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 100)}, Flags: SendSignaled,
		RemoteAddr: b.va(dstOff), RKey: b.mr.RKey()})
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 2, Opcode: cq.OpRDMAWrite, ByteLen: 100})
	if sent != 1 || acks != 1 || len(ackReqAt) != 1 {
		t.Fatalf("one-packet WRITE: sent %d, AckReq %v, ACKs %d", sent, ackReqAt, acks)
	}
}

// TestSolicitedEvent: IBV_SEND_SOLICITED sets the BTH SE bit on the last
// packet of a SEND or WRITE_WITH_IMM only (IBTA 9.2.3; not on a plain
// WRITE, which completes nothing at the responder), and a receive CQ armed
// for solicited completions only fires for that message (IBTA 11.4.2.2).
func TestSolicitedEvent(t *testing.T) {
	n, a, b := rcPair(t, connOpts{mtu: MTU256})
	var se []string
	n.filter = func(from *side, _ *link.Datagram, p *bth.Packet) bool {
		if from == a && p.BTH.SE() {
			se = append(se, p.BTH.Opcode().String())
		}
		return true
	}
	fired := func() bool {
		select {
		case <-b.rcq.Channel():
			return true
		default:
			return false
		}
	}
	if err := b.rcq.ReqNotify(true); err != nil {
		t.Fatal(err)
	}
	b.postRecv(t, RecvWR{WRID: 1, SGL: []SGE{b.sge(0, 1000)}}, RecvWR{WRID: 2, SGL: []SGE{b.sge(1000, 1000)}},
		RecvWR{WRID: 3})
	// unsolicited SEND of 3 packets and a solicited plain WRITE: no SE, no event
	a.postSend(t, SendWR{WRID: 1, Opcode: WRSend, SGL: []SGE{a.sge(0, 600)}},
		SendWR{WRID: 2, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 600)}, Flags: SendSolicited,
			RemoteAddr: b.va(dstOff), RKey: b.mr.RKey()})
	n.pump()
	expectWC(t, pollAll(b.rcq), cq.WC{WRID: 1, Opcode: cq.OpRecv, ByteLen: 600})
	if len(se) != 0 || fired() {
		t.Fatalf("unsolicited messages: SE on %v, event %v", se, fired())
	}
	// solicited SEND of 3 packets: SE on the last only, the event fires
	a.postSend(t, SendWR{WRID: 3, Opcode: WRSend, SGL: []SGE{a.sge(0, 600)}, Flags: SendSolicited})
	n.pump()
	if want := fmt.Sprint([]string{bth.OpRCSendLast.String()}); fmt.Sprint(se) != want {
		t.Fatalf("SE on %v, want %s", se, want)
	}
	if !fired() {
		t.Fatal("solicited SEND did not fire the solicited-only arm")
	}
	expectWC(t, pollAll(b.rcq), cq.WC{WRID: 2, Opcode: cq.OpRecv, ByteLen: 600})
	// solicited WRITE_WITH_IMM: SE on its last packet, the event fires
	se = nil
	if err := b.rcq.ReqNotify(true); err != nil {
		t.Fatal(err)
	}
	a.postSend(t, SendWR{WRID: 4, Opcode: WRRDMAWriteWithImm, SGL: []SGE{a.sge(0, 600)}, Flags: SendSolicited,
		Imm: 5, RemoteAddr: b.va(dstOff), RKey: b.mr.RKey()})
	n.pump()
	if want := fmt.Sprint([]string{bth.OpRCWriteLastImm.String()}); fmt.Sprint(se) != want {
		t.Fatalf("SE on %v, want %s", se, want)
	}
	if !fired() {
		t.Fatal("solicited WRITE_WITH_IMM did not fire the solicited-only arm")
	}
	expectWC(t, pollAll(b.rcq), cq.WC{WRID: 3, Opcode: cq.OpRecvRDMAWithImm, ByteLen: 600, ImmData: 5, Flags: cq.FlagWithImm})
}

// TestResponderResources: the responder keeps the results of its last
// max_dest_rd_atomic READ/atomic requests (IBTA 9.4.4, 9.7.4.1.3
// responder resources; rxe's resource ring). Duplicates of the three
// FETCH_ADDs are replayed from that cache - the saved result, never
// re-executed - and only for the newest max_dest_rd_atomic of them; an
// evicted one is dropped (rxe: no resource, no reply).
func TestResponderResources(t *testing.T) {
	for _, resN := range []uint8{1, 2, 3} {
		t.Run(fmt.Sprintf("max_dest_rd_atomic%d", resN), func(t *testing.T) {
			n, a, b := rcPair(t, connOpts{rdAtomic: resN, destRDAtomic: resN})
			var reqs []link.Datagram
			capture := true
			n.filter = func(from *side, d *link.Datagram, p *bth.Packet) bool {
				if capture && from == a && p.BTH.Opcode() == bth.OpRCFetchAdd {
					c := *d
					c.Buf = append([]byte(nil), d.Buf...)
					reqs = append(reqs, c)
				}
				return true
			}
			const word = dstOff
			binary.LittleEndian.PutUint64(b.buf[word:], 100)
			for i := 0; i < 3; i++ {
				a.postSend(t, SendWR{WRID: uint64(i), Opcode: WRAtomicFetchAndAdd, SGL: []SGE{a.sge(8*i, 8)},
					Flags: SendSignaled, RemoteAddr: b.va(word), RKey: b.mr.RKey(), CompareAdd: 1})
			}
			n.pump()
			expectWC(t, pollAll(a.scq), cq.WC{WRID: 0, Opcode: cq.OpFetchAdd, ByteLen: 8},
				cq.WC{WRID: 1, Opcode: cq.OpFetchAdd, ByteLen: 8}, cq.WC{WRID: 2, Opcode: cq.OpFetchAdd, ByteLen: 8})
			if len(reqs) != 3 {
				t.Fatalf("captured %d requests", len(reqs))
			}
			capture = false
			dup := b.cnt.Snapshot().DuplicateRequest
			// the duplicates reach the responder; its answers stay in its queue
			var replayed []uint64
			for i := range reqs {
				rq, err := bth.Parse(reqs[i].Buf)
				if err != nil {
					t.Fatal(err)
				}
				n.deliver(a, &reqs[i])
				for _, d := range b.out.q {
					p, err := bth.Parse(d.Buf)
					if err != nil || p.BTH.Opcode() != bth.OpRCAtomicAck || p.BTH.PSN() != rq.BTH.PSN() {
						t.Fatalf("duplicate %d answered with %v (%v)", i, p.BTH.Opcode(), err)
					}
					replayed = append(replayed, p.AtomicAck.OrigData())
				}
				b.out.q = nil
			}
			var want []uint64
			for i := 3 - int(resN); i < 3; i++ {
				want = append(want, 100+uint64(i))
			}
			if fmt.Sprint(replayed) != fmt.Sprint(want) {
				t.Fatalf("replayed results %v, want %v", replayed, want)
			}
			if got := binary.LittleEndian.Uint64(b.buf[word:]); got != 103 {
				t.Fatalf("remote word %d, want 103 (duplicates re-executed)", got)
			}
			if got := b.cnt.Snapshot().DuplicateRequest - dup; got != 3 {
				t.Fatalf("duplicate_request +%d, want 3", got)
			}
			if b.qp.State() != StateRTS {
				t.Fatalf("responder state %v", b.qp.State())
			}
		})
	}
}

// TestMaxRDAtomicWindow: the requester has at most max_rd_atomic READ and
// atomic requests outstanding (IBTA 9.4.4 initiator depth); the rest wait
// for responses, and later WRITEs wait behind them in order.
func TestMaxRDAtomicWindow(t *testing.T) {
	for _, depth := range []uint8{1, 3} {
		n, a, b := rcPair(t, connOpts{rdAtomic: depth})
		for i := 0; i < 5; i++ {
			op := WRAtomicFetchAndAdd
			if i%2 == 1 {
				op = WRRDMARead
			}
			a.postSend(t, SendWR{WRID: uint64(i), Opcode: op, SGL: []SGE{a.sge(8*i, 8)}, Flags: SendSignaled,
				RemoteAddr: b.va(dstOff), RKey: b.mr.RKey(), CompareAdd: 1})
		}
		if len(a.out.q) != int(depth) {
			t.Fatalf("max_rd_atomic %d: %d requests sent before any response", depth, len(a.out.q))
		}
		n.pump()
		if got := len(pollAll(a.scq)); got != 5 {
			t.Fatalf("max_rd_atomic %d: %d completions, want 5", depth, got)
		}
	}
}
