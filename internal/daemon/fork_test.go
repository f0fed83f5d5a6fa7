package daemon_test

import (
	"bytes"
	"io"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/cq"
)

// forkWriter forks (clone with SIGCHLD only: a plain fork) and returns the child's pid in the
// parent. The child, which may run nothing of the Go runtime, writes 0xEE into its copy of
// *buf, tells the parent (the byte on toParent), waits for the parent's go-ahead on
// fromParent, then sends its copy of the n bytes at buf and exits.
//
//go:norace
//go:nosplit
func forkWriter(buf *byte, n int, toParent, fromParent int) (uintptr, syscall.Errno) {
	r, _, e := syscall.RawSyscall6(syscall.SYS_CLONE, uintptr(syscall.SIGCHLD), 0, 0, 0, 0, 0)
	if e != 0 || r != 0 {
		return r, e
	}
	*buf = 0xEE
	syscall.RawSyscall(syscall.SYS_WRITE, uintptr(toParent), uintptr(unsafe.Pointer(buf)), 1)
	var b [1]byte
	syscall.RawSyscall(syscall.SYS_READ, uintptr(fromParent), uintptr(unsafe.Pointer(&b[0])), 1)
	syscall.RawSyscall(syscall.SYS_WRITE, uintptr(toParent), uintptr(unsafe.Pointer(buf)), uintptr(n))
	syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 0, 0, 0)
	return 0, 0
}

// readFull reads len(b) bytes from fd, retrying reads a signal interrupted (the Go runtime
// preempts its threads with signals, so a blocking read of a pipe may end with EINTR).
func readFull(fd int, b []byte) (int, error) {
	got := 0
	for got < len(b) {
		n, err := unix.Read(fd, b[got:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return got, err
		}
		if n == 0 {
			return got, io.ErrUnexpectedEOF
		}
		got += n
	}
	return got, nil
}

// TestForkProcessMemory: a program whose own memory is registered (SR_MR_PROCESS) forks; the
// child writes into its copy of the registered buffer. A peer's RDMA WRITE afterwards lands in
// the parent's memory — the daemon reaches the address space the client's /proc/self/mem named,
// not the child's — the child's write never reaches the parent, and the peer's data never
// reaches the child. The parent's connection keeps working.
func TestForkProcessMemory(t *testing.T) {
	da, db := memPair(t)
	buf := make([]byte, 1<<16)
	a := newEndBuf(t, da.dial(t), buf, 8, rcAccess)
	b := newEnd(t, db.dial(t), 1<<16, 8, rcAccess)
	a.connect(t, ipB, b.q.Num(), 1)
	b.connect(t, ipA, a.q.Num(), 1)

	var up, down [2]int
	if err := unix.Pipe2(up[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	if err := unix.Pipe2(down[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(up[0])
	syscall.ForkLock.Lock()
	pid, errno := forkWriter(&buf[0], 64, up[1], down[0])
	syscall.ForkLock.Unlock()
	unix.Close(up[1])
	unix.Close(down[0])
	if errno != 0 {
		unix.Close(down[1])
		t.Fatal("fork:", errno)
	}
	// On any failure the child must not outlive the test nor keep it waiting: closing its
	// go-ahead pipe ends its read, SIGKILL ends it wherever it is.
	defer func() {
		unix.Close(down[1])
		unix.Kill(int(pid), unix.SIGKILL)
		var ws unix.WaitStatus
		for {
			if _, err := unix.Wait4(int(pid), &ws, 0, nil); err != unix.EINTR {
				break
			}
		}
	}()
	var one [1]byte
	if n, err := readFull(up[0], one[:]); n != 1 || err != nil || one[0] != 0xEE {
		t.Fatalf("child: %d %v %x", n, err, one)
	}
	if buf[0] == 0xEE {
		t.Fatal("the child's write reached the parent")
	}
	// The peer WRITEs into the parent's registered memory.
	pattern(b.buf[:64], 5)
	b.write(t, 1, 0, 64, a, 0)
	if wc := b.wait(t, 1)[0]; wc.Status != cq.StatusSuccess {
		t.Fatalf("WRITE after fork: %+v", wc)
	}
	if !bytes.Equal(buf[:64], b.buf[:64]) {
		t.Fatalf("the parent's memory: % x, want % x", buf[:8], b.buf[:8])
	}
	// The child's copy: its own write, none of the peer's data.
	unix.Write(down[1], []byte{1})
	child := make([]byte, 64)
	if got, err := readFull(up[0], child); got != 64 || err != nil {
		t.Fatalf("child report: %d bytes, %v", got, err)
	}
	if child[0] != 0xEE || bytes.Equal(child[1:64], b.buf[1:64]) {
		t.Fatalf("the child's copy % x: the peer's data reached the child", child[:8])
	}
	// The parent goes on: its own WRITE from the registered memory.
	a.write(t, 2, 0, 64, b, 4096)
	if wc := a.wait(t, 1)[0]; wc.Status != cq.StatusSuccess || !bytes.Equal(b.buf[4096:4160], buf[:64]) {
		t.Fatalf("the parent's WRITE after fork: %+v", wc)
	}
}
