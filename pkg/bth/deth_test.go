package bth

import (
	"math/rand/v2"
	"testing"
)

func TestDETH(t *testing.T) {
	r := rand.New(rand.NewPCG(20, 21))
	for i := 0; i < 500; i++ {
		f := DETHFields{QKey: r.Uint32(), Resv: uint8(r.Uint32()), SrcQP: r.Uint32() & 0xFFFFFF}
		b := DETH(encodeBoth(t, DETHSize, func(b []byte) { DETH(b).Encode(&f) }))
		if b.Fields() != f {
			t.Fatalf("%+v != %+v", b.Fields(), f)
		}
	}
	b := DETH{0x80, 0x01, 0x00, 0x00, 0xAA, 0x00, 0x00, 0x01}
	if b.QKey() != 0x80010000 || b.Resv() != 0xAA || b.SrcQP() != 1 {
		t.Fatalf("%+v", b.Fields())
	}
	checkTruncatedInHeaders(t, OpUDSendOnlyImm)
}
