package mr

import (
	"errors"
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
	b, pers, done, err := tb.CheckPlacementQP(pd, NoQPN, m.RKey(), 0, 0, AccessFlushPersistent, true)
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
		b, pers, done, err := tb.CheckPlacementQP(c.pd, NoQPN, c.key, c.va, c.n, c.need, c.whole)
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
	if _, _, done, err := tb.CheckPlacementQP(pd, NoQPN, wk, 0x10000, 8, AccessRemoteWrite, false); err != nil {
		t.Fatalf("window: %v", err)
	} else {
		done()
	}
	if _, _, _, err := tb.CheckPlacementQP(pd, NoQPN, wk, 0x10000, 8, AccessFlushGlobal, false); !errors.Is(err, ErrAccess) {
		t.Fatalf("FLUSH through a window: %v", err)
	}
	if err := m.Dereg(); !errors.Is(err, ErrBusy) {
		t.Fatalf("dereg with a bound window: %v", err)
	}
	n := testing.AllocsPerRun(100, func() {
		_, _, done, _ := tb.CheckPlacementQP(pd, NoQPN, k, 0x10000, 8, AccessRemoteWrite, false)
		done()
	})
	if n != 0 {
		t.Fatalf("%v allocations per check", n)
	}
}
