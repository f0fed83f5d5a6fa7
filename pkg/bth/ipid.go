package bth

// IPv4IDDelta returns what turns the PseudoHeaderCRC state of an IPv4 datagram with
// Identification 0 into the state for Identification id, by XOR:
//
//	PseudoHeaderCRC(ep with IPID id, n) == PseudoHeaderCRC(ep with IPID 0, n) ^ IPv4IDDelta(id)
//
// for every IPv4 ep and length n. CRC32 is affine over GF(2) (solve.go), and the ID sits at a
// fixed distance from the pseudo-header's end (14 more bytes of the IPv4 header, 8 of the UDP
// header), so the difference is the raw CRC of the ID bytes carried through those 22 zero
// bytes, whatever the addresses, ports and length. A receiver that knows each datagram's ID
// (the AF_XDP path) or a sender that knows the ID its kernel will write (a connected socket)
// keeps one cached state per flow and length for all IDs (IBTA A17.3.3).
func IPv4IDDelta(id uint16) uint32 { return idDeltaHi[id>>8] ^ idDeltaLo[byte(id)] }

// ipv4IDTail is the number of pseudo-header bytes after the IPv4 ID.
const ipv4IDTail = ipv4HdrSize - ipv4IDOff - 2 + udpHdrSize

var idDeltaHi, idDeltaLo = func() (hi, lo [256]uint32) {
	var b [2 + ipv4IDTail]byte
	for v := range 256 {
		b[0], b[1] = byte(v), 0
		hi[v] = ^crcSmall(0xFFFFFFFF, b[:]) // the raw CRC from a zero register
		b[0], b[1] = 0, byte(v)
		lo[v] = ^crcSmall(0xFFFFFFFF, b[:])
	}
	return
}()
