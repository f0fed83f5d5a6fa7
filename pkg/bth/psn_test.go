package bth

import "testing"

func TestPSNAddSub(t *testing.T) {
	pts := []PSN{0, 1, 2, 1<<23 - 1, 1 << 23, 1<<23 + 1, PSNMask - 1, PSNMask}
	deltas := []int32{0, 1, -1, 2, -2, 100, -100, 1<<23 - 1, -(1<<23 - 1), 1 << 23}
	for _, p := range pts {
		for _, d := range deltas {
			q := p.Add(uint32(d))
			if q > PSNMask {
				t.Fatalf("%d.Add(%d) = %d out of range", p, d, q)
			}
			if got := q.Sub(p); got != d {
				t.Fatalf("(%d+%d).Sub(%d) = %d", p, d, p, got)
			}
			if d > 0 && d < 1<<23 {
				if !p.LessThan(q) || q.LessThan(p) || !p.LessThanEq(q) || q.LessThanEq(p) {
					t.Fatalf("order %d < %d", p, q)
				}
			}
			if d < 0 {
				if !q.LessThan(p) || p.LessThan(q) {
					t.Fatalf("order %d > %d", p, q)
				}
			}
			if d == 0 && (p.LessThan(q) || !p.LessThanEq(q)) {
				t.Fatalf("equal %d", p)
			}
		}
	}
	if PSN(PSNMask).Add(1) != 0 || PSN(0).Add(PSNMask) != PSNMask || PSN(5).Add(1<<24) != 5 {
		t.Fatal("wrap")
	}
	if PSN(0).Sub(PSNMask) != 1 || PSN(PSNMask).Sub(0) != -1 {
		t.Fatal("sub across wrap")
	}
	// The range is (-2^23, 2^23].
	if PSN(1<<23).Sub(0) != 1<<23 || PSN(0).Sub(1<<23) != 1<<23 {
		t.Fatal("half distance")
	}
}

// TestPSNExhaustiveAroundWrap compares Sub with a reference over every pair
// in windows around 0, 2^23 and 2^24-1.
func TestPSNExhaustiveAroundWrap(t *testing.T) {
	var pts []PSN
	for _, c := range []int64{0, 1 << 23, PSNMask} {
		for d := int64(-64); d <= 64; d++ {
			pts = append(pts, PSN((c+d)&PSNMask))
		}
	}
	for _, p := range pts {
		for _, q := range pts {
			d := (int64(p) - int64(q)) & PSNMask
			if d > 1<<23 {
				d -= 1 << 24
			}
			if got := p.Sub(q); int64(got) != d {
				t.Fatalf("%d.Sub(%d) = %d, want %d", p, q, got, d)
			}
			if p.LessThan(q) != (d < 0) || p.LessThanEq(q) != (d <= 0) {
				t.Fatalf("%d vs %d", p, q)
			}
		}
	}
}

func TestPSNInWindow(t *testing.T) {
	cases := []struct {
		p, first PSN
		size     uint32
		want     bool
	}{
		{5, 5, 1, true}, {5, 5, 0, false}, {6, 5, 1, false}, {4, 5, 10, false},
		{PSNMask, PSNMask - 1, 2, true}, {0, PSNMask, 2, true}, {1, PSNMask, 2, false},
		{0, PSNMask - 127, 128, false}, {0, PSNMask - 127, 129, true},
		{123, 456, 1 << 24, true}, {123, 456, 1<<24 + 5, true},
	}
	for _, c := range cases {
		if got := c.p.InWindow(c.first, c.size); got != c.want {
			t.Errorf("%d.InWindow(%d, %d) = %v", c.p, c.first, c.size, got)
		}
	}
}
