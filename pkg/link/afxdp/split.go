package afxdp

import (
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
)

// Unsegmented UDP GSO messages ("superframes").
//
// A sender's UDP GSO message (UDP_SEGMENT: softroce's own GSO runs, link.RunSender, such as a
// polled device's [WRITE, ACK] pair) is one buffer of equal-size segments, the last one
// possibly shorter. On a real NIC the segments leave as separate packets. On a veth pair or
// loopback the buffer crosses as one skb, and the receiving kernel only segments it for a
// socket; an XDP program in the generic hook sees it whole, so this path hands the device one
// datagram holding several RoCE packets. RoCEv2 has no
// length field to find the boundaries (IBTA 9.2: the packet ends at the UDP payload's end), so
// such a datagram fails to parse as one packet (an ACK longer than an ACK) or fails its ICRC
// (the ICRC checked is the last segment's, over the wrong length).
//
// SegmentSize is the device's fallback of those two failures on the AF_XDP path (the only one
// that can see such a datagram, and the one that knows its IPv4 ID: link.Datagram.HasIPv4ID):
// it looks for the segment size s (a multiple of 4, as every RoCE packet length is) at which every
// segment start carries a BTH of the same flow (a valid opcode, TVer 0, the first packet's
// P_Key and destination QP), and accepts the first s whose segments all pass the ICRC check
// with the IPv4 ID the sender's kernel gives segment k of a GSO message, the message's ID + k
// (all 32 bits, as for any datagram whose ID is known). Each segment is then handled as a
// datagram of its own, with that ID. A datagram that is not a GSO message costs one scan of
// its 4-byte offsets (at most MaxFrame / 4) and at most maxSplitTries candidate checks
// before the drop it would have had anyway; a valid packet is never split, since the split is
// only tried after the packet as a whole failed.

// maxSplitTries bounds the candidate segment sizes whose ICRCs are checked per datagram
// (crafted input can make many offsets look like segment starts).
const maxSplitTries = 8

// minPacket is the shortest RoCE packet: a BTH and the ICRC (IBTA 9.2, A17.3.3).
const minPacket = bth.BTHSize + bth.ICRCSize

// ICRCFunc computes the ICRC of seg between ep's endpoints with IPv4 ID id (IBTA A17.3.3): the
// receiver's own, which may cache the pseudo-header's CRC state. (ep by value: a pointer given
// to a function not known at compile time would move it to the heap, once per datagram.)
type ICRCFunc func(ep bth.Endpoints, seg []byte, id uint16) uint32

// SegmentSize returns the segment size at which dg is an unsegmented GSO message (see above),
// 0 when it is not one: every segment start carries a BTH of the first packet's flow and every
// segment passes the ICRC check (icrc) with IPv4 ID dg.IPv4ID + k for segment k. The caller
// handles each segment as a datagram of its own, with that ID, without checking its ICRC again.
func SegmentSize(dg *link.Datagram, icrc ICRCFunc) int {
	b := dg.Buf
	n := len(b)
	if !dg.HasIPv4ID || n < 2*minPacket || n > MaxFrame || n%4 != 0 || !bth.Opcode(b[0]).Valid() || b[1]&0x0f != 0 {
		return 0
	}
	src, dst := dg.Src.Addr().Unmap(), dg.Dst.Addr().Unmap()
	if !src.Is4() || !dst.Is4() { // the AF_XDP path is IPv4 only
		return 0
	}
	ep := bth.Endpoints{Src: src, Dst: dst, SrcPort: dg.Src.Port(), DstPort: dg.Dst.Port()}
	tries := 0
	// the first packet's own length when its headers fix it (a polled device's pair: a WRITE
	// Only and an ACK), then every size the scan finds
	first := ExpectedLen(b)
	if first >= minPacket && first+minPacket <= n && first%4 == 0 && segmentStarts(b, first) {
		tries++
		if segmentsVerify(icrc, ep, b, first, dg.IPv4ID) {
			return first
		}
	}
	for s := (bth.Opcode(b[0]).Info().HdrLen + bth.ICRCSize + 3) &^ 3; s+minPacket <= n; s += 4 {
		if s == first || !segmentStarts(b, s) {
			continue
		}
		if tries++; tries > maxSplitTries {
			return 0
		}
		if segmentsVerify(icrc, ep, b, s, dg.IPv4ID) {
			return s
		}
	}
	return 0
}

// ExpectedLen returns the length of the RoCE packet at the start of b when its headers fix it
// (IBTA 9.2: a packet has no length field, its end is the datagram's): an opcode without
// payload (ACK, READ request, atomics: the headers and the ICRC), or with a fixed one, or an
// RDMA WRITE Only (its RETH's DMA length, padded to 4 bytes); 0 when the length is free.
func ExpectedLen(b []byte) int {
	if len(b) < bth.BTHSize {
		return 0
	}
	info := bth.Opcode(b[0]).Info()
	if !info.Valid || len(b) < info.HdrLen+bth.ICRCSize {
		return 0
	}
	switch {
	case !info.Payload:
		return info.HdrLen + bth.ICRCSize
	case info.FixedPayload > 0:
		return info.HdrLen + (info.FixedPayload+3)&^3 + bth.ICRCSize
	case info.Kind == bth.KindWrite && info.Only() && info.Hdrs&bth.HdrRETH != 0 && info.Hdrs&(bth.HdrDETH|bth.HdrXRCETH) == 0: // RETH right after the BTH
		dma := bth.RETH(b[bth.BTHSize:]).DMALen()
		if dma > MaxFrame {
			return 0
		}
		return info.HdrLen + (int(dma)+3)&^3 + bth.ICRCSize
	}
	return 0
}

// segmentStarts reports whether every multiple of s inside b (but 0) starts a BTH of the
// first packet's flow and leaves at least a minimal packet.
func segmentStarts(b []byte, s int) bool {
	for off := s; off < len(b); off += s {
		h := b[off:]
		if len(h) < minPacket || h[5] != b[5] || h[6] != b[6] || h[7] != b[7] || h[2] != b[2] || h[3] != b[3] ||
			h[1]&0x0f != 0 || !bth.Opcode(h[0]).Valid() {
			return false
		}
	}
	return true
}

// segmentsVerify reports whether every segment of size s (the last one shorter or equal)
// passes the ICRC check with its IPv4 ID, id + k for segment k (IBTA A17.3.3).
func segmentsVerify(icrc ICRCFunc, ep bth.Endpoints, b []byte, s int, id uint16) bool {
	for off := 0; off < len(b); off += s {
		seg := b[off:min(off+s, len(b))]
		if icrc(ep, seg, id) != bth.GetICRC(seg) {
			return false
		}
		id++
	}
	return true
}
