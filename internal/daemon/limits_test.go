package daemon_test

import (
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/daemon"
	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/client"
	"github.com/softroce/softroce/pkg/roce"
)

// withLimits starts the test's daemons with the given per-user limits and daemon-wide
// ceiling (restored afterwards).
func withLimits(t *testing.T, l, ceiling daemon.Limits) {
	testLimits, testCeiling = l, ceiling
	t.Cleanup(func() { testLimits, testCeiling = daemon.Limits{}, daemon.Limits{} })
}

// wantLimit fails unless err is a refusal over the named limit.
func wantLimit(t *testing.T, what string, err error, name string) {
	t.Helper()
	if !errors.Is(err, proto.ErrQuota) || !strings.Contains(err.Error(), name) {
		t.Fatalf("%s: %v, want ErrQuota naming %s", what, err, name)
	}
}

// TestLimitsPerUser: the limits hold for a user's connections together. Five connections
// of this process (one uid) under a one-QP limit get one QP between them (before, the quota
// was per connection: five QPs); the refusals are counted; freeing the QP lets another
// connection have it.
func TestLimitsPerUser(t *testing.T) {
	withLimits(t, daemon.Limits{QPs: 1, CQs: 10, PDs: 10}, daemon.Limits{})
	da, _ := memPair(t)
	var made []roce.QueuePair
	var conns []*client.Conn
	refused := 0
	for i := 0; i < 5; i++ {
		c := da.dial(t)
		conns = append(conns, c)
		pd, err := c.AllocPD()
		if err != nil {
			t.Fatal(err)
		}
		x, err := c.CreateCQ(4)
		if err != nil {
			t.Fatal(err)
		}
		q, err := c.CreateQP(roce.VerbsQPInit{Type: qp.TypeRC, PD: pd, SendCQ: x, RecvCQ: x,
			Cap: qp.Cap{MaxSendWR: 2, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			wantLimit(t, "QP of a second connection", err, "qps")
			refused++
			continue
		}
		made = append(made, q)
	}
	if len(made) != 1 || refused != 4 {
		t.Fatalf("5 connections of one user under a 1-QP limit made %d QPs (%d refused), want 1", len(made), refused)
	}
	d, err := conns[4].Debug()
	if err != nil {
		t.Fatal(err)
	}
	if d.User.QPs != 1 || d.User.Conns != 5 || d.UserLimit.QPs != 1 || d.Refused.QPs != 4 {
		t.Fatalf("Debug: user %+v, limit %+v, refused %+v", d.User, d.UserLimit, d.Refused)
	}
	if err := made[0].Destroy(); err != nil {
		t.Fatal(err)
	}
	pd, _ := conns[4].AllocPD()
	x, _ := conns[4].CreateCQ(4)
	if _, err := conns[4].CreateQP(roce.VerbsQPInit{Type: qp.TypeUD, PD: pd, SendCQ: x, RecvCQ: x,
		Cap: qp.Cap{MaxSendWR: 2, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		t.Fatal("QP after the user's only one was destroyed:", err)
	}
}

// TestLimitConns: a user's connections beyond the limit are refused with a clear error
// (the first request is answered with it), and a connection closing frees its place.
func TestLimitConns(t *testing.T) {
	withLimits(t, daemon.Limits{Conns: 2}, daemon.Limits{})
	da, _ := memPair(t)
	c1 := da.dial(t)
	da.dial(t)
	if _, err := client.Dial(da.sock); err == nil {
		t.Fatal("a third connection under a 2-connection limit was accepted")
	} else {
		wantLimit(t, "third connection", err, "conns")
	}
	c1.Close()
	da.waitIdle(t, 1)
	c3, err := client.Dial(da.sock)
	if err != nil {
		t.Fatal("a connection after one closed:", err)
	}
	c3.Close()
}

// TestLimitFDs: the daemon's descriptors held for a user are bounded: a connection holds 3
// (socket, doorbell, event eventfd), a CQ 2 (notify and space eventfds); past the limit
// CreateCQ is refused, and the daemon's descriptor count did not grow with the refusals.
func TestLimitFDs(t *testing.T) {
	withLimits(t, daemon.Limits{FDs: 3 + 2*2}, daemon.Limits{})
	da, _ := memPair(t)
	c := da.dial(t)
	for i := 0; i < 2; i++ {
		if _, err := c.CreateCQ(4); err != nil {
			t.Fatal(err)
		}
	}
	before := da.srv.Debug().FDs
	for i := 0; i < 50; i++ {
		_, err := c.CreateCQ(4)
		wantLimit(t, "CQ past the descriptor limit", err, "fds")
	}
	// the count is the whole test process's: an earlier test's session may still be closing
	// its descriptors meanwhile, so only a rise is a leak of the refused CQs
	if after := da.srv.Debug().FDs; after > before {
		t.Fatalf("the daemon's descriptors went from %d to %d over refused CQs", before, after)
	}
}

// TestLimitEngineMemory: memory the daemon allocates for a user's objects is counted: an
// SRQ or a QP whose queues the engine sizes from the caller's numbers (MaxWR x MaxSGE) is
// refused over the user's engine_bytes (before, an SRQ of 2^20 WRs of 32 SGEs, 552 MiB of
// the daemon's memory, was accepted from anyone), small ones are not.
func TestLimitEngineMemory(t *testing.T) {
	withLimits(t, daemon.Limits{EngineBytes: 64 << 20}, daemon.Limits{})
	da, _ := memPair(t)
	c := da.dial(t)
	a := c.Attr()
	_, err := c.CreateSRQ(qp.SRQOptions{MaxWR: a.MaxSRQWR, MaxSGE: a.MaxSRQSGE})
	wantLimit(t, "the largest SRQ", err, "engine_bytes")
	if _, err := c.CreateSRQ(qp.SRQOptions{MaxWR: 1024, MaxSGE: 4}); err != nil {
		t.Fatal(err)
	}
	pd, _ := c.AllocPD()
	x, _ := c.CreateCQ(4)
	_, err = c.CreateQP(roce.VerbsQPInit{Type: qp.TypeRC, PD: pd, SendCQ: x, RecvCQ: x,
		Cap: qp.Cap{MaxSendWR: uint32(a.MaxQPWR), MaxRecvWR: uint32(a.MaxQPWR), MaxSendSGE: uint32(a.MaxSGE), MaxRecvSGE: uint32(a.MaxSGE), MaxInlineData: uint32(a.MaxInlineData)}})
	wantLimit(t, "the largest QP", err, "engine_bytes")
	if _, err := c.CreateQP(roce.VerbsQPInit{Type: qp.TypeRC, PD: pd, SendCQ: x, RecvCQ: x,
		Cap: qp.Cap{MaxSendWR: 128, MaxRecvWR: 512, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		t.Fatal(err)
	}
	d, _ := c.Debug()
	want := qp.SRQFootprint(1024, 4) + qp.Footprint(qp.Cap{MaxSendWR: 128, MaxRecvWR: 512, MaxSendSGE: 1, MaxRecvSGE: 1}, false)
	if d.User.EngineBytes < want || d.Refused.EngineBytes != 2 {
		t.Fatalf("engine bytes held %d (want at least %d), refused %d", d.User.EngineBytes, want, d.Refused.EngineBytes)
	}
}

// sparseMemfd is a sealed memfd of size bytes with no page allocated.
func sparseMemfd(t *testing.T, size int64) int {
	t.Helper()
	fd, err := unix.MemfdCreate("sparse", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Ftruncate(fd, size); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, proto.Seals); err != nil {
		t.Fatal(err)
	}
	return fd
}

// TestRegMRHuge: a 1 TiB sparse sealed memfd is refused with a clear error (before, it was
// mapped: 127 such calls exhaust a 47-bit address space and the daemon aborts); with no
// mapped_bytes limit it is still refused, for its holes (the pages would be the daemon's);
// and mappings are bounded (vm.max_map_count).
func TestRegMRHuge(t *testing.T) {
	withLimits(t, daemon.Limits{Mappings: 3}, daemon.Limits{})
	da, _ := memPair(t)
	atk := dialRaw(t, da.sock)
	var pd wire.Handle
	if err := atk.call(wire.OpAllocPD, nil, wire.Bytes(&pd)); err != nil {
		t.Fatal(err)
	}
	fd := sparseMemfd(t, 1<<40)
	err := atk.call(wire.OpRegMR, wire.Bytes(&wire.RegMRReq{PD: pd.Handle, Length: 1 << 40, Access: 1, Source: wire.MRMemfd}), nil, fd)
	wantLimit(t, "RegMR of 1 TiB", err, "mapped_bytes")
	t.Logf("1 TiB: %v", err)
	if d := da.srv.Debug(); d.MappedBytes != 0 || d.MRs != 0 {
		t.Fatalf("after the refusal: %+v", d)
	}
	err = atk.call(wire.OpRegMR, wire.Bytes(&wire.RegMRReq{PD: pd.Handle, Length: 1 << 20, Access: 1, Source: wire.MRMemfd}), nil, fd)
	if !errors.Is(err, proto.ErrNotShareable) || !strings.Contains(err.Error(), "not populated") {
		t.Fatalf("RegMR of an unpopulated range: %v, want ErrNotShareable (not populated)", err)
	}
	head, err := unix.Mmap(fd, 0, 3<<12, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(head)
	if err := proto.Populate(head); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := atk.call(wire.OpRegMR, wire.Bytes(&wire.RegMRReq{PD: pd.Handle, Offset: uint64(i) << 12, Length: 4096, Access: 1, Source: wire.MRMemfd}), nil, fd); err != nil {
			t.Fatalf("MR %d: %v", i, err)
		}
	}
	err = atk.call(wire.OpRegMR, wire.Bytes(&wire.RegMRReq{PD: pd.Handle, Length: 4096, Access: 1, Source: wire.MRMemfd}), nil, fd)
	wantLimit(t, "a fourth mapping under a 3-mapping limit", err, "mappings")
}

// TestRegMRDaemonWide: the daemon-wide ceiling bounds all users together; its refusal says so.
func TestRegMRDaemonWide(t *testing.T) {
	withLimits(t, daemon.Limits{MappedBytes: -1}, daemon.Limits{MappedBytes: 1 << 20})
	da, _ := memPair(t)
	c := da.dial(t)
	pd, _ := c.AllocPD()
	buf, err := c.AllocBuffer(2 << 20)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.RegMR(pd, buf, 0, rcAccess)
	wantLimit(t, "2 MiB under a 1 MiB ceiling", err, "daemon-wide mapped_bytes")
	if _, err := c.RegMR(pd, buf[:512<<10], 0, rcAccess); err != nil {
		t.Fatal(err)
	}
}

// TestRegMRHugetlb: memory the daemon could fault on is refused: a hugetlbfs memfd (a hole
// there is a SIGBUS in the daemon when the huge page pool is empty; before, it was mapped).
func TestRegMRHugetlb(t *testing.T) {
	da, _ := memPair(t)
	fd, err := unix.MemfdCreate("huge", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_HUGETLB)
	if err != nil {
		t.Skip("no hugetlbfs memfd:", err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, 2<<20); err != nil {
		t.Skip("hugetlbfs memfd: ftruncate:", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, proto.Seals); err != nil {
		t.Skip("hugetlbfs memfd: seals:", err)
	}
	atk := dialRaw(t, da.sock)
	var pd wire.Handle
	if err := atk.call(wire.OpAllocPD, nil, wire.Bytes(&pd)); err != nil {
		t.Fatal(err)
	}
	err = atk.call(wire.OpRegMR, wire.Bytes(&wire.RegMRReq{PD: pd.Handle, Length: 2 << 20, Access: 1, Source: wire.MRMemfd}), nil, fd)
	if !errors.Is(err, proto.ErrNotShareable) || !strings.Contains(err.Error(), "hugetlbfs") {
		t.Fatalf("RegMR of a hugetlbfs memfd: %v, want ErrNotShareable", err)
	}
}
