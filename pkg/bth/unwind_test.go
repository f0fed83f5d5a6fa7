package bth

import (
	"hash/crc32"
	"testing"
)

func TestICRCUnwind(t *testing.T) {
	data := []byte("\x1c\x40\xff\xff\x00\x00\x00\x11\x80\x00\x12\x34 the headers to unwind")
	for _, v := range []uint32{0, 1, 0xffffffff, 0xdeadbeef, 0x12345678} {
		for n := 0; n <= len(data); n++ {
			c := crc32.Update(v, crc32.IEEETable, data[:n])
			if got := ICRCUnwind(c, data[:n]); got != v {
				t.Fatalf("ICRCUnwind(Update(%#x, %d bytes)) = %#x", v, n, got)
			}
		}
	}
	// a different state or different bytes unwind to something else
	c := crc32.Update(7, crc32.IEEETable, data)
	if ICRCUnwind(c^1, data) == 7 {
		t.Error("a changed CRC unwound to the same state")
	}
	other := append([]byte(nil), data...)
	other[3] ^= 0x40
	if ICRCUnwind(c, other) == 7 {
		t.Error("changed bytes unwound to the same state")
	}
}

func FuzzICRCUnwind(f *testing.F) {
	f.Add(uint32(0x1234), []byte("\x1c\x00\xff\xff"))
	f.Fuzz(func(t *testing.T, v uint32, p []byte) {
		if got := ICRCUnwind(crc32.Update(v, crc32.IEEETable, p), p); got != v {
			t.Fatalf("unwound %#x, want %#x", got, v)
		}
	})
}

// TestRxeFlushICRC: rxe's FLUSH ICRC is the given ICRC continued over the headers, and
// ICRCUnwind over the same bytes gives the given ICRC back.
func TestRxeFlushICRC(t *testing.T) {
	pkt := make([]byte, BTHSize+FETHSize+RETHSize+ICRCSize)
	BTH(pkt).Encode(&BTHFields{Opcode: OpRCFlush, PKey: 0xffff, DestQP: 0x11, PSN: 5})
	hdrs := pkt[:len(pkt)-ICRCSize]
	if got, want := RxeFlushICRC(0xcafe, pkt), crc32.Update(0xcafe, crc32.IEEETable, hdrs); got != want {
		t.Fatalf("RxeFlushICRC %#x, want %#x", got, want)
	}
	if got := ICRCUnwind(RxeFlushICRC(0xcafe, pkt), hdrs); got != 0xcafe {
		t.Fatalf("unwound %#x", got)
	}
}
