package daemon

import (
	"encoding/binary"
	"io"
	"log/slog"
	"net/netip"
	"sync/atomic"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/roce"
)

// fuzzFD makes the descriptor a fuzzed request carries (kind%8): none, a populated sealed
// memfd, a sparse one, an unsealed one, an eventfd, /dev/null, a memfd and an eventfd, or a
// hugetlbfs memfd (an eventfd where there is none). size is the memfd's size.
func fuzzFD(t *testing.T, kind byte, size int) []int {
	sealed := func(populate bool) int {
		fd, mem, err := proto.NewMemfd("fuzz", size)
		if err != nil {
			t.Fatal(err)
		}
		if populate {
			proto.Populate(mem)
		}
		proto.Unmap(mem)
		return fd
	}
	efd := func() int {
		fd, err := proto.NewEventFD()
		if err != nil {
			t.Fatal(err)
		}
		return fd
	}
	switch kind % 8 {
	case 1:
		return []int{sealed(true)}
	case 2:
		return []int{sealed(false)}
	case 3:
		fd, err := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		unix.Ftruncate(fd, int64(size))
		return []int{fd}
	case 4:
		return []int{efd()}
	case 5:
		fd, err := unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		return []int{fd}
	case 6:
		return []int{sealed(true), efd()}
	case 7:
		fd, err := unix.MemfdCreate("huge", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_HUGETLB)
		if err != nil {
			return []int{efd()}
		}
		unix.Ftruncate(fd, 2<<20)
		unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, proto.Seals)
		return []int{fd}
	}
	return nil
}

// FuzzSessionFDs: a client speaking the protocol with real descriptors — memfds of every
// kind with RegMR (sealed or not, populated or sparse, hugetlbfs, the wrong kind of fd, two
// at once), CQs and the post ring set up, then bytes of its choosing written into the shared
// rings (post records and tail, a completion ring's head and arm words) while the daemon
// drains, completes and moves kept completions — never panics, never leaves a descriptor
// the request loop would close twice, and cleanup returns every object, charge, mapping and
// descriptor.
func FuzzSessionFDs(f *testing.F) {
	l, err := mem.NewNetwork(mem.Options{}).Attach(netip.MustParseAddr("10.6.0.6"))
	if err != nil {
		f.Fatal(err)
	}
	dev, err := roce.Open(roce.Options{Link: l})
	if err != nil {
		f.Fatal(err)
	}
	defer dev.Close()
	srv, _ := New(Options{Device: dev, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Limits: Limits{MappedBytes: 64 << 20, Mappings: 64, EngineBytes: 64 << 20, CQs: 8, MRs: 16, QPs: 8}})
	srv.drainPaused.Store(true) // drains happen when the program says
	baseFDs := countFDs()
	msg := func(op wire.Op, body []byte) []byte { return proto.AppendRequest(nil, op, body) }
	// A program is a list of steps: step kind, then its bytes (see the switch below).
	f.Add([]byte{0, 0, 0, 1, 0, 0, 0, 16, 0, 0, 2, 1, 0, 0, 0, 0, 4, 3, 4, 0, 5, 2, 0, 0, 6, 1, 0})
	f.Add([]byte{0, 0, 0, 1, 2, 0, 0, 16, 0, 0, 7, 0, 1, 3, 0, 0, 0, 1, 0, 1, 4, 9, 9, 9, 9, 9})
	f.Add([]byte{0, 2, 0, 0, 0, 1, 6, 0, 8, 0, 0, 3, 1, 0, 0, 0, 4, 0xff, 0xff, 0, 5})
	// a CQ of 4 holding 6 completions (4 in its ring, 2 kept), resized to 16, to 2 (refused),
	// to 64
	f.Add(append(append([]byte{0, 1, 3, 6, 0, 5}, make([]byte, 6*3)...), 8, 1, 16, 8, 1, 2, 8, 1, 64))
	// two PDs, an MR of PD 1 over a memfd, re-registered onto a new memfd, to PD 2 with remote
	// write, all three at once, with no flag (refused), with an unknown one (refused)
	f.Add([]byte{0, 0, 0, 0, 1, 1, 0, 16, 0, 0, 0, 64, 1,
		9, 1, 0, 16, 3, 1, 0, 1, 0, 0, 0, 128,
		9, 0, 0, 0, 3, 6, 2, 3, 0, 0, 0, 0,
		9, 1, 0, 16, 3, 7, 1, 1, 0, 0, 0, 32,
		9, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0,
		9, 0, 0, 0, 3, 8, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, prog []byte) {
		ss := testSession(srv, 1)
		next := func() byte {
			if len(prog) == 0 {
				return 0
			}
			b := prog[0]
			prog = prog[1:]
			return b
		}
		u16 := func() int { return int(next())<<8 | int(next()) }
		request := func(m []byte, fds []int) {
			ss.wbuf = ss.wbuf[:0]
			rights := ss.handle(m, &fds)
			for _, fd := range fds {
				if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
					h, _, _ := proto.ParseHdr(m)
					t.Fatalf("op %d: fd %d left to the request loop is already closed", h.Op, fd)
				}
			}
			proto.CloseFDs(fds)
			proto.CloseFDs(proto.ParseRights(rights))
		}
		cqs := func() []*cqObj {
			_, c, _, _, _ := ss.snapshot()
			return c
		}
		for steps := 0; len(prog) > 0 && steps < 64; steps++ {
			switch next() % 10 {
			case 0: // objects: a PD, a CQ, a QP, the post ring
				switch next() % 4 {
				case 0:
					request(msg(wire.OpAllocPD, nil), nil)
				case 1:
					request(msg(wire.OpCreateCQ, wire.Bytes(&wire.CreateCQReq{CQE: uint32(next()%64) + 1})), nil)
				case 2:
					request(msg(wire.OpCreateQP, wire.Bytes(&wire.CreateQPReq{QPType: next() % 4, PD: uint32(next() % 4), SendCQ: uint32(next() % 4),
						RecvCQ: uint32(next() % 4), Cap: wire.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})), nil)
				case 3:
					request(msg(wire.OpOpenRings, nil), nil)
				}
			case 1: // RegMR with descriptors of a kind
				kind, size := next(), u16()*16+1
				off, n := uint64(u16()), u16()
				request(msg(wire.OpRegMR, wire.Bytes(&wire.RegMRReq{PD: uint32(next() % 4), Offset: off, Length: uint64(n), IOVA: 0x1000,
					Access: uint32(mr.AccessLocalWrite | mr.AccessRemoteWrite), Source: wire.MRMemfd})), fuzzFD(t, kind, size))
			case 2: // any message, with descriptors of a kind
				k, n := next(), int(next())
				m := msg(wire.Op(next()), prog[:min(n, len(prog))])
				prog = prog[min(n, len(prog)):]
				request(m, fuzzFD(t, k, 4096))
			case 3: // bytes into the post ring, and a tail
				if ss.ring == nil {
					continue
				}
				mem := ss.ring.mem
				off, n := u16()%proto.PostRingData, int(next())
				copy(mem[proto.PostRingHeader+off:], prog[:min(n, len(prog))])
				prog = prog[min(n, len(prog)):]
				atomic.StoreUint64((*uint64)(unsafe.Pointer(&mem[0])), uint64(u16()))
			case 4: // a drain, as the drainer or a request does it
				ss.postMu.Lock()
				if next()&1 == 0 {
					ss.drain(drainTurnRecords, drainTurnBytes)
				} else {
					ss.drainLocked()
				}
				ss.postMu.Unlock()
			case 5: // a completion ring's head and arm words as the client may write them
				c := cqs()
				if len(c) == 0 {
					continue
				}
				o := c[int(next())%len(c)]
				binary.LittleEndian.PutUint64(o.mem[64:], uint64(u16()))
				binary.LittleEndian.PutUint32(o.mem[128:], uint32(u16())<<16|uint32(u16()))
			case 6: // completions through the push hook (the engine's path), and kept ones moved
				c := cqs()
				if len(c) == 0 {
					continue
				}
				o := c[int(next())%len(c)]
				for i := int(next() % 8); i >= 0; i-- {
					wc := cq.WC{WRID: uint64(i), Status: cq.Status(next() % 3), Opcode: cq.Opcode(next() % 8)}
					o.c.Push(&wc, next()&1 == 1)
				}
				o.moveKept()
			case 7: // moderation
				c := cqs()
				if len(c) == 0 {
					continue
				}
				o := c[int(next())%len(c)]
				o.setModeration(cq.Moderation{Count: uint16(next() % 4), PeriodUS: uint16(next() % 2)})
			case 8: // a resize, of whatever the ring and the engine CQ hold
				request(msg(wire.OpResizeCQ, wire.Bytes(&wire.ResizeCQReq{Handle: uint32(next() % 8), CQE: uint32(next() % 80)})), nil)
			case 9: // a re-registration, with descriptors of a kind for a new translation
				kind, size := next(), u16()*16+1
				request(msg(wire.OpReregMR, wire.Bytes(&wire.ReregMRReq{Handle: uint32(next() % 8), Flags: uint32(next() % 9),
					PD: uint32(next() % 4), Access: uint32(next() % 16), Offset: uint64(u16()), Length: uint64(u16()),
					IOVA: 0x2000, Source: wire.MRMemfd})), fuzzFD(t, kind, size))
			}
		}
		ss.cleanup()
		if d := srv.Debug(); d.PDs != 0 || d.MRs != 0 || d.CQs != 0 || d.SRQs != 0 || d.QPs != 0 || d.MappedBytes != 0 {
			t.Fatalf("objects left after cleanup: %+v", d)
		}
		if u := srv.acct.usedBy(ss.ten); u != (usage{}) {
			t.Fatalf("charges left after cleanup: %+v", u.proto())
		}
		srv.acct.leave(ss.ten)
		if n := countFDs(); n != baseFDs {
			t.Fatalf("%d descriptors open after cleanup, %d before", n, baseFDs)
		}
	})
}
