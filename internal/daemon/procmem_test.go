package daemon_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"runtime"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
)

// staticBuf is memory in the program's data segment, as a C program's static array.
var staticBuf [1 << 16]byte

// TestProcessMemoryMRs: memory a program registers where it is — a heap slice, a static
// array, an anonymous mmap, hugepages when the host has them — carries RDMA WRITE, READ, SEND,
// atomics and ATOMIC WRITE in both directions, byte for byte, through two daemons, with no
// memfd: the daemon copies through the program's /proc/self/mem.
func TestProcessMemoryMRs(t *testing.T) {
	da, db := memPair(t)
	anon, err := unix.Mmap(-1, 0, 1<<16, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(anon)
	kinds := map[string][]byte{"heap": make([]byte, 1<<16), "static": staticBuf[:], "mmap": anon}
	if huge, err := unix.Mmap(-1, 0, 2<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_HUGETLB); err == nil {
		defer unix.Munmap(huge)
		kinds["hugepage"] = huge[:1<<16]
	} else {
		t.Logf("no hugepages on this host (%v): that kind is not tried", err)
	}
	for name, buf := range kinds {
		t.Run(name, func(t *testing.T) {
			a := newEndBuf(t, da.dial(t), buf, 8, rcAccess)
			b := newEnd(t, db.dial(t), 1<<16, 8, rcAccess)
			a.connect(t, ipB, b.q.Num(), 1)
			b.connect(t, ipA, a.q.Num(), 1)
			// a WRITEs from its own memory into b, then b WRITEs into a's memory.
			pattern(a.buf[:8192], 1)
			a.write(t, 1, 0, 8192, b, 0)
			if wc := a.wait(t, 1)[0]; wc.Status != cq.StatusSuccess || !bytes.Equal(b.buf[:8192], a.buf[:8192]) {
				t.Fatalf("WRITE from %s memory: %+v", name, wc)
			}
			pattern(b.buf[8192:16384], 2)
			b.write(t, 2, 8192, 8192, a, 8192)
			if wc := b.wait(t, 1)[0]; wc.Status != cq.StatusSuccess || !bytes.Equal(a.buf[8192:16384], b.buf[8192:16384]) {
				t.Fatalf("WRITE into %s memory: %+v", name, wc)
			}
			// b READs a's memory.
			pattern(a.buf[16384:20480], 3)
			if _, err := b.q.PostSend([]qp.SendWR{{WRID: 3, Opcode: qp.WRRDMARead, Flags: qp.SendSignaled,
				SGL: []qp.SGE{{Addr: b.iova + 16384, Length: 4096, LKey: b.m.LKey()}}, RemoteAddr: a.iova + 16384, RKey: a.m.RKey()}}); err != nil {
				t.Fatal(err)
			}
			if wc := b.wait(t, 1)[0]; wc.Status != cq.StatusSuccess || !bytes.Equal(b.buf[16384:20480], a.buf[16384:20480]) {
				t.Fatalf("READ of %s memory: %+v", name, wc)
			}
			// SEND into a's memory.
			if _, err := a.q.PostRecv([]qp.RecvWR{{WRID: 4, SGL: []qp.SGE{{Addr: a.iova + 20480, Length: 4096, LKey: a.m.LKey()}}}}); err != nil {
				t.Fatal(err)
			}
			pattern(b.buf[20480:24576], 4)
			if _, err := b.q.PostSend([]qp.SendWR{{WRID: 5, Opcode: qp.WRSend, Flags: qp.SendSignaled,
				SGL: []qp.SGE{{Addr: b.iova + 20480, Length: 4096, LKey: b.m.LKey()}}}}); err != nil {
				t.Fatal(err)
			}
			if wc := a.wait(t, 1)[0]; wc.Status != cq.StatusSuccess || wc.ByteLen != 4096 || !bytes.Equal(a.buf[20480:24576], b.buf[20480:24576]) {
				t.Fatalf("SEND into %s memory: %+v", name, wc)
			}
			b.wait(t, 1)
			// FETCH_ADD on a word of a's memory; the original lands in b.
			binary.LittleEndian.PutUint64(a.buf[32768:], 41)
			if _, err := b.q.PostSend([]qp.SendWR{{WRID: 6, Opcode: qp.WRAtomicFetchAndAdd, Flags: qp.SendSignaled, CompareAdd: 1,
				SGL: []qp.SGE{{Addr: b.iova + 32768, Length: 8, LKey: b.m.LKey()}}, RemoteAddr: a.iova + 32768, RKey: a.m.RKey()}}); err != nil {
				t.Fatal(err)
			}
			if wc := b.wait(t, 1)[0]; wc.Status != cq.StatusSuccess || binary.LittleEndian.Uint64(b.buf[32768:]) != 41 ||
				binary.LittleEndian.Uint64(a.buf[32768:]) != 42 {
				t.Fatalf("FETCH_ADD on %s memory: %+v, %d %d", name, wc, binary.LittleEndian.Uint64(b.buf[32768:]), binary.LittleEndian.Uint64(a.buf[32768:]))
			}
			// ATOMIC WRITE of a word into a's memory (one 8-byte copy, under the atomic lock).
			copy(b.buf[40960:], []byte{1, 2, 3, 4, 5, 6, 7, 8})
			if _, err := b.q.PostSend([]qp.SendWR{{WRID: 7, Opcode: qp.WRAtomicWrite, Flags: qp.SendSignaled,
				SGL: []qp.SGE{{Addr: b.iova + 40960, Length: 8, LKey: b.m.LKey()}}, RemoteAddr: a.iova + 40968, RKey: a.m.RKey()}}); err != nil {
				t.Fatal(err)
			}
			if wc := b.wait(t, 1)[0]; wc.Status != cq.StatusSuccess || wc.Opcode != cq.OpAtomicWrite ||
				!bytes.Equal(a.buf[40968:40976], b.buf[40960:40968]) {
				t.Fatalf("ATOMIC WRITE into %s memory: %+v, %v", name, wc, a.buf[40960:40976])
			}
			if err := a.m.Dereg(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestProcessMemoryUnmapped: memory that is not mapped is refused at registration (EFAULT, as
// ibv_reg_mr); memory unmapped after registration fails the accesses that touch it — the peer's
// WRITE is NAKed (REM_ACCESS_ERR), the program's own send completes with LOC_PROT_ERR — and
// the daemon goes on serving, the MR still deregisters; memory unmapped after ibv_dereg_mr is
// nobody's concern.
func TestProcessMemoryUnmapped(t *testing.T) {
	da, db := memPair(t)
	va := da.dial(t)
	gone, err := unix.Mmap(-1, 0, 1<<16, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	unix.Munmap(gone) // gone still names the range, now unmapped
	pd, err := va.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := va.RegMR(pd, gone, 0, mr.AccessLocalWrite); !errors.Is(err, mr.ErrFault) || !errors.Is(err, syscall.EFAULT) {
		t.Fatalf("registering unmapped memory: %v, want EFAULT", err)
	}
	mem, err := unix.Mmap(-1, 0, 1<<16, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	a := newEndBuf(t, va, mem, 8, rcAccess)
	b := newEnd(t, db.dial(t), 1<<16, 8, rcAccess)
	a.connect(t, ipB, b.q.Num(), 1)
	b.connect(t, ipA, a.q.Num(), 1)
	unix.Munmap(mem) // the program frees its memory without deregistering it
	b.write(t, 1, 0, 4096, a, 0)
	if wc := b.wait(t, 1)[0]; wc.Status != cq.StatusRemAccessErr {
		t.Fatalf("WRITE into unmapped memory: %v, want REM_ACCESS_ERR", wc.Status)
	}
	// a's QP went to ERR (responder access error); a fresh pair shows the program's own send.
	a2 := newEndBuf(t, va, make([]byte, 1<<16), 8, rcAccess)
	b2 := newEnd(t, db.dial(t), 1<<16, 8, rcAccess)
	a2.connect(t, ipB, b2.q.Num(), 1)
	b2.connect(t, ipA, a2.q.Num(), 1)
	if _, err := a2.q.PostSend([]qp.SendWR{{WRID: 2, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
		SGL: []qp.SGE{{Addr: a.iova, Length: 4096, LKey: a.m.LKey()}}, RemoteAddr: b2.iova, RKey: b2.m.RKey()}}); err != nil {
		t.Fatal(err)
	}
	if wc := a2.wait(t, 1)[0]; wc.Status != cq.StatusLocProtErr {
		t.Fatalf("WRITE from unmapped memory: %v, want LOC_PROT_ERR", wc.Status)
	}
	if err := a.m.Dereg(); err != nil {
		t.Fatal("dereg of an MR over unmapped memory:", err)
	}
	if d, err := va.Debug(); err != nil || d.Mine.MRs != 1 {
		t.Fatalf("debug %+v %v", d, err)
	}
}

// TestAttachMem: the daemon takes only a procfs mem file opened read-write as a client's
// memory, once; SR_MR_PROCESS without it is EFAULT.
func TestAttachMem(t *testing.T) {
	da, _ := memPair(t)
	r := dialRaw(t, da.sock)
	var pd wire.Handle
	if err := r.call(wire.OpAllocPD, nil, wire.Bytes(&pd)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	reg := wire.RegMRReq{PD: pd.Handle, Access: 1, Addr: uint64(addrOf(buf)), Length: 4096, IOVA: 0x1000, Source: wire.MRProcess}
	if err := r.call(wire.OpRegMR, wire.Bytes(&reg), nil); !errors.Is(err, proto.ErrNotShareable) || !errors.Is(err, syscall.EFAULT) {
		t.Fatalf("SR_MR_PROCESS before ATTACH_MEM: %v", err)
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	status, _ := os.Open("/proc/self/status")
	defer status.Close()
	ro, _ := os.Open("/proc/self/mem")
	defer ro.Close()
	for name, fd := range map[string]int{"a pipe": p[0], "/proc/self/status": int(status.Fd()), "a read-only /proc/self/mem": int(ro.Fd())} {
		if err := r.call(wire.OpAttachMem, nil, nil, fd); !errors.Is(err, syscall.EFAULT) {
			t.Fatalf("ATTACH_MEM of %s: %v", name, err)
		}
	}
	if err := r.call(wire.OpAttachMem, nil, nil); !errors.Is(err, syscall.EPROTO) {
		t.Fatalf("ATTACH_MEM without an fd: %v", err)
	}
	rw, err := os.OpenFile("/proc/self/mem", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	if err := r.call(wire.OpAttachMem, nil, nil, int(rw.Fd())); err != nil {
		t.Fatal(err)
	}
	if err := r.call(wire.OpAttachMem, nil, nil, int(rw.Fd())); !errors.Is(err, syscall.EPROTO) {
		t.Fatalf("a second ATTACH_MEM: %v", err)
	}
	var mresp wire.RegMRResp
	if err := r.call(wire.OpRegMR, wire.Bytes(&reg), wire.Bytes(&mresp)); err != nil || mresp.LKey == 0 {
		t.Fatalf("SR_MR_PROCESS after ATTACH_MEM: %+v %v", mresp, err)
	}
	beyond := reg
	beyond.Addr = 1 << 60
	if err := r.call(wire.OpRegMR, wire.Bytes(&beyond), nil); !errors.Is(err, syscall.EFAULT) {
		t.Fatalf("a kernel address: %v", err)
	}
	runtime.KeepAlive(buf)
	r.c.Close()
	da.waitIdle(t, 0)
	if d := da.srv.Debug(); d.MRs != 0 {
		t.Fatalf("daemon keeps %+v", d)
	}
}

func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }
