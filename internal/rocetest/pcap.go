package rocetest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"time"
)

// ErrPcap reports a malformed or unsupported pcap file.
var ErrPcap = errors.New("rocetest: bad pcap")

// Pcap link types this reader understands.
const (
	LinkEthernet = 1   // DLT_EN10MB
	LinkRaw      = 101 // DLT_RAW (IP packets)
	LinkLinuxSLL = 113 // DLT_LINUX_SLL (tcpdump -i any)
)

// Frame is one captured frame.
type Frame struct {
	Time     time.Time
	LinkType uint32
	Data     []byte
	OrigLen  int
}

// ReadPcap reads a classic pcap file (microsecond or nanosecond, either byte order).
// A file cut short inside a record (capture still running) returns the complete frames
// read so far and no error.
func ReadPcap(r io.Reader) ([]Frame, error) {
	var gh [24]byte
	if _, err := io.ReadFull(r, gh[:]); err != nil {
		return nil, fmt.Errorf("%w: header: %v", ErrPcap, err)
	}
	var bo binary.ByteOrder
	nano := false
	switch binary.LittleEndian.Uint32(gh[0:4]) {
	case 0xa1b2c3d4:
		bo = binary.LittleEndian
	case 0xa1b23c4d:
		bo, nano = binary.LittleEndian, true
	case 0xd4c3b2a1:
		bo = binary.BigEndian
	case 0x4d3cb2a1:
		bo, nano = binary.BigEndian, true
	default:
		return nil, fmt.Errorf("%w: magic %x", ErrPcap, gh[0:4])
	}
	link := bo.Uint32(gh[20:24]) & 0x0FFFFFFF
	var frames []Frame
	for {
		var rh [16]byte
		if _, err := io.ReadFull(r, rh[:]); err != nil {
			return frames, nil // EOF or a partial record header
		}
		sec, frac := bo.Uint32(rh[0:4]), bo.Uint32(rh[4:8])
		incl, orig := bo.Uint32(rh[8:12]), bo.Uint32(rh[12:16])
		if incl > 1<<18 {
			return frames, fmt.Errorf("%w: record of %d bytes", ErrPcap, incl)
		}
		data := make([]byte, incl)
		if _, err := io.ReadFull(r, data); err != nil {
			return frames, nil
		}
		ns := int64(frac) * 1000
		if nano {
			ns = int64(frac)
		}
		frames = append(frames, Frame{Time: time.Unix(int64(sec), ns), LinkType: link, Data: data, OrigLen: int(orig)})
	}
}

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

// DecodeIPv4UDP decodes an unfragmented IPv4/UDP datagram from a frame (Ethernet, raw IP
// or Linux cooked). ok is false for anything else.
func DecodeIPv4UDP(f *Frame) (d IPv4UDP, ok bool) {
	b := f.Data
	switch f.LinkType {
	case LinkEthernet:
		if len(b) < 14 || binary.BigEndian.Uint16(b[12:14]) != 0x0800 {
			return d, false
		}
		b = b[14:]
	case LinkLinuxSLL:
		if len(b) < 16 || binary.BigEndian.Uint16(b[14:16]) != 0x0800 {
			return d, false
		}
		b = b[16:]
	case LinkRaw:
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
