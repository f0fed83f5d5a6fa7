package testcap

import (
	"encoding/binary"
	"net/netip"

	"github.com/gopacket/gopacket/layers"
)

// IPv4UDP is an IPv4/UDP datagram decoded from a frame.
type IPv4UDP struct {
	Src, Dst         netip.Addr
	ID               uint16
	DF               bool
	TTL, TOS         uint8
	SrcPort, DstPort uint16
	UDPChecksum      uint16
	IP               []byte // from the IPv4 header to the end of the UDP payload
	Payload          []byte // the UDP payload (RoCE: BTH .. ICRC)
}

// DecodeIPv4UDP decodes an unfragmented IPv4/UDP datagram from a record (Ethernet, raw IP,
// Linux cooked v1 or v2). ok is false for anything else. It checks every length itself, so
// a fuzzed or cut record never yields slices beyond its data.
func DecodeIPv4UDP(f *Record) (d IPv4UDP, ok bool) {
	b := f.Data
	switch f.LinkType {
	case layers.LinkTypeEthernet:
		if len(b) < 14 || binary.BigEndian.Uint16(b[12:14]) != 0x0800 {
			return d, false
		}
		b = b[14:]
	case layers.LinkTypeLinuxSLL: // protocol type at 14, header 16 bytes
		if len(b) < 16 || binary.BigEndian.Uint16(b[14:16]) != 0x0800 {
			return d, false
		}
		b = b[16:]
	case layers.LinkTypeLinuxSLL2: // protocol type at 0, header 20 bytes
		if len(b) < 20 || binary.BigEndian.Uint16(b[0:2]) != 0x0800 {
			return d, false
		}
		b = b[20:]
	case layers.LinkTypeRaw, layers.LinkTypeIPv4:
	default:
		return d, false
	}
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
	d = IPv4UDP{
		Src: netip.AddrFrom4([4]byte(b[12:16])), Dst: netip.AddrFrom4([4]byte(b[16:20])),
		ID: binary.BigEndian.Uint16(b[4:6]), DF: frag&0x4000 != 0, TTL: b[8], TOS: b[1],
		SrcPort: binary.BigEndian.Uint16(u[0:2]), DstPort: binary.BigEndian.Uint16(u[2:4]),
		UDPChecksum: binary.BigEndian.Uint16(u[6:8]),
		IP:          b[:ihl+ulen], Payload: u[8:ulen],
	}
	return d, true
}
