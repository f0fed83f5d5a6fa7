package daemon_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/daemon/proto"
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
	return &raw{t: t, c: c}
}

// call sends op+JSON(req) (or op+bin when req is []byte) with fds and returns the error response, if any.
func (r *raw) call(op proto.Op, req any, out any, fds ...int) error {
	r.t.Helper()
	msg := []byte{byte(op)}
	if b, ok := req.([]byte); ok {
		msg = b
	} else if req != nil {
		j, _ := json.Marshal(req)
		msg = append(msg, j...)
	}
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
	proto.CloseFDs(proto.ParseRights(oobBuf[:oobn]))
	if buf[0] != proto.StatusOK {
		var e proto.ErrorBody
		if err := json.Unmarshal(buf[1:n], &e); err != nil {
			r.t.Fatal(err)
		}
		return proto.FromBody(e)
	}
	if out != nil {
		if err := json.Unmarshal(buf[1:n], out); err != nil {
			r.t.Fatal(err)
		}
	}
	return nil
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
	for h := proto.Handle(0); h <= 64; h++ {
		hr := proto.HandleReq{H: h}
		checks := []struct {
			name string
			err  error
		}{
			{"DeallocPD", atk.call(proto.OpDeallocPD, hr, nil)},
			{"DeregMR", atk.call(proto.OpDeregMR, hr, nil)},
			{"DestroyCQ", atk.call(proto.OpDestroyCQ, hr, nil)},
			{"DestroySRQ", atk.call(proto.OpDestroySRQ, hr, nil)},
			{"QuerySRQ", atk.call(proto.OpQuerySRQ, hr, nil)},
			{"ModifySRQ", atk.call(proto.OpModifySRQ, proto.ModifySRQReq{H: h, Mask: qp.SRQLimit, Attr: qp.SRQAttr{SRQLimit: 1}}, nil)},
			{"DestroyQP", atk.call(proto.OpDestroyQP, hr, nil)},
			{"QueryQP", atk.call(proto.OpQueryQP, hr, nil)},
			{"ModifyQP", atk.call(proto.OpModifyQP, proto.ModifyQPReq{H: h, Attr: qp.Attr{State: qp.StateErr}, Mask: qp.AttrState}, nil)},
			{"CreateQP", atk.call(proto.OpCreateQP, proto.CreateQPReq{Type: qp.TypeRC, PD: h, SendCQ: h, RecvCQ: h}, nil)},
			{"CreateAH", atk.call(proto.OpCreateAH, proto.CreateAHReq{PD: h, Attr: qp.AHAttr{DGID: ipB, SGIDIndex: 1}}, nil)},
		}
		post, _ := proto.AppendPostSend(nil, proto.OpPostSend, h, []qp.SendWR{{Opcode: qp.WRSend}})
		checks = append(checks, struct {
			name string
			err  error
		}{"PostSend", atk.call(0, post, nil)})
		recv, _ := proto.AppendPostRecv(nil, proto.OpPostRecv, h, []qp.RecvWR{{WRID: 1}})
		checks = append(checks, struct {
			name string
			err  error
		}{"PostRecv", atk.call(0, recv, nil)})
		srecv, _ := proto.AppendPostRecv(nil, proto.OpPostSRQRecv, h, []qp.RecvWR{{WRID: 1}})
		checks = append(checks, struct {
			name string
			err  error
		}{"PostSRQRecv", atk.call(0, srecv, nil)})
		for _, c := range checks {
			if !errors.Is(c.err, proto.ErrNoObject) {
				t.Fatalf("%s(handle %d) by another client: %v, want ErrNoObject", c.name, h, c.err)
			}
		}
	}
	// The victim's objects are intact.
	if st := victim.q.State(); st != qp.StateReset {
		t.Fatalf("victim QP state %v", st)
	}
	var dbg proto.Debug
	if err := atk.call(proto.OpDebug, nil, &dbg); err != nil || dbg.Mine.QPs != 0 || dbg.QPs != 1 || dbg.SRQs != 1 {
		t.Fatalf("debug %+v %v", dbg, err)
	}

	// 2. Memory that is not a sealed memfd is refused (a plain file, an unsealed memfd).
	var pd proto.HandleResp
	if err := atk.call(proto.OpAllocPD, nil, &pd); err != nil {
		t.Fatal(err)
	}
	f, err := os.CreateTemp(t.TempDir(), "plain")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Truncate(1 << 16)
	if err := atk.call(proto.OpRegMR, proto.RegMRReq{PD: pd.H, Len: 4096, Access: 1}, nil, int(f.Fd())); !errors.Is(err, proto.ErrNotShareable) {
		t.Fatalf("RegMR of a plain file: %v", err)
	}
	ufd, err := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	unix.Ftruncate(ufd, 1<<16)
	if err := atk.call(proto.OpRegMR, proto.RegMRReq{PD: pd.H, Len: 4096, Access: 1}, nil, ufd); !errors.Is(err, proto.ErrNotShareable) {
		t.Fatalf("RegMR of an unsealed memfd: %v", err)
	}
	unix.Close(ufd)
	sfd, mem, err := proto.NewMemfd("sealed", 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	if err := atk.call(proto.OpRegMR, proto.RegMRReq{PD: pd.H, Off: 1 << 16, Len: 4096, Access: 1}, nil, sfd); !errors.Is(err, proto.ErrNotShareable) {
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
	if _, err := other.v.RegMR(other.pd, victim.buf, 0, mr.AccessLocalWrite); !errors.Is(err, proto.ErrNotShareable) {
		t.Fatalf("RegMR of another connection's buffer: %v", err)
	}
}
