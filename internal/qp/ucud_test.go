package qp

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/event"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
)

// TestUCLostPacket: UC has no ACKs; a lost middle packet drops that
// message (no completion at the receiver), the receive WQE is reused by
// the next message, and the sender completes both at once.
func TestUCLostPacket(t *testing.T) {
	n := newNet(t)
	a := n.newSide("10.0.0.1", sideOpts{typ: TypeUC, qpn: 0x21})
	b := n.newSide("10.0.0.2", sideOpts{typ: TypeUC, qpn: 0x22})
	n.connect(a, b, connOpts{mtu: MTU256})
	n.filter = dropNth(a, 2, any)
	a.fill(0, 1000, 1)
	a.fill(1000, 300, 2)
	b.postRecv(t, RecvWR{WRID: 1, SGL: []SGE{b.sge(dstOff, 2000)}}, RecvWR{WRID: 2, SGL: []SGE{b.sge(dstOff+2000, 2000)}})
	a.postSend(t, SendWR{WRID: 10, Opcode: WRSend, SGL: []SGE{a.sge(0, 1000)}, Flags: SendSignaled},
		SendWR{WRID: 11, Opcode: WRSendWithImm, SGL: []SGE{a.sge(1000, 300)}, Flags: SendSignaled, Imm: 5})
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 10, Opcode: cq.OpSend, ByteLen: 1000}, cq.WC{WRID: 11, Opcode: cq.OpSend, ByteLen: 300})
	n.pump()
	expectWC(t, pollAll(b.rcq), cq.WC{WRID: 1, Opcode: cq.OpRecv, ByteLen: 300, ImmData: 5, Flags: cq.FlagWithImm})
	eq(t, "second message", b.buf[dstOff:dstOff+300], a.buf[1000:1300])
	// a lost FIRST of a WRITE: the rest of that WRITE is dropped, the next one lands
	n.filter = dropNth(a, 1, any)
	a.fill(0, 600, 3)
	clear(b.buf[dstOff : dstOff+1200])
	a.postSend(t, SendWR{WRID: 12, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 600)}, RemoteAddr: b.va(dstOff), RKey: b.mr.RKey()},
		SendWR{WRID: 13, Opcode: WRRDMAWriteWithImm, SGL: []SGE{a.sge(0, 600)}, Imm: 6, RemoteAddr: b.va(dstOff + 600), RKey: b.mr.RKey()})
	n.pump()
	expectWC(t, pollAll(b.rcq), cq.WC{WRID: 2, Opcode: cq.OpRecvRDMAWithImm, ByteLen: 600, ImmData: 6, Flags: cq.FlagWithImm})
	for _, c := range b.buf[dstOff : dstOff+600] {
		if c != 0 {
			t.Fatal("dropped WRITE placed data")
		}
	}
	eq(t, "second write", b.buf[dstOff+600:dstOff+1200], a.buf[:600])
	if a.qp.State() != StateRTS || b.qp.State() != StateRTS {
		t.Fatal("UC loss changed a QP state")
	}
}

func udUp(t testing.TB, s *side, qkey uint32) {
	t.Helper()
	for _, st := range []struct {
		a Attr
		m AttrMask
	}{
		{Attr{State: StateInit, Port: 1, QKey: qkey}, AttrState | AttrPKeyIndex | AttrPort | AttrQKey},
		{Attr{State: StateRTR}, AttrState},
		{Attr{State: StateRTS, SQPSN: 77}, AttrState | AttrSQPSN},
	} {
		if err := s.qp.Modify(&st.a, st.m); err != nil {
			t.Fatal(err)
		}
	}
}

// TestUD: several peers and address handles; the GRH at the head of the
// receive buffer; src_qp; the Q_Key rule (high bit = the QP's own Q_Key);
// a wrong Q_Key is dropped; a message longer than the MTU is refused.
func TestUD(t *testing.T) {
	n := newNet(t)
	a := n.newSide("10.0.0.1", sideOpts{typ: TypeUD, qpn: 0x31, mtu: MTU1024})
	b := n.newSide("10.0.0.2", sideOpts{typ: TypeUD, qpn: 0x32, mtu: MTU1024})
	c := n.newSide("10.0.0.3", sideOpts{typ: TypeUD, qpn: 0x33, mtu: MTU1024})
	udUp(t, a, 0x1111)
	udUp(t, b, 0x1111)
	udUp(t, c, 0x2222)
	ahB := &AH{AHAttr: AHAttr{DGID: b.addr, Port: 1}, SGID: a.addr}
	ahC := &AH{AHAttr: AHAttr{DGID: c.addr, Port: 1}, SGID: a.addr}
	for _, s := range []*side{b, c} {
		s.postRecv(t, RecvWR{WRID: 1, SGL: []SGE{s.sge(0, 40), s.sge(100, 1024)}}, RecvWR{WRID: 2, SGL: []SGE{s.sge(2000, 2000)}})
	}
	a.fill(0, 1024, 1)
	a.postSend(t,
		SendWR{WRID: 1, Opcode: WRSend, SGL: []SGE{a.sge(0, 1024)}, Flags: SendSignaled, AH: ahB, RemoteQPN: 0x32, RemoteQKey: 0x80000000},
		SendWR{WRID: 2, Opcode: WRSend, SGL: []SGE{a.sge(0, 10)}, Flags: SendSignaled, AH: ahC, RemoteQPN: 0x33, RemoteQKey: 0x80000000}, // 0x1111: dropped
		SendWR{WRID: 3, Opcode: WRSendWithImm, SGL: []SGE{a.sge(0, 500)}, Flags: SendSignaled, AH: ahC, RemoteQPN: 0x33, RemoteQKey: 0x2222, Imm: 9},
		SendWR{WRID: 4, Opcode: WRSend, SGL: []SGE{a.sge(0, 20)}, Flags: SendSignaled, AH: ahB, RemoteQPN: 0x32, RemoteQKey: 0x1234}) // dropped
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpSend, ByteLen: 1024}, cq.WC{WRID: 2, Opcode: cq.OpSend, ByteLen: 10},
		cq.WC{WRID: 3, Opcode: cq.OpSend, ByteLen: 500}, cq.WC{WRID: 4, Opcode: cq.OpSend, ByteLen: 20})
	n.pump()
	expectWC(t, pollAll(b.rcq), cq.WC{WRID: 1, Opcode: cq.OpRecv, ByteLen: 1064, Flags: cq.FlagGRH, SrcQP: 0x31})
	eq(t, "ud payload", b.buf[100:1124], a.buf[:1024])
	grh := b.buf[20:40] // IPv4 header in the last 20 bytes of the GRH
	if grh[0] != 0x45 || netip.AddrFrom4([4]byte(grh[12:16])) != a.addr || netip.AddrFrom4([4]byte(grh[16:20])) != b.addr {
		t.Fatalf("GRH % x", b.buf[:40])
	}
	if l := binary.BigEndian.Uint16(grh[2:]); l != 20+8+12+8+1024+4 {
		t.Fatalf("GRH IPv4 total length %d", l)
	}
	expectWC(t, pollAll(c.rcq), cq.WC{WRID: 1, Opcode: cq.OpRecv, ByteLen: 540, Flags: cq.FlagGRH | cq.FlagWithImm, ImmData: 9, SrcQP: 0x31})
	eq(t, "ud payload c", c.buf[100:600], a.buf[:500])
	// replies from B and C to A with their own AHs
	a.postRecv(t, RecvWR{WRID: 5, SGL: []SGE{a.sge(dstOff, 1100)}}, RecvWR{WRID: 6, SGL: []SGE{a.sge(dstOff+2000, 1100)}})
	b.postSend(t, SendWR{WRID: 7, Opcode: WRSend, SGL: []SGE{b.sge(100, 33)}, AH: &AH{AHAttr: AHAttr{DGID: a.addr}, SGID: b.addr}, RemoteQPN: 0x31, RemoteQKey: 0x1111})
	c.postSend(t, SendWR{WRID: 8, Opcode: WRSend, SGL: []SGE{c.sge(100, 44)}, AH: &AH{AHAttr: AHAttr{DGID: a.addr}, SGID: c.addr}, RemoteQPN: 0x31, RemoteQKey: 0x1111})
	n.pump()
	expectWC(t, pollAll(a.rcq), cq.WC{WRID: 5, Opcode: cq.OpRecv, ByteLen: 73, Flags: cq.FlagGRH, SrcQP: 0x32},
		cq.WC{WRID: 6, Opcode: cq.OpRecv, ByteLen: 84, Flags: cq.FlagGRH, SrcQP: 0x33})
	// longer than the MTU: refused at post
	if _, err := a.qp.PostSend([]SendWR{{Opcode: WRSend, SGL: []SGE{a.sge(0, 1025)}, AH: ahB, RemoteQPN: 0x32}}); err != ErrMsgTooLong {
		t.Fatalf("oversized UD send: %v", err)
	}
	// UD cannot WRITE
	if _, err := a.qp.PostSend([]SendWR{{Opcode: WRRDMAWrite, AH: ahB}}); err == nil {
		t.Fatal("UD WRITE accepted")
	}
	_ = link.MaxDatagram
	_ = bth.UDPPort
}

// TestSRQ: two RC QPs share one SRQ.
func TestSRQ(t *testing.T) {
	n := newNet(t)
	srq, err := NewSRQ(SRQOptions{MaxWR: 8, MaxSGE: 2})
	if err != nil {
		t.Fatal(err)
	}
	a := n.newSide("10.0.0.1", sideOpts{qpn: 0x11})
	c := n.newSide("10.0.0.3", sideOpts{qpn: 0x13})
	b1 := n.newSide("10.0.0.2", sideOpts{qpn: 0x12, srq: srq})
	b2 := n.newSide("10.0.0.4", sideOpts{qpn: 0x14, srq: srq, sharedTb: b1.tbl, sharedPD: b1.pd})
	n.connect(a, b1, connOpts{})
	n.connect(c, b2, connOpts{})
	if _, err := srq.Post([]RecvWR{{WRID: 1, SGL: []SGE{b1.sge(0, 100)}}, {WRID: 2, SGL: []SGE{b1.sge(100, 100)}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b1.qp.PostRecv([]RecvWR{{}}); err != ErrHasSRQ {
		t.Fatalf("PostRecv on an SRQ QP: %v", err)
	}
	a.fill(0, 50, 1)
	c.fill(0, 60, 2)
	a.postSend(t, SendWR{WRID: 1, Opcode: WRSend, SGL: []SGE{a.sge(0, 50)}})
	n.pump()
	c.postSend(t, SendWR{WRID: 1, Opcode: WRSend, SGL: []SGE{c.sge(0, 60)}})
	n.pump()
	expectWC(t, pollAll(b1.rcq), cq.WC{WRID: 1, Opcode: cq.OpRecv, ByteLen: 50})
	expectWC(t, pollAll(b2.rcq), cq.WC{WRID: 2, Opcode: cq.OpRecv, ByteLen: 60})
	eq(t, "srq 1", b1.buf[:50], a.buf[:50])
	eq(t, "srq 2", b1.buf[100:160], c.buf[:60])
}

// TestSendWithInvalidate: SEND_WITH_INV invalidates a fast-registered MR
// at the responder; the completion carries WITH_INV and the key; a later
// WRITE with that key is NAKed remote access error.
func TestSendWithInvalidate(t *testing.T) {
	n, a, b := rcPair(t, connOpts{})
	fr, err := b.tbl.AllocMR(b.pd, mr.AllocMROptions{Buf: make([]byte, 4096)})
	if err != nil {
		t.Fatal(err)
	}
	if err := fr.FastReg(mr.FastRegOptions{IOVA: 0x5000_0000, Length: 4096, Access: mr.AccessLocalWrite | mr.AccessRemoteWrite, Key: 7}); err != nil {
		t.Fatal(err)
	}
	key := fr.RKey()
	a.postSend(t, SendWR{WRID: 1, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 16)}, Flags: SendSignaled, RemoteAddr: 0x5000_0000, RKey: key})
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpRDMAWrite, ByteLen: 16})
	b.postRecv(t, RecvWR{WRID: 2, SGL: []SGE{b.sge(0, 64)}})
	a.postSend(t, SendWR{WRID: 3, Opcode: WRSendWithInv, SGL: []SGE{a.sge(0, 10)}, Flags: SendSignaled, InvRKey: key})
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 3, Opcode: cq.OpSend, ByteLen: 10})
	expectWC(t, pollAll(b.rcq), cq.WC{WRID: 2, Opcode: cq.OpRecv, ByteLen: 10, Flags: cq.FlagWithInv, InvalidatedRKey: key})
	a.postSend(t, SendWR{WRID: 4, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 16)}, Flags: SendSignaled, RemoteAddr: 0x5000_0000, RKey: key})
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 4, Status: cq.StatusRemAccessErr, Opcode: cq.OpRDMAWrite})
}

// TestLocalOps: BIND_MW binds a type 2 window to this QP's peer-facing
// region (remote WRITE through it works), LOCAL_INV of the window's key
// then makes the same WRITE fail with REM_ACCESS_ERR; completions in order.
func TestLocalOps(t *testing.T) {
	n, a, b := rcPair(t, connOpts{})
	// b binds the window on its own QP (the one a's requests arrive on)
	key := bindWindowWR(t, b, mr.MWType2)
	a.fill(0, 100, 7)
	a.postSend(t, SendWR{WRID: 2, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 100)}, Flags: SendSignaled, RemoteAddr: 0x6000_0000, RKey: key})
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 2, Opcode: cq.OpRDMAWrite, ByteLen: 100})
	eq(t, "through window", b.buf[8192:8292], a.buf[:100])
	b.postSend(t, SendWR{WRID: 3, Opcode: WRLocalInv, Flags: SendSignaled, InvRKey: key})
	expectWC(t, pollAll(b.scq), cq.WC{WRID: 3, Opcode: cq.OpLocalInv})
	a.postSend(t, SendWR{WRID: 4, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 100)}, Flags: SendSignaled, RemoteAddr: 0x6000_0000, RKey: key})
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 4, Status: cq.StatusRemAccessErr, Opcode: cq.OpRDMAWrite})
	// a failing LOCAL_INV is a local error: LOC_PROT_ERR, then ERR and flush
	_, c, _ := rcPair(t, connOpts{})
	c.postSend(t, SendWR{WRID: 5, Opcode: WRLocalInv, InvRKey: 0xDEAD00}, SendWR{WRID: 6, Opcode: WRSend})
	expectWC(t, pollAll(c.scq), cq.WC{WRID: 5, Status: cq.StatusLocProtErr, Opcode: cq.OpLocalInv},
		cq.WC{WRID: 6, Status: cq.StatusWRFlushErr, Opcode: cq.OpSend})
}

// bindWindowWR allocates a window of typ in s's PD and binds it with a BIND_MW work request on
// s's QP, with a new key byte, to 4 KiB of a region over s.buf[8192:16384] at 0x6000_0000
// (remote write); it checks the completion and that the window took the WR's key, and returns
// that key.
func bindWindowWR(t *testing.T, s *side, typ mr.MWType) uint32 {
	t.Helper()
	win, err := s.tbl.AllocMW(s.pd, typ)
	if err != nil {
		t.Fatal(err)
	}
	region, err := s.tbl.RegMR(s.pd, s.buf[8192:16384], 0x6000_0000, mr.AccessLocalWrite|mr.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	newKey := win.RKey()&^0xFF | uint32(uint8(win.RKey())+1)
	s.postSend(t, SendWR{WRID: 1, Opcode: WRBindMW, Flags: SendSignaled, Bind: &BindInfo{
		MWRKey: win.RKey(), NewRKey: newKey, MRLKey: region.LKey(), Addr: 0x6000_0000, Length: 4096,
		Access: uint32(mr.AccessRemoteWrite)}})
	expectWC(t, pollAll(s.scq), cq.WC{WRID: 1, Opcode: cq.OpBindMW})
	if win.RKey() != newKey {
		t.Fatalf("window key %#x, want the WR's %#x", win.RKey(), newKey)
	}
	return newKey
}

// TestBindType1WR: a type 1 window bound by a BIND_MW work request takes the WR's new key (the
// library picked it when it posted the bind: ibv_bind_mw returns it), a remote WRITE through
// it lands; a window of another PD is refused with MW_BIND_ERR.
func TestBindType1WR(t *testing.T) {
	n, a, b := rcPair(t, connOpts{})
	newKey := bindWindowWR(t, b, mr.MWType1)
	a.fill(0, 64, 3)
	a.postSend(t, SendWR{WRID: 2, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 64)}, Flags: SendSignaled, RemoteAddr: 0x6000_0010, RKey: newKey})
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 2, Opcode: cq.OpRDMAWrite, ByteLen: 64})
	eq(t, "through type 1 window", b.buf[8192+16:8192+80], a.buf[:64])
	pd2, err := b.tbl.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	other, err := b.tbl.AllocMW(pd2, mr.MWType1)
	if err != nil {
		t.Fatal(err)
	}
	b.postSend(t, SendWR{WRID: 3, Opcode: WRBindMW, Flags: SendSignaled, Bind: &BindInfo{
		MWRKey: other.RKey(), NewRKey: other.RKey() ^ 1}})
	expectWC(t, pollAll(b.scq), cq.WC{WRID: 3, Status: cq.StatusMWBindErr, Opcode: cq.OpBindMW})
}

// TestEvents: COMM_EST when the first request reaches a QP in RTR;
// SQ_DRAINED once SQD has nothing outstanding; SQD holds new WQEs until
// RTS again.
func TestEvents(t *testing.T) {
	n := newNet(t)
	a := n.newSide("10.0.0.1", sideOpts{qpn: 0x11})
	b := n.newSide("10.0.0.2", sideOpts{qpn: 0x12})
	var evs []event.Event
	sink := func(e event.Event) { evs = append(evs, e) }
	a.qp.cfg.Events, b.qp.cfg.Events = sink, sink
	n.bringUp(a, b, mr.AccessRemoteWrite, 0, 0, connOpts{mtu: MTU1024, timeout: 14}, false)
	// b only to RTR
	must := func(q *QP, at Attr, m AttrMask) {
		t.Helper()
		if err := q.Modify(&at, m); err != nil {
			t.Fatal(err)
		}
	}
	must(b.qp, Attr{State: StateInit, Port: 1, AccessFlags: mr.AccessRemoteWrite}, AttrState|AttrPKeyIndex|AttrPort|AttrAccessFlags)
	must(b.qp, Attr{State: StateRTR, AH: AHAttr{DGID: a.addr}, PathMTU: MTU1024, DestQPN: a.qp.Num(), MaxDestRDAtomic: 1},
		AttrState|AttrAV|AttrPathMTU|AttrDestQPN|AttrRQPSN|AttrMaxDestRDAtomic|AttrMinRNRTimer)
	a.postSend(t, SendWR{WRID: 1, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 8)}, Flags: SendSignaled, RemoteAddr: b.va(0), RKey: b.mr.RKey()})
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpRDMAWrite, ByteLen: 8})
	if len(evs) != 1 || evs[0].Type != event.CommEst || evs[0].QPN != b.qp.Num() {
		t.Fatalf("events %+v", evs)
	}
	// SQD: the posted WQE waits; SQ_DRAINED fires at once (nothing outstanding)
	must(a.qp, Attr{State: StateSQD, SQDrainEvent: true}, AttrState|AttrEnSQDAsyncNotify)
	a.postSend(t, SendWR{WRID: 2, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 8)}, Flags: SendSignaled, RemoteAddr: b.va(0), RKey: b.mr.RKey()})
	if len(a.out.q) != 0 {
		t.Fatal("SQD transmitted a new WQE")
	}
	if len(evs) != 2 || evs[1].Type != event.SQDrained {
		t.Fatalf("events %+v", evs)
	}
	must(a.qp, Attr{State: StateRTS}, AttrState)
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 2, Opcode: cq.OpRDMAWrite, ByteLen: 8})
}
