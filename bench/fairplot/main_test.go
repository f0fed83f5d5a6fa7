package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/softroce/softroce/bench/internal/docgen"
)

// quant is a FAIRCDF list rising from base µs.
func quant(base float64) string {
	v := make([]string, len(quantiles))
	for i, q := range quantiles {
		v[i] = fmt.Sprintf("%.1f", base*(1+10*q*q))
	}
	return strings.Join(v, ",")
}

const sample = `=== RUN   TestTenantFairness
FAIRNESS qps=1,1 mbps=598,584 share=0.98 p50_idle_us=204.8 p50_loaded_us=1792.1 p99_idle_us=436.9 p99_loaded_us=5079.8 p99_ratio=11.63
FAIRCDF qps=1,1 idle=%s loaded=%s
FAIRNESS qps=4,1 mbps=490,474 share=0.97 p50_idle_us=191.6 p50_loaded_us=2099.7 p99_idle_us=414.7 p99_loaded_us=6386.8 p99_ratio=15.40
FAIRCDF qps=4,1 idle=%s loaded=%s
FAIRNESS apart qps=1,1 mbps=652,609 share=0.94 p50_idle_us=173.7 p50_loaded_us=340.0 p99_idle_us=361.6 p99_loaded_us=1294.9 p99_ratio=3.58
FAIRCDF apart qps=1,1 idle=%s loaded=%s
`

func sampleInput() string {
	return fmt.Sprintf(sample, quant(150), quant(1200), quant(150), quant(1800), quant(150), quant(300))
}

// TestParseTableSVG: the three cases' runs, each with its distributions, become a row each and
// six curves (three idle, three loaded) in the plot; a FAIRCDF line without its FAIRNESS line,
// or a malformed number, is an error.
func TestParseTableSVG(t *testing.T) {
	runs, err := parse(strings.NewReader(sampleInput()))
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 3 || runs[0].kind != "equal" || runs[1].kind != "bully" || runs[2].kind != "apart" ||
		len(runs[2].loaded) != len(quantiles) || runs[2].loaded[0] != 300 || runs[1].mbps != [2]float64{490, 474} {
		t.Fatalf("runs %+v", runs)
	}
	var tb bytes.Buffer
	table(&tb, runs)
	for _, want := range []string{
		"| equal clients, same daemons | 1 | 598 and 584 MB/s | 0.98 | 205 -> 1792 µs | 437 -> 5080 µs | 11.6x |",
		"| a client with 4x the QPs, same daemons | 1 | 490 and 474 MB/s | 0.97 |",
		"| equal clients on other daemons (CPU contention only) | 1 | 652 and 609 MB/s | 0.94 |",
	} {
		if !strings.Contains(tb.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, tb.String())
		}
	}
	var sv bytes.Buffer
	svg(&sv, runs)
	if n := strings.Count(sv.String(), "<polyline"); n != 6 {
		t.Errorf("%d curves, want 6", n)
	}
	if !strings.Contains(sv.String(), "1 ms") || !strings.Contains(sv.String(), "100 µs") {
		t.Errorf("no decade labels:\n%s", sv.String())
	}
	for _, bad := range []string{
		"FAIRCDF qps=1,1 idle=1 loaded=2\n",
		"FAIRNESS qps=1,1 mbps=1,2 share=x p50_idle_us=1 p50_loaded_us=1 p99_idle_us=1 p99_loaded_us=1 p99_ratio=1\n",
	} {
		if _, err := parse(strings.NewReader(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// TestDocs: the table lands between bench/fairness's markers, the rest of the page unchanged.
func TestDocs(t *testing.T) {
	begin, end := docgen.Markers("bench/fairness")
	doc := filepath.Join(t.TempDir(), "d.md")
	os.WriteFile(doc, []byte("before\n"+begin+"\nold\n"+end+"\nafter\n"), 0o644)
	runs, err := parse(strings.NewReader(sampleInput()))
	if err != nil {
		t.Fatal(err)
	}
	if err := docgen.Replace(doc, "bench/fairness", func(w io.Writer) { table(w, runs) }); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(doc)
	if s := string(b); !strings.HasPrefix(s, "before\n"+begin+"\n| case |") || !strings.HasSuffix(s, end+"\nafter\n") || strings.Contains(s, "old") {
		t.Fatalf("page:\n%s", s)
	}
}
