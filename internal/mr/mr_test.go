package mr

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
)

// constReader returns the same byte forever: the worst case for key drawing.
type constReader byte

func (c constReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(c)
	}
	return len(p), nil
}

type failReader struct{}

func (failReader) Read(p []byte) (int, error) { return 0, errors.New("no entropy") }

func newPD(t *testing.T, tb *Table) *PD {
	t.Helper()
	pd, err := tb.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	return pd
}

func reg(t *testing.T, tb *Table, pd *PD, buf []byte, iova uint64, acc Access) *MR {
	t.Helper()
	m, err := tb.RegMR(pd, buf, iova, acc)
	if err != nil {
		t.Fatalf("RegMR(acc=%#x): %v", acc, err)
	}
	return m
}

func TestKeyFormat(t *testing.T) {
	tb := NewTable(TableOptions{Rand: constReader(0xA5)})
	pd := newPD(t, tb)
	m := reg(t, tb, pd, make([]byte, 8), 0x1000, AccessLocalWrite)
	if KeyByte(m.LKey()) != 0xA5 {
		t.Fatalf("key byte %#x, want the CSPRNG byte 0xa5", KeyByte(m.LKey()))
	}
	if KeyIndex(m.LKey()) == 0 {
		t.Fatal("index 0 must never be used")
	}
	if m.LKey() != m.RKey() || MakeKey(KeyIndex(m.LKey()), KeyByte(m.LKey())) != m.LKey() {
		t.Fatal("key composition")
	}
	if m.IOVA() != 0x1000 || m.Len() != 8 || m.State() != KeyValid || m.PD() != pd {
		t.Fatal("accessors")
	}
}

func TestRegMRAccessRule(t *testing.T) {
	tb := NewTable(TableOptions{})
	pd := newPD(t, tb)
	for acc := Access(0); acc < 128; acc++ {
		want := acc < 64 && !(acc&(AccessRemoteWrite|AccessRemoteAtomic) != 0 && acc&AccessLocalWrite == 0)
		m, err := tb.RegMR(pd, make([]byte, 16), 0, acc)
		if (err == nil) != want {
			t.Fatalf("acc %#x: err=%v, want ok=%v", acc, err, want)
		}
		if err != nil && !errors.Is(err, ErrInvalidArg) {
			t.Fatalf("acc %#x: %v, want ErrInvalidArg", acc, err)
		}
		if m != nil {
			if err := m.Dereg(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// Every valid access-flag combination x every Op.
func TestAccessMatrix(t *testing.T) {
	tb := NewTable(TableOptions{})
	pd := newPD(t, tb)
	const iova = 0x10000
	buf := make([]byte, 64)
	for i := range buf {
		buf[i] = byte(i)
	}
	for acc := Access(0); acc < 64; acc++ {
		if !acc.Valid() {
			continue
		}
		m := reg(t, tb, pd, buf, iova, acc)
		base := m.IOVA()
		for op := OpLocalRead; op <= OpRemoteAtomic; op++ {
			var need Access
			switch op {
			case OpLocalWrite:
				need = AccessLocalWrite
			case OpRemoteRead:
				need = AccessRemoteRead
			case OpRemoteWrite:
				need = AccessRemoteWrite
			case OpRemoteAtomic:
				need = AccessRemoteAtomic
			}
			allowed := need == 0 || acc&need != 0
			b, done, err := tb.Check(pd, m.LKey(), base+8, 8, op)
			if allowed != (err == nil) {
				t.Fatalf("acc %#x op %v: err %v, want allowed=%v", acc, op, err, allowed)
			}
			if err != nil {
				if !errors.Is(err, ErrAccess) {
					t.Fatalf("acc %#x op %v: %v, want ErrAccess", acc, op, err)
				}
				continue
			}
			if len(b) != 8 || cap(b) != 8 || b[0] != 8 || &b[0] != &buf[8] {
				t.Fatalf("acc %#x op %v: wrong bytes", acc, op)
			}
			if m.InFlight() != 1 {
				t.Fatal("in-flight not counted")
			}
			done()
			if m.InFlight() != 0 {
				t.Fatal("done did not release")
			}
		}
		if err := m.Dereg(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestZeroBased(t *testing.T) {
	tb := NewTable(TableOptions{})
	pd := newPD(t, tb)
	buf := []byte{1, 2, 3, 4}
	m := reg(t, tb, pd, buf, 0x5000, AccessLocalWrite|AccessRemoteRead|AccessZeroBased)
	if m.IOVA() != 0 {
		t.Fatal("zero-based MR must be addressed from 0")
	}
	b, done, err := tb.Check(pd, m.RKey(), 2, 2, OpRemoteRead)
	if err != nil || !bytes.Equal(b, []byte{3, 4}) {
		t.Fatalf("%v %v", b, err)
	}
	done()
}

func TestBounds(t *testing.T) {
	tb := NewTable(TableOptions{})
	pd := newPD(t, tb)
	const va, n = 0x7000, 100
	buf := make([]byte, n)
	m := reg(t, tb, pd, buf, va, AccessLocalWrite|AccessRemoteRead|AccessRemoteWrite)
	k := m.RKey()
	cases := []struct {
		name   string
		va     uint64
		length uint32
		err    error
	}{
		{"va-1", va - 1, 1, ErrBounds},
		{"va-1 spanning", va - 1, 2, ErrBounds},
		{"va", va, 1, nil},
		{"whole", va, n, nil},
		{"whole+1", va, n + 1, ErrBounds},
		{"va+len-1", va + n - 1, 1, nil},
		{"va+len-1 two bytes", va + n - 1, 2, ErrBounds},
		{"va+len", va + n, 1, ErrBounds},
		{"far", 1 << 40, 1, ErrBounds},
		{"overflow", ^uint64(0) - 3, 8, ErrOverflow},
		{"overflow max", ^uint64(0), 0xFFFFFFFF, ErrOverflow},
	}
	for _, c := range cases {
		b, done, err := tb.Check(pd, k, c.va, c.length, OpRemoteWrite)
		if !errors.Is(err, c.err) && !(c.err == nil && err == nil) {
			t.Fatalf("%s: err %v, want %v", c.name, err, c.err)
		}
		if c.err == ErrOverflow && !errors.Is(err, ErrBounds) {
			t.Fatalf("%s: ErrOverflow must also match ErrBounds", c.name)
		}
		if err == nil {
			off := c.va - va
			if len(b) != int(c.length) || &b[0] != &buf[off] {
				t.Fatalf("%s: wrong slice", c.name)
			}
			done()
		} else if b != nil {
			t.Fatalf("%s: bytes returned with error", c.name)
		}
	}
}

// A region ending exactly at 2^64: its last byte is addressable, past it is overflow.
func TestTopOfAddressSpace(t *testing.T) {
	tb := NewTable(TableOptions{})
	pd := newPD(t, tb)
	buf := make([]byte, 16)
	top := ^uint64(0) - 15
	m := reg(t, tb, pd, buf, top, AccessLocalWrite|AccessRemoteWrite)
	b, done, err := tb.Check(pd, m.RKey(), top, 16, OpRemoteWrite)
	if err != nil || &b[15] != &buf[15] {
		t.Fatalf("last 16 bytes of the address space: %v", err)
	}
	done()
	if _, _, err := tb.Check(pd, m.RKey(), top+8, 9, OpRemoteWrite); !errors.Is(err, ErrOverflow) {
		t.Fatalf("got %v, want ErrOverflow", err)
	}
	if _, err := tb.RegMR(pd, make([]byte, 17), top, 0); !errors.Is(err, ErrInvalidArg) {
		t.Fatalf("iova+len past 2^64: %v", err)
	}
}

func TestZeroLength(t *testing.T) {
	tb := NewTable(TableOptions{})
	pd := newPD(t, tb)
	for op := OpLocalRead; op <= OpRemoteWrite; op++ {
		// IBTA: a zero-length access does not validate the key: even a bogus one passes.
		b, done, err := tb.Check(pd, 0xDEADBEEF, ^uint64(0), 0, op)
		if err != nil || b != nil {
			t.Fatalf("op %v: zero length: %v %v", op, b, err)
		}
		done()
	}
	if _, _, err := tb.Check(pd, 0xDEADBEEF, 0, 0, OpRemoteAtomic); !errors.Is(err, ErrAlign) {
		t.Fatalf("zero-length atomic: %v", err)
	}
}

func TestWrongPDAndBadKey(t *testing.T) {
	tb := NewTable(TableOptions{})
	pd1, pd2 := newPD(t, tb), newPD(t, tb)
	m := reg(t, tb, pd1, make([]byte, 8), 0, AccessLocalWrite|AccessRemoteRead)
	if _, _, err := tb.Check(pd2, m.LKey(), 0, 8, OpLocalRead); !errors.Is(err, ErrWrongPD) {
		t.Fatalf("wrong PD: %v", err)
	}
	if _, _, err := tb.Check(pd1, m.LKey()^0x01, 0, 8, OpLocalRead); !errors.Is(err, ErrBadKey) {
		t.Fatalf("guessed key byte: %v", err)
	}
	if _, _, err := tb.Check(pd1, m.LKey()+0x100, 0, 8, OpLocalRead); !errors.Is(err, ErrBadKey) {
		t.Fatalf("unknown index: %v", err)
	}
	if _, _, err := tb.Check(pd1, 0, 0, 8, OpLocalRead); !errors.Is(err, ErrBadKey) {
		t.Fatalf("key 0: %v", err)
	}
	if err := pd1.Dealloc(); !errors.Is(err, ErrBusy) {
		t.Fatalf("Dealloc with an MR: %v", err)
	}
	if err := m.Dereg(); err != nil {
		t.Fatal(err)
	}
	if err := m.Dereg(); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("double dereg: %v", err)
	}
	if err := pd1.Dealloc(); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.RegMR(pd1, nil, 0, 0); !errors.Is(err, ErrInvalidArg) {
		t.Fatalf("RegMR on a dead PD: %v", err)
	}
}

func TestDeregAndReregistration(t *testing.T) {
	// A constant random source is the worst case: the key byte must still change.
	tb := NewTable(TableOptions{Rand: constReader(7)})
	pd := newPD(t, tb)
	buf := make([]byte, 32)
	var all []*MR
	for i := 0; i < chunk; i++ { // fill the first chunk of indices (1..64)
		all = append(all, reg(t, tb, pd, buf, 0, AccessLocalWrite))
	}
	victim := all[10]
	old := victim.LKey()
	if err := victim.Dereg(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := tb.Check(pd, old, 0, 4, OpLocalRead); !errors.Is(err, ErrBadKey) {
		t.Fatalf("deregistered key: %v", err)
	}
	if tb.Lookup(old) != KeyInvalid {
		t.Fatal("Lookup of a deregistered key")
	}
	nm := reg(t, tb, pd, buf, 0, AccessLocalWrite|AccessRemoteRead)
	if KeyIndex(nm.LKey()) != KeyIndex(old) {
		t.Fatalf("expected index reuse, got %d vs %d", KeyIndex(nm.LKey()), KeyIndex(old))
	}
	if nm.LKey() == old {
		t.Fatal("re-registration reused the key byte")
	}
	if _, _, err := tb.Check(pd, old, 0, 4, OpLocalRead); !errors.Is(err, ErrBadKey) {
		t.Fatalf("stale key after re-registration: %v", err)
	}
	b, done, err := tb.Check(pd, nm.RKey(), 0, 4, OpRemoteRead)
	if err != nil || len(b) != 4 {
		t.Fatalf("new key: %v", err)
	}
	done()
}

func TestLimitsAndRandFailure(t *testing.T) {
	tb := NewTable(TableOptions{MaxMR: 2, MaxPD: 1, MaxMW: 1})
	pd := newPD(t, tb)
	if _, err := tb.AllocPD(); !errors.Is(err, ErrLimit) {
		t.Fatalf("MaxPD: %v", err)
	}
	reg(t, tb, pd, nil, 0, 0)
	reg(t, tb, pd, nil, 0, 0)
	if _, err := tb.RegMR(pd, nil, 0, 0); !errors.Is(err, ErrLimit) {
		t.Fatalf("MaxMR: %v", err)
	}
	if _, err := tb.AllocMW(pd, MWType1); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.AllocMW(pd, MWType2); !errors.Is(err, ErrLimit) {
		t.Fatalf("MaxMW: %v", err)
	}
	tf := NewTable(TableOptions{Rand: failReader{}})
	pdf := newPD(t, tf)
	if _, err := tf.RegMR(pdf, nil, 0, 0); !errors.Is(err, ErrRand) {
		t.Fatalf("rand failure: %v", err)
	}
}

func TestAtomic(t *testing.T) {
	tb := NewTable(TableOptions{})
	pd := newPD(t, tb)
	buf := make([]byte, 32)
	m := reg(t, tb, pd, buf, 0x100, AccessLocalWrite|AccessRemoteAtomic)
	b, done, err := tb.CheckAtomic(pd, m.RKey(), 0x108)
	if err != nil || len(b) != 8 || &b[0] != &buf[8] {
		t.Fatalf("aligned atomic: %v", err)
	}
	done()
	for _, va := range []uint64{0x101, 0x104, 0x10F} {
		if _, _, err := tb.CheckAtomic(pd, m.RKey(), va); !errors.Is(err, ErrAlign) {
			t.Fatalf("va %#x: %v, want ErrAlign", va, err)
		}
	}
	if _, _, err := tb.CheckAtomic(pd, m.RKey(), 0x120); !errors.Is(err, ErrBounds) {
		t.Fatalf("past end: %v", err)
	}
	if _, _, err := tb.Check(pd, m.RKey(), 0x108, 4, OpRemoteAtomic); !errors.Is(err, ErrAlign) {
		t.Fatalf("4-byte atomic: %v", err)
	}
	m2 := reg(t, tb, pd, buf, 0, AccessLocalWrite|AccessRemoteWrite)
	if _, _, err := tb.CheckAtomic(pd, m2.RKey(), 8); !errors.Is(err, ErrAccess) {
		t.Fatalf("no atomic access: %v", err)
	}
}

func TestCheckNoAlloc(t *testing.T) {
	tb := NewTable(TableOptions{})
	pd := newPD(t, tb)
	m := reg(t, tb, pd, make([]byte, 4096), 0x1000, AccessLocalWrite|AccessRemoteWrite|AccessRemoteAtomic)
	k := m.RKey()
	n := testing.AllocsPerRun(1000, func() {
		b, done, err := tb.Check(pd, k, 0x1100, 256, OpRemoteWrite)
		if err != nil || len(b) != 256 {
			panic(err)
		}
		done()
		_, done, _ = tb.CheckAtomic(pd, k, 0x1008)
		done()
		_, _, err = tb.Check(pd, k^1, 0x1100, 256, OpRemoteWrite) // error path too
		if err == nil {
			panic("bad key accepted")
		}
	})
	if n != 0 {
		t.Fatalf("Check allocates %v per run", n)
	}
}

// Dereg waits for in-flight users, then succeeds.
func TestDeregWaitsForInFlight(t *testing.T) {
	tb := NewTable(TableOptions{})
	pd := newPD(t, tb)
	buf := make([]byte, 64)
	m := reg(t, tb, pd, buf, 0, AccessLocalWrite|AccessRemoteWrite)
	k := m.RKey()
	b, done, err := tb.Check(pd, k, 0, 64, OpRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	go func() { res <- m.DeregWith(DeregOptions{Timeout: -1}) }()
	// Wait until Dereg has published the Invalid state (new accesses refused).
	for tb.Lookup(k) == KeyValid {
		runtime.Gosched()
	}
	if _, _, err := tb.Check(pd, k, 0, 8, OpRemoteWrite); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("access during dereg: %v", err)
	}
	select {
	case err := <-res:
		t.Fatalf("Dereg returned %v while a user was in flight", err)
	default:
	}
	b[0] = 1 // still ours to touch
	done()
	if err := <-res; err != nil {
		t.Fatalf("Dereg after done: %v", err)
	}
	if _, _, err := tb.Check(pd, k, 0, 8, OpRemoteWrite); !errors.Is(err, ErrBadKey) {
		t.Fatalf("after dereg: %v", err)
	}
}

// Dereg gives up with ErrBusy (bounded wait) and leaves the MR registered.
func TestDeregBusy(t *testing.T) {
	tb := NewTable(TableOptions{})
	pd := newPD(t, tb)
	m := reg(t, tb, pd, make([]byte, 64), 0, AccessLocalWrite)
	_, done, err := tb.Check(pd, m.LKey(), 0, 8, OpLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := m.DeregWith(DeregOptions{Context: ctx, Timeout: -1}); !errors.Is(err, ErrBusy) {
		t.Fatalf("got %v, want ErrBusy", err)
	}
	b, done2, err := tb.Check(pd, m.LKey(), 0, 8, OpLocalWrite)
	if err != nil || len(b) != 8 {
		t.Fatalf("MR must stay registered after ErrBusy: %v", err)
	}
	done2()
	done()
	if err := m.DeregWith(DeregOptions{Context: ctx}); err != nil {
		t.Fatalf("Dereg with no users: %v", err)
	}
}

// Concurrent checkers while the MR is deregistered: nobody gets bytes after Dereg returns.
func TestDeregRace(t *testing.T) {
	tb := NewTable(TableOptions{})
	pd := newPD(t, tb)
	for round := 0; round < 20; round++ {
		m := reg(t, tb, pd, make([]byte, 64), 0, AccessLocalWrite|AccessRemoteWrite)
		k := m.RKey()
		var gone atomicBool
		var wg sync.WaitGroup
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 200; i++ {
					b, done, err := tb.Check(pd, k, 0, 64, OpRemoteWrite)
					if err != nil {
						continue
					}
					if gone.load() {
						t.Error("access granted after Dereg returned")
					}
					b[i%64]++
					done()
				}
			}()
		}
		if err := m.DeregWith(DeregOptions{Timeout: -1}); err != nil {
			t.Fatal(err)
		}
		gone.store(true)
		wg.Wait()
	}
}

type atomicBool struct {
	mu sync.Mutex
	v  bool
}

func (a *atomicBool) load() bool   { a.mu.Lock(); defer a.mu.Unlock(); return a.v }
func (a *atomicBool) store(v bool) { a.mu.Lock(); a.v = v; a.mu.Unlock() }

func BenchmarkCheck(b *testing.B) {
	tb := NewTable(TableOptions{})
	pd, _ := tb.AllocPD()
	m, _ := tb.RegMR(pd, make([]byte, 1<<16), 0x100000, AccessLocalWrite|AccessRemoteWrite)
	k := m.RKey()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_, done, err := tb.Check(pd, k, 0x100100, 4096, OpRemoteWrite)
			if err != nil {
				b.Fatal(err)
			}
			done()
		}
	})
}
