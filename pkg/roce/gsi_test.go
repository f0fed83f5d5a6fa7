package roce

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cm"
	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/mem"
)

// cmPair opens two devices on the in-memory network on a manual clock (no
// timer fires unless the test advances it); a's link drops what drop says.
func cmPair(t *testing.T) (*Device, *Device, *dropLink, *qp.ManualClock) {
	t.Helper()
	clk := qp.NewManualClock(time.Unix(1000, 0))
	nw := mem.NewNetwork(mem.Options{})
	la, err := nw.Attach(addrA)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := nw.Attach(addrB)
	if err != nil {
		t.Fatal(err)
	}
	dl := &dropLink{Link: la}
	a, err := Open(Options{Link: dl, Clock: clk, Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open(Options{Link: lb, Clock: clk, Name: "b"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.Close()
		b.Close()
	})
	return a, b, dl, clk
}

func cmEvents(t *testing.T, d *Device) chan cm.Event {
	ch := make(chan cm.Event, 64)
	if err := d.SetCMEventHandler(func(e cm.Event) { ch <- e }); err != nil {
		t.Fatal(err)
	}
	return ch
}

func waitCM(t *testing.T, ch chan cm.Event, want cm.EventType) cm.Event {
	t.Helper()
	select {
	case e := <-ch:
		if e.Type != want {
			t.Fatalf("CM event %v, want %v (%+v)", e.Type, want, e)
		}
		return e
	case <-time.After(5 * time.Second):
		t.Fatalf("no CM event %v", want)
	}
	return cm.Event{}
}

func rcInit(t *testing.T, e *end) {
	t.Helper()
	if err := e.qp.Modify(&qp.Attr{State: qp.StateInit, Port: 1,
		AccessFlags: mr.AccessLocalWrite | mr.AccessRemoteWrite | mr.AccessRemoteRead},
		qp.AttrState|qp.AttrPKeyIndex|qp.AttrPort|qp.AttrAccessFlags); err != nil {
		t.Fatal(err)
	}
}

// rtrOnly keeps the passive QP in RTR (ToRTS does nothing) so that the
// first packet raises COMM_EST (IBTA 11.6.3: only an RTR QP does).
type rtrOnly struct{ cm.QPControl }

func (rtrOnly) ToRTS(*cm.RTSParams) error { return nil }

// isMAD reports whether p is a CM message of type attr sent to QP1.
func isMAD(p *bth.Packet, attr cm.AttrID) bool {
	return p.BTH.DestQP() == 1 && len(p.Payload) == cm.MADSize && cm.MAD(p.Payload).AttrID() == attr
}

// TestGSIConnect: QP1 exists on every device (a second GSI QP is refused);
// the CM's REQ/REP/RTU travel as UD SENDs between the QP1s, the CM moves
// both RC QPs to RTS and data flows; DREQ/DREP release both sides.
func TestGSIConnect(t *testing.T) {
	a, b, _, _ := cmPair(t)
	if a.CM() == nil || b.CM() == nil {
		t.Fatal("no CM")
	}
	ea, eb := newEnd(t, a, qp.TypeRC, 1<<16), newEnd(t, b, qp.TypeRC, 1<<16)
	if _, err := a.CreateQP(QPInit{Type: qp.TypeGSI, PD: ea.pd, SendCQ: ea.scq, RecvCQ: ea.rcq}); !errors.Is(err, ErrLimit) {
		t.Fatalf("second GSI QP: %v", err)
	}
	rcInit(t, ea)
	rcInit(t, eb)
	evA, evB := cmEvents(t, a), cmEvents(t, b)
	sid := cm.ServiceID(cm.PSTCP, 7174)
	if _, err := b.CM().Listen(sid); err != nil {
		t.Fatal(err)
	}
	_, err := a.CM().Connect(cm.ConnectOptions{ServiceID: sid, Path: cm.Path{SGID: addrA, DGID: addrB},
		QPN: ea.qp.Num(), ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7,
		QP: cm.NewQPControl(ea.qp.QP, cm.QPControlOptions{SGIDIndex: 1})})
	if err != nil {
		t.Fatal(err)
	}
	req := waitCM(t, evB, cm.EventConnectRequest)
	if req.Src.GID != addrA || req.Src.QPN != 1 || req.Remote.QPN != ea.qp.Num() {
		t.Fatalf("CONNECT_REQUEST from %+v, QPN %#x", req.Src, req.Remote.QPN)
	}
	if err := req.Conn.Accept(cm.AcceptOptions{QPN: eb.qp.Num(), ResponderResources: 1, InitiatorDepth: 1,
		RNRRetryCount: 7, QP: cm.NewQPControl(eb.qp.QP, cm.QPControlOptions{SGIDIndex: 1})}); err != nil {
		t.Fatal(err)
	}
	waitCM(t, evA, cm.EventEstablished)
	waitCM(t, evB, cm.EventEstablished)
	if ea.qp.State() != qp.StateRTS || eb.qp.State() != qp.StateRTS {
		t.Fatalf("states %v %v", ea.qp.State(), eb.qp.State())
	}
	copy(ea.buf, "over the CM")
	postRecv(t, eb, qp.RecvWR{WRID: 9, SGL: []qp.SGE{eb.sge(0, 64)}})
	post(t, ea, qp.SendWR{WRID: 1, Opcode: qp.WRSend, Flags: qp.SendSignaled, SGL: []qp.SGE{ea.sge(0, 11)}})
	checkWC(t, waitWC(t, eb.rcq, 1)[0], cq.WC{WRID: 9, Opcode: cq.OpRecv, ByteLen: 11})
	same(t, "data", eb.buf[:11], []byte("over the CM"))
	conns := req.Conn
	if err := conns.Disconnect(nil); err != nil {
		t.Fatal(err)
	}
	waitCM(t, evB, cm.EventDisconnected)
	waitCM(t, evA, cm.EventDisconnected)
	if s := a.CM().Stats(); s.Sent < 2 || s.Received < 2 || s.Malformed != 0 {
		t.Fatalf("CM stats a %+v", s)
	}
}

// TestGSICommEst: with the RTU lost and the passive QP left in RTR, the
// first data packet's COMM_EST event (from the engine) establishes the
// passive side (IBTA 12.9: COMM_EST in REP_SENT); the manual clock never
// fires a REP retransmission, so nothing else could.
func TestGSICommEst(t *testing.T) {
	a, b, dl, _ := cmPair(t)
	ea, eb := newEnd(t, a, qp.TypeRC, 1<<16), newEnd(t, b, qp.TypeRC, 1<<16)
	rcInit(t, ea)
	rcInit(t, eb)
	evA, evB := cmEvents(t, a), cmEvents(t, b)
	dl.setDrop(func(p *bth.Packet) bool { return isMAD(p, cm.AttrRTU) })
	sid := cm.ServiceID(cm.PSTCP, 1)
	if _, err := b.CM().Listen(sid); err != nil {
		t.Fatal(err)
	}
	if _, err := a.CM().Connect(cm.ConnectOptions{ServiceID: sid, Path: cm.Path{SGID: addrA, DGID: addrB},
		QPN: ea.qp.Num(), RetryCount: 7, RNRRetryCount: 7,
		QP: cm.NewQPControl(ea.qp.QP, cm.QPControlOptions{SGIDIndex: 1})}); err != nil {
		t.Fatal(err)
	}
	req := waitCM(t, evB, cm.EventConnectRequest)
	if err := req.Conn.Accept(cm.AcceptOptions{QPN: eb.qp.Num(),
		QP: rtrOnly{cm.NewQPControl(eb.qp.QP, cm.QPControlOptions{SGIDIndex: 1})}}); err != nil {
		t.Fatal(err)
	}
	waitCM(t, evA, cm.EventEstablished)
	if eb.qp.State() != qp.StateRTR || req.Conn.State() == 0 {
		t.Fatalf("passive QP %v", eb.qp.State())
	}
	select {
	case e := <-evB:
		t.Fatalf("passive event before data: %v", e.Type)
	default:
	}
	postRecv(t, eb, qp.RecvWR{WRID: 1, SGL: []qp.SGE{eb.sge(0, 64)}})
	post(t, ea, qp.SendWR{WRID: 1, Opcode: qp.WRSend, SGL: []qp.SGE{ea.sge(0, 8)}})
	waitCM(t, evB, cm.EventEstablished)
}

// TestGSIRemoteGarbage: QP1 takes UD SENDs from anyone: garbage MADs (random bytes, wrong
// class, short, long) are refused by the CM parser and counted, a wrong Q_Key never reaches
// the CM, nothing panics, and the receive ring keeps working (a real REQ afterwards still
// gets its REJ).
func TestGSIRemoteGarbage(t *testing.T) {
	nw := mem.NewNetwork(mem.Options{})
	lb, err := nw.Attach(addrB)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := nw.Attach(netip.MustParseAddr("127.0.0.3"))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	b, err := Open(Options{Link: lb, CM: CMOptions{RecvDepth: 4}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	src := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.3"), 0xC001)
	dst := netip.AddrPortFrom(addrB, bth.UDPPort)
	send := func(qkey uint32, payload []byte) {
		t.Helper()
		if err := raw.Send([]link.Datagram{{Buf: udPacket(src, dst, 1, qkey, payload, 0), Src: src, Dst: dst}}); err != nil {
			t.Fatal(err)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	n := 0
	for i := 0; i < 40; i++ { // 10x the ring: buffers must be reposted
		mad := make([]byte, cm.MADSize)
		for j := range mad {
			mad[j] = byte(rng.Uint32())
		}
		if i%2 == 1 { // a CM header with a garbage attribute / method
			cm.MAD(mad).Encode(&cm.MADFields{BaseVersion: 1, MgmtClass: cm.MgmtClassCM, ClassVersion: 2,
				Method: cm.Method(rng.Uint32()), AttrID: cm.AttrID(rng.Uint32())})
		}
		send(cm.GSIQKey, mad)
		n++
	}
	send(cm.GSIQKey, make([]byte, 100)) // short: not a MAD
	send(0x1234, make([]byte, cm.MADSize))
	// a well-formed REQ for a service nobody listens on: the CM answers REJ to the source QP
	// (udPacket sends from QP 0x77)
	var req [cm.MADSize]byte
	cm.MAD(req[:]).Encode(&cm.MADFields{BaseVersion: 1, MgmtClass: cm.MgmtClassCM, ClassVersion: 2,
		Method: cm.MethodSend, TID: 7, AttrID: cm.AttrREQ})
	cm.REQ(cm.MAD(req[:]).Data()).Encode(&cm.REQFields{LocalCommID: 0x1234, ServiceID: cm.ServiceID(cm.PSTCP, 1),
		LocalQPN: 0x99, PathMTU: 3, MaxCMRetries: 1, RemoteCMResponseTimeout: 10, LocalCMResponseTimeout: 10,
		Primary: cm.PathFields{LocalGID: cm.AddrGID(src.Addr()), RemoteGID: cm.AddrGID(addrB), LocalACKTimeout: 10}})
	send(cm.GSIQKey, req[:])
	got := make([]link.Datagram, 1)
	got[0].Buf = make([]byte, link.MaxDatagram)
	k, err := raw.Recv(got)
	if err != nil || k != 1 {
		t.Fatalf("recv %d %v", k, err)
	}
	p, err := bth.Parse(got[0].Buf)
	if err != nil || p.BTH.DestQP() != 0x77 || p.DETH.Fields().SrcQP != 1 || p.DETH.Fields().QKey != cm.GSIQKey {
		t.Fatalf("answer %v %+v", err, p.BTH.Fields())
	}
	m, err := cm.Parse(p.Payload)
	if err != nil || m.REJ == nil || m.REJ.Reason() != cm.RejInvalidServiceID || m.REJ.RemoteCommID() != 0x1234 || m.MAD.TID() != 7 {
		t.Fatalf("answer %v %+v", err, m)
	}
	s := b.CM().Stats()
	if s.Malformed != uint64(n) || s.Received != 1 {
		t.Fatalf("CM stats %+v, want %d malformed and 1 received", s, n)
	}
}
