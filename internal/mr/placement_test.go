package mr

import (
	"bytes"
	"errors"
	"sync"
	"testing"
)

type persistRec struct{ n int }

func (p *persistRec) Persist(b []byte) error { p.n += len(b); return nil }

// TestFlushAccess: AccessFlushPersistent needs a Persister (RegMR, FastReg refuse it; RegMRWith
// takes it with one); AccessFlushGlobal is ordinary.
func TestFlushAccess(t *testing.T) {
	tb := NewTable(TableOptions{})
	pd, _ := tb.AllocPD()
	buf := make([]byte, 4096)
	if !(AccessFlushGlobal | AccessFlushPersistent).Valid() || AccessFlushGlobal != 256 || AccessFlushPersistent != 512 {
		t.Fatal("IBV_ACCESS_FLUSH_GLOBAL 1<<8 and IBV_ACCESS_FLUSH_PERSISTENT 1<<9 are valid")
	}
	if _, err := tb.RegMR(pd, buf, 0x1000, AccessFlushPersistent); !errors.Is(err, ErrInvalidArg) {
		t.Fatalf("RegMR persistent without a Persister: %v", err)
	}
	if _, err := tb.RegMR(pd, buf, 0x1000, AccessFlushGlobal); err != nil {
		t.Fatal(err)
	}
	p := &persistRec{}
	m, err := tb.RegMRWith(pd, buf, 0x1000, AccessFlushPersistent|AccessLocalWrite, RegMROptions{Persist: p})
	if err != nil {
		t.Fatal(err)
	}
	f, _ := tb.AllocMR(pd, AllocMROptions{Buf: buf})
	if err := f.FastReg(FastRegOptions{Length: 64, Access: AccessFlushPersistent}); !errors.Is(err, ErrInvalidArg) {
		t.Fatalf("FastReg persistent: %v", err)
	}
	pl, done, err := tb.CheckPlacementQP(pd, NoQPN, m.RKey(), 0, 0, AccessFlushPersistent, true)
	b, pers := pl.Bytes(), pl.Persister()
	if err != nil || len(b) != 4096 || pers != p {
		t.Fatalf("whole region: %d bytes, persister %v, %v", len(b), pers, err)
	}
	if m.InFlight() != 1 {
		t.Fatal("no reference taken")
	}
	done()
	if m.InFlight() != 0 {
		t.Fatal("done did not release")
	}
}

// TestCheckPlacement: the key is checked even for a zero length, the access bits all needed,
// the range unless whole.
func TestCheckPlacement(t *testing.T) {
	tb := NewTable(TableOptions{})
	pd, _ := tb.AllocPD()
	pd2, _ := tb.AllocPD()
	buf := make([]byte, 4096)
	m, err := tb.RegMR(pd, buf, 0x10000, AccessLocalWrite|AccessRemoteWrite|AccessFlushGlobal|AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	k := m.RKey()
	cases := []struct {
		name   string
		pd     *PD
		key    uint32
		va     uint64
		n      uint32
		need   Access
		whole  bool
		want   error
		length int
	}{
		{"ok", pd, k, 0x10008, 8, AccessRemoteWrite, false, nil, 8},
		{"zero length still checks the key", pd, k ^ 1, 0x10000, 0, AccessRemoteWrite, false, ErrBadKey, 0},
		{"zero length at the end", pd, k, 0x11000, 0, AccessFlushGlobal, false, nil, 0},
		{"zero length past the end", pd, k, 0x11001, 0, AccessFlushGlobal, false, ErrBounds, 0},
		{"before the region", pd, k, 0xfff8, 8, AccessRemoteWrite, false, ErrBounds, 0},
		{"past the end", pd, k, 0x10ffc, 8, AccessRemoteWrite, false, ErrBounds, 0},
		{"wrap", pd, k, ^uint64(0) - 3, 8, AccessRemoteWrite, false, ErrOverflow, 0},
		{"wrong PD", pd2, k, 0x10000, 8, AccessRemoteWrite, false, ErrWrongPD, 0},
		{"no persistent access", pd, k, 0x10000, 8, AccessFlushGlobal | AccessFlushPersistent, false, ErrAccess, 0},
		{"whole ignores the range", pd, k, 0, 1 << 31, AccessFlushGlobal, true, nil, 4096},
	}
	for _, c := range cases {
		pl, done, err := tb.CheckPlacementQP(c.pd, NoQPN, c.key, c.va, c.n, c.need, c.whole)
		b, pers := pl.Bytes(), pl.Persister()
		if !errors.Is(err, c.want) || len(b) != c.length || pers != nil {
			t.Errorf("%s: %d bytes, %v (persister %v), want %d bytes, %v", c.name, len(b), err, pers, c.length, c.want)
		}
		done()
	}
	if m.InFlight() != 0 {
		t.Fatalf("%d references left", m.InFlight())
	}
	// a window: remote write through it; a FLUSH never (bind takes no FLUSH access)
	w, _ := tb.AllocMW(pd, MWType1)
	if _, err := w.Bind(BindOptions{MR: m, Addr: 0x10000, Length: 64, Access: AccessRemoteWrite | AccessFlushGlobal}); !errors.Is(err, ErrInvalidArg) {
		t.Fatalf("bind with FLUSH access: %v", err)
	}
	wk, err := w.Bind(BindOptions{MR: m, Addr: 0x10000, Length: 64, Access: AccessRemoteWrite})
	if err != nil {
		t.Fatal(err)
	}
	if _, done, err := tb.CheckPlacementQP(pd, NoQPN, wk, 0x10000, 8, AccessRemoteWrite, false); err != nil {
		t.Fatalf("window: %v", err)
	} else {
		done()
	}
	if _, _, err := tb.CheckPlacementQP(pd, NoQPN, wk, 0x10000, 8, AccessFlushGlobal, false); !errors.Is(err, ErrAccess) {
		t.Fatalf("FLUSH through a window: %v", err)
	}
	if err := m.Dereg(); !errors.Is(err, ErrBusy) {
		t.Fatalf("dereg with a bound window: %v", err)
	}
	n := testing.AllocsPerRun(100, func() {
		_, done, _ := tb.CheckPlacementQP(pd, NoQPN, k, 0x10000, 8, AccessRemoteWrite, false)
		done()
	})
	if n != 0 {
		t.Fatalf("%v allocations per check", n)
	}
}

// lockedMem is a Memory whose writes check that mu is held (the device's atomic lock).
type lockedMem struct {
	sliceMem
	mu       *sync.Mutex
	unlocked int
}

func (m *lockedMem) WriteAt(p []byte, off uint64) error {
	if m.mu.TryLock() {
		m.unlocked++
		m.mu.Unlock()
	}
	return m.sliceMem.WriteAt(p, off)
}

// TestPlaceCopied: an ATOMIC WRITE's target in copied memory is checked against the registered
// length (the whole region for FLUSH), has no bytes and no Persister, and StoreWord writes the
// 8 bytes at the target's offset (a window's too) with the atomic lock held — the lock CMP_SWAP
// and FETCH_ADD hold across their read and write; memory that is gone is ErrFault; mapped
// memory at a misaligned address is ErrAlign. Neither allocates.
func TestPlaceCopied(t *testing.T) {
	var mu sync.Mutex
	tb := NewTable(TableOptions{})
	pd, _ := tb.AllocPD()
	mem := &lockedMem{sliceMem: sliceMem{b: make([]byte, 8192)}, mu: &mu}
	m, err := tb.RegMemory(pd, mem, 4096, 0x10000, AccessLocalWrite|AccessRemoteWrite|AccessFlushGlobal|AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	k := m.RKey()
	if _, _, err := tb.CheckPlacementQP(pd, NoQPN, k, 0x10ffc, 8, AccessRemoteWrite, false); !errors.Is(err, ErrBounds) {
		t.Fatalf("past the registered length: %v, want ErrBounds", err)
	}
	pl, done, err := tb.CheckPlacementQP(pd, NoQPN, k, 0, 0, AccessFlushGlobal, true)
	if err != nil || !pl.Copied() || pl.Len() != 4096 || pl.Bytes() != nil || pl.Persister() != nil {
		t.Fatalf("whole copied region: copied %v, %d bytes, %v", pl.Copied(), pl.Len(), err)
	}
	done()
	w := [8]byte{1, 2, 3, 4, 5, 6, 7, 8}
	pl, done, err = tb.CheckPlacementQP(pd, NoQPN, k, 0x10ff8, 8, AccessRemoteWrite, false)
	if err != nil || !pl.Aligned8() {
		t.Fatalf("last word: %v (aligned %v)", err, pl.Aligned8())
	}
	if err := pl.StoreWord(&w, &mu); err != nil {
		t.Fatal(err)
	}
	done()
	if !bytes.Equal(mem.b[0xff8:0x1000], w[:]) || mem.unlocked != 0 {
		t.Fatalf("stored %v, %d stores without the atomic lock", mem.b[0xff8:0x1000], mem.unlocked)
	}
	// through a window at an offset
	mw, _ := tb.AllocMW(pd, MWType1)
	wk, err := mw.Bind(BindOptions{MR: m, Addr: 0x10100, Length: 64, Access: AccessRemoteWrite})
	if err != nil {
		t.Fatal(err)
	}
	w[0] = 9
	pl, done, err = tb.CheckPlacementQP(pd, NoQPN, wk, 0x10108, 8, AccessRemoteWrite, false)
	if err != nil || pl.StoreWord(&w, &mu) != nil {
		t.Fatalf("window: %v", err)
	}
	done()
	if !bytes.Equal(mem.b[0x108:0x110], w[:]) {
		t.Fatalf("window store at %v", mem.b[0x100:0x118])
	}
	if n := testing.AllocsPerRun(100, func() {
		pl, done, _ := tb.CheckPlacementQP(pd, NoQPN, k, 0x10000, 8, AccessRemoteWrite, false)
		_ = pl.StoreWord(&w, &mu)
		done()
	}); n != 0 {
		t.Fatalf("%v allocations per ATOMIC WRITE into copied memory", n)
	}
	mem.gone = true
	pl, done, _ = tb.CheckPlacementQP(pd, NoQPN, k, 0x10000, 8, AccessRemoteWrite, false)
	if err := pl.StoreWord(&w, &mu); !errors.Is(err, ErrFault) {
		t.Fatalf("memory gone: %v, want ErrFault", err)
	}
	done()
	// mapped memory: the store's own address must be aligned
	buf := make([]byte, 64)
	mm, err := tb.RegMR(pd, buf[1:33], 0x20000, AccessLocalWrite|AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	pl, done, err = tb.CheckPlacementQP(pd, NoQPN, mm.RKey(), 0x20000, 8, AccessRemoteWrite, false)
	if err != nil || pl.Aligned8() || !errors.Is(pl.StoreWord(&w, &mu), ErrAlign) {
		t.Fatalf("misaligned mapped target: %v, aligned %v", err, pl.Aligned8())
	}
	done()
}
