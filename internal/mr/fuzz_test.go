package mr

import (
	"errors"
	"testing"
	"unsafe"
)

type fuzzRegion struct {
	buf  []byte
	iova uint64
	key  uint32
}

// FuzzCheck: random (key, va, length, op) against a few registered buffers and windows. The
// validator must never panic, never return bytes outside a registered buffer (checked with
// pointer-range arithmetic), and when it grants access the bytes must be exactly
// [va-iova, va-iova+length) of the object the key names.
func FuzzCheck(f *testing.F) {
	tb := NewTable(TableOptions{})
	pd, _ := tb.AllocPD()
	pd2, _ := tb.AllocPD()
	var regions []fuzzRegion
	add := func(p *PD, n int, iova uint64, acc Access) *MR {
		buf := make([]byte, n)
		m, err := tb.RegMR(p, buf, iova, acc)
		if err != nil {
			f.Fatal(err)
		}
		regions = append(regions, fuzzRegion{buf: buf, iova: m.IOVA(), key: m.RKey()})
		return m
	}
	all := AccessLocalWrite | AccessRemoteRead | AccessRemoteWrite | AccessRemoteAtomic | AccessMWBind
	m0 := add(pd, 4096, 0x10000, all)
	add(pd, 1, 0, AccessRemoteRead)
	add(pd, 64, ^uint64(0)-63, all)
	add(pd2, 100, 0x10000, AccessLocalWrite|AccessRemoteWrite)
	add(pd, 512, 0, all|AccessZeroBased)
	dead := add(pd, 32, 0x20000, all)
	_ = dead.Dereg()
	w1, _ := tb.AllocMW(pd, MWType1)
	k1, err := w1.Bind(BindOptions{MR: m0, Addr: 0x10100, Length: 256, Access: AccessRemoteRead | AccessRemoteWrite})
	if err != nil {
		f.Fatal(err)
	}
	regions = append(regions, fuzzRegion{buf: regions[0].buf[0x100:0x200], iova: 0x10100, key: k1})
	w2, _ := tb.AllocMW(pd, MWType2)
	k2, err := w2.Bind(BindOptions{PD: pd, QPN: 5, MR: m0, Addr: 0x10800, Length: 8, Access: AccessRemoteAtomic, Key: KeyByte(w2.RKey()) + 1})
	if err != nil {
		f.Fatal(err)
	}
	regions = append(regions, fuzzRegion{buf: regions[0].buf[0x800:0x808], iova: 0x10800, key: k2})

	for i, r := range regions {
		f.Add(uint8(i), uint32(0), r.iova, uint32(len(r.buf)), uint8(OpRemoteWrite), false, uint32(5))
		f.Add(uint8(i), uint32(1), r.iova+1, uint32(len(r.buf)), uint8(OpRemoteRead), false, uint32(5))
	}
	f.Add(uint8(0), uint32(0x100), uint64(0x10000), uint32(8), uint8(OpRemoteAtomic), true, uint32(5))
	f.Add(uint8(2), uint32(0), ^uint64(0), uint32(1), uint8(OpLocalRead), false, uint32(0))

	inside := func(b []byte) bool {
		if len(b) == 0 {
			return true
		}
		lo := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
		hi := lo + uintptr(cap(b))
		for _, r := range regions {
			if len(r.buf) == 0 {
				continue
			}
			rlo := uintptr(unsafe.Pointer(unsafe.SliceData(r.buf)))
			if lo >= rlo && hi <= rlo+uintptr(len(r.buf)) {
				return true
			}
		}
		return false
	}

	f.Fuzz(func(t *testing.T, sel uint8, perturb uint32, va uint64, length uint32, op uint8, otherPD bool, qpn uint32) {
		key := perturb
		var want *fuzzRegion
		if int(sel) < len(regions) {
			want = &regions[sel]
			key = want.key ^ perturb
		}
		p := pd
		if otherPD {
			p = pd2
		}
		b, done, err := tb.CheckQP(p, qpn, key, va, length, Op(op%6))
		if done == nil {
			t.Fatal("nil done")
		}
		defer done()
		if err != nil {
			if b != nil {
				t.Fatal("bytes with an error")
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("untyped error %T", err)
			}
			return
		}
		if len(b) != int(length) || cap(b) != len(b) {
			t.Fatalf("len %d cap %d, want %d", len(b), cap(b), length)
		}
		if !inside(b) {
			t.Fatalf("slice outside every registered buffer: key %#x va %#x len %d", key, va, length)
		}
		if length > 0 && want != nil && key == want.key {
			off := va - want.iova
			if &b[0] != &want.buf[off] {
				t.Fatalf("wrong bytes for key %#x va %#x", key, va)
			}
		}
	})
}
