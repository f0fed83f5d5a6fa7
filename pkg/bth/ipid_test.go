package bth

import (
	"math/rand/v2"
	"net/netip"
	"testing"
)

// TestIPv4IDDelta: the pseudo-header state for any IPv4 ID is the ID-0 state XOR
// IPv4IDDelta(id), for random endpoints and lengths; and ICRCs computed from it verify.
func TestIPv4IDDelta(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	if IPv4IDDelta(0) != 0 {
		t.Fatalf("IPv4IDDelta(0) = %#x", IPv4IDDelta(0))
	}
	for i := range 2000 {
		var s, d [4]byte
		for j := range 4 {
			s[j], d[j] = byte(r.Uint32()), byte(r.Uint32())
		}
		ep := Endpoints{Src: netip.AddrFrom4(s), Dst: netip.AddrFrom4(d), SrcPort: uint16(r.Uint32()), DstPort: 4791}
		n := 20 + 4*r.IntN(1000)
		id := uint16(r.Uint32())
		if i < 16 {
			id = 1 << i // every bit alone
		}
		base := PseudoHeaderCRC(&ep, n)
		e := ep
		e.IPID = id
		if got, want := base^IPv4IDDelta(id), PseudoHeaderCRC(&e, n); got != want {
			t.Fatalf("ID %#x, length %d: %#x, want %#x", id, n, got, want)
		}
		pkt := make([]byte, n)
		BTH(pkt).Encode(&BTHFields{Opcode: OpRCAck, PKey: 0xFFFF, DestQP: 7})
		SetICRC(pkt, ICRCContinue(base^IPv4IDDelta(id), pkt))
		if !VerifyICRC(&e, pkt) || VerifyICRC(&ep, pkt) && id != 0 {
			t.Fatalf("ID %#x: the ICRC from the delta does not verify for that ID alone", id)
		}
	}
}

func BenchmarkIPv4IDDelta(b *testing.B) {
	var x uint32
	for i := 0; i < b.N; i++ {
		x ^= IPv4IDDelta(uint16(i))
	}
	sink32 = x
}

var sink32 uint32
