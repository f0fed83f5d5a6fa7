package mr

// NoQPN is passed as qpn to CheckQP by callers that have no QP context; type 2 windows are
// then refused (fail closed).
const NoQPN = ^uint32(0)

// Check is the one access validator (IBTA 10.6.3, 10.6.7, 9.7.4.1.5 for remote accesses). It
// returns exactly the bytes [va, va+length) of the object key names, with cap == len, or a
// typed error, plus a done func the caller must call when it has finished touching b (Dereg
// waits for it). It never allocates.
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
	if op == OpRemoteAtomic {
		if length != 8 || va&7 != 0 {
			return nil, noDone, ErrAlign
		}
	} else if length == 0 {
		return nil, noDone, nil
	}
	if op > OpRemoteAtomic {
		return nil, noDone, ErrAccess
	}
	m := t.lookup(key)
	if m == nil || m.key != key {
		return nil, noDone, ErrBadKey
	}
	if m.state != KeyValid {
		return nil, noDone, ErrInvalidKey
	}
	if m.kind == kindMW {
		if !op.remote() {
			return nil, noDone, ErrBadKey // a window has no L_Key (IBTA 10.6.7.2)
		}
		if m.mwType == MWType2 && (qpn == NoQPN || qpn != m.qpn) {
			return nil, noDone, ErrWrongQP
		}
	}
	if m.pd != pd {
		return nil, noDone, ErrWrongPD
	}
	if need := op.need(); need != 0 && m.acc&need == 0 {
		return nil, noDone, ErrAccess
	}
	// length > 0 here. The last byte va+length-1 must not wrap past 2^64-1.
	if uint64(length)-1 > ^uint64(0)-va {
		return nil, noDone, ErrOverflow
	}
	if va < m.iova {
		return nil, noDone, ErrBounds
	}
	off := va - m.iova
	if off > uint64(len(m.buf)) || uint64(length) > uint64(len(m.buf))-off {
		return nil, noDone, ErrBounds
	}
	owner := m.owner
	owner.users.Add(1)
	// Re-validate after taking the reference: a concurrent Dereg/invalidate/rebind published
	// a new mapping first, then waits for users; either it sees our reference or we see it.
	if t.lookup(key) != m || (m.ownerM != nil && owner.cur.Load() != m.ownerM) {
		owner.release()
		return nil, noDone, ErrInvalidKey
	}
	e := off + uint64(length)
	return m.buf[off:e:e], owner.doneFn, nil
}

// Lookup reports the state of key without taking a reference (diagnostics, query verbs).
func (t *Table) Lookup(key uint32) KeyState {
	m := t.lookup(key)
	if m == nil || m.key != key {
		return KeyInvalid
	}
	return m.state
}
