package mr

import (
	"encoding/binary"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Place is the target of a checked RDMA ATOMIC WRITE or FLUSH (CheckPlacementQP): the region's
// bytes when the memory is mapped, or a range of copied memory (RegMemory). It is a value: no
// allocation, and it stays usable until the check's done func is called.
type Place struct {
	b       []byte // mapped memory: exactly the target bytes (cap == len); nil for copied memory
	mem     Memory // copied memory: the target is mem's [off, off+n)
	off, n  uint64
	persist Persister
}

// Bytes returns the target's bytes when the memory is mapped; nil for copied memory, which
// StoreWord reaches by copying.
func (pl Place) Bytes() []byte { return pl.b }

// Len is the target's length in bytes.
func (pl Place) Len() int { return int(pl.n) }

// Copied reports whether the target is copied memory (mr.Memory).
func (pl Place) Copied() bool { return pl.mem != nil }

// Persister is what makes the target durable (RegMROptions.Persist); nil if the region has
// none, which is always the case for copied memory.
func (pl Place) Persister() Persister { return pl.persist }

// Aligned8 reports whether an 8-byte store at the start of the target is aligned (rxe checks
// the address it stores to, not only the iova). For mapped memory that is the address of the
// bytes; copied memory is written by a copy, whose address in its owner the table does not
// see, so only the iova's alignment (the caller's check) applies.
func (pl Place) Aligned8() bool {
	if pl.n < 8 {
		return false
	}
	if pl.mem != nil {
		return true
	}
	return uintptr(unsafe.Pointer(&pl.b[0]))&7 == 0
}

// StoreWord stores the 8 bytes *w at the start of the target (an ATOMIC WRITE, IBTA A19.4.2)
// with mu, the device's atomic lock, held: no CMP_SWAP or FETCH_ADD of the device (Atomic,
// which holds the same lock across its read and write) and no other ATOMIC WRITE runs between
// another atomic's load and store, on mapped and copied memory alike. The bytes land as they
// are (the payload's order; rxe stores them as one native word). w is the caller's buffer: a
// copy reads it, so it must not be a local that would escape.
//
// What the store is against the CPU: on mapped memory it is one aligned 64-bit atomic store,
// so a reader of the word (a program's load, another mapping of the page) sees all 8 bytes
// old or all new. On copied memory it is one 8-byte write through the owner's /proc/PID/mem:
// the kernel copies into the page with memcpy, which gives no single-copy atomicity, so a
// program that loads or stores the word from its own CPUs while the ATOMIC WRITE lands may see
// or leave a torn value; the guarantee is only against the device's other atomics (as for
// Atomic on copied memory). Programs that need more synchronise with the requester, as they
// must for any RDMA WRITE.
//
// Errors: ErrAlign if Aligned8 is false; ErrFault if the copied memory is gone.
func (pl Place) StoreWord(w *[8]byte, mu *sync.Mutex) error {
	if !pl.Aligned8() {
		return ErrAlign
	}
	mu.Lock()
	defer mu.Unlock()
	if pl.mem != nil {
		if pl.mem.WriteAt(w[:], pl.off) != nil {
			return ErrFault
		}
		return nil
	}
	atomic.StoreUint64((*uint64)(unsafe.Pointer(&pl.b[0])), binary.NativeEndian.Uint64(w[:]))
	return nil
}

// CheckPlacementQP validates the R_Key of an RDMA ATOMIC WRITE or FLUSH (IBTA 1.5, Annex A19
// memory placement extensions) for the responder of QP qpn: the key names a Valid region or
// window of pd whose access holds every bit of need (AccessRemoteWrite for ATOMIC WRITE,
// AccessFlushGlobal and/or AccessFlushPersistent for FLUSH, from its placement type), and
// unless whole, [va, va+length) lies inside it. Unlike Check, a zero length still validates
// the key and va (as kernel rxe does for these operations). whole selects the entire region
// (FLUSH with the Memory Region selectivity level: the RETH's VA and length are not used).
// Mapped and copied memory (RegMemory) are checked alike, against the registered length.
//
// It returns the target (the whole region with whole) and the done func the caller calls
// when it has finished touching it. The errors are Check's. It never allocates.
func (t *Table) CheckPlacementQP(pd *PD, qpn uint32, key uint32, va uint64, length uint32, need Access, whole bool) (pl Place, done func(), err error) {
	for try := 0; ; try++ {
		m := t.lookup(key)
		off, end, err := m.validatePlacement(pd, qpn, key, va, length, need, whole)
		if err != nil {
			return Place{}, noDone, err
		}
		g, ok := t.acquire(key, m)
		if !ok {
			if try == acquireTries-1 {
				return Place{}, noDone, ErrInvalidKey
			}
			continue // the mapping changed: check the new one, as check does
		}
		pl = Place{n: end - off, persist: m.persist}
		if m.ownerM != nil {
			pl.persist = m.ownerM.persist
		}
		if m.mem != nil {
			pl.mem, pl.off = m.mem, m.memOff+off
		} else {
			pl.b = m.buf[off:end:end]
		}
		return pl, g.doneFn, nil
	}
}

// validatePlacement applies CheckPlacementQP's rules to m, the mapping key's slot holds (nil
// if none); it returns the target's range in m.
func (m *mapping) validatePlacement(pd *PD, qpn uint32, key uint32, va uint64, length uint32, need Access, whole bool) (off, end uint64, err error) {
	if m == nil || m.key != key {
		return 0, 0, ErrBadKey
	}
	if m.state != KeyValid {
		return 0, 0, ErrInvalidKey
	}
	if m.kind == kindMW && m.mwType == MWType2 && (qpn == NoQPN || qpn != m.qpn) {
		return 0, 0, ErrWrongQP
	}
	if m.pd != pd {
		return 0, 0, ErrWrongPD
	}
	if m.acc&need != need {
		return 0, 0, ErrAccess
	}
	off, end = 0, m.size
	if !whole {
		if length > 0 && uint64(length)-1 > ^uint64(0)-va {
			return 0, 0, ErrOverflow
		}
		if va < m.iova {
			return 0, 0, ErrBounds
		}
		off = va - m.iova
		if off > m.size || uint64(length) > m.size-off {
			return 0, 0, ErrBounds
		}
		end = off + uint64(length)
	}
	return off, end, nil
}
