// Command loss turns what bench/loss.sh collects at the lab's lossy bottleneck into its table
// and plot:
//
//	loss table FILE...        one row per stack and loss (markdown)
//	loss svg FILE...          goodput and request packets sent per packet needed against the loss
//	loss docs DOC FILE...     the table between DOC's markers
//
// FILE holds the guest's lines (bench/loss-guest.sh): RUN opens a run (stack, netem loss,
// iterations, message size, MTU, depth, rate), then GOODPUT, SEND (the sender's counters),
// RECV (the receiver's), NETEM (the qdisc's packets in, dropped, out), WALL, TC and LOG lines;
// SKIP lines (bench/loss.sh) name a stack that did not run and why.
package main

import (
	"fmt"
	"html"
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
	var doc string
	files := os.Args[2:]
	switch os.Args[1] {
	case "table", "svg":
	case "docs":
		if len(os.Args) < 4 {
			usage()
		}
		doc, files = os.Args[2], os.Args[3:]
	default:
		usage()
	}
	res, err := load(files...)
	if err != nil {
		fail(err)
	}
	switch os.Args[1] {
	case "table":
		table(os.Stdout, res)
	case "svg":
		svg(os.Stdout, res)
	case "docs":
		if err := docs(doc, res); err != nil {
			fail(err)
		}
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: loss table|svg FILE... | loss docs DOC FILE...")
	os.Exit(2)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "loss:", err)
	os.Exit(1)
}

// run is one stream of WRITEs through the bottleneck at one loss.
type run struct {
	stack             string
	loss              float64 // netem loss, percent
	iters, size, mtu  int
	depth             int
	rate              float64 // the bottleneck, Mbit/s
	goodput           float64 // Gbit/s, the tool's own average; -1: failed or missing
	sent, retrans     int64   // the sender's request packets, and those sent again (-1: not counted)
	retries, seqNAKs  int64   // completer_retry_err, rcvd_seq_err (the sender's)
	rcvd, dup, oos    int64   // the receiver's rcvd_pkts, duplicate_request, out_of_seq_request
	netemIn, netemDrp int64   // packets into netem, and dropped by it
	wall              float64 // seconds the sender ran
	haveSend          bool
	haveNetem         bool
}

// needed is how many request packets the data takes: bytes over the MTU's payload.
func (r *run) needed() int64 {
	if r.mtu <= 0 {
		return 0
	}
	per := (r.size + r.mtu - 1) / r.mtu
	return int64(r.iters) * int64(per)
}

// results is a file's runs in order, and the stacks that were skipped with the reason.
type results struct {
	runs  []*run
	skips map[string]string
	order []string // stacks in order of first appearance, skipped ones included
}

func (rs *results) stack(name string) {
	for _, s := range rs.order {
		if s == name {
			return
		}
	}
	rs.order = append(rs.order, name)
}

func load(files ...string) (*results, error) {
	rs := &results{skips: map[string]string{}}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		if err := rs.parse(string(b)); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
	}
	return rs, nil
}

func (rs *results) parse(text string) error {
	var r *run
	for _, line := range strings.Split(text, "\n") {
		fs := strings.Split(strings.TrimSpace(line), "|")
		i64 := func(i int) int64 {
			if i >= len(fs) {
				return 0
			}
			n, _ := strconv.ParseInt(fs[i], 10, 64)
			return n
		}
		switch fs[0] {
		case "RUN":
			if len(fs) < 8 {
				return fmt.Errorf("short RUN line %q", line)
			}
			r = &run{stack: fs[1], goodput: -1, retrans: -1}
			var err error
			if r.loss, err = strconv.ParseFloat(fs[2], 64); err != nil {
				return fmt.Errorf("RUN line %q: loss: %w", line, err)
			}
			r.iters, r.size, r.mtu, r.depth = int(i64(3)), int(i64(4)), int(i64(5)), int(i64(6))
			if r.iters <= 0 || r.size <= 0 || r.mtu <= 0 {
				return fmt.Errorf("RUN line %q: iterations, size and MTU must be positive", line)
			}
			r.rate, _ = strconv.ParseFloat(fs[7], 64)
			rs.runs = append(rs.runs, r)
			rs.stack(r.stack)
		case "SKIP":
			if len(fs) >= 4 {
				rs.skips[fs[1]] = fs[3]
				rs.stack(fs[1])
			}
		case "GOODPUT":
			if r != nil && len(fs) >= 2 {
				if g, err := strconv.ParseFloat(fs[1], 64); err == nil && g >= 0 {
					r.goodput = g
				}
			}
		case "SEND":
			if r != nil && len(fs) >= 5 {
				r.sent, r.retrans, r.retries, r.seqNAKs, r.haveSend = i64(1), i64(2), i64(3), i64(4), true
			}
		case "RECV":
			if r != nil && len(fs) >= 4 {
				r.rcvd, r.dup, r.oos = i64(1), i64(2), i64(3)
			}
		case "NETEM":
			if r != nil && len(fs) >= 3 {
				r.netemIn, r.netemDrp, r.haveNetem = i64(1), i64(2), true
			}
		case "WALL":
			if r != nil && len(fs) >= 2 {
				r.wall, _ = strconv.ParseFloat(fs[1], 64)
			}
		}
	}
	return nil
}

// point is every run of one stack at one loss (bench/loss.sh --rounds repeats them).
type point struct {
	stack string
	loss  float64
	runs  []*run
}

// goodput is the mean, least and greatest of the runs' goodputs (Gbit/s) and how many runs
// reported one (failed runs left out).
func (p *point) goodput() (mean, lo, hi float64, n int) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, r := range p.runs {
		if r.goodput < 0 {
			continue
		}
		mean += r.goodput
		lo, hi = math.Min(lo, r.goodput), math.Max(hi, r.goodput)
		n++
	}
	if n == 0 {
		return 0, 0, 0, 0
	}
	return mean / float64(n), lo, hi, n
}

// totals are the counters summed over the point's runs that have them.
type totals struct {
	sent, needed, retries, seqNAKs int64
	retrans                        int64
	noRetrans                      bool // a run's stack does not count its resent packets (rxe)
	withSend                       int  // runs with the sender's counters
	netemIn, netemDrp              int64
	withNetem                      int
	wall                           float64
}

func (p *point) totals() totals {
	var t totals
	for _, r := range p.runs {
		t.wall += r.wall
		if r.haveNetem {
			t.netemIn += r.netemIn
			t.netemDrp += r.netemDrp
			t.withNetem++
		}
		if !r.haveSend {
			continue
		}
		if r.retrans < 0 {
			t.noRetrans = true
		} else {
			t.retrans += r.retrans
		}
		t.sent += r.sent
		t.needed += r.needed()
		t.retries += r.retries
		t.seqNAKs += r.seqNAKs
		t.withSend++
	}
	return t
}

// ratio is the request packets sent per packet needed over the point's runs (0: unknown).
func (p *point) ratio() float64 {
	t := p.totals()
	if t.withSend == 0 || t.needed == 0 {
		return 0
	}
	return float64(t.sent) / float64(t.needed)
}

// byStack returns each stack's points sorted by loss, stacks in order of appearance.
func (rs *results) byStack() [][]*point {
	var out [][]*point
	for _, s := range rs.order {
		var g []*point
		for _, r := range rs.runs {
			if r.stack != s {
				continue
			}
			var p *point
			for _, q := range g {
				if q.loss == r.loss {
					p = q
				}
			}
			if p == nil {
				p = &point{stack: s, loss: r.loss}
				g = append(g, p)
			}
			p.runs = append(p.runs, r)
		}
		if len(g) == 0 {
			continue
		}
		sort.SliceStable(g, func(i, j int) bool { return g[i].loss < g[j].loss })
		out = append(out, g)
	}
	return out
}

var stackNames = map[string]string{
	"softroce":    "softroce <-> softroce, go-back-N",
	"softroce-sr": "softroce <-> softroce, selective repeat",
	"rxe":         "kernel rxe <-> kernel rxe",
}

func stackName(s string) string {
	if n := stackNames[s]; n != "" {
		return n
	}
	return s
}

func pct(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) + "%" }

func table(w io.Writer, rs *results) {
	fmt.Fprintln(w, "| stack | netem loss | runs | goodput | of loss-free | request packets sent | packets needed | sent / needed | resent (`retransmitted_pkts`) | netem: in / dropped | transport retries (seq NAKs) | time |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, g := range rs.byStack() {
		var base float64
		if g[0].loss == 0 {
			base, _, _, _ = g[0].goodput()
		}
		for _, p := range g {
			mean, lo, hi, n := p.goodput()
			runs := strconv.Itoa(len(p.runs))
			if f := len(p.runs) - n; f > 0 {
				runs += fmt.Sprintf(" (%d failed)", f)
			}
			good, of := "-", "-"
			if n > 0 {
				good = fmt.Sprintf("%.1f Mbit/s", mean*1000)
				if n > 1 {
					good += fmt.Sprintf(" (%.1f-%.1f)", lo*1000, hi*1000)
				}
				if base > 0 {
					of = fmt.Sprintf("%.0f%%", 100*mean/base)
				}
			}
			t := p.totals()
			sent, needed, ratio, resent, retries := "-", "-", "-", "-", "-"
			if t.withSend > 0 {
				sent, needed = strconv.FormatInt(t.sent, 10), strconv.FormatInt(t.needed, 10)
				ratio = fmt.Sprintf("%.2f", p.ratio())
				retries = fmt.Sprintf("%d (%d)", t.retries, t.seqNAKs)
				if !t.noRetrans {
					resent = strconv.FormatInt(t.retrans, 10)
				}
			}
			netem := "-"
			if t.withNetem > 0 {
				netem = fmt.Sprintf("%d / %d", t.netemIn, t.netemDrp)
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.1f s |\n",
				stackName(p.stack), pct(p.loss), runs, good, of, sent, needed, ratio, resent, netem, retries, t.wall)
		}
	}
	if len(rs.runs) > 0 {
		r := rs.runs[0]
		fmt.Fprintf(w, "\nEach run: one RC QP, %d RDMA WRITEs of %d bytes, %d outstanding, MTU %d, through a tbf at %.0f Mbit/s with netem's random loss below it (data direction only); counters and times summed over a row's runs, goodput their mean (least-greatest).",
			r.iters, r.size, r.depth, r.mtu, r.rate)
	}
	var sk []string
	for _, s := range rs.order {
		if why, ok := rs.skips[s]; ok {
			sk = append(sk, fmt.Sprintf("%s: %s", stackName(s), why))
		}
	}
	if len(sk) > 0 {
		fmt.Fprintf(w, " Not run: %s.", strings.Join(sk, "; "))
	}
	if len(rs.runs) > 0 || len(sk) > 0 {
		fmt.Fprintln(w)
	}
}

func docs(doc string, rs *results) error {
	return docgen.Replace(doc, "bench/loss.sh", func(w io.Writer) { table(w, rs) })
}

var colors = map[string]string{"softroce": "#d62728", "softroce-sr": "#2ca02c", "rxe": "#1f77b4"}

// svg draws two panels against the netem loss: each stack's goodput, and its request packets
// sent per packet needed (with the selective-repeat target, 1.15 at 5%, as a dashed line).
func svg(w io.Writer, rs *results) {
	const W, PW, PH, L, T, B, G = 720, 270, 220, 60, 40, 60, 90
	groups := rs.byStack()
	maxLoss, maxGood, maxRatio := 1.0, 1.0, 2.0
	for _, g := range groups {
		for _, p := range g {
			_, _, hi, _ := p.goodput()
			maxLoss = math.Max(maxLoss, p.loss)
			maxGood = math.Max(maxGood, hi*1000)
			maxRatio = math.Max(maxRatio, p.ratio())
		}
	}
	maxGood = math.Ceil(maxGood/5) * 5
	maxRatio = math.Ceil(maxRatio)
	H := T + PH + B + 20*len(groups)
	fmt.Fprintf(w, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H)
	fmt.Fprintf(w, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", W, H)
	panel := func(x0 int, title string, ymin, ymax float64, val func(*point) (float64, bool), yfmt string) {
		x := func(l float64) float64 { return float64(x0) + l/maxLoss*PW }
		y := func(v float64) float64 { return T + PH - (v-ymin)/(ymax-ymin)*PH }
		fmt.Fprintf(w, "<text x=\"%d\" y=\"%d\" font-weight=\"bold\">%s</text>\n", x0, T-12, title)
		fmt.Fprintf(w, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#999\"/>\n", x0, T, PW, PH)
		for _, v := range []float64{ymin, (ymin + ymax) / 2, ymax} {
			fmt.Fprintf(w, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">"+yfmt+"</text>\n", x0-4, y(v)+4, v)
		}
		seen := map[float64]bool{}
		for _, g := range groups {
			for _, p := range g {
				if !seen[p.loss] {
					seen[p.loss] = true
					fmt.Fprintf(w, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", x(p.loss), T+PH+16, pct(p.loss))
				}
			}
		}
		fmt.Fprintf(w, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">netem loss</text>\n", float64(x0)+PW/2, T+PH+34)
		for _, g := range groups {
			c := colors[g[0].stack]
			if c == "" {
				c = "#7f7f7f"
			}
			var pts []string
			for _, p := range g {
				v, ok := val(p)
				if !ok {
					continue
				}
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(p.loss), y(v)))
				fmt.Fprintf(w, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>\n", x(p.loss), y(v), c)
			}
			if len(pts) > 1 {
				fmt.Fprintf(w, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"%s\"/>\n", c, strings.Join(pts, " "))
			}
		}
	}
	panel(L, "goodput (Mbit/s)", 0, maxGood, func(p *point) (float64, bool) {
		m, _, _, n := p.goodput()
		return m * 1000, n > 0
	}, "%.0f")
	x1 := L + PW + G
	panel(x1, "request packets sent per packet needed", 1, maxRatio, func(p *point) (float64, bool) { return p.ratio(), p.totals().withSend > 0 }, "%.1f")
	yt := T + PH - (1.15-1)/(maxRatio-1)*PH
	fmt.Fprintf(w, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#999\" stroke-dasharray=\"4 3\"/>\n", x1, x1+PW, yt, yt)
	fmt.Fprintf(w, "<text x=\"%d\" y=\"%.1f\" fill=\"#666\">1.15: the target at 5%%</text>\n", x1+4, yt-4)
	for i, g := range groups {
		c := colors[g[0].stack]
		if c == "" {
			c = "#7f7f7f"
		}
		ly := T + PH + B + 20*i
		fmt.Fprintf(w, "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"3\"/>\n", L, L+24, ly-4, ly-4, c)
		fmt.Fprintf(w, "<text x=\"%d\" y=\"%d\">%s</text>\n", L+30, ly, html.EscapeString(stackName(g[0].stack)))
	}
	fmt.Fprintln(w, "</svg>")
}
