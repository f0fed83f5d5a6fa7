package daemon_test

import (
	"context"
	"errors"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/qp"
)

func fdCount(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestDisconnectReleasesEverything: a client that goes away without
// destroying anything (its socket just closes, as when the process dies)
// loses every object: QPs to ERR and destroyed (its peer's next requests
// end in RETRY_EXC_ERR), MRs deregistered and unmapped, rings unmapped,
// eventfds closed, goroutines ended. Other clients are unaffected.
func TestDisconnectReleasesEverything(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	// Registered first, so it runs after every other cleanup (clients closed, daemons stopped).
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	da, db := memPair(t)
	bystander := newEnd(t, da.dial(t), 1<<16, 8, rcAccess)
	bpeer := newEnd(t, db.dial(t), 1<<16, 8, rcAccess)
	bystander.connect(t, ipB, bpeer.q.Num(), 1)
	bpeer.connect(t, ipA, bystander.q.Num(), 1)
	peer := newEnd(t, db.dial(t), 1<<20, 16, rcAccess)
	base := da.srv.Debug()
	fds := fdCount(t)

	gone, err := dialNoCleanup(da.sock)
	if err != nil {
		t.Fatal(err)
	}
	a := newEnd(t, gone, 1<<20, 16, rcAccess)
	if _, err := gone.CreateSRQ(qp.SRQOptions{MaxWR: 8, MaxSGE: 1}); err != nil {
		t.Fatal(err)
	}
	extra, _ := gone.AllocBuffer(1 << 16)
	if _, err := gone.RegMR(a.pd, extra, 0x900000, rcAccess); err != nil {
		t.Fatal(err)
	}
	a.connect(t, ipB, peer.q.Num(), 1)
	peer.connect(t, ipA, a.q.Num(), 1)
	// Outstanding work on the departing client: receives and a WRITE.
	for i := 0; i < 4; i++ {
		if _, err := a.q.PostRecv([]qp.RecvWR{{WRID: uint64(i), SGL: []qp.SGE{{Addr: a.iova, Length: 64, LKey: a.m.LKey()}}}}); err != nil {
			t.Fatal(err)
		}
	}
	peer.write(t, 1, 0, 65536, a, 0)
	if wc := peer.wait(t, 1)[0]; wc.Status != cq.StatusSuccess {
		t.Fatalf("WRITE before the disconnect: %+v", wc)
	}
	if d := da.srv.Debug(); d.QPs != base.QPs+1 || d.MRs != base.MRs+2 || d.CQs != base.CQs+1 || d.SRQs != 1 || d.MappedBytes <= base.MappedBytes {
		t.Fatalf("objects while connected: %+v (base %+v)", d, base)
	}

	gone.Close() // the socket closes; nothing was destroyed by the client
	// (The client's own memfds are the client's: a dead process loses them.)
	gone.FreeBuffer(a.buf)
	gone.FreeBuffer(extra)
	da.waitIdle(t, 1)
	d := da.srv.Debug()
	if d.QPs != base.QPs || d.MRs != base.MRs || d.CQs != base.CQs || d.PDs != base.PDs || d.SRQs != 0 || d.MappedBytes != base.MappedBytes {
		t.Fatalf("after disconnect: %+v, want %+v", d, base)
	}
	if got := fdCount(t); got != fds {
		t.Fatalf("open fds %d after disconnect, %d before", got, fds)
	}

	// The peer's QP: its next WRITE is never acknowledged -> retry exceeded.
	peer.write(t, 2, 0, 4096, a, 0)
	if wc := peer.wait(t, 1)[0]; wc.Status != cq.StatusRetryExcErr {
		t.Fatalf("peer of a departed client: %v, want %v", wc.Status, cq.StatusRetryExcErr)
	}
	// The bystander still works.
	pattern(bystander.buf, 4)
	bystander.write(t, 3, 0, 65536, bpeer, 0)
	if wc := bystander.wait(t, 1)[0]; wc.Status != cq.StatusSuccess {
		t.Fatalf("bystander: %+v", wc)
	}
}

// TestShutdownFlushes: Shutdown moves client QPs to ERR; outstanding work
// requests complete with WR_FLUSH_ERR in the client's ring (readable after
// the daemon is gone), and further control calls report the disconnect.
func TestShutdownFlushes(t *testing.T) {
	da, db := memPair(t)
	c := da.dial(t)
	a := newEnd(t, c, 1<<16, 16, rcAccess)
	// The peer QP stays in RESET: requests to it are dropped, so sends stay outstanding.
	peer := newEnd(t, db.dial(t), 1<<16, 16, rcAccess)
	a.timeout = 0 // infinite: nothing completes until the flush
	a.connect(t, ipB, peer.q.Num(), 1)
	for i := 0; i < 4; i++ {
		if _, err := a.q.PostRecv([]qp.RecvWR{{WRID: 100 + uint64(i), SGL: []qp.SGE{{Addr: a.iova, Length: 64, LKey: a.m.LKey()}}}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 3; i++ {
		a.write(t, 200+uint64(i), 0, 1024, peer, 0)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := da.srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	wcs := make([]cq.WC, 16)
	n := a.cq.Poll(wcs)
	if n != 7 {
		t.Fatalf("%d completions after shutdown, want 7: %+v", n, wcs[:n])
	}
	seen := map[uint64]bool{}
	for _, wc := range wcs[:n] {
		if wc.Status != cq.StatusWRFlushErr {
			t.Fatalf("completion %+v, want WR_FLUSH_ERR", wc)
		}
		seen[wc.WRID] = true
	}
	for _, id := range []uint64{100, 101, 102, 103, 200, 201, 202} {
		if !seen[id] {
			t.Fatalf("no flush completion for WR %d", id)
		}
	}
	if _, err := c.AllocPD(); !errors.Is(err, proto.ErrDisconnected) {
		t.Fatalf("AllocPD after shutdown: %v", err)
	}
	// A post the client would have put in the post ring fails too (it does not vanish).
	if _, err := a.q.PostRecv([]qp.RecvWR{{WRID: 300, SGL: []qp.SGE{{Addr: a.iova, Length: 64, LKey: a.m.LKey()}}}}); !errors.Is(err, proto.ErrDisconnected) {
		t.Fatalf("PostRecv after shutdown: %v", err)
	}
}
