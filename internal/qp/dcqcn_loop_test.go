package qp

import (
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cc"
	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
)

// TestCNPStreamHoldsRate: a requester that keeps receiving CNPs (one every 4 ms, as a
// notification point facing a queue above its marking threshold sends them) while it streams
// WRITEs is held near DCQCN's minimum: its sending rate over the last 100 ms is a small part of
// the rate it started from.
func TestCNPStreamHoldsRate(t *testing.T) {
	n := newNet(t)
	p := cc.Defaults()
	for _, s := range []string{"rp_clamp_tgt_rate=1", "rp_ai_rate=1", "rp_hai_rate=2", "rp_time_reset=20000", "rp_byte_reset=0", "rp_dce_tcp_g=960",
		"np_min_time_between_cnps=4000", "rp_rate_reduce_monitor_period=1000", "rp_dce_tcp_rtt=4000", "rp_rate_to_set_on_first_cnp=100"} {
		if err := p.Parse(s); err != nil {
			t.Fatal(err)
		}
	}
	a := n.newSide("198.18.0.1", sideOpts{cc: &p, bufSize: 1 << 20})
	b := n.newSide("198.18.0.2", sideOpts{cc: &p, bufSize: 1 << 20})
	n.connect(a, b, connOpts{timeout: 14})
	posted := 0
	post := func() {
		for ; posted-int(a.cnt.SentPkts.Load()/64) < 4 && posted < 10000; posted++ {
			a.postSend(t, SendWR{WRID: uint64(posted), Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 65536)},
				RemoteAddr: b.va(0), RKey: b.mr.RKey()})
		}
	}
	start := n.clk.Now()
	nextCNP := start
	var sent0 uint64
	var mark time.Time
	n.runUntil(50*time.Microsecond, 10*time.Second, func() bool {
		post()
		now := n.clk.Now()
		if !now.Before(nextCNP) {
			a.qp.ReceiveCNP(now, from(b))
			nextCNP = now.Add(4 * time.Millisecond)
		}
		if mark.IsZero() && now.Sub(start) >= 300*time.Millisecond {
			mark, sent0 = now, a.cnt.SentPkts.Load()
		}
		return !mark.IsZero() && now.Sub(mark) >= 100*time.Millisecond
	})
	pkts := a.cnt.SentPkts.Load() - sent0
	rate := float64(pkts) * 1100 * 8 / 0.1
	st := a.qp.CongestionState()
	t.Logf("rate over the last 100 ms %.2f Mbit/s (%d packets), state %+v, CNPs handled %d", rate/1e6, pkts, st, a.cnt.RPCNPHandled.Load())
	if rate > 10e6 {
		t.Fatalf("sending %.1f Mbit/s under a CNP every 4 ms", rate/1e6)
	}
}

// TestPacedRetriesSendTheWindow: a requester paced slower than its ACK timeout towards a peer
// that answers nothing gets each of its retries' worth out of the wire: the ACK timer runs from
// the last request packet the pacer let go, never while the pacer still holds the resend, so
// every try (the first and seven retries, IBTA 9.7.6.1.3) sends the whole message before the
// WRITE ends in RETRY_EXC_ERR. Timed from the last progress alone, the timer expired every 67 ms
// in the middle of a resend and the retries ran out with most of the message never resent.
func TestPacedRetriesSendTheWindow(t *testing.T) {
	n := newNet(t)
	a := n.newSide("198.18.0.1", sideOpts{})
	b := n.newSide("198.18.0.2", sideOpts{})
	n.connect(a, b, connOpts{timeout: 14, retry: 7})                           // 67 ms
	if err := a.qp.Modify(&Attr{RateLimit: 1000}, AttrRateLimit); err != nil { // 1 Mbit/s
		t.Fatal(err)
	}
	n.filter = func(from *side, d *link.Datagram, p *bth.Packet) bool { return from != a } // a silent peer
	const pkts = 16                                                                        // MTU 1024: about 9 ms each at 1 Mbit/s
	a.postSend(t, SendWR{WRID: 1, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, pkts*1024)}, Flags: SendSignaled,
		RemoteAddr: b.va(0), RKey: b.mr.RKey()})
	var wcs []cq.WC
	n.runUntil(time.Millisecond, 60*time.Second, func() bool {
		wcs = append(wcs, pollAll(a.scq)...)
		return len(wcs) > 0
	})
	if wcs[0].Status != cq.StatusRetryExcErr {
		t.Fatalf("completion %+v, want RETRY_EXC_ERR", wcs[0])
	}
	sent := a.cnt.SentPkts.Load()
	t.Logf("%d request packets sent, %d retries", sent, a.cnt.CompleterRetryErr.Load())
	if want := uint64(8 * pkts); sent < want {
		t.Fatalf("%d request packets sent before RETRY_EXC_ERR, want the message 8 times (%d)", sent, want)
	}
}

// TestPacedLateACKAfterRewind: a paced requester whose ACK comes later than its ACK timeout (a
// deep bottleneck queue) goes back N; the first ACK to reach it then, the responder's answer
// to a duplicate (C9-105: the last PSN it executed), acknowledges the whole WRITE while the
// pacer is still resending it. That ACK completes the WRITE, whose every packet was sent
// before the rewind (IBTA 9.7.5.1.1: an ACK acknowledges every request up to its PSN). Taken as
// "everything sent so far" of a WQE being sent, it moved the completion PSN past the WRITE
// without completing it; every later ACK of the same PSN was then old, and each timeout's
// resend was duplicates until RETRY_EXC_ERR.
func TestPacedLateACKAfterRewind(t *testing.T) {
	n := newNet(t)
	a := n.newSide("198.18.0.1", sideOpts{})
	b := n.newSide("198.18.0.2", sideOpts{})
	n.connect(a, b, connOpts{timeout: 14, retry: 7})                           // 67 ms
	if err := a.qp.Modify(&Attr{RateLimit: 1000}, AttrRateLimit); err != nil { // 1 Mbit/s
		t.Fatal(err)
	}
	// b's answers are lost until a's first ACK timeout (they stand for ACKs still queued)
	n.filter = func(from *side, d *link.Datagram, p *bth.Packet) bool {
		return from != b || a.cnt.CompleterRetryErr.Load() > 0
	}
	const pkts = 16 // MTU 1024: about 9 ms each at 1 Mbit/s
	a.postSend(t, SendWR{WRID: 1, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, pkts*1024)}, Flags: SendSignaled,
		RemoteAddr: b.va(0), RKey: b.mr.RKey()})
	var wcs []cq.WC
	n.runUntil(time.Millisecond, 60*time.Second, func() bool {
		wcs = append(wcs, pollAll(a.scq)...)
		return len(wcs) > 0
	})
	retries := a.cnt.CompleterRetryErr.Load()
	t.Logf("completion %v, %d request packets sent, %d retries", wcs[0].Status, a.cnt.SentPkts.Load(), retries)
	if wcs[0].Status != cq.StatusSuccess || retries != 1 {
		t.Fatalf("completion %+v after %d retries, want success after the one timeout", wcs[0], retries)
	}
}
