package perf

import (
	"bytes"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/softroce/softroce/internal/oob/perftest"
)

// TestPerfConnections runs the UC and UD tests softroce <-> softroce in this process (UC:
// write and send, BW and latency; UD: send, BW and latency, -a up to the MTU, a -s above the
// MTU cut to it, as check_mtu does) with the checks of TestPerfPairs, and the banner's
// connection type.
func TestPerfConnections(t *testing.T) {
	for _, c := range []struct {
		args       []string
		sizes      []int
		iters, qps int
	}{
		{[]string{"write", "-c", "UC", "-s", "3000", "-n", "200", "-m", "1024"}, []int{3000}, 200, 1},
		{[]string{"send", "-c", "UC", "-s", "3000", "-n", "200", "-m", "1024"}, []int{3000}, 200, 1},
		{[]string{"send", "-c", "UC", "-s", "64", "-n", "300", "-q", "2"}, []int{64}, 300, 2},
		{[]string{"send", "-c", "UD", "-s", "1024", "-n", "200", "-m", "1024"}, []int{1024}, 200, 1},
		{[]string{"send", "-c", "UD", "-s", "4000", "-n", "100", "-m", "1024"}, []int{1024}, 100, 1},
		{[]string{"send", "-c", "UD", "-a", "-n", "5", "-m", "1024"}, []int{2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}, 5, 1},
		{[]string{"write", "--lat", "-c", "UC", "-s", "64", "-n", "200"}, []int{64}, 200, 1},
		{[]string{"send", "--lat", "-c", "UC", "-s", "3000", "-n", "200", "-m", "1024"}, []int{3000}, 200, 1},
		{[]string{"send", "--lat", "-c", "UD", "-s", "512", "-n", "200", "-m", "1024"}, []int{512}, 200, 1},
	} {
		t.Run(strings.Join(c.args, "_"), func(t *testing.T) {
			cfg, err := parsePerf(c.args, new(bytes.Buffer))
			if err != nil {
				t.Fatal(err)
			}
			_, _, so, co := perfPairInProcess(t, c.args...)
			checkPerfPair(t, so, co, cfg.Test, c.sizes, c.iters, c.qps, cfg.Gbits)
			want := " Connection type : " + cfg.Conn.String() + "\t"
			if !strings.Contains(so, want) || !strings.Contains(co, want) {
				t.Errorf("no %q in the banners", want)
			}
			if t.Failed() {
				t.Logf("server:\n%s\nclient:\n%s", so, co)
			}
		})
	}
}

// TestPerfBidirectional runs -b softroce <-> softroce: both sides measure and print the sum
// of both reports, so their rows are the same; the banner says Bidirectional and shows both
// depths.
func TestPerfBidirectional(t *testing.T) {
	for _, c := range []struct {
		args       []string
		sizes      []int
		iters, qps int
	}{
		{[]string{"write", "-b", "-s", "4096", "-n", "200"}, []int{4096}, 200, 1},
		{[]string{"read", "-b", "-s", "3000", "-n", "200", "-m", "1024"}, []int{3000}, 200, 1},
		{[]string{"atomic", "-b", "-n", "200", "-q", "2"}, []int{8}, 200, 2},
		{[]string{"write", "-b", "-a", "-n", "5"}, perfSizes(&perfConfig{All: true}, 0), 5, 1},
		{[]string{"send", "-b", "-s", "3000", "-n", "200", "-m", "1024"}, []int{3000}, 200, 1},
		{[]string{"send", "-b", "-s", "64", "-n", "300", "-q", "2", "-c", "UC"}, []int{64}, 300, 2},
		{[]string{"send", "-b", "-c", "UD", "-s", "1024", "-n", "200", "-m", "1024"}, []int{1024}, 200, 1},
		{[]string{"send", "-b", "-a", "-n", "5", "-m", "1024"}, perfSizes(&perfConfig{All: true}, 0), 5, 1},
		{[]string{"write", "-b", "-s", "64", "-n", "300", "--report-both"}, []int{64}, 300, 1},
	} {
		t.Run(strings.Join(c.args, "_"), func(t *testing.T) {
			cfg, err := parsePerf(c.args, new(bytes.Buffer))
			if err != nil {
				t.Fatal(err)
			}
			_, _, so, co := perfPairInProcess(t, c.args...)
			var rows [2]perfOutput
			for i, o := range []struct{ who, out string }{{"server", so}, {"client", co}} {
				rows[i] = parsePerfOutput(t, o.who, o.out, cfg.Test, cfg.Gbits)
				if len(rows[i].rows) != len(c.sizes) {
					t.Fatalf("%s: %d rows, want %d:\n%s", o.who, len(rows[i].rows), len(c.sizes), o.out)
				}
				for k, r := range rows[i].rows {
					checkBWRow(t, o.who, r, c.sizes[k], c.iters*c.qps, cfg.Gbits)
				}
				if !strings.Contains(o.out, " Bidirectional BW Test\n") || !strings.Contains(o.out, " TX depth ") ||
					(cfg.Verb == "send") != strings.Contains(o.out, " RX depth ") {
					t.Errorf("%s: banner:\n%s", o.who, o.out)
				}
				if cfg.ReportBoth && (!strings.Contains(o.out, "\n Local results: \n") || !strings.Contains(o.out, "\n Remote results: \n")) {
					t.Errorf("%s: --report-both without the local and remote results:\n%s", o.who, o.out)
				}
			}
			if fmt.Sprint(rows[0].rows) != fmt.Sprint(rows[1].rows) {
				t.Errorf("the sums differ: server %v, client %v", rows[0].rows, rows[1].rows)
			}
			if t.Failed() {
				t.Logf("server:\n%s\nclient:\n%s", so, co)
			}
		})
	}
}

// TestPerfDuration runs -D 1 -f 0 (each side measures for one second, the whole time a
// sample) softroce <-> softroce: BW rows count the sample's messages, with no peak; latency
// rows are print_report_lat_duration's (t_avg, and the transactions per second it implies).
// The duration is the feature under test: these runs take their second.
func TestPerfDuration(t *testing.T) {
	if testing.Short() {
		t.Skip("each run measures for its -D")
	}
	for _, args := range [][]string{
		{"write", "-D", "1", "-f", "0", "-s", "4096"},
		{"send", "-D", "1", "-f", "0", "-s", "4096", "-c", "UC"},
		{"send", "-b", "-D", "1", "-f", "0", "-s", "1024", "-c", "UD", "-m", "1024"},
		{"write", "-b", "-D", "1", "-f", "0", "-s", "64"},
		{"write", "--lat", "-D", "1", "-f", "0", "-s", "64"},
		{"send", "--lat", "-D", "1", "-f", "0", "-s", "64"},
		{"read", "--lat", "-D", "1", "-f", "0", "-s", "64"},
	} {
		t.Run(strings.Join(args, "_"), func(t *testing.T) {
			cfg, err := parsePerf(args, new(bytes.Buffer))
			if err != nil {
				t.Fatal(err)
			}
			_, _, so, co := perfPairInProcess(t, args...)
			for _, o := range []struct{ who, out string }{{"server", so}, {"client", co}} {
				header := perftest.BWHeader(false)
				if !cfg.Test.BW() {
					header = perftest.HeaderLatDur
					if o.who == "server" && cfg.Verb == "read" {
						continue // read_lat.c: the server prints no table
					}
				}
				i := strings.Index(o.out, header)
				if i < 0 {
					t.Fatalf("%s: no header %q:\n%s", o.who, header, o.out)
				}
				f := strings.Fields(strings.SplitN(o.out[i+len(header):], "\n", 2)[0])
				v := make([]float64, len(f))
				for k := range f {
					if v[k], err = strconv.ParseFloat(f[k], 64); err != nil {
						t.Fatalf("%s: row %q", o.who, f)
					}
				}
				switch {
				case cfg.Test.BW() && len(v) == 5:
					size := cfg.Size
					if v[0] != float64(size) || v[1] < 10 || v[2] != 0 || v[3] <= 0 {
						t.Errorf("%s: row %v: want %d bytes, a sample of messages, no peak", o.who, v, size)
					}
					if want := v[4] * 1e6 * float64(size) / perftest.BytesPerMB; !cfg.Duplex && math.Abs(want-v[3]) > 0.02*v[3]+0.01 {
						t.Errorf("%s: BW %v, message rate %v", o.who, v[3], v[4])
					}
				case !cfg.Test.BW() && len(v) == 4:
					// t_avg is half (WRITE, SEND) or all (READ) of window/iters; tps is iters/window
					half := 2.0
					if cfg.Verb == "read" {
						half = 1
					}
					if v[0] != float64(cfg.Size) || v[1] < 10 || v[2] <= 0 || math.Abs(v[3]-v[1]) > 0.01*v[3]+0.01 ||
						math.Abs(v[2]*half*v[3]-1e6) > 0.02e6 {
						t.Errorf("%s: latency row %v: %d bytes, iterations, t_avg, tps over 1 s", o.who, v, cfg.Size)
					}
				default:
					t.Errorf("%s: row %v", o.who, v)
				}
			}
			if t.Failed() {
				t.Logf("server:\n%s\nclient:\n%s", so, co)
			}
		})
	}
}
