package daemon_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/softroce/softroce/internal/cm"
	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/event"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/rdmacm"
	"github.com/softroce/softroce/pkg/roce"
)

// rdma_cm through the daemon: two daemons on 127.0.0.1 and 127.0.0.2
// (UDP on a random RoCE port, portable sockets so the race detector sees
// the ordering), clients over real unix sockets.

var (
	lo1 = netip.MustParseAddr("127.0.0.1")
	lo2 = netip.MustParseAddr("127.0.0.2")
)

// noLeaks checks, after every cleanup of the test, that no goroutine the
// test started is left.
func noLeaks(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
}

func rocePort() uint16 { return uint16(20000 + rand.IntN(40000)) }

// cmUDPDevice opens a device on addr:port whose async events go to *srv.
func cmUDPDevice(t *testing.T, addr netip.Addr, port uint16, srv *atomic.Pointer[serverRef]) *roce.Device {
	t.Helper()
	d, err := roce.OpenUDP(roce.UDPOptions{Addrs: []netip.Addr{addr}, Port: port, Portable: true, Name: "soft-" + addr.String(),
		Events: func(e event.Event) {
			if srv != nil {
				if s := srv.Load(); s != nil {
					s.d.srv.Event(e)
				}
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

type serverRef struct{ d *testDaemon }

// udpDaemons starts daemons on 127.0.0.1 and 127.0.0.2.
func udpDaemons(t *testing.T) (*testDaemon, *testDaemon, uint16) {
	t.Helper()
	port := rocePort()
	var ra, rb atomic.Pointer[serverRef]
	da := serveDevice(t, cmUDPDevice(t, lo1, port, &ra), "a")
	db := serveDevice(t, cmUDPDevice(t, lo2, port, &rb), "b")
	ra.Store(&serverRef{da})
	rb.Store(&serverRef{db})
	return da, db, port
}

// cmEnd is an rdma_cm endpoint written only against roce.Verbs and rdmacm
// (the same code embedded and through the daemon).
type cmEnd struct {
	v   roce.Verbs
	ch  *rdmacm.EventChannel
	id  *rdmacm.ID
	pd  roce.ProtectionDomain
	cq  roce.CompletionQueue
	buf []byte
	m   roce.MemoryRegion
	q   roce.QueuePair
	wc  [16]cq.WC
}

const cmIOVA = 0x20000

func newCMEnd(t *testing.T, v roce.Verbs, ps cm.PortSpace) *cmEnd {
	t.Helper()
	e := &cmEnd{v: v, ch: rdmacm.NewEventChannel()}
	t.Cleanup(e.ch.Close)
	var err error
	if e.id, err = rdmacm.CreateID(e.ch, rdmacm.IDOptions{Verbs: v, PortSpace: ps}); err != nil {
		t.Fatal("CreateID:", err)
	}
	if e.pd, err = v.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if e.cq, err = v.CreateCQ(64); err != nil {
		t.Fatal(err)
	}
	if e.buf, err = v.AllocBuffer(8192); err != nil {
		t.Fatal(err)
	}
	if e.m, err = v.RegMR(e.pd, e.buf, cmIOVA, rcAccess); err != nil {
		t.Fatal(err)
	}
	return e
}

// createQP gives id a QP on e's objects.
func (e *cmEnd) createQP(t *testing.T, id *rdmacm.ID) {
	t.Helper()
	q, err := id.CreateQPVerbs(e.pd, roce.VerbsQPInit{SendCQ: e.cq, RecvCQ: e.cq,
		Cap: qp.Cap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal("CreateQPVerbs:", err)
	}
	e.q = q
}

func (e *cmEnd) next(t *testing.T, want rdmacm.EventType) rdmacm.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	ev, err := e.ch.Get(ctx)
	if err != nil {
		t.Fatalf("waiting for %v: %v", want, err)
	}
	if ev.Type != want {
		t.Fatalf("event %v (status %v), want %v", ev.Type, ev.Status, want)
	}
	return ev
}

func (e *cmEnd) wait(t *testing.T) cq.WC {
	t.Helper()
	deadline := time.NewTimer(waitLimit)
	defer deadline.Stop()
	for {
		if n := e.cq.Poll(e.wc[:1]); n == 1 {
			return e.wc[0]
		}
		if err := e.cq.ReqNotify(false); err != nil {
			t.Fatal(err)
		}
		if n := e.cq.Poll(e.wc[:1]); n == 1 {
			return e.wc[0]
		}
		select {
		case <-e.cq.Channel():
		case <-deadline.C:
			t.Fatal("no completion")
		}
	}
}

func (e *cmEnd) recv(t *testing.T, off, n int) {
	t.Helper()
	if _, err := e.q.PostRecv([]qp.RecvWR{{WRID: 7, SGL: []qp.SGE{{Addr: cmIOVA + uint64(off), Length: uint32(n), LKey: e.m.LKey()}}}}); err != nil {
		t.Fatal("PostRecv:", err)
	}
}

func (e *cmEnd) send(t *testing.T, wr qp.SendWR) {
	t.Helper()
	wr.Flags |= qp.SendSignaled
	if _, err := e.q.PostSend([]qp.SendWR{wr}); err != nil {
		t.Fatal("PostSend:", err)
	}
	if wc := e.wait(t); wc.Status != cq.StatusSuccess {
		t.Fatalf("send completion %+v", wc)
	}
}

// listen makes e listen on addr:port.
func (e *cmEnd) listen(t *testing.T, ap netip.AddrPort) {
	t.Helper()
	if err := e.id.BindAddr(ap); err != nil {
		t.Fatal("BindAddr:", err)
	}
	if err := e.id.Listen(4); err != nil {
		t.Fatal("Listen:", err)
	}
}

// dial resolves and connects e's ID to dst with private data.
func (e *cmEnd) dial(t *testing.T, dst netip.AddrPort, pdata []byte) {
	t.Helper()
	if err := e.id.ResolveAddr(netip.Addr{}, dst, time.Second); err != nil {
		t.Fatal("ResolveAddr:", err)
	}
	e.next(t, rdmacm.EventAddrResolved)
	if err := e.id.ResolveRoute(time.Second); err != nil {
		t.Fatal("ResolveRoute:", err)
	}
	e.next(t, rdmacm.EventRouteResolved)
	e.createQP(t, e.id)
	if err := e.id.Connect(rdmacm.ConnParam{PrivateData: pdata, ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7}); err != nil {
		t.Fatal("Connect:", err)
	}
}

// rcSession runs connect, accept, SEND and RDMA WRITE both ways, and
// disconnect between an active and a passive endpoint.
func rcSession(t *testing.T, act, pas *cmEnd, dst netip.AddrPort) {
	t.Helper()
	pas.listen(t, dst)
	act.dial(t, dst, []byte("hello from the active side"))
	act.recv(t, 6000, 64)
	req := pas.next(t, rdmacm.EventConnectRequest)
	if !bytes.HasPrefix(req.Param.PrivateData, []byte("hello from the active side")) {
		t.Fatalf("CONNECT_REQUEST private data %q", req.Param.PrivateData)
	}
	if req.Listen != pas.id || req.ID == pas.id || req.ID.LocalAddr() != dst {
		t.Fatalf("CONNECT_REQUEST IDs: listen %p (want %p), new %p, local %v", req.Listen, pas.id, req.ID, req.ID.LocalAddr())
	}
	if req.ID.RemoteAddr().Addr() != act.id.LocalAddr().Addr() || req.ID.RemoteAddr().Port() != act.id.LocalAddr().Port() {
		t.Fatalf("CONNECT_REQUEST from %v, active side is %v", req.ID.RemoteAddr(), act.id.LocalAddr())
	}
	if req.Param.ResponderResources != 1 || req.Param.InitiatorDepth != 1 || req.Param.RNRRetryCount != 7 {
		t.Fatalf("CONNECT_REQUEST parameters %+v", req.Param)
	}
	pas.createQP(t, req.ID)
	pas.recv(t, 0, 64)
	if err := req.ID.Accept(&rdmacm.ConnParam{PrivateData: []byte("welcome"), ResponderResources: 1, InitiatorDepth: 1, RNRRetryCount: 7}); err != nil {
		t.Fatal("Accept:", err)
	}
	est := act.next(t, rdmacm.EventEstablished)
	if !bytes.HasPrefix(est.Param.PrivateData, []byte("welcome")) {
		t.Fatalf("ESTABLISHED private data %q", est.Param.PrivateData)
	}
	pas.next(t, rdmacm.EventEstablished)

	// data: SEND active -> passive, RDMA WRITE passive -> active
	copy(act.buf[4096:], "ping through the daemon")
	act.send(t, qp.SendWR{Opcode: qp.WRSend, SGL: []qp.SGE{{Addr: cmIOVA + 4096, Length: 23, LKey: act.m.LKey()}}})
	if wc := pas.wait(t); wc.Status != cq.StatusSuccess || wc.Opcode != cq.OpRecv || wc.ByteLen != 23 {
		t.Fatalf("receive completion %+v", wc)
	}
	if string(pas.buf[:23]) != "ping through the daemon" {
		t.Fatalf("received %q", pas.buf[:23])
	}
	copy(pas.buf[1024:], "pong by RDMA WRITE")
	pas.send(t, qp.SendWR{Opcode: qp.WRRDMAWrite, SGL: []qp.SGE{{Addr: cmIOVA + 1024, Length: 18, LKey: pas.m.LKey()}},
		RemoteAddr: cmIOVA + 2048, RKey: act.m.RKey()})
	// a SEND after the WRITE: its receive completion orders the WRITE's
	// data before the check for the race detector (an embedded buffer is
	// written by the receive goroutine; the kernel socket's ordering is
	// invisible to it)
	pas.send(t, qp.SendWR{Opcode: qp.WRSend, SGL: []qp.SGE{{Addr: cmIOVA + 1024, Length: 4, LKey: pas.m.LKey()}}})
	if wc := act.wait(t); wc.Status != cq.StatusSuccess || wc.Opcode != cq.OpRecv || wc.ByteLen != 4 {
		t.Fatalf("active receive completion %+v", wc)
	}
	if string(act.buf[2048:2066]) != "pong by RDMA WRITE" {
		t.Fatalf("written %q", act.buf[2048:2066])
	}

	if err := act.id.Disconnect(); err != nil {
		t.Fatal("Disconnect:", err)
	}
	act.next(t, rdmacm.EventDisconnected)
	pas.next(t, rdmacm.EventDisconnected)
	if err := req.ID.Destroy(); err != nil {
		t.Fatal(err)
	}
}

// cmIDs returns the daemon's live CM IDs.
func cmIDs(d *testDaemon) int { return d.srv.Debug().CMIDs }

// TestCMDaemonRC: RC connect/accept/data/disconnect with both ends clients
// of daemons; destroying the IDs leaves the daemons holding none.
func TestCMDaemonRC(t *testing.T) {
	noLeaks(t)
	da, db, _ := udpDaemons(t)
	act := newCMEnd(t, da.dial(t), cm.PSTCP)
	pas := newCMEnd(t, db.dial(t), cm.PSTCP)
	rcSession(t, act, pas, netip.AddrPortFrom(lo2, 7471))
	if n := cmIDs(db); n != 1 {
		t.Fatalf("daemon B holds %d CM IDs, want 1 (the listener)", n)
	}
	act.id.Destroy()
	pas.id.Destroy()
	if a, b := cmIDs(da), cmIDs(db); a != 0 || b != 0 {
		t.Fatalf("after Destroy the daemons hold %d and %d CM IDs", a, b)
	}
}

// TestCMDaemonEmbeddedPeer: a daemon client connects to an embedded rdmacm
// peer, and an embedded peer to a daemon client (IDOptions.Verbs both ways).
func TestCMDaemonEmbeddedPeer(t *testing.T) {
	noLeaks(t)
	port := rocePort()
	var ra atomic.Pointer[serverRef]
	da := serveDevice(t, cmUDPDevice(t, lo1, port, &ra), "a")
	ra.Store(&serverRef{da})
	devB := cmUDPDevice(t, lo2, port, nil)
	t.Cleanup(func() { devB.Close() })
	t.Run("client-to-embedded", func(t *testing.T) {
		act := newCMEnd(t, da.dial(t), cm.PSTCP)
		pas := newCMEnd(t, devB.Verbs(), cm.PSTCP)
		rcSession(t, act, pas, netip.AddrPortFrom(lo2, 7472))
		act.id.Destroy()
		pas.id.Destroy()
	})
	t.Run("embedded-to-client", func(t *testing.T) {
		act := newCMEnd(t, devB.Verbs(), cm.PSTCP)
		pas := newCMEnd(t, da.dial(t), cm.PSTCP)
		rcSession(t, act, pas, netip.AddrPortFrom(lo1, 7473))
		act.id.Destroy()
		pas.id.Destroy()
	})
	da.waitIdle(t, 0)
	if n := cmIDs(da); n != 0 {
		t.Fatalf("daemon holds %d CM IDs", n)
	}
}

// TestCMDaemonReject: the passive client rejects with private data; the
// active client sees REJECTED, reason Consumer Defined, and the data.
func TestCMDaemonReject(t *testing.T) {
	noLeaks(t)
	da, db, _ := udpDaemons(t)
	act := newCMEnd(t, da.dial(t), cm.PSTCP)
	pas := newCMEnd(t, db.dial(t), cm.PSTCP)
	dst := netip.AddrPortFrom(lo2, 7474)
	pas.listen(t, dst)
	act.dial(t, dst, []byte("may I"))
	req := pas.next(t, rdmacm.EventConnectRequest)
	if err := req.ID.Reject([]byte("no, go away")); err != nil {
		t.Fatal("Reject:", err)
	}
	ev := act.next(t, rdmacm.EventRejected)
	var rj *rdmacm.RejectError
	if !errors.As(ev.Status, &rj) || rj.Reason != cm.RejConsumerDefined {
		t.Fatalf("REJECTED status %v", ev.Status)
	}
	if !bytes.HasPrefix(ev.Param.PrivateData, []byte("no, go away")) {
		t.Fatalf("REJECTED private data %q", ev.Param.PrivateData)
	}
	req.ID.Destroy()
}

// TestCMDaemonUD: SIDR through both daemons; a UD SEND to the resolved
// QP with the address handle the daemon resolved.
func TestCMDaemonUD(t *testing.T) {
	noLeaks(t)
	da, db, _ := udpDaemons(t)
	act := newCMEnd(t, da.dial(t), cm.PSUDP)
	pas := newCMEnd(t, db.dial(t), cm.PSUDP)
	dst := netip.AddrPortFrom(lo2, 7475)
	pas.listen(t, dst)
	act.dial(t, dst, []byte("sidr"))
	req := pas.next(t, rdmacm.EventConnectRequest)
	if !bytes.HasPrefix(req.Param.PrivateData, []byte("sidr")) {
		t.Fatalf("SIDR private data %q", req.Param.PrivateData)
	}
	pas.createQP(t, req.ID)
	pas.recv(t, 0, 40+64)
	if err := req.ID.Accept(nil); err != nil {
		t.Fatal("Accept:", err)
	}
	est := act.next(t, rdmacm.EventEstablished)
	if est.UD.AH == nil || est.UD.QPN != pas.q.Num() || est.UD.QKey != cm.RDMAUDPQKey {
		t.Fatalf("ESTABLISHED UD %+v, want QPN %d Q_Key %#x", est.UD, pas.q.Num(), cm.RDMAUDPQKey)
	}
	if act.id.UD().QPN != pas.q.Num() {
		t.Fatalf("ID.UD() = %+v", act.id.UD())
	}
	copy(act.buf[4096:], "datagram via SIDR")
	act.send(t, qp.SendWR{Opcode: qp.WRSend, SGL: []qp.SGE{{Addr: cmIOVA + 4096, Length: 17, LKey: act.m.LKey()}},
		AH: est.UD.AH, RemoteQPN: est.UD.QPN, RemoteQKey: est.UD.QKey})
	if wc := pas.wait(t); wc.Status != cq.StatusSuccess || wc.ByteLen != 40+17 {
		t.Fatalf("UD receive %+v", wc)
	}
	if string(pas.buf[40:57]) != "datagram via SIDR" {
		t.Fatalf("received %q", pas.buf[40:57])
	}
	req.ID.Destroy()
}

// TestCMDaemonIsolation: one session cannot use another's ID handles, nor
// bind or listen on a port another session holds; a listener's crash
// frees its port.
func TestCMDaemonIsolation(t *testing.T) {
	noLeaks(t)
	da, _, _ := udpDaemons(t)
	ca, cb := da.dial(t), da.dial(t)
	a := newCMEnd(t, ca, cm.PSTCP)
	ap := netip.AddrPortFrom(lo1, 7476)
	a.listen(t, ap)
	h := a.id.Handle()
	// session B names A's handle: nothing of B's
	for name, err := range map[string]error{
		"Accept":     cb.CMAccept(h, nil),
		"Reject":     cb.CMReject(h, nil),
		"Disconnect": cb.CMDisconnect(h),
		"Destroy":    cb.CMDestroy(h),
		"Listen":     func() error { _, err := cb.CMListen(h, 1); return err }(),
	} {
		if !errors.Is(err, proto.ErrNoObject) {
			t.Errorf("%s on another session's ID: %v, want ErrNoObject", name, err)
		}
	}
	// the port is A's
	b := newCMEnd(t, cb, cm.PSTCP)
	if err := b.id.BindAddr(ap); !errors.Is(err, rdmacm.ErrAddrInUse) {
		t.Fatalf("BindAddr on session A's port: %v, want ErrAddrInUse", err)
	}
	if err := b.id.BindAddr(netip.AddrPortFrom(netip.IPv4Unspecified(), ap.Port())); !errors.Is(err, rdmacm.ErrAddrInUse) {
		t.Fatalf("BindAddr on session A's port (any address): %v, want ErrAddrInUse", err)
	}
	// A's ID is intact: still listening after B's attempts
	if d, err := ca.Debug(); err != nil || d.Mine.CMIDs != 1 {
		t.Fatalf("session A's CM IDs: %+v %v", d.Mine, err)
	}
	// A crashes: its listen and port are freed; B takes the port
	ca.Close()
	da.waitIdle(t, 1)
	if err := b.id.BindAddr(ap); err != nil {
		t.Fatalf("BindAddr after the holder crashed: %v", err)
	}
	if err := b.id.Listen(1); err != nil {
		t.Fatal(err)
	}
	if n := cmIDs(da); n != 1 {
		t.Fatalf("daemon holds %d CM IDs, want 1 (B's)", n)
	}
}

// TestCMDaemonClientCrash: a connected client's session ends abruptly; the
// peer sees DISCONNECTED (the daemon DREQs the connection) and the daemon
// holds no CM IDs (Debug and metrics).
func TestCMDaemonClientCrash(t *testing.T) {
	noLeaks(t)
	da, db, _ := udpDaemons(t)
	ca := da.dial(t)
	act := newCMEnd(t, ca, cm.PSTCP)
	pas := newCMEnd(t, db.dial(t), cm.PSTCP)
	dst := netip.AddrPortFrom(lo2, 7477)
	pas.listen(t, dst)
	act.dial(t, dst, nil)
	req := pas.next(t, rdmacm.EventConnectRequest)
	pas.createQP(t, req.ID)
	if err := req.ID.Accept(nil); err != nil {
		t.Fatal(err)
	}
	act.next(t, rdmacm.EventEstablished)
	pas.next(t, rdmacm.EventEstablished)
	if n := cmIDs(da); n != 1 {
		t.Fatalf("daemon A holds %d CM IDs before the crash", n)
	}
	ca.Close() // the process dies: its socket closes, nothing more
	pas.next(t, rdmacm.EventDisconnected)
	da.waitIdle(t, 0)
	if n := cmIDs(da); n != 0 {
		t.Fatalf("daemon A holds %d CM IDs after the crash", n)
	}
	var m bytes.Buffer
	if err := da.srv.WriteMetrics(&m); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(m.Bytes(), []byte(`softroce_daemon_cm_ids{device="soft-127.0.0.1"} 0`)) {
		t.Fatalf("metrics lack cm_ids 0:\n%s", m.String())
	}
	req.ID.Destroy()
}

// TestCMDaemonCrashPendingRequest: a listening client crashes with a
// request it never answered: the active side is rejected, not left to
// time out.
func TestCMDaemonCrashPendingRequest(t *testing.T) {
	noLeaks(t)
	da, db, _ := udpDaemons(t)
	act := newCMEnd(t, da.dial(t), cm.PSTCP)
	cb := db.dial(t)
	pas := newCMEnd(t, cb, cm.PSTCP)
	dst := netip.AddrPortFrom(lo2, 7478)
	pas.listen(t, dst)
	act.dial(t, dst, nil)
	pas.next(t, rdmacm.EventConnectRequest)
	cb.Close()
	ev := act.next(t, rdmacm.EventRejected)
	var rj *rdmacm.RejectError
	if !errors.As(ev.Status, &rj) {
		t.Fatalf("REJECTED status %v", ev.Status)
	}
	db.waitIdle(t, 0)
	if n := cmIDs(db); n != 0 {
		t.Fatalf("daemon B holds %d CM IDs", n)
	}
}

// TestCMDaemonShutdown: the daemon shutting down with a client's connection up DREQs it: the
// peer (a client of the other daemon) sees DISCONNECTED.
func TestCMDaemonShutdown(t *testing.T) {
	noLeaks(t)
	da, db, _ := udpDaemons(t)
	act := newCMEnd(t, da.dial(t), cm.PSTCP)
	pas := newCMEnd(t, db.dial(t), cm.PSTCP)
	dst := netip.AddrPortFrom(lo2, 7479)
	pas.listen(t, dst)
	act.dial(t, dst, nil)
	req := pas.next(t, rdmacm.EventConnectRequest)
	pas.createQP(t, req.ID)
	if err := req.ID.Accept(nil); err != nil {
		t.Fatal(err)
	}
	act.next(t, rdmacm.EventEstablished)
	pas.next(t, rdmacm.EventEstablished)
	da.stop(t)
	pas.next(t, rdmacm.EventDisconnected)
	req.ID.Destroy()
}
