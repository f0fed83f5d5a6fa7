package roce

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/link"
)

// Device memory and the XDP write responder (docs/api.md "Device memory"): a device whose link
// has the AF_XDP path's write responder (link.WriteResponder: afxdp.Options.WriteMemory) offers that memory
// through AllocDM, as an RNIC offers its on-chip memory through ibv_alloc_dm. An MR registered
// over device memory with remote write access is entered in the program's R_Key table, and
// every RC QP in RTR or RTS that allows remote writes is attached to it (qp.Config.Writes):
// the program then executes the QP's RDMA WRITE Only requests of up to 64 bytes into device
// memory and ACKs them in the sender's transmit, as kernel rxe does; everything else takes the
// usual path. Writes into other memory are unchanged.

// ErrNoDM: the device has no device memory (its link has no XDP write responder).
var ErrNoDM = errors.New("roce: the device has no device memory (AF_XDP path with a write responder)")

// devMem is a device's device memory and its write responder.
type devMem struct {
	l     link.WriteResponder
	link  link.Link // the link l is (writesFor compares)
	mem   []byte
	mu    sync.Mutex  // pages and allocs
	pages []bool      // in use
	alloc map[int]int // first page -> pages, per allocation
	// keys: MR index (key >> 8) -> the key entered in the program's table and the device
	// memory it covers (under the MR table's lock and mu)
	keys map[uint32]dmKey
}

type dmKey struct {
	key    uint32
	off, n int
}

const dmPage = 4096

func newDevMem(l link.Link) *devMem {
	u, ok := l.(link.WriteResponder)
	if !ok {
		return nil
	}
	mem := u.DeviceMemory()
	if len(mem) == 0 {
		return nil
	}
	return &devMem{l: u, link: l, mem: mem, pages: make([]bool, len(mem)/dmPage), alloc: map[int]int{}, keys: map[uint32]dmKey{}}
}

// AllocDM allocates n bytes of device memory (ibv_alloc_dm), zeroed and page-aligned, for
// MRs whose remote WRITEs the AF_XDP path's write responder executes, until FreeDM (after
// Close it is plain memory, no longer the program's). ErrNoDM without a write responder.
func (d *Device) AllocDM(n int) ([]byte, error) {
	m := d.dm
	if m == nil {
		return nil, ErrNoDM
	}
	if d.closed.Load() {
		return nil, ErrClosed
	}
	if n <= 0 {
		return nil, fmt.Errorf("%w: device memory of %d bytes", ErrInvalidArg, n)
	}
	np := (n + dmPage - 1) / dmPage
	m.mu.Lock()
	defer m.mu.Unlock()
	for first := 0; first+np <= len(m.pages); first++ {
		free := true
		for i := first; i < first+np; i++ {
			if m.pages[i] {
				free, first = false, i
				break
			}
		}
		if !free {
			continue
		}
		for i := first; i < first+np; i++ {
			m.pages[i] = true
		}
		m.alloc[first] = np
		b := m.mem[first*dmPage : first*dmPage+n : first*dmPage+n]
		clear(b)
		return b, nil
	}
	return nil, fmt.Errorf("%w: no %d free bytes of device memory (%d in all)", ErrLimit, n, len(m.mem))
}

// FreeDM frees device memory AllocDM returned (ibv_free_dm). MRs over it that allow remote
// writes must be deregistered first (ErrBusy).
func (d *Device) FreeDM(b []byte) error {
	m := d.dm
	if m == nil {
		return ErrNoDM
	}
	off, ok := m.offsetOf(b)
	if !ok || off%dmPage != 0 {
		return fmt.Errorf("%w: not device memory AllocDM returned", ErrInvalidArg)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	np, ok := m.alloc[off/dmPage]
	if !ok {
		return fmt.Errorf("%w: not device memory AllocDM returned", ErrInvalidArg)
	}
	for _, k := range m.keys {
		if k.off < off+np*dmPage && off < k.off+k.n {
			return fmt.Errorf("%w: MR %#x is registered over this device memory", ErrBusy, k.key)
		}
	}
	delete(m.alloc, off/dmPage)
	for i := off / dmPage; i < off/dmPage+np; i++ {
		m.pages[i] = false
	}
	return nil
}

// offsetOf returns where b starts in the device memory, if all of it lies there.
func (m *devMem) offsetOf(b []byte) (int, bool) {
	if len(b) == 0 || len(m.mem) == 0 {
		return 0, false
	}
	base, p := uintptr(unsafe.Pointer(&m.mem[0])), uintptr(unsafe.Pointer(&b[0]))
	if p < base || p-base >= uintptr(len(m.mem)) || uintptr(len(b)) > uintptr(len(m.mem))-(p-base) {
		return 0, false
	}
	return int(p - base), true
}

// keyChanged keeps the program's R_Key table equal to the valid MRs over device memory that
// allow remote writes (mr.TableOptions.OnKey: the MR table's lock is held).
func (m *devMem) keyChanged(e mr.KeyEvent) {
	idx := e.Key >> 8
	m.mu.Lock()
	old, had := m.keys[idx]
	delete(m.keys, idx)
	m.mu.Unlock()
	if had {
		m.l.RemoveWriteMR(old.key) // returns once no program run can write through it
	}
	if !e.MR || e.Access&mr.AccessRemoteWrite == 0 {
		return
	}
	if off, ok := m.offsetOf(e.Buf); ok {
		if m.l.AddWriteMR(e.Key, e.PD, e.IOVA, uint64(len(e.Buf)), uint64(off)) == nil {
			m.mu.Lock()
			m.keys[idx] = dmKey{key: e.Key, off: off, n: len(e.Buf)}
			m.mu.Unlock()
		}
	}
}

// AttachWrites attaches a QP to the program (qp.WriteResponder), paused until the QP
// publishes its state.
func (m *devMem) AttachWrites(w qp.WriteQPInfo) (qp.WriteState, error) {
	s, err := m.l.AddWriteQP(link.WriteQP{QPN: w.QPN, PD: w.PD, Local: w.Local, Peer: w.Peer,
		SrcPort: w.SrcPort, DstPort: w.DstPort, TClass: w.TClass, ACK: w.ACK}, 0, 0, true)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// DetachWrites takes a QP out of the program.
func (m *devMem) DetachWrites(s qp.WriteState) { m.l.RemoveWriteQP(s) }

// writesFor is the write responder for QP qpn: the device memory's, for QPs on its link.
func (d *Device) writesFor(qpn uint32) qp.WriteResponder {
	if d.dm == nil || d.links[qpn%uint32(len(d.links))] != d.dm.link {
		return nil
	}
	return d.dm
}
