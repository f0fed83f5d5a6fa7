package bth

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"net/netip"
)

// ICRCSize is the size of the invariant CRC that ends every packet.
const ICRCSize = 4

// Endpoints is the part of the IP and UDP headers the ICRC covers and a UDP
// socket knows (IBTA Annex A17.3.3). Src and Dst are both IPv4 (4-byte or
// IPv4-mapped) or both IPv6; Src decides.
//
// For IPv4 the covered header is rebuilt as the one Linux writes for a
// RoCEv2 datagram: version 4, IHL 5, DF set, fragment offset 0, protocol UDP,
// no options, with Identification = IPID. Other IP headers (options,
// fragments) can only be checked with ICRCFromIP on the whole packet.
type Endpoints struct {
	Src, Dst         netip.Addr // IP source and destination
	SrcPort, DstPort uint16     // UDP ports
	IPID             uint16     // IPv4 Identification (covered by the ICRC); 0 for our own sends
}

// Equal reports whether e and o are the same endpoints. It is == spelled out field by field:
// the struct has padding, so == calls the generated equality function, where this compares
// in line (the data path's pseudo-header caches ask it for every packet).
func (e *Endpoints) Equal(o *Endpoints) bool {
	return e.SrcPort == o.SrcPort && e.DstPort == o.DstPort && e.IPID == o.IPID && e.Src == o.Src && e.Dst == o.Dst
}

// ErrNotRoCEIP is returned by ICRCFromIP for input that is not an IPv4 or
// IPv6 packet carrying UDP directly.
var ErrNotRoCEIP = errors.New("bth: not an IPv4/IPv6 UDP packet")

const (
	ipv4HdrSize = 20
	ipv6HdrSize = 40
	udpHdrSize  = 8
	ipv4IDOff   = 4
	ipv4DF      = 0x4000
	protoUDP    = 17
)

// lrhMaskCRC is the CRC32 state after the 8 bytes of 0xFF that stand for the
// LRH, which RoCEv2 does not carry (IBTA A17.3.3: "the LRH is replaced by 64
// bits of 1s").
var lrhMaskCRC = crc32.Update(0, crc32.IEEETable, []byte{0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF})

// buildPseudo writes the masked IP and UDP headers the ICRC covers into buf
// and returns their length (28 for IPv4, 48 for IPv6), IBTA A17.3.3:
// IPv4 TOS, TTL and header checksum, IPv6 traffic class, flow label and hop
// limit, and the UDP checksum are replaced by ones.
func buildPseudo(buf *[ipv6HdrSize + udpHdrSize]byte, ep *Endpoints, udpPayloadLen int) int {
	src, dst := ep.Src.Unmap(), ep.Dst.Unmap()
	ulen := uint16(udpHdrSize + udpPayloadLen)
	var u []byte
	n := 0
	if src.Is4() {
		h := buf[:ipv4HdrSize]
		h[0] = 0x45
		h[1] = 0xFF // TOS
		binary.BigEndian.PutUint16(h[2:], ipv4HdrSize+ulen)
		binary.BigEndian.PutUint16(h[ipv4IDOff:], ep.IPID)
		binary.BigEndian.PutUint16(h[6:], ipv4DF)
		h[8] = 0xFF // TTL
		h[9] = protoUDP
		h[10], h[11] = 0xFF, 0xFF // header checksum
		s, d := as4(src), as4(dst)
		copy(h[12:16], s[:])
		copy(h[16:20], d[:])
		u = buf[ipv4HdrSize : ipv4HdrSize+udpHdrSize]
		n = ipv4HdrSize + udpHdrSize
	} else {
		h := buf[:ipv6HdrSize]
		h[0], h[1], h[2], h[3] = 0x6F, 0xFF, 0xFF, 0xFF // version 6, traffic class, flow label
		binary.BigEndian.PutUint16(h[4:], ulen)
		h[6] = protoUDP
		h[7] = 0xFF // hop limit
		s, d := src.As16(), dst.As16()
		copy(h[8:24], s[:])
		copy(h[24:40], d[:])
		u = buf[ipv6HdrSize:]
		n = ipv6HdrSize + udpHdrSize
	}
	binary.BigEndian.PutUint16(u[0:], ep.SrcPort)
	binary.BigEndian.PutUint16(u[2:], ep.DstPort)
	binary.BigEndian.PutUint16(u[4:], ulen)
	u[6], u[7] = 0xFF, 0xFF // UDP checksum
	return n
}

// as4 is Addr.As4 without its panic: a mixed-family Endpoints (a caller
// bug) gives zeros and a failing ICRC rather than a crash.
func as4(a netip.Addr) [4]byte {
	if !a.Is4() {
		return [4]byte{}
	}
	return a.As4()
}

// PseudoHeaderCRC returns the CRC32 state after the 8 bytes of ones, the
// masked IP header and the masked UDP header of a datagram with the given
// endpoints and UDP payload length (BTH .. ICRC). The state depends only on
// (ep, udpPayloadLen): the data path may cache it per flow and length and
// finish each packet with ICRCContinue.
func PseudoHeaderCRC(ep *Endpoints, udpPayloadLen int) uint32 {
	var buf [ipv6HdrSize + udpHdrSize]byte
	n := buildPseudo(&buf, ep, udpPayloadLen)
	return crcSmall(lrhMaskCRC, buf[:n])
}

// crcSmall is crc32.Update for short stack buffers: crc32.Update calls
// through a function variable, so a buffer passed to it escapes to the
// heap; this byte-wise loop keeps the pseudo-header on the stack.
func crcSmall(crc uint32, p []byte) uint32 {
	tab := crc32.IEEETable
	crc = ^crc
	for _, b := range p {
		crc = tab[byte(crc)^b] ^ crc>>8
	}
	return ^crc
}

// ICRCContinue continues a PseudoHeaderCRC state over the UDP payload: the
// BTH with byte 4 (FECN, BECN, reserved) replaced by ones, then everything up
// to, not including, the last 4 bytes (the ICRC). It returns the ICRC value
// (as GetICRC reads it). Input shorter than a BTH is covered as it is.
//
// The BTH's first bytes are folded in byte by byte and so is a rest shorter than
// crcTableCutoff: each crc32.Update call costs a sync.OnceFunc check and two indirect calls
// before it reaches the same table loop for inputs that short, more than the few table steps
// (an 8-byte WRITE latency test's ACKs: one call for all of its 16 bytes, instead of three).
func ICRCContinue(state uint32, udpPayload []byte) uint32 {
	n := len(udpPayload) - ICRCSize
	if n <= bthFECN {
		if n > 0 {
			state = crcSmall(state, udpPayload[:n])
		}
		return state
	}
	tab := crc32.IEEETable
	crc := ^state
	for _, b := range udpPayload[:bthFECN] {
		crc = tab[byte(crc)^b] ^ crc>>8
	}
	crc = tab[^byte(crc)] ^ crc>>8 // BTH byte 4 (FECN, BECN, reserved) as ones
	rest := udpPayload[bthFECN+1 : n]
	if len(rest) >= crcTableCutoff {
		return crc32.Update(^crc, tab, rest)
	}
	for _, b := range rest {
		crc = tab[byte(crc)^b] ^ crc>>8
	}
	return ^crc
}

// crcTableCutoff: hash/crc32 computes inputs shorter than this with the one-table loop too
// (its slicing-by-8 starts at 16 bytes, its carry-less multiply at 64).
const crcTableCutoff = 16

// ICRC computes the ICRC of a RoCEv2 datagram (IBTA Annex A17.3.3; Linux
// rxe_icrc.c): CRC32 (IEEE 802.3) over 8 bytes of ones, the masked IP and
// UDP headers built from ep, the BTH with byte 4 masked, and the rest of
// udpPayload except its last 4 bytes (the ICRC field, not read).
func ICRC(ep *Endpoints, udpPayload []byte) uint32 {
	return ICRCContinue(PseudoHeaderCRC(ep, len(udpPayload)), udpPayload)
}

// SetICRC writes v little-endian into the last 4 bytes of udpPayload, as
// RoCEv2 stores it. Shorter input is left unchanged.
func SetICRC(udpPayload []byte, v uint32) {
	if len(udpPayload) >= ICRCSize {
		binary.LittleEndian.PutUint32(udpPayload[len(udpPayload)-ICRCSize:], v)
	}
}

// GetICRC reads the ICRC stored (little-endian) in the last 4 bytes of
// udpPayload; 0 for shorter input.
func GetICRC(udpPayload []byte) uint32 {
	if len(udpPayload) < ICRCSize {
		return 0
	}
	return binary.LittleEndian.Uint32(udpPayload[len(udpPayload)-ICRCSize:])
}

// VerifyICRC reports whether the stored ICRC matches the one computed with ep
// (including ep.IPID for IPv4). Input shorter than a BTH and ICRC fails.
func VerifyICRC(ep *Endpoints, udpPayload []byte) bool {
	if len(udpPayload) < BTHSize+ICRCSize {
		return false
	}
	return ICRC(ep, udpPayload) == GetICRC(udpPayload)
}

// ICRCFromIP computes the ICRC of a captured IP packet (IPv4 or IPv6 header,
// UDP header, RoCEv2 payload ending in the ICRC), masking the fields of
// IBTA A17.3.3 in place of the real ones. It covers the IP header as it is
// (IPv4 options and the real flags included) and the UDP payload the UDP
// length field gives. Compare the result with GetICRC of the UDP payload.
func ICRCFromIP(ip []byte) (computed uint32, err error) {
	if len(ip) < 1 {
		return 0, ErrTruncated
	}
	var hdr [60 + udpHdrSize]byte
	var hl, total int
	switch ip[0] >> 4 {
	case 4:
		hl = int(ip[0]&0x0F) * 4
		if hl < ipv4HdrSize {
			return 0, ErrNotRoCEIP
		}
		if len(ip) < hl+udpHdrSize {
			return 0, ErrTruncated
		}
		if ip[9] != protoUDP {
			return 0, ErrNotRoCEIP
		}
		total = int(binary.BigEndian.Uint16(ip[2:]))
		copy(hdr[:], ip[:hl+udpHdrSize])
		hdr[1] = 0xFF
		hdr[8] = 0xFF
		hdr[10], hdr[11] = 0xFF, 0xFF
	case 6:
		hl = ipv6HdrSize
		if len(ip) < hl+udpHdrSize {
			return 0, ErrTruncated
		}
		if ip[6] != protoUDP {
			return 0, ErrNotRoCEIP
		}
		total = ipv6HdrSize + int(binary.BigEndian.Uint16(ip[4:]))
		copy(hdr[:], ip[:hl+udpHdrSize])
		hdr[0] |= 0x0F
		hdr[1], hdr[2], hdr[3] = 0xFF, 0xFF, 0xFF
		hdr[7] = 0xFF
	default:
		return 0, ErrNotRoCEIP
	}
	if total > len(ip) || total < hl+udpHdrSize {
		return 0, ErrTruncated
	}
	ulen := int(binary.BigEndian.Uint16(ip[hl+4:]))
	if ulen < udpHdrSize+ICRCSize || hl+ulen > total {
		return 0, ErrTruncated
	}
	hdr[hl+6], hdr[hl+7] = 0xFF, 0xFF
	state := crcSmall(lrhMaskCRC, hdr[:hl+udpHdrSize])
	return ICRCContinue(state, ip[hl+udpHdrSize:hl+ulen]), nil
}

// RxeFlushICRC is the ICRC kernel rxe (6.2 up to at least 6.12) puts on, and expects of, an RC
// FLUSH whose A17.3.3 ICRC is icrc: rxe's opcode table gives the FLUSH no payload offset, so
// its CRC goes on over the packet's headers (udpPayload up to, not including, the ICRC field)
// a second time, unmasked. ICRCUnwind over the same bytes undoes it (pkg/roce, rxeflush.go).
func RxeFlushICRC(icrc uint32, udpPayload []byte) uint32 {
	if len(udpPayload) < ICRCSize {
		return icrc
	}
	return crc32.Update(icrc, crc32.IEEETable, udpPayload[:len(udpPayload)-ICRCSize])
}

// crcTopIndex maps the top byte of an IEEE CRC32 table entry to its index: the 256 entries'
// top bytes are distinct, which makes CRC32's byte step invertible.
var crcTopIndex = func() (t [256]uint8) {
	for i, v := range crc32.IEEETable {
		t[v>>24] = uint8(i)
	}
	return t
}()

// ICRCUnwind undoes crc32.Update (IEEE) over p: it returns the one v for which
// crc32.Update(v, crc32.IEEETable, p) == crc. A CRC register's step over a byte is a bijection,
// so the register before p follows from the register after it, byte by byte from the end.
// Kernel rxe's FLUSH ICRC is the A17.3.3 ICRC continued over the packet's headers a second
// time (pkg/roce, rxeflush.go): unwinding those headers gives the ICRC to check.
func ICRCUnwind(crc uint32, p []byte) uint32 {
	tab := crc32.IEEETable
	r := ^crc
	for i := len(p) - 1; i >= 0; i-- {
		idx := crcTopIndex[r>>24]
		r = (r^tab[idx])<<8 | uint32(idx^p[i])
	}
	return ^r
}
