package daemon_test

import (
	"errors"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cm"
	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/rdmacm"
	"github.com/softroce/softroce/pkg/roce"
)

// TestCMDaemonExternalQP: through daemons, the active client connects a QP its ID does not
// own (CM_INIT_QP_ATTR moves it): CONNECT_RESPONSE reaches it, not ESTABLISHED; CM_ESTABLISH
// sends the RTU and the passive client gets ESTABLISHED; data flows. The ACK timeout option
// (CM_SET_OPTION) is in the RTS attributes on the active side and in the daemon-moved QP on
// the passive side, the TOS in the route; REUSEADDR and unknown options are EOPNOTSUPP, the
// ACK timeout of a UD ID EINVAL, selective repeat EOPNOTSUPP (from the client's ID and from
// the daemon).
func TestCMDaemonExternalQP(t *testing.T) {
	noLeaks(t)
	da, db, _ := udpDaemons(t)
	act := newCMEnd(t, da.dial(t), cm.PSTCP)
	pas := newCMEnd(t, db.dial(t), cm.PSTCP)
	dst := netip.AddrPortFrom(lo2, 7472)
	pas.listen(t, dst)
	for _, o := range []struct {
		o rdmacm.Option
		v uint32
	}{{rdmacm.OptionAckTimeout, 21}, {rdmacm.OptionTOS, 0x48}} {
		if err := act.id.SetOption(o.o, o.v); err != nil {
			t.Fatalf("SetOption(%d): %v", o.o, err)
		}
	}
	if err := act.id.ResolveAddr(netip.Addr{}, dst, time.Second); err != nil {
		t.Fatal(err)
	}
	act.next(t, rdmacm.EventAddrResolved)
	if err := act.id.ResolveRoute(time.Second); err != nil {
		t.Fatal(err)
	}
	act.next(t, rdmacm.EventRouteResolved)
	if tc := act.id.Route().TrafficClass; tc != 0x48 {
		t.Fatalf("route traffic class %#x, want the TOS 0x48", tc)
	}
	q, err := act.v.CreateQP(roce.VerbsQPInit{Type: qp.TypeRC, PD: act.pd, SendCQ: act.cq, RecvCQ: act.cq,
		Cap: qp.Cap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	act.q = q
	move := func(s qp.State) qp.Attr {
		t.Helper()
		a, m, err := act.id.InitQPAttr(s)
		if err != nil {
			t.Fatalf("InitQPAttr(%v): %v", s, err)
		}
		if err := q.Modify(&a, m); err != nil {
			t.Fatalf("to %v: %v", s, err)
		}
		return a
	}
	move(qp.StateInit)
	if err := act.id.Connect(rdmacm.ConnParam{QPNum: q.Num(), ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7}); err != nil {
		t.Fatal(err)
	}
	req := pas.next(t, rdmacm.EventConnectRequest)
	pas.createQP(t, req.ID)
	if err := req.ID.SetOption(rdmacm.OptionAckTimeout, 16); err != nil {
		t.Fatal(err)
	}
	pas.recv(t, 0, 64)
	if err := req.ID.Accept(nil); err != nil {
		t.Fatal(err)
	}
	act.next(t, rdmacm.EventConnectResponse)
	move(qp.StateRTR)
	if a := move(qp.StateRTS); a.Timeout != 21 {
		t.Fatalf("RTS timeout %d, want the option's 21", a.Timeout)
	}
	if err := act.id.Establish(); err != nil {
		t.Fatal("Establish:", err)
	}
	pas.next(t, rdmacm.EventEstablished)
	if got := pas.q.Query().Timeout; got != 16 {
		t.Fatalf("passive QP timeout %d, want 16", got)
	}
	if got := q.Query(); got.Timeout != 21 || got.AH.TrafficClass != 0x48 {
		t.Fatalf("active QP timeout %d traffic class %#x", got.Timeout, got.AH.TrafficClass)
	}
	copy(act.buf[4096:], "external QP")
	act.send(t, qp.SendWR{Opcode: qp.WRSend, SGL: []qp.SGE{{Addr: cmIOVA + 4096, Length: 11, LKey: act.m.LKey()}}})
	if wc := pas.wait(t); wc.Status != cq.StatusSuccess || wc.ByteLen != 11 {
		t.Fatalf("receive %+v", wc)
	}
	if err := act.id.Establish(); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("Establish twice: %v", err)
	}
	if err := act.id.SetOption(rdmacm.OptionReuseAddr, 1); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("REUSEADDR on a bound ID: %v", err)
	}
	fresh := newCMEnd(t, da.dial(t), cm.PSTCP)
	if err := fresh.id.SetOption(rdmacm.OptionReuseAddr, 1); !errors.Is(err, syscall.EOPNOTSUPP) {
		t.Fatalf("REUSEADDR: %v", err)
	}
	if err := fresh.id.SetOption(rdmacm.Option(77), 1); !errors.Is(err, syscall.EOPNOTSUPP) {
		t.Fatalf("option 77: %v", err)
	}
	// selective repeat: refused by the client's ID, and by the daemon to a client that sends
	// the option itself (the session's QPs cannot have it)
	if err := fresh.id.SetOption(rdmacm.OptionSelectiveRepeat, 1); !errors.Is(err, syscall.EOPNOTSUPP) ||
		!errors.Is(err, roce.ErrSelectiveRepeat) {
		t.Fatalf("selective repeat: %v", err)
	}
	if r, ok := fresh.v.(rdmacm.Remote); !ok {
		t.Fatal("the daemon client is no rdmacm.Remote")
	} else if err := r.CMSetOption(fresh.id.Handle(), rdmacm.OptionSelectiveRepeat, 1); !errors.Is(err, syscall.EOPNOTSUPP) {
		t.Fatalf("selective repeat sent to the daemon: %v", err)
	}
	ud := newCMEnd(t, da.dial(t), cm.PSUDP)
	if err := ud.id.SetOption(rdmacm.OptionAckTimeout, 14); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("ACK timeout on a UD ID: %v", err)
	}
	if err := act.id.Disconnect(); err != nil {
		t.Fatal(err)
	}
	act.next(t, rdmacm.EventDisconnected)
	pas.next(t, rdmacm.EventDisconnected)
	for _, e := range []*cmEnd{act, pas, fresh, ud} {
		e.id.Destroy()
	}
	req.ID.Destroy()
	q.Destroy()
}
