package mr

import (
	"context"
	"errors"
	"math/rand"
	"testing"
)

// Tests of TableOptions.OnKey: every change of a key's mapping is reported, synchronously, so
// a consumer that keeps its own R_Key table by key index (pkg/roce devmem.go: each event
// replaces the index's entry, an MR event adds it) always equals the table's valid MR keys.

// keyLog records OnKey events and mirrors them the way a consumer does.
type keyLog struct {
	ev     []KeyEvent
	mirror map[uint32]KeyEvent // key index -> valid MR mapping
}

func newKeyLog() *keyLog { return &keyLog{mirror: map[uint32]KeyEvent{}} }

func (l *keyLog) on(e KeyEvent) {
	l.ev = append(l.ev, e)
	delete(l.mirror, KeyIndex(e.Key))
	if e.MR {
		l.mirror[KeyIndex(e.Key)] = e
	}
}

// take returns the events since the last take.
func (l *keyLog) take() []KeyEvent {
	e := l.ev
	l.ev = nil
	return e
}

func onKeyTable(t *testing.T) (*Table, *keyLog, *PD) {
	t.Helper()
	l := newKeyLog()
	tb := NewTable(TableOptions{OnKey: l.on})
	return tb, l, newPD(t, tb)
}

// sameBuf reports whether a and b are the same memory (first byte and length).
func sameBuf(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	return len(a) == 0 || &a[0] == &b[0]
}

// wantMR checks that evs is exactly one valid-MR event with this mapping.
func wantMR(t *testing.T, what string, evs []KeyEvent, key uint32, buf []byte, iova uint64, pd *PD, acc Access) {
	t.Helper()
	if len(evs) != 1 {
		t.Fatalf("%s: %d events %+v, want 1", what, len(evs), evs)
	}
	e := evs[0]
	if e.Key != key || !e.MR || !sameBuf(e.Buf, buf) || e.IOVA != iova || e.PD != pd.Handle() || e.Access != acc {
		t.Fatalf("%s: event {Key %#x MR %v len %d IOVA %#x PD %d Access %#x}, want {Key %#x MR true len %d IOVA %#x PD %d Access %#x} on the same memory",
			what, e.Key, e.MR, len(e.Buf), e.IOVA, e.PD, e.Access, key, len(buf), iova, pd.Handle(), acc)
	}
	if len(e.Buf) != cap(e.Buf) {
		t.Fatalf("%s: event Buf reaches past the mapping (len %d cap %d)", what, len(e.Buf), cap(e.Buf))
	}
}

// wantGone checks that evs is at least one event, each for key with MR false.
func wantGone(t *testing.T, what string, evs []KeyEvent, key uint32) {
	t.Helper()
	if len(evs) == 0 {
		t.Fatalf("%s: no event", what)
	}
	for _, e := range evs {
		if e.Key != key || e.MR || e.Buf != nil {
			t.Fatalf("%s: event %+v, want Key %#x MR false", what, e, key)
		}
	}
}

func wantNone(t *testing.T, what string, evs []KeyEvent) {
	t.Helper()
	if len(evs) != 0 {
		t.Fatalf("%s: events %+v, want none", what, evs)
	}
}

// TestOnKeyRegDereg: RegMR reports the key with the registered mapping (zero-based: IOVA 0);
// Dereg reports the key gone; failed registrations report nothing.
func TestOnKeyRegDereg(t *testing.T) {
	tb, l, pd := onKeyTable(t)
	buf := make([]byte, 4096)
	acc := AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead
	m, err := tb.RegMR(pd, buf[100:300], 0x5000, acc)
	if err != nil {
		t.Fatal(err)
	}
	wantMR(t, "RegMR", l.take(), m.RKey(), buf[100:300], 0x5000, pd, acc)
	z, err := tb.RegMR(pd, buf[1024:2048], 0x9000, AccessRemoteRead|AccessZeroBased)
	if err != nil {
		t.Fatal(err)
	}
	wantMR(t, "zero-based RegMR", l.take(), z.RKey(), buf[1024:2048], 0, pd, AccessRemoteRead|AccessZeroBased)
	if len(l.mirror) != 2 {
		t.Fatalf("mirror %d keys, want 2", len(l.mirror))
	}
	// failures change nothing
	if _, err := tb.RegMR(pd, buf, 0, AccessRemoteWrite); err == nil { // remote write needs local write
		t.Fatal("RegMR with remote write and no local write")
	}
	if _, err := tb.RegMR(nil, buf, 0, AccessLocalWrite); err == nil {
		t.Fatal("RegMR without a PD")
	}
	wantNone(t, "failed RegMR", l.take())
	key := m.RKey()
	if err := m.Dereg(); err != nil {
		t.Fatal(err)
	}
	wantGone(t, "Dereg", l.take(), key)
	if _, ok := l.mirror[KeyIndex(key)]; ok || len(l.mirror) != 1 {
		t.Fatalf("mirror after Dereg: %+v", l.mirror)
	}
	if err := m.Dereg(); err == nil {
		t.Fatal("second Dereg")
	}
	wantNone(t, "second Dereg", l.take())
	// the index comes back with another key: the mirror follows
	zk := z.RKey()
	if err := z.Dereg(); err != nil {
		t.Fatal(err)
	}
	wantGone(t, "Dereg zero-based", l.take(), zk)
	if len(l.mirror) != 0 {
		t.Fatalf("mirror after both Deregs: %+v", l.mirror)
	}
}

// TestOnKeyDeregBusyRestores: a Dereg that gives up (accesses still in flight) reports the key
// gone and then back with its mapping, so the consumer keeps it; the Dereg after the access
// ends reports it gone.
func TestOnKeyDeregBusyRestores(t *testing.T) {
	tb, l, pd := onKeyTable(t)
	buf := make([]byte, 256)
	acc := AccessLocalWrite | AccessRemoteWrite
	m, err := tb.RegMR(pd, buf, 0x1000, acc)
	if err != nil {
		t.Fatal(err)
	}
	l.take()
	_, done, err := tb.Check(pd, m.LKey(), 0x1000, 8, OpLocalRead)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the wait ends at once, without a timer
	if err := m.DeregWith(DeregOptions{Context: ctx, Timeout: -1}); !errors.Is(err, ErrBusy) {
		t.Fatalf("Dereg with an access in flight: %v", err)
	}
	evs := l.take()
	if len(evs) < 2 {
		t.Fatalf("events %+v: want the key gone, then back", evs)
	}
	wantGone(t, "Dereg giving up (first)", evs[:len(evs)-1], m.RKey())
	wantMR(t, "Dereg giving up (last)", evs[len(evs)-1:], m.RKey(), buf, 0x1000, pd, acc)
	if e, ok := l.mirror[KeyIndex(m.RKey())]; !ok || e.Key != m.RKey() {
		t.Fatalf("mirror lost the restored key: %+v", l.mirror)
	}
	done()
	key := m.RKey()
	if err := m.Dereg(); err != nil {
		t.Fatal(err)
	}
	wantGone(t, "Dereg", l.take(), key)
	if len(l.mirror) != 0 {
		t.Fatalf("mirror %+v", l.mirror)
	}
}

// TestOnKeyFastReg: a fast-register MR is reported without a valid mapping when allocated,
// with the new key and its mapping at each FastReg, and gone at Invalidate and InvalidateQP
// (IBTA 10.6.3.4, 10.6.3.5); operations that fail report nothing.
func TestOnKeyFastReg(t *testing.T) {
	tb, l, pd := onKeyTable(t)
	backing := make([]byte, 8192)
	m, err := tb.AllocMR(pd, AllocMROptions{Buf: backing})
	if err != nil {
		t.Fatal(err)
	}
	wantGone(t, "AllocMR", l.take(), m.RKey())
	if len(l.mirror) != 0 {
		t.Fatalf("a Free key in the mirror: %+v", l.mirror)
	}
	idx := KeyIndex(m.RKey())
	acc := AccessLocalWrite | AccessRemoteWrite
	if err := m.FastReg(FastRegOptions{PD: pd, IOVA: 0x7000, Length: 4096, Access: acc, Key: 0x42}); err != nil {
		t.Fatal(err)
	}
	k1 := MakeKey(idx, 0x42)
	if m.RKey() != k1 {
		t.Fatalf("key %#x after FastReg, want %#x", m.RKey(), k1)
	}
	wantMR(t, "FastReg", l.take(), k1, backing[:4096], 0x7000, pd, acc)
	// failures: FastReg of a Valid key, Invalidate of an ordinary MR, from another PD, a wrong key
	if err := m.FastReg(FastRegOptions{Length: 8, Access: acc, Key: 0x43}); !errors.Is(err, ErrState) {
		t.Fatalf("FastReg while Valid: %v", err)
	}
	plain, err := tb.RegMR(pd, make([]byte, 64), 0, AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	l.take()
	if err := tb.Invalidate(pd, plain.RKey()); !errors.Is(err, ErrState) {
		t.Fatalf("Invalidate of an ordinary MR: %v", err)
	}
	other := newPD(t, tb)
	if err := tb.Invalidate(other, k1); !errors.Is(err, ErrWrongPD) {
		t.Fatalf("Invalidate from another PD: %v", err)
	}
	if err := tb.Invalidate(pd, k1^1); err == nil {
		t.Fatal("Invalidate of a stale key byte")
	}
	wantNone(t, "failed operations", l.take())

	if err := tb.Invalidate(pd, k1); err != nil {
		t.Fatal(err)
	}
	wantGone(t, "Invalidate", l.take(), k1)
	if _, ok := l.mirror[idx]; ok {
		t.Fatal("mirror kept an invalidated key")
	}
	// FastReg with its own memory, zero-based
	own := make([]byte, 512)
	if err := m.FastReg(FastRegOptions{Buf: own, IOVA: 0x9999, Length: 256, Access: acc | AccessZeroBased, Key: 0x43}); err != nil {
		t.Fatal(err)
	}
	k2 := MakeKey(idx, 0x43)
	wantMR(t, "second FastReg", l.take(), k2, own[:256], 0, pd, acc|AccessZeroBased)
	if e := l.mirror[idx]; e.Key != k2 {
		t.Fatalf("mirror holds %#x, want %#x", e.Key, k2)
	}
	if err := tb.InvalidateQP(pd, 7, k2); err != nil {
		t.Fatal(err)
	}
	wantGone(t, "InvalidateQP", l.take(), k2)
	if err := m.FastReg(FastRegOptions{Length: 16, Access: acc, Key: 0x44}); err != nil {
		t.Fatal(err)
	}
	k3 := MakeKey(idx, 0x44)
	wantMR(t, "third FastReg", l.take(), k3, backing[:16], 0, pd, acc)
	if err := m.Dereg(); err != nil {
		t.Fatal(err)
	}
	wantGone(t, "Dereg", l.take(), k3)
	if _, ok := l.mirror[idx]; ok || len(l.mirror) != 1 {
		t.Fatalf("mirror %+v, want only the ordinary MR", l.mirror)
	}
}

// TestOnKeyWindows: a window's allocation, binds (type 1 and 2), unbind, invalidation and
// deallocation report its keys with MR false; the MR under it stays in the mirror, and a
// Dereg refused while a window is bound reports nothing.
func TestOnKeyWindows(t *testing.T) {
	tb, l, pd := onKeyTable(t)
	buf := make([]byte, 1024)
	acc := AccessLocalWrite | AccessRemoteWrite | AccessMWBind
	m, err := tb.RegMR(pd, buf, 0x4000, acc)
	if err != nil {
		t.Fatal(err)
	}
	l.take()
	mirrorHasMR := func(what string) {
		t.Helper()
		if e, ok := l.mirror[KeyIndex(m.RKey())]; !ok || e.Key != m.RKey() || len(l.mirror) != 1 {
			t.Fatalf("%s: mirror %+v, want only the MR %#x", what, l.mirror, m.RKey())
		}
	}
	w1, err := tb.AllocMW(pd, MWType1)
	if err != nil {
		t.Fatal(err)
	}
	wantGone(t, "AllocMW type 1", l.take(), w1.RKey())
	k, err := w1.Bind(BindOptions{MR: m, Addr: 0x4010, Length: 64, Access: AccessRemoteWrite})
	if err != nil {
		t.Fatal(err)
	}
	wantGone(t, "Bind type 1", l.take(), k)
	mirrorHasMR("after Bind type 1")
	if err := m.Dereg(); !errors.Is(err, ErrBusy) {
		t.Fatalf("Dereg with a bound window: %v", err)
	}
	wantNone(t, "refused Dereg", l.take())
	k, err = w1.Bind(BindOptions{MR: m, Addr: 0x4100, Length: 16, Access: AccessRemoteRead})
	if err != nil {
		t.Fatal(err)
	}
	wantGone(t, "rebind type 1", l.take(), k)
	k, err = w1.Bind(BindOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantGone(t, "unbind type 1", l.take(), k)

	w2, err := tb.AllocMW(pd, MWType2)
	if err != nil {
		t.Fatal(err)
	}
	wantGone(t, "AllocMW type 2", l.take(), w2.RKey())
	k2, err := w2.Bind(BindOptions{PD: pd, QPN: 5, MR: m, Addr: 0x4000, Length: 128, Access: AccessRemoteWrite,
		Key: KeyByte(w2.RKey()) + 1})
	if err != nil {
		t.Fatal(err)
	}
	wantGone(t, "Bind type 2", l.take(), k2)
	if err := tb.InvalidateQP(pd, 6, k2); !errors.Is(err, ErrWrongQP) {
		t.Fatalf("InvalidateQP from another QP: %v", err)
	}
	wantNone(t, "refused InvalidateQP", l.take())
	if err := tb.InvalidateQP(pd, 5, k2); err != nil {
		t.Fatal(err)
	}
	wantGone(t, "InvalidateQP type 2", l.take(), k2)
	mirrorHasMR("after the windows' changes")

	for _, w := range []*MW{w1, w2} {
		key := w.RKey()
		if err := w.Dealloc(); err != nil {
			t.Fatal(err)
		}
		wantGone(t, "Dealloc", l.take(), key)
	}
	mirrorHasMR("after Dealloc")
	key := m.RKey()
	if err := m.Dereg(); err != nil {
		t.Fatal(err)
	}
	wantGone(t, "Dereg", l.take(), key)
	if len(l.mirror) != 0 {
		t.Fatalf("mirror %+v", l.mirror)
	}
}

// TestOnKeyMirror runs a seeded random sequence of registrations, fast registrations,
// invalidations, window binds and deregistrations (index reuse included) and checks after each
// step that the consumer's mirror equals the table's valid MR keys and their mappings.
func TestOnKeyMirror(t *testing.T) {
	tb, l, pd := onKeyTable(t)
	rng := rand.New(rand.NewSource(7))
	mem := make([]byte, 1<<16)
	var mrs []*MR
	var mws []*MW
	acc := AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessMWBind
	keyByte := uint8(0)
	done := map[string]int{} // successful operations
	ok := func(op string, err error) {
		if err == nil {
			done[op]++
		}
	}
	check := func(step int, op string) {
		t.Helper()
		want := 0
		for _, m := range mrs {
			if m.State() != KeyValid {
				continue
			}
			want++
			e, ok := l.mirror[KeyIndex(m.RKey())]
			cur := m.cur.Load()
			if !ok || e.Key != m.RKey() || !sameBuf(e.Buf, cur.buf) || e.IOVA != m.IOVA() || e.Access != m.Access() ||
				e.PD != pd.Handle() {
				t.Fatalf("step %d (%s): MR %#x: mirror %+v (present %v)", step, op, m.RKey(), e, ok)
			}
		}
		if len(l.mirror) != want {
			t.Fatalf("step %d (%s): mirror has %d keys, the table %d valid MRs", step, op, len(l.mirror), want)
		}
	}
	for step := 0; step < 2000; step++ {
		op := ""
		switch rng.Intn(7) {
		case 0:
			op = "RegMR"
			off := rng.Intn(len(mem) - 256)
			m, err := tb.RegMR(pd, mem[off:off+1+rng.Intn(255)], uint64(rng.Intn(1<<20)), acc)
			if ok(op, err); err == nil {
				mrs = append(mrs, m)
			}
		case 1:
			op = "AllocMR"
			off := rng.Intn(len(mem) - 512)
			m, err := tb.AllocMR(pd, AllocMROptions{Buf: mem[off : off+512]})
			if ok(op, err); err == nil {
				mrs = append(mrs, m)
			}
		case 2:
			op = "FastReg"
			if len(mrs) > 0 {
				keyByte++
				ok(op, mrs[rng.Intn(len(mrs))].FastReg(FastRegOptions{IOVA: uint64(rng.Intn(1 << 20)),
					Length: uint64(rng.Intn(512)), Access: acc, Key: keyByte}))
			}
		case 3:
			op = "Invalidate"
			if len(mrs) > 0 {
				ok(op, tb.Invalidate(pd, mrs[rng.Intn(len(mrs))].RKey()))
			}
		case 4:
			op = "Dereg"
			if len(mrs) > 0 {
				i := rng.Intn(len(mrs))
				if err := mrs[i].Dereg(); err == nil {
					ok(op, err)
					mrs = append(mrs[:i], mrs[i+1:]...)
				}
			}
		case 5:
			op = "AllocMW/Bind"
			if len(mws) < 8 {
				if w, err := tb.AllocMW(pd, MWType1); err == nil {
					mws = append(mws, w)
				}
			}
			if len(mws) > 0 && len(mrs) > 0 {
				m := mrs[rng.Intn(len(mrs))]
				if m.State() == KeyValid && m.Len() > 0 {
					_, err := mws[rng.Intn(len(mws))].Bind(BindOptions{MR: m, Addr: m.IOVA(), Length: uint64(m.Len()),
						Access: AccessRemoteRead})
					ok("Bind", err)
				}
			}
		case 6:
			op = "Dealloc MW"
			if len(mws) > 0 {
				i := rng.Intn(len(mws))
				if err := mws[i].Dealloc(); err == nil {
					ok(op, err)
					mws = append(mws[:i], mws[i+1:]...)
				}
			}
		}
		check(step, op)
	}
	for _, op := range []string{"RegMR", "AllocMR", "FastReg", "Invalidate", "Dereg", "Bind", "Dealloc MW"} {
		if done[op] == 0 {
			t.Fatalf("the sequence never completed a %s (%v)", op, done)
		}
	}
	t.Logf("operations %v", done)
}
