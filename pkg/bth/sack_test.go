package bth

import (
	"bytes"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"
)

// sackPacket builds a SACK: the NAK PSN sequence error Acknowledge with the extension.
func sackPacket(psn PSN, f *SACKFields) []byte {
	b := make([]byte, BTHSize+AETHSize+SACKSize+ICRCSize)
	BTH(b).Encode(&BTHFields{Opcode: OpRCAck, PKey: 0xFFFF, DestQP: 0x000123, PSN: psn})
	AETH(b[BTHSize:]).Encode(&AETHFields{Syndrome: SyndromeNAK(NAKPSNSeqErr), MSN: 0x000042})
	SACK(b[BTHSize+AETHSize:]).Encode(f)
	ep := Endpoints{Src: netip.MustParseAddr("198.18.0.1"), Dst: netip.MustParseAddr("198.18.0.2"),
		SrcPort: 50000, DstPort: UDPPort}
	SetICRC(b, ICRC(&ep, b))
	return b
}

// TestSACKGolden fixes the extension's bytes: trigger PSN in the low 24 bits of the first
// word, bit i of the bitmap at byte 4+i/8, most significant bit first.
func TestSACKGolden(t *testing.T) {
	f := SACKFields{Trigger: 0xABCDEF}
	for _, i := range []int{0, 1, 9, 63, 126, 127} {
		f.SetHeld(i)
	}
	b := sackPacket(0x000100, &f)
	want := "1100ffff" + "00000123" + "00000100" + "60000042" + // BTH (opcode 0x11, PSN 0x100), AETH NAK seq, MSN 0x42
		"00abcdef" + "c0400000000000010000000000000003" // trigger, bitmap
	if got := hex.EncodeToString(b[:len(b)-ICRCSize]); got != want {
		t.Fatalf("SACK bytes\n got %s\nwant %s", got, want)
	}
	p, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if p.SACK == nil || p.AETH == nil || p.Info.Kind != KindAck || len(p.Payload) != 0 {
		t.Fatalf("parsed %+v", p)
	}
	if g := p.SACK.Fields(); g != f {
		t.Fatalf("fields %+v, want %+v", g, f)
	}
	for i := -1; i <= SACKBits; i++ {
		want := i == 0 || i == 1 || i == 9 || i == 63 || i == 126 || i == 127
		if p.SACK.Held(i) != want {
			t.Fatalf("Held(%d) = %v", i, !want)
		}
	}
	if p.SACK.Trigger() != 0xABCDEF || SyndromeType(p.AETH.Syndrome()) != AckTypeNAK ||
		SyndromeValue(p.AETH.Syndrome()) != NAKPSNSeqErr || p.BTH.PSN() != 0x100 {
		t.Fatal("fields")
	}
	enc := encodeBoth(t, SACKSize, func(b []byte) { SACK(b).Encode(&f) })
	if !bytes.Equal(enc, b[BTHSize+AETHSize:BTHSize+AETHSize+SACKSize]) {
		t.Fatal("Encode leaves bits")
	}
}

// TestSACKLength: only an RC Acknowledge exactly SACKSize bytes longer carries the
// extension; other lengths and other opcodes stay ErrBadLength, and a plain ACK has none.
func TestSACKLength(t *testing.T) {
	b := sackPacket(5, &SACKFields{})
	ack := append(append([]byte{}, b[:BTHSize+AETHSize]...), 0, 0, 0, 0)
	if p, err := Parse(ack); err != nil || p.SACK != nil {
		t.Fatalf("plain ACK: %v %v", err, p.SACK)
	}
	for _, n := range []int{1, 4, SACKSize - 1, SACKSize + 1, SACKSize + 4} {
		x := append(append([]byte{}, b[:BTHSize+AETHSize]...), make([]byte, n+ICRCSize)...)
		if _, err := Parse(x); !errors.Is(err, ErrBadLength) {
			t.Fatalf("%d extra bytes: %v", n, err)
		}
	}
	at := buildPacket(rand.New(rand.NewPCG(1, 2)), OpRCAtomicAck, 0, 0)
	x := append(append([]byte{}, at[:len(at)-ICRCSize]...), make([]byte, SACKSize+ICRCSize)...)
	if _, err := Parse(x); !errors.Is(err, ErrBadLength) {
		t.Fatalf("atomic ACK with SACK bytes: %v", err)
	}
	uc := append([]byte{}, b...)
	uc[0] = 0x51 // RD Acknowledge: the extension is RC's only
	if _, err := Parse(uc); !errors.Is(err, ErrBadLength) {
		t.Fatalf("RD ACK with SACK bytes: %v", err)
	}
}

// FuzzSACK: a SACK parsed from arbitrary bytes never panics, and its fields re-encode to the
// same bytes (the reserved byte aside).
func FuzzSACK(f *testing.F) {
	f.Add(sackPacket(1, &SACKFields{Trigger: 3, Held: [16]byte{0xFF}}))
	f.Add(sackPacket(0xFFFFFF, &SACKFields{}))
	f.Add([]byte{0x11})
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := Parse(b)
		if err != nil || p.SACK == nil {
			return
		}
		if len(p.SACK) != SACKSize || p.Info.Kind != KindAck {
			t.Fatalf("SACK of %d bytes on %v", len(p.SACK), p.Info.Name)
		}
		fl := p.SACK.Fields()
		re := make(SACK, SACKSize)
		re.Encode(&fl)
		re[0] = p.SACK[0]
		if !bytes.Equal(re, p.SACK) {
			t.Fatalf("re-encode %x, want %x", re, p.SACK)
		}
		for i := 0; i < SACKBits; i++ {
			if p.SACK.Held(i) != (fl.Held[i/8]&(0x80>>(i%8)) != 0) {
				t.Fatalf("bit %d", i)
			}
		}
	})
}
