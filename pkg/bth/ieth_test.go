package bth

import "testing"

func TestIETH(t *testing.T) {
	e := make(IETH, 4)
	e.SetRKey(0xDEADBEEF)
	if e[0] != 0xDE || e.RKey() != 0xDEADBEEF {
		t.Fatalf("IETH %x", e)
	}
	checkTruncatedInHeaders(t, OpRCSendOnlyInv)
}
