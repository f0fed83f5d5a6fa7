package mr

// ReregFlags says what Rereg changes: ibv_rereg_mr's IBV_REREG_MR_CHANGE_* bits.
type ReregFlags uint32

// Re-registration flags (enum ibv_rereg_mr_flags values).
const (
	// ReregTranslation: the memory, its length and its iova (IBV_REREG_MR_CHANGE_TRANSLATION).
	ReregTranslation ReregFlags = 1 << 0
	// ReregPD: the protection domain (IBV_REREG_MR_CHANGE_PD).
	ReregPD ReregFlags = 1 << 1
	// ReregAccess: the access flags (IBV_REREG_MR_CHANGE_ACCESS).
	ReregAccess ReregFlags = 1 << 2
	// ReregAll is every flag (IBV_REREG_MR_FLAGS_SUPPORTED).
	ReregAll = ReregTranslation | ReregPD | ReregAccess
)

// ReregOptions is one re-registration (Rereg). Fields a flag does not select are ignored.
type ReregOptions struct {
	Flags ReregFlags
	// PD is the new protection domain (ReregPD).
	PD *PD
	// Access is the new access (ReregAccess), with RegMR's rules.
	Access Access
	// Buf is the new memory (ReregTranslation), as RegMRWith takes it: Persist is its
	// Persister; IOVA is where it is addressed (0 with AccessZeroBased).
	Buf     []byte
	Persist Persister
	IOVA    uint64
}

// Rereg changes the MR's memory, protection domain and/or access flags in place (ibv_rereg_mr;
// the Reregister Memory Region verb, IBTA 10.6.3's rules for the new registration): its L_Key
// and R_Key stay the same (rxe keeps them; so does mlx5 where it can), so the keys a peer
// holds go on working under the new registration. The change is atomic for the data path:
// every access is checked and performed under either the old registration (its memory, PD and
// rights) or the new one, never a mix, and Rereg returns only once no access checked under the
// old one is in flight (for up to DefaultDeregTimeout; ReregWith takes a bound), so the old memory may then be reused or freed.
//
// Errors, with the MR unchanged: ErrInvalidArg (no flag or an unknown one, a nil, dead or
// foreign PD, an invalid access combination, a change of AccessZeroBased without a new
// translation, AccessFlushPersistent without a Persister, an iova range that wraps), ErrInvalidKey (deregistered), ErrBusy (a Dereg or another Rereg in
// progress, or memory windows bound to the MR: they were bound to the old registration),
// ErrState (a fast-register MR, which IBV_WR_REG_MR re-maps instead). ErrDraining: the new
// registration is in effect, but the wait for the old one's accesses ended first.
func (m *MR) Rereg(o ReregOptions) error { return m.ReregWith(o, nil, 0, DeregOptions{}) }

// ReregWith is Rereg for the softroce daemon: with mem not nil the new memory is length bytes
// of copied memory (as RegMemory takes it) in place of o.Buf, and wait bounds the wait for the
// old registration's accesses (DeregWith's bounds).
func (m *MR) ReregWith(o ReregOptions, mem Memory, length uint64, wait DeregOptions) error {
	if o.Flags == 0 || o.Flags&^ReregAll != 0 {
		return ErrInvalidArg
	}
	if o.Flags&ReregAccess != 0 && !o.Access.Valid() {
		return ErrInvalidArg
	}
	if o.Flags&ReregTranslation != 0 && o.Buf != nil && mem != nil {
		return ErrInvalidArg
	}
	t := m.t
	if err := m.lockReplaceable(); err != nil {
		return err
	}
	if m.fastReg {
		t.mu.Unlock()
		return ErrState
	}
	old := m.cur.Load()
	nm, err := old.reregistered(t, o, mem, length)
	if err != nil {
		t.mu.Unlock()
		return err
	}
	og := m.g
	m.g = newGen()
	nm.gen = m.g
	t.publish(t.slotOf(m.idx), &m.cur, nm)
	if nm.pd != old.pd {
		old.pd.objs--
		nm.pd.objs++
		m.pd = nm.pd
	}
	m.dereg = true // no Dereg or Rereg while this one waits
	// The registrations an earlier Rereg could not wait out may still touch the memory this one
	// replaces (one that changed only the PD or the access kept it): "returned, so the old
	// memory may be reused" holds only once none of their accesses is in flight either.
	// m.retired cannot change while m.dereg is set.
	gens := append([]*gen{og}, m.retired...)
	t.mu.Unlock()

	ok := waitGens(gens, wait)

	t.mu.Lock()
	defer t.mu.Unlock()
	m.dereg = false
	if !ok {
		m.retired = append(m.retired, og)
		return ErrDraining
	}
	m.retired = nil
	return nil
}

// reregistered is the mapping o makes of old, a Valid MR mapping (t.mu held); its gen is left
// for the caller.
func (old *mapping) reregistered(t *Table, o ReregOptions, mem Memory, length uint64) (*mapping, error) {
	nm := *old
	if o.Flags&ReregPD != 0 {
		if o.PD == nil || o.PD.t != t || o.PD.dead {
			return nil, ErrInvalidArg
		}
		nm.pd = o.PD
	}
	if o.Flags&ReregAccess != 0 {
		nm.acc = o.Access
	}
	if o.Flags&ReregTranslation != 0 {
		nm.buf, nm.mem, nm.memOff, nm.persist, nm.iova = nil, nil, 0, nil, o.IOVA
		if mem != nil {
			nm.mem, nm.size = mem, length
		} else {
			nm.buf, nm.size, nm.persist = o.Buf[:len(o.Buf):len(o.Buf)], uint64(len(o.Buf)), o.Persist
		}
		if nm.acc&AccessZeroBased != 0 {
			nm.iova = 0
		}
		if nm.size > 0 && nm.size-1 > ^uint64(0)-nm.iova {
			return nil, ErrInvalidArg
		}
	} else if (nm.acc^old.acc)&AccessZeroBased != 0 {
		// The address the region had before it was zero-based is not kept: a new translation
		// says where it is.
		return nil, ErrInvalidArg
	}
	if nm.acc&AccessFlushPersistent != 0 && nm.persist == nil {
		return nil, ErrInvalidArg // nothing makes the memory durable (RegMRWith)
	}
	return &nm, nil
}

// lockReplaceable locks the MR's table and, holding the lock, returns nil if the registration
// may be replaced (DeregWith, ReregWith): ErrInvalidKey once deregistered, ErrBusy while a
// Dereg or Rereg is in progress or memory windows are bound to the MR, each with the lock let
// go.
func (m *MR) lockReplaceable() error {
	t := m.t
	t.mu.Lock()
	if m.dead {
		t.mu.Unlock()
		return ErrInvalidKey
	}
	if m.dereg || m.nmw > 0 {
		t.mu.Unlock()
		return ErrBusy
	}
	return nil
}
