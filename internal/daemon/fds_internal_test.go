package daemon

import (
	"io"
	"log/slog"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/roce"
)

// TestRequestFDsClosedOnce: a request's descriptors have one owner. Whatever handle leaves in
// the slice is the caller's to close and still open; whatever it took it closed itself. A
// descriptor closed twice (before: a RegMR refused after the memfd was taken closed it, and
// the request loop closed the same number again) closes whatever another session's goroutine
// opened under that number meanwhile — another client's eventfd or ring.
func TestRequestFDsClosedOnce(t *testing.T) {
	l, err := mem.NewNetwork(mem.Options{}).Attach(netip.MustParseAddr("10.6.0.5"))
	if err != nil {
		t.Fatal(err)
	}
	dev, err := roce.Open(roce.Options{Link: l})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	srv, _ := New(Options{Device: dev, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ss := testSession(srv, 1)
	defer ss.cleanup()
	var none []int
	ss.handle(reqMsg[wire.Handle](wire.OpAllocPD, nil), &none)
	memfd, mem, err := proto.NewMemfd("fds", 8192)
	if err != nil {
		t.Fatal(err)
	}
	defer proto.Unmap(mem)
	if err := proto.Populate(mem); err != nil {
		t.Fatal(err)
	}
	defer proto.CloseFD(memfd)
	for _, tc := range []struct {
		name string
		req  wire.RegMRReq
		ok   bool
	}{
		{"a registration", wire.RegMRReq{PD: 1, Length: 4096, Access: 1, Source: wire.MRMemfd}, true},
		{"no such PD", wire.RegMRReq{PD: 9, Length: 4096, Access: 1, Source: wire.MRMemfd}, false},
		{"past the memfd", wire.RegMRReq{PD: 1, Offset: 8192, Length: 4096, Access: 1, Source: wire.MRMemfd}, false},
		{"a bad access", wire.RegMRReq{PD: 1, Length: 4096, Access: 1 << 30, Source: wire.MRMemfd}, false},
	} {
		dup, err := unix.FcntlInt(uintptr(memfd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		fds := []int{dup}
		ss.wbuf = ss.wbuf[:0]
		ss.handle(reqMsg(wire.OpRegMR, &tc.req), &fds)
		if st, err := ss.lastStatus(); (st == 0) != tc.ok {
			t.Fatalf("%s: status %d: %v", tc.name, st, err)
		}
		for _, fd := range fds {
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
				t.Fatalf("%s: fd %d left to the caller is already closed (%v): the caller would close it again", tc.name, fd, err)
			}
		}
		proto.CloseFDs(fds)
		if len(fds) == 0 {
			if _, err := unix.FcntlInt(uintptr(dup), unix.F_GETFD, 0); err == nil {
				t.Fatalf("%s: fd %d taken by the handler but left open", tc.name, dup)
			}
		}
	}
}
