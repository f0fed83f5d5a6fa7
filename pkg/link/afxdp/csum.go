package afxdp

import (
	"encoding/binary"
	"math/bits"
)

// udp4ChecksumOK reports whether udp (an IPv4 UDP datagram, header included, its checksum
// field non-zero) from the addresses addrs (source then destination, 8 bytes) passes the UDP
// checksum as the kernel's receive path would take it (RFC 768): the ones' complement sum of
// the pseudo-header and the datagram is all ones. It also accepts a checksum field that holds
// only the pseudo-header's sum: what a sender's stack leaves for checksum offload
// (CHECKSUM_PARTIAL), which a frame from a local socket still carries when a veth or a tap
// hands it to an XDP program, and which the kernel's own receive path trusts from the skb's
// state an XDP program cannot see. A zero field (no checksum, RFC 768; what kernel rxe sends)
// is the caller's to accept.
func udp4ChecksumOK(addrs, udp []byte) bool {
	ph := onesSum(addrs) + uint64(17) + uint64(len(udp))
	if fold(ph) == binary.BigEndian.Uint16(udp[6:8]) {
		return true // the pseudo-header's sum only: checksum offload's partial value
	}
	return fold(ph+onesSum(udp)) == 0xFFFF
}

// onesSum adds b as big-endian 16-bit words (an odd last byte padded with zero) into a 64-bit
// accumulator; fold reduces it to the 16-bit ones' complement sum (RFC 1071).
func onesSum(b []byte) uint64 {
	var s, c uint64
	for len(b) >= 8 {
		s, c = bits.Add64(s, binary.BigEndian.Uint64(b), c)
		b = b[8:]
	}
	s, c = bits.Add64(s, c, 0) // the carries wrap around: 2^64 = 1 modulo 2^16 - 1
	s += c
	s = s>>32 + s&0xFFFFFFFF // < 2^33: the tail's words cannot overflow it
	for len(b) >= 2 {
		s += uint64(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		s += uint64(b[0]) << 8
	}
	return s
}

func fold(s uint64) uint16 {
	s = s>>32 + s&0xFFFFFFFF
	s = s>>32 + s&0xFFFFFFFF
	s = s>>16 + s&0xFFFF
	s = s>>16 + s&0xFFFF
	return uint16(s)
}
