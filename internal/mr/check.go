package mr

import (
	"encoding/binary"
	"sync"
)

// NoQPN is passed as qpn to CheckQP by callers that have no QP context; type 2 windows are
// then refused (fail closed).
const NoQPN = ^uint32(0)

// Check is the one access validator (IBTA 10.6.3, 10.6.7, 9.7.4.1.5 for remote accesses). It
// returns exactly the bytes [va, va+length) of the object key names, with cap == len, or a
// typed error, plus a done func the caller must call when it has finished touching b (Dereg
// waits for it). It never allocates. For an MR over copied memory (RegMemory) b is nil: a
// caller that moves data uses CopyOut, CopyIn or Atomic, which work for both kinds.
//
// Order of checks: key lookup (ErrBadKey), key state (ErrInvalidKey), window type 2 QP
// (ErrWrongQP; Check has no QP, so type 2 windows are refused — responders use CheckQP), PD
// (ErrWrongPD), access rights (ErrAccess), range (ErrOverflow / ErrBounds).
//
// Zero length: a zero-length access touches no memory, so the key is not validated at all
// (IBTA 9.4.3/9.4.4: a zero-length RDMA WRITE or READ does not check the R_Key; a zero-length
// local SGE is ignored): b is nil, done is a no-op, err is nil. OpRemoteAtomic is never zero
// length: it must be 8 bytes (use CheckAtomic).
func (t *Table) Check(pd *PD, key uint32, va uint64, length uint32, op Op) (b []byte, done func(), err error) {
	return t.check(pd, NoQPN, key, va, length, op)
}

// CheckQP is Check for a responder that knows its QP number, so that type 2 memory windows
// bound to that QP are accepted (IBTA 10.6.7.2.3).
func (t *Table) CheckQP(pd *PD, qpn uint32, key uint32, va uint64, length uint32, op Op) (b []byte, done func(), err error) {
	return t.check(pd, qpn, key, va, length, op)
}

// CheckAtomic validates an atomic target (IBTA 9.4.5): 8 bytes at an 8-byte aligned va, with
// AccessRemoteAtomic. It returns the 8-byte slice. Misalignment is ErrAlign (rxe answers it
// with an invalid-request NAK; other failures are remote access errors).
func (t *Table) CheckAtomic(pd *PD, rkey uint32, va uint64) (b []byte, done func(), err error) {
	return t.CheckAtomicQP(pd, NoQPN, rkey, va)
}

// CheckAtomicQP is CheckAtomic with the responder's QP number (for type 2 windows).
func (t *Table) CheckAtomicQP(pd *PD, qpn uint32, rkey uint32, va uint64) (b []byte, done func(), err error) {
	if va&7 != 0 {
		return nil, noDone, ErrAlign
	}
	return t.check(pd, qpn, rkey, va, 8, OpRemoteAtomic)
}

func (t *Table) check(pd *PD, qpn uint32, key uint32, va uint64, length uint32, op Op) ([]byte, func(), error) {
	m, off, done, err := t.resolve(pd, qpn, key, va, length, op)
	if err != nil || m == nil || m.mem != nil {
		return nil, done, err // copied memory: CopyOut, CopyIn and Atomic reach it
	}
	e := off + uint64(length)
	return m.buf[off:e:e], done, nil
}

// resolve is Check returning the mapping and the offset of va in it (m nil for a zero-length
// access that touches nothing).
func (t *Table) resolve(pd *PD, qpn uint32, key uint32, va uint64, length uint32, op Op) (*mapping, uint64, func(), error) {
	if op == OpRemoteAtomic {
		if length != 8 || va&7 != 0 {
			return nil, 0, noDone, ErrAlign
		}
	} else if length == 0 {
		return nil, 0, noDone, nil
	}
	if op > OpRemoteAtomic {
		return nil, 0, noDone, ErrAccess
	}
	for try := 0; ; try++ {
		m := t.lookup(key)
		off, err := m.validate(pd, qpn, key, va, length, op)
		if err != nil {
			return nil, 0, noDone, err
		}
		if g, ok := t.acquire(key, m); ok {
			return m, off, g.doneFn, nil
		} else if try == acquireTries-1 {
			return nil, 0, noDone, ErrInvalidKey
		}
	}
}

// acquireTries bounds how often a check runs again because the key's mapping changed between
// its look and its reference (each time a control operation published a new mapping).
const acquireTries = 4

// acquire takes an in-flight reference on the registration of m, the mapping of key a check
// validated, and re-loads the key's mapping: if a control operation published another one
// meanwhile (or, for a window, its MR's mapping changed), the reference is dropped and ok is
// false: the caller checks again against what is there now. A Dereg or Rereg publishes first
// and then waits for the references of the registration it replaced, so either it sees this
// reference or this re-load sees its mapping.
func (t *Table) acquire(key uint32, m *mapping) (g *gen, ok bool) {
	g = m.gen
	if m.ownerM != nil {
		g = m.ownerM.gen
	}
	if g == nil {
		return nil, false
	}
	g.users.Add(1)
	if t.lookup(key) != m || (m.ownerM != nil && m.owner.cur.Load() != m.ownerM) {
		g.release()
		return nil, false
	}
	return g, true
}

// validate applies Check's rules (its order of checks) to m, the mapping key's slot holds (nil
// if none), for an access of length > 0 bytes at va; it returns the offset of va in m.
func (m *mapping) validate(pd *PD, qpn uint32, key uint32, va uint64, length uint32, op Op) (uint64, error) {
	if m == nil || m.key != key {
		return 0, ErrBadKey
	}
	if m.state != KeyValid {
		return 0, ErrInvalidKey
	}
	if m.kind == kindMW {
		if !op.remote() {
			return 0, ErrBadKey // a window has no L_Key (IBTA 10.6.7.2)
		}
		if m.mwType == MWType2 && (qpn == NoQPN || qpn != m.qpn) {
			return 0, ErrWrongQP
		}
	}
	if m.pd != pd {
		return 0, ErrWrongPD
	}
	if need := op.need(); need != 0 && m.acc&need == 0 {
		return 0, ErrAccess
	}
	// length > 0 here. The last byte va+length-1 must not wrap past 2^64-1.
	if uint64(length)-1 > ^uint64(0)-va {
		return 0, ErrOverflow
	}
	if va < m.iova {
		return 0, ErrBounds
	}
	off := va - m.iova
	if off > m.size || uint64(length) > m.size-off {
		return 0, ErrBounds
	}
	return off, nil
}

// Lookup reports the state of key without taking a reference (diagnostics, query verbs).
func (t *Table) Lookup(key uint32) KeyState {
	m := t.lookup(key)
	if m == nil || m.key != key {
		return KeyInvalid
	}
	return m.state
}

// CopyOut checks an access to [va, va+len(dst)) of key (OpLocalRead or OpRemoteRead, with the
// responder's qpn or NoQPN) and copies those bytes into dst, from mapped or copied memory. A
// copy that fails (copied memory gone) is ErrFault. It never allocates.
func (t *Table) CopyOut(pd *PD, qpn uint32, key uint32, va uint64, dst []byte, op Op) error {
	return t.copy(pd, qpn, key, va, dst, op, false)
}

// CopyIn checks an access to [va, va+len(src)) of key (OpLocalWrite or OpRemoteWrite) and
// copies src there.
func (t *Table) CopyIn(pd *PD, qpn uint32, key uint32, va uint64, src []byte, op Op) error {
	return t.copy(pd, qpn, key, va, src, op, true)
}

func (t *Table) copy(pd *PD, qpn uint32, key uint32, va uint64, p []byte, op Op, in bool) error {
	if len(p) == 0 {
		return nil
	}
	if uint64(len(p)) > 0xFFFFFFFF {
		return ErrBounds
	}
	m, off, done, err := t.resolve(pd, qpn, key, va, uint32(len(p)), op)
	if err != nil {
		return err
	}
	defer done()
	switch {
	case m.mem == nil && in:
		copy(m.buf[off:], p)
	case m.mem == nil:
		copy(p, m.buf[off:])
	case in:
		err = m.mem.WriteAt(p, m.memOff+off)
	default:
		err = m.mem.ReadAt(p, m.memOff+off)
	}
	if err != nil {
		return ErrFault
	}
	return nil
}

// Atomic checks an atomic target (CheckAtomicQP's rules) and executes CMP_SWAP (cmpSwap: the
// 8 bytes, read little-endian, become swap if they equal compare) or FETCH_ADD (they become
// their sum with add), with mu held across the read and the write (the device's atomic lock,
// IBTA 9.4.5). It returns the original value. scratch is the caller's buffer for copied memory. On copied memory the read and the write are two copies: atomic with respect to the
// device's other atomics, not to the owning process's CPU accesses (rxe's atomics are a locked
// read and write too).
func (t *Table) Atomic(pd *PD, qpn uint32, rkey uint32, va uint64, mu *sync.Mutex, scratch *[8]byte, cmpSwap bool, compare, swapAdd uint64) (uint64, error) {
	fn := func(orig uint64) uint64 {
		switch {
		case !cmpSwap:
			return orig + swapAdd
		case orig == compare:
			return swapAdd
		}
		return orig
	}
	if va&7 != 0 {
		return 0, ErrAlign
	}
	m, off, done, err := t.resolve(pd, qpn, rkey, va, 8, OpRemoteAtomic)
	if err != nil {
		return 0, err
	}
	defer done()
	mu.Lock()
	defer mu.Unlock()
	if m.mem == nil {
		b := m.buf[off : off+8]
		orig := binary.LittleEndian.Uint64(b)
		binary.LittleEndian.PutUint64(b, fn(orig))
		return orig, nil
	}
	if m.mem.ReadAt(scratch[:], m.memOff+off) != nil {
		return 0, ErrFault
	}
	orig := binary.LittleEndian.Uint64(scratch[:])
	binary.LittleEndian.PutUint64(scratch[:], fn(orig))
	if m.mem.WriteAt(scratch[:], m.memOff+off) != nil {
		return 0, ErrFault
	}
	return orig, nil
}

// Copied reports whether key now names copied memory (RegMemory, or a window bound to such a
// region). A hint for callers that batch their copies (a read ahead, a write behind): it takes
// no reference and checks nothing; CopyOut and CopyIn still check every access.
func (t *Table) Copied(key uint32) bool {
	m := t.lookup(key)
	return m != nil && m.key == key && m.mem != nil
}
