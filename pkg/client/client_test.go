package client

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/internal/daemontest"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/roce"
)

func serve(t *testing.T, l link.Link) string {
	dev, err := roce.Open(roce.Options{Link: l})
	if err != nil {
		t.Fatal(err)
	}
	sock, _ := daemontest.Serve(t, dev)
	return sock
}

type side struct {
	c   *Conn
	cq  *cqc
	q   *qpc
	m   roce.MemoryRegion
	buf []byte
	// rqPSN is the receive PSN rts starts the QP at (0 unless a test sets it)
	rqPSN uint32
}

func open(t *testing.T, sock string, depth uint32) *side {
	s, _ := openCQs(t, sock, depth, 64, 0)
	return s
}

// openCQs is open with the QP's send CQ of sendCQE entries and a receive CQ of its own of
// recvCQE (0: the send CQ receives too), which it returns besides.
func openCQs(t *testing.T, sock string, depth uint32, sendCQE, recvCQE int) (*side, *cqc) {
	c, err := Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	pd, err := c.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	x, err := c.CreateCQ(sendCQE)
	if err != nil {
		t.Fatal(err)
	}
	y := x
	if recvCQE > 0 {
		if y, err = c.CreateCQ(recvCQE); err != nil {
			t.Fatal(err)
		}
	}
	buf, _ := c.AllocBuffer(1 << 16)
	m, err := c.RegMR(pd, buf, 0, mr.AccessLocalWrite|mr.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	q, err := c.CreateQP(roce.VerbsQPInit{Type: qp.TypeRC, PD: pd, SendCQ: x, RecvCQ: y,
		Cap: qp.Cap{MaxSendWR: depth, MaxRecvWR: depth, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	return &side{c: c, cq: x.(*cqc), q: q.(*qpc), m: m, buf: buf}, y.(*cqc)
}

func (s *side) waitWC(t *testing.T) cq.WC {
	wc := make([]cq.WC, 1)
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	for {
		if s.cq.Poll(wc) == 1 {
			return wc[0]
		}
		s.cq.ReqNotify(false)
		if s.cq.Poll(wc) == 1 {
			return wc[0]
		}
		select {
		case <-s.cq.Channel():
		case <-timer.C:
			t.Fatal("no completion")
		}
	}
}

func (s *side) rts(t *testing.T, peer netip.Addr, qpn uint32, timeout uint8) {
	mods := []struct {
		a qp.Attr
		m qp.AttrMask
	}{
		{qp.Attr{State: qp.StateInit, Port: 1, AccessFlags: mr.AccessRemoteWrite}, qp.AttrState | qp.AttrPKeyIndex | qp.AttrPort | qp.AttrAccessFlags},
		{qp.Attr{State: qp.StateRTR, AH: qp.AHAttr{DGID: peer, SGIDIndex: 1}, PathMTU: qp.MTU1024, DestQPN: qpn, RQPSN: s.rqPSN, MaxDestRDAtomic: 1, MinRNRTimer: 1},
			qp.AttrState | qp.AttrAV | qp.AttrPathMTU | qp.AttrDestQPN | qp.AttrRQPSN | qp.AttrMaxDestRDAtomic | qp.AttrMinRNRTimer},
		{qp.Attr{State: qp.StateRTS, Timeout: timeout, RetryCnt: 7, RNRRetry: 7, MaxRDAtomic: 1},
			qp.AttrState | qp.AttrSQPSN | qp.AttrTimeout | qp.AttrRetryCnt | qp.AttrRNRRetry | qp.AttrMaxQPRDAtomic},
	}
	for _, m := range mods {
		if err := s.q.Modify(&m.a, m.m); err != nil {
			t.Fatal(err)
		}
	}
}

// TestResetCleansCQ: a QP moved to RESET takes its unpolled completions out of its CQ (IBTA
// 10.3.1), and another QP's on the same CQ stay, in order; the QP's outstanding counts are 0.
func TestResetCleansCQ(t *testing.T) {
	l, _ := mem.NewNetwork(mem.Options{}).Attach(netip.MustParseAddr("10.8.0.1"))
	s := open(t, serve(t, l), 4)
	pd, err := s.c.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	x, err := s.c.CreateQP(roce.VerbsQPInit{Type: qp.TypeRC, PD: pd, SendCQ: s.cq, RecvCQ: s.cq,
		Cap: qp.Cap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	other := x.(*qpc)
	init := qp.Attr{State: qp.StateInit, Port: 1}
	for _, q := range []*qpc{s.q, other} {
		if err := q.Modify(&init, qp.AttrState|qp.AttrPKeyIndex|qp.AttrPort|qp.AttrAccessFlags); err != nil {
			t.Fatal(err)
		}
	}
	// Interleaved receives of both QPs, flushed by ERR: the CQ holds s.q's, other's, s.q's.
	recv := func(q *qpc, id uint64) {
		t.Helper()
		if _, err := q.PostRecv([]qp.RecvWR{{WRID: id}}); err != nil {
			t.Fatal(err)
		}
	}
	errState := qp.Attr{State: qp.StateErr}
	recv(s.q, 1)
	recv(s.q, 2)
	recv(other, 10)
	recv(other, 11)
	if err := s.q.Modify(&errState, qp.AttrState); err != nil {
		t.Fatal(err)
	}
	if err := other.Modify(&errState, qp.AttrState); err != nil {
		t.Fatal(err)
	}
	// Wait until all four are in the ring (the flushes are delivered asynchronously): each
	// arm fires at the next completion.
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	for s.cq.ring.Tail()-s.cq.head < 4 {
		s.cq.ReqNotify(false)
		if s.cq.ring.Tail()-s.cq.head >= 4 {
			break
		}
		select {
		case <-s.cq.Channel():
		case <-timer.C:
			t.Fatalf("%d completions in the ring, want 4", s.cq.ring.Tail()-s.cq.head)
		}
	}
	if err := s.q.Modify(&qp.Attr{State: qp.StateReset}, qp.AttrState); err != nil {
		t.Fatal(err)
	}
	wcs := make([]cq.WC, 8)
	n := s.cq.Poll(wcs)
	if n != 2 || wcs[0].WRID != 10 || wcs[1].WRID != 11 || wcs[0].QPNum != other.num {
		t.Fatalf("after RESET polled %d: %+v", n, wcs[:n])
	}
	if s.q.sqOut.Load() != 0 || s.q.rqOut.Load() != 0 {
		t.Fatalf("counts after RESET: send %d recv %d", s.q.sqOut.Load(), s.q.rqOut.Load())
	}
}

// TestAsyncPostRefused: a post the client believed valid but the engine
// refuses (here: the QP is in RESET, with the client's state forced) still
// yields one completion per WR, LOC_QP_OP_ERR with the error's code.
func TestAsyncPostRefused(t *testing.T) {
	l, _ := mem.NewNetwork(mem.Options{}).Attach(netip.MustParseAddr("10.8.0.1"))
	s := open(t, serve(t, l), 8)
	s.q.sendOK.Store(true) // pretend: the client thinks the QP is in RTS
	wrs := []qp.SendWR{
		{WRID: 1, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled, SGL: []qp.SGE{{Addr: 0, Length: 8, LKey: s.m.LKey()}}, RKey: 1},
		{WRID: 2, Opcode: qp.WRSend, Flags: qp.SendSignaled, SGL: []qp.SGE{{Addr: 0, Length: 8, LKey: s.m.LKey()}}},
	}
	if n, err := s.q.PostSend(wrs); n != 2 || err != nil {
		t.Fatalf("async post: %d %v", n, err)
	}
	for i, want := range []struct {
		id uint64
		op cq.Opcode
	}{{1, cq.OpRDMAWrite}, {2, cq.OpSend}} {
		wc := s.waitWC(t)
		if wc.WRID != want.id || wc.Opcode != want.op || wc.Status != cq.StatusLocQPOpErr ||
			!errors.Is(proto.ErrorFrom(0, wire.Code(wc.VendorErr), ""), qp.ErrInvalidState) {
			t.Fatalf("completion %d: %+v", i, wc)
		}
	}
	if out := s.q.sqOut.Load(); out != 0 {
		t.Fatalf("outstanding count %d after both completions", out)
	}
	// Without the forced state the post is a round trip and the engine's error is returned.
	s.q.sendOK.Store(false)
	if _, err := s.q.PostSend(wrs); !errors.Is(err, qp.ErrInvalidState) {
		t.Fatalf("synchronous post in RESET: %v", err)
	}
}

// TestAsyncPostCounting: the client posts asynchronously while its count
// of outstanding WRs leaves room, then asks the engine (which reports the
// full queue); unsignaled WRs switch sends to synchronous posts.
func TestAsyncPostCounting(t *testing.T) {
	nw := mem.NewNetwork(mem.Options{})
	la, _ := nw.Attach(netip.MustParseAddr("10.8.0.1"))
	lb, _ := nw.Attach(netip.MustParseAddr("10.8.0.2"))
	a := open(t, serve(t, la), 4)
	b := open(t, serve(t, lb), 4)
	// b stays in RESET: a's requests are never acknowledged (timeout 0 = wait forever).
	a.rts(t, netip.MustParseAddr("10.8.0.2"), b.q.Num(), 0)
	if !a.q.sendOK.Load() || !a.q.recvOK.Load() {
		t.Fatal("RTS did not enable asynchronous posts")
	}
	w := qp.SendWR{Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled, SGL: []qp.SGE{{Addr: 0, Length: 64, LKey: a.m.LKey()}}, RKey: 1}
	for i := 0; i < 4; i++ {
		w.WRID = uint64(i)
		if _, err := a.q.PostSend([]qp.SendWR{w}); err != nil {
			t.Fatal(err)
		}
	}
	if out := a.q.sqOut.Load(); out != 4 {
		t.Fatalf("outstanding %d, want 4", out)
	}
	w.WRID = 4
	if n, err := a.q.PostSend([]qp.SendWR{w}); n != 0 || !errors.Is(err, qp.ErrQueueFull) {
		t.Fatalf("fifth post into a 4-deep queue: %d %v", n, err)
	}
	// Receives: 4 asynchronously, the fifth refused by the engine.
	r := qp.RecvWR{SGL: []qp.SGE{{Addr: 4096, Length: 64, LKey: a.m.LKey()}}}
	for i := 0; i < 4; i++ {
		if _, err := a.q.PostRecv([]qp.RecvWR{r}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.q.PostRecv([]qp.RecvWR{r}); !errors.Is(err, qp.ErrQueueFull) {
		t.Fatalf("fifth receive: %v", err)
	}
	// Moving to ERR flushes all 8 (one completion each) and the counts return to 0.
	if err := a.q.Modify(&qp.Attr{State: qp.StateErr}, qp.AttrState); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 8; i++ {
		if wc := a.waitWC(t); wc.Status != cq.StatusWRFlushErr {
			t.Fatalf("flush completion %+v", wc)
		}
	}
	if a.q.sqOut.Load() != 0 || a.q.rqOut.Load() != 0 {
		t.Fatalf("counts after the flush: send %d recv %d", a.q.sqOut.Load(), a.q.rqOut.Load())
	}
	if a.q.sendOK.Load() {
		t.Fatal("ERR left asynchronous sends on")
	}
	// An unsignaled WR makes later sends synchronous. a's 4 WRITEs (PSN 0..3, to b while it was
	// in RESET) may still be in b's receive path: b expects PSN 100, so that they are
	// duplicates if they arrive now (re-acknowledged, not executed) — at PSN 0 the first would
	// be executed, fail its R_Key check, and put b in ERR before its move to RTS.
	b.rqPSN = 100
	b.rts(t, netip.MustParseAddr("10.8.0.1"), a.q.Num(), 14)
	w.Flags = 0
	if _, err := b.q.PostSend([]qp.SendWR{w}); err != nil {
		t.Fatal(err)
	}
	if !b.q.unsignaled.Load() {
		t.Fatal("unsignaled WR not noticed")
	}
}
