// Package testcap reads pcap and pcapng captures for tests: the reference captures of
// testdata/captures and the captures the interop suite takes in the lab. Read returns, per
// frame, the IP packet, the UDP payload and the addressing a RoCEv2 receiver needs
// (including the IPv4 Identification, which the ICRC covers); ReadStream returns the raw
// records of a capture that may still be growing, and DecodeIPUDP takes one apart.
//
// Only tests import it. The containers are read by gopacket's pcapgo, the frames decoded by
// gopacket/layers; the production packages never do either (softroce decode has its own
// bounded reader for captures it cannot trust).
package testcap

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
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

// Read returns every IP frame of the pcap or pcapng file at path (non-IP frames are
// skipped, numbering still counts them).
func Read(path string) ([]Frame, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	recs, err := readAll(file, false)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var out []Frame
	for i, rec := range recs {
		pkt := gopacket.NewPacket(rec.Data, rec.LinkType, gopacket.Default)
		f := Frame{Number: i + 1}
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

// ErrCapture reports a stream that is not a pcap or pcapng capture.
var ErrCapture = errors.New("testcap: not a pcap or pcapng capture")

// Record is one captured frame as the capture holds it.
type Record struct {
	Time     time.Time
	LinkType layers.LinkType
	Data     []byte
	OrigLen  int
}

// ReadStream returns the records of a pcap or pcapng stream. A stream cut short inside a
// record (tcpdump still writing) yields the complete records read so far and no error.
func ReadStream(r io.Reader) ([]Record, error) { return readAll(r, true) }

// readAll reads every record; cut says whether a stream ending inside a record is accepted.
func readAll(r io.Reader, cut bool) ([]Record, error) {
	br := bufio.NewReader(r)
	magic, _ := br.Peek(4)
	if len(magic) < 4 {
		return nil, ErrCapture
	}
	var (
		src  gopacket.ZeroCopyPacketDataSource
		link func(gopacket.CaptureInfo) layers.LinkType
	)
	if string(magic) == "\x0a\x0d\x0d\x0a" {
		ng, err := pcapgo.NewNgReader(br, pcapgo.NgReaderOptions{WantMixedLinkType: true})
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrCapture, err)
		}
		src = ng
		link = func(ci gopacket.CaptureInfo) layers.LinkType {
			iface, err := ng.Interface(ci.InterfaceIndex)
			if err != nil {
				return 0
			}
			return iface.LinkType
		}
	} else {
		pr, err := pcapgo.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrCapture, err)
		}
		src = pr
		link = func(gopacket.CaptureInfo) layers.LinkType { return pr.LinkType() }
	}
	var out []Record
	for {
		data, ci, err := src.ZeroCopyReadPacketData()
		if err == io.EOF || (cut && errors.Is(err, io.ErrUnexpectedEOF)) {
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("record %d: %w", len(out)+1, err)
		}
		out = append(out, Record{Time: ci.Timestamp, LinkType: link(ci), Data: append([]byte(nil), data...), OrigLen: ci.Length})
	}
}
