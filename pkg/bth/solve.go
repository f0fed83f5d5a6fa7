package bth

import (
	"math/bits"
	"sync/atomic"
)

// Recovering the IPv4 Identification.
//
// The ICRC covers the IPv4 ID, which a UDP socket never sees. CRC32 is affine
// over GF(2): for two messages of equal length that differ only in the ID,
// the CRCs differ by L(id), a linear function of the 16 ID bits, where
// L(id) = XOR of v_j over the set bits j of id, and v_j is the effect of
// flipping ID bit j: the raw CRC of that 2-byte pattern carried through the
// n bytes that follow the ID, i.e. multiplied by x^(8n) mod P. The v_j
// depend only on n, hence only on the packet length. So: compute the ICRC
// with ID 0; t = that XOR the received ICRC must lie in span{v_j}; reducing t
// by a reduced-echelon basis of that span yields the ID (or proves none
// exists). The basis is built in O(log n) (x^(8n) by squaring) and cached per
// UDP payload length in a lazily filled two-level table of atomic pointers:
// no locks on the hot path.

// crcPolyReflected is the CRC-32 (IEEE 802.3) polynomial in the reflected
// bit order Go's crc32.IEEETable uses: bit 31 is the coefficient of x^0.
const crcPolyReflected = 0xEDB88320

// polyOne is the polynomial 1 in that order.
const polyOne = 1 << 31

// mulModP returns a*b mod P in the reflected representation.
func mulModP(a, b uint32) uint32 {
	var p uint32
	for m := uint32(polyOne); m != 0 && a != 0; m >>= 1 {
		if a&m != 0 {
			p ^= b
			a &^= m
		}
		// b *= x: the x^31 coefficient (bit 0) overflows into P.
		b = b>>1 ^ (crcPolyReflected & -(b & 1))
	}
	return p
}

// xPow2k[k] = x^(2^k) mod P.
var xPow2k = func() (t [64]uint32) {
	t[0] = polyOne >> 1 // x^1
	for k := 1; k < len(t); k++ {
		t[k] = mulModP(t[k-1], t[k-1])
	}
	return t
}()

// xPow8n returns x^(8n) mod P: the operator that carries a CRC register
// difference over n zero bytes.
func xPow8n(n uint64) uint32 {
	r := uint32(polyOne)
	e := n * 8
	for k := 0; e != 0; k, e = k+1, e>>1 {
		if e&1 != 0 {
			r = mulModP(r, xPow2k[k])
		}
	}
	return r
}

// rawCRC2 returns the linear (zero initial value, no final inversion) CRC
// register after the two bytes b0 b1.
func rawCRC2(b0, b1 byte) uint32 {
	var s uint32
	for _, c := range [2]byte{b0, b1} {
		s ^= uint32(c)
		for i := 0; i < 8; i++ {
			s = s>>1 ^ (crcPolyReflected & -(s & 1))
		}
	}
	return s
}

// idBasis is a reduced row-echelon basis of span{v_0..v_15} for one length:
// each row's pivot bit appears in no other row; comb says which ID bits
// produce the row.
type idBasis struct {
	n    int
	vec  [16]uint32
	comb [16]uint16
	piv  [16]uint32
}

// idVectors returns v_j, the ICRC change when bit j of the (big-endian) IPv4
// ID flips, for a datagram whose UDP payload (BTH .. ICRC) is udpPayloadLen
// bytes long.
func idVectors(udpPayloadLen int) (v [16]uint32) {
	// Bytes covered after the ID: the rest of the IPv4 header (14), the UDP
	// header (8) and the UDP payload without the ICRC.
	after := uint64(ipv4HdrSize-ipv4IDOff-2) + udpHdrSize + uint64(udpPayloadLen-ICRCSize)
	if udpPayloadLen < ICRCSize {
		after = uint64(ipv4HdrSize-ipv4IDOff-2) + udpHdrSize
	}
	z := xPow8n(after)
	for j := 0; j < 16; j++ {
		id := uint16(1) << j
		v[j] = mulModP(rawCRC2(byte(id>>8), byte(id)), z)
	}
	return v
}

func newIDBasis(udpPayloadLen int) *idBasis {
	b := new(idBasis)
	v := idVectors(udpPayloadLen)
	for j := 0; j < 16; j++ {
		x, c := v[j], uint16(1)<<j
		for k := 0; k < b.n; k++ {
			if x&b.piv[k] != 0 {
				x ^= b.vec[k]
				c ^= b.comb[k]
			}
		}
		if x == 0 {
			continue // dependent (does not happen for CRC-32 and 16 adjacent bits)
		}
		p := uint32(1) << bits.TrailingZeros32(x)
		for k := 0; k < b.n; k++ {
			if b.vec[k]&p != 0 {
				b.vec[k] ^= x
				b.comb[k] ^= c
			}
		}
		b.vec[b.n], b.comb[b.n], b.piv[b.n] = x, c, p
		b.n++
	}
	return b
}

// solve returns the ID whose contribution is t, if t is in the span.
func (b *idBasis) solve(t uint32) (uint16, bool) {
	var id uint16
	for k := 0; k < b.n; k++ {
		if t&b.piv[k] != 0 {
			t ^= b.vec[k]
			id ^= b.comb[k]
		}
	}
	return id, t == 0
}

// basisCache[len>>8][len&0xFF] caches the basis per UDP payload length.
var basisCache [256]atomic.Pointer[[256]atomic.Pointer[idBasis]]

func basisFor(udpPayloadLen int) *idBasis {
	if udpPayloadLen < 0 || udpPayloadLen > 0xFFFF {
		return newIDBasis(udpPayloadLen)
	}
	row := basisCache[udpPayloadLen>>8].Load()
	if row == nil {
		nr := new([256]atomic.Pointer[idBasis])
		if basisCache[udpPayloadLen>>8].CompareAndSwap(nil, nr) {
			row = nr
		} else {
			row = basisCache[udpPayloadLen>>8].Load()
		}
	}
	slot := &row[udpPayloadLen&0xFF]
	b := slot.Load()
	if b == nil {
		b = newIDBasis(udpPayloadLen)
		if !slot.CompareAndSwap(nil, b) {
			b = slot.Load()
		}
	}
	return b
}

// SolveIPv4ID finds the IPv4 Identification that makes the stored ICRC of
// udpPayload match, for an IPv4 datagram with the given endpoints (ep.IPID
// is ignored). ok=false means no ID does: the packet is corrupt. The fast
// path (ID 0, what an unconnected DF socket sends) costs one CRC.
//
// The solver spends 16 of the 32 ICRC bits on the unknown ID: a corrupted
// packet is accepted with probability about 2^-16 (versus 2^-32 for a full
// check). For IPv6 (no ID) it returns (0, VerifyICRC(ep, udpPayload)).
func SolveIPv4ID(ep *Endpoints, udpPayload []byte) (id uint16, ok bool) {
	return SolveIPv4IDFor(ep, udpPayload, GetICRC(udpPayload))
}

// SolveIPv4IDFor is SolveIPv4ID against the ICRC want instead of the one udpPayload stores
// (e.g. a sender's variant ICRC unwound to the one A17.3.3 defines, pkg/roce).
func SolveIPv4IDFor(ep *Endpoints, udpPayload []byte, want uint32) (id uint16, ok bool) {
	if len(udpPayload) < BTHSize+ICRCSize {
		return 0, false
	}
	e := *ep
	e.IPID = 0
	got := ICRC(&e, udpPayload)
	if got == want {
		return 0, true
	}
	if !e.Src.Unmap().Is4() {
		return 0, false
	}
	return basisFor(len(udpPayload)).solve(got ^ want)
}
