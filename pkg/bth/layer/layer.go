// Package layer adapts the RoCEv2 wire formats of package bth to gopacket.
//
// Importing this package registers LayerTypeRoCE for UDP port 4791 (IBTA Annex
// A17.2: the RoCEv2 well-known destination port), so gopacket.NewPacket on an
// Ethernet frame carrying RoCEv2 yields Ethernet / IPv4|IPv6 / UDP / RoCE
// (/ Payload) layers. Decoding is a thin wrapper around bth.Parse: the RoCE
// layer holds views into the packet bytes (no copies) and a reused RoCE value
// decodes without allocating (with gopacket.DecodingLayerParser).
//
// Layer boundaries: LayerContents is the BTH and the extension headers (IBTA
// 9.2, 9.3); LayerPayload is the message payload without the pad bytes and the
// ICRC. The pad (IBTA 9.2, PadCnt) and the 4-byte ICRC (IBTA A17.3.3) are a
// trailer that gopacket has no slot for; they are reachable through
// RoCE.Packet (Pad, ICRC) and RoCE.Trailer.
package layer

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/softroce/softroce/pkg/bth"
)

// LayerTypeID is the gopacket layer type number of LayerTypeRoCE (gopacket
// reserves 1000-1999 for applications; 1791 echoes UDP port 4791).
const LayerTypeID = 1791

// LayerTypeRoCE is the gopacket layer type of a RoCEv2 packet: the UDP payload
// from the BTH to the ICRC (IBTA Annex A17).
var LayerTypeRoCE = gopacket.RegisterLayerType(LayerTypeID, gopacket.LayerTypeMetadata{
	Name:    "RoCEv2",
	Decoder: gopacket.DecodeFunc(decodeRoCE),
})

func init() {
	layers.RegisterUDPPortLayerType(layers.UDPPort(bth.UDPPort), LayerTypeRoCE)
}

// Errors returned by this package (besides the bth sentinel errors, which
// DecodeFromBytes wraps).
var (
	// ErrNoBTH: SerializeTo was called on a RoCE whose Packet.BTH is shorter
	// than bth.BTHSize.
	ErrNoBTH = errors.New("roce layer: no BTH to serialize")
	// ErrHeaderMismatch: the extension headers present in Packet do not add
	// up to the header length the BTH opcode requires (IBTA 9.2.1 table 36).
	ErrHeaderMismatch = errors.New("roce layer: extension headers do not match the opcode")
	// ErrNotIP: FixICRC was given something that is not an IPv4 or IPv6
	// packet long enough for its own length field.
	ErrNotIP = errors.New("roce layer: not a complete IPv4/IPv6 packet")
	// ErrInconsistent: bth.Parse returned views that do not tile the packet
	// (a bug in bth; reported rather than trusted).
	ErrInconsistent = errors.New("roce layer: inconsistent parse result")
)

// RoCE is one decoded RoCEv2 packet (IBTA Annex A17; headers IBTA 9.2-9.3).
//
// Contents (LayerContents) is the BTH plus the extension headers; Payload
// (LayerPayload) is the message payload without pad and ICRC. Packet holds the
// bth views, all pointing into the decoded bytes; absent headers are nil.
type RoCE struct {
	layers.BaseLayer
	// Packet is the result of bth.Parse over the whole UDP payload.
	Packet bth.Packet
}

// LayerType returns LayerTypeRoCE.
func (r *RoCE) LayerType() gopacket.LayerType { return LayerTypeRoCE }

// CanDecode returns LayerTypeRoCE (gopacket.DecodingLayer).
func (r *RoCE) CanDecode() gopacket.LayerClass { return LayerTypeRoCE }

// NextLayerType is gopacket.LayerTypePayload when the packet carries payload
// bytes and gopacket.LayerTypeZero otherwise (ACKs, READ requests, ...).
func (r *RoCE) NextLayerType() gopacket.LayerType {
	if len(r.Payload) > 0 {
		return gopacket.LayerTypePayload
	}
	return gopacket.LayerTypeZero
}

// Trailer returns the pad bytes and the ICRC that follow the payload (a view,
// nil before a successful decode).
func (r *RoCE) Trailer() []byte {
	if r.Packet.ICRC == nil {
		return nil
	}
	all := r.Contents[:cap(r.Contents)]
	start := len(r.Contents) + len(r.Payload)
	end := start + r.Packet.Pad + bth.ICRCSize
	if end > len(all) {
		return nil
	}
	return all[start:end]
}

// DecodeFromBytes decodes data, a whole UDP payload (BTH .. ICRC), with
// bth.Parse (IBTA 9.2/9.3 checks: TVer 0, defined opcode, length covers the
// headers, pad and ICRC). On malformed input it returns bth.Parse's error
// (wrapping bth.ErrTruncated, bth.ErrBadTVer, bth.ErrUnknownOpcode, ...; use
// errors.Is), resets r and never panics. It does not allocate on success.
func (r *RoCE) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	p, err := bth.Parse(data)
	if err != nil {
		r.reset()
		if df != nil && errors.Is(err, bth.ErrTruncated) {
			df.SetTruncated()
		}
		return err
	}
	hdrEnd := len(data) - bth.ICRCSize - p.Pad - len(p.Payload)
	if hdrEnd < bth.BTHSize || hdrEnd > len(data) {
		// bth.Parse broke its own contract; refuse rather than slice out of range.
		r.reset()
		return ErrInconsistent
	}
	r.Packet = p
	r.Contents = data[:hdrEnd:len(data)]
	r.Payload = p.Payload
	return nil
}

func (r *RoCE) reset() {
	r.Packet = bth.Packet{}
	r.Contents = nil
	r.Payload = nil
}

func decodeRoCE(data []byte, p gopacket.PacketBuilder) error {
	r := &RoCE{}
	if err := r.DecodeFromBytes(data, p); err != nil {
		return err
	}
	p.AddLayer(r)
	if len(r.Payload) == 0 {
		return nil
	}
	return p.NextDecoder(gopacket.LayerTypePayload)
}

// headerViews lists the extension headers of p in wire order (IBTA 9.2,
// 9.3; the order bth.Parse uses: RDETH, DETH, XRCETH, FETH, RETH, AtomicETH,
// AETH, AtomicAckETH, ImmDt, IETH), each cut to its size (nil if absent).
func headerViews(p *bth.Packet) [10][]byte {
	cut := func(b []byte, n int) []byte {
		if len(b) < n {
			return b
		}
		return b[:n]
	}
	return [10][]byte{
		cut(p.RDETH, bth.RDETHSize),
		cut(p.DETH, bth.DETHSize),
		cut(p.XRCETH, bth.XRCETHSize),
		cut(p.FETH, bth.FETHSize),
		cut(p.RETH, bth.RETHSize),
		cut(p.AtomicETH, bth.AtomicETHSize),
		cut(p.AETH, bth.AETHSize),
		cut(p.AtomicAck, bth.AtomicAckETHSize),
		cut(p.ImmDt, bth.ImmDtSize),
		cut(p.IETH, bth.IETHSize),
	}
}

// SerializeTo writes the RoCE packet around the bytes already in b (the
// payload, serialized by the layers after this one): it prepends Packet.BTH and
// the present extension headers in wire order and appends the pad and the ICRC.
//
// With opts.FixLengths the BTH PadCnt written is set so that the payload plus
// pad is a multiple of 4 bytes (IBTA 9.2 PadCnt); otherwise the BTH PadCnt is
// used as is. The ICRC written is Packet.ICRC (4 bytes) or zero:
// opts.ComputeChecksums cannot compute it here, because the ICRC covers the IP
// and UDP headers (IBTA A17.3.3) which do not exist yet. Serialize the whole
// packet, then call FixICRC on the IP bytes (and keep the UDP checksum 0, as
// rxe does, or recompute it afterwards).
func (r *RoCE) SerializeTo(b gopacket.SerializeBuffer, opts gopacket.SerializeOptions) error {
	p := &r.Packet
	if len(p.BTH) < bth.BTHSize {
		return ErrNoBTH
	}
	info := p.BTH.Opcode().Info()
	views := headerViews(p)
	n := bth.BTHSize
	for _, v := range views {
		n += len(v)
	}
	// A CNP (RoCEv2 Annex A17.9.3) has 16 reserved bytes after the BTH, which
	// Packet has no view for: written from Contents when it holds them, else 0.
	cnpResv := 0
	if info.Transport == bth.TransportCNP && info.HdrLen == n+bth.CNPResvSize {
		cnpResv = bth.CNPResvSize
	}
	if !info.Valid || n+cnpResv != info.HdrLen {
		return fmt.Errorf("%w: opcode %v needs %d header bytes, have %d", ErrHeaderMismatch, p.BTH.Opcode(), info.HdrLen, n)
	}
	payloadLen := len(b.Bytes())
	pad := int(p.BTH.PadCnt())
	if opts.FixLengths {
		pad = (4 - payloadLen%4) % 4
	}
	hdr, err := b.PrependBytes(n + cnpResv)
	if err != nil {
		return err
	}
	off := copy(hdr, p.BTH[:bth.BTHSize])
	if cnpResv > 0 {
		resv := hdr[off : off+cnpResv]
		for i := range resv {
			resv[i] = 0
		}
		if len(r.Contents) == bth.BTHSize+cnpResv {
			copy(resv, r.Contents[bth.BTHSize:])
		}
		off += cnpResv
	}
	for _, v := range views {
		off += copy(hdr[off:], v)
	}
	if opts.FixLengths {
		bth.BTH(hdr).SetPadCnt(uint8(pad))
	}
	tail, err := b.AppendBytes(pad + bth.ICRCSize)
	if err != nil {
		return err
	}
	for i := range tail {
		tail[i] = 0
	}
	if len(p.ICRC) == bth.ICRCSize {
		copy(tail[pad:], p.ICRC)
	}
	return nil
}

// FixICRC computes the ICRC of a whole serialized RoCEv2 IP packet (IPv4 or
// IPv6 header, UDP header, BTH .. ICRC; IBTA A17.3.3) and writes it into the
// packet's last 4 bytes (as given by the IP length field). The UDP checksum
// is not updated (the ICRC masks it; rxe sends 0).
func FixICRC(ipPacket []byte) error {
	end, ok := ipEnd(ipPacket)
	if !ok {
		return ErrNotIP
	}
	v, err := bth.ICRCFromIP(ipPacket[:end])
	if err != nil {
		return err
	}
	bth.SetICRC(ipPacket[:end], v)
	return nil
}

// ipEnd returns the length of the IP packet at the start of b according to its
// own length field (IPv4 Total Length, IPv6 40 + Payload Length).
func ipEnd(b []byte) (int, bool) {
	if len(b) < 1 {
		return 0, false
	}
	var end int
	switch b[0] >> 4 {
	case 4:
		if len(b) < 20 {
			return 0, false
		}
		end = int(binary.BigEndian.Uint16(b[2:4]))
	case 6:
		if len(b) < 40 {
			return 0, false
		}
		end = 40 + int(binary.BigEndian.Uint16(b[4:6]))
	default:
		return 0, false
	}
	if end > len(b) || end < bth.ICRCSize {
		return 0, false
	}
	return end, true
}
