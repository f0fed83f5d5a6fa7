package main

import (
	"encoding/xml"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/softroce/softroce/bench/internal/docgen"
)

// sample is what bench/loss.sh collects: guest lines of three runs of two stacks, a failed
// run, and a skipped stack.
const sample = `RUN|softroce|0|100|65536|4096|2|20
SEND|1600|0|0|0
RECV|1600|0|0
GOODPUT|0.019500
WALL|5.41
NETEM|1612|0|1612|6830000
TC|qdisc tbf 1: root refcnt 2 rate 20Mbit burst 20000b lat 400.0ms
LOG|stats: sent_pkts 1600
SKIP|softroce-sr|0|this softroce has no --selective-repeat (softroce perf -h)
RUN|rxe|0|100|65536|4096|2|20
SEND|1600|-1|0|0
RECV|1600|0|0
GOODPUT|0.019000
WALL|5.60
NETEM|1610|0|1610|6820000
RUN|softroce|5|100|65536|4096|2|20
SEND|4800|3200|150|140
RECV|4550|1900|140
GOODPUT|0.006500
WALL|16.20
NETEM|4812|250|4562|19300000
RUN|rxe|5|100|65536|4096|2|20
GOODPUT|FAIL
WALL|270.00
RUN|softroce|1|100|65536|4096|2|20
SEND|2000|400|30|29
RECV|1980|380|29
GOODPUT|0.016
WALL|6.50
NETEM|2010|20|1990|8400000
`

func loadSample(t *testing.T) *results {
	t.Helper()
	f := filepath.Join(t.TempDir(), "loss.txt")
	if err := os.WriteFile(f, []byte(sample), 0o644); err != nil {
		t.Fatal(err)
	}
	rs, err := load(f)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func TestParse(t *testing.T) {
	rs := loadSample(t)
	if len(rs.runs) != 5 {
		t.Fatalf("%d runs, want 5", len(rs.runs))
	}
	if got := strings.Join(rs.order, ","); got != "softroce,softroce-sr,rxe" {
		t.Errorf("stacks %s", got)
	}
	if rs.skips["softroce-sr"] == "" {
		t.Errorf("softroce-sr not skipped")
	}
	r := rs.runs[2] // softroce at 5%
	if r.stack != "softroce" || r.loss != 5 || r.sent != 4800 || r.retrans != 3200 || r.retries != 150 ||
		r.seqNAKs != 140 || r.rcvd != 4550 || r.netemIn != 4812 || r.netemDrp != 250 || r.wall != 16.2 {
		t.Errorf("softroce 5%%: %+v", *r)
	}
	if r.needed() != 1600 {
		t.Errorf("needed %d, want 100 x 64 KiB / 4096 = 1600", r.needed())
	}
	if rs.runs[1].retrans != -1 {
		t.Errorf("rxe retransmissions %d, want -1 (not counted)", rs.runs[1].retrans)
	}
	f := rs.runs[3] // rxe at 5%: failed, no counters
	if f.goodput != -1 || f.haveSend || f.haveNetem {
		t.Errorf("failed run: %+v", *f)
	}
	g := rs.byStack()
	if len(g) != 2 || len(g[0]) != 3 || len(g[1]) != 2 || g[0][0].stack != "softroce" || g[1][0].stack != "rxe" {
		t.Fatalf("points: %d stacks", len(g))
	}
	for i, want := range []float64{0, 1, 5} {
		if g[0][i].loss != want {
			t.Errorf("softroce point %d at %v%%, want %v%% (sorted by loss)", i, g[0][i].loss, want)
		}
	}
	if v := g[0][2].ratio(); math.Abs(v-3) > 1e-9 {
		t.Errorf("softroce 5%% ratio %v, want 3", v)
	}
	if v := g[1][1].ratio(); v != 0 {
		t.Errorf("failed run's ratio %v, want 0 (unknown)", v)
	}
}

func TestParseErrors(t *testing.T) {
	for _, in := range []string{
		"RUN|softroce|5|100\n",                 // short
		"RUN|softroce|x|100|65536|4096|2|20\n", // loss not a number
		"RUN|softroce|5|0|65536|4096|2|20\n",   // no iterations
		"RUN|softroce|5|100|65536|0|2|20\n",    // no MTU
	} {
		rs := &results{skips: map[string]string{}}
		if err := rs.parse(in); err == nil {
			t.Errorf("parse(%q) accepted", in)
		}
	}
	// lines before any RUN, and unknown lines, are ignored
	rs := &results{skips: map[string]string{}}
	if err := rs.parse("SEND|1|2|3|4\nGOODPUT|1\nS|1|2\n\n"); err != nil || len(rs.runs) != 0 {
		t.Errorf("stray lines: %v, %d runs", err, len(rs.runs))
	}
}

func TestNeededRoundsUp(t *testing.T) {
	r := run{iters: 10, size: 5000, mtu: 4096}
	if n := r.needed(); n != 20 {
		t.Errorf("needed %d, want 20 (two packets a message)", n)
	}
}

func TestTable(t *testing.T) {
	rs := loadSample(t)
	var b strings.Builder
	table(&b, rs)
	out := b.String()
	lines := strings.Split(out, "\n")
	// header, rule, 3 softroce rows (sorted by loss), 2 rxe rows
	want := []string{
		"| softroce <-> softroce, go-back-N | 0% | 1 | 19.5 Mbit/s | 100% | 1600 | 1600 | 1.00 | 0 | 1612 / 0 | 0 (0) | 5.4 s |",
		"| softroce <-> softroce, go-back-N | 1% | 1 | 16.0 Mbit/s | 82% | 2000 | 1600 | 1.25 | 400 | 2010 / 20 | 30 (29) | 6.5 s |",
		"| softroce <-> softroce, go-back-N | 5% | 1 | 6.5 Mbit/s | 33% | 4800 | 1600 | 3.00 | 3200 | 4812 / 250 | 150 (140) | 16.2 s |",
		"| kernel rxe <-> kernel rxe | 0% | 1 | 19.0 Mbit/s | 100% | 1600 | 1600 | 1.00 | - | 1610 / 0 | 0 (0) | 5.6 s |",
		"| kernel rxe <-> kernel rxe | 5% | 1 (1 failed) | - | - | - | - | - | - | - | - | 270.0 s |",
	}
	if len(lines) < 2+len(want) {
		t.Fatalf("table:\n%s", out)
	}
	for i, w := range want {
		if lines[2+i] != w {
			t.Errorf("row %d:\n got %s\nwant %s", i, lines[2+i], w)
		}
	}
	for _, s := range []string{"100 RDMA WRITEs of 65536 bytes, 2 outstanding, MTU 4096", "20 Mbit/s", "Not run: softroce <-> softroce, selective repeat: this softroce has no --selective-repeat"} {
		if !strings.Contains(out, s) {
			t.Errorf("table lacks %q:\n%s", s, out)
		}
	}
}

func TestDocs(t *testing.T) {
	rs := loadSample(t)
	doc := filepath.Join(t.TempDir(), "doc.md")
	beginMark, endMark := docgen.Markers("bench/loss.sh")
	in := "before\n" + beginMark + "\nold table\n" + endMark + "\nafter\n"
	if err := os.WriteFile(doc, []byte(in), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := docs(doc, rs); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(doc)
	s := string(b)
	if strings.Contains(s, "old table") || !strings.HasPrefix(s, "before\n"+beginMark+"\n| stack |") || !strings.HasSuffix(s, endMark+"\nafter\n") {
		t.Errorf("doc:\n%s", s)
	}
	if err := os.WriteFile(doc, []byte("no markers\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := docs(doc, rs); err == nil {
		t.Errorf("a doc without markers was accepted")
	}
}

func TestSVG(t *testing.T) {
	rs := loadSample(t)
	var b strings.Builder
	svg(&b, rs)
	out := b.String()
	// well-formed XML (the stack names carry "<->")
	d := xml.NewDecoder(strings.NewReader(out))
	for {
		if _, err := d.Token(); err != nil {
			if err != io.EOF {
				t.Fatalf("svg is not well-formed: %v\n%s", err, out)
			}
			break
		}
	}
	// two polylines per stack with at least two points: softroce in both panels, rxe's
	// goodput has one point left (its 5% run failed) and its ratio too
	if n := strings.Count(out, "<polyline"); n != 2 {
		t.Errorf("%d polylines, want 2:\n%s", n, out)
	}
	if !strings.Contains(out, "kernel rxe &lt;-&gt; kernel rxe") {
		t.Errorf("legend lacks rxe")
	}
}

// TestRounds: a second round of the same stack and loss joins the first's row: counters and
// times summed, the goodput their mean with the range; a failed round is counted and its
// counters still count.
func TestRounds(t *testing.T) {
	rs := &results{skips: map[string]string{}}
	in := `RUN|rxe|0|100|65536|4096|2|20
SEND|1600|-1|0|0
GOODPUT|0.020
WALL|5
RUN|rxe|5|100|65536|4096|2|20
SEND|4000|-1|100|90
GOODPUT|0.008
WALL|12
NETEM|4010|200|3810|1
RUN|rxe|0|100|65536|4096|2|20
SEND|1700|-1|2|0
GOODPUT|0.018
WALL|6
RUN|rxe|5|100|65536|4096|2|20
SEND|5600|-1|150|120
GOODPUT|FAIL
WALL|40
NETEM|5610|280|5330|1
`
	if err := rs.parse(in); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	table(&b, rs)
	lines := strings.Split(b.String(), "\n")
	want := []string{
		"| kernel rxe <-> kernel rxe | 0% | 2 | 19.0 Mbit/s (18.0-20.0) | 100% | 3300 | 3200 | 1.03 | - | - | 2 (0) | 11.0 s |",
		"| kernel rxe <-> kernel rxe | 5% | 2 (1 failed) | 8.0 Mbit/s | 42% | 9600 | 3200 | 3.00 | - | 9620 / 480 | 250 (210) | 52.0 s |",
	}
	for i, w := range want {
		if lines[2+i] != w {
			t.Errorf("row %d:\n got %s\nwant %s", i, lines[2+i], w)
		}
	}
}
