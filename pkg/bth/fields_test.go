package bth

import (
	"math/rand/v2"
	"testing"
)

// TestSmallHeaderFields: ImmDt, IETH and FETH round-trip through their Fields structs for
// random words (FETH's reserved bits included), and Encode writes the documented bit places.
func TestSmallHeaderFields(t *testing.T) {
	r := rand.New(rand.NewPCG(60, 61))
	for i := 0; i < 1000; i++ {
		w := r.Uint32()
		im := make(ImmDt, ImmDtSize)
		be.PutUint32(im, w)
		f := im.Fields()
		out := make(ImmDt, ImmDtSize)
		out.Encode(&f)
		if f.Imm != w || string(out) != string(im) {
			t.Fatalf("ImmDt %#x: %+v %x", w, f, out)
		}
		ie := make(IETH, IETHSize)
		be.PutUint32(ie, w)
		g := ie.Fields()
		oie := make(IETH, IETHSize)
		oie.Encode(&g)
		if g.RKey != w || string(oie) != string(ie) {
			t.Fatalf("IETH %#x: %+v %x", w, g, oie)
		}
		fe := make(FETH, FETHSize)
		fe.SetRaw(w)
		h := fe.Fields()
		ofe := make(FETH, FETHSize)
		ofe.Encode(&h)
		if ofe.Raw() != w || h.Placement != uint8(w&0xF) || h.Selectivity != uint8(w>>4&3) || h.Resv != w>>6 {
			t.Fatalf("FETH %#x: %+v %#x", w, h, ofe.Raw())
		}
	}
	fe := make(FETH, FETHSize)
	fe.Encode(&FETHFields{Placement: FlushGlobal | FlushPersistent, Selectivity: FlushMR})
	if fe.Raw() != 0x13 {
		t.Fatalf("FETH placement 3, selectivity MR: %#x, want 0x13", fe.Raw())
	}
}
