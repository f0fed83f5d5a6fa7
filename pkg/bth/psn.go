package bth

// PSN is a 24-bit packet sequence number (IBTA Vol 1 9.2.9, 9.7.1) with
// wraparound arithmetic, in the style of gVisor's seqnum: comparisons use
// the signed distance, so they are meaningful for numbers less than 2^23
// apart. A PSN is always kept < 1<<24 by these methods.
type PSN uint32

// PSNMask is the mask of the 24 PSN bits.
const PSNMask = 0xFFFFFF

const psnHalf = 1 << 23

// Add returns p + n modulo 2^24.
func (p PSN) Add(n uint32) PSN { return PSN((uint32(p) + n) & PSNMask) }

// Sub returns the signed distance p - q modulo 2^24, in (-2^23, 2^23].
func (p PSN) Sub(q PSN) int32 {
	d := (uint32(p) - uint32(q)) & PSNMask
	if d > psnHalf {
		return int32(d) - (1 << 24)
	}
	return int32(d)
}

// LessThan reports whether p comes before q (p - q < 0).
func (p PSN) LessThan(q PSN) bool { return p.Sub(q) < 0 }

// LessThanEq reports whether p comes before q or equals it.
func (p PSN) LessThanEq(q PSN) bool { return p.Sub(q) <= 0 }

// InWindow reports whether p is in [first, first+size), modulo 2^24.
// size must be at most 2^24 (larger sizes are treated as 2^24).
func (p PSN) InWindow(first PSN, size uint32) bool {
	return (uint32(p)-uint32(first))&PSNMask < size
}
