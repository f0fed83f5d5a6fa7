package qp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/fault"
)

// Recovery tests (docs/reliability.md, "Recovery rules and their tests"):
// scripted faults from pkg/link/fault rules in front of the channel
// double, time from the ManualClock only (no sleeps), exact completions.

// chanLink makes the channel double a link.Link so fault.Wrap can sit in
// front of it (send faults only: Recv is never called).
type chanLink struct {
	*chanOut
	addr netip.Addr
}

var errNoRecv = errors.New("chanLink: no receive side")

func (chanLink) Recv([]link.Datagram) (int, error) { return 0, errNoRecv }
func (chanLink) BatchSize() int                    { return txBuffers }
func (l chanLink) LocalAddrs() []netip.Addr        { return []netip.Addr{l.addr} }
func (chanLink) Close() error                      { return nil }

// logged is one delivered packet.
type logged struct {
	from *side
	op   bth.Opcode
	psn  bth.PSN
	reth bth.RETHFields
	syn  uint8
	n    int
}

// wire is a pair of RC QPs whose sends pass the fault rules of their side,
// with a log of every delivered packet.
type wire struct {
	*net
	a, b *side
	log  []logged
}

// faultPair connects a (10.0.0.1, QPN 0x11) and b (10.0.0.2, QPN 0x12)
// with rules (fault.ParseRules syntax) on each side's sends.
func faultPair(t *testing.T, o connOpts, rulesA, rulesB string) *wire {
	t.Helper()
	n := newNet(t)
	w := &wire{net: n}
	mk := func(addr string, qpn uint32, rules string) *side {
		rs, err := fault.ParseRules(rules)
		if err != nil {
			t.Fatal(err)
		}
		ip := netip.MustParseAddr(addr)
		return n.newSide(addr, sideOpts{qpn: qpn, out: func(c *chanOut) Output {
			fl := fault.Wrap(chanLink{c, ip}, fault.Options{Clock: n.clk, Send: fault.DirOptions{Rules: rs}})
			t.Cleanup(func() { fl.Close() })
			return fl
		}})
	}
	w.a = mk("10.0.0.1", 0x11, rulesA)
	w.b = mk("10.0.0.2", 0x12, rulesB)
	n.connect(w.a, w.b, o)
	n.filter = func(from *side, d *link.Datagram, p *bth.Packet) bool {
		l := logged{from: from, op: p.BTH.Opcode(), psn: p.BTH.PSN(), n: len(p.Payload)}
		if p.RETH != nil {
			l.reth = p.RETH.Fields()
		}
		if p.AETH != nil {
			l.syn = p.AETH.Fields().Syndrome
		}
		w.log = append(w.log, l)
		return true
	}
	return w
}

// sent returns the delivered packets from s with opcode op (any if op is 0xFF).
func (w *wire) sent(s *side, op bth.Opcode) []logged {
	var out []logged
	for _, l := range w.log {
		if l.from == s && (op == 0xFF || l.op == op) {
			out = append(out, l)
		}
	}
	return out
}

// naks returns the NAKs (not RNR) from s.
func (w *wire) naks(s *side) []logged {
	var out []logged
	for _, l := range w.sent(s, bth.OpRCAck) {
		if bth.SyndromeType(l.syn) == bth.AckTypeNAK {
			out = append(out, l)
		}
	}
	return out
}

func (s *side) write(wrid uint64, off, n int, remote uint64, rkey uint32, flags SendFlags) SendWR {
	return SendWR{WRID: wrid, Opcode: WRRDMAWrite, SGL: []SGE{s.sge(off, n)}, Flags: flags, RemoteAddr: remote, RKey: rkey}
}

// TestAckTimeoutTimer: the ACK timer (IBTA 9.7.6.1.3) fires exactly
// 4.096 us x 2^timeout after the request went out (not a nanosecond
// before), for small and large codes; timeout 0 arms no timer at all.
func TestAckTimeoutTimer(t *testing.T) {
	for _, code := range []uint8{1, 8, 14, 20, 31} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			want := time.Duration(4096<<code) * time.Nanosecond
			if got := AckTimeout(code); got != want {
				t.Fatalf("AckTimeout(%d) = %v, want %v", code, got, want)
			}
			w := faultPair(t, connOpts{timeout: code, retry: 1}, "", "drop:op=ACK:nth=1")
			a, b := w.a, w.b
			a.postSend(t, a.write(1, 0, 64, b.va(0), b.mr.RKey(), SendSignaled))
			start := w.clk.Now()
			w.pump()
			dl, ok := w.clk.NextDeadline()
			if !ok || !dl.Equal(start.Add(want)) {
				t.Fatalf("deadline %v (armed %v), want start+%v", dl.Sub(start), ok, want)
			}
			w.clk.Advance(want - time.Nanosecond)
			w.pump()
			if k := len(w.sent(a, bth.OpRCWriteOnly)); k != 1 {
				t.Fatalf("%d WRITEs before the timeout, want 1", k)
			}
			w.clk.Advance(time.Nanosecond)
			w.pump()
			if k := len(w.sent(a, bth.OpRCWriteOnly)); k != 2 {
				t.Fatalf("%d WRITEs after the timeout, want 2", k)
			}
			expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpRDMAWrite, ByteLen: 64})
			if s := a.cnt.Snapshot(); s.CompleterRetryErr != 1 || s.RetransPkts != 1 {
				t.Fatalf("completer_retry_err %d retransmitted_pkts %d, want 1 1", s.CompleterRetryErr, s.RetransPkts)
			}
			// the timer of the last post may still be pending (armTimerAt leaves it, lazily):
			// when it fires it finds nothing outstanding, resends nothing and arms nothing
			if dl, ok := w.clk.NextDeadline(); ok {
				w.clk.Advance(dl.Sub(w.clk.Now()))
				w.pump()
			}
			if k := len(w.sent(a, bth.OpRCWriteOnly)); k != 2 || w.clk.Pending() != 0 {
				t.Fatalf("after the last timer: %d WRITEs (want 2), %d timers pending (want none)", k, w.clk.Pending())
			}
		})
	}
	t.Run("0 is infinite", func(t *testing.T) {
		w := faultPair(t, connOpts{noTimer: true}, "", "drop:op=ACK")
		a, b := w.a, w.b
		a.postSend(t, a.write(1, 0, 64, b.va(0), b.mr.RKey(), SendSignaled))
		w.pump()
		if w.clk.Pending() != 0 {
			t.Fatal("timeout 0 armed a timer")
		}
		w.clk.Advance(100 * time.Hour)
		w.pump()
		if k := len(w.sent(a, bth.OpRCWriteOnly)); k != 1 {
			t.Fatalf("%d WRITEs, want 1 (no retransmission)", k)
		}
		expectWC(t, pollAll(a.scq))
	})
}

// TestRetryCountReset: retry_cnt counts consecutive timeouts without
// progress (IBTA 9.7.6.1.3, C9-140): an ACK in between gives the next WQE
// the full count again, so with retry_cnt 2 the failure comes at the
// fifth timeout, not the third.
func TestRetryCountReset(t *testing.T) {
	w := faultPair(t, connOpts{timeout: 8, retry: 2}, "", "")
	a, b := w.a, w.b
	p1 := bth.PSN(0) // connOpts psnA = 0
	seen1 := 0
	inner := w.filter
	w.filter = func(from *side, d *link.Datagram, p *bth.Packet) bool {
		if from == a {
			switch p.BTH.PSN() {
			case p1:
				seen1++
				if seen1 <= 2 {
					return false
				}
			case p1 + 1:
				return false
			}
		}
		return inner(from, d, p)
	}
	a.postSend(t, a.write(1, 0, 8, b.va(0), b.mr.RKey(), SendSignaled), a.write(2, 8, 8, b.va(8), b.mr.RKey(), SendSignaled))
	w.pump()
	for i := 1; i <= 4; i++ {
		w.clk.Advance(AckTimeout(8))
		w.pump()
		got := pollAll(a.scq)
		if i == 2 {
			expectWC(t, got, cq.WC{WRID: 1, Opcode: cq.OpRDMAWrite, ByteLen: 8})
			continue
		}
		expectWC(t, got)
	}
	w.clk.Advance(AckTimeout(8))
	w.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 2, Status: cq.StatusRetryExcErr, Opcode: cq.OpRDMAWrite})
	if s := a.cnt.Snapshot(); s.CompleterRetryErr != 4 || s.RetryExceededErr != 1 {
		t.Fatalf("completer_retry_err %d retry_exceeded_err %d, want 4 1", s.CompleterRetryErr, s.RetryExceededErr)
	}
}

// TestRNRTimer: after an RNR NAK the requester is silent for exactly the
// timer of the NAK's code (IBTA 9.7.5.2.8, the RNR timer table in bth.RNRTimer), then
// resends from the NAKed PSN.
func TestRNRTimer(t *testing.T) {
	for _, code := range []uint8{0, 1, 14, 31} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			w := faultPair(t, connOpts{minRNR: code, rnrRetry: 7, timeout: 31}, "", "")
			a, b := w.a, w.b
			a.postSend(t, SendWR{WRID: 1, Opcode: WRSend, SGL: []SGE{a.sge(0, 100)}, Flags: SendSignaled})
			w.pump()
			naks := w.sent(b, bth.OpRCAck)
			if len(naks) != 1 || naks[0].syn != bth.SyndromeRNR(code) {
				t.Fatalf("responder sent %+v, want one RNR NAK with code %d", naks, code)
			}
			b.postRecv(t, RecvWR{WRID: 9, SGL: []SGE{b.sge(0, 100)}})
			d := bth.RNRTimer(code)
			w.clk.Advance(d - time.Nanosecond)
			w.pump()
			if k := len(w.sent(a, bth.OpRCSendOnly)); k != 1 {
				t.Fatalf("resent before the RNR timer (%d SENDs)", k)
			}
			w.clk.Advance(time.Nanosecond)
			w.pump()
			if s := w.sent(a, bth.OpRCSendOnly); len(s) != 2 || s[1].psn != s[0].psn {
				t.Fatalf("after the RNR timer: %+v, want the SEND again with its PSN", s)
			}
			expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpSend, ByteLen: 100})
			expectWC(t, pollAll(b.rcq), cq.WC{WRID: 9, Opcode: cq.OpRecv, ByteLen: 100})
		})
	}
}

// TestRNRDuplicateNAK: a copy of an RNR NAK (the network duplicated it)
// is not another RNR retry: with rnr_retry 1 the SEND still gets its one
// retry and succeeds, and the wait is not restarted.
func TestRNRDuplicateNAK(t *testing.T) {
	const code = 14
	w := faultPair(t, connOpts{minRNR: code, rnrRetry: 1}, "", "dup:op=ACK:nth=1:delay=100us")
	a, b := w.a, w.b
	a.postSend(t, SendWR{WRID: 1, Opcode: WRSend, SGL: []SGE{a.sge(0, 10)}, Flags: SendSignaled})
	w.pump()
	b.postRecv(t, RecvWR{WRID: 9, SGL: []SGE{b.sge(0, 10)}})
	w.clk.Advance(100 * time.Microsecond) // the copy arrives during the wait
	w.pump()
	expectWC(t, pollAll(a.scq))
	w.clk.Advance(bth.RNRTimer(code) - 100*time.Microsecond)
	w.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpSend, ByteLen: 10})
	if s := a.cnt.Snapshot(); s.RcvdRNRErr != 2 || s.RetryRNRExceededErr != 0 {
		t.Fatalf("rcvd_rnr_err %d retry_rnr_exceeded_err %d, want 2 0", s.RcvdRNRErr, s.RetryRNRExceededErr)
	}
}

// injectAck delivers an ACK/NAK with syndrome syn and PSN psn from b to a,
// as if b had sent it.
func injectAck(w *wire, syn uint8, psn bth.PSN) {
	buf := make([]byte, bth.BTHSize+bth.AETHSize+bth.ICRCSize)
	bth.BTH(buf).Encode(&bth.BTHFields{Opcode: bth.OpRCAck, PKey: 0xFFFF, DestQP: w.a.qp.Num(), PSN: psn})
	bth.AETH(buf[bth.BTHSize:]).Encode(&bth.AETHFields{Syndrome: syn, MSN: 1})
	d := link.Datagram{Buf: buf, Src: netip.AddrPortFrom(w.b.addr, 0xC000), Dst: netip.AddrPortFrom(w.a.addr, bth.UDPPort)}
	reencode(&d)
	w.deliver(w.b, &d)
}

// TestNAKKinds: each NAK code completes the WQE holding the NAKed PSN with
// its status (IBTA 9.7.5.2 table 44 -> 11.6.2 completion codes), the
// WQEs before it (implicitly ACKed by the NAK) succeed, the rest -
// including unsignaled ones and a receive - are flushed in posting order,
// the QP is in ERR and no timer is left.
func TestNAKKinds(t *testing.T) {
	cases := []struct {
		code uint8
		st   cq.Status
	}{
		{bth.NAKInvalidRequest, cq.StatusRemInvReqErr},
		{bth.NAKRemoteAccessErr, cq.StatusRemAccessErr},
		{bth.NAKRemoteOpErr, cq.StatusRemOpErr},
		{bth.NAKInvalidRDRequest, cq.StatusRemInvRDReqErr},
		{9, cq.StatusBadRespErr}, // reserved code
	}
	for _, c := range cases {
		t.Run(c.st.String(), func(t *testing.T) {
			w := faultPair(t, connOpts{}, "drop", "") // nothing of a's reaches b
			a, b := w.a, w.b
			a.postRecv(t, RecvWR{WRID: 70})
			a.postSend(t,
				a.write(1, 0, 8, b.va(0), b.mr.RKey(), SendSignaled),        // PSN 0
				SendWR{WRID: 2, Opcode: WRSend, SGL: []SGE{a.sge(0, 3000)}}, // PSN 1..3, unsignaled
				SendWR{WRID: 3, Opcode: WRRDMARead, SGL: []SGE{a.sge(0, 8)}, Flags: SendSignaled, RemoteAddr: b.va(0), RKey: b.mr.RKey()},
				a.write(4, 0, 8, b.va(0), b.mr.RKey(), 0))
			w.pump()
			injectAck(w, bth.SyndromeNAK(c.code), 2) // inside WQE 2
			expectWC(t, pollAll(a.scq),
				cq.WC{WRID: 1, Opcode: cq.OpRDMAWrite, ByteLen: 8},
				cq.WC{WRID: 2, Status: c.st, Opcode: cq.OpSend},
				cq.WC{WRID: 3, Status: cq.StatusWRFlushErr, Opcode: cq.OpRDMARead},
				cq.WC{WRID: 4, Status: cq.StatusWRFlushErr, Opcode: cq.OpRDMAWrite})
			expectWC(t, pollAll(a.rcq), cq.WC{WRID: 70, Status: cq.StatusWRFlushErr, Opcode: cq.OpRecv})
			if a.qp.State() != StateErr || w.clk.Pending() != 0 {
				t.Fatalf("state %v, %d timers", a.qp.State(), w.clk.Pending())
			}
		})
	}
}

// TestSeqNAKOnce: a lost middle packet makes the responder count every
// later packet out of sequence but NAK only once (IBTA 9.7.5.2.1), with
// the expected PSN; the requester goes back to exactly that PSN (not to
// the start of the message) and the data arrives intact.
func TestSeqNAKOnce(t *testing.T) {
	w := faultPair(t, connOpts{mtu: MTU256, psnA: 500, retry: 7}, "drop:psn=503:nth=1", "")
	a, b := w.a, w.b
	a.fill(0, 256*10, 3)
	a.postSend(t, a.write(1, 0, 256*10, b.va(dstOff), b.mr.RKey(), SendSignaled))
	w.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpRDMAWrite, ByteLen: 2560})
	eq(t, "write", b.buf[dstOff:dstOff+2560], a.buf[:2560])
	naks := w.naks(b)
	if len(naks) != 1 || naks[0].psn != 503 || bth.SyndromeValue(naks[0].syn) != bth.NAKPSNSeqErr {
		t.Fatalf("NAKs %+v, want one PSN-sequence NAK for 503", naks)
	}
	var psns []bth.PSN
	for _, l := range w.sent(a, 0xFF) {
		psns = append(psns, l.psn)
	}
	// 500..502, 504..509 (503 dropped), then 503..509 again
	want := []bth.PSN{500, 501, 502, 504, 505, 506, 507, 508, 509, 503, 504, 505, 506, 507, 508, 509}
	if fmt.Sprint(psns) != fmt.Sprint(want) {
		t.Fatalf("requester PSNs %v, want %v", psns, want)
	}
	if s := b.cnt.Snapshot(); s.OutOfSeqRequest != 6 || s.DuplicateRequest != 0 {
		t.Fatalf("out_of_seq_request %d duplicate_request %d, want 6 0", s.OutOfSeqRequest, s.DuplicateRequest)
	}
	if s := a.cnt.Snapshot(); s.RcvdSeqErr != 1 || s.RetransPkts != 7 {
		t.Fatalf("rcvd_seq_err %d retransmitted_pkts %d, want 1 7", s.RcvdSeqErr, s.RetransPkts)
	}
}

// TestDuplicates: each kind of duplicate request (IBTA 9.7.4.1, duplicate
// requests; rxe duplicate_request()) is answered without executing it
// again.
func TestDuplicates(t *testing.T) {
	t.Run("SEND re-ACKed, delivered once", func(t *testing.T) {
		w := faultPair(t, connOpts{mtu: MTU256}, "dup:op=SEND_ONLY:nth=1,dup:op=SEND_MIDDLE:nth=2", "")
		a, b := w.a, w.b
		a.fill(0, 1000, 1)
		b.postRecv(t, RecvWR{WRID: 5, SGL: []SGE{b.sge(dstOff, 100)}}, RecvWR{WRID: 6, SGL: []SGE{b.sge(dstOff+100, 1000)}},
			RecvWR{WRID: 7, SGL: []SGE{b.sge(dstOff+2000, 1000)}})
		a.postSend(t, SendWR{WRID: 1, Opcode: WRSend, SGL: []SGE{a.sge(0, 100)}, Flags: SendSignaled},
			SendWR{WRID: 2, Opcode: WRSend, SGL: []SGE{a.sge(0, 1000)}, Flags: SendSignaled})
		w.pump()
		expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpSend, ByteLen: 100}, cq.WC{WRID: 2, Opcode: cq.OpSend, ByteLen: 1000})
		expectWC(t, pollAll(b.rcq), cq.WC{WRID: 5, Opcode: cq.OpRecv, ByteLen: 100}, cq.WC{WRID: 6, Opcode: cq.OpRecv, ByteLen: 1000})
		eq(t, "send", b.buf[dstOff+100:dstOff+1100], a.buf[:1000])
		acks := w.sent(b, bth.OpRCAck)
		// ACK 0, re-ACK 0 for the copy of SEND_ONLY, re-ACK 3 for the copy of the
		// second MIDDLE (C9-105: duplicates are ACKed even without AckReq), ACK 4
		if len(acks) != 4 || acks[0].psn != 0 || acks[1].psn != 0 || acks[2].psn != 3 || acks[3].psn != 4 {
			t.Fatalf("ACKs %+v", acks)
		}
		if s := b.cnt.Snapshot(); s.DuplicateRequest != 2 || s.RDMARecvs != 2 {
			t.Fatalf("duplicate_request %d rdma_recvs %d, want 2 2", s.DuplicateRequest, s.RDMARecvs)
		}
	})
	t.Run("late WRITE copy not written again", func(t *testing.T) {
		w := faultPair(t, connOpts{}, "dup:op=WRITE_ONLY:nth=1:delay=1ms", "")
		a, b := w.a, w.b
		a.fill(0, 64, 1)
		a.fill(64, 64, 2)
		a.postSend(t, a.write(1, 0, 64, b.va(dstOff), b.mr.RKey(), SendSignaled))
		w.pump()
		a.postSend(t, a.write(2, 64, 64, b.va(dstOff), b.mr.RKey(), SendSignaled))
		w.pump()
		w.clk.Advance(time.Millisecond) // the copy of the first WRITE arrives now
		w.pump()
		expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpRDMAWrite, ByteLen: 64}, cq.WC{WRID: 2, Opcode: cq.OpRDMAWrite, ByteLen: 64})
		eq(t, "memory holds the second WRITE", b.buf[dstOff:dstOff+64], a.buf[64:128])
		if s := b.cnt.Snapshot(); s.DuplicateRequest != 1 {
			t.Fatalf("duplicate_request %d", s.DuplicateRequest)
		}
	})
	t.Run("READ replayed", func(t *testing.T) {
		w := faultPair(t, connOpts{mtu: MTU256}, "dup:op=READ_REQUEST:nth=1", "")
		a, b := w.a, w.b
		b.fill(dstOff, 1000, 4)
		a.postSend(t, SendWR{WRID: 1, Opcode: WRRDMARead, SGL: []SGE{a.sge(0, 1000)}, Flags: SendSignaled,
			RemoteAddr: b.va(dstOff), RKey: b.mr.RKey()})
		w.pump()
		expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpRDMARead, ByteLen: 1000})
		eq(t, "read", a.buf[:1000], b.buf[dstOff:dstOff+1000])
		if k := len(w.sent(b, 0xFF)); k != 8 {
			t.Fatalf("responder sent %d packets, want 2 x 4 responses", k)
		}
	})
	t.Run("atomic answered from the saved result", func(t *testing.T) {
		w := faultPair(t, connOpts{}, "dup:op=FETCH_ADD:nth=1,dup:op=CMP_SWAP:nth=1:delay=2ms", "")
		a, b := w.a, w.b
		binary.LittleEndian.PutUint64(b.buf[64:], 100)
		a.postSend(t,
			SendWR{WRID: 1, Opcode: WRAtomicFetchAndAdd, SGL: []SGE{a.sge(0, 8)}, Flags: SendSignaled, RemoteAddr: b.va(64), RKey: b.mr.RKey(), CompareAdd: 7},
			SendWR{WRID: 2, Opcode: WRAtomicCmpAndSwp, SGL: []SGE{a.sge(8, 8)}, Flags: SendSignaled, RemoteAddr: b.va(64), RKey: b.mr.RKey(), CompareAdd: 107, Swap: 1})
		w.pump()
		// 20 more FETCH_ADDs recycle every responder resource before the
		// late copy of the CMP_SWAP arrives: it must be dropped, not run
		for i := 0; i < 20; i++ {
			a.postSend(t, SendWR{WRID: uint64(10 + i), Opcode: WRAtomicFetchAndAdd, SGL: []SGE{a.sge(16, 8)}, RemoteAddr: b.va(64), RKey: b.mr.RKey(), CompareAdd: 1})
			w.pump()
		}
		binary.LittleEndian.PutUint64(b.buf[64:], 107) // the CMP_SWAP copy would match now
		w.clk.Advance(2 * time.Millisecond)
		w.pump()
		expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpFetchAdd, ByteLen: 8}, cq.WC{WRID: 2, Opcode: cq.OpCompSwap, ByteLen: 8})
		if got := binary.LittleEndian.Uint64(a.buf[0:]); got != 100 {
			t.Fatalf("FETCH_ADD returned %d", got)
		}
		if got := binary.LittleEndian.Uint64(a.buf[8:]); got != 107 {
			t.Fatalf("CMP_SWAP returned %d", got)
		}
		if got := binary.LittleEndian.Uint64(b.buf[64:]); got != 107 {
			t.Fatalf("remote word %d, want 107 (the late CMP_SWAP copy ran)", got)
		}
		if k := len(w.sent(b, bth.OpRCAtomicAck)); k != 23 {
			t.Fatalf("%d atomic ACKs, want 22 + 1 replayed", k)
		}
	})
}

// TestReadResume: a lost READ response in the middle makes the requester
// re-request from the first missing packet - PSN first+2, VA +2 MTU,
// length -2 MTU (IBTA 9.7.6.1.3 / 9.4.4; rxe's "restart at iova + done") -
// once, although 5 more responses of the burst arrive after the gap.
func TestReadResume(t *testing.T) {
	w := faultPair(t, connOpts{mtu: MTU256, psnA: 0xFFFFFF}, "", "drop:op=READ_RESPONSE_MIDDLE:nth=2")
	a, b := w.a, w.b
	b.fill(dstOff, 2000, 6)
	a.postSend(t, SendWR{WRID: 1, Opcode: WRRDMARead, SGL: sgl(a, 0, 2000, 3), Flags: SendSignaled,
		RemoteAddr: b.va(dstOff), RKey: b.mr.RKey()})
	w.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpRDMARead, ByteLen: 2000})
	eq(t, "read", a.buf[:2000], b.buf[dstOff:dstOff+2000])
	reqs := w.sent(a, bth.OpRCReadRequest)
	if len(reqs) != 2 {
		t.Fatalf("READ requests %+v, want 2", reqs)
	}
	first := bth.PSN(0xFFFFFF)
	if r := reqs[1]; r.psn != first.Add(2) || r.reth.VA != b.va(dstOff+512) || r.reth.DMALen != 2000-512 || r.reth.RKey != b.mr.RKey() {
		t.Fatalf("resumed request %+v (PSN %#x), want PSN %#x VA %#x len %d", r.reth, uint32(r.psn), uint32(first.Add(2)), b.va(dstOff+512), 2000-512)
	}
	if s := a.cnt.Snapshot(); s.RetransPkts != 1 || s.CompleterRetryErr != 0 {
		t.Fatalf("retransmitted_pkts %d completer_retry_err %d, want 1 0", s.RetransPkts, s.CompleterRetryErr)
	}
}

// TestPSNWrapRetransmit: losses right at the 2^24 PSN wrap, recovered by
// a sequence NAK, by the ACK timeout and by a READ resume.
func TestPSNWrapRetransmit(t *testing.T) {
	t.Run("seq NAK", func(t *testing.T) {
		w := faultPair(t, connOpts{mtu: MTU256, psnA: 0xFFFFFD, retry: 7}, "drop:psn=0:nth=1", "")
		a, b := w.a, w.b
		a.fill(0, 256*6, 8)
		a.postSend(t, a.write(1, 0, 256*6, b.va(dstOff), b.mr.RKey(), SendSignaled))
		w.pump()
		expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpRDMAWrite, ByteLen: 1536})
		eq(t, "write", b.buf[dstOff:dstOff+1536], a.buf[:1536])
		if naks := w.naks(b); len(naks) != 1 || naks[0].psn != 0 {
			t.Fatalf("NAKs %+v", naks)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		w := faultPair(t, connOpts{mtu: MTU256, psnA: 0xFFFFFD, timeout: 10, retry: 7}, "drop:psn=2:nth=1", "")
		a, b := w.a, w.b
		a.fill(0, 256*6, 9)
		a.postSend(t, a.write(1, 0, 256*6, b.va(dstOff), b.mr.RKey(), SendSignaled))
		w.pump()
		expectWC(t, pollAll(a.scq))
		w.clk.Advance(AckTimeout(10))
		w.pump()
		expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpRDMAWrite, ByteLen: 1536})
		eq(t, "write", b.buf[dstOff:dstOff+1536], a.buf[:1536])
		var psns []bth.PSN
		for _, l := range w.sent(a, 0xFF) {
			psns = append(psns, l.psn)
		}
		want := []bth.PSN{0xFFFFFD, 0xFFFFFE, 0xFFFFFF, 0, 1, 0xFFFFFD, 0xFFFFFE, 0xFFFFFF, 0, 1, 2}
		if fmt.Sprint(psns) != fmt.Sprint(want) {
			t.Fatalf("PSNs %x, want %x", psns, want)
		}
	})
	t.Run("READ resume", func(t *testing.T) {
		w := faultPair(t, connOpts{mtu: MTU256, psnA: 0xFFFFFE}, "", "drop:psn=0:nth=1")
		a, b := w.a, w.b
		b.fill(dstOff, 1200, 10)
		a.postSend(t, SendWR{WRID: 1, Opcode: WRRDMARead, SGL: []SGE{a.sge(0, 1200)}, Flags: SendSignaled, RemoteAddr: b.va(dstOff), RKey: b.mr.RKey()})
		w.pump()
		expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpRDMARead, ByteLen: 1200})
		eq(t, "read", a.buf[:1200], b.buf[dstOff:dstOff+1200])
		reqs := w.sent(a, bth.OpRCReadRequest)
		if len(reqs) != 2 || reqs[1].psn != 0 || reqs[1].reth.VA != b.va(dstOff+512) || reqs[1].reth.DMALen != 1200-512 {
			t.Fatalf("READ requests %+v", reqs)
		}
	})
}

// TestImplicitAck: later responses acknowledge earlier requests (IBTA
// 9.7.5.1.2), and a response after a READ/atomic whose response was lost
// triggers the resend at once, without waiting for the ACK timeout.
func TestImplicitAck(t *testing.T) {
	t.Run("READ response ACKs a WRITE", func(t *testing.T) {
		w := faultPair(t, connOpts{}, "", "drop:op=ACK:nth=1")
		a, b := w.a, w.b
		a.postSend(t, a.write(1, 0, 8, b.va(0), b.mr.RKey(), SendSignaled),
			SendWR{WRID: 2, Opcode: WRRDMARead, SGL: []SGE{a.sge(64, 8)}, Flags: SendSignaled, RemoteAddr: b.va(0), RKey: b.mr.RKey()})
		w.pump()
		expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpRDMAWrite, ByteLen: 8}, cq.WC{WRID: 2, Opcode: cq.OpRDMARead, ByteLen: 8})
	})
	for _, c := range []struct {
		name, rule    string
		first, second WROpcode
	}{
		{"lost READ tail, later ACK", "drop:op=READ_RESPONSE_LAST:nth=1", WRRDMARead, WRRDMAWrite},
		{"lost READ tail, later atomic ACK", "drop:op=READ_RESPONSE_LAST:nth=1", WRRDMARead, WRAtomicFetchAndAdd},
		{"lost atomic ACK, later READ response", "drop:op=ATOMIC_ACK:nth=1", WRAtomicFetchAndAdd, WRRDMARead},
		{"lost atomic ACK, later ACK", "drop:op=ATOMIC_ACK:nth=1", WRAtomicFetchAndAdd, WRRDMAWrite},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := faultPair(t, connOpts{mtu: MTU256}, "", c.rule)
			a, b := w.a, w.b
			b.fill(dstOff, 1000, 11)
			binary.LittleEndian.PutUint64(b.buf[8:], 40)
			first := SendWR{WRID: 1, Opcode: c.first, Flags: SendSignaled, RKey: b.mr.RKey(), CompareAdd: 3}
			if first.Opcode == WRRDMARead {
				first.SGL, first.RemoteAddr = []SGE{a.sge(0, 1000)}, b.va(dstOff)
			} else {
				first.SGL, first.RemoteAddr = []SGE{a.sge(0, 8)}, b.va(8)
			}
			second := SendWR{WRID: 2, Opcode: c.second, Flags: SendSignaled, SGL: []SGE{a.sge(2000, 8)},
				RemoteAddr: b.va(24), RKey: b.mr.RKey(), CompareAdd: 1}
			a.postSend(t, first, second)
			w.pump() // no clock advance: no ACK timeout may be needed
			got := pollAll(a.scq)
			if len(got) != 2 || got[0].WRID != 1 || got[0].Status != cq.StatusSuccess || got[1].WRID != 2 || got[1].Status != cq.StatusSuccess {
				t.Fatalf("completions %+v, want 1 and 2 without a timeout", got)
			}
			if first.Opcode == WRRDMARead {
				eq(t, "read", a.buf[:1000], b.buf[dstOff:dstOff+1000])
			} else if got := binary.LittleEndian.Uint64(a.buf[0:]); got != 40 || binary.LittleEndian.Uint64(b.buf[8:]) != 43 {
				t.Fatalf("FETCH_ADD returned %d, word %d (want 40, 43: once)", got, binary.LittleEndian.Uint64(b.buf[8:]))
			}
			if s := a.cnt.Snapshot(); s.CompleterRetryErr != 0 {
				t.Fatalf("completer_retry_err %d: recovered by a timeout", s.CompleterRetryErr)
			}
		})
	}
}

// TestReadReplayAfterDereg: a READ whose last response was lost is
// retried by the ACK timeout after the responder deregistered the MR:
// the replay is refused with a remote access NAK for the resumed PSN, the
// responder enters ERR (rxe: RKEY_VIOLATION), and the requester completes
// the READ with REM_ACCESS_ERR and flushes the rest, without looping.
func TestReadReplayAfterDereg(t *testing.T) {
	w := faultPair(t, connOpts{mtu: MTU256, timeout: 10, retry: 7}, "drop:op=WRITE_ONLY", "drop:op=READ_RESPONSE_LAST:nth=1")
	a, b := w.a, w.b
	a.postSend(t, SendWR{WRID: 1, Opcode: WRRDMARead, SGL: []SGE{a.sge(0, 1000)}, Flags: SendSignaled, RemoteAddr: b.va(0), RKey: b.mr.RKey()},
		a.write(2, 0, 8, b.va(0), b.mr.RKey(), 0))
	w.pump()
	expectWC(t, pollAll(a.scq))
	if err := b.mr.Dereg(); err != nil {
		t.Fatal(err)
	}
	w.clk.Advance(AckTimeout(10))
	w.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Status: cq.StatusRemAccessErr, Opcode: cq.OpRDMARead},
		cq.WC{WRID: 2, Status: cq.StatusWRFlushErr, Opcode: cq.OpRDMAWrite})
	naks := w.naks(b)
	if len(naks) != 1 || naks[0].psn != 3 || bth.SyndromeValue(naks[0].syn) != bth.NAKRemoteAccessErr {
		t.Fatalf("NAKs %+v, want one remote access NAK for PSN 3", naks)
	}
	if a.qp.State() != StateErr || b.qp.State() != StateErr {
		t.Fatalf("states %v %v, want ERR ERR", a.qp.State(), b.qp.State())
	}
}

// TestRetryExhaustedFlushOrder: with everything lost, the oldest WQE
// completes with RETRY_EXC_ERR after retry_cnt retries, then every other
// send WQE (signaled or not, READ, atomic, SEND) and every receive WQE is
// flushed in posting order; the QP is in ERR with no timer armed. The
// same for rnr_retry: RNR_RETRY_EXC_ERR.
func TestRetryExhaustedFlushOrder(t *testing.T) {
	post := func(a, b *side) {
		a.postRecv(t, RecvWR{WRID: 80}, RecvWR{WRID: 81})
		a.postSend(t,
			SendWR{WRID: 1, Opcode: WRSend, SGL: []SGE{a.sge(0, 8)}},
			SendWR{WRID: 2, Opcode: WRRDMARead, SGL: []SGE{a.sge(0, 8)}, RemoteAddr: b.va(0), RKey: b.mr.RKey()},
			SendWR{WRID: 3, Opcode: WRAtomicCmpAndSwp, SGL: []SGE{a.sge(8, 8)}, Flags: SendSignaled, RemoteAddr: b.va(0), RKey: b.mr.RKey()},
			a.write(4, 0, 8, b.va(0), b.mr.RKey(), SendSignaled))
	}
	want := func(st cq.Status) []cq.WC {
		return []cq.WC{{WRID: 1, Status: st, Opcode: cq.OpSend},
			{WRID: 2, Status: cq.StatusWRFlushErr, Opcode: cq.OpRDMARead},
			{WRID: 3, Status: cq.StatusWRFlushErr, Opcode: cq.OpCompSwap},
			{WRID: 4, Status: cq.StatusWRFlushErr, Opcode: cq.OpRDMAWrite}}
	}
	t.Run("retry_cnt", func(t *testing.T) {
		w := faultPair(t, connOpts{timeout: 8, retry: 3}, "drop", "")
		a, b := w.a, w.b
		post(a, b)
		w.pump()
		for i := 0; i < 3; i++ {
			w.clk.Advance(AckTimeout(8))
			w.pump()
			expectWC(t, pollAll(a.scq))
		}
		w.clk.Advance(AckTimeout(8))
		w.pump()
		expectWC(t, pollAll(a.scq), want(cq.StatusRetryExcErr)...)
		expectWC(t, pollAll(a.rcq), cq.WC{WRID: 80, Status: cq.StatusWRFlushErr, Opcode: cq.OpRecv}, cq.WC{WRID: 81, Status: cq.StatusWRFlushErr, Opcode: cq.OpRecv})
		if a.qp.State() != StateErr || w.clk.Pending() != 0 {
			t.Fatalf("state %v, %d timers", a.qp.State(), w.clk.Pending())
		}
	})
	t.Run("rnr_retry", func(t *testing.T) {
		w := faultPair(t, connOpts{minRNR: 1, rnrRetry: 2}, "", "")
		a, b := w.a, w.b
		post(a, b)
		w.pump()
		w.clk.Advance(bth.RNRTimer(1))
		w.pump()
		expectWC(t, pollAll(a.scq))
		w.clk.Advance(bth.RNRTimer(1))
		w.pump()
		expectWC(t, pollAll(a.scq), want(cq.StatusRNRRetryExcErr)...)
		expectWC(t, pollAll(a.rcq), cq.WC{WRID: 80, Status: cq.StatusWRFlushErr, Opcode: cq.OpRecv}, cq.WC{WRID: 81, Status: cq.StatusWRFlushErr, Opcode: cq.OpRecv})
		if s := a.cnt.Snapshot(); s.RcvdRNRErr != 3 || s.RetryRNRExceededErr != 1 {
			t.Fatalf("rcvd_rnr_err %d retry_rnr_exceeded_err %d, want 3 1", s.RcvdRNRErr, s.RetryRNRExceededErr)
		}
		if a.qp.State() != StateErr || w.clk.Pending() != 0 {
			t.Fatalf("state %v, %d timers", a.qp.State(), w.clk.Pending())
		}
	})
}

// TestRNRResetsRetryCount: an RNR NAK is a response from a live
// responder, so it ends a run of transport retries (IBTA 9.7.6.1.3 counts
// retries without a response; RNR NAKs have their own rnr_retry count,
// 9.7.5.2.8). With retry_cnt 1, two lost resends separated by RNR NAKs
// must not fail the SEND: while the receiver has no WQE the requester
// alternates RNR waits and (lossy) resends, possibly for a long time.
func TestRNRResetsRetryCount(t *testing.T) {
	const code = 1 // 0.01 ms
	w := faultPair(t, connOpts{minRNR: code, rnrRetry: 7, retry: 1, timeout: 8},
		"drop:op=SEND_ONLY:nth=2,drop:op=SEND_ONLY:nth=4", "")
	a, b := w.a, w.b
	a.postSend(t, SendWR{WRID: 1, Opcode: WRSend, SGL: []SGE{a.sge(0, 10)}, Flags: SendSignaled})
	w.pump() // RNR NAK 1
	for _, d := range []time.Duration{bth.RNRTimer(code), AckTimeout(8), bth.RNRTimer(code), AckTimeout(8), bth.RNRTimer(code)} {
		w.clk.Advance(d) // resend (dropped) / timeout resend -> RNR NAK / ...
		w.pump()
		expectWC(t, pollAll(a.scq))
	}
	b.postRecv(t, RecvWR{WRID: 9, SGL: []SGE{b.sge(0, 10)}})
	w.clk.Advance(bth.RNRTimer(code))
	w.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpSend, ByteLen: 10})
	if s := a.cnt.Snapshot(); s.CompleterRetryErr != 2 || s.RcvdRNRErr < 3 {
		t.Fatalf("completer_retry_err %d rcvd_rnr_err %d, want 2 and >= 3", s.CompleterRetryErr, s.RcvdRNRErr)
	}
}

// TestReadChunks: a READ longer than readChunk (128) packets is requested
// chunk by chunk at fixed boundaries, each chunk once the previous one has
// arrived (so the responder never has more than 128 responses of it in
// flight); a loss inside a chunk resumes from the first missing byte to
// that chunk's end, which the responder replays (IBTA 9.4.4, 9.7.6.1.3).
func TestReadChunks(t *testing.T) {
	const pkts = 3*readChunk + 40
	const size = pkts*256 - 100
	w := faultPair(t, connOpts{mtu: MTU256, psnA: 0xFFFF00, retry: 7}, "", fmt.Sprintf("drop:psn=%d:nth=1", (0xFFFF00+readChunk+5)&0xFFFFFF))
	a, b := w.a, w.b
	b.fill(dstOff, size, 12)
	inFlight, maxInFlight := 0, 0
	inner := w.filter
	w.filter = func(from *side, d *link.Datagram, p *bth.Packet) bool {
		switch {
		case from == a && p.BTH.Opcode() == bth.OpRCReadRequest:
			inFlight = int(p.RETH.Fields().DMALen+255) / 256
		case from == b:
			inFlight--
		}
		maxInFlight = max(maxInFlight, inFlight)
		return inner(from, d, p)
	}
	a.postSend(t, SendWR{WRID: 1, Opcode: WRRDMARead, SGL: sgl(a, 0, size, 3), Flags: SendSignaled, RemoteAddr: b.va(dstOff), RKey: b.mr.RKey()},
		a.write(2, 0, 8, b.va(0), b.mr.RKey(), SendSignaled))
	w.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpRDMARead, ByteLen: size}, cq.WC{WRID: 2, Opcode: cq.OpRDMAWrite, ByteLen: 8})
	eq(t, "read", a.buf[:size], b.buf[dstOff:dstOff+size])
	first := bth.PSN(0xFFFF00)
	type req struct {
		psn     bth.PSN
		off, ln uint32
	}
	var got []req
	for _, r := range w.sent(a, bth.OpRCReadRequest) {
		got = append(got, req{r.psn, uint32(r.reth.VA - b.va(dstOff)), r.reth.DMALen})
	}
	c := uint32(readChunk * 256)
	want := []req{
		{first, 0, c},
		{first.Add(readChunk), c, c}, // chunk 1, response 5 lost
		{first.Add(readChunk + 5), c + 5*256, c - 5*256}, // resumed to the chunk's end
		{first.Add(2 * readChunk), 2 * c, c},
		{first.Add(3 * readChunk), 3 * c, size - 3*c},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("READ requests %v, want %v", got, want)
	}
	if maxInFlight > readChunk {
		t.Fatalf("%d READ responses in flight, want <= %d", maxInFlight, readChunk)
	}
	if wr := w.sent(a, bth.OpRCWriteOnly); len(wr) != 1 || wr[0].psn != first.Add(pkts) {
		t.Fatalf("WRITE after the READ: %+v, want PSN %#x", wr, uint32(first.Add(pkts)))
	}
}

// TestReadSelectiveRetry: four pipelined READs with a WRITE among them;
// one response of the first READ is lost. The responses of the later
// READs are kept and only the first READ is asked again (one extra READ
// request, its missing part replayed); the WRITE counts as acknowledged
// by the later READ's response (IBTA 9.7.5.1.2). No ACK timeout, no
// go-back-N: the responder sends 16 + 3 responses instead of 16 + 15.
func TestReadSelectiveRetry(t *testing.T) {
	w := faultPair(t, connOpts{mtu: MTU256, retry: 7}, "", "drop:op=READ_RESPONSE_MIDDLE:nth=1")
	a, b := w.a, w.b
	b.fill(dstOff, 4*1024, 13)
	var wrs []SendWR
	for i := 0; i < 4; i++ {
		wrs = append(wrs, SendWR{WRID: uint64(i + 1), Opcode: WRRDMARead, SGL: []SGE{a.sge(i*1024, 1024)}, Flags: SendSignaled,
			RemoteAddr: b.va(dstOff + i*1024), RKey: b.mr.RKey()})
		if i == 0 {
			wrs = append(wrs, a.write(9, 8000, 64, b.va(0), b.mr.RKey(), SendSignaled))
		}
	}
	a.postSend(t, wrs...)
	w.pump() // no clock advance
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpRDMARead, ByteLen: 1024}, cq.WC{WRID: 9, Opcode: cq.OpRDMAWrite, ByteLen: 64},
		cq.WC{WRID: 2, Opcode: cq.OpRDMARead, ByteLen: 1024}, cq.WC{WRID: 3, Opcode: cq.OpRDMARead, ByteLen: 1024},
		cq.WC{WRID: 4, Opcode: cq.OpRDMARead, ByteLen: 1024})
	eq(t, "reads", a.buf[:4096], b.buf[dstOff:dstOff+4096])
	reqs := w.sent(a, bth.OpRCReadRequest)
	if len(reqs) != 5 || reqs[4].psn != 1 || reqs[4].reth.VA != b.va(dstOff+256) || reqs[4].reth.DMALen != 768 {
		t.Fatalf("READ requests %+v, want 4 + one for READ 1 from PSN 1", reqs)
	}
	if k := len(w.sent(a, bth.OpRCWriteOnly)); k != 1 {
		t.Fatalf("WRITE sent %d times", k)
	}
	if k := len(w.sent(b, 0xFF)); k != 15+1+3 {
		t.Fatalf("responder sent %d packets, want 15 responses + 1 ACK + 3 replayed", k)
	}
	if s := a.cnt.Snapshot(); s.CompleterRetryErr != 0 || s.RetransPkts != 1 {
		t.Fatalf("completer_retry_err %d retransmitted_pkts %d, want 0 1", s.CompleterRetryErr, s.RetransPkts)
	}
}

// TestLocalOpNotRepeated: a LOCAL_INV executed while an earlier WRITE is
// still unacknowledged is not executed again when the ACK timeout sends
// the WRITE again (go-back-N resends requests, not local operations).
func TestLocalOpNotRepeated(t *testing.T) {
	w := faultPair(t, connOpts{retry: 7, timeout: 10}, "", "drop:op=ACK:nth=1")
	a, b := w.a, w.b
	win, err := a.tbl.AllocMW(a.pd, mr.MWType2)
	if err != nil {
		t.Fatal(err)
	}
	region, err := a.tbl.RegMR(a.pd, a.buf[1<<20:1<<20+4096], 0x6000_0000, mr.AccessLocalWrite|mr.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	key := win.RKey()&^0xFF | uint32(uint8(win.RKey())+1)
	a.postSend(t, SendWR{WRID: 1, Opcode: WRBindMW, Flags: SendSignaled, Bind: &BindInfo{MWRKey: win.RKey(), NewRKey: key,
		MRLKey: region.LKey(), Addr: 0x6000_0000, Length: 4096, Access: uint32(mr.AccessRemoteWrite)}})
	a.postSend(t, a.write(2, 0, 8, b.va(0), b.mr.RKey(), SendSignaled), SendWR{WRID: 3, Opcode: WRLocalInv, Flags: SendSignaled, InvRKey: key})
	w.pump()
	w.clk.Advance(AckTimeout(10))
	w.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpBindMW}, cq.WC{WRID: 2, Opcode: cq.OpRDMAWrite, ByteLen: 8},
		cq.WC{WRID: 3, Opcode: cq.OpLocalInv})
	if a.qp.State() != StateRTS {
		t.Fatalf("state %v", a.qp.State())
	}
}
