// Command report turns bench/run's raw results into the table of docs/performance.md and a
// plot. The results are in Go's benchmark format (one "BenchmarkKind/key=value/... N value
// unit ..." line per measurement, "key: value" lines for the machine), so benchstat reads the
// same file:
//
//	report table FILE        the Markdown table, on stdout
//	report svg FILE          bandwidth against message size, an SVG image on stdout
//	report docs FILE DOC     replace the table between DOC's "bench/run table" markers
//
// A key measured several times (bench/run RUNS=N) shows its median; the share of the
// ceiling compares the best softroce run with the best ceiling measurement, as the target
// does (docs/performance.md, "Targets").
package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/softroce/softroce/bench/internal/docgen"
)

func main() {
	if len(os.Args) < 3 {
		usage()
	}
	r, err := load(os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(1)
	}
	switch os.Args[1] {
	case "table":
		r.table(os.Stdout)
	case "svg":
		r.svg(os.Stdout)
	case "docs":
		if len(os.Args) != 4 {
			usage()
		}
		if err := r.docs(os.Args[3]); err != nil {
			fmt.Fprintln(os.Stderr, "report:", err)
			os.Exit(1)
		}
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: report table|svg FILE | report docs FILE DOC")
	os.Exit(2)
}

// result is one benchmark line: its kind ("Loopback"), its keys, its values by unit.
type result struct {
	kind   string
	keys   map[string]string
	values map[string]float64
}

type results struct {
	config [][2]string // "key: value" lines, in file order
	lines  []result
}

func load(path string) (*results, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := &results{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if name, ok := strings.CutPrefix(line, "Benchmark"); ok {
			fs := strings.Fields(name)
			if len(fs) < 4 || len(fs)%2 != 0 {
				return nil, fmt.Errorf("%s: malformed line %q", path, line)
			}
			parts := strings.Split(fs[0], "/")
			res := result{kind: parts[0], keys: map[string]string{}, values: map[string]float64{}}
			for _, p := range parts[1:] {
				k, v, _ := strings.Cut(p, "=")
				res.keys[k] = v
			}
			for i := 2; i+1 < len(fs); i += 2 {
				v, err := strconv.ParseFloat(fs[i], 64)
				if err != nil {
					return nil, fmt.Errorf("%s: %q: %v", path, line, err)
				}
				res.values[fs[i+1]] = v
			}
			r.lines = append(r.lines, res)
			continue
		}
		if k, v, ok := strings.Cut(line, ": "); ok && !strings.Contains(k, " ") {
			r.config = append(r.config, [2]string{k, v})
		}
	}
	return r, sc.Err()
}

// samples returns the values of unit over the lines of kind whose keys include want.
func (r *results) samples(kind, unit string, want map[string]string) []float64 {
	var out []float64
next:
	for _, l := range r.lines {
		if l.kind != kind {
			continue
		}
		for k, v := range want {
			if l.keys[k] != v {
				continue next
			}
		}
		if v, ok := l.values[unit]; ok {
			out = append(out, v)
		}
	}
	return out
}

// keyValues returns the distinct values of key over the lines of kind, numerically sorted.
func (r *results) keyValues(kind, key string) []string {
	seen := map[string]bool{}
	var out []string
	for _, l := range r.lines {
		if v, ok := l.keys[key]; ok && l.kind == kind && !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, ea := strconv.Atoi(out[i])
		b, eb := strconv.Atoi(out[j])
		if ea == nil && eb == nil {
			return a < b
		}
		return out[i] < out[j]
	})
	return out
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func maxOf(v []float64) float64 {
	m := math.Inf(-1)
	for _, x := range v {
		m = math.Max(m, x)
	}
	return m
}

// size formats a byte count the way the docs do: 64 B, 4 KiB, 1 MiB.
func size(s string) string {
	n, err := strconv.Atoi(s)
	switch {
	case err != nil:
		return s
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

// num formats a value with three significant digits.
func num(v float64) string {
	switch {
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case v >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	return strconv.FormatFloat(v, 'g', 2, 64)
}

func (r *results) conf(key string) string {
	for _, c := range r.config {
		if c[0] == key {
			return c[1]
		}
	}
	return "?"
}

func (r *results) table(w io.Writer) {
	fmt.Fprintf(w, "Machine: %s CPUs (%s), Linux %s, %s. Loopback, two `softroce perf` processes "+
		"(127.0.0.1 <-> 127.0.0.2), BW average in Gbit/s", r.conf("cpus"), r.conf("cpu"), r.conf("kernel"), r.conf("go"))
	if n := r.maxSamples("Loopback"); n > 1 {
		fmt.Fprintf(w, " (the median where a row ran more than once, up to %d times)", n)
	}
	fmt.Fprintln(w, ":")
	fmt.Fprintln(w)
	sizes := r.keyValues("Loopback", "size")
	fmt.Fprint(w, "| verb | MTU | QPs |")
	for _, s := range sizes {
		fmt.Fprintf(w, " %s |", size(s))
	}
	fmt.Fprint(w, "\n|---|---:|---:|")
	for range sizes {
		fmt.Fprint(w, "---:|")
	}
	fmt.Fprintln(w)
	for _, verb := range []string{"write", "read", "send"} {
		for _, mtu := range r.keyValues("Loopback", "mtu") {
			for _, qps := range r.keyValues("Loopback", "qps") {
				var cells []string
				found := false
				for _, s := range sizes {
					v := r.samples("Loopback", "Gbit/s", map[string]string{"verb": verb, "size": s, "mtu": mtu, "qps": qps})
					if len(v) == 0 {
						cells = append(cells, "–")
						continue
					}
					found = true
					cells = append(cells, num(median(v)))
				}
				if found {
					fmt.Fprintf(w, "| %s | %s | %s | %s |\n", verb, mtu, qps, strings.Join(cells, " | "))
				}
			}
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| measurement | result |")
	fmt.Fprintln(w, "|---|---|")
	for _, s := range r.keyValues("Latency", "size") {
		k := map[string]string{"verb": "write", "size": s}
		t, p := r.samples("Latency", "us-typical", k), r.samples("Latency", "us-p99", k)
		if len(t) > 0 && len(p) > 0 {
			fmt.Fprintf(w, "| write latency, %s, MTU 4096 (`--lat`, half the round trip) | typical %s us, p99 %s us |\n", size(s), num(median(t)), num(median(p)))
		}
	}
	for _, b := range r.keyValues("Ceiling", "buf") {
		if v := r.samples("Ceiling", "Gbit/s", map[string]string{"buf": b}); len(v) > 0 {
			fmt.Fprintf(w, "| raw UDP GSO/GRO ceiling with RoCE work (`bench/ceiling`), %s buffers | %s Gbit/s (best of %d) |\n", size(b), num(maxOf(v)), len(v))
		}
	}
	sr := r.samples("Loopback", "Gbit/s", map[string]string{"verb": "write", "size": "65536", "mtu": "4096", "qps": "1"})
	ce := r.samples("Ceiling", "Gbit/s", map[string]string{"buf": "65536"})
	if len(sr) > 0 && len(ce) > 0 && maxOf(ce) > 0 {
		fmt.Fprintf(w, "| **share**: write 64 KiB, MTU 4096, 1 QP (best of %d) / the 64 KiB ceiling | **%.0f%%** (target >= 80%%) |\n",
			len(sr), 100*maxOf(sr)/maxOf(ce))
	}
	for _, q := range r.keyValues("Scale", "qps") {
		k := map[string]string{"qps": q}
		m, g := r.samples("Scale", "B/idle-QP", k), r.samples("Scale", "Gbit/s", k)
		if len(m) > 0 && len(g) > 0 {
			fmt.Fprintf(w, "| scale: %s connected RC QPs per device, one process (`bench/scale`) | %.0f B heap per idle QP; %s Gbit/s aggregate 64 KiB WRITEs |\n", q, median(m), num(median(g)))
		}
	}
}

func (r *results) maxSamples(kind string) int {
	n := map[string]int{}
	m := 0
	for _, l := range r.lines {
		if l.kind != kind {
			continue
		}
		k := fmt.Sprint(l.keys)
		n[k]++
		m = max(m, n[k])
	}
	return m
}

func (r *results) docs(doc string) error {
	return docgen.Replace(doc, "bench/run", func(w io.Writer) { r.table(w) })
}

// svg draws the loopback bandwidth (median, 1 QP) against the message size, one line per
// verb and MTU, on a log2 size axis.
func (r *results) svg(w io.Writer) {
	const W, H, L, R, T, B = 640, 400, 60, 150, 30, 50
	sizes := r.keyValues("Loopback", "size")
	type series struct {
		name string
		pts  [][2]float64 // log2 size, Gbit/s
	}
	var ss []series
	top := 1.0
	for _, verb := range []string{"write", "read", "send"} {
		for _, mtu := range r.keyValues("Loopback", "mtu") {
			s := series{name: verb + ", MTU " + mtu}
			for _, sz := range sizes {
				v := r.samples("Loopback", "Gbit/s", map[string]string{"verb": verb, "size": sz, "mtu": mtu, "qps": "1"})
				n, err := strconv.Atoi(sz)
				if len(v) == 0 || err != nil || n <= 0 {
					continue
				}
				g := median(v)
				top = math.Max(top, g)
				s.pts = append(s.pts, [2]float64{math.Log2(float64(n)), g})
			}
			if len(s.pts) > 0 {
				ss = append(ss, s)
			}
		}
	}
	ceil := r.samples("Ceiling", "Gbit/s", map[string]string{"buf": "65536"})
	if len(ceil) > 0 {
		top = math.Max(top, maxOf(ceil))
	}
	top = math.Ceil(top/5) * 5
	lo, hi := 6.0, 20.0
	if len(sizes) > 0 {
		a, _ := strconv.Atoi(sizes[0])
		b, _ := strconv.Atoi(sizes[len(sizes)-1])
		if a > 0 && b > a {
			lo, hi = math.Log2(float64(a)), math.Log2(float64(b))
		}
	}
	x := func(v float64) float64 { return L + (v-lo)/(hi-lo)*(W-L-R) }
	y := func(v float64) float64 { return H - B - v/top*(H-T-B) }
	colors := []string{"#1f77b4", "#aec7e8", "#d62728", "#ff9896", "#2ca02c", "#98df8a"}
	fmt.Fprintf(w, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H)
	fmt.Fprintf(w, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", W, H)
	fmt.Fprintf(w, "<text x=\"%d\" y=\"18\">softroce loopback bandwidth, 1 QP (bench/run): Gbit/s by message size</text>\n", L)
	for g := 0.0; g <= top; g += top / 5 {
		fmt.Fprintf(w, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n",
			L, W-R, y(g), y(g), L-6, y(g)+4, g)
	}
	for _, sz := range sizes {
		n, _ := strconv.Atoi(sz)
		if n <= 0 {
			continue
		}
		px := x(math.Log2(float64(n)))
		fmt.Fprintf(w, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" stroke=\"#ddd\"/><text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n",
			px, px, T, H-B, px, H-B+16, size(sz))
	}
	for i, s := range ss {
		c := colors[i%len(colors)]
		var pts []string
		for _, p := range s.pts {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(p[0]), y(p[1])))
		}
		fmt.Fprintf(w, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"%s\"/>\n", c, strings.Join(pts, " "))
		ly := T + 10 + 18*i
		fmt.Fprintf(w, "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"/><text x=\"%d\" y=\"%d\">%s</text>\n",
			W-R+10, W-R+30, ly, ly, c, W-R+36, ly+4, s.name)
	}
	if len(ceil) > 0 {
		c := maxOf(ceil)
		fmt.Fprintf(w, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"black\" stroke-dasharray=\"4 3\"/><text x=\"%d\" y=\"%.1f\">GSO/GRO ceiling, 64 KiB buffers: %s</text>\n",
			L, W-R, y(c), y(c), L+4, y(c)-4, num(c))
	}
	fmt.Fprintf(w, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">message size</text>\n", (W-R+L)/2, H-12)
	fmt.Fprintln(w, "</svg>")
}
