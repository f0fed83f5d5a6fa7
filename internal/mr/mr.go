// Long file: keys, the mapping table and the one access validator (Check) every data path
// uses, kept together so every memory-protection rule of IBTA 10.6 is reviewed in one place.

// Package mr implements protection domains, memory regions, memory windows and their keys,
// and the one access validator every data path uses (IBTA 10.6 "Memory protection").
//
// Keys. An lkey/rkey is (24-bit index << 8) | 8-bit key byte. The index names a slot of the
// Table; the key byte is drawn from a CSPRNG (crypto/rand unless TableOptions.Rand is set) at
// every registration of the slot and is never equal to the previous key byte of that slot, so
// a stale key (from a deregistered or re-registered object) or a guessed key is refused.
// Index 0 is never used, so key 0 is never valid.
//
// Concurrency. Each slot holds an atomic pointer to an immutable mapping (key, state, PD,
// buffer, iova, access). Check loads it without a lock, takes an in-flight reference on the
// registration the mapping belongs to (a gen: an MR has a new one after each Rereg), then
// re-loads the mapping: if it changed meanwhile the reference is dropped and the check runs
// again against the new mapping (which refuses a deregistered or invalidated key). Control
// operations (register, deregister, re-register, bind, invalidate, fast-register) serialise on
// Table.mu and publish a new mapping. Dereg first publishes an Invalid mapping, then waits
// (bounded) for the in-flight counts of the MR's registrations to reach zero: after that no
// data path can touch the buffer. Rereg publishes the new registration, then waits for the
// accesses of the one it replaced: an access checked under either sees only that one's
// memory, PD and rights. Check never allocates; done is a method value cached on the gen.
package mr

import (
	"context"
	"crypto/rand"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// Access is a set of ibv_access_flags.
type Access uint32

// Access flags (ibv_access_flags values).
const (
	AccessLocalWrite   Access = 1  // IBV_ACCESS_LOCAL_WRITE
	AccessRemoteWrite  Access = 2  // IBV_ACCESS_REMOTE_WRITE
	AccessRemoteRead   Access = 4  // IBV_ACCESS_REMOTE_READ
	AccessRemoteAtomic Access = 8  // IBV_ACCESS_REMOTE_ATOMIC
	AccessMWBind       Access = 16 // IBV_ACCESS_MW_BIND
	AccessZeroBased    Access = 32 // IBV_ACCESS_ZERO_BASED: addresses are offsets from 0
	// AccessFlushGlobal (IBV_ACCESS_FLUSH_GLOBAL) lets a remote FLUSH with the global
	// visibility placement type target the region (IBTA A19.4.1.1, memory placement).
	AccessFlushGlobal Access = 1 << 8
	// AccessFlushPersistent (IBV_ACCESS_FLUSH_PERSISTENT) lets a remote FLUSH with the
	// persistence placement type target the region. Only memory that can be made durable
	// takes it: RegMRWith with a Persister (docs/objects.md, "Persistence"); RegMR refuses it,
	// as rxe refuses it on pages that are not persistent memory.
	AccessFlushPersistent Access = 1 << 9
	accessAll                    = AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead |
		AccessRemoteAtomic | AccessMWBind | AccessZeroBased | AccessFlushGlobal | AccessFlushPersistent
)

// Valid reports whether a holds only defined bits and obeys the ibverbs rule that
// REMOTE_WRITE or REMOTE_ATOMIC requires LOCAL_WRITE (ibv_reg_mr EINVAL; IBTA 10.6.3.1).
func (a Access) Valid() bool {
	if a&^accessAll != 0 {
		return false
	}
	if a&(AccessRemoteWrite|AccessRemoteAtomic) != 0 && a&AccessLocalWrite == 0 {
		return false
	}
	return true
}

// Op is the kind of access a Check asks for.
type Op uint8

// Access operations.
const (
	OpLocalRead    Op = iota // gather from an SGE (send payload, WRITE source, READ response source locally)
	OpLocalWrite             // scatter into an SGE (receive, READ response, atomic result)
	OpRemoteRead             // responder: RDMA READ (IBTA 9.4.4)
	OpRemoteWrite            // responder: RDMA WRITE (IBTA 9.4.3)
	OpRemoteAtomic           // responder: atomics (IBTA 9.4.5)
)

// String names the operation.
func (o Op) String() string {
	switch o {
	case OpLocalRead:
		return "local read"
	case OpLocalWrite:
		return "local write"
	case OpRemoteRead:
		return "remote read"
	case OpRemoteWrite:
		return "remote write"
	case OpRemoteAtomic:
		return "remote atomic"
	}
	return "unknown op"
}

func (o Op) remote() bool { return o >= OpRemoteRead && o <= OpRemoteAtomic }

// need returns the access bit op requires (0 = always allowed).
func (o Op) need() Access {
	switch o {
	case OpLocalWrite:
		return AccessLocalWrite
	case OpRemoteRead:
		return AccessRemoteRead
	case OpRemoteWrite:
		return AccessRemoteWrite
	case OpRemoteAtomic:
		return AccessRemoteAtomic
	}
	return 0
}

// KeyState is the state of an L_Key/R_Key (IBTA 10.6.7.1 / 10.6.7.2).
type KeyState uint8

// Key states.
const (
	// KeyInvalid: the key names nothing (deregistered, deallocated, or never allocated).
	KeyInvalid KeyState = iota
	// KeyFree: the object exists but is not usable: a fast-register MR or a memory window
	// that has been allocated or invalidated and not (re)registered or bound.
	KeyFree
	// KeyValid: accesses that pass the checks are allowed.
	KeyValid
)

// String returns "invalid", "free" or "valid".
func (s KeyState) String() string {
	switch s {
	case KeyFree:
		return "free"
	case KeyValid:
		return "valid"
	}
	return "invalid"
}

// MaxIndex is the largest slot index (24 bits).
const MaxIndex = 1<<24 - 1

// KeyIndex returns the 24-bit index of a key.
func KeyIndex(key uint32) uint32 { return key >> 8 }

// KeyByte returns the 8-bit key byte of a key.
func KeyByte(key uint32) uint8 { return uint8(key) }

// MakeKey builds a key from an index and a key byte.
func MakeKey(index uint32, b uint8) uint32 { return index<<8 | uint32(b) }

type kind uint8

const (
	kindMR kind = iota + 1
	kindMW
)

// mapping is an immutable snapshot of one slot. A new one is published on every change.
type mapping struct {
	key    uint32
	state  KeyState
	kind   kind
	pd     *PD
	buf    []byte // mapped memory: exactly the addressable bytes; cap == len
	mem    Memory // copied memory (buf nil): the region is mem's [memOff, memOff+size)
	memOff uint64
	size   uint64 // the addressable length (len(buf) for mapped memory)
	iova   uint64
	acc    Access
	owner  *MR      // MR providing the memory (the MR itself, or the MR a window is bound to)
	ownerM *mapping // for windows: owner's mapping at bind time (re-checked on access)
	mwType MWType
	qpn    uint32 // type 2 window: the QP it is bound to
	mw     *MW    // windows: the window object
	// persist makes the MR's bytes durable (RegMROptions.Persist); nil for windows, which
	// use their owner's (ownerM.persist)
	persist Persister
	// gen counts the accesses that passed a check of this mapping (an MR's mappings: its
	// registration at the time; nil for windows, which count on ownerM.gen, and for Free or
	// Invalid mappings, which no check passes)
	gen *gen
}

type slot struct {
	m    atomic.Pointer[mapping]
	last uint8 // previous key byte (under Table.mu)
	used bool  // ever drawn (under Table.mu)
}

// TableOptions configures NewTable. Zero limits take the device defaults.
type TableOptions struct {
	MaxMR, MaxPD, MaxMW int
	// Rand supplies key bytes. Nil means crypto/rand. Tests inject deterministic readers.
	Rand io.Reader
	// OnKey, if set, hears of every change of a key's mapping (registration, fast
	// registration, invalidation, a window's bind, deregistration), with the
	// table's lock held: it must not call the table. A device's write responder outside the
	// engine keeps its own R_Key table with it (pkg/roce, devmem.go).
	OnKey func(KeyEvent)
}

// KeyEvent is a key's new mapping (TableOptions.OnKey).
type KeyEvent struct {
	Key uint32
	// MR is true for a memory region's valid key; Buf, IOVA, PD and Access are then its
	// mapping. Anything else (a free, invalid or released key, a window) has MR false.
	MR     bool
	Buf    []byte
	IOVA   uint64
	PD     uint32
	Access Access
}

// Default limits (rxe_param.h: RXE_MAX_MR, RXE_MAX_PD; MaxMW is softroce's choice).
const (
	DefaultMaxMR = 256 * 1024
	DefaultMaxPD = 0x7ffc
	DefaultMaxMW = 0x10000
)

const chunk = 64

// Table holds one device's PDs, MRs and MWs and their keys. Lookups are O(1) and lock-free.
type Table struct {
	mu    sync.Mutex
	slots atomic.Pointer[[]*slot]
	free  []uint32 // FIFO of free indices: reuse is as late as possible
	nMR   int
	nMW   int
	nPD   int
	pdSeq uint32
	o     TableOptions
	rb    [1]byte
}

// NewTable creates a table.
func NewTable(o TableOptions) *Table {
	if o.MaxMR <= 0 {
		o.MaxMR = DefaultMaxMR
	}
	if o.MaxPD <= 0 {
		o.MaxPD = DefaultMaxPD
	}
	if o.MaxMW <= 0 {
		o.MaxMW = DefaultMaxMW
	}
	if o.Rand == nil {
		o.Rand = rand.Reader
	}
	t := &Table{o: o}
	s := make([]*slot, 0)
	t.slots.Store(&s)
	return t
}

// lookup returns the current mapping of key's slot (nil if none). Lock-free.
func (t *Table) lookup(key uint32) *mapping {
	idx := key >> 8
	s := *t.slots.Load()
	if idx == 0 || idx >= uint32(len(s)) {
		return nil
	}
	return s[idx].m.Load()
}

func (t *Table) slotOf(idx uint32) *slot { return (*t.slots.Load())[idx] }

// allocIndex returns a free slot index and a fresh key for it. Caller holds t.mu.
func (t *Table) allocIndex() (uint32, uint32, error) {
	if len(t.free) == 0 {
		old := *t.slots.Load()
		start := len(old)
		if start == 0 {
			start = 1 // index 0 is reserved
		}
		if start > MaxIndex {
			return 0, 0, ErrLimit
		}
		end := min(start+chunk, MaxIndex+1)
		ns := make([]*slot, end)
		copy(ns, old)
		for i := len(old); i < end; i++ {
			ns[i] = new(slot)
		}
		t.slots.Store(&ns)
		for i := start; i < end; i++ {
			t.free = append(t.free, uint32(i))
		}
	}
	idx := t.free[0]
	t.free = t.free[1:]
	b, err := t.drawKey(t.slotOf(idx))
	if err != nil {
		t.free = append(t.free, idx)
		return 0, 0, err
	}
	return idx, MakeKey(idx, b), nil
}

// drawKey draws a key byte from the CSPRNG that differs from the slot's previous one.
// Caller holds t.mu.
func (t *Table) drawKey(s *slot) (uint8, error) {
	if _, err := io.ReadFull(t.o.Rand, t.rb[:]); err != nil {
		return 0, ErrRand
	}
	b := t.rb[0]
	if s.used && b == s.last {
		b++ // never repeat the previous key byte of this index
	}
	s.used, s.last = true, b
	return b, nil
}

// setKeyByte records a consumer-chosen key byte (fast-register, type 2 bind). Caller holds t.mu.
func setKeyByte(s *slot, b uint8) { s.used, s.last = true, b }

func (t *Table) releaseIndex(idx uint32) {
	if old := t.slotOf(idx).m.Load(); old != nil && t.o.OnKey != nil {
		t.o.OnKey(KeyEvent{Key: old.key})
	}
	t.slotOf(idx).m.Store(nil)
	t.free = append(t.free, idx)
}

// PD is a protection domain (IBTA 10.2.3).
type PD struct {
	t      *Table
	handle uint32
	objs   int // MRs and MWs in this PD (under t.mu)
	dead   bool
}

// AllocPD allocates a protection domain.
func (t *Table) AllocPD() (*PD, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.nPD >= t.o.MaxPD {
		return nil, ErrLimit
	}
	t.nPD++
	t.pdSeq++
	return &PD{t: t, handle: t.pdSeq}, nil
}

// Handle returns the PD's number (for diagnostics).
func (p *PD) Handle() uint32 { return p.handle }

// Dealloc frees the PD. It fails with ErrBusy while MRs or MWs remain in it.
func (p *PD) Dealloc() error {
	t := p.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if p.dead {
		return ErrInvalidArg
	}
	if p.objs > 0 {
		return ErrBusy
	}
	p.dead = true
	t.nPD--
	return nil
}

// MR is a memory region: a caller's []byte reachable at [IOVA, IOVA+Len).
type MR struct {
	t       *Table
	idx     uint32
	pd      *PD
	fastReg bool
	backing []byte // fast-register MRs: the memory FastReg maps by default

	cur atomic.Pointer[mapping] // last published mapping (readable after Dereg)
	// g is the current registration (under t.mu); retired, the registrations Rereg replaced
	// whose accesses it could not wait out (under t.mu; Dereg waits for them too)
	g       *gen
	retired []*gen

	nmw   int  // windows bound to this MR (under t.mu)
	dereg bool // a Dereg or Rereg is in progress (under t.mu)
	dead  bool // deregistered (under t.mu)
}

func (t *Table) publish(s *slot, cur *atomic.Pointer[mapping], mp *mapping) {
	cur.Store(mp)
	s.m.Store(mp)
	if t.o.OnKey != nil {
		e := KeyEvent{Key: mp.key}
		if mp.kind == kindMR && mp.state == KeyValid {
			// Copied memory (mp.buf nil) is an MR no one outside the engine can address.
			e.MR, e.Buf, e.IOVA, e.PD, e.Access = mp.mem == nil, mp.buf, mp.iova, mp.pd.handle, mp.acc
		}
		t.o.OnKey(e)
	}
}

func newMR(t *Table, pd *PD, idx uint32) *MR {
	return &MR{t: t, idx: idx, pd: pd, g: newGen()}
}

// RegMR registers buf at iova with access acc (ibv_reg_mr / ibv_reg_mr_iova; IBTA 10.6.3.1).
// The MR's key state is Valid. With AccessZeroBased the MR is addressed from 0 (iova is
// ignored). Errors: ErrInvalidArg (bad access combination, nil/dead PD, iova+len overflow,
// AccessFlushPersistent: see RegMRWith), ErrLimit, ErrRand.
func (t *Table) RegMR(pd *PD, buf []byte, iova uint64, acc Access) (*MR, error) {
	return t.RegMRWith(pd, buf, iova, acc, RegMROptions{})
}

// Persister makes registered memory durable: a FLUSH with the persistence placement type
// (IBTA A19.4.1.1) returns its response only after Persist returned nil for the bytes it
// covers.
type Persister interface {
	// Persist returns once b, a sub-slice of the registered buffer, is durable (for a
	// file mapping: msync(MS_SYNC) of the pages holding it), or the error that kept it
	// from being so.
	Persist(b []byte) error
}

// RegMROptions configures RegMRWith.
type RegMROptions struct {
	// Persist, if set, is how the region's bytes become durable. AccessFlushPersistent
	// needs it: memory without one (the Go heap, a memfd, device memory) is volatile, and
	// registering it for persistent FLUSH is refused (ErrInvalidArg) rather than promising
	// what a FLUSH could not keep.
	Persist Persister
}

// RegMRWith is RegMR with options.
func (t *Table) RegMRWith(pd *PD, buf []byte, iova uint64, acc Access, o RegMROptions) (*MR, error) {
	if !acc.Valid() || (acc&AccessFlushPersistent != 0 && o.Persist == nil) {
		return nil, ErrInvalidArg
	}
	if acc&AccessZeroBased != 0 {
		iova = 0
	}
	if len(buf) > 0 && uint64(len(buf)-1) > ^uint64(0)-iova {
		return nil, ErrInvalidArg
	}
	return t.register(pd, mapping{buf: buf[:len(buf):len(buf)], size: uint64(len(buf)), iova: iova, acc: acc, persist: o.Persist})
}

// register adds an MR in pd whose mapping is mp (its memory, size, iova, access; register
// fills in the key, state, kind, PD and owner): RegMR's and RegMemory's common part.
func (t *Table) register(pd *PD, mp mapping) (*MR, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if pd == nil || pd.t != t || pd.dead {
		return nil, ErrInvalidArg
	}
	if t.nMR >= t.o.MaxMR {
		return nil, ErrLimit
	}
	idx, key, err := t.allocIndex()
	if err != nil {
		return nil, err
	}
	m := newMR(t, pd, idx)
	mp.key, mp.state, mp.kind, mp.pd, mp.owner, mp.gen = key, KeyValid, kindMR, pd, m, m.g
	t.publish(t.slotOf(idx), &m.cur, &mp)
	t.nMR++
	pd.objs++
	return m, nil
}

// Memory is registered memory the device reaches by copying, not by addressing it: the softroce
// daemon's view of a client process's memory, read and written through that process's
// /proc/self/mem. An MR over it (RegMemory) works for every access Table.CopyOut, CopyIn and
// Atomic make; Check validates it but returns no bytes. Implementations copy without allocating
// and report ErrFault (or any error, which the table turns into ErrFault) when the memory is
// gone: its owner unmapped it or exited.
type Memory interface {
	// ReadAt copies len(p) bytes at offset off of the memory into p.
	ReadAt(p []byte, off uint64) error
	// WriteAt copies p to offset off of the memory.
	WriteAt(p []byte, off uint64) error
}

// RegMemory registers length bytes of mem at iova with access acc, as RegMR registers a buffer
// (same checks and errors). Copied memory has no Persister, so AccessFlushPersistent is
// ErrInvalidArg (rxe refuses it too over memory that is not persistent).
func (t *Table) RegMemory(pd *PD, mem Memory, length, iova uint64, acc Access) (*MR, error) {
	if mem == nil || !acc.Valid() || acc&AccessFlushPersistent != 0 {
		return nil, ErrInvalidArg
	}
	if acc&AccessZeroBased != 0 {
		iova = 0
	}
	if length > 0 && length-1 > ^uint64(0)-iova {
		return nil, ErrInvalidArg
	}
	return t.register(pd, mapping{mem: mem, size: length, iova: iova, acc: acc})
}

// AllocMROptions configures AllocMR.
type AllocMROptions struct {
	// Buf is the memory later fast-registrations map (their Length <= len(Buf)), unless a
	// FastRegOptions.Buf replaces it.
	Buf []byte
}

// AllocMR allocates a fast-register MR (ib_alloc_mr, IBTA 10.6.3.3 "Allocate L_Key"): its key
// is in the Free state until FastReg makes it Valid.
func (t *Table) AllocMR(pd *PD, o AllocMROptions) (*MR, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if pd == nil || pd.t != t || pd.dead {
		return nil, ErrInvalidArg
	}
	if t.nMR >= t.o.MaxMR {
		return nil, ErrLimit
	}
	idx, key, err := t.allocIndex()
	if err != nil {
		return nil, err
	}
	m := newMR(t, pd, idx)
	m.fastReg = true
	m.backing = o.Buf
	t.publish(t.slotOf(idx), &m.cur, &mapping{key: key, state: KeyFree, kind: kindMR, pd: pd, owner: m})
	t.nMR++
	pd.objs++
	return m, nil
}

// FastRegOptions configures a fast-register work request (IBV_WR_REG_MR; IBTA 10.6.3.4).
type FastRegOptions struct {
	// PD, if non-nil, must be the PD of the MR (the posting QP's PD).
	PD *PD
	// Buf replaces the memory to map; nil maps AllocMROptions.Buf.
	Buf    []byte
	IOVA   uint64
	Length uint64
	Access Access
	// Key is the new key byte (ibv_inc_rkey style); the index does not change.
	Key uint8
}

// FastReg maps memory into a Free fast-register MR and makes its key Valid with the new key
// byte. Errors: ErrState (not a fast-register MR, or not Free), ErrInvalidArg, ErrWrongPD.
func (m *MR) FastReg(o FastRegOptions) error {
	t := m.t
	if !o.Access.Valid() || o.Access&AccessFlushPersistent != 0 { // no Persister: see RegMRWith
		return ErrInvalidArg
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := m.cur.Load()
	if m.dead || m.dereg || !m.fastReg {
		return ErrState
	}
	if cur.state != KeyFree {
		return ErrState
	}
	if o.PD != nil && o.PD != m.pd {
		return ErrWrongPD
	}
	buf := o.Buf
	if buf == nil {
		buf = m.backing
	}
	if o.Length > uint64(len(buf)) {
		return ErrInvalidArg
	}
	iova := o.IOVA
	if o.Access&AccessZeroBased != 0 {
		iova = 0
	}
	if o.Length > 0 && o.Length-1 > ^uint64(0)-iova {
		return ErrInvalidArg
	}
	s := t.slotOf(m.idx)
	setKeyByte(s, o.Key)
	n := int(o.Length)
	t.publish(s, &m.cur, &mapping{
		key: MakeKey(m.idx, o.Key), state: KeyValid, kind: kindMR, pd: m.pd,
		buf: buf[:n:n], size: uint64(n), iova: iova, acc: o.Access, owner: m, gen: m.g,
	})
	return nil
}

// LKey returns the local key (equal to the remote key, as in rxe).
func (m *MR) LKey() uint32 { return m.cur.Load().key }

// RKey returns the remote key.
func (m *MR) RKey() uint32 { return m.cur.Load().key }

// IOVA returns the first virtual address (0 for zero-based MRs).
func (m *MR) IOVA() uint64 { return m.cur.Load().iova }

// Len returns the length in bytes.
func (m *MR) Len() int { return int(m.cur.Load().size) }

// Access returns the access flags.
func (m *MR) Access() Access { return m.cur.Load().acc }

// PD returns the protection domain (Rereg may change it).
func (m *MR) PD() *PD { return m.cur.Load().pd }

// State returns the key state.
func (m *MR) State() KeyState { return m.cur.Load().state }

// InFlight returns the number of accesses that have passed Check and not called done.
func (m *MR) InFlight() int {
	m.t.mu.Lock()
	defer m.t.mu.Unlock()
	n := m.g.users.Load()
	for _, g := range m.retired {
		n += g.users.Load()
	}
	return int(n)
}

// DeregOptions bounds the wait of DeregWith.
type DeregOptions struct {
	// Context cancels the wait (nil = context.Background()).
	Context context.Context
	// Timeout bounds the wait; 0 means DefaultDeregTimeout, negative means no timeout
	// (only Context bounds it).
	Timeout time.Duration
}

// DefaultDeregTimeout bounds Dereg's wait for in-flight users.
const DefaultDeregTimeout = 5 * time.Second

// Dereg deregisters the MR (ibv_dereg_mr), waiting up to DefaultDeregTimeout for in-flight
// users to call done. See DeregWith.
func (m *MR) Dereg() error { return m.DeregWith(DeregOptions{}) }

// DeregWith deregisters the MR. The key becomes Invalid at once, so no new access passes
// Check; then it waits for in-flight accesses to call done. If the wait ends first (timeout or
// cancelled context) the registration is restored unchanged and ErrBusy returned, as is
// ErrBusy while memory windows are bound to the MR (rxe refuses that too).
func (m *MR) DeregWith(o DeregOptions) error {
	t := m.t
	if err := m.lockReplaceable(); err != nil {
		return err
	}
	s := t.slotOf(m.idx)
	old := m.cur.Load()
	inv := *old
	inv.state = KeyInvalid
	t.publish(s, &m.cur, &inv)
	m.dereg = true
	gens := append([]*gen{m.g}, m.retired...)
	t.mu.Unlock()

	ok := waitGens(gens, o)

	t.mu.Lock()
	defer t.mu.Unlock()
	m.dereg = false
	if !ok {
		t.publish(s, &m.cur, old)
		return ErrBusy
	}
	m.retired = nil
	m.dead = true
	t.releaseIndex(m.idx)
	t.nMR--
	m.pd.objs--
	return nil
}

func nop() {}

// noDone is returned for accesses that touch no registered memory (zero length).
var noDone = nop
