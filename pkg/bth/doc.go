// Package bth is the RoCEv2 wire format: zero-copy views of the InfiniBand
// transport headers (BTH and the extension headers, IBTA Vol 1 chapter 9),
// the opcode table (IBTA 9.2.1 table 36), 24-bit PSN arithmetic, the AETH
// syndrome tables, the packet parser, the invariant CRC (ICRC, IBTA Annex
// A17.3.3) including recovery of the IPv4 Identification a UDP socket cannot
// see, and the RoCEv2 UDP source port (Annex A17.3.2).
//
// Every header is a `type X []byte` view in the style of gVisor's
// pkg/tcpip/header: getters and setters read and write the bytes in place,
// an XFields struct plus Encode/Fields convert to and from plain values,
// writing every bit (reserved bits included) so that re-encoding parsed
// fields reproduces the bytes exactly. Views do not check their length: the
// caller (normally Parse) guarantees it, as gVisor does.
//
// The package uses only the standard library and allocates nothing per
// packet. See docs/wire.md.
package bth

import "encoding/binary"

var be = binary.BigEndian

// get24 reads a 24-bit big-endian value.
func get24(b []byte) uint32 { return uint32(b[0])<<16 | uint32(b[1])<<8 | uint32(b[2]) }

// put24 writes the low 24 bits of v big-endian.
func put24(b []byte, v uint32) { b[0], b[1], b[2] = byte(v>>16), byte(v>>8), byte(v) }

func b2u(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}
