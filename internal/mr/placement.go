package mr

// CheckPlacementQP validates the R_Key of an RDMA ATOMIC WRITE or FLUSH (IBTA 1.5, Annex A19
// memory placement extensions) for the responder of QP qpn: the key names a Valid region or
// window of pd whose access holds every bit of need (AccessRemoteWrite for ATOMIC WRITE,
// AccessFlushGlobal and/or AccessFlushPersistent for FLUSH, from its placement type), and
// unless whole, [va, va+length) lies inside it. Unlike Check, a zero length still validates
// the key and va (as kernel rxe does for these operations). whole selects the entire region
// (FLUSH with the Memory Region selectivity level: the RETH's VA and length are not used).
//
// It returns the bytes (the whole region with whole), the Persister of the region that
// provides the memory (nil if it has none) and the done func the caller calls when it has
// finished touching b. The errors are Check's. It never allocates.
func (t *Table) CheckPlacementQP(pd *PD, qpn uint32, key uint32, va uint64, length uint32, need Access, whole bool) (b []byte, p Persister, done func(), err error) {
	m := t.lookup(key)
	if m == nil || m.key != key {
		return nil, nil, noDone, ErrBadKey
	}
	if m.state != KeyValid {
		return nil, nil, noDone, ErrInvalidKey
	}
	if m.kind == kindMW && m.mwType == MWType2 && (qpn == NoQPN || qpn != m.qpn) {
		return nil, nil, noDone, ErrWrongQP
	}
	if m.pd != pd {
		return nil, nil, noDone, ErrWrongPD
	}
	if m.acc&need != need {
		return nil, nil, noDone, ErrAccess
	}
	off, end := uint64(0), uint64(len(m.buf))
	if !whole {
		if length > 0 && uint64(length)-1 > ^uint64(0)-va {
			return nil, nil, noDone, ErrOverflow
		}
		if va < m.iova {
			return nil, nil, noDone, ErrBounds
		}
		off = va - m.iova
		if off > uint64(len(m.buf)) || uint64(length) > uint64(len(m.buf))-off {
			return nil, nil, noDone, ErrBounds
		}
		end = off + uint64(length)
	}
	owner := m.owner
	if owner == nil {
		return nil, nil, noDone, ErrInvalidKey
	}
	owner.users.Add(1)
	// re-validate after taking the reference, as check does
	if t.lookup(key) != m || (m.ownerM != nil && owner.cur.Load() != m.ownerM) {
		owner.release()
		return nil, nil, noDone, ErrInvalidKey
	}
	p = m.persist
	if m.ownerM != nil {
		p = m.ownerM.persist
	}
	return m.buf[off:end:end], p, owner.doneFn, nil
}
