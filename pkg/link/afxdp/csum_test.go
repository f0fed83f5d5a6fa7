package afxdp

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// csumRef is RFC 1071's checksum, 16 bits at a time.
func csumRef(addrs, udp []byte) uint16 {
	var s uint32
	add := func(b []byte) {
		for i := 0; i+1 < len(b); i += 2 {
			s += uint32(binary.BigEndian.Uint16(b[i:]))
		}
		if len(b)%2 == 1 {
			s += uint32(b[len(b)-1]) << 8
		}
	}
	add(addrs)
	s += 17 + uint32(len(udp))
	add(udp)
	for s>>16 != 0 {
		s = s&0xFFFF + s>>16
	}
	return ^uint16(s)
}

// TestUDP4Checksum: a datagram with its right checksum passes, so does one carrying only the
// pseudo-header's sum (checksum offload's partial value, what a local socket's frame holds on a
// veth; the value a sniffer showed for 198.18.9.1 -> 198.18.9.2, 108 bytes: 0x9ea5), and every
// single-bit change of the datagram or a wrong checksum fails; random lengths 8..4000 against
// RFC 1071's 16-bit loop.
func TestUDP4Checksum(t *testing.T) {
	addrs := []byte{198, 18, 9, 1, 198, 18, 9, 2}
	udp := make([]byte, 108)
	binary.BigEndian.PutUint16(udp[0:], 39174)
	binary.BigEndian.PutUint16(udp[2:], 4791)
	binary.BigEndian.PutUint16(udp[4:], 108)
	for i := 8; i < len(udp); i++ {
		udp[i] = 'x'
	}
	binary.BigEndian.PutUint16(udp[6:], 0x9ea5)
	if !udp4ChecksumOK(addrs, udp) {
		t.Fatal("the partial checksum a local sender leaves (0x9ea5) refused")
	}
	binary.BigEndian.PutUint16(udp[6:], 0x2da9) // the full checksum, as the sniffer computed it
	if !udp4ChecksumOK(addrs, udp) {
		t.Fatal("the right checksum 0x2da9 refused")
	}
	r := rand.New(rand.NewPCG(1, 2))
	for n := 0; n < 2000; n++ {
		l := 8 + r.IntN(4000)
		u := make([]byte, l)
		for i := range u {
			u[i] = byte(r.Uint32())
		}
		a := []byte{byte(r.Uint32()), byte(r.Uint32()), 1, 2, 3, 4, byte(r.Uint32()), 9}
		binary.BigEndian.PutUint16(u[4:], uint16(l))
		u[6], u[7] = 0, 0
		c := csumRef(a, u)
		if c == 0 {
			c = 0xFFFF
		}
		binary.BigEndian.PutUint16(u[6:], c)
		if !udp4ChecksumOK(a, u) {
			t.Fatalf("length %d: the right checksum %#04x refused", l, c)
		}
		bit := r.IntN(8 * l)
		if bit/8 == 6 || bit/8 == 7 {
			continue // the checksum field itself: below
		}
		u[bit/8] ^= 1 << (bit % 8)
		if udp4ChecksumOK(a, u) && fold(onesSum(a)+17+uint64(l)) != c {
			t.Fatalf("length %d: bit %d flipped, checksum still accepted", l, bit)
		}
		u[bit/8] ^= 1 << (bit % 8)
		binary.BigEndian.PutUint16(u[6:], c^0x0101)
		if udp4ChecksumOK(a, u) && fold(onesSum(a)+17+uint64(l)) != c^0x0101 {
			t.Fatalf("length %d: wrong checksum %#04x accepted", l, c^0x0101)
		}
	}
	if n := testing.AllocsPerRun(100, func() { udp4ChecksumOK(addrs, udp) }); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}

func BenchmarkUDP4Checksum(b *testing.B) {
	addrs := []byte{198, 18, 9, 1, 198, 18, 9, 2}
	udp := make([]byte, 2048)
	binary.BigEndian.PutUint16(udp[6:], 1)
	b.SetBytes(int64(len(udp)))
	for b.Loop() {
		udp4ChecksumOK(addrs, udp)
	}
}
