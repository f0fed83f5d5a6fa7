package bth

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// encodeBoth encodes into a zero-filled and a 0xFF-filled buffer: Encode
// writes every bit, so both must give the same bytes.
func encodeBoth(t *testing.T, size int, enc func(b []byte)) []byte {
	t.Helper()
	a, b := make([]byte, size), bytes.Repeat([]byte{0xFF}, size)
	enc(a)
	enc(b)
	if !bytes.Equal(a, b) {
		t.Fatalf("Encode leaves bits untouched:\n%x\n%x", a, b)
	}
	return a
}

func randBTHFields(r *rand.Rand) BTHFields {
	return BTHFields{
		Opcode: Opcode(r.Uint32()), SE: r.IntN(2) == 1, MigReq: r.IntN(2) == 1, PadCnt: uint8(r.IntN(4)),
		TVer: uint8(r.IntN(16)), PKey: uint16(r.Uint32()), FECN: r.IntN(2) == 1, BECN: r.IntN(2) == 1,
		Resv6: uint8(r.IntN(64)), DestQP: r.Uint32() & 0xFFFFFF, AckReq: r.IntN(2) == 1,
		Resv7: uint8(r.IntN(128)), PSN: PSN(r.Uint32() & PSNMask),
	}
}

func TestBTHRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(10, 11))
	for i := 0; i < 2000; i++ {
		f := randBTHFields(r)
		b := BTH(encodeBoth(t, BTHSize, func(b []byte) { BTH(b).Encode(&f) }))
		if got := b.Fields(); got != f {
			t.Fatalf("Fields %+v, encoded %+v", got, f)
		}
		// Re-encoding the parsed fields gives the same bytes.
		g := b.Fields()
		c := make(BTH, BTHSize)
		c.Encode(&g)
		if !bytes.Equal(c, b) {
			t.Fatal("re-encode differs")
		}
	}
}

// TestBTHSetters: each setter changes only its own field.
func TestBTHSetters(t *testing.T) {
	r := rand.New(rand.NewPCG(12, 13))
	for i := 0; i < 500; i++ {
		f := randBTHFields(r)
		b := make(BTH, BTHSize)
		b.Encode(&f)
		g := randBTHFields(r)
		steps := []func(){
			func() { b.SetOpcode(g.Opcode); f.Opcode = g.Opcode },
			func() { b.SetSE(g.SE); f.SE = g.SE },
			func() { b.SetMigReq(g.MigReq); f.MigReq = g.MigReq },
			func() { b.SetPadCnt(g.PadCnt); f.PadCnt = g.PadCnt },
			func() { b.SetTVer(g.TVer); f.TVer = g.TVer },
			func() { b.SetPKey(g.PKey); f.PKey = g.PKey },
			func() { b.SetFECN(g.FECN); f.FECN = g.FECN },
			func() { b.SetBECN(g.BECN); f.BECN = g.BECN },
			func() { b.SetDestQP(g.DestQP | 0xFF000000); f.DestQP = g.DestQP },
			func() { b.SetAckReq(g.AckReq); f.AckReq = g.AckReq },
			func() { b.SetPSN(g.PSN); f.PSN = g.PSN },
		}
		for _, s := range steps {
			s()
			if got := b.Fields(); got != f {
				t.Fatalf("after a setter: %+v, want %+v", got, f)
			}
		}
	}
	// Fixed layout check against a captured BTH (ib_write_bw frame 20:
	// RC RDMA Write First, P_Key 0xffff, QP 0x17, PSN 361436).
	b := BTH{0x06, 0x00, 0xFF, 0xFF, 0x00, 0x00, 0x00, 0x17, 0x00, 0x05, 0x83, 0xDC}
	if b.Opcode() != OpRCWriteFirst || b.PKey() != 0xFFFF || b.DestQP() != 0x17 || b.PSN() != 361436 {
		t.Fatalf("decoded %+v", b.Fields())
	}
}

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
}

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
}

func TestAtomicAckETH(t *testing.T) {
	f := AtomicAckETHFields{OrigData: 0x0102030405060708}
	b := AtomicAckETH(encodeBoth(t, AtomicAckETHSize, func(b []byte) { AtomicAckETH(b).Encode(&f) }))
	if b[0] != 1 || b[7] != 8 || b.Fields() != f {
		t.Fatalf("%x", b)
	}
}

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
}

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
}

func TestSmallHeaders(t *testing.T) {
	i := make(ImmDt, 4)
	i.SetImm(0x01020304)
	if i[0] != 1 || i.Imm() != 0x01020304 {
		t.Fatalf("ImmDt %x", i)
	}
	e := make(IETH, 4)
	e.SetRKey(0xDEADBEEF)
	if e[0] != 0xDE || e.RKey() != 0xDEADBEEF {
		t.Fatalf("IETH %x", e)
	}
	f := make(FETH, 4)
	f.SetRaw(0xFFFFFFC0)
	f.SetPlacement(FlushPersistent | FlushGlobal)
	f.SetSelectivity(FlushMR)
	if f.Placement() != 3 || f.Selectivity() != 1 || f.Raw() != 0xFFFFFFD3 {
		t.Fatalf("FETH %x", f)
	}
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
}
