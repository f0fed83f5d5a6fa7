package mr

import "sync/atomic"

// MWType is a memory window type (IBTA 10.6.7.2).
type MWType uint8

// Memory window types.
const (
	// MWType1 windows are bound with the ibv_bind_mw verb, get a CA-chosen key byte, may be
	// rebound while Valid, and cannot be invalidated by LOCAL_INV or SEND_WITH_INV.
	MWType1 MWType = 1
	// MWType2 windows (type 2B) are bound by a BIND_MW work request to one QP with a
	// consumer-chosen key byte, must be Free to bind, and are invalidated by LOCAL_INV or
	// SEND_WITH_INV.
	MWType2 MWType = 2
)

// MW is a memory window: a remote-access view onto a range of an MR.
type MW struct {
	t    *Table
	idx  uint32
	pd   *PD
	typ  MWType
	cur  atomic.Pointer[mapping]
	mr   *MR // bound MR (under t.mu)
	dead bool
}

// AllocMW allocates a window (ibv_alloc_mw; IBTA 10.6.7.2.1). Its key is Free until bound.
func (t *Table) AllocMW(pd *PD, typ MWType) (*MW, error) {
	if typ != MWType1 && typ != MWType2 {
		return nil, ErrInvalidArg
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if pd == nil || pd.t != t || pd.dead {
		return nil, ErrInvalidArg
	}
	if t.nMW >= t.o.MaxMW {
		return nil, ErrLimit
	}
	idx, key, err := t.allocIndex()
	if err != nil {
		return nil, err
	}
	w := &MW{t: t, idx: idx, pd: pd, typ: typ}
	t.publish(t.slotOf(idx), &w.cur, &mapping{key: key, state: KeyFree, kind: kindMW, pd: pd, mwType: typ, mw: w})
	t.nMW++
	pd.objs++
	return w, nil
}

// RKey returns the window's current remote key.
func (w *MW) RKey() uint32 { return w.cur.Load().key }

// State returns the key state.
func (w *MW) State() KeyState { return w.cur.Load().state }

// Type returns the window type.
func (w *MW) Type() MWType { return w.typ }

// BindOptions describes a bind (ibv_bind_mw / IBV_WR_BIND_MW; IBTA 10.6.7.2.2).
type BindOptions struct {
	// PD is the binding QP's PD; it must equal the window's PD. Nil skips the check (a type 1
	// bind not made by a QP).
	PD *PD
	// QPN is the QP a type 2 window is bound to (only that QP may use it).
	QPN uint32
	// MR is the region to bind to; nil (or Length 0 with a type 1 window) unbinds a type 1
	// window.
	MR     *MR
	Addr   uint64
	Length uint64
	// Access is the window's remote access: AccessRemoteRead/Write/Atomic (and ZeroBased, for
	// type 2 windows only).
	Access Access
	// Key is the new key byte for a type 2 window; it must differ from the current one.
	// Type 1 windows get a fresh CSPRNG key byte, unless KeyGiven.
	Key uint8
	// KeyGiven makes a type 1 bind take Key (it must differ from the current key byte) instead
	// of drawing one: ibv_bind_mw returns the window's new R_Key when it posts the bind, before
	// the bind runs, so the library that posts it picks the key (as rdma-core's rxe provider
	// does), and through the daemon the client does.
	KeyGiven bool
}

// Bind binds the window to [Addr, Addr+Length) of MR with Access, making its key Valid, and
// returns the new rkey. Rules (IBTA 10.6.7.2.2, as rxe_mw.c enforces them): the MR is Valid,
// has AccessMWBind and is in the window's PD; the range lies inside the MR; remote write or
// atomic access needs the MR to have AccessLocalWrite; a type 2 window must be Free and the
// binding QP's PD must be the window's PD, for type 1 windows too when the bind names one; only
// a type 2 window may be zero-based.
func (w *MW) Bind(o BindOptions) (uint32, error) {
	t := w.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if w.dead {
		return 0, ErrInvalidKey
	}
	cur := w.cur.Load()
	s := t.slotOf(w.idx)
	if w.typ == MWType1 {
		// The binding QP's PD must be the window's: IBTA 10.6.7.2.2 asks it of type 2 binds,
		// softroce of type 1 binds too, so no QP binds a window of another PD (through the
		// daemon, another tenant's: a type 1 bind names the window by its R_Key alone).
		if o.PD != nil && o.PD != w.pd {
			return 0, ErrWrongPD
		}
		if o.KeyGiven && o.Key == KeyByte(cur.key) {
			return 0, ErrInvalidArg
		}
		// A type 1 window is not zero-based (IBTA o10-36.2.2, as rxe_check_bind_mw); an
		// unbind's access is not looked at.
		if o.MR != nil && o.Length != 0 && o.Access&AccessZeroBased != 0 {
			return 0, ErrInvalidArg
		}
	}
	if w.typ == MWType2 {
		if cur.state != KeyFree {
			return 0, ErrState
		}
		if o.PD != nil && o.PD != w.pd {
			return 0, ErrWrongPD
		}
		if o.Key == KeyByte(cur.key) {
			return 0, ErrInvalidArg
		}
		if o.MR == nil {
			return 0, ErrInvalidArg
		}
	} else if o.MR == nil || o.Length == 0 {
		// Type 1 zero-length bind: unbind.
		b, err := t.type1Key(s, o)
		if err != nil {
			return 0, err
		}
		w.unbindLocked()
		t.publish(s, &w.cur, &mapping{key: MakeKey(w.idx, b), state: KeyFree, kind: kindMW, pd: w.pd, mwType: w.typ, mw: w})
		return w.cur.Load().key, nil
	}
	acc := o.Access
	if acc&^(AccessRemoteRead|AccessRemoteWrite|AccessRemoteAtomic|AccessZeroBased) != 0 {
		return 0, ErrInvalidArg
	}
	m := o.MR
	mm := m.cur.Load()
	if m.t != t || m.dead || m.dereg || mm.state != KeyValid {
		return 0, ErrInvalidKey
	}
	if m.pd != w.pd {
		return 0, ErrWrongPD
	}
	if mm.acc&AccessMWBind == 0 {
		return 0, ErrAccess
	}
	if acc&(AccessRemoteWrite|AccessRemoteAtomic) != 0 && mm.acc&AccessLocalWrite == 0 {
		return 0, ErrAccess
	}
	if o.Addr < mm.iova || o.Length > mm.size || o.Addr-mm.iova > mm.size-o.Length {
		return 0, ErrBounds
	}
	var b uint8
	if w.typ == MWType2 {
		b = o.Key
		setKeyByte(s, b)
	} else {
		var err error
		if b, err = t.type1Key(s, o); err != nil {
			return 0, err
		}
	}
	off := o.Addr - mm.iova
	e := off + o.Length
	iova := o.Addr
	if acc&AccessZeroBased != 0 {
		iova = 0
	}
	w.unbindLocked()
	w.mr = m
	m.nmw++
	mp := &mapping{
		key: MakeKey(w.idx, b), state: KeyValid, kind: kindMW, pd: w.pd,
		size: o.Length, iova: iova, acc: acc, owner: m, ownerM: mm,
		mwType: w.typ, qpn: o.QPN, mw: w,
	}
	if mm.mem != nil {
		mp.mem, mp.memOff = mm.mem, mm.memOff+off
	} else {
		mp.buf = mm.buf[off:e:e]
	}
	t.publish(s, &w.cur, mp)
	return w.cur.Load().key, nil
}

// type1Key is a type 1 bind's new key byte: the binder's (KeyGiven) or a fresh one. Caller
// holds t.mu.
func (t *Table) type1Key(s *slot, o BindOptions) (uint8, error) {
	if o.KeyGiven {
		setKeyByte(s, o.Key)
		return o.Key, nil
	}
	return t.drawKey(s)
}

func (w *MW) unbindLocked() {
	if w.mr != nil {
		w.mr.nmw--
		w.mr = nil
	}
}

// Dealloc frees the window (ibv_dealloc_mw); its key becomes Invalid.
func (w *MW) Dealloc() error {
	t := w.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if w.dead {
		return ErrInvalidKey
	}
	w.unbindLocked()
	inv := *w.cur.Load()
	inv.state = KeyInvalid
	w.cur.Store(&inv)
	w.dead = true
	t.releaseIndex(w.idx)
	t.nMW--
	w.pd.objs--
	return nil
}

// Invalidate moves a Valid key to Free: LOCAL_INV (IBTA 10.6.7.2.4 / 10.6.3.5) or the remote
// invalidation of SEND_WITH_INV (IBTA 9.4.1.1; responders should use InvalidateQP). It applies
// to fast-register MRs and type 2 windows; an ordinary MR or a type 1 window gives ErrState,
// a fast-register MR with bound windows ErrBusy. pd is the QP's PD.
func (t *Table) Invalidate(pd *PD, key uint32) error { return t.invalidate(pd, NoQPN, key) }

// InvalidateQP is the remote invalidation of SEND_WITH_INV received on QP qpn: a type 2
// window must be bound to that QP (IBTA 10.6.7.2.4).
func (t *Table) InvalidateQP(pd *PD, qpn uint32, key uint32) error {
	if qpn == NoQPN {
		return ErrWrongQP
	}
	return t.invalidate(pd, qpn, key)
}

func (t *Table) invalidate(pd *PD, qpn uint32, key uint32) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.lookup(key)
	if m == nil || m.key != key {
		return ErrBadKey
	}
	if m.state != KeyValid {
		return ErrInvalidKey
	}
	if m.pd != pd {
		return ErrWrongPD
	}
	s := t.slotOf(KeyIndex(key))
	nm := &mapping{key: key, state: KeyFree, kind: m.kind, pd: m.pd, mwType: m.mwType, mw: m.mw}
	switch m.kind {
	case kindMR:
		mr := m.owner
		if !mr.fastReg {
			return ErrState
		}
		if mr.nmw > 0 {
			return ErrBusy
		}
		if mr.dereg {
			return ErrInvalidKey
		}
		nm.owner = mr
		t.publish(s, &mr.cur, nm)
	case kindMW:
		if m.mwType != MWType2 {
			return ErrState
		}
		if qpn != NoQPN && qpn != m.qpn {
			return ErrWrongQP
		}
		w := m.mw
		w.unbindLocked()
		t.publish(s, &w.cur, nm)
	}
	return nil
}

// MRByKey returns the MR whose current key is key (any key state but Invalid), or nil. For
// work requests that name an MR by key (BIND_MW's MR, fast-register). Lock-free.
func (t *Table) MRByKey(key uint32) *MR {
	m := t.lookup(key)
	if m == nil || m.key != key || m.kind != kindMR || m.state == KeyInvalid {
		return nil
	}
	return m.owner
}

// MWByKey returns the memory window whose current rkey is key, or nil (BIND_MW names the
// window by its rkey). Lock-free.
func (t *Table) MWByKey(key uint32) *MW {
	m := t.lookup(key)
	if m == nil || m.key != key || m.kind != kindMW || m.state == KeyInvalid {
		return nil
	}
	return m.mw
}
