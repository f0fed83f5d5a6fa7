package bth

import "testing"

func TestFETH(t *testing.T) {
	f := make(FETH, 4)
	f.SetRaw(0xFFFFFFC0)
	f.SetPlacement(FlushPersistent | FlushGlobal)
	f.SetSelectivity(FlushMR)
	if f.Placement() != 3 || f.Selectivity() != 1 || f.Raw() != 0xFFFFFFD3 {
		t.Fatalf("FETH %x", f)
	}
	checkTruncatedInHeaders(t, OpRCFlush)
}
