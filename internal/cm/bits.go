package cm

import "encoding/binary"

var be = binary.BigEndian

// get24 reads a 24-bit big-endian value.
func get24(b []byte) uint32 { return uint32(b[0])<<16 | uint32(b[1])<<8 | uint32(b[2]) }

// put24 writes the low 24 bits of v big-endian.
func put24(b []byte, v uint32) { b[0], b[1], b[2] = byte(v>>16), byte(v>>8), byte(v) }

// bits returns the width-bit field of b whose lowest bit is at shift (bit 0 =
// least significant). IBTA tables number bits from the most significant end;
// the constants below are converted.
func bits(b byte, shift, width uint) uint8 { return uint8(b>>shift) & (1<<width - 1) }

// setBits writes the low width bits of v into b at shift, leaving other bits.
func setBits(b *byte, shift, width uint, v uint8) {
	m := byte(1<<width-1) << shift
	*b = *b&^m | (v<<shift)&m
}

func b2u(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}
