package bth

import (
	"testing"
)

func TestAtomicAckETH(t *testing.T) {
	f := AtomicAckETHFields{OrigData: 0x0102030405060708}
	b := AtomicAckETH(encodeBoth(t, AtomicAckETHSize, func(b []byte) { AtomicAckETH(b).Encode(&f) }))
	if b[0] != 1 || b[7] != 8 || b.Fields() != f {
		t.Fatalf("%x", b)
	}
	checkTruncatedInHeaders(t, OpRCAtomicAck)
}
