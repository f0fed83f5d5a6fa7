package bth

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestAETH(t *testing.T) {
	r := rand.New(rand.NewPCG(18, 19))
	for i := 0; i < 500; i++ {
		f := AETHFields{Syndrome: uint8(r.Uint32()), MSN: r.Uint32() & 0xFFFFFF}
		b := AETH(encodeBoth(t, AETHSize, func(b []byte) { AETH(b).Encode(&f) }))
		if b.Fields() != f {
			t.Fatalf("%+v != %+v", b.Fields(), f)
		}
	}
	b := make(AETH, 4)
	b.SetSyndrome(0x1F)
	b.SetMSN(0xFFABCDEF)
	if b[0] != 0x1F || b.MSN() != 0xABCDEF || b.Syndrome() != 0x1F {
		t.Fatalf("%x", b)
	}
	checkTruncatedInHeaders(t, OpRCAck)
}

func TestSyndromes(t *testing.T) {
	if SyndromeACK(CreditNone) != 0x1F {
		t.Fatal("rxe's ACK syndrome is 0x1f")
	}
	for _, c := range []struct {
		s    uint8
		typ  AckType
		v    uint8
		name string
	}{
		{SyndromeACK(3), AckTypeACK, 3, "ACK"},
		{SyndromeRNR(12), AckTypeRNR, 12, "RNR"},
		{SyndromeNAK(NAKPSNSeqErr), AckTypeNAK, 0, "NAK"},
		{0x40, AckTypeReserved, 0, "Reserved"},
	} {
		if SyndromeType(c.s) != c.typ || SyndromeValue(c.s) != c.v || c.typ.String() != c.name {
			t.Errorf("syndrome %#x: %v %d", c.s, SyndromeType(c.s), SyndromeValue(c.s))
		}
	}
	// IBTA table 45 values as rxe defines them (AETH_NAK_*).
	want := map[uint8]uint8{NAKPSNSeqErr: 0x60, NAKInvalidRequest: 0x61, NAKRemoteAccessErr: 0x62, NAKRemoteOpErr: 0x63, NAKInvalidRDRequest: 0x64}
	for code, s := range want {
		if SyndromeNAK(code) != s {
			t.Errorf("NAK %d = %#x, want %#x", code, SyndromeNAK(code), s)
		}
	}
	if SyndromeRNR(0xFF) != 0x3F || SyndromeACK(0xFF) != 0x1F {
		t.Fatal("value not masked to 5 bits")
	}
	if SyndromeType(0x80|0x60) != AckTypeNAK {
		t.Fatal("bit 7 must be ignored")
	}
}

func TestCreditCount(t *testing.T) {
	want := []int{0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768,
		1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, -1}
	for c, w := range want {
		if got := CreditCount(uint8(c)); got != w {
			t.Errorf("CreditCount(%d) = %d, want %d", c, got, w)
		}
	}
}

func TestRNRTimer(t *testing.T) {
	ms := []float64{655.36, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12, 0.16, 0.24, 0.32, 0.48, 0.64,
		0.96, 1.28, 1.92, 2.56, 3.84, 5.12, 7.68, 10.24, 15.36, 20.48, 30.72, 40.96, 61.44, 81.92,
		122.88, 163.84, 245.76, 327.68, 491.52}
	for c, m := range ms {
		want := time.Duration(m*1e6+0.5) * time.Nanosecond
		if got := RNRTimer(uint8(c)); got != want {
			t.Errorf("RNRTimer(%d) = %v, want %v", c, got, want)
		}
		// Both ways: the exact duration maps back to its code.
		if got := RNRTimerCode(want); got != uint8(c) {
			t.Errorf("RNRTimerCode(%v) = %d, want %d", want, got, c)
		}
	}
	cases := []struct {
		d    time.Duration
		want uint8
	}{
		{0, 1}, {-time.Second, 1}, {10 * time.Microsecond, 1}, {11 * time.Microsecond, 2},
		{time.Millisecond, 14}, {500 * time.Millisecond, 0}, {time.Hour, 0}, {491520 * time.Microsecond, 31},
	}
	for _, c := range cases {
		if got := RNRTimerCode(c.d); got != c.want {
			t.Errorf("RNRTimerCode(%v) = %d, want %d", c.d, got, c.want)
		}
		if c.d > 0 && c.d <= RNRTimer(0) && RNRTimer(RNRTimerCode(c.d)) < c.d {
			t.Errorf("RNRTimerCode(%v) gives a shorter timer", c.d)
		}
	}
}
