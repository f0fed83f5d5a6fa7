package bth

import (
	"math/rand/v2"
	"testing"
)

func TestRETH(t *testing.T) {
	r := rand.New(rand.NewPCG(14, 15))
	for i := 0; i < 500; i++ {
		f := RETHFields{VA: r.Uint64(), RKey: r.Uint32(), DMALen: r.Uint32()}
		b := RETH(encodeBoth(t, RETHSize, func(b []byte) { RETH(b).Encode(&f) }))
		if b.Fields() != f {
			t.Fatalf("%+v != %+v", b.Fields(), f)
		}
	}
	b := RETH{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	if b.VA() != 0x0102030405060708 || b.RKey() != 0x090A0B0C || b.DMALen() != 0x0D0E0F10 {
		t.Fatalf("layout %+v", b.Fields())
	}
	checkTruncatedInHeaders(t, OpRCWriteOnly)
}
