package roce

import (
	"errors"
	"testing"
	"time"

	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/cm"
	"github.com/softroce/softroce/pkg/cq"
	"github.com/softroce/softroce/pkg/mr"
	"github.com/softroce/softroce/pkg/qp"
	"github.com/softroce/softroce/pkg/roce/link"
)

// cmPair opens two devices on the in-memory network on a manual clock (no
// timer fires unless the test advances it); a's link drops what drop says.
func cmPair(t *testing.T) (*Device, *Device, *dropLink, *qp.ManualClock) {
	t.Helper()
	clk := qp.NewManualClock(time.Unix(1000, 0))
	nw := link.NewMemNetwork(link.MemOptions{})
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
