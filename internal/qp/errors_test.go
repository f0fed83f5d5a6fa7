package qp

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
)

// nakCase posts a failing WR followed by two more and expects the failing
// one to complete with st, the rest flushed in order, both QPs in ERR.
func nakCase(t *testing.T, n *net, a, b *side, bad SendWR, st cq.Status) {
	t.Helper()
	good := SendWR{WRID: 50, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 16)}, RemoteAddr: b.va(0), RKey: b.mr.RKey()}
	first := good
	first.WRID = 40
	first.Flags = SendSignaled
	next := good
	next.WRID = 51
	a.postSend(t, first, bad, good, next)
	n.pump()
	expectWC(t, pollAll(a.scq),
		cq.WC{WRID: 40, Opcode: cq.OpRDMAWrite, ByteLen: 16},
		cq.WC{WRID: bad.WRID, Status: st, Opcode: wcOpcode(bad.Opcode)},
		cq.WC{WRID: 50, Status: cq.StatusWRFlushErr, Opcode: cq.OpRDMAWrite},
		cq.WC{WRID: 51, Status: cq.StatusWRFlushErr, Opcode: cq.OpRDMAWrite})
	if a.qp.State() != StateErr {
		t.Fatalf("requester state %v, want ERR", a.qp.State())
	}
	if b.qp.State() != StateErr {
		t.Fatalf("responder state %v, want ERR", b.qp.State())
	}
}

func TestNAKRemoteAccess(t *testing.T) {
	t.Run("bad rkey", func(t *testing.T) {
		n, a, b := rcPair(t, connOpts{})
		nakCase(t, n, a, b, SendWR{WRID: 9, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 16)},
			RemoteAddr: b.va(0), RKey: b.mr.RKey() ^ 0x5500}, cq.StatusRemAccessErr)
	})
	t.Run("out of bounds", func(t *testing.T) {
		n, a, b := rcPair(t, connOpts{})
		nakCase(t, n, a, b, SendWR{WRID: 9, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 2000)},
			RemoteAddr: b.va(len(b.buf) - 1000), RKey: b.mr.RKey()}, cq.StatusRemAccessErr)
	})
	t.Run("only out of bounds", func(t *testing.T) { // one packet: the payload's check is the only one
		n, a, b := rcPair(t, connOpts{})
		nakCase(t, n, a, b, SendWR{WRID: 9, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 16)},
			RemoteAddr: b.va(len(b.buf) - 8), RKey: b.mr.RKey()}, cq.StatusRemAccessErr)
	})
	t.Run("read out of bounds", func(t *testing.T) {
		n, a, b := rcPair(t, connOpts{})
		nakCase(t, n, a, b, SendWR{WRID: 9, Opcode: WRRDMARead, SGL: []SGE{a.sge(0, 64)},
			RemoteAddr: b.va(len(b.buf) - 8), RKey: b.mr.RKey()}, cq.StatusRemAccessErr)
	})
	t.Run("missing permission", func(t *testing.T) {
		n, a, b := rcPair(t, connOpts{})
		ro, err := b.tbl.RegMR(b.pd, make([]byte, 4096), 0x9000000, mr.AccessLocalWrite|mr.AccessRemoteRead)
		if err != nil {
			t.Fatal(err)
		}
		nakCase(t, n, a, b, SendWR{WRID: 9, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 16)},
			RemoteAddr: 0x9000000, RKey: ro.RKey()}, cq.StatusRemAccessErr)
	})
	t.Run("atomic without permission", func(t *testing.T) {
		n, a, b := rcPair(t, connOpts{})
		ro, err := b.tbl.RegMR(b.pd, make([]byte, 4096), 0x9000000, mr.AccessLocalWrite|mr.AccessRemoteRead)
		if err != nil {
			t.Fatal(err)
		}
		nakCase(t, n, a, b, SendWR{WRID: 9, Opcode: WRAtomicFetchAndAdd, SGL: []SGE{a.sge(64, 8)},
			RemoteAddr: 0x9000000, RKey: ro.RKey(), CompareAdd: 1}, cq.StatusRemAccessErr)
	})
}

// TestNAKInvalidOpcodeSequence rewrites the FIRST packet of a SEND into a
// MIDDLE (a crafted packet): the responder NAKs invalid request.
func TestNAKInvalidOpcodeSequence(t *testing.T) {
	n, a, b := rcPair(t, connOpts{mtu: MTU256})
	b.postRecv(t, RecvWR{WRID: 70, SGL: []SGE{b.sge(0, 4096)}})
	n.filter = func(from *side, d *link.Datagram, p *bth.Packet) bool {
		if from == a && p.BTH.Opcode() == bth.OpRCSendFirst {
			p.BTH.SetOpcode(bth.OpRCSendMiddle)
			reencode(d)
			*p, _ = bth.Parse(d.Buf)
		}
		return true
	}
	nakCase(t, n, a, b, SendWR{WRID: 9, Opcode: WRSend, SGL: []SGE{a.sge(0, 1000)}}, cq.StatusRemInvReqErr)
	// the responder's receive WQE is flushed
	got := pollAll(b.rcq)
	if len(got) != 1 || got[0].WRID != 70 || got[0].Status != cq.StatusWRFlushErr {
		t.Fatalf("responder completions %+v", got)
	}
}

// TestNAKMessageTooLong: a SEND longer than the receive buffer.
func TestNAKMessageTooLong(t *testing.T) {
	n, a, b := rcPair(t, connOpts{mtu: MTU256})
	b.postRecv(t, RecvWR{WRID: 70, SGL: []SGE{b.sge(0, 300)}})
	nakCase(t, n, a, b, SendWR{WRID: 9, Opcode: WRSend, SGL: []SGE{a.sge(0, 600)}}, cq.StatusRemInvReqErr)
	got := pollAll(b.rcq)
	if len(got) != 1 || got[0].WRID != 70 || got[0].Status != cq.StatusLocLenErr {
		t.Fatalf("responder completions %+v", got)
	}
}

// dropNth drops the nth (1-based) packet from a matching pred, once.
func dropNth(from *side, nth int, pred func(p *bth.Packet) bool) func(*side, *link.Datagram, *bth.Packet) bool {
	seen := 0
	return func(s *side, d *link.Datagram, p *bth.Packet) bool {
		if s != from || !pred(p) {
			return true
		}
		seen++
		return seen != nth
	}
}

func any(*bth.Packet) bool { return true }

// TestRetransmitAfterLoss: a middle packet lost -> PSN sequence NAK ->
// go-back-N; the last packet lost -> nothing happens until the ACK
// timeout on the fake clock, then the transfer completes.
func TestRetransmitAfterLoss(t *testing.T) {
	t.Run("middle lost, seq NAK", func(t *testing.T) {
		n, a, b := rcPair(t, connOpts{mtu: MTU256, retry: 3})
		n.filter = dropNth(a, 3, any)
		a.fill(0, 2560, 1)
		a.postSend(t, SendWR{WRID: 1, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 2560)}, Flags: SendSignaled,
			RemoteAddr: b.va(dstOff), RKey: b.mr.RKey()})
		n.pump()
		expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpRDMAWrite, ByteLen: 2560})
		eq(t, "write", b.buf[dstOff:dstOff+2560], a.buf[:2560])
		if s := a.cnt.Snapshot(); s.RcvdSeqErr != 1 {
			t.Fatalf("rcvd_seq_err %d", s.RcvdSeqErr)
		}
		if s := b.cnt.Snapshot(); s.OutOfSeqRequest == 0 {
			t.Fatal("no out_of_seq_request counted")
		}
	})
	t.Run("last lost, timeout", func(t *testing.T) {
		n, a, b := rcPair(t, connOpts{mtu: MTU256, retry: 3, timeout: 10})
		n.filter = dropNth(a, 10, any)
		a.fill(0, 2560, 2)
		a.postSend(t, SendWR{WRID: 1, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 2560)}, Flags: SendSignaled,
			RemoteAddr: b.va(dstOff), RKey: b.mr.RKey()})
		n.pump()
		expectWC(t, pollAll(a.scq))
		n.clk.Advance(AckTimeout(10) - time.Microsecond)
		n.pump()
		expectWC(t, pollAll(a.scq))
		n.clk.Advance(2 * time.Microsecond)
		n.pump()
		expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpRDMAWrite, ByteLen: 2560})
		eq(t, "write", b.buf[dstOff:dstOff+2560], a.buf[:2560])
		if s := a.cnt.Snapshot(); s.CompleterRetryErr != 1 {
			t.Fatalf("completer_retry_err %d", s.CompleterRetryErr)
		}
	})
	t.Run("ACK lost, duplicate re-ACKed", func(t *testing.T) {
		n, a, b := rcPair(t, connOpts{retry: 3})
		n.filter = dropNth(b, 1, any)
		b.postRecv(t, RecvWR{WRID: 5, SGL: []SGE{b.sge(0, 100)}})
		a.postSend(t, SendWR{WRID: 1, Opcode: WRSend, SGL: []SGE{a.sge(0, 100)}, Flags: SendSignaled})
		n.pump()
		n.clk.Advance(AckTimeout(14))
		n.pump()
		expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpSend, ByteLen: 100})
		expectWC(t, pollAll(b.rcq), cq.WC{WRID: 5, Opcode: cq.OpRecv, ByteLen: 100}) // once
		if s := b.cnt.Snapshot(); s.DuplicateRequest != 1 {
			t.Fatalf("duplicate_request %d", s.DuplicateRequest)
		}
	})
	t.Run("READ response lost, resumed", func(t *testing.T) {
		n, a, b := rcPair(t, connOpts{mtu: MTU256, retry: 3})
		n.filter = dropNth(b, 3, any)
		b.fill(dstOff, 256*8, 9)
		a.postSend(t, SendWR{WRID: 1, Opcode: WRRDMARead, SGL: sgl(a, 0, 256*8, 3), Flags: SendSignaled,
			RemoteAddr: b.va(dstOff), RKey: b.mr.RKey()})
		n.pump()
		expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpRDMARead, ByteLen: 2048})
		eq(t, "read", a.buf[:2048], b.buf[dstOff:dstOff+2048])
	})
	t.Run("READ last response lost, timeout", func(t *testing.T) {
		n, a, b := rcPair(t, connOpts{mtu: MTU256, retry: 3})
		n.filter = dropNth(b, 8, any)
		b.fill(dstOff, 256*8, 9)
		a.postSend(t, SendWR{WRID: 1, Opcode: WRRDMARead, SGL: sgl(a, 0, 256*8, 3), Flags: SendSignaled,
			RemoteAddr: b.va(dstOff), RKey: b.mr.RKey()})
		n.pump()
		expectWC(t, pollAll(a.scq))
		n.clk.Advance(AckTimeout(14))
		n.pump()
		expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpRDMARead, ByteLen: 2048})
		eq(t, "read", a.buf[:2048], b.buf[dstOff:dstOff+2048])
	})
	t.Run("atomic ACK lost, replayed not re-executed", func(t *testing.T) {
		n, a, b := rcPair(t, connOpts{retry: 3})
		n.filter = dropNth(b, 1, any)
		binary.LittleEndian.PutUint64(b.buf[8:], 10)
		a.postSend(t, SendWR{WRID: 1, Opcode: WRAtomicFetchAndAdd, SGL: []SGE{a.sge(0, 8)}, Flags: SendSignaled,
			RemoteAddr: b.va(8), RKey: b.mr.RKey(), CompareAdd: 5})
		n.pump()
		n.clk.Advance(AckTimeout(14))
		n.pump()
		expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpFetchAdd, ByteLen: 8})
		if got := binary.LittleEndian.Uint64(a.buf[0:]); got != 10 {
			t.Fatalf("returned %d", got)
		}
		if got := binary.LittleEndian.Uint64(b.buf[8:]); got != 15 {
			t.Fatalf("remote %d, want 15 (executed once)", got)
		}
	})
}

// TestRetryExceeded: with every packet lost the WQE completes with
// RETRY_EXC_ERR after exactly retry_cnt retries; 7 is not infinite.
func TestRetryExceeded(t *testing.T) {
	for _, retry := range []uint8{0, 3, 7} {
		n, a, b := rcPair(t, connOpts{retry: retry, timeout: 8})
		n.filter = func(s *side, _ *link.Datagram, _ *bth.Packet) bool { return s != a }
		a.postSend(t, SendWR{WRID: 1, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 8)}, Flags: SendSignaled,
			RemoteAddr: b.va(0), RKey: b.mr.RKey()},
			SendWR{WRID: 2, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 8)}, RemoteAddr: b.va(0), RKey: b.mr.RKey()})
		for i := 0; i < int(retry); i++ {
			n.clk.Advance(AckTimeout(8))
			n.pump()
			if got := pollAll(a.scq); len(got) != 0 {
				t.Fatalf("retry %d: early completion %+v", i, got)
			}
		}
		n.clk.Advance(AckTimeout(8))
		n.pump()
		expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Status: cq.StatusRetryExcErr, Opcode: cq.OpRDMAWrite},
			cq.WC{WRID: 2, Status: cq.StatusWRFlushErr, Opcode: cq.OpRDMAWrite})
		s := a.cnt.Snapshot()
		if s.RetryExceededErr != 1 || s.CompleterRetryErr != uint64(retry) {
			t.Fatalf("retry %d: counters %+v", retry, s)
		}
		if n.clk.Pending() != 0 {
			t.Fatalf("timer still armed in ERR")
		}
	}
}

// TestRNR: a SEND with no receive posted draws an RNR NAK; the requester
// waits the RNR timer and retries; when a receive appears it succeeds.
// With rnr_retry exhausted the WQE fails with RNR_RETRY_EXC_ERR.
func TestRNR(t *testing.T) {
	const code = 14 // 1.28 ms
	t.Run("recovers", func(t *testing.T) {
		n, a, b := rcPair(t, connOpts{minRNR: code, rnrRetry: 3})
		a.fill(0, 3000, 4)
		a.postSend(t, SendWR{WRID: 1, Opcode: WRSend, SGL: []SGE{a.sge(0, 3000)}, Flags: SendSignaled})
		n.pump()
		if s := b.cnt.Snapshot(); s.SendRNRErr != 1 {
			t.Fatalf("send_rnr_err %d", s.SendRNRErr)
		}
		n.clk.Advance(bth.RNRTimer(code))
		n.pump()
		if s := a.cnt.Snapshot(); s.RcvdRNRErr != 2 {
			t.Fatalf("rcvd_rnr_err %d", s.RcvdRNRErr)
		}
		b.postRecv(t, RecvWR{WRID: 2, SGL: []SGE{b.sge(dstOff, 4000)}})
		n.clk.Advance(bth.RNRTimer(code) - time.Microsecond)
		n.pump()
		expectWC(t, pollAll(a.scq))
		n.clk.Advance(time.Microsecond)
		n.pump()
		expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpSend, ByteLen: 3000})
		expectWC(t, pollAll(b.rcq), cq.WC{WRID: 2, Opcode: cq.OpRecv, ByteLen: 3000})
		eq(t, "send", b.buf[dstOff:dstOff+3000], a.buf[:3000])
	})
	t.Run("exhausted", func(t *testing.T) {
		n, a, _ := rcPair(t, connOpts{minRNR: code, rnrRetry: 1})
		a.postSend(t, SendWR{WRID: 1, Opcode: WRSend, SGL: []SGE{a.sge(0, 10)}})
		n.pump()
		n.clk.Advance(bth.RNRTimer(code))
		n.pump()
		expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Status: cq.StatusRNRRetryExcErr, Opcode: cq.OpSend})
		if s := a.cnt.Snapshot(); s.RetryRNRExceededErr != 1 {
			t.Fatalf("retry_rnr_exceeded_err %d", s.RetryRNRExceededErr)
		}
	})
	t.Run("write with imm", func(t *testing.T) {
		n, a, b := rcPair(t, connOpts{minRNR: code, rnrRetry: 7, mtu: MTU256})
		a.fill(0, 1000, 5)
		a.postSend(t, SendWR{WRID: 1, Opcode: WRRDMAWriteWithImm, SGL: []SGE{a.sge(0, 1000)}, Flags: SendSignaled,
			Imm: 42, RemoteAddr: b.va(dstOff), RKey: b.mr.RKey()})
		n.pump()
		for i := 0; i < 10; i++ { // 7 = infinite
			n.clk.Advance(bth.RNRTimer(code))
			n.pump()
		}
		expectWC(t, pollAll(a.scq))
		b.postRecv(t, RecvWR{WRID: 3})
		n.clk.Advance(bth.RNRTimer(code))
		n.pump()
		expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpRDMAWrite, ByteLen: 1000})
		expectWC(t, pollAll(b.rcq), cq.WC{WRID: 3, Opcode: cq.OpRecvRDMAWithImm, ByteLen: 1000, ImmData: 42, Flags: cq.FlagWithImm})
		eq(t, "write", b.buf[dstOff:dstOff+1000], a.buf[:1000])
	})
}

// TestFenceAndRDAtomicLimit: with max_rd_atomic 1 a second READ waits for
// the first; a fenced WRITE waits for the READ before it.
func TestFenceAndRDAtomicLimit(t *testing.T) {
	n, a, b := rcPair(t, connOpts{rdAtomic: 1})
	var reads, beforeRead int
	readDone := false
	n.filter = func(s *side, _ *link.Datagram, p *bth.Packet) bool {
		if s == a {
			switch p.BTH.Opcode() {
			case bth.OpRCReadRequest:
				reads++
			case bth.OpRCWriteOnly:
				if !readDone {
					beforeRead++
				}
			}
		}
		if s == b && p.BTH.Opcode() == bth.OpRCReadRespOnly {
			readDone = reads == 2
		}
		return true
	}
	a.postSend(t,
		SendWR{WRID: 1, Opcode: WRRDMARead, SGL: []SGE{a.sge(0, 64)}, RemoteAddr: b.va(0), RKey: b.mr.RKey()},
		SendWR{WRID: 2, Opcode: WRRDMARead, SGL: []SGE{a.sge(64, 64)}, RemoteAddr: b.va(0), RKey: b.mr.RKey()},
		SendWR{WRID: 3, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 64)}, Flags: SendFence | SendSignaled,
			RemoteAddr: b.va(128), RKey: b.mr.RKey()})
	if len(a.out.q) != 1 {
		t.Fatalf("sent %d packets before any response, want 1 (max_rd_atomic 1)", len(a.out.q))
	}
	n.pump()
	if beforeRead != 0 {
		t.Fatal("fenced WRITE sent before the READ completed")
	}
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 3, Opcode: cq.OpRDMAWrite, ByteLen: 64})
}
