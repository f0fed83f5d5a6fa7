package daemon_test

import (
	"errors"
	"testing"

	"github.com/softroce/softroce/internal/cm"
	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/rdmacm"
	"github.com/softroce/softroce/pkg/roce"
)

// controlledQKey is the GSI's Q_Key (QP1, the CM): a controlled Q_Key (high-order bit set).
const controlledQKey = 0x80010000

// udEnd is a UD QP through roce.Verbs, in RTS with the given Q_Key (or refused).
type udEnd struct {
	v   roce.Verbs
	pd  roce.ProtectionDomain
	cq  roce.CompletionQueue
	q   roce.QueuePair
	buf []byte
	m   roce.MemoryRegion
}

func newUD(t *testing.T, v roce.Verbs) *udEnd {
	t.Helper()
	u := &udEnd{v: v}
	var err error
	if u.pd, err = v.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if u.cq, err = v.CreateCQ(16); err != nil {
		t.Fatal(err)
	}
	if u.buf, err = v.AllocBuffer(8192); err != nil {
		t.Fatal(err)
	}
	if u.m, err = v.RegMR(u.pd, u.buf, 0, rcAccess); err != nil {
		t.Fatal(err)
	}
	if u.q, err = v.CreateQP(roce.VerbsQPInit{Type: qp.TypeUD, PD: u.pd, SendCQ: u.cq, RecvCQ: u.cq,
		Cap: qp.Cap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		t.Fatal(err)
	}
	return u
}

func (u *udEnd) init(qkey uint32) error {
	return u.q.Modify(&qp.Attr{State: qp.StateInit, Port: 1, QKey: qkey}, qp.AttrState|qp.AttrPKeyIndex|qp.AttrPort|qp.AttrQKey)
}

func (u *udEnd) rts(t *testing.T) {
	t.Helper()
	if err := u.q.Modify(&qp.Attr{State: qp.StateRTR}, qp.AttrState); err != nil {
		t.Fatal(err)
	}
	if err := u.q.Modify(&qp.Attr{State: qp.StateRTS, SQPSN: 0}, qp.AttrState|qp.AttrSQPSN); err != nil {
		t.Fatal(err)
	}
}

// TestControlledQKey: a client cannot speak with the host CM's voice. An unprivileged
// user's UD QP is refused a controlled Q_Key (the high-order bit set: IBTA 10.2.4 reserves
// them to privileged consumers; the kernel refuses them without CAP_NET_RAW) at INIT and at a
// later modify, so it can neither receive GSI traffic nor send it: a send WR's controlled
// Q_Key means "the QP's own" (IBTA 10.2.5), which the peer's QP receives. rdma_cm refuses a
// controlled Q_Key in a UD accept too. A privileged user may. (Before, the client's QP took
// 0x80010000 and exchanged CM MADs with another daemon's QP1.)
func TestControlledQKey(t *testing.T) {
	testPrivileged = func(uid uint32) bool { return false }
	defer func() { testPrivileged = nil }()
	da, db := memPair(t)
	a := newUD(t, da.dial(t))
	if err := a.init(controlledQKey); !errors.Is(err, proto.ErrPermission) {
		t.Fatalf("INIT with Q_Key 0x%x: %v, want ErrPermission", controlledQKey, err)
	}
	if err := a.init(0x11111111); err != nil {
		t.Fatal(err)
	}
	if err := a.q.Modify(&qp.Attr{QKey: controlledQKey}, qp.AttrQKey); !errors.Is(err, proto.ErrPermission) {
		t.Fatalf("modify to Q_Key 0x%x: %v, want ErrPermission", controlledQKey, err)
	}
	if got := a.q.Query().QKey; got != 0x11111111 {
		t.Fatalf("Q_Key after the refusals: 0x%x", got)
	}
	a.rts(t)

	// A WR naming the controlled Q_Key sends the QP's own: a peer QP with that one receives it.
	b := newUD(t, db.dev.Verbs())
	if err := b.init(0x11111111); err != nil {
		t.Fatal(err)
	}
	b.rts(t)
	if _, err := b.q.PostRecv([]qp.RecvWR{{WRID: 7, SGL: []qp.SGE{{Addr: 0, Length: 4096, LKey: b.m.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	ah, err := a.v.CreateAH(a.pd, qp.AHAttr{DGID: ipB, SGIDIndex: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.q.PostSend([]qp.SendWR{{WRID: 1, Opcode: qp.WRSend, Flags: qp.SendSignaled, AH: ah,
		RemoteQPN: b.q.Num(), RemoteQKey: controlledQKey, SGL: []qp.SGE{{Addr: 0, Length: 64, LKey: a.m.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	be := &end{cq: b.cq, wc: make([]cq.WC, 4)}
	if wc := be.wait(t, 1)[0]; wc.Status != cq.StatusSuccess || wc.WRID != 7 {
		t.Fatalf("peer's receive: %+v", wc)
	}

	// rdma_cm: a UD accept advertising a controlled Q_Key is refused too.
	id, err := rdmacm.CreateID(rdmacm.NewEventChannel(), rdmacm.IDOptions{Verbs: da.dial(t), PortSpace: cm.PSUDP})
	if err != nil {
		t.Fatal(err)
	}
	defer id.Destroy()
	if err := id.Accept(&rdmacm.ConnParam{QKey: controlledQKey}); !errors.Is(err, proto.ErrPermission) {
		t.Fatalf("rdma_accept with Q_Key 0x%x: %v, want ErrPermission", controlledQKey, err)
	}

	// A privileged user may.
	testPrivileged = func(uid uint32) bool { return true }
	dc, _ := memPair(t)
	c := newUD(t, dc.dial(t))
	if err := c.init(controlledQKey); err != nil {
		t.Fatalf("privileged INIT with Q_Key 0x%x: %v", controlledQKey, err)
	}
	if d, _ := da.dial(t).Debug(); d.RefusedPrivileged != 3 {
		t.Fatalf("refusals counted: %d, want 3", d.RefusedPrivileged)
	}
}
