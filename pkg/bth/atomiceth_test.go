package bth

import (
	"math/rand/v2"
	"testing"
)

func TestAtomicETH(t *testing.T) {
	r := rand.New(rand.NewPCG(16, 17))
	for i := 0; i < 500; i++ {
		f := AtomicETHFields{VA: r.Uint64(), RKey: r.Uint32(), SwapAdd: r.Uint64(), Compare: r.Uint64()}
		b := AtomicETH(encodeBoth(t, AtomicETHSize, func(b []byte) { AtomicETH(b).Encode(&f) }))
		if b.Fields() != f {
			t.Fatalf("%+v != %+v", b.Fields(), f)
		}
	}
	b := make(AtomicETH, AtomicETHSize)
	for i := range b {
		b[i] = byte(i)
	}
	if b.VA() != 0x0001020304050607 || b.RKey() != 0x08090A0B || b.SwapAdd() != 0x0C0D0E0F10111213 || b.Compare() != 0x1415161718191A1B {
		t.Fatalf("layout %+v", b.Fields())
	}
	checkTruncatedInHeaders(t, OpRCCmpSwap)
}
