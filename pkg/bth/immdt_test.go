package bth

import "testing"

func TestImmDt(t *testing.T) {
	i := make(ImmDt, 4)
	i.SetImm(0x01020304)
	if i[0] != 1 || i.Imm() != 0x01020304 {
		t.Fatalf("ImmDt %x", i)
	}
	checkTruncatedInHeaders(t, OpRCWriteOnlyImm)
}
