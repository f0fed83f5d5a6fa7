package bth

import (
	"hash/crc32"
	"math/rand/v2"
	"net/netip"
	"testing"
)

// TestMulModPMatchesZeroBytes checks the polynomial arithmetic against the
// byte-wise CRC: carrying a register over n zero bytes equals multiplying by
// x^(8n).
func TestMulModPMatchesZeroBytes(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 2, 3, 7, 8, 100, 1023, 4096, 65535} {
		s := r.Uint32()
		// Raw register over n zero bytes, via the table: Update does
		// ^(table-walk(^crc)), so walk from ^s and invert back.
		want := ^crc32.Update(^s, crc32.IEEETable, make([]byte, n))
		if got := mulModP(s, xPow8n(uint64(n))); got != want {
			t.Fatalf("n=%d: mulModP %#x, table %#x", n, got, want)
		}
	}
	if mulModP(polyOne, 0x12345678) != 0x12345678 || mulModP(0x12345678, polyOne) != 0x12345678 {
		t.Fatal("1 is not the identity")
	}
}

// TestIDVectorsBruteForce checks the per-bit vectors and the solver against
// recomputing the ICRC with the ID set, for several lengths.
func TestIDVectorsBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	ep := Endpoints{Src: netip.MustParseAddr("198.19.0.1"), Dst: netip.MustParseAddr("198.19.0.2"), SrcPort: 49441, DstPort: UDPPort}
	for _, l := range []int{16, 17, 32, 60, 1000, 1084, 4124, 9000} {
		pkt := make([]byte, l)
		for i := range pkt {
			pkt[i] = byte(r.Uint32())
		}
		ep.IPID = 0
		base := ICRC(&ep, pkt)
		v := idVectors(l)
		for j := 0; j < 16; j++ {
			ep.IPID = 1 << j
			if d := ICRC(&ep, pkt) ^ base; d != v[j] {
				t.Fatalf("len %d bit %d: brute %#x, vector %#x", l, j, d, v[j])
			}
		}
		b := newIDBasis(l)
		if b.n != 16 {
			t.Fatalf("len %d: rank %d, want 16", l, b.n)
		}
		for k := 0; k < 200; k++ {
			id := uint16(r.Uint32())
			ep.IPID = id
			SetICRC(pkt, ICRC(&ep, pkt))
			got, ok := SolveIPv4ID(&ep, pkt)
			if !ok || got != id {
				t.Fatalf("len %d: SolveIPv4ID = %#x %v, want %#x", l, got, ok, id)
			}
		}
	}
}

// TestSolveIPv4IDCaptures: the solver recovers exactly the captured ID of
// every IPv4 RoCE packet, and IPv6 packets verify without one.
func TestSolveIPv4IDCaptures(t *testing.T) {
	n, nonzero := 0, 0
	for name, frames := range captureFrames(t) {
		for i := range frames {
			f := &frames[i]
			ep := endpointsOf(f)
			ep.IPID = 0xBEEF // must be ignored
			id, ok := SolveIPv4ID(&ep, f.UDPPayload)
			if !ok || id != f.IPv4ID {
				t.Fatalf("%s frame %d: SolveIPv4ID = %#04x %v, captured ID %#04x", name, f.Number, id, ok, f.IPv4ID)
			}
			n++
			if f.IPv4ID != 0 {
				nonzero++
			}
		}
	}
	if nonzero < 100 {
		t.Fatalf("only %d packets with a non-zero ID: the test does not exercise the solver", nonzero)
	}
	t.Logf("%d packets, %d with non-zero IPv4 ID recovered", n, nonzero)
}

// maskedPayloadBit reports whether bit (byte i, bit b) of the UDP payload is
// outside the ICRC: BTH byte 4 and the ICRC itself.
func maskedPayloadByte(i, n int) bool { return i == bthFECN || i >= n-ICRCSize }

// TestSolveRejectsSingleBitCorruption: flipping any single covered bit of a
// captured packet is rejected by the solver (a CRC detects every burst of up
// to 32 bits, and the ID bits cannot absorb it).
func TestSolveRejectsSingleBitCorruption(t *testing.T) {
	frames := captureFrames(t)
	for _, name := range []string{"ib_write_bw.pcap", "ib_atomic_bw_cas.pcap", "ud_pingpong.pcap", "rping.pcap"} {
		for fi := range frames[name] {
			if fi > 3 {
				break
			}
			f := &frames[name][fi]
			pkt := append([]byte(nil), f.UDPPayload...)
			ep := endpointsOf(f)
			for i := range pkt {
				if maskedPayloadByte(i, len(pkt)) {
					continue
				}
				for b := 0; b < 8; b++ {
					pkt[i] ^= 1 << b
					if id, ok := SolveIPv4ID(&ep, pkt); ok {
						t.Fatalf("%s frame %d: flip byte %d bit %d accepted with id %#x", name, f.Number, i, b, id)
					}
					pkt[i] ^= 1 << b
				}
			}
			// Ports and addresses are covered too.
			ep2 := ep
			ep2.SrcPort ^= 1
			if _, ok := SolveIPv4ID(&ep2, pkt); ok {
				t.Fatalf("%s frame %d: wrong source port accepted", name, f.Number)
			}
		}
	}
}

// TestSolveFalseAcceptRate measures how often a random multi-byte
// corruption is accepted by the solver: about 2^-16 expected (16 of the 32
// ICRC bits protect the packet), versus 0 for the full check with the known
// ID at this sample size.
func TestSolveFalseAcceptRate(t *testing.T) {
	trials := 400000
	if testing.Short() {
		trials = 60000
	}
	frames := captureFrames(t)["ib_write_bw.pcap"]
	f := &frames[0]
	ep := endpointsOf(f)
	pkt := append([]byte(nil), f.UDPPayload...)
	r := rand.New(rand.NewPCG(5, 6))
	accepted, fullAccepted := 0, 0
	for k := 0; k < trials; k++ {
		// Corrupt 8 random bytes in the covered part of the payload (after
		// the BTH: a random burst pattern wider than the CRC's guarantees).
		var save [8]struct {
			i int
			v byte
		}
		for j := range save {
			i := BTHSize + r.IntN(len(pkt)-BTHSize-ICRCSize)
			save[j].i, save[j].v = i, pkt[i]
			pkt[i] ^= byte(1 + r.IntN(255))
		}
		if _, ok := SolveIPv4ID(&ep, pkt); ok {
			accepted++
		}
		if VerifyICRC(&ep, pkt) {
			fullAccepted++
		}
		for j := len(save) - 1; j >= 0; j-- {
			pkt[save[j].i] = save[j].v
		}
	}
	rate := float64(accepted) / float64(trials)
	t.Logf("solver false-accept: %d / %d = %.2e (2^-16 = %.2e); full check: %d", accepted, trials, rate, 1.0/65536, fullAccepted)
	// Expected trials/65536 (~6 at 400k); allow a wide Poisson band.
	want := float64(trials) / 65536
	if float64(accepted) > 4*want+6 {
		t.Fatalf("solver accepted %d corrupted packets, expected about %.1f", accepted, want)
	}
	if fullAccepted > 1 {
		t.Fatalf("full ICRC check accepted %d corrupted packets", fullAccepted)
	}
}

func TestSolveIPv6AndShort(t *testing.T) {
	if _, ok := SolveIPv4ID(&Endpoints{}, make([]byte, 15)); ok {
		t.Fatal("short packet accepted")
	}
	frames := captureFrames(t)["guest-to-host-rc-ipv6.pcap"]
	f := &frames[0]
	ep := endpointsOf(f)
	if id, ok := SolveIPv4ID(&ep, f.UDPPayload); !ok || id != 0 {
		t.Fatalf("IPv6: %v %v", id, ok)
	}
	pkt := append([]byte(nil), f.UDPPayload...)
	pkt[20] ^= 1
	if _, ok := SolveIPv4ID(&ep, pkt); ok {
		t.Fatal("IPv6 corruption accepted")
	}
}
