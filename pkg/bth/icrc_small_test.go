package bth

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// TestICRCContinueMatchesCRC32: ICRCContinue (byte-wise head and short rests, crc32.Update
// for longer ones) equals crc32.Update over the masked UDP payload (IBTA A17.3.3: BTH byte 4
// as ones, the ICRC field not covered) for every length from 0 to 200 bytes, both sides of
// the 16-byte cutoff, from random states.
func TestICRCContinueMatchesCRC32(t *testing.T) {
	r := rand.New(rand.NewPCG(60, 61))
	for n := 0; n <= 200; n++ {
		for k := 0; k < 8; k++ {
			p := make([]byte, n)
			for i := range p {
				p[i] = byte(r.Uint32())
			}
			state := r.Uint32()
			want := state
			if c := n - ICRCSize; c > 0 {
				m := append([]byte(nil), p[:c]...)
				if c > bthFECN {
					m[bthFECN] = 0xFF
				}
				want = crc32.Update(state, crc32.IEEETable, m)
			}
			if got := ICRCContinue(state, p); got != want {
				t.Fatalf("%d bytes from state %#x: %#x, want %#x", n, state, got, want)
			}
		}
	}
}
