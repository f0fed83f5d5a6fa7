// Command congestion turns the samples bench/congestion.sh collects at the lab's ECN-marking
// bottleneck into its table and plot:
//
//	congestion table FILE...        one row per phase and round, then how many rounds met each
//	                                target (markdown)
//	congestion svg FILE             each flow's rate over 1 s intervals, a panel per phase
//	congestion docs DOC FILE...     the table between DOC's markers
//
// FILE holds the guest's lines (bench/congestion-guest.sh), each round's after a ROUND line
// (bench/congestion.sh --rounds; none: one round): PHASE, then S samples every 0.25 s
// (the bytes each flow delivered past the bottleneck, the bottleneck's bytes, the RED queue's
// backlog and cumulative marked, early and pdrop counts), FLOW and RECV counters, TC lines.
package main

import (
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
	switch os.Args[1] {
	case "table":
		ph, err := load(os.Args[2:]...)
		if err != nil {
			fail(err)
		}
		table(os.Stdout, ph)
	case "svg":
		ph, err := load(os.Args[2])
		if err != nil {
			fail(err)
		}
		svg(os.Stdout, ph)
	case "docs":
		if len(os.Args) < 4 {
			usage()
		}
		ph, err := load(os.Args[3:]...)
		if err != nil {
			fail(err)
		}
		if err := docs(os.Args[2], ph); err != nil {
			fail(err)
		}
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: congestion table|svg FILE... | congestion docs DOC FILE...")
	os.Exit(2)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "congestion:", err)
	os.Exit(1)
}

type sample struct {
	t                    float64
	flow                 []float64 // bytes delivered past the bottleneck, per flow (cumulative)
	link                 float64   // the bottleneck's bytes (cumulative)
	backlog              float64   // RED queue, bytes now
	marked, early, pdrop float64   // cumulative
}

type flowStat struct {
	goodput            float64 // Gbit/s, the tool's own average (-1: failed)
	retrans, cnp, ign  int
	sent, selective    int // request packets sent, resent one by one (selective repeat)
	sackRcvd, retries  int // SACKs acted on, transport retries (completer_retry_err)
	seqNAK             int // sequence NAKs received
	ecnMarked, cnpSent int
	sackSent, dup      int // the receiver's SACKs and duplicate requests
	rcvd               int // the receiver's packets
}

type phase struct {
	name, kind, cc, red string
	round               int // 1 when the file has no ROUND lines
	flows               int
	secs                int
	rate                float64 // Mbit/s
	samples             []sample
	stat                []flowStat
	tc                  []string
}

func load(files ...string) ([]*phase, error) {
	var out []*phase
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var p *phase
		round := 1
		for _, line := range strings.Split(string(b), "\n") {
			fs := strings.Split(line, "|")
			switch fs[0] {
			case "ROUND":
				if len(fs) > 1 {
					if r, err := strconv.Atoi(fs[1]); err == nil {
						round = r
					}
				}
			case "PHASE":
				if len(fs) < 8 {
					return nil, fmt.Errorf("%s: short PHASE line %q", f, line)
				}
				p = &phase{name: fs[1], kind: fs[2], cc: fs[6], red: fs[7], round: round}
				p.flows, _ = strconv.Atoi(fs[3])
				p.secs, _ = strconv.Atoi(fs[4])
				p.rate, _ = strconv.ParseFloat(fs[5], 64)
				p.stat = make([]flowStat, p.flows)
				out = append(out, p)
			case "S":
				if p == nil || len(fs) != 2+p.flows+5 {
					continue
				}
				v := make([]float64, len(fs)-1)
				for i, s := range fs[1:] {
					v[i], _ = strconv.ParseFloat(s, 64)
				}
				n := p.flows
				p.samples = append(p.samples, sample{t: v[0], flow: v[1 : 1+n], link: v[1+n],
					backlog: v[2+n], marked: v[3+n], early: v[4+n], pdrop: v[5+n]})
			case "FLOW", "RECV":
				if p == nil || len(fs) < 4 {
					continue
				}
				k, _ := strconv.Atoi(fs[1])
				if k < 1 || k > p.flows {
					continue
				}
				s := &p.stat[k-1]
				num := func(i int) int {
					if i >= len(fs) {
						return 0
					}
					n, _ := strconv.Atoi(fs[i])
					return n
				}
				if fs[0] == "FLOW" {
					g, err := strconv.ParseFloat(fs[2], 64)
					if err != nil {
						g = -1
					}
					s.goodput, s.retrans, s.cnp, s.ign = g, num(3), num(4), num(5)
					s.sent, s.selective, s.sackRcvd, s.retries, s.seqNAK = num(6), num(7), num(8), num(9), num(10)
				} else {
					s.ecnMarked, s.cnpSent = num(2), num(3)
					s.sackSent, s.dup, s.rcvd = num(4), num(5), num(6)
				}
			case "TC":
				if p != nil {
					p.tc = append(p.tc, strings.Join(fs[1:], "|"))
				}
			}
		}
	}
	return out, nil
}

// warm is the time left out at each end of a phase: perftest's -D margin (2 s), during which
// the flows start and stop.
const warm = 2.0

// window returns the samples of the measured part of the phase.
func (p *phase) window() []sample {
	if len(p.samples) < 2 {
		return nil
	}
	t0, t1 := p.samples[0].t+warm, p.samples[len(p.samples)-1].t-warm
	var w []sample
	for _, s := range p.samples {
		if s.t >= t0 && s.t <= t1 {
			w = append(w, s)
		}
	}
	return w
}

// intervals returns each flow's rate (Mbit/s) over consecutive 1 s intervals of samples,
// starting at from (nil when it has no sample): the interval's ends are the first samples at or
// after each whole second.
func intervals(ss []sample, from, to float64) (t []float64, rates [][]float64) {
	var idx []int
	next := from
	for i, s := range ss {
		if s.t >= next && s.t <= to {
			idx = append(idx, i)
			next = s.t + 1 - 0.125 // samples come every ~0.25 s: the one nearest a second on
		}
	}
	for j := 1; j < len(idx); j++ {
		a, b := ss[idx[j-1]], ss[idx[j]]
		dt := b.t - a.t
		r := make([]float64, len(a.flow))
		for k := range r {
			r[k] = (b.flow[k] - a.flow[k]) * 8 / dt / 1e6
		}
		t = append(t, b.t-ss[0].t)
		rates = append(rates, r)
	}
	return t, rates
}

// jain is Jain's fairness index of x: (Σx)² / (n·Σx²).
func jain(x []float64) float64 {
	var s, s2 float64
	for _, v := range x {
		s += v
		s2 += v * v
	}
	if s2 == 0 {
		return 0
	}
	return s * s / (float64(len(x)) * s2)
}

type result struct {
	util, goodput      float64 // utilization of the bottleneck (share), goodput sum Mbit/s
	jainMean, jainMin  float64
	intervals          int
	marked, early, pd  float64
	qMean, qP95        float64 // bytes
	retrans, cnpSent   int
	cnpHandled, cnpIgn int
	selective          int
	failed             int
}

func (p *phase) result() result {
	var r result
	w := p.window()
	if len(w) < 2 {
		r.failed = p.flows
		return r
	}
	a, b := w[0], w[len(w)-1]
	r.util = (b.link - a.link) * 8 / (b.t - a.t) / (p.rate * 1e6)
	first, last := p.samples[0], p.samples[len(p.samples)-1]
	r.marked, r.early, r.pd = last.marked-first.marked, last.early-first.early, last.pdrop-first.pdrop
	_, rates := intervals(p.samples, a.t, b.t)
	r.jainMin = 1
	for _, x := range rates {
		j := jain(x)
		r.jainMean += j
		r.jainMin = math.Min(r.jainMin, j)
	}
	if r.intervals = len(rates); r.intervals > 0 {
		r.jainMean /= float64(len(rates))
	} else {
		r.jainMin = 0
	}
	q := make([]float64, len(w))
	for i, s := range w {
		q[i] = s.backlog
		r.qMean += s.backlog
	}
	r.qMean /= float64(len(w))
	sort.Float64s(q)
	r.qP95 = q[int(0.95*float64(len(q)-1))]
	for _, s := range p.stat {
		if s.goodput < 0 {
			r.failed++ // no goodput; its counters still count
		} else {
			r.goodput += s.goodput * 1000
		}
		r.retrans += s.retrans
		r.selective += s.selective
		r.cnpSent += s.cnpSent
		r.cnpHandled += s.cnp
		r.cnpIgn += s.ign
	}
	return r
}

var names = map[string]string{
	"softroce-cc":    "softroce, DCQCN",
	"softroce-cc-sr": "softroce, DCQCN + selective repeat",
	"softroce-nocc":  "softroce, CC off",
	"rxe":            "kernel rxe",
}

func nameOf(p *phase) string {
	if n := names[p.name]; n != "" {
		return n
	}
	return p.name
}

func table(w io.Writer, ph []*phase) {
	fmt.Fprintln(w, "| senders | flows | run | utilization | goodput (sum) | Jain, 1 s intervals: mean (min) | ECN marked | RED drops (early) | tail drops | queue mean / p95 | resent packets (one by one) | CNPs sent / handled |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, p := range ph {
		r := p.result()
		fail := ""
		if r.failed > 0 {
			fail = fmt.Sprintf(" (%d failed)", r.failed)
		}
		fmt.Fprintf(w, "| %s%s | %d | %d | %.1f%% | %.1f Mbit/s | %.3f (%.3f) | %.0f | %.0f | %.0f | %.1f / %.1f KB | %d (%d) | %d / %d |\n",
			nameOf(p), fail, p.flows, p.round, 100*r.util, r.goodput, r.jainMean, r.jainMin,
			r.marked, r.early, r.pd, r.qMean/1000, r.qP95/1000, r.retrans, r.selective, r.cnpSent, r.cnpHandled)
	}
	if len(ph) > 0 {
		fmt.Fprintf(w, "\nRED below the tbf, in bytes: %s; the DCQCN phases' settings: %s\n", strings.TrimPrefix(ph[0].red, "red "), ccOf(ph))
		fmt.Fprintln(w)
		targets(w, ph)
	}
}

// The targets, per run of a phase: utilization at least 90%, Jain's index over 1 s intervals
// at least 0.95 (their mean), no tail drop, the RED queue's mean between the marking threshold
// and the point where every packet is marked (RED's min and max), every flow completed.
const (
	targetUtil = 0.90
	targetJain = 0.95
)

type tally struct {
	name                          string
	flows, runs                   int
	util, jain, tail, queue, done int
}

// met returns which targets r meets for p.
func (p *phase) met(r result) (util, jain, tail, queue, done bool) {
	lo, hi := redRange(p.red)
	return r.util >= targetUtil, r.intervals > 0 && r.jainMean >= targetJain, r.pd == 0,
		hi > 0 && r.qMean >= lo && r.qMean <= hi, r.failed == 0
}

// redRange returns RED's min and max (bytes) from the PHASE line's "red min A max B ..."
// (0, 0 when absent).
func redRange(red string) (lo, hi float64) {
	f := strings.Fields(red)
	for i := 0; i+1 < len(f); i++ {
		v, err := strconv.ParseFloat(f[i+1], 64)
		if err != nil {
			continue
		}
		switch f[i] {
		case "min":
			lo = v
		case "max":
			hi = v
		}
	}
	return lo, hi
}

// targets writes, per phase and flow count, in how many of its runs each target was met.
func targets(w io.Writer, ph []*phase) {
	var order []*tally
	by := map[string]*tally{}
	for _, p := range ph {
		key := fmt.Sprintf("%s|%d", p.name, p.flows)
		t := by[key]
		if t == nil {
			t = &tally{name: nameOf(p), flows: p.flows}
			by[key] = t
			order = append(order, t)
		}
		u, j, tl, q, d := p.met(p.result())
		t.runs++
		for _, c := range []struct {
			ok bool
			n  *int
		}{{u, &t.util}, {j, &t.jain}, {tl, &t.tail}, {q, &t.queue}, {d, &t.done}} {
			if c.ok {
				*c.n++
			}
		}
	}
	fmt.Fprintln(w, "| senders | flows | runs | utilization ≥ 90% | Jain (mean) ≥ 0.95 | no tail drop | queue mean within RED's marking range | every flow completed |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, t := range order {
		fmt.Fprintf(w, "| %s | %d | %d | %d of %d | %d of %d | %d of %d | %d of %d | %d of %d |\n",
			t.name, t.flows, t.runs, t.util, t.runs, t.jain, t.runs, t.tail, t.runs, t.queue, t.runs, t.done, t.runs)
	}
}

func ccOf(ph []*phase) string {
	for _, p := range ph {
		if p.name == "softroce-cc" || p.name == "softroce-cc-sr" {
			return "`" + p.cc + "`"
		}
	}
	return "-"
}

func docs(doc string, ph []*phase) error {
	return docgen.Replace(doc, "bench/congestion.sh", func(w io.Writer) { table(w, ph) })
}

var colors = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"}

// svg draws, per phase, each flow's rate over 1 s intervals against time, and the fair share.
func svg(w io.Writer, ph []*phase) {
	const W, PH, L, R, T, B = 640, 180, 60, 20, 30, 40
	H := T + len(ph)*(PH+B)
	fmt.Fprintf(w, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H)
	fmt.Fprintf(w, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", W, H)
	for n, p := range ph {
		y0 := T + n*(PH+B)
		if len(p.samples) < 2 {
			continue
		}
		ts, rates := intervals(p.samples, p.samples[0].t, p.samples[len(p.samples)-1].t)
		tmax := math.Max(float64(p.secs), 1)
		if len(ts) > 0 {
			tmax = math.Max(tmax, ts[len(ts)-1])
		}
		ymax := p.rate
		for _, r := range rates {
			for _, v := range r {
				ymax = math.Max(ymax, v)
			}
		}
		ymax = math.Ceil(ymax/10) * 10
		x := func(t float64) float64 { return L + t/tmax*float64(W-L-R) }
		y := func(v float64) float64 { return float64(y0+PH) - v/ymax*float64(PH) }
		fmt.Fprintf(w, "<text x=\"%d\" y=\"%d\" font-weight=\"bold\">%s, run %d: %d flows through %.0f Mbit/s, rate per flow over 1 s (Mbit/s)</text>\n", L, y0-8, p.name, p.round, p.flows, p.rate)
		fmt.Fprintf(w, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#999\"/>\n", L, y0, W-L-R, PH)
		for _, v := range []float64{0, ymax / 2, ymax} {
			fmt.Fprintf(w, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.0f</text>\n", L-4, y(v)+4, v)
		}
		for t := 0.0; t <= tmax; t += 5 {
			fmt.Fprintf(w, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%.0f s</text>\n", x(t), y0+PH+14, t)
		}
		share := p.rate / float64(p.flows)
		fmt.Fprintf(w, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#999\" stroke-dasharray=\"4 3\"/>\n", L, W-R, y(share), y(share))
		for k := 0; k < p.flows; k++ {
			var pts []string
			for i, r := range rates {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(ts[i]), y(r[k])))
			}
			fmt.Fprintf(w, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"%s\"/>\n", colors[k%len(colors)], strings.Join(pts, " "))
		}
	}
	fmt.Fprintln(w, "</svg>")
}
