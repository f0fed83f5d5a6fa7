// Command fairplot turns the lines bench/fairness collects (TestTenantFairness's FAIRNESS and
// FAIRCDF lines, one pair per run) into the table of docs/daemon.md ("Fair service") and a plot
// of the ping-pong's round-trip distributions, idle and under the bandwidth clients:
//
//	fairplot table RESULTS      the table on stdout
//	fairplot svg RESULTS        the plot, an SVG image on stdout
//	fairplot docs RESULTS DOC   the table into DOC, between bench/fairness's markers
package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/softroce/softroce/bench/internal/docgen"
)

// quantiles are the levels of a FAIRCDF list (fping's QUANT line): 0, 0.01, ..., 0.99, 0.999, 1.
var quantiles = func() []float64 {
	q := make([]float64, 0, 102)
	for i := 0; i <= 99; i++ {
		q = append(q, float64(i)/100)
	}
	return append(q, 0.999, 1)
}()

// run is one run of one case.
type run struct {
	kind         string // "equal", "bully", "apart"
	qps          string // "1,1"
	mbps         [2]float64
	share        float64
	p50, p99     [2]float64 // idle, loaded (µs)
	ratio        float64
	idle, loaded []float64 // µs at quantiles (nil without a FAIRCDF line)
}

func kindOf(apart bool, qps string) string {
	switch {
	case apart:
		return "apart"
	case qps == "1,1":
		return "equal"
	}
	return "bully"
}

// caseNames describe the cases in the table and the plot's legend.
var caseNames = map[string]string{
	"equal": "equal clients, same daemons",
	"bully": "a client with 4x the QPs, same daemons",
	"apart": "equal clients on other daemons (CPU contention only)",
}

// parse reads FAIRNESS and FAIRCDF lines (others are skipped); a FAIRCDF line belongs to the
// FAIRNESS line before it.
func parse(r io.Reader) ([]run, error) {
	var runs []run
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || (f[0] != "FAIRNESS" && f[0] != "FAIRCDF") {
			continue
		}
		apart := len(f) > 1 && f[1] == "apart"
		kv := map[string]string{}
		for _, x := range f[1:] {
			if k, v, ok := strings.Cut(x, "="); ok {
				kv[k] = v
			}
		}
		if f[0] == "FAIRCDF" {
			if len(runs) == 0 || runs[len(runs)-1].qps != kv["qps"] || runs[len(runs)-1].kind != kindOf(apart, kv["qps"]) {
				return nil, fmt.Errorf("FAIRCDF line without its FAIRNESS line: %q", sc.Text())
			}
			r := &runs[len(runs)-1]
			var err error
			if r.idle, err = floats(kv["idle"]); err != nil {
				return nil, err
			}
			if r.loaded, err = floats(kv["loaded"]); err != nil {
				return nil, err
			}
			continue
		}
		r := run{kind: kindOf(apart, kv["qps"]), qps: kv["qps"]}
		bw, err := floats(kv["mbps"])
		if err != nil || len(bw) != 2 {
			return nil, fmt.Errorf("mbps in %q", sc.Text())
		}
		copy(r.mbps[:], bw)
		for _, x := range []struct {
			key string
			dst *float64
		}{{"share", &r.share}, {"p50_idle_us", &r.p50[0]}, {"p50_loaded_us", &r.p50[1]},
			{"p99_idle_us", &r.p99[0]}, {"p99_loaded_us", &r.p99[1]}, {"p99_ratio", &r.ratio}} {
			if *x.dst, err = strconv.ParseFloat(kv[x.key], 64); err != nil {
				return nil, fmt.Errorf("%s in %q", x.key, sc.Text())
			}
		}
		runs = append(runs, r)
	}
	return runs, sc.Err()
}

func floats(s string) ([]float64, error) {
	var out []float64
	for _, x := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(x, 64)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", s, err)
		}
		out = append(out, v)
	}
	return out, nil
}

// table writes one row per run, the cases in the order they came.
func table(w io.Writer, runs []run) {
	fmt.Fprintln(w, "| case | run | bandwidth clients | share (min/max) | ping-pong p50 idle -> loaded | p99 idle -> loaded | p99 loaded / idle |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|")
	n := map[string]int{}
	for _, r := range runs {
		n[r.kind]++
		fmt.Fprintf(w, "| %s | %d | %.0f and %.0f MB/s | %.2f | %.0f -> %.0f µs | %.0f -> %.0f µs | %.1fx |\n",
			caseNames[r.kind], n[r.kind], r.mbps[0], r.mbps[1], r.share, r.p50[0], r.p50[1], r.p99[0], r.p99[1], r.ratio)
	}
}

// colors of the loaded curves per case; idle curves are grey.
var colors = map[string]string{"equal": "#1f77b4", "bully": "#d62728", "apart": "#2ca02c"}

// svg draws each run's round-trip distribution (the fraction of round trips at most x, x on a
// log scale): idle in grey, loaded in the case's color.
func svg(w io.Writer, runs []run) {
	const W, H, L, R, T, B = 760, 500, 60, 40, 40, 110
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, r := range runs {
		for _, v := range append(append([]float64(nil), r.idle...), r.loaded...) {
			if v > 0 {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
	}
	if math.IsInf(lo, 1) {
		lo, hi = 10, 1e5
	}
	d0, d1 := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if d1 <= d0 {
		d1 = d0 + 1
	}
	x := func(us float64) float64 {
		return L + (math.Log10(math.Max(us, math.Pow(10, d0)))-d0)/(d1-d0)*(W-L-R)
	}
	y := func(q float64) float64 { return T + (1-q)*(H-T-B) }
	fmt.Fprintf(w, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H)
	fmt.Fprintf(w, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", W, H)
	fmt.Fprintf(w, "<text x=\"%d\" y=\"20\" font-size=\"14\">8-byte ping-pong round trips through two softroce daemons (bench/fairness)</text>\n", L)
	for d := d0; d <= d1; d++ {
		px := x(math.Pow(10, d))
		fmt.Fprintf(w, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#ddd\"/>\n", px, T, px, H-B)
		fmt.Fprintf(w, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", px, H-B+16, usLabel(math.Pow(10, d)))
	}
	for _, q := range []float64{0, 0.25, 0.5, 0.75, 0.9, 1} {
		fmt.Fprintf(w, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L, y(q), W-R, y(q))
		fmt.Fprintf(w, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", L-6, y(q)+4, q)
	}
	fmt.Fprintf(w, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">round trip (log scale)</text>\n", (W+L-R)/2, H-B+34)
	fmt.Fprintf(w, "<text x=\"14\" y=\"%d\" transform=\"rotate(-90 14 %d)\" text-anchor=\"middle\">fraction of round trips</text>\n", (H+T-B)/2, (H+T-B)/2)
	curve := func(vs []float64, color string, width float64) {
		if len(vs) != len(quantiles) {
			return
		}
		var b strings.Builder
		for i, v := range vs {
			fmt.Fprintf(&b, "%.1f,%.1f ", x(v), y(quantiles[i]))
		}
		fmt.Fprintf(w, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%.1f\" points=\"%s\"/>\n", color, width, strings.TrimSpace(b.String()))
	}
	for _, r := range runs {
		curve(r.idle, "#999", 1)
	}
	for _, r := range runs {
		curve(r.loaded, colors[r.kind], 1.5)
	}
	// the legend below the plot
	lx, ly := L, H-B+56
	legend := func(color, text string) {
		fmt.Fprintf(w, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"/>\n", lx, ly-4, lx+24, ly-4, color)
		fmt.Fprintf(w, "<text x=\"%d\" y=\"%d\">%s</text>\n", lx+30, ly, text)
		ly += 16
	}
	legend("#999", "the ping-pong alone (idle)")
	seen := map[string]bool{}
	for _, r := range runs {
		if !seen[r.kind] {
			seen[r.kind] = true
			legend(colors[r.kind], "loaded: "+caseNames[r.kind])
		}
	}
	fmt.Fprintln(w, "</svg>")
}

func usLabel(us float64) string {
	switch {
	case us >= 1e6:
		return fmt.Sprintf("%g s", us/1e6)
	case us >= 1e3:
		return fmt.Sprintf("%g ms", us/1e3)
	}
	return fmt.Sprintf("%g µs", us)
}

func main() {
	if len(os.Args) < 3 || (os.Args[1] == "docs") != (len(os.Args) == 4) {
		fmt.Fprintln(os.Stderr, "usage: fairplot table|svg RESULTS | fairplot docs RESULTS DOC")
		os.Exit(2)
	}
	f, err := os.Open(os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "fairplot:", err)
		os.Exit(1)
	}
	runs, err := parse(f)
	f.Close()
	if err == nil && len(runs) == 0 {
		err = fmt.Errorf("%s: no FAIRNESS lines", os.Args[2])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fairplot:", err)
		os.Exit(1)
	}
	switch os.Args[1] {
	case "table":
		table(os.Stdout, runs)
	case "svg":
		svg(os.Stdout, runs)
	case "docs":
		err = docgen.Replace(os.Args[3], "bench/fairness", func(w io.Writer) { table(w, runs) })
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fairplot:", err)
		os.Exit(1)
	}
}
