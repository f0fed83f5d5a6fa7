package qp

import (
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
)

// takeOut removes and returns what s sent so far.
func takeOut(s *side) []link.Datagram {
	q := s.out.q
	s.out.q = nil
	return q
}

func parsed(t *testing.T, d link.Datagram) bth.Packet {
	t.Helper()
	p, err := bth.Parse(d.Buf)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestReadResponsesInBursts: a READ of 64 responses gets ReadInline of them when its request
// arrives, the rest from the scheduler's RunResponder turns (ReadBudget each); a WRITE that
// arrives meanwhile waits (its data is not placed, no ACK), then runs after the READ's last
// response, and its ACK follows that response (IBTA 9.5: requests execute in order; an ACK
// beyond an unanswered READ would tell the requester its responses were lost).
func TestReadResponsesInBursts(t *testing.T) {
	n := newNet(t)
	a := n.newSide("10.0.0.1", sideOpts{qpn: 0x11})
	b := n.newSide("10.0.0.2", sideOpts{qpn: 0x12})
	n.connect(a, b, connOpts{mtu: MTU4096})
	const size = 64 * 4096
	b.fill(0, size, 7)
	a.fill(size, 100, 9)
	a.postSend(t, SendWR{WRID: 1, Opcode: WRRDMARead, SGL: []SGE{a.sge(0, size)}, RemoteAddr: b.va(0), RKey: b.mr.RKey(), Flags: SendSignaled},
		SendWR{WRID: 2, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(size, 100)}, RemoteAddr: b.va(size), RKey: b.mr.RKey(), Flags: SendSignaled})
	reqs := takeOut(a)
	if len(reqs) != 2 {
		t.Fatalf("%d requests, want the READ and the WRITE", len(reqs))
	}
	n.deliver(a, &reqs[0])
	if got := len(b.out.q); got != ReadInline || len(n.sched) != 1 || n.sched[0] != b.qp || !b.qp.ResponderBusy() {
		t.Fatalf("after the READ request: %d responses, scheduled %v; want %d and the QP scheduled", got, n.sched, ReadInline)
	}
	n.deliver(a, &reqs[1])
	if len(b.out.q) != ReadInline || b.buf[size] != 0 {
		t.Fatal("the WRITE behind the READ was executed or answered before the READ's responses")
	}
	if !n.runScheduled() || len(b.out.q) != 65 {
		t.Fatalf("after one turn: %d packets, want the READ's 64 and the WRITE's ACK", len(b.out.q))
	}
	// the turn that finished the READ ran the WRITE: its ACK after the last response
	out := takeOut(b)
	if b.buf[size] == 0 || len(n.sched) != 0 {
		t.Fatalf("the held WRITE was not executed after the READ (scheduled %d)", len(n.sched))
	}
	for i, d := range out {
		p := parsed(t, d)
		want := bth.OpRCReadRespMiddle
		switch i {
		case 0:
			want = bth.OpRCReadRespFirst
		case 63:
			want = bth.OpRCReadRespLast
		}
		if i == 64 {
			want = bth.OpRCAck
		}
		if p.BTH.Opcode() != want {
			t.Fatalf("packet %d: %v, want %v", i, p.BTH.Opcode(), want)
		}
	}
	for i := range out {
		n.deliver(b, &out[i])
	}
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpRDMARead, ByteLen: size}, cq.WC{WRID: 2, Opcode: cq.OpRDMAWrite, ByteLen: 100})
	eq(t, "read", a.buf[:size], b.buf[:size])
	eq(t, "write", b.buf[size:size+100], a.buf[size:size+100])
}

// TestDuplicateReadRestarts: a duplicate READ that arrives while the original's responses are
// still going restarts them from the PSN it asks for (here the 11th response, with the
// remaining length, as a requester resuming after a loss asks): no second full set, and the
// responses continue FIRST (at the duplicate's PSN) .. LAST.
func TestDuplicateReadRestarts(t *testing.T) {
	n := newNet(t)
	a := n.newSide("10.0.0.1", sideOpts{qpn: 0x11})
	b := n.newSide("10.0.0.2", sideOpts{qpn: 0x12})
	n.connect(a, b, connOpts{mtu: MTU4096, psnA: 1000})
	const size = 64 * 4096
	b.fill(0, size, 3)
	a.postSend(t, SendWR{WRID: 1, Opcode: WRRDMARead, SGL: []SGE{a.sge(0, size)}, RemoteAddr: b.va(0), RKey: b.mr.RKey(), Flags: SendSignaled})
	reqs := takeOut(a)
	n.deliver(a, &reqs[0])
	// the duplicate: PSN +10, VA +10 MTUs, 54 MTUs left
	dup := link.Datagram{Buf: append([]byte(nil), reqs[0].Buf...), Src: reqs[0].Src, Dst: reqs[0].Dst}
	p := parsed(t, dup)
	p.BTH.SetPSN(p.BTH.PSN().Add(10))
	f := p.RETH.Fields()
	f.VA += 10 * 4096
	f.DMALen -= 10 * 4096
	p.RETH.Encode(&f)
	reencode(&dup)
	n.deliver(a, &dup)
	if b.cnt.Snapshot().DuplicateRequest != 1 {
		t.Fatal("the resent READ was not a duplicate")
	}
	for n.runScheduled() {
	}
	out := takeOut(b)
	if len(out) != ReadInline+54 {
		t.Fatalf("%d responses, want %d (the first %d, then the 54 the duplicate asks for)", len(out), ReadInline+54, ReadInline)
	}
	q := parsed(t, out[ReadInline])
	if q.BTH.PSN() != bth.PSN(1010) || q.BTH.Opcode() != bth.OpRCReadRespFirst {
		t.Fatalf("after the duplicate: %v PSN %d, want READ response FIRST at 1010", q.BTH.Opcode(), q.BTH.PSN())
	}
	if q := parsed(t, out[len(out)-1]); q.BTH.PSN() != bth.PSN(1063) || q.BTH.Opcode() != bth.OpRCReadRespLast {
		t.Fatalf("last: %v PSN %d, want READ response LAST at 1063", q.BTH.Opcode(), q.BTH.PSN())
	}
}

// TestReadResponsesStop: ERR stops a READ's responses (and drops the requests waiting behind
// it); a deregistered MR stops them with a remote access NAK at the first response not sent,
// and the QP enters ERR (IBTA 9.7.5.2.4).
func TestReadResponsesStop(t *testing.T) {
	for _, how := range []string{"err", "dereg"} {
		n := newNet(t)
		a := n.newSide("10.0.0.1", sideOpts{qpn: 0x11})
		b := n.newSide("10.0.0.2", sideOpts{qpn: 0x12})
		n.connect(a, b, connOpts{mtu: MTU4096})
		const size = 64 * 4096
		a.postSend(t, SendWR{WRID: 1, Opcode: WRRDMARead, SGL: []SGE{a.sge(0, size)}, RemoteAddr: b.va(0), RKey: b.mr.RKey(), Flags: SendSignaled},
			SendWR{WRID: 2, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(size, 100)}, RemoteAddr: b.va(size), RKey: b.mr.RKey(), Flags: SendSignaled})
		for _, r := range takeOut(a) {
			n.deliver(a, &r)
		}
		takeOut(b)
		if how == "err" {
			if err := b.qp.Modify(&Attr{State: StateErr}, AttrState); err != nil {
				t.Fatal(err)
			}
		} else if err := b.mr.Dereg(); err != nil {
			t.Fatal(err)
		}
		for n.runScheduled() {
		}
		out := takeOut(b)
		if b.qp.ResponderBusy() || b.qp.State() != StateErr {
			t.Fatalf("%s: busy %v, state %v", how, b.qp.ResponderBusy(), b.qp.State())
		}
		if how == "err" {
			if len(out) != 0 {
				t.Fatalf("%d packets after ERR", len(out))
			}
			continue
		}
		if len(out) != 1 {
			t.Fatalf("dereg: %d packets, want the NAK", len(out))
		}
		p := parsed(t, out[0])
		if p.BTH.Opcode() != bth.OpRCAck || p.AETH.Syndrome() != bth.SyndromeNAK(bth.NAKRemoteAccessErr) || p.BTH.PSN() != bth.PSN(ReadInline) {
			t.Fatalf("dereg: %v syndrome %#x PSN %d, want a remote access NAK at PSN %d", p.BTH.Opcode(), p.AETH.Syndrome(), p.BTH.PSN(), ReadInline)
		}
	}
}
