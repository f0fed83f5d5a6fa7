package testcap

import (
	"encoding/binary"
	"net/netip"

	"github.com/gopacket/gopacket/layers"
)

// IPUDP is an IPv4/UDP or IPv6/UDP datagram decoded from a frame.
type IPUDP struct {
	Src, Dst netip.Addr
	// ID and DF are IPv4's Identification and Don't Fragment (0 and false over IPv6, which
	// routers never fragment).
	ID uint16
	DF bool
	// TTL and TOS are IPv4's, or IPv6's hop limit and traffic class.
	TTL, TOS         uint8
	SrcPort, DstPort uint16
	UDPChecksum      uint16
	IP               []byte // from the IP header to the end of the UDP payload
	Payload          []byte // the UDP payload (RoCE: BTH .. ICRC)
}

// DecodeIPUDP decodes an unfragmented IPv4/UDP datagram, or an IPv6/UDP one without extension
// headers, from a record (Ethernet, raw IP, Linux cooked v1 or v2). ok is false for anything
// else. It checks every length itself, so a fuzzed or cut record never yields slices beyond
// its data.
func DecodeIPUDP(f *Record) (d IPUDP, ok bool) {
	b := f.Data
	var etherType uint16
	switch f.LinkType {
	case layers.LinkTypeEthernet:
		if len(b) < 14 {
			return d, false
		}
		etherType, b = binary.BigEndian.Uint16(b[12:14]), b[14:]
	case layers.LinkTypeLinuxSLL: // protocol type at 14, header 16 bytes
		if len(b) < 16 {
			return d, false
		}
		etherType, b = binary.BigEndian.Uint16(b[14:16]), b[16:]
	case layers.LinkTypeLinuxSLL2: // protocol type at 0, header 20 bytes
		if len(b) < 20 {
			return d, false
		}
		etherType, b = binary.BigEndian.Uint16(b[0:2]), b[20:]
	case layers.LinkTypeRaw:
		if len(b) < 1 {
			return d, false
		}
		etherType = map[byte]uint16{4: 0x0800, 6: 0x86DD}[b[0]>>4]
	case layers.LinkTypeIPv4:
		etherType = 0x0800
	case layers.LinkTypeIPv6:
		etherType = 0x86DD
	default:
		return d, false
	}
	switch etherType {
	case 0x0800:
		return decodeIPv4UDP(b)
	case 0x86DD:
		return decodeIPv6UDP(b)
	}
	return d, false
}

func decodeIPv4UDP(b []byte) (d IPUDP, ok bool) {
	if len(b) < 20 || b[0]>>4 != 4 {
		return d, false
	}
	ihl := int(b[0]&0x0F) * 4
	tot := int(binary.BigEndian.Uint16(b[2:4]))
	if ihl < 20 || tot < ihl+8 || tot > len(b) || b[9] != 17 {
		return d, false
	}
	frag := binary.BigEndian.Uint16(b[6:8])
	if frag&0x3FFF != 0 { // MF or an offset: a fragment
		return d, false
	}
	b = b[:tot]
	u := b[ihl:]
	ulen := int(binary.BigEndian.Uint16(u[4:6]))
	if ulen < 8 || ulen > len(u) {
		return d, false
	}
	d = IPUDP{
		Src: netip.AddrFrom4([4]byte(b[12:16])), Dst: netip.AddrFrom4([4]byte(b[16:20])),
		ID: binary.BigEndian.Uint16(b[4:6]), DF: frag&0x4000 != 0, TTL: b[8], TOS: b[1],
		SrcPort: binary.BigEndian.Uint16(u[0:2]), DstPort: binary.BigEndian.Uint16(u[2:4]),
		UDPChecksum: binary.BigEndian.Uint16(u[6:8]),
		IP:          b[:ihl+ulen], Payload: u[8:ulen],
	}
	return d, true
}

// decodeIPv6UDP decodes an IPv6 packet whose next header is UDP (RFC 8200 3).
func decodeIPv6UDP(b []byte) (d IPUDP, ok bool) {
	const hl = 40
	if len(b) < hl+8 || b[0]>>4 != 6 || b[6] != 17 {
		return d, false
	}
	plen := int(binary.BigEndian.Uint16(b[4:6]))
	if plen < 8 || hl+plen > len(b) {
		return d, false
	}
	u := b[hl : hl+plen]
	ulen := int(binary.BigEndian.Uint16(u[4:6]))
	if ulen < 8 || ulen > len(u) {
		return d, false
	}
	d = IPUDP{
		Src: netip.AddrFrom16([16]byte(b[8:24])), Dst: netip.AddrFrom16([16]byte(b[24:40])),
		TTL: b[7], TOS: b[0]<<4 | b[1]>>4,
		SrcPort: binary.BigEndian.Uint16(u[0:2]), DstPort: binary.BigEndian.Uint16(u[2:4]),
		UDPChecksum: binary.BigEndian.Uint16(u[6:8]),
		IP:          b[:hl+ulen], Payload: u[8:ulen],
	}
	return d, true
}
