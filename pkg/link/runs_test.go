package link

import (
	"net/netip"
	"testing"
)

// TestRunRule checks the grouping rule: same Src/Dst, same length except a shorter last one,
// at most MaxRunSegments datagrams and MaxRunBytes bytes.
func TestRunRule(t *testing.T) {
	a := netip.MustParseAddrPort("198.18.0.1:4791")
	b := netip.MustParseAddrPort("198.18.0.2:4791")
	c := netip.MustParseAddrPort("198.18.0.2:4792")
	var r RunRule
	steps := []struct {
		n        int
		src, dst netip.AddrPort
		want     int
	}{
		{1000, a, b, 0}, {1000, a, b, 1}, {1000, a, b, 2},
		{300, a, b, 3}, // shorter: joins and closes the run
		{300, a, b, 0}, // after a short one: new run
		{300, a, b, 1},
		{400, a, b, 0}, // longer: new run
		{400, a, c, 0}, // other destination
		{400, b, c, 0}, // other source
		{0, b, c, 0},   // empty datagrams never join
		{0, b, c, 0},
		{400, b, c, 0},
	}
	for i, s := range steps {
		if got := r.Join(s.n, s.src, s.dst); got != s.want {
			t.Fatalf("step %d (%d bytes): index %d, want %d", i, s.n, got, s.want)
		}
	}
	r.Reset()
	for k := 0; k < MaxRunSegments+1; k++ {
		want := k % MaxRunSegments
		if got := r.Join(100, a, b); got != want {
			t.Fatalf("segment %d: index %d, want %d (64-segment limit)", k, got, want)
		}
	}
	r.Reset()
	// 15 x 4128 = 61920 fits; a 16th would pass 65507.
	for k := 0; k < 16; k++ {
		if got := r.Join(4128, a, b); got != k%15 {
			t.Fatalf("segment %d: index %d, want %d (byte limit)", k, got, k%15)
		}
	}
}

func TestValidRuns(t *testing.T) {
	a := netip.MustParseAddrPort("127.0.0.1:4791")
	b := netip.MustParseAddrPort("127.0.0.2:4791")
	mk := func(sizes ...int) []Datagram {
		out := make([]Datagram, len(sizes))
		for i, n := range sizes {
			out[i] = Datagram{Buf: make([]byte, n), Src: a, Dst: b}
		}
		return out
	}
	cases := []struct {
		batch []Datagram
		runs  []uint8
		ok    bool
	}{
		{mk(100, 100, 50), []uint8{3}, true},
		{mk(100, 100, 50), []uint8{2, 1}, true},
		{mk(100, 100, 50), []uint8{1, 1, 1}, true},
		{mk(100, 100, 50), []uint8{2}, false},       // does not cover the batch
		{mk(100, 100, 50), []uint8{2, 2}, false},    // runs past the end
		{mk(100, 200), []uint8{2}, false},           // longer second datagram
		{mk(50, 100), []uint8{2}, false},            // shorter first
		{mk(100, 100), []uint8{0, 2}, false},        // empty run
		{mk(100, 50, 50), []uint8{3}, false},        // only the last may be shorter
		{mk(), nil, true},                           // nothing
		{mk(100, 100, 100), []uint8{1, 2}, true},    // a run may start anywhere
		{mk(0, 0), []uint8{2}, false},               // empty datagrams never share a message
		{mk(100, 100, 100, 100), []uint8{4}, true},  // equal lengths
		{mk(100, 100, 100, 100), []uint8{5}, false}, // too long
	}
	for i, c := range cases {
		if got := ValidRuns(c.batch, c.runs); got != c.ok {
			t.Errorf("case %d: validRuns %v, want %v", i, got, c.ok)
		}
	}
}
