package mr

import (
	"bytes"
	"encoding/binary"
	"errors"
	"sync"
	"testing"
)

// sliceMem is a Memory over a slice (every access a copy); gone makes accesses fail.
type sliceMem struct {
	b    []byte
	gone bool
}

func (m *sliceMem) ReadAt(p []byte, off uint64) error {
	if m.gone || off+uint64(len(p)) > uint64(len(m.b)) {
		return errors.New("gone")
	}
	copy(p, m.b[off:])
	return nil
}

func (m *sliceMem) WriteAt(p []byte, off uint64) error {
	if m.gone || off+uint64(len(p)) > uint64(len(m.b)) {
		return errors.New("gone")
	}
	copy(m.b[off:], p)
	return nil
}

// TestRegMemory: an MR over copied memory is checked exactly as one over mapped memory
// (key, PD, rights, bounds), Check returns no bytes for it, CopyOut/CopyIn/Atomic reach it at
// the right offsets (through a window too), a failed copy is ErrFault, and OnKey reports it as
// no MR an outside responder could address.
func TestRegMemory(t *testing.T) {
	var events []KeyEvent
	tb := NewTable(TableOptions{OnKey: func(e KeyEvent) { events = append(events, e) }})
	pd, _ := tb.AllocPD()
	other, _ := tb.AllocPD()
	mem := &sliceMem{b: make([]byte, 8192)}
	if _, err := tb.RegMemory(pd, nil, 10, 0, AccessLocalWrite); !errors.Is(err, ErrInvalidArg) {
		t.Fatalf("nil memory: %v", err)
	}
	if _, err := tb.RegMemory(pd, mem, 10, 0, AccessRemoteWrite); !errors.Is(err, ErrInvalidArg) {
		t.Fatalf("REMOTE_WRITE without LOCAL_WRITE: %v", err)
	}
	if _, err := tb.RegMemory(pd, mem, 2, ^uint64(0), AccessLocalWrite); !errors.Is(err, ErrInvalidArg) {
		t.Fatalf("iova+length overflow: %v", err)
	}
	m, err := tb.RegMemory(pd, mem, 4096, 0x1000, AccessLocalWrite|AccessRemoteRead|AccessRemoteWrite|AccessRemoteAtomic|AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	if m.Len() != 4096 || m.IOVA() != 0x1000 {
		t.Fatalf("len %d iova %#x", m.Len(), m.IOVA())
	}
	if e := events[len(events)-1]; e.Key != m.LKey() || e.MR || e.Buf != nil {
		t.Fatalf("OnKey %+v: copied memory must not be offered as an addressable MR", e)
	}
	b, done, err := tb.Check(pd, m.LKey(), 0x1000, 16, OpLocalRead)
	if err != nil || b != nil {
		t.Fatalf("Check: %v %v", b, err)
	}
	done()
	if err := tb.CopyIn(pd, NoQPN, m.LKey(), 0x1010, []byte("abcd"), OpLocalWrite); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mem.b[0x10:0x14], []byte("abcd")) {
		t.Fatalf("CopyIn wrote % x", mem.b[0x10:0x14])
	}
	var got [4]byte
	if err := tb.CopyOut(pd, NoQPN, m.RKey(), 0x1010, got[:], OpRemoteRead); err != nil || string(got[:]) != "abcd" {
		t.Fatalf("CopyOut %q %v", got, err)
	}
	// The same checks as mapped memory.
	for _, c := range []struct {
		name string
		err  error
		want error
	}{
		{"wrong PD", tb.CopyOut(other, NoQPN, m.LKey(), 0x1000, got[:], OpLocalRead), ErrWrongPD},
		{"beyond", tb.CopyOut(pd, NoQPN, m.LKey(), 0x1000+4093, got[:], OpLocalRead), ErrBounds},
		{"below", tb.CopyIn(pd, NoQPN, m.LKey(), 0xfff, got[:], OpLocalWrite), ErrBounds},
		{"bad key", tb.CopyOut(pd, NoQPN, m.LKey()+1, 0x1000, got[:], OpLocalRead), ErrBadKey},
	} {
		if !errors.Is(c.err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, c.err, c.want)
		}
	}
	// Atomics: FETCH_ADD and CMP_SWP on the copied word (little-endian in memory).
	var mu sync.Mutex
	var scratch [8]byte
	binary.LittleEndian.PutUint64(mem.b[0x100:], 40)
	if orig, err := tb.Atomic(pd, 1, m.RKey(), 0x1100, &mu, &scratch, false, 0, 2); err != nil || orig != 40 {
		t.Fatalf("FETCH_ADD %d %v", orig, err)
	}
	if orig, err := tb.Atomic(pd, 1, m.RKey(), 0x1100, &mu, &scratch, true, 42, 7); err != nil || orig != 42 ||
		binary.LittleEndian.Uint64(mem.b[0x100:]) != 7 {
		t.Fatalf("CMP_SWP %d %v, memory %d", orig, err, binary.LittleEndian.Uint64(mem.b[0x100:]))
	}
	if _, err := tb.Atomic(pd, 1, m.RKey(), 0x1104, &mu, &scratch, false, 0, 1); !errors.Is(err, ErrAlign) {
		t.Fatalf("misaligned atomic: %v", err)
	}
	// A type 1 window over part of it: offsets relative to the window's start.
	w, _ := tb.AllocMW(pd, MWType1)
	rkey, err := w.Bind(BindOptions{MR: m, Addr: 0x1800, Length: 0x100, Access: AccessRemoteRead | AccessRemoteWrite})
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.CopyIn(pd, NoQPN, rkey, 0x1808, []byte("win!"), OpRemoteWrite); err != nil || string(mem.b[0x808:0x80c]) != "win!" {
		t.Fatalf("through the window: %v, memory %q", err, mem.b[0x808:0x80c])
	}
	if err := tb.CopyIn(pd, NoQPN, rkey, 0x18fe, []byte("win!"), OpRemoteWrite); !errors.Is(err, ErrBounds) {
		t.Fatalf("beyond the window: %v", err)
	}
	if err := w.Dealloc(); err != nil {
		t.Fatal(err)
	}
	// Memory gone: ErrFault, and the key stays valid (dereg still works).
	mem.gone = true
	if err := tb.CopyOut(pd, NoQPN, m.LKey(), 0x1000, got[:], OpLocalRead); !errors.Is(err, ErrFault) {
		t.Fatalf("memory gone: %v", err)
	}
	if _, err := tb.Atomic(pd, 1, m.RKey(), 0x1100, &mu, &scratch, false, 0, 1); !errors.Is(err, ErrFault) {
		t.Fatalf("atomic on memory gone: %v", err)
	}
	if m.InFlight() != 0 {
		t.Fatalf("%d accesses left in flight", m.InFlight())
	}
	if err := m.Dereg(); err != nil {
		t.Fatal(err)
	}
	if err := tb.CopyOut(pd, NoQPN, m.LKey(), 0x1000, got[:], OpLocalRead); !errors.Is(err, ErrBadKey) {
		t.Fatalf("after dereg: %v", err)
	}
	if a := testing.AllocsPerRun(100, func() {
		tb.CopyOut(pd, NoQPN, 0, 0x1000, got[:], OpLocalRead)
	}); a != 0 {
		t.Fatalf("%v allocations per refused CopyOut", a)
	}
}
