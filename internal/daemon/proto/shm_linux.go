package proto

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// PageSize is the mapping granularity.
var PageSize = os.Getpagesize()

// Seals every shared memory object carries before the other side maps it:
// its size can no longer change, so neither side can make the other's
// mapping fault (SIGBUS) by truncating the file.
const Seals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// ErrNotShareable: a file descriptor is not a sealed memfd of the needed size.
var ErrNotShareable = errors.New("softroce daemon: memory is not a sealed memfd of the needed size")

// NewMemfd creates a memfd of size bytes (rounded up to pages), seals its
// size and maps it shared read-write. The caller owns fd and mem.
func NewMemfd(name string, size int) (fd int, mem []byte, err error) {
	if size <= 0 {
		return -1, nil, fmt.Errorf("%w: size %d", ErrNotShareable, size)
	}
	size = RoundPage(size)
	fd, err = unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, nil, fmt.Errorf("memfd_create: %w", err)
	}
	if err = unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return -1, nil, fmt.Errorf("ftruncate: %w", err)
	}
	if _, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, Seals); err != nil {
		unix.Close(fd)
		return -1, nil, fmt.Errorf("F_ADD_SEALS: %w", err)
	}
	mem, err = unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return -1, nil, fmt.Errorf("mmap: %w", err)
	}
	return fd, mem, nil
}

// RoundPage rounds n up to a multiple of the page size.
func RoundPage(n int) int { return (n + PageSize - 1) &^ (PageSize - 1) }

// MapSpan is the size of the page-aligned mapping MapShared makes for [off, off+length)
// (what the mapping costs the mapper's address space), or ErrNotShareable for a range it
// refuses outright.
func MapSpan(off uint64, length int) (int64, error) {
	if length <= 0 || off > 1<<48 || length > 1<<40 {
		return 0, fmt.Errorf("%w: range %d+%d", ErrNotShareable, off, length)
	}
	start := off &^ uint64(PageSize-1)
	return int64(uint64(RoundPage(int(off+uint64(length)))) - start), nil
}

// tmpfsMagic is the f_type of tmpfs (shmem), where memfd_create puts a memfd without
// MFD_HUGETLB.
const tmpfsMagic = 0x01021994

// MapShared maps [off, off+length) of a peer's memfd read-write. It refuses
// (ErrNotShareable) anything but a memfd sealed against shrinking whose size
// covers the range, so a later truncation cannot fault the mapper; anything but shmem
// (a hugetlbfs memfd faults with SIGBUS where the huge page pool has no page for a hole);
// and a range with holes: the peer populates the range before passing it (fallocate), so
// the pages are charged to the peer, not faulted in by the mapper (RDMA writes into a
// hole would allocate the page in the mapper's memory). It returns the page-aligned
// mapping (for Unmap) and the requested view.
func MapShared(fd int, off uint64, length int) (mapping, view []byte, err error) {
	if _, err := MapSpan(off, length); err != nil {
		return nil, nil, err
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || seals&unix.F_SEAL_SHRINK == 0 {
		return nil, nil, fmt.Errorf("%w: no shrink seal", ErrNotShareable)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, nil, fmt.Errorf("%w: fstat: %v", ErrNotShareable, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || uint64(st.Size) < off+uint64(length) {
		return nil, nil, fmt.Errorf("%w: size %d < %d", ErrNotShareable, st.Size, off+uint64(length))
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil || fs.Type != tmpfsMagic {
		return nil, nil, fmt.Errorf("%w: not a shmem memfd (file system 0x%x; hugetlbfs memory is refused)", ErrNotShareable, fs.Type)
	}
	if hole, err := unix.Seek(fd, int64(off), unix.SEEK_HOLE); err != nil || uint64(hole) < off+uint64(length) {
		return nil, nil, fmt.Errorf("%w: range %d+%d not populated (a hole at %d): fault its pages in first (Populate)", ErrNotShareable, off, length, hole)
	}
	start := off &^ uint64(PageSize-1)
	end := uint64(RoundPage(int(off + uint64(length))))
	if end > uint64(st.Size) {
		end = uint64(st.Size) // the tail page is only partly inside the file: map what exists
		if end < off+uint64(length) {
			return nil, nil, ErrNotShareable
		}
	}
	mapping, err = unix.Mmap(fd, int64(start), int(end-start), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: mmap: %v", ErrNotShareable, err)
	}
	v := off - start
	return mapping, mapping[v : v+uint64(length) : v+uint64(length)], nil
}

// Populate faults in, writable, every page of mem (a page-aligned part of a shared mapping
// of a memfd), as MapShared wants them: the pages become the caller's (charged to the
// caller's memory, as ibv_reg_mr pins pages in the registering process), and their contents
// do not change. MADV_POPULATE_WRITE (Linux 5.14) does it in one call; before that each
// page is touched with an atomic OR of zero. (fallocate is not enough: shmem leaves
// fallocated pages !uptodate, and SEEK_HOLE reports them as holes.)
func Populate(mem []byte) error {
	if len(mem) == 0 {
		return nil
	}
	base := unsafe.Pointer(&mem[0])
	if uintptr(base)&uintptr(PageSize-1) != 0 {
		return fmt.Errorf("%w: Populate of memory not page-aligned", ErrNotShareable)
	}
	n := uintptr(RoundPage(len(mem)))
	_, _, errno := unix.Syscall(unix.SYS_MADVISE, uintptr(base), n, unix.MADV_POPULATE_WRITE)
	if errno == 0 {
		return nil
	}
	if errno != unix.EINVAL {
		return fmt.Errorf("madvise(MADV_POPULATE_WRITE) %d bytes: %w", len(mem), errno)
	}
	for i := 0; i < len(mem); i += PageSize {
		atomic.OrUint32((*uint32)(unsafe.Add(base, i)), 0)
	}
	return nil
}

// Unmap releases a mapping from NewMemfd or MapShared.
func Unmap(b []byte) error {
	if b == nil {
		return nil
	}
	return unix.Munmap(b)
}

// NewEventFD returns a non-blocking, close-on-exec eventfd.
func NewEventFD() (int, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return -1, fmt.Errorf("eventfd: %w", err)
	}
	return fd, nil
}

var one = [8]byte{1}

// Signal adds 1 to an eventfd (never blocks: the fd is non-blocking and
// the counter saturates only at 2^64-2). A raw system call: the Go
// runtime's syscall bookkeeping (entersyscall, which wakes an idle
// process's sysmon thread with a futex) costs more than the write itself.
func Signal(fd int) {
	unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&one)), uintptr(len(one)))
}

// EventFile wraps an eventfd in an *os.File whose Read waits in the Go
// poller (no thread blocked); Close ends a pending Read. It takes fd.
func EventFile(fd int, name string) *os.File {
	return os.NewFile(uintptr(fd), name)
}

// WaitLoop calls fn, then again each time the eventfd f is written, until
// fn returns true or f is closed (then it returns the poller's error). It
// waits in the Go poller and never reads the counter after the first call:
// Go registers fds edge-triggered and every eventfd write is a new edge, so
// a wakeup costs no system call here (a read, then a read failing with
// EAGAIN, before). woken tells whether the eventfd was written: on the
// first call, whether its counter was non-zero (read once, so writes made
// before WaitLoop started waiting, whose edges the poller may have
// dropped, are not lost); later always true. Writes while fn runs are not
// lost either: the poller records the edge and the next wait returns at
// once; writes close together coalesce into one call. After the first
// call the counter is never drained (it saturates only after 2^64-2 writes).
func WaitLoop(f *os.File, fn func(woken bool) (stop bool)) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	first := true
	return rc.Read(func(fd uintptr) bool {
		if first {
			first = false
			var b [8]byte
			n, _ := unix.Read(int(fd), b[:])
			return fn(n == len(b))
		}
		return fn(true)
	})
}

// Rights builds an SCM_RIGHTS control message carrying fds.
func Rights(fds ...int) []byte {
	if len(fds) == 0 {
		return nil
	}
	return unix.UnixRights(fds...)
}

// ParseRights returns the file descriptors in a control message. Every
// returned fd belongs to the caller (close what you do not keep).
func ParseRights(oob []byte) []int {
	if len(oob) == 0 {
		return nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for i := range msgs {
		f, err := unix.ParseUnixRights(&msgs[i])
		if err == nil {
			fds = append(fds, f...)
		}
	}
	return fds
}

// CloseFDs closes every fd in fds.
func CloseFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// CloseFD closes one fd.
func CloseFD(fd int) error { return unix.Close(fd) }
