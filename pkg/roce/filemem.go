package roce

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/mr"
)

// Persistence (docs/objects.md, "Persistence"): a FLUSH with the persistence placement type
// (IBTA 1.5, A19.4.1.1) is acknowledged only once what was placed before it is durable. The
// only memory softroce can make durable is a shared mapping of a file on a file system that
// keeps data across a power loss (FileMemory): Persist runs msync(MS_SYNC) on the pages of the
// flushed range, which returns once the kernel wrote them to the file system and the file
// system says they are on stable storage (what fsync promises for that file system; on a DAX
// mount of persistent memory the same msync writes the CPU caches back). Every other memory
// (a Go slice, AllocBuffer's memory, a daemon client's memfd, device memory) is volatile, and a
// region over it cannot get AccessFlushPersistent.

// Persister is mr.Persister: what makes a region's bytes durable (RegMROptions.Persist).
type Persister = mr.Persister

// RegMROptions is mr.RegMROptions: options of Device.RegMRWith.
type RegMROptions = mr.RegMROptions

// ErrNotDurable: the file system of a FileMemory does not keep data across a reboot (tmpfs,
// ramfs, hugetlbfs), so it has no Persister.
var ErrNotDurable = errors.New("roce: the file system does not keep data: no persistence")

// FileMemory is a shared (MAP_SHARED) mapping of a file, for a region that takes
// AccessFlushPersistent: register Bytes() with RegMROptions{Persist: m.Persister()}.
type FileMemory struct {
	mu      sync.Mutex
	b       []byte
	durable bool
}

// volatileFS are the file systems whose data does not survive a reboot (statfs f_type).
var volatileFS = map[int64]string{
	unix.TMPFS_MAGIC: "tmpfs", unix.RAMFS_MAGIC: "ramfs", unix.HUGETLBFS_MAGIC: "hugetlbfs",
}

// MapFile maps the first length bytes of the file at path, read-write and shared, creating it
// (mode 0600) or extending it to length if it is shorter. The mapping stays valid after the file
// is closed or removed; Close unmaps it.
func MapFile(path string, length int) (*FileMemory, error) {
	if length <= 0 {
		return nil, fmt.Errorf("roce: MapFile %s: length %d", path, length)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() < int64(length) {
		if err := f.Truncate(int64(length)); err != nil {
			return nil, err
		}
	}
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &sfs); err != nil {
		return nil, err
	}
	b, err := unix.Mmap(int(f.Fd()), 0, length, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("roce: MapFile %s: %w", path, err)
	}
	_, vol := volatileFS[int64(sfs.Type)]
	return &FileMemory{b: b, durable: !vol}, nil
}

// Bytes returns the mapped memory (nil after Close).
func (m *FileMemory) Bytes() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.b
}

// Durable reports whether the file system keeps the file's data across a reboot.
func (m *FileMemory) Durable() bool { return m.durable }

// Persister returns the mapping as a Persister, or nil if its file system is not durable
// (RegMRWith then refuses AccessFlushPersistent: nothing a FLUSH could promise).
func (m *FileMemory) Persister() Persister {
	if !m.durable {
		return nil
	}
	return m
}

// Persist makes b, a part of Bytes(), durable: msync(MS_SYNC) of the pages that hold it. A
// FLUSH's response waits for it (docs/objects.md, "Persistence").
func (m *FileMemory) Persist(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.durable {
		return ErrNotDurable
	}
	if m.b == nil {
		return os.ErrClosed
	}
	base := uintptr(unsafe.Pointer(&m.b[0]))
	p := uintptr(unsafe.Pointer(&b[0]))
	if p < base || p-base+uintptr(len(b)) > uintptr(len(m.b)) {
		return fmt.Errorf("roce: Persist: %d bytes outside the mapping", len(b))
	}
	page := uintptr(os.Getpagesize())
	start := (p - base) &^ (page - 1)
	end := p - base + uintptr(len(b))
	return unix.Msync(m.b[start:end], unix.MS_SYNC)
}

// Close unmaps the memory. Deregister its regions first.
func (m *FileMemory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.b == nil {
		return nil
	}
	err := unix.Munmap(m.b)
	m.b = nil
	return err
}
