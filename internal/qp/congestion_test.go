package qp

import (
	"math"
	"net/netip"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cc"
	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
)

// runUntil moves packets, and advances the fake clock by step whenever the network is quiet,
// until done reports true; it fails after limit of fake time. It returns the fake time taken.
func (n *net) runUntil(step, limit time.Duration, done func() bool) time.Duration {
	n.t.Helper()
	start := n.clk.Now()
	for {
		n.pump()
		if done() {
			return n.clk.Now().Sub(start)
		}
		if n.clk.Now().Sub(start) > limit {
			n.t.Fatalf("not done after %v of fake time", limit)
		}
		n.clk.Advance(step)
	}
}

// captureOut records every datagram a side sends (its classes and bytes), then passes it on.
type captureOut struct {
	Output
	seen []link.Datagram
}

func (c *captureOut) Send(batch []link.Datagram) error {
	for _, d := range batch {
		d.Buf = append([]byte(nil), d.Buf...)
		c.seen = append(c.seen, d)
	}
	return c.Output.Send(batch)
}

func captured(n *net, o sideOpts) (sideOpts, **captureOut) {
	var c *captureOut
	o.out = func(ch *chanOut) Output { c = &captureOut{Output: ch}; return c }
	return o, &c
}

// TestECNCapable: an RC QP's requests and ACKs leave ECT(0) with the address vector's DSCP kept
// (IBTA A17.9.1, RFC 3168); READ responses, not paced, keep the address vector's byte; with
// ecn off, everything keeps it; UD keeps it.
func TestECNCapable(t *testing.T) {
	for _, ecn := range []bool{true, false} {
		n := newNet(t)
		p := cc.Defaults()
		p.ECN = ecn
		oa, ca := captured(n, sideOpts{cc: &p})
		ob, cb := captured(n, sideOpts{cc: &p})
		a := n.newSide("198.18.0.1", oa)
		b := n.newSide("198.18.0.2", ob)
		n.connect(a, b, connOpts{tclass: 0xB8})
		a.fill(0, 8192, 3)
		a.postSend(t, SendWR{WRID: 1, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 4096)}, Flags: SendSignaled,
			RemoteAddr: b.va(0), RKey: b.mr.RKey()},
			SendWR{WRID: 2, Opcode: WRRDMARead, SGL: []SGE{a.sge(4096, 4096)}, Flags: SendSignaled,
				RemoteAddr: b.va(0), RKey: b.mr.RKey()})
		n.pump()
		expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpRDMAWrite, ByteLen: 4096},
			cq.WC{WRID: 2, Opcode: cq.OpRDMARead, ByteLen: 4096})
		want := uint8(0xB8)
		if ecn {
			want = 0xB8 | link.ECNECT0
		}
		kinds := map[bth.OpKind]int{}
		for _, d := range append((*ca).seen, (*cb).seen...) {
			k := bth.BTH(d.Buf).Opcode().Info().Kind
			kinds[k]++
			w := want
			if k == bth.KindReadResp {
				w = 0xB8
			}
			if d.TClass != w {
				t.Fatalf("ecn %v: %v sent with TClass %#x, want %#x", ecn, bth.BTH(d.Buf).Opcode(), d.TClass, w)
			}
		}
		if kinds[bth.KindWrite] == 0 || kinds[bth.KindAck] == 0 || kinds[bth.KindReadReq] == 0 || kinds[bth.KindReadResp] == 0 {
			t.Fatalf("ecn %v: packets seen %v", ecn, kinds)
		}
	}
}

// TestNotificationPoint: a CE-marked request makes the responder QP send one CNP to the
// requester's QP (IBTA A17.9.3: opcode 0x81, BECN, P_Key 0xFFFF, DestQP, PSN 0, 16 zero bytes, a
// good ICRC, TOS 0xc2), at most one per np_min_time_between_cnps; none with np off, none for a
// packet whose source is not the QP's peer.
func TestNotificationPoint(t *testing.T) {
	n := newNet(t)
	p := cc.Defaults()
	p.MinTimeBetweenCNPs = 100
	p.Enabled = false // the requester ignores the CNPs here: only the NP is under test
	ob, cb := captured(n, sideOpts{cc: &p})
	a := n.newSide("198.18.0.1", sideOpts{cc: &p})
	b := n.newSide("198.18.0.2", ob)
	n.connect(a, b, connOpts{})
	mark := true
	n.filter = func(from *side, d *link.Datagram, pk *bth.Packet) bool {
		if from == a && mark && pk.Info.Request {
			if d.TClass&link.ECNMask != link.ECNECT0 {
				t.Fatalf("request not ECN-capable: %#x", d.TClass)
			}
			d.TClass |= link.ECNCE // the switch's mark
		}
		return true
	}
	write := func(id uint64) {
		a.postSend(t, SendWR{WRID: id, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 8192)},
			RemoteAddr: b.va(0), RKey: b.mr.RKey()})
		n.pump()
	}
	cnps := func() (out []link.Datagram) {
		for _, d := range (*cb).seen {
			if bth.BTH(d.Buf).Opcode() == bth.OpCNP {
				out = append(out, d)
			}
		}
		return out
	}
	write(1) // 8 marked packets in no time: one CNP
	got := cnps()
	if len(got) != 1 || b.cnt.NPCNPSent.Load() != 1 {
		t.Fatalf("%d CNPs (np_cnp_sent %d) for a burst of marked packets, want 1", len(got), b.cnt.NPCNPSent.Load())
	}
	c := got[0]
	ep := bth.Endpoints{Src: c.Src.Addr(), Dst: c.Dst.Addr(), SrcPort: c.Src.Port(), DstPort: c.Dst.Port()}
	pk, err := bth.Parse(c.Buf)
	if err != nil || len(c.Buf) != bth.CNPSize || !bth.VerifyICRC(&ep, c.Buf) {
		t.Fatalf("CNP %x: %v", c.Buf, err)
	}
	f := pk.BTH.Fields()
	if f != (bth.BTHFields{Opcode: bth.OpCNP, PKey: 0xFFFF, BECN: true, DestQP: a.qp.Num()}) ||
		string(bth.CNP(c.Buf).Reserved()) != string(make([]byte, 16)) {
		t.Fatalf("CNP fields %+v reserved %x", f, bth.CNP(c.Buf).Reserved())
	}
	if c.TClass != 0xC2 || c.Dst.Addr() != a.addr || c.Src.Addr() != b.addr ||
		c.Src.Port() != bth.SourcePort(b.qp.Num(), a.qp.Num()) {
		t.Fatalf("CNP %v -> %v TOS %#x", c.Src, c.Dst, c.TClass)
	}
	if a.cnt.RPCNPIgnored.Load() != 1 {
		t.Fatalf("rp_cnp_ignored %d with DCQCN off", a.cnt.RPCNPIgnored.Load())
	}

	n.clk.Advance(99 * time.Microsecond)
	write(2)
	if len(cnps()) != 1 {
		t.Fatal("a CNP inside np_min_time_between_cnps")
	}
	n.clk.Advance(time.Microsecond)
	write(3)
	if len(cnps()) != 2 {
		t.Fatalf("%d CNPs after the interval, want 2", len(cnps()))
	}
	mark = false
	n.clk.Advance(time.Second)
	write(4)
	if len(cnps()) != 2 {
		t.Fatal("a CNP for unmarked packets")
	}
	// a marked packet from someone else than the peer: no CNP
	n.clk.Advance(time.Second)
	if b.qp.NoteCE(n.clk.Now(), netip.AddrPortFrom(netip.MustParseAddr("198.18.9.9"), 0xC000)) {
		t.Fatal("CNP for a stranger's packet")
	}
	// np off
	q := b.qp
	q.mu.Lock()
	q.cc.p.NPEnabled = false
	q.mu.Unlock()
	mark = true
	write(5)
	if len(cnps()) != 2 {
		t.Fatal("a CNP with np off")
	}
}

// TestReactionPointPaces: a CNP cuts the requester's rate (DCQCN, rp_cnp_handled) and the
// requester then sends at that rate, paced by the QP's timer: a 1 MiB WRITE started at a
// known rate takes the time the cut rate gives, within 5%, with an ACK asked before each pause
// and no retransmission although it takes longer than the ACK timeout.
func TestReactionPointPaces(t *testing.T) {
	n := newNet(t)
	p := cc.Defaults()
	p.RateToSetOnFirstCNP = 200 // Mbit/s: the first cut halves it (α ≈ 1) to about 100
	p.TimeReset = 131071        // no increase during the test (131 ms)
	p.ByteReset = 0
	a := n.newSide("198.18.0.1", sideOpts{cc: &p})
	b := n.newSide("198.18.0.2", sideOpts{cc: &p})
	n.connect(a, b, connOpts{timeout: 12}) // 16.8 ms ACK timeout
	a.qp.ReceiveCNP(n.clk.Now(), from(b))
	st := a.qp.CongestionState()
	wantRate := 200e6 * (1 - 1023.0/1024/2)
	if a.cnt.RPCNPHandled.Load() != 1 || !st.Limited || math.Abs(st.Rate-wantRate) > 1 || st.Pace != st.Rate {
		t.Fatalf("after a CNP: handled %d, state %+v", a.cnt.RPCNPHandled.Load(), st)
	}
	const size = 1 << 20
	a.postSend(t, SendWR{WRID: 1, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, size)}, Flags: SendSignaled,
		RemoteAddr: b.va(0), RKey: b.mr.RKey()})
	took := n.runUntil(50*time.Microsecond, 2*time.Second, func() bool { return a.scq.Len() > 0 })
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpRDMAWrite, ByteLen: size})
	pkts := size / 1024
	wire := float64(pkts * (1024 + bth.BTHSize + bth.ICRCSize + 28 + bth.RETHSize/pkts))
	want := time.Duration(wire * 8 / wantRate * float64(time.Second))
	if d := math.Abs(float64(took-want)) / float64(want); d > 0.05 {
		t.Fatalf("1 MiB at %.1f Mbit/s took %v, want %v (%.1f%% off)", wantRate/1e6, took, want, 100*d)
	}
	if r := a.cnt.RetransPkts.Load() + a.cnt.CompleterRetryErr.Load(); r != 0 {
		t.Fatalf("%d retransmissions/retries while paced", r)
	}
}

// from returns a source address of s (for a CNP given by hand).
func from(s *side) netip.AddrPort { return netip.AddrPortFrom(s.addr, 0xC000) }

// TestRateLimit: AttrRateLimit (ibv_modify_qp_rate_limit, kbit/s) paces the requester; 0
// removes the limit; DCQCN's rate and the limit combine to the lower one.
func TestRateLimit(t *testing.T) {
	n := newNet(t)
	p := cc.Defaults()
	a := n.newSide("198.18.0.1", sideOpts{cc: &p})
	b := n.newSide("198.18.0.2", sideOpts{cc: &p})
	n.connect(a, b, connOpts{})
	if err := a.qp.Modify(&Attr{RateLimit: 10_000}, AttrRateLimit); err != nil {
		t.Fatal(err)
	}
	if st := a.qp.CongestionState(); st.RateLimit != 10e6 || st.Pace != 10e6 || st.Limited {
		t.Fatalf("%+v", st)
	}
	const size = 256 << 10
	write := func(id uint64) time.Duration {
		a.postSend(t, SendWR{WRID: id, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, size)}, Flags: SendSignaled,
			RemoteAddr: b.va(0), RKey: b.mr.RKey()})
		took := n.runUntil(100*time.Microsecond, 2*time.Second, func() bool { return a.scq.Len() > 0 })
		expectWC(t, pollAll(a.scq), cq.WC{WRID: id, Opcode: cq.OpRDMAWrite, ByteLen: size})
		return took
	}
	n.clk.Advance(time.Second) // no credit from the past beyond the tolerance
	took := write(1)
	pkts := size / 1024
	want := time.Duration(float64(pkts*(1024+bth.BTHSize+bth.ICRCSize+28)+bth.RETHSize) * 8 / 10e6 * float64(time.Second))
	if d := math.Abs(float64(took-want)) / float64(want); d > 0.05 {
		t.Fatalf("256 KiB at 10 Mbit/s took %v, want %v", took, want)
	}
	if err := a.qp.Modify(&Attr{RateLimit: 0}, AttrRateLimit); err != nil {
		t.Fatal(err)
	}
	if took := write(2); took != 0 {
		t.Fatalf("unlimited WRITE took %v of fake time", took)
	}
	// QP1 (GSI) takes no rate limit; RC from RTR to RTS does
	if _, err := CheckModify(TypeGSI, StateRTS, &Attr{}, AttrRateLimit, nil); err == nil {
		t.Fatal("GSI accepted a rate limit")
	}
}

// TestCCOff: with cc off a CNP is ignored (rp_cnp_ignored) and nothing is paced.
func TestCCOff(t *testing.T) {
	n := newNet(t)
	p := cc.Defaults()
	if err := p.Parse("off"); err != nil {
		t.Fatal(err)
	}
	a := n.newSide("198.18.0.1", sideOpts{cc: &p})
	b := n.newSide("198.18.0.2", sideOpts{cc: &p})
	n.connect(a, b, connOpts{})
	a.qp.ReceiveCNP(n.clk.Now(), from(b))
	if a.cnt.RPCNPIgnored.Load() != 1 || a.cnt.RPCNPHandled.Load() != 0 || a.qp.CongestionState().Limited {
		t.Fatalf("cc off: handled %d ignored %d", a.cnt.RPCNPHandled.Load(), a.cnt.RPCNPIgnored.Load())
	}
}
