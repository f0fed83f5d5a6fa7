package bth

import "testing"

func TestRDETHAndXRCETH(t *testing.T) {
	rd := RDETH{0x55, 0, 0, 0}
	rd.SetEEContext(0xFF123456)
	if rd.EEContext() != 0x123456 || rd[0] != 0x55 {
		t.Fatalf("RDETH %x", rd)
	}
	x := XRCETH{0x66, 0, 0, 0}
	x.SetXRCSRQ(0x654321)
	if x.XRCSRQ() != 0x654321 || x[0] != 0x66 {
		t.Fatalf("XRCETH %x", x)
	}
	checkTruncatedInHeaders(t, OpRDWriteOnlyImm)
	checkTruncatedInHeaders(t, OpXRCCmpSwap)
}
