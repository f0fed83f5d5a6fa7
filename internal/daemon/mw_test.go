package daemon_test

import (
	"errors"
	"syscall"
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/daemon"
	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/client"
	"github.com/softroce/softroce/pkg/roce"
)

// TestMWProtocol: ALLOC_MW and DEALLOC_MW at the wire: each refusal has the errno and code the
// spec gives (a handle of nothing or of another kind, a type other than 1 and 2 — EINVAL, not
// EOPNOTSUPP, which rdma-core's suite reads as "no windows" — a short body), a window keeps
// its PD busy, and a dealloc'd handle names nothing.
func TestMWProtocol(t *testing.T) {
	da, _ := memPair(t)
	r := dialRaw(t, da.sock)
	is := func(what string, err error, sentinel error, errno syscall.Errno) {
		t.Helper()
		if !errors.Is(err, sentinel) || !errors.Is(err, errno) {
			t.Fatalf("%s: %v, want %v (%v)", what, err, sentinel, errno)
		}
	}
	var pd wire.Handle
	if err := r.call(wire.OpAllocPD, nil, wire.Bytes(&pd)); err != nil {
		t.Fatal(err)
	}
	alloc := func(pd, typ uint32) (wire.AllocMWResp, error) {
		var resp wire.AllocMWResp
		err := r.call(wire.OpAllocMW, wire.Bytes(&wire.AllocMWReq{PD: pd, Type: typ}), wire.Bytes(&resp))
		return resp, err
	}
	_, err := alloc(pd.Handle+100, 1)
	is("ALLOC_MW in no PD", err, proto.ErrNoObject, syscall.EINVAL)
	for _, typ := range []uint32{0, 3, 0x102} {
		_, err := alloc(pd.Handle, typ)
		is("ALLOC_MW of a type the device has not", err, mr.ErrInvalidArg, syscall.EINVAL)
	}
	is("ALLOC_MW short body", r.call(wire.OpAllocMW, []byte{1, 0, 0, 0}, nil), proto.ErrProtocol, syscall.EPROTO)
	w1, err := alloc(pd.Handle, 1)
	if err != nil {
		t.Fatal(err)
	}
	w2, err := alloc(pd.Handle, 2)
	if err != nil {
		t.Fatal(err)
	}
	if w1.Handle == w2.Handle || w1.RKey == 0 || w2.RKey == 0 || mr.KeyIndex(w1.RKey) == mr.KeyIndex(w2.RKey) {
		t.Fatalf("two windows: %+v %+v", w1, w2)
	}
	if da.dev.MRTable().MWByKey(w1.RKey).Type() != mr.MWType1 || da.dev.MRTable().MWByKey(w2.RKey).Type() != mr.MWType2 {
		t.Fatal("the R_Keys do not name windows of the asked types")
	}
	if n := da.srv.LiveMWs(); n != 2 {
		t.Fatalf("%d live windows, want 2", n)
	}
	is("DEALLOC_PD with windows", r.call(wire.OpDeallocPD, wire.Bytes(&pd), nil), mr.ErrBusy, syscall.EBUSY)
	is("DEALLOC_MW of a PD handle", r.call(wire.OpDeallocMW, wire.Bytes(&pd), nil), proto.ErrNoObject, syscall.EINVAL)
	is("DEALLOC_MW of nothing", r.call(wire.OpDeallocMW, wire.Bytes(&wire.Handle{Handle: 999}), nil), proto.ErrNoObject, syscall.EINVAL)
	is("DEREG_MR of a window handle", r.call(wire.OpDeregMR, wire.Bytes(&wire.Handle{Handle: w1.Handle}), nil), proto.ErrNoObject, syscall.EINVAL)
	for _, w := range []wire.AllocMWResp{w1, w2} {
		if err := r.call(wire.OpDeallocMW, wire.Bytes(&wire.Handle{Handle: w.Handle}), nil); err != nil {
			t.Fatal(err)
		}
		if da.dev.MRTable().MWByKey(w.RKey) != nil {
			t.Fatalf("R_Key %#x still names a window after DEALLOC_MW", w.RKey)
		}
	}
	is("DEALLOC_MW twice", r.call(wire.OpDeallocMW, wire.Bytes(&wire.Handle{Handle: w1.Handle}), nil), proto.ErrNoObject, syscall.EINVAL)
	if err := r.call(wire.OpDeallocPD, wire.Bytes(&pd), nil); err != nil {
		t.Fatal("DEALLOC_PD once its windows are gone:", err)
	}
	if n := da.srv.LiveMWs(); n != 0 {
		t.Fatalf("%d live windows, want 0", n)
	}
}

// mwPair is two connected RC ends on two daemons, b's MR open to window binds.
func mwPair(t *testing.T) (a, b *end, cb *client.Conn, db *testDaemon) {
	da, db := memPair(t)
	ca, cb := da.dial(t), db.dial(t)
	a = newEnd(t, ca, 64<<10, 16, rcAccess)
	b = newEnd(t, cb, 64<<10, 16, rcAccess|mr.AccessMWBind)
	a.connect(t, ipB, b.q.Num(), 1)
	b.connect(t, ipA, a.q.Num(), 1)
	return a, b, cb, db
}

// writeStatus WRITEs 64 bytes from a into b's memory at b.iova+off through rkey and returns
// the completion's status.
func writeStatus(t *testing.T, a, b *end, wrid uint64, off uint64, rkey uint32) cq.Status {
	t.Helper()
	if _, err := a.q.PostSend([]qp.SendWR{{WRID: wrid, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
		SGL: []qp.SGE{{Addr: a.iova, Length: 64, LKey: a.m.LKey()}}, RemoteAddr: b.iova + off, RKey: rkey}}); err != nil {
		t.Fatal(err)
	}
	wc := a.wait(t, 1)[0]
	if wc.WRID != wrid || wc.Opcode != cq.OpRDMAWrite {
		t.Fatalf("WRITE completion %+v", wc)
	}
	return wc.Status
}

// reconnect replaces e's and peer's QPs with new ones connected to each other (an access
// error moves both ends of an RC connection to ERR).
func (e *end) reconnect(t *testing.T, peer *end) {
	t.Helper()
	for _, x := range []*end{e, peer} {
		q, err := x.v.CreateQP(roce.VerbsQPInit{Type: qp.TypeRC, PD: x.pd, SendCQ: x.cq, RecvCQ: x.cq,
			Cap: qp.Cap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 2, MaxRecvSGE: 2}})
		if err != nil {
			t.Fatal(err)
		}
		if err := x.q.Destroy(); err != nil {
			t.Fatal(err)
		}
		x.q = q
	}
	e.connect(t, ipB, peer.q.Num(), 1)
	peer.connect(t, ipA, e.q.Num(), 1)
}

// TestMWType1 through the daemon: a type 1 window bound by the client (Bind picks the new
// R_Key), a peer's WRITE through it lands and one outside it fails; the MR cannot be
// deregistered while the window is bound; a zero-length bind unbinds (the old R_Key gets a
// remote access error); DEALLOC_MW of a bound window invalidates its R_Key and lets the MR go;
// a QP cannot bind another client's window (MW_BIND_ERR).
func TestMWType1(t *testing.T) {
	a, b, cb, db := mwPair(t)
	w, err := cb.AllocMW(b.pd, roce.MWType1)
	if err != nil {
		t.Fatal(err)
	}
	bind := func(wrid uint64, m roce.MemoryRegion, off, n uint64) uint32 {
		t.Helper()
		k, err := w.Bind(b.q, wrid, qp.SendSignaled, m, b.iova+off, n, mr.AccessRemoteWrite)
		if err != nil {
			t.Fatal(err)
		}
		if wc := b.wait(t, 1)[0]; wc.Status != cq.StatusSuccess || wc.Opcode != cq.OpBindMW || wc.WRID != wrid {
			t.Fatalf("bind completion %+v", wc)
		}
		if k != w.RKey() || mr.KeyIndex(k) == mr.KeyIndex(b.m.RKey()) {
			t.Fatalf("bound R_Key %#x, window %#x", k, w.RKey())
		}
		return k
	}
	k1 := bind(1, b.m, 4096, 8192)
	pattern(a.buf[:64], 7)
	if s := writeStatus(t, a, b, 2, 4096, k1); s != cq.StatusSuccess || string(b.buf[4096:4160]) != string(a.buf[:64]) {
		t.Fatalf("WRITE through the window: %v", s)
	}
	if err := b.m.Dereg(); !errors.Is(err, mr.ErrBusy) || !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("DEREG_MR under a bound window: %v, want EBUSY", err)
	}
	k2 := bind(3, nil, 0, 0) // unbind
	if k2 == k1 {
		t.Fatal("unbinding kept the R_Key")
	}
	if s := writeStatus(t, a, b, 4, 4096, k1); s != cq.StatusRemAccessErr {
		t.Fatalf("WRITE through an unbound window: %v, want a remote access error", s)
	}
	a.reconnect(t, b)
	k3 := bind(5, b.m, 0, 4096)
	if s := writeStatus(t, a, b, 6, 4096, k3); s != cq.StatusRemAccessErr {
		t.Fatalf("WRITE past the window: %v, want a remote access error", s)
	}
	a.reconnect(t, b)
	if s := writeStatus(t, a, b, 7, 64, k3); s != cq.StatusSuccess {
		t.Fatalf("WRITE through the rebound window: %v", s)
	}
	if err := w.Dealloc(); err != nil {
		t.Fatal("DEALLOC_MW of a bound window:", err)
	}
	if s := writeStatus(t, a, b, 8, 64, k3); s != cq.StatusRemAccessErr {
		t.Fatalf("WRITE through a deallocated window: %v, want a remote access error", s)
	}
	// Another client's window and MR, named by their keys on b's QP: their PD is not the QP's
	// (a bind would hand b's client an R_Key to the other client's memory).
	e2 := newEnd(t, db.dial(t), 4096, 4, rcAccess|mr.AccessMWBind)
	w2, err := e2.v.(*client.Conn).AllocMW(e2.pd, roce.MWType1)
	if err != nil {
		t.Fatal(err)
	}
	a.reconnect(t, b)
	k := w2.RKey()
	if _, err := b.q.PostSend([]qp.SendWR{{WRID: 9, Opcode: qp.WRBindMW, Flags: qp.SendSignaled, Bind: &qp.BindInfo{
		MWRKey: k, NewRKey: k ^ 1, MRLKey: e2.m.LKey(), Addr: e2.iova, Length: 64, Access: uint32(mr.AccessRemoteWrite)}}}); err != nil {
		t.Fatal(err)
	}
	if wc := b.wait(t, 1)[0]; wc.Status != cq.StatusMWBindErr || wc.WRID != 9 {
		t.Fatalf("bind of another client's window: %+v, want MW_BIND_ERR", wc)
	}
	if err := b.m.Dereg(); err != nil {
		t.Fatal("DEREG_MR once its window is gone:", err)
	}
}

// TestMWType1FailedBind: a type 1 bind that completes in error (MW_BIND_ERR: a range outside
// the MR) leaves the window's R_Key as it was, while Bind already gave the program the new one;
// SetRKey puts the previous one back (a C program assigns ibv_mw.rkey), and the window binds
// again. A zero-based bind is refused at once (as ibv_bind_mw refuses it), the R_Key unchanged.
func TestMWType1FailedBind(t *testing.T) {
	a, b, cb, _ := mwPair(t)
	w, err := cb.AllocMW(b.pd, roce.MWType1)
	if err != nil {
		t.Fatal(err)
	}
	bind := func(wrid, off, n uint64, want cq.Status) uint32 {
		t.Helper()
		k, err := w.Bind(b.q, wrid, qp.SendSignaled, b.m, b.iova+off, n, mr.AccessRemoteWrite)
		if err != nil {
			t.Fatal(err)
		}
		if wc := b.wait(t, 1)[0]; wc.Status != want || wc.WRID != wrid {
			t.Fatalf("bind completion %+v, want %v", wc, want)
		}
		return k
	}
	k1 := bind(1, 0, 4096, cq.StatusSuccess)
	if k2 := bind(2, 1<<30, 64, cq.StatusMWBindErr); w.RKey() != k2 || k2 == k1 {
		t.Fatalf("after a posted bind: RKey %#x, want the bind's %#x", w.RKey(), k2)
	}
	a.reconnect(t, b)
	if s := writeStatus(t, a, b, 3, 64, k1); s != cq.StatusSuccess {
		t.Fatalf("WRITE through the R_Key the failed bind left: %v", s)
	}
	w.SetRKey(k1)
	if _, err := w.Bind(b.q, 4, qp.SendSignaled, b.m, b.iova, 64, mr.AccessRemoteWrite|mr.AccessZeroBased); !errors.Is(err, roce.ErrInvalidArg) || w.RKey() != k1 {
		t.Fatalf("zero-based type 1 bind: %v (R_Key %#x), want roce.ErrInvalidArg and %#x", err, w.RKey(), k1)
	}
	k3 := bind(5, 0, 4096, cq.StatusSuccess)
	if s := writeStatus(t, a, b, 6, 64, k3); s != cq.StatusSuccess || k3 == k1 {
		t.Fatalf("WRITE through the window bound again (%#x): %v", k3, s)
	}
}

// TestMWType2 through the daemon: BIND_MW work requests (the client's new R_Key), LOCAL_INV,
// a peer's SEND_WITH_INV (the receive completion names the R_Key, IBV_WC_WITH_INV), each
// leaving the R_Key refused; a bind whose new R_Key is not the window's is refused at post
// (EINVAL); a window of another PD is not bound (MW_BIND_ERR).
func TestMWType2(t *testing.T) {
	a, b, cb, _ := mwPair(t)
	w, err := cb.AllocMW(b.pd, roce.MWType2)
	if err != nil {
		t.Fatal(err)
	}
	inc := func(k uint32) uint32 { return mr.MakeKey(mr.KeyIndex(k), mr.KeyByte(k)+1) }
	bind := func(wrid uint64, cur uint32) uint32 {
		t.Helper()
		k := inc(cur)
		if _, err := b.q.PostSend([]qp.SendWR{{WRID: wrid, Opcode: qp.WRBindMW, Flags: qp.SendSignaled, Bind: &qp.BindInfo{
			MWRKey: cur, NewRKey: k, MRLKey: b.m.LKey(), Addr: b.iova, Length: 4096,
			Access: uint32(mr.AccessRemoteWrite | mr.AccessRemoteRead)}}}); err != nil {
			t.Fatal(err)
		}
		if wc := b.wait(t, 1)[0]; wc.Status != cq.StatusSuccess || wc.Opcode != cq.OpBindMW || wc.WRID != wrid {
			t.Fatalf("bind completion %+v", wc)
		}
		return k
	}
	k1 := bind(1, w.RKey())
	if s := writeStatus(t, a, b, 2, 128, k1); s != cq.StatusSuccess {
		t.Fatalf("WRITE through the window: %v", s)
	}
	if _, err := b.q.PostSend([]qp.SendWR{{WRID: 3, Opcode: qp.WRLocalInv, Flags: qp.SendSignaled, InvRKey: k1}}); err != nil {
		t.Fatal(err)
	}
	if wc := b.wait(t, 1)[0]; wc.Status != cq.StatusSuccess || wc.Opcode != cq.OpLocalInv || wc.WRID != 3 {
		t.Fatalf("LOCAL_INV completion %+v", wc)
	}
	if s := writeStatus(t, a, b, 4, 128, k1); s != cq.StatusRemAccessErr {
		t.Fatalf("WRITE after LOCAL_INV: %v, want a remote access error", s)
	}
	a.reconnect(t, b)
	k2 := bind(5, k1)
	if _, err := b.q.PostRecv([]qp.RecvWR{{WRID: 6, SGL: []qp.SGE{{Addr: b.iova + 8192, Length: 64, LKey: b.m.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.q.PostSend([]qp.SendWR{{WRID: 7, Opcode: qp.WRSendWithInv, Flags: qp.SendSignaled, InvRKey: k2,
		SGL: []qp.SGE{{Addr: a.iova, Length: 16, LKey: a.m.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	if wc := a.wait(t, 1)[0]; wc.Status != cq.StatusSuccess || wc.WRID != 7 {
		t.Fatalf("SEND_WITH_INV completion %+v", wc)
	}
	if wc := b.wait(t, 1)[0]; wc.Status != cq.StatusSuccess || wc.WRID != 6 || wc.Flags&cq.FlagWithInv == 0 ||
		wc.InvalidatedRKey != k2 || wc.ByteLen != 16 {
		t.Fatalf("receive of SEND_WITH_INV %+v, want IBV_WC_WITH_INV of %#x", wc, k2)
	}
	if s := writeStatus(t, a, b, 8, 128, k2); s != cq.StatusRemAccessErr {
		t.Fatalf("WRITE after SEND_WITH_INV: %v, want a remote access error", s)
	}
	a.reconnect(t, b)
	_, err = b.q.PostSend([]qp.SendWR{{WRID: 9, Opcode: qp.WRBindMW, Bind: &qp.BindInfo{MWRKey: k2, NewRKey: inc(k2) + 0x100,
		MRLKey: b.m.LKey(), Length: 64}}})
	if !errors.Is(err, mr.ErrInvalidArg) || !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("bind to an R_Key of another index: %v, want EINVAL", err)
	}
	pd2, err := cb.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	w2, err := cb.AllocMW(pd2, roce.MWType2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.q.PostSend([]qp.SendWR{{WRID: 10, Opcode: qp.WRBindMW, Flags: qp.SendSignaled, Bind: &qp.BindInfo{
		MWRKey: w2.RKey(), NewRKey: inc(w2.RKey()), MRLKey: b.m.LKey(), Addr: b.iova, Length: 64}}}); err != nil {
		t.Fatal(err)
	}
	if wc := b.wait(t, 1)[0]; wc.Status != cq.StatusMWBindErr || wc.WRID != 10 {
		t.Fatalf("bind of a window of another PD: %+v, want MW_BIND_ERR", wc)
	}
}

// TestMWSessionClose: a client that goes away holding windows (one bound to its MR, which
// it never deregistered) leaves nothing: no window, MR or PD, no charge on its user.
func TestMWSessionClose(t *testing.T) {
	_, b, cb, db := mwPair(t)
	w1, err := cb.AllocMW(b.pd, roce.MWType1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cb.AllocMW(b.pd, roce.MWType2); err != nil {
		t.Fatal(err)
	}
	if _, err := w1.Bind(b.q, 1, qp.SendSignaled, b.m, b.iova, 64, mr.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	if wc := b.wait(t, 1)[0]; wc.Status != cq.StatusSuccess {
		t.Fatalf("bind completion %+v", wc)
	}
	other := db.dial(t)
	if d, err := other.Debug(); err != nil || d.User.MRs != 3 {
		t.Fatalf("the user's mrs: %+v %v, want its MR and two windows", d.User, err)
	}
	if err := cb.Close(); err != nil {
		t.Fatal(err)
	}
	db.waitIdle(t, 1)
	if n, d := db.srv.LiveMWs(), db.srv.Debug(); n != 0 || d.MRs != 0 || d.PDs != 0 || d.QPs != 0 {
		t.Fatalf("after the client left: %d windows, %+v", n, d)
	}
	if d, err := other.Debug(); err != nil || d.User.MRs != 0 || d.User.PDs != 0 {
		t.Fatalf("the user's holdings after the client left: %+v %v", d.User, err)
	}
}

// TestMWLimit: windows count against the user's mrs limit (each holds a key of the device's
// table, as an MR does): over it, ALLOC_MW is refused with EDQUOT; a dealloc frees the room.
func TestMWLimit(t *testing.T) {
	withLimits(t, daemon.Limits{MRs: 2}, daemon.Limits{})
	da, _ := memPair(t)
	c := da.dial(t)
	e := newEnd(t, c, 4096, 4, rcAccess|mr.AccessMWBind) // one MR
	w, err := c.AllocMW(e.pd, roce.MWType2)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.AllocMW(e.pd, roce.MWType1)
	wantLimit(t, "a window over the mrs limit", err, "mrs")
	if !errors.Is(err, syscall.EDQUOT) {
		t.Fatalf("%v: want EDQUOT", err)
	}
	if d, err := c.Debug(); err != nil || d.User.MRs != 2 || d.Refused.MRs != 1 {
		t.Fatalf("Debug: user %+v refused %+v (%v)", d.User, d.Refused, err)
	}
	if err := w.Dealloc(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AllocMW(e.pd, roce.MWType1); err != nil {
		t.Fatal("a window once another was deallocated:", err)
	}
}
