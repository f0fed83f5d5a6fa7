// Package testcap reads the reference pcap captures for tests: it returns, per
// frame, the IP packet, the UDP payload and the addressing a RoCEv2 receiver
// needs (including the IPv4 Identification, which the ICRC covers).
//
// Only tests import it; it decodes with gopacket/layers, which the production
// packages never do. The classic pcap container is read by a small reader here
// (gopacket/pcapgo would pull golang.org/x/net/bpf into go.mod).
package testcap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// RoCEPort is the RoCEv2 UDP destination port (IBTA Annex A17.2).
const RoCEPort = 4791

// Frame is one captured frame reduced to what RoCE tests need. Byte slices
// are private copies, safe to modify.
type Frame struct {
	Number     int        // 1-based frame number in the capture (as tshark counts)
	IP         []byte     // the IP packet (IPv4 or IPv6 header .. end), trimmed to the IP length
	IsIPv6     bool       // IP is an IPv6 packet
	UDP        bool       // the frame carries UDP (UDPPayload and ports are valid)
	UDPPayload []byte     // the UDP payload (a sub-slice of IP)
	Src, Dst   netip.Addr // IP source and destination
	SrcPort    uint16     // UDP source port
	DstPort    uint16     // UDP destination port
	IPv4ID     uint16     // IPv4 Identification (0 for IPv6)
}

// IsRoCE reports whether the frame is UDP to the RoCEv2 port.
func (f *Frame) IsRoCE() bool { return f.UDP && f.DstPort == RoCEPort }

// Read returns every IP frame of the pcap file at path (non-IP frames are
// skipped, numbering still counts them).
func Read(path string) ([]Frame, error) {
	file, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	recs, linkType, err := parsePcap(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var out []Frame
	for i, data := range recs {
		n := i + 1
		pkt := gopacket.NewPacket(data, linkType, gopacket.Default)
		var f Frame
		f.Number = n
		switch {
		case pkt.Layer(layers.LayerTypeIPv4) != nil:
			ip := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
			raw := append(append([]byte(nil), ip.Contents...), ip.Payload...)
			if int(ip.Length) <= len(raw) && ip.Length >= 20 {
				raw = raw[:ip.Length]
			}
			f.IP = raw
			f.Src, _ = netip.AddrFromSlice(ip.SrcIP.To4())
			f.Dst, _ = netip.AddrFromSlice(ip.DstIP.To4())
			f.IPv4ID = ip.Id
			if ip.Protocol == layers.IPProtocolUDP && len(raw) >= len(ip.Contents)+8 {
				f.UDP = true
				f.fillUDP(len(ip.Contents))
			}
		case pkt.Layer(layers.LayerTypeIPv6) != nil:
			ip := pkt.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
			raw := append(append([]byte(nil), ip.Contents...), ip.Payload...)
			if 40+int(ip.Length) <= len(raw) {
				raw = raw[:40+int(ip.Length)]
			}
			f.IP = raw
			f.IsIPv6 = true
			f.Src, _ = netip.AddrFromSlice(ip.SrcIP.To16())
			f.Dst, _ = netip.AddrFromSlice(ip.DstIP.To16())
			if ip.NextHeader == layers.IPProtocolUDP && len(raw) >= 48 {
				f.UDP = true
				f.fillUDP(40)
			}
		default:
			continue
		}
		out = append(out, f)
	}
	return out, nil
}

func (f *Frame) fillUDP(off int) {
	u := f.IP[off:]
	f.SrcPort = uint16(u[0])<<8 | uint16(u[1])
	f.DstPort = uint16(u[2])<<8 | uint16(u[3])
	l := int(uint16(u[4])<<8 | uint16(u[5]))
	if l < 8 || l > len(u) {
		l = len(u)
	}
	f.UDPPayload = u[8:l]
}

// ReadRoCE returns only the RoCEv2 frames (UDP to port 4791) of the capture.
func ReadRoCE(path string) ([]Frame, error) {
	all, err := Read(path)
	if err != nil {
		return nil, err
	}
	var out []Frame
	for _, f := range all {
		if f.IsRoCE() {
			out = append(out, f)
		}
	}
	return out, nil
}

// Files returns the sorted *.pcap files of dir.
func Files(dir string) ([]string, error) {
	m, err := filepath.Glob(filepath.Join(dir, "*.pcap"))
	if err != nil {
		return nil, err
	}
	sort.Strings(m)
	return m, nil
}

// parsePcap splits a classic libpcap file (either byte order, micro- or
// nanosecond magic) into its records.
func parsePcap(b []byte) (recs [][]byte, lt layers.LinkType, err error) {
	if len(b) < 24 {
		return nil, 0, errors.New("pcap: short file header")
	}
	var bo binary.ByteOrder
	switch binary.LittleEndian.Uint32(b) {
	case 0xA1B2C3D4, 0xA1B23C4D:
		bo = binary.LittleEndian
	case 0xD4C3B2A1, 0x4D3CB2A1:
		bo = binary.BigEndian
	default:
		return nil, 0, errors.New("pcap: not a classic pcap file")
	}
	lt = layers.LinkType(bo.Uint32(b[20:24]))
	off := 24
	for off+16 <= len(b) {
		incl := int(bo.Uint32(b[off+8:]))
		off += 16
		if incl < 0 || off+incl > len(b) {
			return nil, 0, errors.New("pcap: truncated record")
		}
		recs = append(recs, append([]byte(nil), b[off:off+incl]...))
		off += incl
	}
	return recs, lt, nil
}
