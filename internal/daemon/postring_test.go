package daemon_test

import (
	"bytes"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/internal/qp"
)

// TestPostRingCarriesPosts: asynchronous posts travel through the shared
// post ring, not the socket (the daemon's counters), in order, and their
// completions arrive; a synchronous post (unsignaled WR) afterwards still
// goes over the socket and lands after the ring's posts.
func TestPostRingCarriesPosts(t *testing.T) {
	t.Run("sleeping drainer", func(t *testing.T) { testPostRingCarriesPosts(t) })
	t.Run("spinning drainer", func(t *testing.T) {
		testPostSpin = 50 * time.Microsecond
		defer func() { testPostSpin = 0 }()
		testPostRingCarriesPosts(t)
	})
}

func testPostRingCarriesPosts(t *testing.T) {
	da, db := memPair(t)
	a := newEnd(t, da.dial(t), 1<<20, 64, rcAccess)
	b := newEnd(t, db.dial(t), 1<<20, 64, rcAccess)
	a.connect(t, ipB, b.q.Num(), 1)
	b.connect(t, ipA, a.q.Num(), 1)
	base := da.srv.Debug()
	pattern(a.buf, 5)
	const n = 48
	for i := 0; i < n; i++ {
		a.write(t, uint64(i), i*16384, 16384, b, i*16384)
	}
	got := a.wait(t, n)
	for i, wc := range got {
		if wc.Status != cq.StatusSuccess || wc.WRID != uint64(i) {
			t.Fatalf("completion %d: %+v", i, wc)
		}
	}
	if !bytes.Equal(a.buf[:n*16384], b.buf[:n*16384]) {
		t.Fatal("data differs")
	}
	d := da.srv.Debug()
	if d.RingPosts-base.RingPosts != n || d.SocketPosts != base.SocketPosts {
		t.Fatalf("ring posts %d, socket posts %d; want %d, 0", d.RingPosts-base.RingPosts, d.SocketPosts-base.SocketPosts, n)
	}
	// Unsignaled: the client cannot vouch for it, so it is a round trip.
	if _, err := a.q.PostSend([]qp.SendWR{{WRID: 99, Opcode: qp.WRRDMAWrite,
		SGL: []qp.SGE{{Addr: a.iova, Length: 8, LKey: a.m.LKey()}}, RemoteAddr: b.iova, RKey: b.m.RKey()}}); err != nil {
		t.Fatal(err)
	}
	if d2 := da.srv.Debug(); d2.SocketPosts != d.SocketPosts+1 {
		t.Fatalf("socket posts %d, want %d", d2.SocketPosts, d.SocketPosts+1)
	}
}

// rawRing is an attacker's view of its own connection's post ring.
func openRawRing(t *testing.T, r *raw) (*proto.PostRing, int) {
	t.Helper()
	if _, _, err := r.c.WriteMsgUnix(proto.AppendRequest(nil, wire.OpOpenRings, nil), nil, nil); err != nil {
		t.Fatal(err)
	}
	buf, oob := make([]byte, 4096), make([]byte, 256)
	n, oobn, _, _, err := r.c.ReadMsgUnix(buf, oob)
	h, body, _ := proto.ParseHdr(buf[:n])
	if err != nil || h.Status != 0 {
		t.Fatalf("OpOpenRings: %v %q", err, buf[:n])
	}
	var resp wire.OpenRingsResp
	if _, ok := wire.Read(body, &resp); !ok {
		t.Fatalf("%d-byte response", len(body))
	}
	fds := proto.ParseRights(oob[:oobn])
	if len(fds) != 3 { // ring memfd, doorbell, event eventfd
		t.Fatalf("%d fds", len(fds))
	}
	proto.CloseFD(fds[2])
	mem, err := unix.Mmap(fds[0], 0, int(resp.Bytes), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	proto.CloseFD(fds[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem); proto.CloseFD(fds[1]) })
	ring, ok := proto.NewPostRing(mem, true)
	if !ok {
		t.Fatal("ring view")
	}
	// A second ring for the same connection is refused.
	if err := r.call(wire.OpOpenRings, nil, nil); err == nil {
		t.Fatal("second post ring accepted")
	}
	return ring, fds[1]
}

// TestPostRingAttack: a client writing into its post ring reaches nothing of
// another client (every handle 0..64 with the victim's lkey: no completion,
// no byte moved, the victim's QP still works), and a corrupt ring only
// disconnects that client; the daemon keeps serving the others.
func TestPostRingAttack(t *testing.T) {
	da, db := memPair(t)
	v := newEnd(t, da.dial(t), 1<<16, 8, rcAccess)
	p := newEnd(t, db.dial(t), 1<<16, 8, rcAccess)
	v.connect(t, ipB, p.q.Num(), 1)
	p.connect(t, ipA, v.q.Num(), 1)
	pattern(v.buf, 3)
	orig := append([]byte(nil), v.buf...)

	atk := dialRaw(t, da.sock)
	ring, bell := openRawRing(t, atk)
	put := func(msg []byte) {
		if ok, _ := ring.Write(msg); !ok {
			t.Fatal("ring full")
		}
		proto.Signal(bell)
	}
	for h := proto.Handle(0); h <= 64; h++ {
		s, _ := proto.AppendPostSend(nil, wire.OpPostSendAsync, h, []qp.SendWR{{WRID: 1, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
			SGL: []qp.SGE{{Addr: v.iova, Length: 4096, LKey: v.m.LKey()}}, RemoteAddr: p.iova, RKey: p.m.RKey()}})
		put(s)
		r, _ := proto.AppendPostRecv(nil, wire.OpPostRecvAsync, h, []qp.RecvWR{{WRID: 2, SGL: []qp.SGE{{Addr: v.iova, Length: 4096, LKey: v.m.LKey()}}}})
		put(r)
		put(proto.AppendRequest(nil, wire.OpPostSendAsync, []byte{1, 2})) // truncated post: refused, no effect
	}
	// The attacker's own connection still works: the daemon drained the
	// ring before answering this request.
	if err := atk.call(wire.OpDebug, nil, nil); err != nil {
		t.Fatal(err)
	}
	// A record that is not a post: the daemon disconnects the attacker.
	put(proto.AppendRequest(nil, wire.OpAllocPD, nil))
	atk.c.SetReadDeadline(time.Now().Add(waitLimit))
	if n, err := atk.c.Read(make([]byte, 64)); err == nil && n > 0 {
		t.Fatalf("attacker still connected (read %d bytes)", n)
	}
	da.waitIdle(t, 1)

	if k := v.cq.Poll(v.wc); k != 0 {
		t.Fatalf("victim got %d completions from the attacker's ring: %+v", k, v.wc[:k])
	}
	if !bytes.Equal(v.buf, orig) || !bytes.Equal(p.buf, make([]byte, len(p.buf))) {
		t.Fatal("the attacker moved bytes")
	}
	// The victim's QP is untouched: a WRITE through it completes.
	v.write(t, 7, 0, 8192, p, 0)
	if wc := v.wait(t, 1)[0]; wc.Status != cq.StatusSuccess || wc.WRID != 7 {
		t.Fatalf("victim WRITE after the attack: %+v", wc)
	}
	if !bytes.Equal(p.buf[:8192], v.buf[:8192]) {
		t.Fatal("victim WRITE data")
	}
}
