package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestJain(t *testing.T) {
	for _, c := range []struct {
		x    []float64
		want float64
	}{
		{[]float64{5, 5, 5, 5}, 1},
		{[]float64{20, 0, 0, 0}, 0.25},
		{[]float64{10, 10, 0, 0}, 0.5},
		{[]float64{0, 0}, 0},
	} {
		if got := jain(c.x); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("jain(%v) = %v, want %v", c.x, got, c.want)
		}
	}
}

// TestResult: two flows at 6 and 2 Mbit/s through a 10 Mbit/s bottleneck for 8 s, sampled every
// 0.25 s: utilization 80%, Jain 0.8 in every interval, the RED counters' differences, the
// queue's mean over the measured window.
func TestResult(t *testing.T) {
	var b strings.Builder
	b.WriteString("PHASE|softroce-cc|softroce|2|8|10|on|red min 1 max 2\n")
	for i := 0; i <= 32; i++ {
		s := float64(i) / 4
		fmt.Fprintf(&b, "S|%.2f|%.0f|%.0f|%.0f|%d|%d|0|%d\n", 1000+s, s*6e6/8, s*2e6/8, s*8e6/8, 1000*(i%2), 10+i, 3+i/8)
	}
	b.WriteString("FLOW|1|0.006|0|12|0\nRECV|1|40|12\nFLOW|2|0.002|3|4|1\nRECV|2|9|4\n")
	f := filepath.Join(t.TempDir(), "c.txt")
	if err := os.WriteFile(f, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	ph, err := load(f)
	if err != nil || len(ph) != 1 {
		t.Fatalf("load: %v, %d phases", err, len(ph))
	}
	r := ph[0].result()
	near := func(name string, got, want float64) {
		if math.Abs(got-want) > 1e-6*math.Max(1, math.Abs(want)) {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	near("utilization", r.util, 0.8)
	near("goodput", r.goodput, 8)
	near("jain mean", r.jainMean, 0.8)
	near("jain min", r.jainMin, 0.8)
	near("marked", r.marked, 32)
	near("pdrop", r.pd, 4)
	near("queue mean", r.qMean, 1000*8.0/17) // 17 samples from 2 s to 6 s, 8 of them at 1000
	if r.intervals != 4 || r.retrans != 3 || r.cnpSent != 16 || r.cnpHandled != 16 || r.failed != 0 {
		t.Errorf("intervals %d, retrans %d, cnp sent %d handled %d, failed %d", r.intervals, r.retrans, r.cnpSent, r.cnpHandled, r.failed)
	}
	var out strings.Builder
	svg(&out, ph)
	if !strings.Contains(out.String(), "<polyline") || !strings.HasSuffix(out.String(), "</svg>\n") {
		t.Errorf("svg: %q", out.String())
	}
}

// TestRoundsAndTargets: two rounds of one phase (ROUND lines), the first meeting every target,
// the second with a failed flow, tail drops and a queue above RED's max: a row per run, and the
// tally says 1 of 2 for each target the second run misses.
func TestRoundsAndTargets(t *testing.T) {
	var b strings.Builder
	for round, bad := range []bool{false, true} {
		fmt.Fprintf(&b, "ROUND|%d\nPHASE|softroce-cc-sr|softroce-sr|2|8|10|on|red min 1000 max 5000 limit 9000\n", round+1)
		for i := 0; i <= 32; i++ {
			s := float64(i) / 4
			q, pd := 2000, 0
			if bad {
				q, pd = 8000, i
			}
			fmt.Fprintf(&b, "S|%.2f|%.0f|%.0f|%.0f|%d|%d|0|%d\n", s, s*4.6e6/8, s*4.6e6/8, s*9.2e6/8, q, i, pd)
		}
		if bad {
			b.WriteString("FLOW|1|FAIL|30|4|0|100|2|3|8|1\nRECV|1|9|4|3|20|100\n")
		} else {
			b.WriteString("FLOW|1|0.0046|3|4|0|100|2|3|0|0\nRECV|1|9|4|3|1|100\n")
		}
		b.WriteString("FLOW|2|0.0046|0|4|0\nRECV|2|9|4\n")
	}
	f := filepath.Join(t.TempDir(), "c.txt")
	if err := os.WriteFile(f, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	ph, err := load(f)
	if err != nil || len(ph) != 2 || ph[0].round != 1 || ph[1].round != 2 {
		t.Fatalf("load: %v, %d phases", err, len(ph))
	}
	if s := ph[1].stat[0]; s.goodput != -1 || s.selective != 2 || s.sackRcvd != 3 || s.retries != 8 || s.seqNAK != 1 ||
		s.sackSent != 3 || s.dup != 20 || s.rcvd != 100 {
		t.Errorf("flow 1 of round 2: %+v", s)
	}
	var out strings.Builder
	table(&out, ph)
	for _, want := range []string{
		"| softroce, DCQCN + selective repeat | 2 | 1 | 92.0% |",
		"| softroce, DCQCN + selective repeat (1 failed) | 2 | 2 | 92.0% |",
		"| softroce, DCQCN + selective repeat | 2 | 2 | 2 of 2 | 2 of 2 | 1 of 2 | 1 of 2 | 1 of 2 |",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}
