package mr

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// TestReregKeepsKeys: each change (access, PD, translation, all three) applies to the next
// access, the L_Key and R_Key stay the same, the accessors follow, and OnKey hears the new
// mapping.
func TestReregKeepsKeys(t *testing.T) {
	var events []KeyEvent
	tb := NewTable(TableOptions{OnKey: func(e KeyEvent) { events = append(events, e) }})
	pd, pd2 := newPD(t, tb), newPD(t, tb)
	a, b := bytes.Repeat([]byte{'a'}, 64), bytes.Repeat([]byte{'b'}, 32)
	m := reg(t, tb, pd, a, 0x1000, AccessLocalWrite)
	k := m.RKey()
	if _, _, err := tb.Check(pd, k, 0x1000, 8, OpRemoteWrite); !errors.Is(err, ErrAccess) {
		t.Fatalf("remote write before: %v", err)
	}
	if err := m.Rereg(ReregOptions{Flags: ReregAccess, Access: AccessLocalWrite | AccessRemoteWrite}); err != nil {
		t.Fatal(err)
	}
	if m.LKey() != k || m.RKey() != k || m.Access() != AccessLocalWrite|AccessRemoteWrite {
		t.Fatalf("keys %#x/%#x (want %#x), access %#x", m.LKey(), m.RKey(), k, m.Access())
	}
	got, done, err := tb.Check(pd, k, 0x1000, 8, OpRemoteWrite)
	if err != nil || &got[0] != &a[0] {
		t.Fatalf("remote write after the access change: %v", err)
	}
	done()
	if last := events[len(events)-1]; last.Key != k || !last.MR || last.Access != AccessLocalWrite|AccessRemoteWrite {
		t.Fatalf("OnKey heard %+v", last)
	}

	if err := m.Rereg(ReregOptions{Flags: ReregPD, PD: pd2}); err != nil {
		t.Fatal(err)
	}
	if m.PD() != pd2 {
		t.Fatal("PD not changed")
	}
	if _, _, err := tb.Check(pd, k, 0x1000, 8, OpLocalRead); !errors.Is(err, ErrWrongPD) {
		t.Fatalf("old PD after the PD change: %v", err)
	}
	if err := pd2.Dealloc(); !errors.Is(err, ErrBusy) {
		t.Fatalf("the new PD holds the MR: Dealloc %v", err)
	}
	if err := pd.Dealloc(); err != nil {
		t.Fatalf("the old PD holds nothing: Dealloc %v", err)
	}
	pd = newPD(t, tb)

	if err := m.Rereg(ReregOptions{Flags: ReregTranslation, Buf: b, IOVA: 0x9000}); err != nil {
		t.Fatal(err)
	}
	if m.IOVA() != 0x9000 || m.Len() != 32 || m.LKey() != k {
		t.Fatalf("after translation: iova %#x len %d key %#x", m.IOVA(), m.Len(), m.LKey())
	}
	if _, _, err := tb.Check(pd2, k, 0x1000, 8, OpLocalRead); !errors.Is(err, ErrBounds) {
		t.Fatalf("old range after translation: %v", err)
	}
	got, done, err = tb.Check(pd2, k, 0x9000+24, 8, OpRemoteWrite)
	if err != nil || &got[0] != &b[24] || cap(got) != 8 {
		t.Fatalf("new range: %v", err)
	}
	done()

	mem := &sliceMem{b: bytes.Repeat([]byte{'c'}, 16)}
	if err := m.ReregWith(ReregOptions{Flags: ReregAll, PD: pd, Access: AccessLocalWrite | AccessRemoteRead,
		IOVA: 0x100}, mem, 16, DeregOptions{}); err != nil {
		t.Fatal(err)
	}
	var out [4]byte
	if err := tb.CopyOut(pd, NoQPN, k, 0x10c, out[:], OpRemoteRead); err != nil || string(out[:]) != "cccc" {
		t.Fatalf("copied memory after all three changes: %v %q", err, out)
	}
	if err := tb.CopyIn(pd, NoQPN, k, 0x100, out[:], OpRemoteWrite); !errors.Is(err, ErrAccess) {
		t.Fatalf("remote write after the access change: %v", err)
	}
	if last := events[len(events)-1]; last.Key != k || last.MR {
		t.Fatalf("copied memory is no MR an outside responder addresses: %+v", last)
	}
	if m.InFlight() != 0 {
		t.Fatalf("%d references left", m.InFlight())
	}
	if err := m.Dereg(); err != nil {
		t.Fatal(err)
	}
	if err := pd.Dealloc(); err != nil {
		t.Fatalf("PD after dereg: %v", err)
	}
}

// TestReregRefused: bad arguments and states leave the MR as it was.
func TestReregRefused(t *testing.T) {
	tb := NewTable(TableOptions{})
	other := NewTable(TableOptions{})
	pd := newPD(t, tb)
	dead := newPD(t, tb)
	if err := dead.Dealloc(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	m := reg(t, tb, pd, buf, 0x1000, AccessLocalWrite)
	k := m.LKey()
	cases := []struct {
		name string
		o    ReregOptions
		mem  Memory
		err  error
	}{
		{"no flag", ReregOptions{}, nil, ErrInvalidArg},
		{"unknown flag", ReregOptions{Flags: 8}, nil, ErrInvalidArg},
		{"remote write without local write", ReregOptions{Flags: ReregAccess, Access: AccessRemoteWrite}, nil, ErrInvalidArg},
		{"unknown access bit", ReregOptions{Flags: ReregAccess, Access: 1 << 12}, nil, ErrInvalidArg},
		{"nil PD", ReregOptions{Flags: ReregPD}, nil, ErrInvalidArg},
		{"dead PD", ReregOptions{Flags: ReregPD, PD: dead}, nil, ErrInvalidArg},
		{"another table's PD", ReregOptions{Flags: ReregPD, PD: newPD(t, other)}, nil, ErrInvalidArg},
		{"two memories", ReregOptions{Flags: ReregTranslation, Buf: buf}, &sliceMem{}, ErrInvalidArg},
		{"wrapping iova", ReregOptions{Flags: ReregTranslation, Buf: buf, IOVA: ^uint64(0) - 8}, nil, ErrInvalidArg},
		{"zero-based without translation", ReregOptions{Flags: ReregAccess, Access: AccessLocalWrite | AccessZeroBased}, nil, ErrInvalidArg},
		{"persistent without a persister", ReregOptions{Flags: ReregAccess, Access: AccessLocalWrite | AccessFlushPersistent}, nil, ErrInvalidArg},
		{"persistent copied memory", ReregOptions{Flags: ReregAccess | ReregTranslation,
			Access: AccessLocalWrite | AccessFlushPersistent}, &sliceMem{}, ErrInvalidArg},
	}
	for _, c := range cases {
		if err := m.ReregWith(c.o, c.mem, 1, DeregOptions{}); !errors.Is(err, c.err) {
			t.Errorf("%s: %v, want %v", c.name, err, c.err)
		}
	}
	if m.LKey() != k || m.IOVA() != 0x1000 || m.Len() != 64 || m.Access() != AccessLocalWrite || m.PD() != pd {
		t.Fatal("a refused Rereg changed the MR")
	}
	// A zero-based region re-registered over new memory stays addressed from 0.
	if err := m.Rereg(ReregOptions{Flags: ReregAccess | ReregTranslation, Access: AccessLocalWrite | AccessZeroBased,
		Buf: buf[:8], IOVA: 0x5000}); err != nil || m.IOVA() != 0 {
		t.Fatalf("zero-based translation: %v, iova %#x", err, m.IOVA())
	}

	// Windows bound to it: busy. Fast-register MRs: ErrState. Deregistered: ErrInvalidKey.
	wm := reg(t, tb, pd, buf, 0, AccessLocalWrite|AccessMWBind)
	w, _ := tb.AllocMW(pd, MWType1)
	if _, err := w.Bind(BindOptions{MR: wm, Addr: 0, Length: 8, Access: AccessRemoteRead}); err != nil {
		t.Fatal(err)
	}
	if err := wm.Rereg(ReregOptions{Flags: ReregAccess, Access: AccessLocalWrite}); !errors.Is(err, ErrBusy) {
		t.Fatalf("with a bound window: %v", err)
	}
	fm, err := tb.AllocMR(pd, AllocMROptions{Buf: buf})
	if err != nil {
		t.Fatal(err)
	}
	if err := fm.Rereg(ReregOptions{Flags: ReregAccess, Access: AccessLocalWrite}); !errors.Is(err, ErrState) {
		t.Fatalf("fast-register MR: %v", err)
	}
	if err := m.Dereg(); err != nil {
		t.Fatal(err)
	}
	if err := m.Rereg(ReregOptions{Flags: ReregAccess, Access: AccessLocalWrite}); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("deregistered: %v", err)
	}
}

// TestReregWaitsForInFlight: an access checked under the old registration keeps Rereg from
// returning (its memory is still touched) while new accesses already see the new one; a wait
// that ends first leaves the new registration in effect (ErrDraining, an ErrBusy) and Dereg
// then waits for the old access too.
func TestReregWaitsForInFlight(t *testing.T) {
	tb := NewTable(TableOptions{})
	pd := newPD(t, tb)
	a, b := make([]byte, 64), make([]byte, 64)
	m := reg(t, tb, pd, a, 0, AccessLocalWrite|AccessRemoteWrite)
	k := m.RKey()
	old, done, err := tb.Check(pd, k, 0, 64, OpRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	go func() {
		res <- m.ReregWith(ReregOptions{Flags: ReregTranslation, Buf: b}, nil, 0, DeregOptions{Timeout: -1})
	}()
	var nb []byte
	for { // until Rereg published the new registration
		got, d, err := tb.Check(pd, k, 0, 64, OpRemoteWrite)
		if err != nil {
			t.Fatal(err)
		}
		if &got[0] == &b[0] {
			nb = got
			d()
			break
		}
		d()
		runtime.Gosched()
	}
	select {
	case err := <-res:
		t.Fatalf("Rereg returned %v while an access of the old registration was in flight", err)
	default:
	}
	old[0], nb[0] = 1, 2
	done()
	if err := <-res; err != nil {
		t.Fatalf("Rereg after done: %v", err)
	}

	_, done, err = tb.Check(pd, k, 0, 8, OpRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = m.ReregWith(ReregOptions{Flags: ReregAccess, Access: AccessLocalWrite}, nil, 0, DeregOptions{Context: ctx, Timeout: -1})
	if !errors.Is(err, ErrDraining) || !errors.Is(err, ErrBusy) || m.Access() != AccessLocalWrite {
		t.Fatalf("wait cut short: %v, access %#x (want the new one in effect)", err, m.Access())
	}
	if m.InFlight() != 1 {
		t.Fatalf("in flight %d, want the old registration's one", m.InFlight())
	}
	if err := m.DeregWith(DeregOptions{Context: ctx, Timeout: -1}); !errors.Is(err, ErrBusy) {
		t.Fatalf("Dereg with the old registration's access in flight: %v", err)
	}
	done()
	if err := m.Dereg(); err != nil {
		t.Fatalf("Dereg once it ended: %v", err)
	}
}

// TestReregWaitsForRetired: a Rereg whose wait ended first (ErrDraining) leaves the old
// registration's access in flight over the same memory when it changed only the access; a
// later Rereg that replaces that memory must wait for that access too, not only for the
// registration it replaces, before it says the memory may be reused.
func TestReregWaitsForRetired(t *testing.T) {
	tb := NewTable(TableOptions{})
	pd := newPD(t, tb)
	a, b := make([]byte, 64), make([]byte, 64)
	m := reg(t, tb, pd, a, 0, AccessLocalWrite|AccessRemoteWrite)
	_, done, err := tb.Check(pd, m.RKey(), 0, 64, OpRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = m.ReregWith(ReregOptions{Flags: ReregAccess, Access: AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead}, nil, 0, DeregOptions{Context: ctx, Timeout: -1})
	if !errors.Is(err, ErrDraining) {
		t.Fatalf("access change with an access in flight and no wait: %v, want ErrDraining", err)
	}
	err = m.ReregWith(ReregOptions{Flags: ReregTranslation, Buf: b}, nil, 0, DeregOptions{Context: ctx, Timeout: -1})
	if !errors.Is(err, ErrDraining) {
		t.Fatalf("translation change while the first registration's access is in flight over a: %v, want ErrDraining", err)
	}
	done()
	if err := m.Rereg(ReregOptions{Flags: ReregAccess, Access: AccessLocalWrite}); err != nil {
		t.Fatalf("Rereg once the access ended: %v", err)
	}
	if n := m.InFlight(); n != 0 {
		t.Fatalf("in flight %d after a Rereg that waited for every registration", n)
	}
}

// TestReregRace: checkers (local and remote, mapped and copied, windows of another MR) race
// re-registrations that flip between two buffers with different rights, PDs and lengths.
// Every access sees exactly one registration: bytes of the buffer whose PD and rights it was
// granted under, never the other's; and once Rereg returned, no access of the registration
// before it is in flight: the test then writes the buffer it replaced, which the race detector
// would report against a checker still writing it.
func TestReregRace(t *testing.T) {
	tb := NewTable(TableOptions{})
	pdA, pdB := newPD(t, tb), newPD(t, tb)
	a, b := make([]byte, 64), make([]byte, 32)
	m := reg(t, tb, pdA, a, 0x1000, AccessLocalWrite|AccessRemoteWrite)
	k := m.RKey()
	var retiredA, retiredB atomic.Bool // the buffer no registration names any more and was drained
	var stop atomic.Bool
	var grants atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for !stop.Load() {
				for _, pd := range []*PD{pdA, pdB} {
					got, done, err := tb.Check(pd, k, 0x1000, 32, OpRemoteWrite)
					if err != nil {
						if !errors.Is(err, ErrWrongPD) { // the other registration's PD, nothing else
							t.Errorf("check during re-registrations: %v", err)
						}
						continue
					}
					runtime.Gosched() // hold the reference while the re-registrations go on
					switch {
					case pd == pdA && &got[0] == &a[0]:
						if retiredA.Load() {
							t.Error("buffer A granted after the Rereg that replaced it returned")
						}
					case pd == pdB && &got[0] == &b[0]:
						if retiredB.Load() {
							t.Error("buffer B granted after the Rereg that replaced it returned")
						}
					default:
						t.Error("an access got the other registration's memory")
					}
					got[g]++ // each checker its own byte
					grants.Add(1)
					done()
				}
			}
		}(g)
	}
	for i := 0; i < 100; i++ {
		for n := grants.Load(); grants.Load() < n+4; { // let the checkers run under each registration
			runtime.Gosched()
		}
		if i%2 == 0 {
			retiredB.Store(false)
			err := m.ReregWith(ReregOptions{Flags: ReregAll, PD: pdB, Access: AccessLocalWrite | AccessRemoteWrite,
				Buf: b, IOVA: 0x1000}, nil, 0, DeregOptions{Timeout: -1})
			if err != nil {
				t.Fatal(err)
			}
			retiredA.Store(true)
			clear(a[:4]) // the race detector sees any access of A still in flight
		} else {
			retiredA.Store(false)
			err := m.ReregWith(ReregOptions{Flags: ReregAll, PD: pdA, Access: AccessLocalWrite | AccessRemoteWrite,
				Buf: a, IOVA: 0x1000}, nil, 0, DeregOptions{Timeout: -1})
			if err != nil {
				t.Fatal(err)
			}
			retiredB.Store(true)
			clear(b[:4])
		}
	}
	stop.Store(true)
	wg.Wait()
	if m.InFlight() != 0 {
		t.Fatalf("%d references left", m.InFlight())
	}
	if err := m.Dereg(); err != nil {
		t.Fatal(err)
	}
}

// TestReregCheckAllocs: the retry a Rereg can cause keeps Check allocation-free.
func TestReregCheckAllocs(t *testing.T) {
	tb := NewTable(TableOptions{})
	pd := newPD(t, tb)
	m := reg(t, tb, pd, make([]byte, 64), 0, AccessLocalWrite)
	if err := m.Rereg(ReregOptions{Flags: ReregAccess, Access: AccessLocalWrite | AccessRemoteRead}); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() {
		_, done, err := tb.Check(pd, m.RKey(), 0, 8, OpRemoteRead)
		if err != nil {
			t.Fatal(err)
		}
		done()
	}); n != 0 {
		t.Fatalf("Check allocates %v per run after a Rereg", n)
	}
}
