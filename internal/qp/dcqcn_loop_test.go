package qp

import (
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cc"
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
