package qp

import (
	"errors"
	"net/netip"
	"sync"
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/event"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
)

// Tests of the engine's side of the write responder protocol (writes.go): a fake
// WriteResponder stands in for the link's XDP program (pkg/link/xdpwrite_linux.go), with
// the same semantics as its state word (expected PSN, MSN, paused).

// fakeWriteState is an in-memory WriteState: the program executes a WRITE only when not
// paused and only at the expected PSN, advancing the PSN and the MSN (24 bits, IBTA 9.7.5.1.1).
type fakeWriteState struct {
	mu             sync.Mutex
	info           WriteQPInfo
	epsn, msn      uint32
	paused         bool
	executed       uint64
	pauses         int
	resumes        int
	detached       bool
	pausedAtDetach bool
	lateResume     bool // Resume after DetachWrites (the real state then stays paused)
}

func (s *fakeWriteState) Pause() (epsn, msn uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.paused = true
	s.pauses++
	return s.epsn, s.msn
}

func (s *fakeWriteState) Resume(epsn, msn uint32, paused bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.detached {
		s.lateResume = true
		return
	}
	s.epsn, s.msn, s.paused = epsn&bth.PSNMask, msn&bth.PSNMask, paused
	s.resumes++
}

func (s *fakeWriteState) Executed() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.executed
}

// execute simulates the program executing n WRITEs at the expected PSN; it stops at a pause.
// It returns how many it executed.
func (s *fakeWriteState) execute(n int) int {
	k := 0
	for ; k < n; k++ {
		s.mu.Lock()
		ok := !s.paused && !s.detached
		if ok {
			s.advanceLocked()
		}
		s.mu.Unlock()
		if !ok {
			break
		}
	}
	return k
}

// claim executes the WRITE at psn if the program may (not paused, psn expected); it returns the
// MSN its ACK carries.
func (s *fakeWriteState) claim(psn bth.PSN) (msn uint32, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.paused || s.detached || uint32(psn) != s.epsn {
		return 0, false
	}
	s.advanceLocked()
	return s.msn, true
}

func (s *fakeWriteState) advanceLocked() {
	s.epsn = (s.epsn + 1) & bth.PSNMask
	s.msn = (s.msn + 1) & bth.PSNMask
	s.executed++
}

// snapshot returns the published state.
func (s *fakeWriteState) snapshot() (epsn, msn uint32, paused bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.epsn, s.msn, s.paused
}

// fakeWrites is the WriteResponder: it records every attach and detach.
type fakeWrites struct {
	mu       sync.Mutex
	err      error // AttachWrites fails with it
	attaches []*fakeWriteState
	detaches []*fakeWriteState
}

func (f *fakeWrites) AttachWrites(w WriteQPInfo) (WriteState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	// paused until the QP publishes its state, like AddWriteQP with paused set
	s := &fakeWriteState{info: w, paused: true}
	f.attaches = append(f.attaches, s)
	return s, nil
}

func (f *fakeWrites) DetachWrites(s WriteState) {
	fs := s.(*fakeWriteState)
	fs.mu.Lock()
	fs.pausedAtDetach = fs.paused
	fs.detached = true
	fs.mu.Unlock()
	f.mu.Lock()
	f.detaches = append(f.detaches, fs)
	f.mu.Unlock()
}

func (f *fakeWrites) counts() (attaches, detaches int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.attaches), len(f.detaches)
}

// cur is the last attached state (nil before any).
func (f *fakeWrites) cur() *fakeWriteState {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.attaches) == 0 {
		return nil
	}
	return f.attaches[len(f.attaches)-1]
}

// portOut is an Output whose SourcePort is not the entropy itself, so the tests see that the
// write responder gets the port the QP's packets use (Output.SourcePort), not the entropy.
type portOut struct{ *chanOut }

func (p portOut) SourcePort(_ netip.Addr, entropy uint16) uint16 { return entropy ^ 0x0A5A | 0xC000 }

// wenv is a requester a and a responder b whose QP has the fake write responder.
type wenv struct {
	t    *testing.T
	n    *net
	a, b *side
	fw   *fakeWrites
	psn  bth.PSN // b's RQPSN (a's first PSN)
	// mu serializes the program's ACKs with the test's reading of them (TestWritesRace)
	mu   sync.Mutex
	acks []link.Datagram
	// wire logs, in order, what left b: the engine's packets when its Output sends them, the
	// program's ACKs when it executes (XDP_TX)
	wire []wirePkt
}

// wirePkt is one packet b put on the wire.
type wirePkt struct {
	program bool // the program's ACK (else the engine's)
	op      bth.Opcode
	psn     bth.PSN
}

// wireOut is b's Output: it logs what the engine sends in e.wire.
type wireOut struct {
	portOut
	e *wenv
}

func (w wireOut) Send(batch []link.Datagram) error {
	w.e.mu.Lock()
	for i := range batch {
		p, err := bth.Parse(batch[i].Buf)
		if err != nil {
			w.e.t.Errorf("engine sent an unparsable packet: %v", err)
			continue
		}
		w.e.wire = append(w.e.wire, wirePkt{op: p.BTH.Opcode(), psn: p.BTH.PSN()})
	}
	w.e.mu.Unlock()
	return w.portOut.Send(batch)
}

// writesPSN is b's RQPSN: near the 24-bit wrap, so the PSNs and the fake wrap during tests.
const writesPSN = 0xFFFFFE

func newWEnv(t *testing.T) *wenv { return newWEnvOpts(t, wenvOpts{}) }

// wenvOpts vary newWEnv's b.
type wenvOpts struct {
	events  event.Sink // b's affiliated events
	rtrOnly bool       // b only to RTR (a in RTS)
}

func newWEnvOpts(t *testing.T, o wenvOpts) *wenv {
	e := &wenv{t: t, n: newNet(t), fw: &fakeWrites{}, psn: writesPSN}
	e.a = e.n.newSide("10.0.0.1", sideOpts{qpn: 0x11, bufSize: 1 << 20})
	e.b = e.n.newSide("10.0.0.2", sideOpts{qpn: 0x12, bufSize: 1 << 20, events: o.events,
		out: func(c *chanOut) Output { return wireOut{portOut{c}, e} }})
	e.b.qp.cfg.Writes = e.fw
	co := connOpts{mtu: MTU1024, psnA: writesPSN, psnB: 77}
	if !o.rtrOnly {
		e.n.connect(e.a, e.b, co)
		return e
	}
	all := mr.AccessLocalWrite | mr.AccessRemoteWrite | mr.AccessRemoteRead | mr.AccessRemoteAtomic
	e.n.bringUp(e.a, e.b, all, co.psnB, co.psnA, co, false)
	for _, m := range []struct {
		a    Attr
		mask AttrMask
	}{
		{Attr{State: StateInit, Port: 1, AccessFlags: all}, AttrState | AttrPKeyIndex | AttrPort | AttrAccessFlags},
		{Attr{State: StateRTR, AH: AHAttr{DGID: e.a.addr, Port: 1}, PathMTU: MTU1024, DestQPN: e.a.qp.Num(),
			RQPSN: writesPSN, MaxDestRDAtomic: 16},
			AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRDAtomic | AttrMinRNRTimer},
	} {
		if err := e.b.qp.Modify(&m.a, m.mask); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// program plays the XDP program for the requests a queued: a WRITE Only of 1..64 bytes (no
// immediate) the fake can claim is placed into b's buffer and answered with the ACK built from
// the attach template; every other request goes to b's QP, as the link hands it to user space.
// It returns how many the fake executed; the ACKs wait in e.acks (deliverAcks).
func (e *wenv) program() int {
	q := e.a.out.q
	e.a.out.q = nil
	k := 0
	for i := range q {
		d := &q[i]
		if e.claim(d) {
			k++
			continue
		}
		e.n.deliver(e.a, d)
	}
	return k
}

// claim executes d in the fake if it can.
func (e *wenv) claim(d *link.Datagram) bool {
	p, err := bth.Parse(d.Buf)
	if err != nil {
		e.t.Errorf("parse: %v", err)
		return false
	}
	s := e.fw.cur()
	if s == nil || p.BTH.Opcode() != bth.OpRCWriteOnly || len(p.Payload) == 0 || len(p.Payload) > 64 ||
		p.BTH.DestQP() != s.info.QPN {
		return false
	}
	msn, ok := s.claim(p.BTH.PSN())
	if !ok {
		return false
	}
	off := p.RETH.VA() - e.b.mr.IOVA()
	copy(e.b.buf[off:], p.Payload)
	ack := make([]byte, 16+bth.ICRCSize)
	copy(ack, s.info.ACK[:])
	bth.BTH(ack).SetPSN(p.BTH.PSN())
	bth.AETH(ack[bth.BTHSize:]).SetMSN(msn)
	a := link.Datagram{Buf: ack, Src: netip.AddrPortFrom(s.info.Local, s.info.SrcPort),
		Dst: netip.AddrPortFrom(s.info.Peer, s.info.DstPort)}
	reencode(&a)
	e.mu.Lock()
	e.acks = append(e.acks, a)
	e.wire = append(e.wire, wirePkt{program: true, op: bth.OpRCAck, psn: p.BTH.PSN()})
	e.mu.Unlock()
	return true
}

// deliverAcks hands the program's ACKs to a (ICRC checked), then pumps.
func (e *wenv) deliverAcks() {
	e.mu.Lock()
	q := e.acks
	e.acks = nil
	e.mu.Unlock()
	for i := range q {
		e.n.deliver(e.b, &q[i])
	}
	e.n.pump()
}

// write posts a signaled RDMA WRITE of n bytes from a's offset off to b's offset off.
func (e *wenv) write(wrid uint64, off, n int) {
	e.t.Helper()
	e.a.postSend(e.t, SendWR{WRID: wrid, Opcode: WRRDMAWrite, SGL: []SGE{e.a.sge(off, n)}, Flags: SendSignaled,
		RemoteAddr: e.b.va(off), RKey: e.b.mr.RKey()})
}

// wantState checks the fake's published state.
func (e *wenv) wantState(what string, epsn bth.PSN, msn uint32, paused bool) {
	e.t.Helper()
	s := e.fw.cur()
	if s == nil {
		e.t.Fatalf("%s: not attached", what)
	}
	ge, gm, gp := s.snapshot()
	if ge != uint32(epsn) || gm != msn || gp != paused {
		e.t.Fatalf("%s: published ePSN %#x MSN %d paused %v, want ePSN %#x MSN %d paused %v",
			what, ge, gm, gp, uint32(epsn), msn, paused)
	}
}

// ackOf is a parsed acknowledge b sent.
type ackOf struct {
	op     bth.Opcode
	psn    bth.PSN
	typ    bth.AckType
	value  uint8
	msn    uint32
	sport  uint16
	header [16]byte // BTH + AETH as sent
}

// bAcks parses what b queued (without taking it).
func (e *wenv) bAcks() []ackOf {
	e.t.Helper()
	var out []ackOf
	for _, d := range e.b.out.q {
		p, err := bth.Parse(d.Buf)
		if err != nil {
			e.t.Fatal(err)
		}
		a := ackOf{op: p.BTH.Opcode(), psn: p.BTH.PSN(), sport: d.Src.Port()}
		if p.AETH != nil {
			f := p.AETH.Fields()
			a.typ, a.value, a.msn = bth.SyndromeType(f.Syndrome), bth.SyndromeValue(f.Syndrome), f.MSN
		}
		copy(a.header[:], d.Buf)
		out = append(out, a)
	}
	return out
}

// wantAck checks that b queued exactly one acknowledge, of type typ (value for NAKs), PSN and MSN.
func (e *wenv) wantAck(what string, typ bth.AckType, value uint8, psn bth.PSN, msn uint32) ackOf {
	e.t.Helper()
	got := e.bAcks()
	if len(got) != 1 {
		e.t.Fatalf("%s: b sent %d packets %+v, want one acknowledge", what, len(got), got)
	}
	g := got[0]
	if g.op != bth.OpRCAck || g.typ != typ || g.psn != psn || g.msn != msn || (typ != bth.AckTypeACK && g.value != value) {
		e.t.Fatalf("%s: got %v %v/%d PSN %#x MSN %d, want %v/%d PSN %#x MSN %d",
			what, g.op, g.typ, g.value, uint32(g.psn), g.msn, typ, value, uint32(psn), msn)
	}
	return g
}

func (e *wenv) wantWCs(n int) {
	e.t.Helper()
	wcs := pollAll(e.a.scq)
	if len(wcs) != n {
		e.t.Fatalf("a: %d completions %+v, want %d", len(wcs), wcs, n)
	}
	for _, w := range wcs {
		if w.Status != cq.StatusSuccess {
			e.t.Fatalf("a: completion %+v", w)
		}
	}
}

// TestWritesAttach: an RC QP allowing remote writes is attached when it reaches RTR, once, with
// its QPN, the peer's, its PD, its path and ports and the ACK its own responder sends (PSN and
// MSN 0), and its state is published unpaused at the RQPSN; UC, UD, a QP without remote
// write access, no Config.Writes and a responder that refuses leave the QP on its own.
func TestWritesAttach(t *testing.T) {
	t.Run("rc", func(t *testing.T) {
		n := newNet(t)
		fw := &fakeWrites{}
		a := n.newSide("10.0.0.1", sideOpts{qpn: 0x11})
		b := n.newSide("10.0.0.2", sideOpts{qpn: 0x12, out: func(c *chanOut) Output { return portOut{c} }})
		b.qp.cfg.Writes = fw
		must := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
		}
		all := mr.AccessLocalWrite | mr.AccessRemoteWrite
		must(b.qp.Modify(&Attr{State: StateInit, Port: 1, AccessFlags: all}, AttrState|AttrPKeyIndex|AttrPort|AttrAccessFlags))
		if at, _ := fw.counts(); at != 0 {
			t.Fatalf("attached in INIT (%d)", at)
		}
		must(b.qp.Modify(&Attr{State: StateRTR, AH: AHAttr{DGID: a.addr, Port: 1}, PathMTU: MTU1024,
			DestQPN: a.qp.Num(), RQPSN: 0x123456, MaxDestRDAtomic: 4},
			AttrState|AttrAV|AttrPathMTU|AttrDestQPN|AttrRQPSN|AttrMaxDestRDAtomic|AttrMinRNRTimer))
		if at, dt := fw.counts(); at != 1 || dt != 0 {
			t.Fatalf("at RTR: %d attaches %d detaches, want 1, 0", at, dt)
		}
		s := fw.cur()
		epsn, msn, paused := s.snapshot()
		// paused in RTR until the first request reaches the engine (it raises CommEst, IBTA
		// 11.6.3, which the program cannot)
		if epsn != 0x123456 || msn != 0 || !paused {
			t.Fatalf("at RTR: published ePSN %#x MSN %d paused %v, want 0x123456 0 true", epsn, msn, paused)
		}
		w := s.info
		if w.QPN != 0x12 || w.DestQPN != a.qp.Num() || w.PD != b.pd.Handle() || w.Local != b.addr || w.Peer != a.addr ||
			w.DstPort != bth.UDPPort {
			t.Fatalf("WriteQPInfo %+v: want QPN 0x12 DestQPN %#x PD %d Local %v Peer %v DstPort 4791",
				w, a.qp.Num(), b.pd.Handle(), b.addr, a.addr)
		}
		if want := bth.SourcePort(0x12, a.qp.Num()) ^ 0x0A5A | 0xC000; w.SrcPort != want {
			t.Fatalf("SrcPort %d, want the Output's %d", w.SrcPort, want)
		}
		var ack [16]byte
		bth.BTH(ack[:]).Encode(&bth.BTHFields{Opcode: bth.OpRCAck, PKey: 0xFFFF, DestQP: a.qp.Num()})
		bth.AETH(ack[bth.BTHSize:]).Encode(&bth.AETHFields{Syndrome: bth.SyndromeACK(0x1F)})
		if w.ACK != ack {
			t.Fatalf("ACK template % x, want % x", w.ACK, ack)
		}
		must(b.qp.Modify(&Attr{State: StateRTS, SQPSN: 5, Timeout: 14, MaxRDAtomic: 4},
			AttrState|AttrSQPSN|AttrTimeout|AttrRetryCnt|AttrRNRRetry|AttrMaxQPRDAtomic))
		if at, dt := fw.counts(); at != 1 || dt != 0 {
			t.Fatalf("at RTS: %d attaches %d detaches, want 1, 0", at, dt)
		}
		epsn, _, paused = s.snapshot()
		if epsn != 0x123456 || paused {
			t.Fatalf("at RTS: ePSN %#x paused %v", epsn, paused)
		}
	})
	t.Run("template-matches-own-ack", func(t *testing.T) {
		// the template is the QP's own ACK with PSN and MSN 0, and its port is the ACK's
		e := newWEnv(t)
		e.a.fill(0, 100, 1)
		e.write(1, 0, 100)
		e.n.deliver(e.a, &e.a.out.q[0])
		e.a.out.q = nil
		g := e.wantAck("own ACK", bth.AckTypeACK, 0, e.psn, 1)
		hdr := g.header
		bth.BTH(hdr[:]).SetPSN(0)
		bth.AETH(hdr[bth.BTHSize:]).SetMSN(0)
		if info := e.fw.cur().info; hdr != info.ACK || g.sport != info.SrcPort {
			t.Fatalf("QP's ACK (PSN, MSN zeroed) % x from port %d; template % x port %d",
				hdr, g.sport, info.ACK, info.SrcPort)
		}
	})
	for _, tc := range []struct {
		name   string
		typ    Type
		access mr.Access
		writes func() *fakeWrites
	}{
		{"uc", TypeUC, 0, func() *fakeWrites { return &fakeWrites{} }},
		{"no-remote-write", TypeRC, mr.AccessLocalWrite | mr.AccessRemoteRead | mr.AccessRemoteAtomic,
			func() *fakeWrites { return &fakeWrites{} }},
		{"nil-writes", TypeRC, 0, func() *fakeWrites { return nil }},
		{"refused", TypeRC, 0, func() *fakeWrites { return &fakeWrites{err: errors.New("no slot")} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNet(t)
			a := n.newSide("10.0.0.1", sideOpts{typ: tc.typ, qpn: 0x11})
			b := n.newSide("10.0.0.2", sideOpts{typ: tc.typ, qpn: 0x12})
			fw := tc.writes()
			if fw != nil {
				b.qp.cfg.Writes = fw
			}
			n.connect(a, b, connOpts{mtu: MTU1024, accessB: tc.access})
			if fw != nil {
				if at, _ := fw.counts(); at != 0 && fw.err == nil {
					t.Fatalf("%d attaches", at)
				}
			}
			if b.qp.wo != nil {
				t.Fatal("QP holds a write state")
			}
			// the QP works on its own
			a.postRecv(t, RecvWR{WRID: 1, SGL: []SGE{a.sge(0, 64)}})
			b.postRecv(t, RecvWR{WRID: 1, SGL: []SGE{b.sge(0, 64)}})
			a.postSend(t, SendWR{WRID: 2, Opcode: WRSend, SGL: []SGE{a.sge(0, 8)}, Flags: SendSignaled})
			n.pump()
			if wcs := pollAll(b.rcq); len(wcs) != 1 || wcs[0].Status != cq.StatusSuccess {
				t.Fatalf("b's receive: %+v", wcs)
			}
		})
	}
	t.Run("ud", func(t *testing.T) {
		n := newNet(t)
		fw := &fakeWrites{}
		b := n.newSide("10.0.0.2", sideOpts{typ: TypeUD, qpn: 0x12})
		b.qp.cfg.Writes = fw
		for _, m := range []struct {
			a    Attr
			mask AttrMask
		}{
			{Attr{State: StateInit, Port: 1, QKey: 7}, AttrState | AttrPKeyIndex | AttrPort | AttrQKey},
			{Attr{State: StateRTR}, AttrState},
			{Attr{State: StateRTS, SQPSN: 1}, AttrState | AttrSQPSN},
		} {
			if err := b.qp.Modify(&m.a, m.mask); err != nil {
				t.Fatal(err)
			}
		}
		if at, _ := fw.counts(); at != 0 || b.qp.wo != nil {
			t.Fatalf("UD QP attached (%d)", at)
		}
	})
}

// TestWritesAdoptExecuted: after the program executed k WRITEs, a request at the new expected
// PSN that the QP handles (a 100-byte WRITE, then a SEND) is executed: the QP adopted the PSN
// and MSN (its ACK carries PSN ePSN and MSN adopted+1) and publishes the state back advanced and
// unpaused. The program's ACKs (from the template) complete the requester's WRITEs.
func TestWritesAdoptExecuted(t *testing.T) {
	e := newWEnv(t)
	e.a.fill(0, 4096, 3)
	const k = 3
	for i := 0; i < k; i++ {
		e.write(uint64(i), i*64, 8)
	}
	if got := e.program(); got != k {
		t.Fatalf("program executed %d, want %d", got, k)
	}
	if len(e.b.out.q) != 0 {
		t.Fatalf("the QP answered requests the program executed: %+v", e.bAcks())
	}
	e.wantState("after the program", e.psn.Add(k), k, false)
	if got := e.b.qp.RemoteWrites(); got != k {
		t.Fatalf("RemoteWrites %d, want %d", got, k)
	}
	e.deliverAcks()
	e.wantWCs(k)

	e.write(10, 1024, 100)
	if got := e.program(); got != 0 {
		t.Fatalf("program took a 100-byte WRITE")
	}
	e.wantAck("100-byte WRITE", bth.AckTypeACK, 0, e.psn.Add(k), k+1)
	e.wantState("after the QP's WRITE", e.psn.Add(k+1), k+1, false)
	e.n.pump()
	e.wantWCs(1)

	e.b.postRecv(e.t, RecvWR{WRID: 5, SGL: []SGE{e.b.sge(8192, 64)}})
	e.a.postSend(e.t, SendWR{WRID: 11, Opcode: WRSend, SGL: []SGE{e.a.sge(2048, 8)}, Flags: SendSignaled})
	if got := e.program(); got != 0 {
		t.Fatalf("program took a SEND")
	}
	e.wantAck("SEND", bth.AckTypeACK, 0, e.psn.Add(k+1), k+2)
	e.wantState("after the QP's SEND", e.psn.Add(k+2), k+2, false)
	e.n.pump()
	e.wantWCs(1)

	// and the program goes on from there
	e.write(12, 3072, 16)
	if got := e.program(); got != 1 {
		t.Fatalf("program executed %d after the QP's requests, want 1", got)
	}
	e.wantState("after the program again", e.psn.Add(k+3), k+3, false)
	e.deliverAcks()
	e.wantWCs(1)

	for _, r := range [][2]int{{0, 8}, {64, 72}, {128, 136}, {1024, 1124}, {3072, 3088}} {
		eq(t, "placed", e.b.buf[r[0]:r[1]], e.a.buf[r[0]:r[1]])
	}
	eq(t, "received", e.b.buf[8192:8200], e.a.buf[2048:2056])
	if got := e.b.qp.RemoteWrites(); got != k+2 {
		t.Fatalf("RemoteWrites %d, want %d (program %d + QP 1)", got, k+2, k+1)
	}
	if c := e.fw.cur(); c.Executed() != k+1 {
		t.Fatalf("program Executed %d", c.Executed())
	}
}

// TestWritesDuplicateOfExecuted: a retransmission of a WRITE the program executed reaches the QP
// as a duplicate: re-ACKed with ePSN-1 and the adopted MSN (IBTA C9-105), memory not written
// again, the state unchanged and unpaused.
func TestWritesDuplicateOfExecuted(t *testing.T) {
	e := newWEnv(t)
	e.a.fill(0, 256, 9)
	e.write(1, 0, 32)
	e.write(2, 64, 32)
	dup := append([]byte(nil), e.a.out.q[0].Buf...)
	first := e.a.out.q[0]
	if got := e.program(); got != 2 {
		t.Fatalf("program executed %d, want 2", got)
	}
	e.deliverAcks()
	e.wantWCs(2)
	// the retransmission carries other bytes: had the QP executed it, memory would change
	d := link.Datagram{Buf: dup, Src: first.Src, Dst: first.Dst}
	p, err := bth.Parse(d.Buf)
	if err != nil {
		t.Fatal(err)
	}
	for i := range p.Payload {
		p.Payload[i] ^= 0xFF
	}
	reencode(&d)
	before := append([]byte(nil), e.b.buf[:256]...)
	dups := e.b.cnt.DuplicateRequest.Load()
	e.n.deliver(e.a, &d)
	e.wantAck("duplicate", bth.AckTypeACK, 0, e.psn.Add(1), 2)
	eq(t, "memory after the duplicate", e.b.buf[:256], before)
	if got := e.b.cnt.DuplicateRequest.Load() - dups; got != 1 {
		t.Fatalf("DuplicateRequest moved by %d", got)
	}
	e.wantState("after the duplicate", e.psn.Add(2), 2, false)
	if got := e.b.qp.RemoteWrites(); got != 2 {
		t.Fatalf("RemoteWrites %d, want 2", got)
	}
}

// TestWritesPausedWhileNotAtRest: the state is published paused while the responder is not at
// rest — a PSN sequence NAK outstanding (until the in-sequence retransmission), a multi-packet
// WRITE in progress (until its Last), an RNR NAK outstanding — and the program executes
// nothing meanwhile.
func TestWritesPausedWhileNotAtRest(t *testing.T) {
	t.Run("psn-gap", func(t *testing.T) {
		e := newWEnv(t)
		e.a.fill(0, 1024, 5)
		e.write(1, 0, 8)
		e.write(2, 64, 8)
		e.write(3, 128, 8)
		q := e.a.out.q
		e.a.out.q = nil
		e.n.deliver(e.a, &q[1]) // the first is lost
		e.wantAck("gap", bth.AckTypeNAK, bth.NAKPSNSeqErr, e.psn, 0)
		e.b.out.q = nil
		e.wantState("after the NAK", e.psn, 0, true)
		if got := e.fw.cur().execute(1); got != 0 {
			t.Fatal("the program executed while the NAK is outstanding")
		}
		e.n.deliver(e.a, &q[2]) // still ahead: silent (one NAK per gap)
		if len(e.b.out.q) != 0 {
			t.Fatalf("second NAK: %+v", e.bAcks())
		}
		e.wantState("after another packet past the gap", e.psn, 0, true)
		e.n.deliver(e.a, &q[0]) // the requester resends from the expected PSN
		e.wantAck("in-sequence resend", bth.AckTypeACK, 0, e.psn, 1)
		e.wantState("after the resend", e.psn.Add(1), 1, false)
		e.b.out.q = nil
		// the program takes the rest of the resent run
		for i := 1; i < 3; i++ {
			if !e.claim(&q[i]) {
				t.Fatalf("program did not take PSN %#x", uint32(e.psn.Add(uint32(i))))
			}
		}
		e.wantState("after the program", e.psn.Add(3), 3, false)
	})
	t.Run("multi-packet", func(t *testing.T) {
		e := newWEnv(t)
		e.a.fill(0, 3000, 6)
		e.write(1, 0, 3000) // First, Middle, Last at MTU 1024
		q := e.a.out.q
		e.a.out.q = nil
		if len(q) != 3 {
			t.Fatalf("%d packets", len(q))
		}
		for i := 0; i < 2; i++ {
			e.n.deliver(e.a, &q[i])
			e.wantState("inside the message", e.psn.Add(uint32(i+1)), 0, true)
			if got := e.fw.cur().execute(1); got != 0 {
				t.Fatal("the program executed inside a multi-packet WRITE")
			}
		}
		e.n.deliver(e.a, &q[2])
		e.wantState("after the Last", e.psn.Add(3), 1, false)
		e.wantAck("Last", bth.AckTypeACK, 0, e.psn.Add(2), 1)
		eq(t, "placed", e.b.buf[:3000], e.a.buf[:3000])
	})
	t.Run("rnr", func(t *testing.T) {
		e := newWEnv(t)
		e.a.postSend(t, SendWR{WRID: 1, Opcode: WRSend, SGL: []SGE{e.a.sge(0, 8)}, Flags: SendSignaled})
		q := e.a.out.q
		e.a.out.q = nil
		e.n.deliver(e.a, &q[0]) // no receive posted
		e.wantAck("SEND without a receive", bth.AckTypeRNR, 0, e.psn, 0)
		e.b.out.q = nil
		e.wantState("after the RNR NAK", e.psn, 0, true)
		e.b.postRecv(t, RecvWR{WRID: 2, SGL: []SGE{e.b.sge(0, 64)}})
		e.n.deliver(e.a, &q[0]) // the resend after the RNR timer
		e.wantAck("resent SEND", bth.AckTypeACK, 0, e.psn, 1)
		e.wantState("after the resend", e.psn.Add(1), 1, false)
	})
}

// TestWritesDetach: RemoteWrites counts the QP's WRITEs and the program's, also after a detach;
// a transition to ERR, RESET and Destroy detach once, the program paused first; RESET zeroes
// RemoteWrites; the QP attaches again at its next RTR.
func TestWritesDetach(t *testing.T) {
	t.Run("err-reset-reattach", func(t *testing.T) {
		e := newWEnv(t)
		e.a.fill(0, 1024, 2)
		e.write(1, 0, 8)
		e.write(2, 64, 8)
		e.write(3, 128, 200)
		if got := e.program(); got != 2 {
			t.Fatalf("program executed %d", got)
		}
		s := e.fw.cur()
		if got := e.b.qp.RemoteWrites(); got != 3 {
			t.Fatalf("RemoteWrites %d, want 2 + 1", got)
		}
		// the program executes one more the QP has not seen before the transition
		e.write(4, 256, 8)
		if got := e.program(); got != 1 {
			t.Fatalf("program executed %d", got)
		}
		if err := e.b.qp.Modify(&Attr{State: StateErr}, AttrState); err != nil {
			t.Fatal(err)
		}
		if at, dt := e.fw.counts(); at != 1 || dt != 1 || e.fw.detaches[0] != s {
			t.Fatalf("after ERR: %d attaches %d detaches", at, dt)
		}
		s.mu.Lock()
		pausedAt := s.pausedAtDetach
		s.mu.Unlock()
		if !pausedAt {
			t.Fatal("detached without pausing first")
		}
		if e.b.qp.resp.epsn != e.psn.Add(4) || e.b.qp.resp.msn != 4 {
			t.Fatalf("QP did not adopt at detach: ePSN %#x MSN %d", uint32(e.b.qp.resp.epsn), e.b.qp.resp.msn)
		}
		if got := e.b.qp.RemoteWrites(); got != 4 {
			t.Fatalf("RemoteWrites after detach %d, want 4", got)
		}
		if err := e.b.qp.Modify(&Attr{State: StateReset}, AttrState); err != nil {
			t.Fatal(err)
		}
		if _, dt := e.fw.counts(); dt != 1 {
			t.Fatalf("RESET after ERR detached again (%d)", dt)
		}
		if got := e.b.qp.RemoteWrites(); got != 0 {
			t.Fatalf("RemoteWrites after RESET %d", got)
		}
		// attach again: a fresh connection from a new a
		e.a.qp.Destroy()
		a2 := e.n.newSide("10.0.0.3", sideOpts{qpn: 0x21, bufSize: 1 << 20})
		e.a = a2
		e.n.connect(a2, e.b, connOpts{mtu: MTU1024, psnA: 500, psnB: 9})
		e.psn = 500
		if at, _ := e.fw.counts(); at != 2 {
			t.Fatalf("attaches after the second RTR: %d", at)
		}
		if c := e.fw.cur(); c == s || c.info.Peer != a2.addr || c.info.DestQPN != 0x21 {
			t.Fatalf("re-attached with %+v", c.info)
		}
		e.wantState("re-attached", 500, 0, false)
		a2.fill(0, 64, 4)
		e.write(5, 0, 8)
		if got := e.program(); got != 1 {
			t.Fatalf("program executed %d after re-attach", got)
		}
		e.deliverAcks()
		e.wantWCs(1)
		if got := e.b.qp.RemoteWrites(); got != 1 {
			t.Fatalf("RemoteWrites after re-attach %d, want 1", got)
		}
		s.mu.Lock()
		late := s.lateResume
		s.mu.Unlock()
		if late {
			t.Fatal("the old state was resumed after its detach")
		}
	})
	t.Run("reset-from-rts", func(t *testing.T) {
		e := newWEnv(t)
		e.write(1, 0, 8)
		e.program()
		s := e.fw.cur()
		if err := e.b.qp.Modify(&Attr{State: StateReset}, AttrState); err != nil {
			t.Fatal(err)
		}
		if at, dt := e.fw.counts(); at != 1 || dt != 1 || !s.pausedAtDetach {
			t.Fatalf("RESET: %d attaches %d detaches, paused first %v", at, dt, s.pausedAtDetach)
		}
		if got := e.b.qp.RemoteWrites(); got != 0 {
			t.Fatalf("RemoteWrites after RESET %d", got)
		}
	})
	t.Run("destroy", func(t *testing.T) {
		e := newWEnv(t)
		e.write(1, 0, 8)
		e.program()
		s := e.fw.cur()
		e.b.qp.Destroy()
		if at, dt := e.fw.counts(); at != 1 || dt != 1 || !s.pausedAtDetach {
			t.Fatalf("Destroy: %d attaches %d detaches, paused first %v", at, dt, s.pausedAtDetach)
		}
		e.b.qp.Destroy()
		if _, dt := e.fw.counts(); dt != 1 {
			t.Fatalf("second Destroy detached again (%d)", dt)
		}
		if got := e.b.qp.RemoteWrites(); got != 1 {
			t.Fatalf("RemoteWrites after Destroy %d, want 1", got)
		}
	})
	t.Run("request-error", func(t *testing.T) {
		// a request error inside the responder (ERR) detaches; nothing is published after
		e := newWEnv(t)
		e.write(1, 0, 8)
		e.program()
		s := e.fw.cur()
		e.a.postSend(t, SendWR{WRID: 2, Opcode: WRRDMAWrite, SGL: []SGE{e.a.sge(0, 100)}, Flags: SendSignaled,
			RemoteAddr: e.b.va(0), RKey: e.b.mr.RKey() ^ 0x80})
		e.program()
		e.wantAck("bad R_Key", bth.AckTypeNAK, bth.NAKRemoteAccessErr, e.psn.Add(1), 1)
		if _, dt := e.fw.counts(); dt != 1 || !s.pausedAtDetach || s.lateResume {
			t.Fatalf("%d detaches, paused first %v, resumed after %v", dt, s.pausedAtDetach, s.lateResume)
		}
	})
}

// TestWritesModifyKeepsExecuted: a Modify of an attached QP (RTS to RTS, or one that fails)
// republishes what the program advanced to, not the QP's older state: after it, the program
// goes on and the QP's next request is ACKed in sequence.
func TestWritesModifyKeepsExecuted(t *testing.T) {
	for _, tc := range []struct {
		name string
		a    Attr
		mask AttrMask
		fail bool
	}{
		{"rts-rts", Attr{State: StateRTS, MinRNRTimer: 3}, AttrState | AttrMinRNRTimer, false},
		{"failed", Attr{State: StateRTR}, AttrState, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newWEnv(t)
			e.write(1, 0, 8)
			e.write(2, 64, 8)
			if got := e.program(); got != 2 {
				t.Fatalf("program executed %d", got)
			}
			err := e.b.qp.Modify(&tc.a, tc.mask)
			if (err != nil) != tc.fail {
				t.Fatalf("Modify: %v", err)
			}
			e.wantState("after Modify", e.psn.Add(2), 2, false)
			e.write(3, 128, 8)
			if got := e.program(); got != 1 {
				t.Fatalf("program executed %d after Modify, want 1", got)
			}
			e.write(4, 256, 100)
			e.program()
			e.wantAck("QP's WRITE", bth.AckTypeACK, 0, e.psn.Add(3), 4)
		})
	}
}

// TestWritesRace runs the program and the QP's receive on two goroutines, as the XDP program
// and the device's receive loop: each request is executed once, in order, by one of the two,
// whatever the interleaving, and RemoteWrites ends at the number of WRITEs. Run with -race.
func TestWritesRace(t *testing.T) {
	e := newWEnv(t)
	const msgs = 120
	e.a.fill(0, msgs*128, 8)
	nw := 0
	for i := 0; i < msgs; i++ {
		switch {
		case i%10 == 9:
			e.b.postRecv(t, RecvWR{WRID: uint64(i), SGL: []SGE{e.b.sge(1<<19+i*128, 128)}})
			e.a.postSend(t, SendWR{WRID: uint64(i), Opcode: WRSend, SGL: []SGE{e.a.sge(i*128, 32)}, Flags: SendSignaled})
		case i%3 == 2:
			e.write(uint64(i), i*128, 100) // the QP's
			nw++
		default:
			e.write(uint64(i), i*128, 1+i%64)
			nw++
		}
	}
	q := e.a.out.q
	e.a.out.q = nil
	if len(q) != msgs {
		t.Fatalf("%d packets", len(q))
	}
	toQP := make(chan *link.Datagram, msgs)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the device's receive loop
		defer wg.Done()
		for d := range toQP {
			p, err := bth.Parse(d.Buf)
			if err != nil {
				t.Error(err)
				return
			}
			e.b.qp.Receive(e.n.clk.Now(), &p, d.Src, d.Dst)
			_ = e.b.qp.RemoteWrites()
		}
	}()
	taken := 0
	for i := range q { // the program, in arrival order
		if e.claim(&q[i]) {
			taken++
		} else {
			toQP <- &q[i]
		}
		_ = e.b.qp.RemoteWrites()
	}
	close(toQP)
	wg.Wait()
	if taken == 0 {
		t.Fatal("the program executed nothing")
	}
	for _, a := range e.bAcks() {
		if a.typ != bth.AckTypeACK {
			t.Fatalf("the QP sent %v/%d PSN %#x", a.typ, a.value, uint32(a.psn))
		}
	}
	e.wantState("at the end", e.psn.Add(msgs), msgs, false)
	if got := e.b.qp.RemoteWrites(); got != uint64(nw) {
		t.Fatalf("RemoteWrites %d, want %d (program %d)", got, nw, taken)
	}
	e.deliverAcks()
	e.wantWCs(msgs)
	for i := 0; i < msgs; i++ {
		if i%10 == 9 {
			continue
		}
		n := 100
		if i%3 != 2 {
			n = 1 + i%64
		}
		eq(t, "WRITE data", e.b.buf[i*128:i*128+n], e.a.buf[i*128:i*128+n])
	}
	t.Logf("program executed %d of %d WRITEs", taken, nw)
}

// receiveDeferred hands d to b's QP with ReceiveDeferred (no flush), as the device's batched
// receive loop and the polled device do.
func (e *wenv) receiveDeferred(d *link.Datagram) {
	e.t.Helper()
	p, err := bth.Parse(d.Buf)
	if err != nil {
		e.t.Fatal(err)
	}
	if !e.b.qp.ReceiveDeferred(e.n.clk.Now(), &p, d.Src, d.Dst) {
		e.t.Fatalf("b dropped PSN %#x", uint32(p.BTH.PSN()))
	}
}

// wireLog returns what b put on the wire so far and clears the log.
func (e *wenv) wireLog() []wirePkt {
	e.mu.Lock()
	defer e.mu.Unlock()
	w := e.wire
	e.wire = nil
	return w
}

// TestWritesPausedUntilFlushed: responses the engine built but has not sent yet (a deferred
// receive: ReceiveDeferred before FlushReceived or FlushDeferred) keep the program paused: the
// state is published with the advanced PSN and MSN but paused, the program executes nothing and
// leaves the next WRITE to the QP (whose ACK queues behind the response); the flush sends them
// and unpauses the state. So on the wire the engine's READ response or ACK precedes every ACK
// the program sends afterwards: responses leave in the order of their requests (IBTA 9.5).
func TestWritesPausedUntilFlushed(t *testing.T) {
	flushReceived := func(e *wenv) { e.b.qp.FlushReceived(e.n.clk.Now()) }
	flushDeferred := func(e *wenv) { e.b.qp.FlushDeferred() }
	for _, tc := range []struct {
		name  string
		read  bool // the engine's request is an RDMA READ of 2000 bytes (else a 100-byte WRITE)
		flush func(e *wenv)
	}{
		{"read/FlushReceived", true, flushReceived},
		{"read/FlushDeferred", true, flushDeferred},
		{"write/FlushReceived", false, flushReceived},
		{"write/FlushDeferred", false, flushDeferred},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newWEnv(t)
			e.a.fill(0, 8192, 7)
			e.b.fill(4096, 2000, 9)
			// the program executes two WRITEs first (the QP adopts them at its request)
			e.write(1, 0, 8)
			e.write(2, 64, 8)
			if got := e.program(); got != 2 {
				t.Fatalf("program executed %d, want 2", got)
			}
			e.deliverAcks()
			e.wantWCs(2)
			e.wireLog()

			// the request the engine answers, then an 8-byte WRITE the program could execute
			npsn := uint32(1)
			if tc.read {
				e.a.postSend(t, SendWR{WRID: 3, Opcode: WRRDMARead, SGL: []SGE{e.a.sge(16384, 2000)},
					Flags: SendSignaled, RemoteAddr: e.b.va(4096), RKey: e.b.mr.RKey()})
				npsn = 2 // READ Response First and Last at MTU 1024
			} else {
				e.write(3, 1024, 100)
			}
			e.write(4, 128, 8)
			q := e.a.out.q
			e.a.out.q = nil
			if len(q) != 2 {
				t.Fatalf("a sent %d packets, want 2", len(q))
			}
			if e.claim(&q[0]) {
				t.Fatal("the program took the engine's request")
			}
			e.receiveDeferred(&q[0])
			if len(e.b.out.q) != 0 {
				t.Fatalf("b sent before the flush: %+v", e.bAcks())
			}
			next := e.psn.Add(2 + npsn)
			e.wantState("response queued, not sent", next, 3, true)
			if got := e.fw.cur().execute(1); got != 0 {
				t.Fatal("the program executed while the engine's response was unsent")
			}
			// the WRITE behind it: the program leaves it to the QP
			if e.claim(&q[1]) {
				t.Fatal("the program executed a WRITE while the engine's response was unsent")
			}
			e.receiveDeferred(&q[1])
			e.wantState("two responses queued", next.Add(1), 4, true)
			if w := e.wireLog(); len(w) != 0 {
				t.Fatalf("on the wire before the flush: %+v", w)
			}

			tc.flush(e)
			e.wantState("after the flush", next.Add(1), 4, false)
			e.write(5, 192, 8)
			if got := e.program(); got != 1 {
				t.Fatalf("program executed %d after the flush, want 1", got)
			}
			e.wantState("after the program", next.Add(2), 5, false)

			var want []wirePkt
			if tc.read {
				want = append(want, wirePkt{op: bth.OpRCReadRespFirst, psn: e.psn.Add(2)},
					wirePkt{op: bth.OpRCReadRespLast, psn: e.psn.Add(3)})
			} else {
				want = append(want, wirePkt{op: bth.OpRCAck, psn: e.psn.Add(2)})
			}
			want = append(want, wirePkt{op: bth.OpRCAck, psn: next},
				wirePkt{program: true, op: bth.OpRCAck, psn: next.Add(1)})
			got := e.wireLog()
			if len(got) != len(want) {
				t.Fatalf("wire %+v, want %+v", got, want)
			}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("wire %+v, want %+v", got, want)
				}
			}

			e.n.pump()
			e.deliverAcks()
			e.wantWCs(3)
			if tc.read {
				eq(t, "READ data", e.a.buf[16384:16384+2000], e.b.buf[4096:4096+2000])
			} else {
				eq(t, "QP's WRITE", e.b.buf[1024:1124], e.a.buf[1024:1124])
			}
			eq(t, "WRITE behind the response", e.b.buf[128:136], e.a.buf[128:136])
			eq(t, "program's WRITE", e.b.buf[192:200], e.a.buf[192:200])
		})
	}
}

// TestWritesCommEstInRTR: a QP attached in RTR is published paused at its RQPSN, since only
// the engine raises the Communication Established event of the first request received in RTR
// (IBTA 11.6.3); the program executes nothing and leaves that request to the QP, which raises
// CommEst (once), ACKs it and publishes the state unpaused: the program executes the next
// WRITE while the QP is still in RTR.
func TestWritesCommEstInRTR(t *testing.T) {
	ev := &evLog{}
	e := newWEnvOpts(t, wenvOpts{events: ev.sink, rtrOnly: true})
	if st := e.b.qp.State(); st != StateRTR {
		t.Fatalf("b in %v", st)
	}
	e.wantState("attached in RTR", e.psn, 0, true)
	if got := e.fw.cur().execute(1); got != 0 {
		t.Fatal("the program executed before communication was established")
	}
	e.a.fill(0, 1024, 4)
	e.write(1, 0, 8)
	e.write(2, 64, 8)
	q := e.a.out.q
	e.a.out.q = nil
	sameEvents(t, "b before any request", ev.types())
	if e.claim(&q[0]) {
		t.Fatal("the program executed the first request in RTR")
	}
	e.n.deliver(e.a, &q[0])
	sameEvents(t, "b after the first request", ev.types(), event.CommEst)
	e.wantAck("first request", bth.AckTypeACK, 0, e.psn, 1)
	e.wantState("after the first request", e.psn.Add(1), 1, false)
	if !e.claim(&q[1]) {
		t.Fatal("the program did not execute the second WRITE")
	}
	e.wantState("after the program", e.psn.Add(2), 2, false)
	if st := e.b.qp.State(); st != StateRTR {
		t.Fatalf("b in %v, want RTR", st)
	}
	sameEvents(t, "b at the end", ev.types(), event.CommEst)
	e.n.pump()
	e.deliverAcks()
	e.wantWCs(2)
	eq(t, "QP's WRITE", e.b.buf[0:8], e.a.buf[0:8])
	eq(t, "program's WRITE", e.b.buf[64:72], e.a.buf[64:72])
	if got := e.b.qp.RemoteWrites(); got != 2 {
		t.Fatalf("RemoteWrites %d, want 2", got)
	}
}
