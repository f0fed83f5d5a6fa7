package daemon_test

import (
	"bytes"
	"errors"
	"net"
	"os"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/roce"
)

// raw is a protocol-level client: it sends whatever handles it likes.
type raw struct {
	t *testing.T
	c *net.UnixConn
}

func dialRaw(t *testing.T, sock string) *raw {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	r := &raw{t: t, c: c}
	if err := r.call(wire.OpHello, wire.Bytes(&wire.HelloReq{Magic: wire.Magic, Version: wire.Version}), nil); err != nil {
		t.Fatal(err)
	}
	return r
}

// call sends op with body (a wire struct's bytes) and fds, copies the response
// body into out and returns the error response, if any.
func (r *raw) call(op wire.Op, body, out []byte, fds ...int) error {
	r.t.Helper()
	return r.send(proto.AppendRequest(nil, op, body), out, fds...)
}

// send sends a whole message (e.g. a post) and reads the response as call does.
func (r *raw) send(msg, out []byte, fds ...int) error {
	r.t.Helper()
	got, err := r.sendFDs(msg, out, fds...)
	proto.CloseFDs(got)
	return err
}

// callFDs is call returning the fds that came with the response.
func (r *raw) callFDs(op wire.Op, body, out []byte) ([]int, error) {
	r.t.Helper()
	return r.sendFDs(proto.AppendRequest(nil, op, body), out)
}

func (r *raw) sendFDs(msg, out []byte, fds ...int) ([]int, error) {
	r.t.Helper()
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := r.c.WriteMsgUnix(msg, oob, nil); err != nil {
		r.t.Fatal(err)
	}
	buf := make([]byte, proto.MaxMsg)
	oobBuf := make([]byte, 256)
	n, oobn, _, _, err := r.c.ReadMsgUnix(buf, oobBuf)
	if err != nil {
		r.t.Fatal(err)
	}
	got := proto.ParseRights(oobBuf[:oobn])
	h, b, ok := proto.ParseHdr(buf[:n])
	if !ok {
		r.t.Fatalf("%d-byte response", n)
	}
	if h.Status != 0 {
		_, err := proto.ResponseError(h, b)
		return got, err
	}
	copy(out, b)
	return got, nil
}

// TestIsolation: a client cannot name another client's objects through the
// socket (every handle number is tried with every operation), cannot use
// another client's lkey in its own work requests, cannot register memory
// that is not a sealed memfd, and reaches another client's memory only
// through an rkey over the wire, with the usual access checks.
func TestIsolation(t *testing.T) {
	da, db := memPair(t)
	victimConn := da.dial(t)
	victim := newEnd(t, victimConn, 1<<16, 8, mr.AccessLocalWrite) // no remote access
	pattern(victim.buf, 9)
	orig := append([]byte(nil), victim.buf...)
	vSRQ, err := victimConn.CreateSRQ(qp.SRQOptions{MaxWR: 4, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	_ = vSRQ

	// 1. Handles: the attacker's session has no objects; every handle the
	// victim could have (1..64) names nothing, for every operation.
	atk := dialRaw(t, da.sock)
	for h := uint32(0); h <= 64; h++ {
		hr := wire.Bytes(&wire.Handle{Handle: h})
		checks := []struct {
			name string
			err  error
		}{
			{"DeallocPD", atk.call(wire.OpDeallocPD, hr, nil)},
			{"DeregMR", atk.call(wire.OpDeregMR, hr, nil)},
			{"DestroyCQ", atk.call(wire.OpDestroyCQ, hr, nil)},
			{"ModifyCQ", atk.call(wire.OpModifyCQ, wire.Bytes(&wire.ModifyCQReq{Handle: h, CQCount: 4}), nil)},
			{"DestroySRQ", atk.call(wire.OpDestroySRQ, hr, nil)},
			{"QuerySRQ", atk.call(wire.OpQuerySRQ, hr, nil)},
			{"ModifySRQ", atk.call(wire.OpModifySRQ, wire.Bytes(&wire.ModifySRQReq{Handle: h, AttrMask: uint32(qp.SRQLimit), SRQLimit: 1}), nil)},
			{"DestroyQP", atk.call(wire.OpDestroyQP, hr, nil)},
			{"QueryQP", atk.call(wire.OpQueryQP, wire.Bytes(&wire.QueryQPReq{Handle: h}), nil)},
			{"ModifyQP", atk.call(wire.OpModifyQP, wire.Bytes(&wire.ModifyQPReq{Handle: h, AttrMask: uint32(qp.AttrState),
				Attr: wire.QPAttr{QPState: uint8(qp.StateErr)}}), nil)},
			{"CreateQP", atk.call(wire.OpCreateQP, wire.Bytes(&wire.CreateQPReq{QPType: uint8(qp.TypeRC), PD: h, SendCQ: h, RecvCQ: h}), nil)},
			{"CreateAH", atk.call(wire.OpCreateAH, wire.Bytes(&wire.CreateAHReq{PD: h, Attr: wire.AHAttr{DGID: ipB.As16(), SGIDIndex: 1}}), nil)},
			{"CMDestroyChannel", atk.call(wire.OpCMDestroyChannel, hr, nil)},
			{"CMCreateID", atk.call(wire.OpCMCreateID, wire.Bytes(&wire.CMCreateIDReq{Channel: h, PortSpace: 0x0106}), nil)},
			{"CMGetEvents", atk.call(wire.OpCMGetEvents, wire.Bytes(&wire.CMGetEventsReq{Channel: h}), nil)},
			{"CMDestroyID", atk.call(wire.OpCMDestroyID, hr, nil)},
			{"CMQueryID", atk.call(wire.OpCMQueryID, hr, nil)},
		}
		post, _ := proto.AppendPostSend(nil, wire.OpPostSend, proto.Handle(h), []qp.SendWR{{Opcode: qp.WRSend}})
		checks = append(checks, struct {
			name string
			err  error
		}{"PostSend", atk.send(post, nil)})
		recv, _ := proto.AppendPostRecv(nil, wire.OpPostRecv, proto.Handle(h), []qp.RecvWR{{WRID: 1}})
		checks = append(checks, struct {
			name string
			err  error
		}{"PostRecv", atk.send(recv, nil)})
		srecv, _ := proto.AppendPostRecv(nil, wire.OpPostSRQRecv, proto.Handle(h), []qp.RecvWR{{WRID: 1}})
		checks = append(checks, struct {
			name string
			err  error
		}{"PostSRQRecv", atk.send(srecv, nil)})
		for _, c := range checks {
			if !errors.Is(c.err, proto.ErrNoObject) || !errors.Is(c.err, syscall.EINVAL) {
				t.Fatalf("%s(handle %d) by another client: %v, want ErrNoObject", c.name, h, c.err)
			}
		}
	}
	// The victim's objects are intact.
	if st := victim.q.State(); st != qp.StateReset {
		t.Fatalf("victim QP state %v", st)
	}
	var dbg wire.Debug
	if err := atk.call(wire.OpDebug, nil, wire.Bytes(&dbg)); err != nil || dbg.MineQPs != 0 || dbg.QPs != 1 || dbg.SRQs != 1 {
		t.Fatalf("debug %+v %v", dbg, err)
	}

	// 2. Memory that is not a sealed memfd is refused (a plain file, an unsealed memfd).
	var pd wire.Handle
	if err := atk.call(wire.OpAllocPD, nil, wire.Bytes(&pd)); err != nil {
		t.Fatal(err)
	}
	memfdMR := func(off uint64) []byte {
		return wire.Bytes(&wire.RegMRReq{PD: pd.Handle, Length: 4096, Offset: off, Access: 1, Source: wire.MRMemfd})
	}
	f, err := os.CreateTemp(t.TempDir(), "plain")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Truncate(1 << 16)
	if err := atk.call(wire.OpRegMR, memfdMR(0), nil, int(f.Fd())); !errors.Is(err, proto.ErrNotShareable) || !errors.Is(err, syscall.EFAULT) {
		t.Fatalf("RegMR of a plain file: %v", err)
	}
	ufd, err := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	unix.Ftruncate(ufd, 1<<16)
	if err := atk.call(wire.OpRegMR, memfdMR(0), nil, ufd); !errors.Is(err, proto.ErrNotShareable) {
		t.Fatalf("RegMR of an unsealed memfd: %v", err)
	}
	unix.Close(ufd)
	sfd, mem, err := proto.NewMemfd("sealed", 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	if err := atk.call(wire.OpRegMR, memfdMR(1<<16), nil, sfd); !errors.Is(err, proto.ErrNotShareable) {
		t.Fatalf("RegMR beyond the memfd: %v", err)
	}
	proto.CloseFD(sfd)
	proto.Unmap(mem)

	// 3. Keys. A second client (on the same daemon) with its own QP to a
	// third client on daemon B uses the victim's lkey in its SGE: local
	// protection error, nothing sent from the victim's memory.
	other := newEnd(t, da.dial(t), 1<<16, 8, rcAccess)
	peer := newEnd(t, db.dial(t), 1<<16, 8, rcAccess)
	other.connect(t, ipB, peer.q.Num(), 1)
	peer.connect(t, ipA, other.q.Num(), 1)
	if _, err := other.q.PostSend([]qp.SendWR{{WRID: 1, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
		SGL:        []qp.SGE{{Addr: victim.iova, Length: 4096, LKey: victim.m.LKey()}},
		RemoteAddr: peer.iova, RKey: peer.m.RKey()}}); err != nil {
		t.Fatal(err)
	}
	if wc := other.wait(t, 1)[0]; wc.Status != cq.StatusLocProtErr {
		t.Fatalf("WRITE from another client's lkey: %v, want %v", wc.Status, cq.StatusLocProtErr)
	}
	if bytes.Equal(peer.buf[:4096], victim.buf[:4096]) {
		t.Fatal("the victim's memory reached the wire")
	}
	// RECV into the victim's lkey: the receive completes in error, the victim's memory is untouched.
	other2 := newEnd(t, da.dial(t), 1<<16, 8, rcAccess)
	peer2 := newEnd(t, db.dial(t), 1<<16, 8, rcAccess)
	other2.connect(t, ipB, peer2.q.Num(), 1)
	peer2.connect(t, ipA, other2.q.Num(), 1)
	if _, err := other2.q.PostRecv([]qp.RecvWR{{WRID: 5, SGL: []qp.SGE{{Addr: victim.iova, Length: 4096, LKey: victim.m.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := peer2.q.PostSend([]qp.SendWR{{WRID: 6, Opcode: qp.WRSend, Flags: qp.SendSignaled,
		SGL: []qp.SGE{{Addr: peer2.iova, Length: 4096, LKey: peer2.m.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	if wc := other2.wait(t, 1)[0]; wc.Status != cq.StatusLocProtErr {
		t.Fatalf("RECV into another client's lkey: %v", wc.Status)
	}

	// 4. Over the wire: the victim's QP, connected to a client of daemon B,
	// exposes an MR without remote write: a WRITE with its rkey fails the
	// usual check (remote access error) and leaves the memory unchanged.
	peer3 := newEnd(t, db.dial(t), 1<<16, 8, rcAccess)
	victim.connect(t, ipB, peer3.q.Num(), 1)
	peer3.connect(t, ipA, victim.q.Num(), 1)
	if _, err := peer3.q.PostSend([]qp.SendWR{{WRID: 7, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
		SGL:        []qp.SGE{{Addr: peer3.iova, Length: 4096, LKey: peer3.m.LKey()}},
		RemoteAddr: victim.iova, RKey: victim.m.RKey()}}); err != nil {
		t.Fatal(err)
	}
	if wc := peer3.wait(t, 1)[0]; wc.Status != cq.StatusRemAccessErr {
		t.Fatalf("WRITE without remote-write access: %v, want %v", wc.Status, cq.StatusRemAccessErr)
	}
	if !bytes.Equal(victim.buf, orig) {
		t.Fatal("the victim's memory changed")
	}

	// 5. Objects of another connection are refused client-side too.
	if _, err := other.v.RegMR(victim.pd, other.buf, 0, mr.AccessLocalWrite); !errors.Is(err, roce.ErrInvalidArg) {
		t.Fatalf("RegMR with another connection's PD: %v", err)
	}
	// Another connection's buffer in the same process is this program's memory too: it is
	// registered where it is (process memory), not shared through the other connection's memfd.
	if m, err := other.v.RegMR(other.pd, victim.buf, 0, mr.AccessLocalWrite); err != nil {
		t.Fatalf("RegMR of the program's own memory from another connection: %v", err)
	} else if err := m.Dereg(); err != nil {
		t.Fatal(err)
	}
}
