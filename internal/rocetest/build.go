// Package rocetest crafts and matches RoCEv2 packets for interop and conformance tests
// (test/interop, and the conformance bench pkg/conform). Every header goes through
// pkg/bth; nothing here is on a data path, so clarity wins over allocation counts.
//
// Style (gVisor packetimpact): a Spec describes a packet to send, zero fields take
// defaults; an Expect describes a packet to wait for, nil fields match anything.
package rocetest

import (
	"errors"
	"fmt"

	"github.com/softroce/softroce/pkg/bth"
)

// DefaultPKey is the default partition key (IBTA 10.9.1.1), the only one rxe accepts.
const DefaultPKey = 0xFFFF

// Spec describes one RoCEv2 packet (UDP payload: BTH, extension headers, payload, pad,
// ICRC). Extension headers the opcode carries (IBTA 9.2.1 table 36 via bth.OpInfo) are
// written from the matching field, zero when the field is nil.
type Spec struct {
	Opcode bth.Opcode
	SE     bool
	AckReq bool
	// PKey 0 means DefaultPKey.
	PKey   uint16
	DestQP uint32
	PSN    bth.PSN

	FETH      *bth.FETHFields      // IBTA 1.5 A19.4.1 (FLUSH)
	RETH      *bth.RETHFields      // IBTA 9.3.3
	AETH      *bth.AETHFields      // IBTA 9.3.5
	AtomicETH *bth.AtomicETHFields // IBTA 9.3.4
	AtomicAck *bth.AtomicAckETHFields
	DETH      *bth.DETHFields // IBTA 9.3.2
	Imm       uint32          // ImmDt (IBTA 9.3.7), if the opcode has one
	IETH      uint32          // R_Key to invalidate (IBTA 9.3.8), if the opcode has one

	Payload []byte

	// CorruptICRC flips bits of the computed ICRC (negative tests: the receiver must drop).
	CorruptICRC bool

	// Negative-test knobs (conformance bench). Zero values build a well-formed packet.

	// TVer is the BTH transport header version (IBTA 9.2: must be 0).
	TVer uint8
	// PadCnt, when set, overrides the pad count written in the BTH (IBTA 9.2.5); the
	// pad bytes actually appended stay those the payload length needs.
	PadCnt *uint8
	// FECN, BECN and MigReq set those BTH bits (IBTA 9.2; FECN/BECN are masked out of the ICRC).
	FECN, BECN, MigReq bool
	// Mutate, if set, edits the packet (BTH .. ICRC placeholder) before the ICRC is computed
	// and returns it, possibly shorter or longer (truncated or padded packets whose ICRC is
	// still right, so only the rule under test is broken). The ICRC goes into the last 4
	// bytes of what Mutate returns (nothing is written if it returns fewer than 4 bytes).
	Mutate func(pkt []byte) []byte
	// ICRCIPID, if nonzero, computes the ICRC as if the IPv4 Identification were this
	// value instead of ep.IPID (negative tests: the wire carries ep.IPID).
	ICRCIPID uint16
	// ICRC, if set, computes the ICRC instead of bth.ICRC (a peer's own variant, such as
	// RxeFlushICRC); CorruptICRC still applies to its result.
	ICRC func(ep *bth.Endpoints, pkt []byte) uint32
}

// ErrSpec reports a Spec that cannot be built (unknown opcode, unsupported header).
var ErrSpec = errors.New("rocetest: bad packet spec")

// Append builds the packet onto dst and returns the extended slice. ep gives the IP/UDP
// fields the ICRC covers (IBTA A17.3.3); for packets sent from an unconnected DF UDP
// socket ep.IPID must be 0 (what Linux writes on the wire).
func (s *Spec) Append(dst []byte, ep *bth.Endpoints) ([]byte, error) {
	info := s.Opcode.Info()
	if !info.Valid {
		return dst, fmt.Errorf("%w: opcode %v", ErrSpec, s.Opcode)
	}
	if !info.Payload && len(s.Payload) > 0 {
		return dst, fmt.Errorf("%w: %v carries no payload", ErrSpec, s.Opcode)
	}
	start := len(dst)
	pad := (4 - len(s.Payload)%4) % 4
	total := info.HdrLen + len(s.Payload) + pad + bth.ICRCSize
	dst = append(dst, make([]byte, total)...)
	pkt := dst[start:]

	pkey := s.PKey
	if pkey == 0 {
		pkey = DefaultPKey
	}
	padCnt := uint8(pad)
	if s.PadCnt != nil {
		padCnt = *s.PadCnt
	}
	bth.BTH(pkt).Encode(&bth.BTHFields{
		Opcode: s.Opcode, SE: s.SE, MigReq: s.MigReq, PadCnt: padCnt, TVer: s.TVer, PKey: pkey,
		FECN: s.FECN, BECN: s.BECN, DestQP: s.DestQP, AckReq: s.AckReq, PSN: s.PSN,
	})
	off := bth.BTHSize
	// Extension headers in wire order (IBTA 9.2.1 table 36; DETH first for UD, FLUSH's
	// FETH before its RETH).
	for _, h := range []bth.Hdr{bth.HdrDETH, bth.HdrFETH, bth.HdrRETH, bth.HdrAtomicETH,
		bth.HdrAETH, bth.HdrAtomicAckETH, bth.HdrImmDt, bth.HdrIETH} {
		if info.Hdrs&h == 0 {
			continue
		}
		b := pkt[off:]
		switch h {
		case bth.HdrDETH:
			if s.DETH != nil {
				bth.DETH(b).Encode(s.DETH)
			}
			off += bth.DETHSize
		case bth.HdrFETH:
			if s.FETH != nil {
				bth.FETH(b).Encode(s.FETH)
			}
			off += bth.FETHSize
		case bth.HdrRETH:
			if s.RETH != nil {
				bth.RETH(b).Encode(s.RETH)
			}
			off += bth.RETHSize
		case bth.HdrAtomicETH:
			if s.AtomicETH != nil {
				bth.AtomicETH(b).Encode(s.AtomicETH)
			}
			off += bth.AtomicETHSize
		case bth.HdrAETH:
			if s.AETH != nil {
				bth.AETH(b).Encode(s.AETH)
			}
			off += bth.AETHSize
		case bth.HdrAtomicAckETH:
			if s.AtomicAck != nil {
				bth.AtomicAckETH(b).Encode(s.AtomicAck)
			}
			off += bth.AtomicAckETHSize
		case bth.HdrImmDt:
			bth.ImmDt(b).SetImm(s.Imm)
			off += bth.ImmDtSize
		case bth.HdrIETH:
			bth.IETH(b).SetRKey(s.IETH)
			off += bth.IETHSize
		}
	}
	if off != info.HdrLen {
		return dst[:start], fmt.Errorf("%w: %v has headers rocetest cannot build (%d of %d bytes)", ErrSpec, s.Opcode, off, info.HdrLen)
	}
	copy(pkt[off:], s.Payload)
	if s.Mutate != nil {
		m := s.Mutate(append([]byte(nil), pkt...))
		dst = append(dst[:start], m...)
		pkt = dst[start:]
		if len(pkt) < bth.ICRCSize {
			return dst, nil
		}
	}
	if s.ICRCIPID != 0 {
		e := *ep
		e.IPID = s.ICRCIPID
		ep = &e
	}
	var v uint32
	if s.ICRC != nil {
		v = s.ICRC(ep, pkt)
	} else {
		v = bth.ICRC(ep, pkt)
	}
	if s.CorruptICRC {
		v ^= 0x5A5A5A5A
	}
	bth.SetICRC(pkt, v)
	return dst, nil
}

// Segment is one packet of a multi-packet message.
type Segment struct {
	Opcode bth.Opcode
	Off    int // offset in the message
	Len    int
}

// SegmentSend splits an RC SEND of msgLen bytes into packets of at most mtu payload bytes
// (IBTA 9.7.2: First/Middle/Last, or Only; a zero-length message is one Only packet).
func SegmentSend(msgLen, mtu int) []Segment {
	return segment(msgLen, mtu, bth.OpRCSendOnly, bth.OpRCSendFirst, bth.OpRCSendMiddle, bth.OpRCSendLast)
}

func segment(msgLen, mtu int, only, first, middle, last bth.Opcode) []Segment {
	if msgLen <= mtu {
		return []Segment{{Opcode: only, Len: msgLen}}
	}
	var segs []Segment
	for off := 0; off < msgLen; off += mtu {
		n := min(mtu, msgLen-off)
		op := middle
		switch {
		case off == 0:
			op = first
		case off+n == msgLen:
			op = last
		}
		segs = append(segs, Segment{Opcode: op, Off: off, Len: n})
	}
	return segs
}
