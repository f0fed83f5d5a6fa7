package daemon

import (
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/roce"
)

// memServer is a server on an in-memory device, for tests that drive sessions directly.
func memServer(t *testing.T) *Server {
	t.Helper()
	l, err := mem.NewNetwork(mem.Options{}).Attach(netip.MustParseAddr("10.7.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	dev, err := roce.Open(roce.Options{Link: l})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	srv, err := New(Options{Device: dev, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

// requestFDs serves one request on ss and returns the response body (or its error) and the
// fds it sends.
func (ss *session) requestFDs(t *testing.T, op wire.Op, body []byte) ([]byte, []int, error) {
	t.Helper()
	var fds []int
	ss.wbuf = ss.wbuf[:0]
	rights := ss.handle(proto.AppendRequest(nil, op, body), &fds)
	proto.CloseFDs(fds)
	out := proto.ParseRights(rights)
	h, b, _ := proto.ParseHdr(ss.wbuf)
	if h.Status != 0 {
		_, err := proto.ResponseError(h, b)
		return nil, out, err
	}
	return b, out, nil
}

// TestResizeCQRing: OpResizeCQ on a client's ring holding unpolled completions and, behind a
// full ring, completions the engine CQ kept. A size below all of them is EINVAL and changes
// nothing; a size that holds them moves them, in order, at the same counters, into the new
// ring the response's memfd maps, and the arm (a sleeping one) carries over: the kept
// completions that follow take it and write the notify eventfd. The new ring's size is the
// next power of two, the response's cqe the one asked; out-of-range sizes, another handle and
// a head the daemon cannot believe are refused; the charges follow the ring.
func TestResizeCQRing(t *testing.T) {
	srv := memServer(t)
	ss := testSession(srv, 1)
	b, fds, err := ss.requestFDs(t, wire.OpCreateCQ, wire.Bytes(&wire.CreateCQReq{CQE: 4}))
	if err != nil || len(fds) != 3 {
		t.Fatalf("CreateCQ: %v, %d fds", err, len(fds))
	}
	defer proto.CloseFDs(fds)
	var cr wire.CreateCQResp
	wire.Read(b, &cr)
	o := ss.objs[proto.Handle(cr.Handle)].(*cqObj)
	for id := uint64(1); id <= 6; id++ { // 4 in the ring, 2 kept by the engine CQ
		o.c.Push(&cq.WC{WRID: id}, false)
	}
	if o.ring.Tail() != 4 || o.c.Len() != 2 || !o.ring.TakeWaiting() {
		t.Fatalf("ring tail %d, kept %d", o.ring.Tail(), o.c.Len())
	}
	o.ring.Consume(1) // the client polled one: 3 in the ring, 2 kept
	o.ring.Arm(proto.ArmNext, true)
	used := srv.acct.usedBy(ss.ten)

	resize := func(h, cqe uint32) (wire.ResizeCQResp, []int, error) {
		var r wire.ResizeCQResp
		b, fds, err := ss.requestFDs(t, wire.OpResizeCQ, wire.Bytes(&wire.ResizeCQReq{Handle: h, CQE: cqe}))
		wire.Read(b, &r)
		return r, fds, err
	}
	for _, c := range []struct {
		h, cqe uint32
		code   wire.Code
	}{{cr.Handle, 4, wire.CodeCQCapacity}, {cr.Handle, 0, wire.CodeCQCapacity},
		{cr.Handle, uint32(srv.dev.Attr().MaxCQE) + 1, wire.CodeCQCapacity}, {cr.Handle + 9, 8, wire.CodeNoObject}} {
		_, fds, err := resize(c.h, c.cqe)
		if proto.CodeOf(err) != c.code || !errors.Is(err, syscall.EINVAL) || len(fds) != 0 {
			t.Fatalf("resize %d to %d: %v (%d fds), want code %d, EINVAL", c.h, c.cqe, err, len(fds), c.code)
		}
	}
	if o.ring.Tail() != 4 || o.c.Len() != 2 || o.ring.Armed() != proto.ArmNext || srv.acct.usedBy(ss.ten) != used {
		t.Fatal("a refused resize changed the CQ")
	}

	r, nfds, err := resize(cr.Handle, 5)
	if err != nil || len(nfds) != 1 || r.CQE != 5 || r.Entries != 8 || r.Bytes != uint32(proto.RingBytes(8)) {
		t.Fatalf("resize to 5: %v, %d fds, %+v", err, len(nfds), r)
	}
	m, err := unix.Mmap(nfds[0], 0, int(r.Bytes), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	proto.CloseFDs(nfds)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	ring, _ := proto.NewRing(m, int(r.Entries))
	if ring.Head() != 1 || ring.Tail() != 6 || o.c.Len() != 0 || ring.TakeWaiting() {
		t.Fatalf("new ring: head %d tail %d, kept %d", ring.Head(), ring.Tail(), o.c.Len())
	}
	var wc cq.WC
	for pos := uint64(1); pos < 6; pos++ {
		if ring.Get(pos, &wc); wc.WRID != pos+1 {
			t.Fatalf("entry %d: completion %d, want %d (in order, none lost or doubled)", pos, wc.WRID, pos+1)
		}
	}
	var ev [8]byte
	if ring.Armed() != proto.ArmNone {
		t.Fatal("the arm did not carry over to be taken by the moved completions")
	}
	if n, _ := unix.Read(o.notifyFD, ev[:]); n != 8 {
		t.Fatal("the sleeping arm taken in the new ring wrote no notify eventfd")
	}
	o.c.Push(&cq.WC{WRID: 7}, false)
	if ring.Get(6, &wc); ring.Tail() != 7 || wc.WRID != 7 {
		t.Fatalf("a later completion: tail %d, entry %+v", ring.Tail(), wc)
	}
	if u := srv.acct.usedBy(ss.ten); u[resMappedBytes] != used[resMappedBytes]-int64(proto.RingBytes(4))+int64(proto.RingBytes(8)) ||
		u[resMappings] != used[resMappings] {
		t.Fatalf("charges after the resize: %+v, before %+v", u, used)
	}

	ring.Consume(9) // a head beyond the tail: the daemon cannot believe it
	if _, _, err := resize(cr.Handle, 64); proto.CodeOf(err) != wire.CodeCQCapacity {
		t.Fatalf("resize with a corrupt head: %v", err)
	}
	ring.Consume(7)
	if _, fds, err := resize(cr.Handle, 1); err != nil || len(fds) != 1 {
		t.Fatalf("shrink an empty CQ to 1: %v", err)
	} else {
		proto.CloseFDs(fds)
	}
	if _, _, err := ss.requestFDs(t, wire.OpDestroyCQ, wire.Bytes(&wire.Handle{Handle: cr.Handle})); err != nil {
		t.Fatal(err)
	}
	if u := srv.acct.usedBy(ss.ten); u != (usage{}) || srv.Debug().MappedBytes != 0 {
		t.Fatalf("charges left after destroy: %+v, mapped %d", u.proto(), srv.Debug().MappedBytes)
	}
}
