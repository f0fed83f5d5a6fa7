package mr

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

func mwSetup(t *testing.T) (*Table, *PD, []byte, *MR) {
	t.Helper()
	tb := NewTable(TableOptions{})
	pd := newPD(t, tb)
	buf := make([]byte, 256)
	for i := range buf {
		buf[i] = byte(i)
	}
	m := reg(t, tb, pd, buf, 0x4000, AccessLocalWrite|AccessMWBind)
	return tb, pd, buf, m
}

func TestMWType1(t *testing.T) {
	tb, pd, buf, m := mwSetup(t)
	w, err := tb.AllocMW(pd, MWType1)
	if err != nil {
		t.Fatal(err)
	}
	if w.State() != KeyFree || w.Type() != MWType1 {
		t.Fatal("new window must be Free")
	}
	if _, _, err := tb.Check(pd, w.RKey(), 0x4000, 1, OpRemoteRead); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("unbound window: %v", err)
	}
	k1, err := w.Bind(BindOptions{MR: m, Addr: 0x4010, Length: 32, Access: AccessRemoteRead})
	if err != nil {
		t.Fatal(err)
	}
	if k1 != w.RKey() || w.State() != KeyValid {
		t.Fatal("bind must return the new rkey and make it Valid")
	}
	b, done, err := tb.Check(pd, k1, 0x4010, 32, OpRemoteRead)
	if err != nil || &b[0] != &buf[0x10] || len(b) != 32 {
		t.Fatalf("window read: %v", err)
	}
	if m.InFlight() != 1 {
		t.Fatal("window access must pin the MR")
	}
	done()
	// Bounds are the window's, not the MR's.
	for _, c := range []struct {
		va uint64
		n  uint32
	}{{0x400F, 1}, {0x4030, 1}, {0x4010, 33}, {0x4000, 4}} {
		if _, _, err := tb.Check(pd, k1, c.va, c.n, OpRemoteRead); !errors.Is(err, ErrBounds) {
			t.Fatalf("window bounds %#x+%d: %v", c.va, c.n, err)
		}
	}
	if _, _, err := tb.Check(pd, k1, 0x4010, 4, OpRemoteWrite); !errors.Is(err, ErrAccess) {
		t.Fatalf("window without write access: %v", err)
	}
	if _, _, err := tb.Check(pd, k1, 0x4010, 4, OpLocalRead); !errors.Is(err, ErrBadKey) {
		t.Fatalf("window rkey used as lkey: %v", err)
	}
	// Type 1 windows are not invalidated by LOCAL_INV / SEND_WITH_INV.
	if err := tb.Invalidate(pd, k1); !errors.Is(err, ErrState) {
		t.Fatalf("invalidate type 1: %v", err)
	}
	// The MR cannot be deregistered while a window is bound.
	if err := m.Dereg(); !errors.Is(err, ErrBusy) {
		t.Fatalf("dereg with bound window: %v", err)
	}
	// Rebind: a new key; the old one is refused.
	k2, err := w.Bind(BindOptions{MR: m, Addr: 0x4000, Length: 256, Access: AccessRemoteRead | AccessRemoteWrite})
	if err != nil || k2 == k1 || KeyIndex(k2) != KeyIndex(k1) {
		t.Fatalf("rebind: %v %#x %#x", err, k1, k2)
	}
	if _, _, err := tb.Check(pd, k1, 0x4010, 4, OpRemoteRead); !errors.Is(err, ErrBadKey) {
		t.Fatalf("old window key: %v", err)
	}
	b, done, err = tb.Check(pd, k2, 0x40FF, 1, OpRemoteWrite)
	if err != nil || &b[0] != &buf[0xFF] {
		t.Fatalf("rebound window: %v", err)
	}
	done()
	// Zero-length bind unbinds.
	k3, err := w.Bind(BindOptions{MR: m})
	if err != nil || w.State() != KeyFree || k3 == k2 {
		t.Fatalf("unbind: %v", err)
	}
	if _, _, err := tb.Check(pd, k2, 0x4010, 4, OpRemoteRead); !errors.Is(err, ErrBadKey) {
		t.Fatalf("after unbind: %v", err)
	}
	if err := m.Dereg(); err != nil {
		t.Fatalf("dereg after unbind: %v", err)
	}
	if err := w.Dealloc(); err != nil {
		t.Fatal(err)
	}
	if err := w.Dealloc(); !errors.Is(err, ErrInvalidKey) {
		t.Fatal("double dealloc")
	}
	if err := pd.Dealloc(); err != nil {
		t.Fatal(err)
	}
}

func TestMWBindRules(t *testing.T) {
	tb, pd, _, m := mwSetup(t)
	pd2 := newPD(t, tb)
	w, _ := tb.AllocMW(pd, MWType1)
	noBind := reg(t, tb, pd, make([]byte, 64), 0, AccessLocalWrite)
	roMR := reg(t, tb, pd, make([]byte, 64), 0, AccessMWBind|AccessRemoteRead)
	other := reg(t, tb, pd2, make([]byte, 64), 0, AccessLocalWrite|AccessMWBind)
	cases := []struct {
		name string
		o    BindOptions
		err  error
	}{
		{"MR without MW_BIND", BindOptions{MR: noBind, Addr: 0, Length: 8, Access: AccessRemoteRead}, ErrAccess},
		{"remote write on MR without LOCAL_WRITE", BindOptions{MR: roMR, Length: 8, Access: AccessRemoteWrite}, ErrAccess},
		{"remote atomic on MR without LOCAL_WRITE", BindOptions{MR: roMR, Length: 8, Access: AccessRemoteAtomic}, ErrAccess},
		{"MR in another PD", BindOptions{MR: other, Length: 8, Access: AccessRemoteRead}, ErrWrongPD},
		{"below MR", BindOptions{MR: m, Addr: 0x3FFF, Length: 8, Access: AccessRemoteRead}, ErrBounds},
		{"past MR", BindOptions{MR: m, Addr: 0x40F9, Length: 8, Access: AccessRemoteRead}, ErrBounds},
		{"huge", BindOptions{MR: m, Addr: 0x4000, Length: ^uint64(0), Access: AccessRemoteRead}, ErrBounds},
		{"local write access bit", BindOptions{MR: m, Length: 8, Addr: 0x4000, Access: AccessLocalWrite}, ErrInvalidArg},
	}
	for _, c := range cases {
		if _, err := w.Bind(c.o); !errors.Is(err, c.err) {
			t.Fatalf("%s: %v, want %v", c.name, err, c.err)
		}
	}
	if _, err := w.Bind(BindOptions{MR: roMR, Length: 8, Access: AccessRemoteRead}); err != nil {
		t.Fatalf("read-only window on read-only MR: %v", err)
	}
}

func TestMWType2(t *testing.T) {
	tb, pd, buf, m := mwSetup(t)
	pd2 := newPD(t, tb)
	w, err := tb.AllocMW(pd, MWType2)
	if err != nil {
		t.Fatal(err)
	}
	old := w.RKey()
	if _, err := w.Bind(BindOptions{PD: pd, QPN: 17, MR: m, Addr: 0x4000, Length: 16, Access: AccessRemoteRead, Key: KeyByte(old)}); !errors.Is(err, ErrInvalidArg) {
		t.Fatalf("type 2 bind with the same key byte: %v", err)
	}
	if _, err := w.Bind(BindOptions{PD: pd2, QPN: 17, MR: m, Addr: 0x4000, Length: 16, Access: AccessRemoteRead, Key: KeyByte(old) + 1}); !errors.Is(err, ErrWrongPD) {
		t.Fatalf("type 2 bind from a QP in another PD: %v", err)
	}
	k, err := w.Bind(BindOptions{PD: pd, QPN: 17, MR: m, Addr: 0x4000, Length: 16, Access: AccessRemoteWrite | AccessRemoteRead, Key: KeyByte(old) + 1})
	if err != nil || KeyByte(k) != KeyByte(old)+1 {
		t.Fatalf("type 2 bind: %v", err)
	}
	// A Valid type 2 window cannot be rebound.
	if _, err := w.Bind(BindOptions{PD: pd, QPN: 17, MR: m, Length: 16, Addr: 0x4000, Access: AccessRemoteRead, Key: 9}); !errors.Is(err, ErrState) {
		t.Fatalf("rebind of a valid type 2 window: %v", err)
	}
	// Bound to QP 17: Check without a QP and CheckQP from QP 18 are refused.
	if _, _, err := tb.Check(pd, k, 0x4000, 4, OpRemoteWrite); !errors.Is(err, ErrWrongQP) {
		t.Fatalf("Check of type 2 window: %v", err)
	}
	if _, _, err := tb.CheckQP(pd, 18, k, 0x4000, 4, OpRemoteWrite); !errors.Is(err, ErrWrongQP) {
		t.Fatalf("wrong QP: %v", err)
	}
	b, done, err := tb.CheckQP(pd, 17, k, 0x4004, 4, OpRemoteWrite)
	if err != nil || &b[0] != &buf[4] {
		t.Fatalf("bound QP: %v", err)
	}
	done()
	// Remote invalidation (SEND_WITH_INV) from another QP is refused; from QP 17 it works.
	if err := tb.InvalidateQP(pd, 18, k); !errors.Is(err, ErrWrongQP) {
		t.Fatalf("remote invalidate from another QP: %v", err)
	}
	if err := tb.InvalidateQP(pd2, 17, k); !errors.Is(err, ErrWrongPD) {
		t.Fatalf("remote invalidate from another PD: %v", err)
	}
	if err := tb.InvalidateQP(pd, 17, k^0x55); !errors.Is(err, ErrBadKey) {
		t.Fatalf("invalidate with a wrong key byte: %v", err)
	}
	if err := tb.InvalidateQP(pd, 17, k); err != nil {
		t.Fatalf("remote invalidate: %v", err)
	}
	if w.State() != KeyFree {
		t.Fatal("invalidated window must be Free")
	}
	if _, _, err := tb.CheckQP(pd, 17, k, 0x4000, 4, OpRemoteWrite); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("invalidated window: %v", err)
	}
	if err := tb.Invalidate(pd, k); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("invalidate twice: %v", err)
	}
	// Free again: bind with a new key byte (local invalidate path next).
	k2, err := w.Bind(BindOptions{PD: pd, QPN: 17, MR: m, Addr: 0x4000, Length: 16, Access: AccessRemoteRead, Key: KeyByte(k) + 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := tb.CheckQP(pd, 17, k, 0x4000, 4, OpRemoteRead); !errors.Is(err, ErrBadKey) {
		t.Fatalf("previous key after rebind: %v", err)
	}
	if err := tb.Invalidate(pd, k2); err != nil { // LOCAL_INV
		t.Fatal(err)
	}
	if err := m.Dereg(); err != nil {
		t.Fatalf("dereg after window invalidated: %v", err)
	}
}

// Fast-register / local-invalidate key state machine (IBTA 10.6.7.1).
func TestFastRegStateMachine(t *testing.T) {
	tb := NewTable(TableOptions{})
	pd := newPD(t, tb)
	pd2 := newPD(t, tb)
	buf := make([]byte, 128)
	m, err := tb.AllocMR(pd, AllocMROptions{Buf: buf})
	if err != nil {
		t.Fatal(err)
	}
	k0 := m.LKey()
	if m.State() != KeyFree {
		t.Fatal("allocated fast-reg MR must be Free")
	}
	if _, _, err := tb.Check(pd, k0, 0, 1, OpLocalRead); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("free key: %v", err)
	}
	if err := m.FastReg(FastRegOptions{IOVA: 0x9000, Length: 64, Access: AccessRemoteWrite, Key: 3}); !errors.Is(err, ErrInvalidArg) {
		t.Fatalf("REMOTE_WRITE without LOCAL_WRITE: %v", err)
	}
	if err := m.FastReg(FastRegOptions{IOVA: 0x9000, Length: 129, Access: AccessLocalWrite, Key: 3}); !errors.Is(err, ErrInvalidArg) {
		t.Fatalf("longer than the buffer: %v", err)
	}
	if err := m.FastReg(FastRegOptions{PD: pd2, IOVA: 0x9000, Length: 64, Access: AccessLocalWrite, Key: 3}); !errors.Is(err, ErrWrongPD) {
		t.Fatalf("QP in another PD: %v", err)
	}
	if err := m.FastReg(FastRegOptions{PD: pd, IOVA: 0x9000, Length: 64, Access: AccessLocalWrite | AccessRemoteRead, Key: 3}); err != nil {
		t.Fatal(err)
	}
	k1 := m.RKey()
	if KeyIndex(k1) != KeyIndex(k0) || KeyByte(k1) != 3 || m.State() != KeyValid || m.IOVA() != 0x9000 || m.Len() != 64 {
		t.Fatalf("after fast-reg: key %#x state %v", k1, m.State())
	}
	b, done, err := tb.Check(pd, k1, 0x903F, 1, OpRemoteRead)
	if err != nil || &b[0] != &buf[63] {
		t.Fatalf("fast-registered access: %v", err)
	}
	done()
	if _, _, err := tb.Check(pd, k1, 0x9040, 1, OpRemoteRead); !errors.Is(err, ErrBounds) {
		t.Fatalf("past fast-reg length: %v", err)
	}
	if err := m.FastReg(FastRegOptions{IOVA: 0, Length: 8, Access: AccessLocalWrite, Key: 4}); !errors.Is(err, ErrState) {
		t.Fatalf("fast-reg of a Valid MR: %v", err)
	}
	if err := tb.Invalidate(pd2, k1); !errors.Is(err, ErrWrongPD) {
		t.Fatalf("invalidate from another PD: %v", err)
	}
	if err := tb.Invalidate(pd, k1); err != nil {
		t.Fatal(err)
	}
	if m.State() != KeyFree {
		t.Fatal("invalidated MR must be Free")
	}
	if _, _, err := tb.Check(pd, k1, 0x9000, 1, OpRemoteRead); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("invalidated key: %v", err)
	}
	other := make([]byte, 16)
	if err := m.FastReg(FastRegOptions{Buf: other, IOVA: 0x100, Length: 16, Access: AccessLocalWrite, Key: 4}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := tb.Check(pd, k1, 0x100, 1, OpLocalRead); !errors.Is(err, ErrBadKey) {
		t.Fatalf("old key byte after re-fast-reg: %v", err)
	}
	b, done, err = tb.Check(pd, m.LKey(), 0x10F, 1, OpLocalWrite)
	if err != nil || &b[0] != &other[15] {
		t.Fatalf("new mapping: %v", err)
	}
	done()
	// Ordinary MRs are not invalidated by LOCAL_INV.
	plain := reg(t, tb, pd, buf, 0, AccessLocalWrite)
	if err := tb.Invalidate(pd, plain.LKey()); !errors.Is(err, ErrState) {
		t.Fatalf("invalidate of an ordinary MR: %v", err)
	}
	if err := plain.FastReg(FastRegOptions{Length: 1, Key: 1}); !errors.Is(err, ErrState) {
		t.Fatalf("fast-reg of an ordinary MR: %v", err)
	}
	if err := m.Dereg(); err != nil {
		t.Fatal(err)
	}
}

func TestByKey(t *testing.T) {
	tb, pd, _, m := mwSetup(t)
	w, _ := tb.AllocMW(pd, MWType2)
	if tb.MRByKey(m.LKey()) != m || tb.MRByKey(m.LKey()^1) != nil || tb.MRByKey(w.RKey()) != nil {
		t.Fatal("MRByKey")
	}
	if tb.MWByKey(w.RKey()) != w || tb.MWByKey(m.LKey()) != nil || tb.MWByKey(w.RKey()^1) != nil {
		t.Fatal("MWByKey")
	}
	k, err := tb.MWByKey(w.RKey()).Bind(BindOptions{PD: pd, QPN: 3, MR: tb.MRByKey(m.LKey()), Addr: 0x4000, Length: 8, Access: AccessRemoteRead, Key: KeyByte(w.RKey()) + 1})
	if err != nil || tb.MWByKey(k) != w {
		t.Fatalf("bind through keys: %v", err)
	}
	k0 := m.LKey()
	if err := tb.Invalidate(pd, k); err != nil {
		t.Fatal(err)
	}
	if err := m.Dereg(); err != nil {
		t.Fatal(err)
	}
	if tb.MRByKey(k0) != nil {
		t.Fatal("MRByKey after dereg")
	}
}

// Accesses through a window racing with invalidate/rebind (run under -race): every granted
// slice is the bound range, and every reference is released.
func TestMWRebindRace(t *testing.T) {
	tb, pd, buf, m := mwSetup(t)
	w, _ := tb.AllocMW(pd, MWType2)
	stop := make(chan struct{})
	var granted atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 3; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				s, done, err := tb.CheckQP(pd, 7, w.RKey(), 0x4000, 16, OpRemoteWrite)
				if err == nil {
					if &s[0] != &buf[0] || len(s) != 16 {
						t.Error("slice outside the bound range")
					}
					s[g]++ // each goroutine its own byte: the test's writes must not race each other
					granted.Add(1)
				}
				done()
			}
		}()
	}
	for i := 0; i < 300; i++ {
		k, err := w.Bind(BindOptions{PD: pd, QPN: 7, MR: m, Addr: 0x4000, Length: 32, Access: AccessRemoteWrite, Key: KeyByte(w.RKey()) + 37})
		if err != nil {
			t.Fatal(err)
		}
		if i < 5 { // make sure accesses really interleave with the state changes
			for before := granted.Load(); granted.Load() == before; {
				runtime.Gosched()
			}
		}
		if err := tb.Invalidate(pd, k); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if m.InFlight() != 0 {
		t.Fatalf("leaked %d in-flight references", m.InFlight())
	}
}

// TestMWType1GivenKey: a type 1 bind with KeyGiven takes the binder's key byte (bind, rebind,
// unbind), refuses the current one, and a bind naming a PD other than the window's fails.
func TestMWType1GivenKey(t *testing.T) {
	tb, pd, _, m := mwSetup(t)
	pd2 := newPD(t, tb)
	w, err := tb.AllocMW(pd, MWType1)
	if err != nil {
		t.Fatal(err)
	}
	old := w.RKey()
	if _, err := w.Bind(BindOptions{MR: m, Addr: 0x4000, Length: 8, Access: AccessRemoteRead, Key: KeyByte(old), KeyGiven: true}); !errors.Is(err, ErrInvalidArg) {
		t.Fatalf("given key equal to the current one: %v", err)
	}
	if _, err := w.Bind(BindOptions{PD: pd2, MR: m, Addr: 0x4000, Length: 8, Access: AccessRemoteRead}); !errors.Is(err, ErrWrongPD) {
		t.Fatalf("bind by a QP of another PD: %v", err)
	}
	if _, err := w.Bind(BindOptions{PD: pd2, MR: m}); !errors.Is(err, ErrWrongPD) {
		t.Fatalf("unbind by a QP of another PD: %v", err)
	}
	if w.RKey() != old || w.State() != KeyFree {
		t.Fatal("a refused bind changed the window")
	}
	for i, b := range []uint8{KeyByte(old) + 1, KeyByte(old) + 2} {
		k, err := w.Bind(BindOptions{PD: pd, MR: m, Addr: 0x4000, Length: 8, Access: AccessRemoteRead, Key: b, KeyGiven: true})
		if err != nil || k != MakeKey(KeyIndex(old), b) || w.RKey() != k || w.State() != KeyValid {
			t.Fatalf("bind %d: %#x %v, want key byte %#x", i, k, err, b)
		}
		if _, done, err := tb.Check(pd, k, 0x4000, 8, OpRemoteRead); err != nil {
			t.Fatalf("bind %d: access: %v", i, err)
		} else {
			done()
		}
	}
	k, err := w.Bind(BindOptions{PD: pd, MR: m, Key: 0x77, KeyGiven: true})
	if err != nil || k != MakeKey(KeyIndex(old), 0x77) || w.State() != KeyFree {
		t.Fatalf("unbind with a given key: %#x %v", k, err)
	}
	if err := w.Dealloc(); err != nil {
		t.Fatal(err)
	}
}

// TestMWType1NotZeroBased: a type 1 window is never zero-based (IBTA o10-36.2.2; rxe's
// rxe_check_bind_mw and mlx5's bind refuse it): a bind asking for it is ErrInvalidArg and
// leaves the window as it was; an unbind's access bits are not looked at.
func TestMWType1NotZeroBased(t *testing.T) {
	tb, pd, _, m := mwSetup(t)
	w, err := tb.AllocMW(pd, MWType1)
	if err != nil {
		t.Fatal(err)
	}
	k, err := w.Bind(BindOptions{PD: pd, MR: m, Addr: 0x4000, Length: 64, Access: AccessRemoteRead})
	if err != nil {
		t.Fatal(err)
	}
	for _, given := range []bool{false, true} {
		o := BindOptions{PD: pd, MR: m, Addr: 0x4010, Length: 16, Access: AccessRemoteRead | AccessZeroBased,
			Key: KeyByte(k) + 1, KeyGiven: given}
		if _, err := w.Bind(o); !errors.Is(err, ErrInvalidArg) {
			t.Fatalf("zero-based type 1 bind (key given %v): %v, want ErrInvalidArg", given, err)
		}
		if w.RKey() != k || w.State() != KeyValid {
			t.Fatalf("a refused bind changed the window: %#x %v", w.RKey(), w.State())
		}
	}
	if _, err := w.Bind(BindOptions{PD: pd, Access: AccessZeroBased}); err != nil || w.State() != KeyFree {
		t.Fatalf("unbind with stray access bits: %v %v", err, w.State())
	}
}
