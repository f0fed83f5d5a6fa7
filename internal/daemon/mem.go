package daemon

// Memory a program registers where it is (docs/daemon-protocol.md, "Registered memory"):
// malloc'd, stack, static, mmap'ed or hugepage memory of a C program is not something the
// daemon can map, so it reaches it by copying, through the client's own /proc/self/mem, which
// the client opens and passes once (SR_OP_ATTACH_MEM). The engine's MR is an mr.Memory whose
// every access is one pread or pwrite at the registered address:
//
//   - the file names the address space the client had when it opened it (procfs keeps the mm,
//     not the pid), so a reused pid can never make the daemon touch another process, and after a
//     fork the daemon still reaches the parent, never the child;
//   - the kernel checked the client's right to its own memory at open; the daemon gains nothing
//     the client did not have;
//   - accesses do not block on the client: a page the client has unmapped, or a process that
//     exited, makes the copy fail (mr.ErrFault: an error completion or a remote access NAK),
//     and procfs faults pages in without waiting on a userfaultfd handler;
//   - nothing is pinned or mapped: the client may unmap the memory after ibv_dereg_mr returned
//     (Dereg waits for accesses in flight).

import (
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/mr"
)

// procMem is an MR's view of the client's memory: the registered range starts at base.
type procMem struct {
	fd   int
	base uint64
}

// ReadAt implements mr.Memory.
func (m *procMem) ReadAt(p []byte, off uint64) error {
	n, err := unix.Pread(m.fd, p, int64(m.base+off))
	if err != nil || n != len(p) {
		return mr.ErrFault
	}
	return nil
}

// WriteAt implements mr.Memory.
func (m *procMem) WriteAt(p []byte, off uint64) error {
	n, err := unix.Pwrite(m.fd, p, int64(m.base+off))
	if err != nil || n != len(p) {
		return mr.ErrFault
	}
	return nil
}

// maxUserAddr bounds the addresses a client may register (the x86-64 and arm64 user space is
// below 2^56 with 5-level tables; pread's offset is signed).
const maxUserAddr = 1 << 56

// attachMem is SR_OP_ATTACH_MEM: the client's /proc/self/mem, kept until the session ends.
// Only a procfs "mem" file opened read-write is taken: anything else (a pipe, a socket, a file
// on another filesystem, which a pread could block on) is refused.
func (ss *session) attachMem(fds *[]int) error {
	if len(*fds) != 1 {
		return fmt.Errorf("%w: SR_OP_ATTACH_MEM needs exactly one fd", proto.ErrProtocol)
	}
	if ss.hasMem {
		return fmt.Errorf("%w: memory already attached", proto.ErrProtocol)
	}
	fd := (*fds)[0]
	var fs unix.Statfs_t
	var st unix.Stat_t
	if err := unix.Fstatfs(fd, &fs); err != nil || fs.Type != unix.PROC_SUPER_MAGIC {
		return fmt.Errorf("%w: not a procfs file", proto.ErrNotShareable)
	}
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("%w: not a regular procfs file", proto.ErrNotShareable)
	}
	if fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0); err != nil || fl&unix.O_ACCMODE != unix.O_RDWR {
		return fmt.Errorf("%w: /proc/self/mem must be open read-write", proto.ErrNotShareable)
	}
	var buf [64]byte
	n, err := unix.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd), buf[:])
	if err != nil || !strings.HasSuffix(string(buf[:n]), "/mem") {
		return fmt.Errorf("%w: not a /proc/<pid>/mem file", proto.ErrNotShareable)
	}
	if err := ss.charge(one(resFDs)); err != nil { // kept open past the request
		return err
	}
	*fds = (*fds)[1:]
	ss.memFD, ss.hasMem = fd, true
	return nil
}

// processMemory is SR_MR_PROCESS memory: [addr, addr+length) of the client, reached through
// its attached /proc/self/mem. The first and last byte must be readable now (EFAULT otherwise,
// as ibv_reg_mr fails on memory that is not mapped).
func (ss *session) processMemory(addr, length uint64) (*procMem, error) {
	if !ss.hasMem {
		return nil, fmt.Errorf("%w: no SR_OP_ATTACH_MEM before an SR_MR_PROCESS registration", proto.ErrNotShareable)
	}
	if addr >= maxUserAddr || length > maxUserAddr-addr {
		return nil, fmt.Errorf("%w: range %#x+%d", mr.ErrFault, addr, length)
	}
	m := &procMem{fd: ss.memFD, base: addr}
	if length > 0 {
		var b [1]byte
		if m.ReadAt(b[:], 0) != nil || m.ReadAt(b[:], length-1) != nil {
			return nil, fmt.Errorf("%w: %#x+%d is not mapped in the client", mr.ErrFault, addr, length)
		}
	}
	return m, nil
}

// releaseMem closes the session's /proc/self/mem once no MR can use it: an MR whose Dereg
// gave up (accesses still in flight) keeps it open, so its number is never reused under a late
// access (a leak is safe; another file behind the number is not).
func (ss *session) releaseMem() {
	if !ss.hasMem {
		return
	}
	_, _, _, mrs, _ := ss.snapshot()
	for _, o := range mrs {
		if !o.released {
			ss.s.log.Error("client memory fd kept open: an MR is still registered", "client", ss.id)
			return
		}
	}
	proto.CloseFD(ss.memFD)
	ss.memFD, ss.hasMem = -1, false
	ss.release(one(resFDs))
}
