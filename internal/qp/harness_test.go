package qp

import (
	"bytes"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cc"
	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/event"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
)

// chanOut is the channel double for the engine's Output (gVisor
// link/channel style): sent datagrams are copied into a queue that the
// test delivers explicitly with pump, so runs are deterministic.
type chanOut struct {
	q []link.Datagram
}

func (c *chanOut) Send(batch []link.Datagram) error {
	for _, d := range batch {
		d.Buf = append([]byte(nil), d.Buf...)
		c.q = append(c.q, d)
	}
	return nil
}

func (c *chanOut) SourcePort(local netip.Addr, entropy uint16) uint16 { return entropy }

// side is one end: its MR table, PD, CQs, a QP and one registered buffer.
type side struct {
	addr     netip.Addr
	tbl      *mr.Table
	pd       *mr.PD
	scq, rcq *cq.CQ
	qp       *QP
	out      *chanOut
	buf      []byte
	mr       *mr.MR
	mem      *copiedMem // sideOpts.copied: the MR's memory, reached by copies
	cnt      Counters
	sched    bool // the QP asked to be scheduled (bench_test.go's writeStream runs it)
}

// net joins sides on a fake clock. filter may drop (return false) or
// rewrite a datagram before delivery.
type net struct {
	t      testing.TB
	clk    *ManualClock
	sides  []*side
	filter func(from *side, d *link.Datagram, p *bth.Packet) bool
	// delivered counts packets handed to a QP.
	delivered int
	// sched are the QPs whose responder asked to be run (Config.Schedule), in order; pump
	// runs them (RunResponder, ReadBudget) round-robin between deliveries, as a device's
	// responder scheduler does.
	sched []*QP
}

func (n *net) schedule(q *QP) { n.sched = append(n.sched, q) }

// runScheduled gives each scheduled QP one turn; false if none was scheduled.
func (n *net) runScheduled() bool {
	if len(n.sched) == 0 {
		return false
	}
	qs := n.sched
	n.sched = nil
	for _, q := range qs {
		if q.RunResponder(ReadBudget) {
			n.sched = append(n.sched, q)
		}
	}
	return true
}

const bufSize = 4 << 20

func newNet(t testing.TB) *net {
	return &net{t: t, clk: NewManualClock(time.Unix(1000, 0))}
}

type sideOpts struct {
	typ      Type
	qpn      uint32
	cap      Cap
	srq      *SRQ
	access   mr.Access
	mtu      MTU
	cqCap    int
	bufSize  int
	sharedTb *mr.Table
	sharedPD *mr.PD
	// out, if set, makes the QP's Output from the side's channel double
	// (recovery_test.go puts the fault injector in front of it).
	out func(*chanOut) Output
	// events receives the QP's affiliated events.
	events event.Sink
	// cc is the QP's congestion control (nil: the defaults).
	cc *cc.Params
	// copied registers the buffer as copied memory (mr.Memory, RegMemory: every access a copy,
	// as the daemon reaches a client process's memory) instead of mapped memory.
	copied bool
	// budget is the QP's group in-flight budget (budget.go; nil: none).
	budget *Budget
}

func (n *net) newSide(addr string, o sideOpts) *side {
	t := n.t
	s := &side{addr: netip.MustParseAddr(addr), out: &chanOut{}}
	if o.sharedTb != nil {
		s.tbl, s.pd = o.sharedTb, o.sharedPD
	} else {
		s.tbl = mr.NewTable(mr.TableOptions{})
		var err error
		if s.pd, err = s.tbl.AllocPD(); err != nil {
			t.Fatal(err)
		}
	}
	if o.cqCap == 0 {
		o.cqCap = 4096
	}
	var err error
	if s.scq, err = cq.New(cq.Options{Capacity: o.cqCap}); err != nil {
		t.Fatal(err)
	}
	if s.rcq, err = cq.New(cq.Options{Capacity: o.cqCap}); err != nil {
		t.Fatal(err)
	}
	if o.bufSize == 0 {
		o.bufSize = bufSize
	}
	s.buf = make([]byte, o.bufSize)
	if o.access == 0 {
		o.access = mr.AccessLocalWrite | mr.AccessRemoteWrite | mr.AccessRemoteRead | mr.AccessRemoteAtomic
	}
	if o.copied {
		s.mem = &copiedMem{b: s.buf}
		s.mr, err = s.tbl.RegMemory(s.pd, s.mem, uint64(len(s.buf)), 0x10000, o.access)
	} else {
		s.mr, err = s.tbl.RegMR(s.pd, s.buf, 0x10000, o.access)
	}
	if err != nil {
		t.Fatal(err)
	}
	if o.cap.MaxSendWR == 0 {
		o.cap = Cap{MaxSendWR: 256, MaxRecvWR: 256, MaxSendSGE: 8, MaxRecvSGE: 8, MaxInlineData: 256}
	}
	if o.typ == 0 {
		o.typ = TypeRC
	}
	local := s.addr
	var out Output = s.out
	if o.out != nil {
		out = o.out(s.out)
	}
	s.qp, err = New(Config{
		Type: o.typ, QPN: o.qpn, PD: s.pd, MRs: s.tbl, SendCQ: s.scq, RecvCQ: s.rcq, SRQ: o.srq,
		Cap: o.cap, Out: out, Clock: n.clk, Events: o.events, Counters: &s.cnt, MTU: o.mtu,
		Resolve:  func(ah *AHAttr) (Path, error) { return Path{Src: local, Dst: ah.DGID, TClass: ah.TrafficClass}, nil },
		Schedule: n.schedule,
		CC:       o.cc,
		Budget:   o.budget,
	})
	if err != nil {
		t.Fatal(err)
	}
	n.sides = append(n.sides, s)
	return s
}

// connOpts are the RC/UC connection parameters.
type connOpts struct {
	mtu              MTU
	psnA, psnB       uint32
	timeout, retry   uint8
	rnrRetry, minRNR uint8
	rdAtomic         uint8
	// destRDAtomic is both sides' max_dest_rd_atomic (0 = 16).
	destRDAtomic     uint8
	accessA, accessB mr.Access
	// noTimer sets timeout 0 (no ACK timer); timeout 0 above means 14.
	noTimer bool
	// tclass is both address vectors' traffic class.
	tclass uint8
	// srA, srB turn selective repeat on for a's and b's QP (selective.go).
	srA, srB bool
}

func (n *net) connect(a, b *side, o connOpts) {
	if o.mtu == 0 {
		o.mtu = MTU1024
	}
	if o.timeout == 0 {
		o.timeout = 14
	}
	if o.noTimer {
		o.timeout = 0
	}
	if o.rdAtomic == 0 {
		o.rdAtomic = 16
	}
	all := mr.AccessLocalWrite | mr.AccessRemoteWrite | mr.AccessRemoteRead | mr.AccessRemoteAtomic
	if o.accessA == 0 {
		o.accessA = all
	}
	if o.accessB == 0 {
		o.accessB = all
	}
	n.bringUp(a, b, o.accessA, o.psnB, o.psnA, o, o.srA)
	n.bringUp(b, a, o.accessB, o.psnA, o.psnB, o, o.srB)
}

func (n *net) bringUp(s, peer *side, acc mr.Access, rq, sq uint32, o connOpts, sr bool) {
	t := n.t
	t.Helper()
	q := s.qp
	must := func(a *Attr, m AttrMask) {
		t.Helper()
		if err := q.Modify(a, m); err != nil {
			t.Fatal(err)
		}
	}
	must(&Attr{State: StateInit, Port: 1, AccessFlags: acc}, AttrState|AttrPKeyIndex|AttrPort|AttrAccessFlags)
	dest := o.destRDAtomic
	if dest == 0 {
		dest = 16
	}
	m := AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN
	if q.Type() == TypeRC {
		m |= AttrMaxDestRDAtomic | AttrMinRNRTimer
		if sr {
			m |= AttrSelectiveRepeat
		}
	}
	must(&Attr{State: StateRTR, AH: AHAttr{DGID: peer.addr, Port: 1, TrafficClass: o.tclass}, PathMTU: o.mtu,
		DestQPN: peer.qp.Num(), RQPSN: rq, MaxDestRDAtomic: dest, MinRNRTimer: o.minRNR, SelectiveRepeat: sr}, m)
	m = AttrState | AttrSQPSN
	if q.Type() == TypeRC {
		m |= AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRDAtomic
	}
	must(&Attr{State: StateRTS, SQPSN: sq, Timeout: o.timeout, RetryCnt: o.retry, RNRRetry: o.rnrRetry,
		MaxRDAtomic: o.rdAtomic}, m)
}

func (n *net) sideOf(a netip.Addr) *side {
	for _, s := range n.sides {
		if s.addr == a.Unmap() {
			return s
		}
	}
	return nil
}

// pump delivers queued datagrams until every queue is empty (or max
// rounds), verifying the ICRC of each like the device does.
func (n *net) pump() {
	n.t.Helper()
	for round := 0; round < 1_000_000; round++ {
		moved := false
		for _, s := range n.sides {
			q := s.out.q
			s.out.q = nil
			for i := range q {
				moved = true
				n.deliver(s, &q[i])
			}
		}
		if n.runScheduled() {
			moved = true
		}
		if !moved {
			return
		}
	}
	n.t.Fatal("pump: no quiescence")
}

func (n *net) deliver(from *side, d *link.Datagram) {
	t := n.t
	t.Helper()
	ep := bth.Endpoints{Src: d.Src.Addr(), Dst: d.Dst.Addr(), SrcPort: d.Src.Port(), DstPort: d.Dst.Port()}
	if !bth.VerifyICRC(&ep, d.Buf) {
		t.Fatalf("bad ICRC from %v", from.addr)
	}
	p, err := bth.Parse(d.Buf)
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	if n.filter != nil && !n.filter(from, d, &p) {
		return
	}
	to := n.sideOf(d.Dst.Addr())
	if to == nil {
		return
	}
	if p.BTH.DestQP() != to.qp.Num() {
		return
	}
	n.delivered++
	if p.Info.Kind == bth.KindCNP { // as the device dispatches (pkg/roce handleChecked)
		to.qp.ReceiveCNP(n.clk.Now(), d.Src)
		return
	}
	if d.CE() && to.qp.NoteCE(n.clk.Now(), d.Src) {
		to.qp.FlushReceived(n.clk.Now())
	}
	to.qp.Receive(n.clk.Now(), &p, d.Src, d.Dst)
}

// reencode recomputes the ICRC of a datagram after a test rewrote it.
func reencode(d *link.Datagram) {
	ep := bth.Endpoints{Src: d.Src.Addr(), Dst: d.Dst.Addr(), SrcPort: d.Src.Port(), DstPort: d.Dst.Port()}
	bth.SetICRC(d.Buf, bth.ICRC(&ep, d.Buf))
}

func (s *side) va(off int) uint64 { return s.mr.IOVA() + uint64(off) }

func (s *side) sge(off, n int) SGE { return SGE{Addr: s.va(off), Length: uint32(n), LKey: s.mr.LKey()} }

func (s *side) fill(off, n int, seed byte) {
	for i := 0; i < n; i++ {
		s.buf[off+i] = byte(i*7) + seed + byte(i>>8)
	}
}

func pollAll(c *cq.CQ) []cq.WC {
	var out []cq.WC
	buf := make([]cq.WC, 64)
	for {
		k := c.Poll(buf)
		out = append(out, buf[:k]...)
		if k < len(buf) {
			return out
		}
	}
}

func (s *side) postSend(t testing.TB, wrs ...SendWR) {
	t.Helper()
	if n, err := s.qp.PostSend(wrs); err != nil {
		t.Fatalf("PostSend: %d: %v", n, err)
	}
}

func (s *side) postRecv(t testing.TB, wrs ...RecvWR) {
	t.Helper()
	if n, err := s.qp.PostRecv(wrs); err != nil {
		t.Fatalf("PostRecv: %d: %v", n, err)
	}
}

func expectWC(t testing.TB, got []cq.WC, want ...cq.WC) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d completions %+v, want %d %+v", len(got), got, len(want), want)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.WRID != w.WRID || g.Status != w.Status || g.Opcode != w.Opcode || g.ByteLen != w.ByteLen ||
			g.ImmData != w.ImmData || g.Flags != w.Flags || g.InvalidatedRKey != w.InvalidatedRKey ||
			(w.SrcQP != 0 && g.SrcQP != w.SrcQP) || (w.QPNum != 0 && g.QPNum != w.QPNum) {
			t.Fatalf("completion %d: got %+v, want %+v", i, g, w)
		}
	}
}

func eq(t testing.TB, what string, a, b []byte) {
	t.Helper()
	if !bytes.Equal(a, b) {
		i := 0
		for i < len(a) && i < len(b) && a[i] == b[i] {
			i++
		}
		t.Fatalf("%s: data differs at byte %d of %d/%d", what, i, len(a), len(b))
	}
}

// copiedMem is an mr.Memory over a buffer: every access is a copy, as the daemon's view of a
// client process's memory; fail makes every access fail (the memory gone).
type copiedMem struct {
	b      []byte
	fail   atomic.Bool
	copies atomic.Int64
}

func (m *copiedMem) ReadAt(p []byte, off uint64) error {
	if m.fail.Load() || off > uint64(len(m.b)) || uint64(len(p)) > uint64(len(m.b))-off {
		return mr.ErrFault
	}
	m.copies.Add(1)
	copy(p, m.b[off:])
	return nil
}

func (m *copiedMem) WriteAt(p []byte, off uint64) error {
	if m.fail.Load() || off > uint64(len(m.b)) || uint64(len(p)) > uint64(len(m.b))-off {
		return mr.ErrFault
	}
	m.copies.Add(1)
	copy(m.b[off:], p)
	return nil
}
