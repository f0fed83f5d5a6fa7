package perf

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/oob/perftest"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/internal/rocetest"
	"github.com/softroce/softroce/internal/tools/tooltest"
	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/roce"
)

// perfEnv is where a test's run writes, plus the Config's test seam.
type perfEnv struct {
	Stdout, Stderr io.Writer
	Listener       net.Listener
}

// perfMain is Main with env's listener, leaving GOMAXPROCS alone.
func perfMain(args []string, env *perfEnv) int {
	return main(context.Background(), args, env.Stdout, env.Stderr, false, func(c *Config) { c.Listener = env.Listener })
}

// parsePerf is parseArgs (the test's stderr is not used: errors are returned).
func parsePerf(args []string, _ io.Writer) (*perfConfig, error) { return parseArgs(args) }

// TestPerfFlags checks perftest's defaults and dependencies (perftest_parameters.c
// init_perftest_params / force_dependecies) and the refusals.
func TestPerfFlags(t *testing.T) {
	parse := func(args ...string) (*perfConfig, error) {
		var errb bytes.Buffer
		return parsePerf(args, &errb)
	}
	for _, c := range []struct {
		args                                []string
		test                                perftest.Test
		size, iters, tx, rx, cqMod, outRead int
		noPeak                              bool
	}{
		{[]string{"write"}, perftest.WriteBW, 65536, 5000, 128, 1, 1, 128, false}, // >8 KiB: cq_mod 1
		{[]string{"write", "-s", "4096"}, perftest.WriteBW, 4096, 5000, 128, 1, 100, 128, false},
		{[]string{"write", "-n", "5", "-s", "3000"}, perftest.WriteBW, 3000, 5, 5, 1, 5, 128, false}, // the lab's CQ Moderation 5
		{[]string{"send", "-n", "300"}, perftest.SendBW, 65536, 300, 128, 300, 1, 128, true},         // the server: no peak
		{[]string{"send", "-s", "64", "h"}, perftest.SendBW, 64, 5000, 128, 512, 100, 128, false},
		{[]string{"send", "-n", "5", "h"}, perftest.SendBW, 65536, 5, 5, 6, 1, 128, false},                                    // an odd rx_depth + 1
		{[]string{"send", "-c", "UD", "-n", "20000", "-s", "1024"}, perftest.SendBW, 1024, 20000, 128, 16000, 100, 128, true}, // UD: a receive per message
		{[]string{"send", "-c", "UC", "-n", "100", "h"}, perftest.SendBW, 65536, 100, 100, 100, 1, 128, false},
		{[]string{"write", "-D", "4"}, perftest.WriteBW, 65536, 5000, 128, 1, 1, 128, true}, // duration: no peak, tx_depth not capped
		{[]string{"send", "-D", "4", "-n", "10", "h"}, perftest.SendBW, 65536, 10, 128, 512, 1, 128, true},
		{[]string{"read", "-n", "20001"}, perftest.ReadBW, 65536, 20001, 128, 1, 1, 128, true},
		{[]string{"atomic", "-o", "16"}, perftest.AtomicBW, 8, 5000, 128, 1, 100, 16, false},
		{[]string{"write", "--lat"}, perftest.WriteLat, 2, 1000, 1, 1, 1, 128, false},
		{[]string{"send", "--lat", "-s", "8"}, perftest.SendLat, 8, 1000, 1, 512, 1, 128, false},
		{[]string{"read", "--lat"}, perftest.ReadLat, 2, 1000, 1, 1, 1, 128, false},
		{[]string{"atomic", "--lat", "-A", "CMP_AND_SWAP"}, perftest.AtomicLat, 8, 1000, 1, 1, 1, 128, false},
		{[]string{"write", "-a", "-n", "10"}, perftest.WriteBW, perfMaxSize, 10, 10, 1, 10, 128, false}, // -a keeps cq_mod
	} {
		cfg, err := parse(c.args...)
		if err != nil {
			t.Errorf("%v: %v", c.args, err)
			continue
		}
		got := []int{cfg.Size, cfg.Iters, cfg.TxDepth, cfg.RxDepth, cfg.CQMod, cfg.OutReads}
		want := []int{c.size, c.iters, c.tx, c.rx, c.cqMod, c.outRead}
		if cfg.Test != c.test || fmt.Sprint(got) != fmt.Sprint(want) || cfg.NoPeak != c.noPeak {
			t.Errorf("%v: test %v size/iters/tx/rx/cqmod/outreads %v noPeak %v, want %v %v %v", c.args, cfg.Test, got, cfg.NoPeak, c.test, want, c.noPeak)
		}
	}
	cfg, err := parse("write", "-d", "127.0.0.2", "-m", "1024", "-x", "1", "-F", "--report_gbits", "-q", "4", "-p", "20000", "10.1.2.3")
	if err != nil || cfg.Server != "10.1.2.3" || cfg.MTU != qp.MTU1024 || cfg.QPs != 4 || !cfg.Gbits || cfg.Port != 20000 ||
		cfg.Dev.Addr != netip.MustParseAddr("127.0.0.2") || cfg.GIDIndex != 1 {
		t.Errorf("full command line: %+v %v", cfg, err)
	}
	for _, bad := range [][]string{
		{}, {"-s", "8"}, {"flush"}, {"write", "-n", "4"}, {"atomic", "-s", "64"}, {"atomic", "-a"}, {"write", "-m", "1500"},
		{"atomic", "-A", "SWAP"}, {"write", "--lat", "-b"}, {"write", "-D", "0"}, {"write", "-D", "4", "-a"}, {"send", "-D", "4", "-e"},
		{"write", "-D", "2", "-f", "1"}, {"write", "-f", "3"}, {"write", "-R"}, {"write", "-c", "UD"}, {"read", "-c", "UC"}, {"write", "-c", "rc"},
		{"write", "--lat", "-q", "2"}, {"write", "-q", "0"}, {"write", "-s", "8388609"}, {"write", "-i", "2"},
		{"write", "a", "b"}, {"write", "--loopback", "host"}, {"write", "-p", "70000"}, {"write", "--timeout", "0s"},
	} {
		if _, err := parse(bad...); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if _, err := parse("write", "-c", "XRC"); !errors.Is(err, errPerfUnsupported) {
		t.Errorf("-c XRC: %v, want errPerfUnsupported", err)
	}
	if cfg, err := parse("write", "--selective-repeat", "h"); err != nil || !cfg.SelectiveRepeat {
		t.Errorf("--selective-repeat: %+v %v", cfg.SelectiveRepeat, err)
	}
	for _, bad := range [][]string{{"send", "-c", "UD", "--selective-repeat"}, {"write", "--loopback", "--selective-repeat"},
		{"write", "--daemon", "/x", "--selective-repeat"}} {
		if _, err := parse(bad...); !errors.Is(err, errPerfUnsupported) {
			t.Errorf("%q: %v, want errPerfUnsupported", bad, err)
		}
	}
	cfg, err = parse("write", "-b", "-D", "6", "-c", "UC", "--report-both", "h")
	if err != nil || !cfg.Duplex || cfg.Duration != 6*time.Second || cfg.Margin != time.Second || cfg.Conn != qp.TypeUC || !cfg.ReportBoth {
		t.Errorf("-b -D 6 -c UC: %+v %v", cfg, err)
	}
	if cfg, err = parse("send", "-D", "10", "-f", "0", "-c", "UD", "h"); err != nil || cfg.Margin != 0 || cfg.Conn != qp.TypeUD {
		t.Errorf("-D 10 -f 0 -c UD: %+v %v", cfg, err)
	}
}

// TestPerfPeak compares perfPeak with a direct evaluation of print_report_bw's definition.
func TestPerfPeak(t *testing.T) {
	us := func(v ...int) []time.Duration {
		d := make([]time.Duration, len(v))
		for i, x := range v {
			d[i] = time.Duration(x) * time.Microsecond
		}
		return d
	}
	// cq_mod 1: every completion time is known; the best window is messages 2..3
	// ((40-20)/2 = 10 us), better than any single message (>= 12 us).
	posted := us(0, 1, 20, 21, 22)
	completed := us(15, 30, 32, 40, 70)
	if got := perfPeak(posted, completed, 1); got != 10*time.Microsecond {
		t.Errorf("cq_mod 1: %v, want 10us", got)
	}
	// cq_mod 2 over 5 messages: completions 1, 3 and (explicitly signaled) the last, 4.
	// Windows: (i=0,j=1) 30/2=15, (0,3) 40/4=10, (0,4) 70/5=14, (1,1) 29, (1,3) 39/3=13,
	// (2,3) 20/2=10, (2,4) 50/3=16, (3,3) 19, (3,4) 49/2=24, (4,4) 48 -> 10.
	if got := perfPeak(posted, completed, 2); got != 10*time.Microsecond {
		t.Errorf("cq_mod 2: %v, want 10us", got)
	}
	completed[3] = us(60)[0] // now (0,4) = 14 is the best
	if got := perfPeak(posted, completed, 2); got != 14*time.Microsecond {
		t.Errorf("cq_mod 2 after change: %v, want 14us", got)
	}
	// Random runs against perftest's exhaustive search.
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 200; trial++ {
		n := 1 + rng.IntN(60)
		cqMod := 1 + rng.IntN(8)
		p, c := make([]time.Duration, n), make([]time.Duration, n)
		var at time.Duration
		for i := range p {
			at += time.Duration(rng.IntN(5000))
			p[i] = at
			c[i] = at + time.Duration(1+rng.IntN(20000))
		}
		for i := 1; i < n; i++ { // completions in order
			c[i] = max(c[i], c[i-1])
		}
		want := c[n-1] - p[0]
		for i := 0; i < n; i++ {
			for j := i; j < n; j++ {
				if j%cqMod == cqMod-1 || j == n-1 {
					want = min(want, (c[j]-p[i])/time.Duration(j-i+1))
				}
			}
		}
		if got := perfPeak(p, c, cqMod); got != want {
			t.Fatalf("trial %d (n %d cq_mod %d): %v, exhaustive search %v", trial, n, cqMod, got, want)
		}
	}
}

// perfRow is one result line.
type perfRow []float64

var (
	perfLocalRe  = regexp.MustCompile(`(?m)^ local address: LID 0000 QPN (0x[0-9a-f]+) PSN (0x[0-9a-f]+)(.*)\n GID: ([0-9:]+)$`)
	perfRemoteRe = regexp.MustCompile(`(?m)^ remote address: LID 0000 QPN (0x[0-9a-f]+) PSN (0x[0-9a-f]+)(.*)\n GID: ([0-9:]+)$`)
)

// perfOutput splits a run's output into its address lines and result rows, checking the
// table's frame (separator, header).
type perfOutput struct {
	locals, remotes [][]string
	rows            []perfRow
}

func parsePerfOutput(t *testing.T, who, out string, tst perftest.Test, gbits bool) perfOutput {
	t.Helper()
	var o perfOutput
	o.locals = perfLocalRe.FindAllStringSubmatch(out, -1)
	o.remotes = perfRemoteRe.FindAllStringSubmatch(out, -1)
	header := perftest.HeaderLat
	cols := 9
	if tst.BW() {
		header, cols = perftest.BWHeader(gbits), 5
	}
	i := strings.Index(out, header)
	if i < 0 {
		t.Errorf("%s: no header %q in\n%s", who, header, out)
		return o
	}
	rest := out[i+len(header):]
	for _, line := range strings.Split(rest, "\n") {
		if line+"\n" == perftest.ResultLine {
			break
		}
		f := strings.Fields(line)
		if len(f) != cols {
			t.Errorf("%s: result line %q has %d columns, want %d", who, line, len(f), cols)
			continue
		}
		row := make(perfRow, cols)
		for k, s := range f {
			v, err := strconv.ParseFloat(s, 64)
			if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				t.Errorf("%s: column %d of %q: %q", who, k, line, s)
			}
			row[k] = v
		}
		o.rows = append(o.rows, row)
	}
	if !strings.HasSuffix(out, perftest.ResultLine) {
		t.Errorf("%s: output does not end with the separator:\n%s", who, out)
	}
	return o
}

// checkBWRow: #bytes and #iterations as asked, peak >= average > 0 (peak 0 = not measured),
// and the message rate consistent with the average (BW = rate x size).
func checkBWRow(t *testing.T, who string, r perfRow, size, iters int, gbits bool) {
	t.Helper()
	if int(r[0]) != size || int(r[1]) != iters {
		t.Errorf("%s: row %v: want %d bytes x %d iterations", who, r, size, iters)
	}
	avg, peak, rate := r[3], r[2], r[4]
	unit := float64(perftest.BytesPerMB)
	if gbits {
		unit = perftest.BytesPerGbit
	}
	// BW = rate x size; the columns are rounded to 2 (BW) and 6 (rate) decimals.
	perRate := 1e6 * float64(size) / unit
	want := rate * perRate
	if rate <= 0 || (peak != 0 && peak < avg*0.99) || (avg == 0 && want >= 0.01) {
		t.Errorf("%s: implausible row %v", who, r)
	}
	if math.Abs(want-avg) > 0.02*avg+0.006+0.5e-6*perRate {
		t.Errorf("%s: BW average %v but msg rate %v x %d bytes = %v", who, avg, rate, size, want)
	}
}

// checkLatRow: #bytes and #iterations as asked, 0 < t_min <= t_typical <= t_max,
// t_min <= t_avg, t_min <= 99% <= 99.9%.
func checkLatRow(t *testing.T, who string, r perfRow, size, iters int) {
	t.Helper()
	if int(r[0]) != size || int(r[1]) != iters {
		t.Errorf("%s: row %v: want %d bytes x %d iterations", who, r, size, iters)
	}
	mn, mx, typ, avg, p99, p999 := r[2], r[3], r[4], r[5], r[7], r[8]
	if !(mn > 0 && mn <= typ && typ <= mx && mn <= avg && mn <= p99 && p99 <= p999) {
		t.Errorf("%s: implausible latency row %v", who, r)
	}
}

// checkPerfPair checks both sides of a run: exit statuses, each side's remote address lines
// are the other's local lines (GIDs 127.0.0.1 / 127.0.0.2), and the result rows.
func checkPerfPair(t *testing.T, srvOut, cliOut string, tst perftest.Test, sizes []int, iters, qps int, gbits bool) {
	t.Helper()
	checkPerfPairAt(t, srvOut, cliOut, tst, sizes, iters, qps, gbits,
		"00:00:00:00:00:00:00:00:00:00:255:255:127:00:00:01", "00:00:00:00:00:00:00:00:00:00:255:255:127:00:00:02")
}

// checkPerfPairAt is checkPerfPair for a server and a client with the given local GIDs (as
// perftest prints them).
func checkPerfPairAt(t *testing.T, srvOut, cliOut string, tst perftest.Test, sizes []int, iters, qps int, gbits bool, srvGID, cliGID string) {
	t.Helper()
	var so perfOutput
	if tst == perftest.ReadLat || tst == perftest.AtomicLat {
		// read_lat.c: the server prints its addresses and a separator, no table
		so.locals = perfLocalRe.FindAllStringSubmatch(srvOut, -1)
		so.remotes = perfRemoteRe.FindAllStringSubmatch(srvOut, -1)
		if strings.Contains(srvOut, "#bytes") || !strings.HasSuffix(srvOut, perftest.ResultLine+perftest.ResultLine) {
			t.Errorf("read/atomic latency server output:\n%s", srvOut)
		}
	} else {
		so = parsePerfOutput(t, "server", srvOut, tst, gbits)
	}
	co := parsePerfOutput(t, "client", cliOut, tst, gbits)
	for _, s := range []struct {
		who      string
		o, peer  perfOutput
		localGID string
	}{{"server", so, co, srvGID}, {"client", co, so, cliGID}} {
		if len(s.o.locals) != qps || len(s.o.remotes) != qps {
			t.Errorf("%s: %d local and %d remote address lines, want %d", s.who, len(s.o.locals), len(s.o.remotes), qps)
			continue
		}
		for i := 0; i < qps && i < len(s.peer.locals); i++ {
			if s.o.locals[i][4] != s.localGID {
				t.Errorf("%s: local GID %s", s.who, s.o.locals[i][4])
			}
			if strings.Join(s.o.remotes[i][1:], "|") != strings.Join(s.peer.locals[i][1:], "|") {
				t.Errorf("%s: remote address %v is not the peer's local %v", s.who, s.o.remotes[i][1:], s.peer.locals[i][1:])
			}
		}
	}
	check := func(who string, o perfOutput, want []int) {
		if len(o.rows) != len(want) {
			t.Errorf("%s: %d result rows, want %d", who, len(o.rows), len(want))
			return
		}
		for i, r := range o.rows {
			if tst.BW() {
				checkBWRow(t, who, r, want[i], iters*qps, gbits)
			} else {
				checkLatRow(t, who, r, want[i], iters)
			}
		}
	}
	check("client", co, sizes)
	// perftest's frame: read/atomic tools start with ctx_set_max_inline's separator, a server
	// then prints the waiting banner, and both the test's banner (title, MTU, GID index).
	pre := ""
	if v := tst.String(); strings.Contains(v, "read") || strings.Contains(v, "atomic") {
		pre = perftest.ResultLine
	}
	title := map[perftest.Test]string{perftest.WriteBW: "RDMA_Write BW Test", perftest.ReadBW: "RDMA_Read BW Test",
		perftest.SendBW: "Send BW Test", perftest.AtomicBW: "BW Test", perftest.WriteLat: "RDMA_Write Latency Test",
		perftest.ReadLat: "RDMA_Read Latency Test", perftest.SendLat: "Send Latency Test", perftest.AtomicLat: "Latency Test"}[tst]
	for _, o := range []struct{ who, out, start string }{
		{"server", srvOut, pre + perftest.WaitingBanner + perftest.ResultLine}, {"client", cliOut, pre + perftest.ResultLine},
	} {
		if !strings.HasPrefix(o.out, o.start) || !strings.Contains(o.out, title+"\n") || !strings.Contains(o.out, " GID index       : 1\n") ||
			!strings.Contains(o.out, "\tDevice         : softroce0\n") {
			t.Errorf("%s: not perftest's frame (%q, banner %q):\n%s", o.who, o.start, title, o.out)
		}
	}
	switch {
	case tst == perftest.ReadLat || tst == perftest.AtomicLat:
		if len(so.rows) != 0 {
			t.Errorf("read/atomic latency server printed results %v", so.rows)
		}
	case tst.BW() && !tst.Send():
		// the server prints the client's report of the last size, as received
		if len(so.rows) != 1 || len(co.rows) == 0 || fmt.Sprint(so.rows[0]) != fmt.Sprint(co.rows[len(co.rows)-1]) {
			t.Errorf("server rows %v, want the client's last %v", so.rows, co.rows)
		}
	default:
		check("server", so, sizes)
	}
}

// perfPairInProcess runs a server on 127.0.0.1 and a client on 127.0.0.2 in this process.
func perfPairInProcess(t *testing.T, args ...string) (srvStatus, cliStatus int, srvOut, cliOut string) {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	common := append(append([]string{}, args...), "-p", port, "--roce-port", strconv.Itoa(int(tooltest.FreeUDPPort(t))),
		"--timeout", "20s", "--run-timeout", "20s")
	// -u 17 (0.5 s per try) unless the case sets it: both ends share this process, and on a
	// busy test machine (the race detector, other packages' tests) a scheduling stall can
	// outlast perftest's default ACK timeout (14: 67 ms) times 7 retries; no case here loses
	// packets on purpose
	if !slices.Contains(args, "-u") && !slices.Contains(args, "--qp-timeout") {
		common = append(common, "-u", "17")
	}
	var so, se, co, ce bytes.Buffer
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		srvStatus = perfMain(append(append([]string{}, common...), "-d", "127.0.0.1"), &perfEnv{Stdout: &so, Stderr: &se, Listener: ln})
	}()
	cliStatus = perfMain(append(append([]string{}, common...), "-d", "127.0.0.2", "127.0.0.1"), &perfEnv{Stdout: &co, Stderr: &ce})
	wg.Wait()
	if se.Len() != 0 || ce.Len() != 0 {
		t.Errorf("stderr: server %q client %q", se.String(), ce.String())
	}
	if srvStatus != 0 || cliStatus != 0 {
		t.Errorf("%v: exit status server %d client %d\nserver:\n%s\nclient:\n%s", args, srvStatus, cliStatus, so.String(), co.String())
	}
	return srvStatus, cliStatus, so.String(), co.String()
}

// TestPerfPairs runs every test softroce <-> softroce in this process (UDP on 127.0.0.1 and
// 127.0.0.2, real OOB over TCP) and checks both outputs.
func TestPerfPairs(t *testing.T) {
	for _, c := range []struct {
		args       []string
		sizes      []int
		iters, qps int
	}{
		{[]string{"write", "-s", "3000", "-n", "200", "-m", "1024"}, []int{3000}, 200, 1},
		{[]string{"write", "-s", "65536", "-n", "100", "-q", "2", "--report_gbits"}, []int{65536}, 100, 2},
		{[]string{"write", "-s", "65536", "-n", "100", "--selective-repeat"}, []int{65536}, 100, 1},
		{[]string{"read", "-s", "3000", "-n", "200", "-m", "1024"}, []int{3000}, 200, 1},
		{[]string{"send", "-s", "3000", "-n", "200", "-m", "1024"}, []int{3000}, 200, 1},
		{[]string{"send", "-s", "64", "-n", "300", "-q", "2", "-r", "16"}, []int{64}, 300, 2},
		// -n not a multiple of cq_mod (100) with several QPs: the last signaled WR of a QP
		// completes fewer than cq_mod messages (counting cq_mod there stopped the client)
		// -u 17: 8 QPs x 128 WRITEs in flight on a busy machine can go unanswered for longer
		// than perftest's default ACK timeout (14: 67 ms) times 7 retries
		{[]string{"write", "-s", "64", "-n", "1050", "-q", "8", "-u", "17"}, []int{64}, 1050, 8},
		{[]string{"atomic", "-n", "200"}, []int{8}, 200, 1},
		{[]string{"atomic", "-n", "200", "-A", "CMP_AND_SWAP"}, []int{8}, 200, 1},
		{[]string{"write", "--lat", "-s", "64", "-n", "300"}, []int{64}, 300, 1},
		{[]string{"write", "--lat", "-s", "3000", "-n", "300", "-m", "1024"}, []int{3000}, 300, 1}, // iteration bytes wrap at 256
		{[]string{"send", "--lat", "-s", "8", "-n", "300"}, []int{8}, 300, 1},
		{[]string{"read", "--lat", "-s", "64", "-n", "100"}, []int{64}, 100, 1},
		{[]string{"atomic", "--lat", "-n", "100"}, []int{8}, 100, 1},
		{[]string{"write", "-a", "-n", "5", "-m", "4096"}, perfSizes(&perfConfig{All: true}, 0), 5, 1},
		{[]string{"send", "-a", "-n", "5"}, perfSizes(&perfConfig{All: true}, 0), 5, 1},
		{[]string{"send", "--lat", "-a", "-n", "5"}, perfSizes(&perfConfig{All: true}, 0), 5, 1},
	} {
		t.Run(strings.Join(c.args, "_"), func(t *testing.T) {
			cfg, err := parsePerf(c.args, new(bytes.Buffer))
			if err != nil {
				t.Fatal(err)
			}
			_, _, so, co := perfPairInProcess(t, c.args...)
			checkPerfPair(t, so, co, cfg.Test, c.sizes, c.iters, c.qps, cfg.Gbits)
			if t.Failed() {
				t.Logf("server:\n%s\nclient:\n%s", so, co)
			}
		})
	}
}

// TestPerfNoPeer: a client without a server and a server without a client fail within their
// --timeout with exit status 1 (perftest would wait forever or fail at once).
func TestPerfNoPeer(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close() // nobody listens there now: connections are refused
	var out, errb bytes.Buffer
	start := time.Now()
	st := perfMain([]string{"write", "-d", "127.0.0.2", "-p", port, "--roce-port", strconv.Itoa(int(tooltest.FreeUDPPort(t))),
		"--timeout", "500ms", "127.0.0.1"}, &perfEnv{Stdout: &out, Stderr: &errb})
	if el := time.Since(start); st != 1 || el > 10*time.Second || !strings.Contains(errb.String(), "Couldn't connect") {
		t.Errorf("client without server: status %d after %v, stderr %q", st, el, errb.String())
	}
	ln, err = net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	out.Reset()
	errb.Reset()
	st = perfMain([]string{"send", "-d", "127.0.0.1", "--roce-port", strconv.Itoa(int(tooltest.FreeUDPPort(t))), "--timeout", "300ms"},
		&perfEnv{Stdout: &out, Stderr: &errb, Listener: ln})
	if st != 1 || !strings.Contains(errb.String(), "no client connected") || !strings.Contains(out.String(), "Waiting for client") {
		t.Errorf("server without client: status %d, stdout %q stderr %q", st, out.String(), errb.String())
	}
}

// TestPerfPeerVanishes: the server accepts, then the client's TCP connection closes in the
// middle of the exchange; the server fails with status 1 instead of hanging.
func TestPerfPeerVanishes(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan int, 1)
	var out, errb bytes.Buffer
	go func() {
		done <- perfMain([]string{"write", "-d", "127.0.0.1", "--roce-port", strconv.Itoa(int(tooltest.FreeUDPPort(t))), "--timeout", "5s"},
			&perfEnv{Stdout: &out, Stderr: &errb, Listener: ln})
	}()
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("6.06\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00")); err != nil {
		t.Fatal(err)
	}
	c.Close()
	select {
	case st := <-done:
		if st != 1 || errb.Len() == 0 {
			t.Errorf("status %d stderr %q", st, errb.String())
		}
	case <-time.After(30 * time.Second): // a bound on a hang, not a sleep
		t.Fatal("server did not give up")
	}
}

// TestPerfDataPathAllocs proves the measurement loops allocate nothing per message: a BW
// client loop of 200 WRITEs and a SEND latency ping-pong on the in-memory link.
func TestPerfDataPathAllocs(t *testing.T) {
	// The in-memory link grows each ring slot's buffer on first use: warm-up runs fill them.
	nw := mem.NewNetwork(mem.Options{})
	mk := func(addr string, c *perfConfig) *perfRes {
		a := netip.MustParseAddr(addr)
		l, err := nw.Attach(a)
		if err != nil {
			t.Fatal(err)
		}
		d, err := roce.Open(roce.Options{Link: l})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		r, err := newPerfRes(c, d.Verbs(), a, d.GIDIndex(a))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for k, args := range [][]string{{"write", "-s", "4096", "-n", "200"}, {"send", "--lat", "-s", "64", "-n", "100"}} {
		cs, err := parsePerf(args, new(bytes.Buffer))
		if err != nil {
			t.Fatal(err)
		}
		cc := *cs
		cc.Server = "peer"
		srv, cli := mk(fmt.Sprintf("10.9.%d.1", k), cs), mk(fmt.Sprintf("10.9.%d.2", k), &cc)
		t.Cleanup(func() { srv.close(); cli.close() })
		if err := srv.connect(cli.mine, qp.MTU4096, netip.Addr{}); err != nil {
			t.Fatal(err)
		}
		if err := cli.connect(srv.mine, qp.MTU4096, netip.Addr{}); err != nil {
			t.Fatal(err)
		}
		var run func() error
		if cs.Lat {
			run = func() error {
				// both sides' receives, then the ping-pong: the server in a goroutine
				if err := srv.postRecvs(cs.Size); err != nil {
					return err
				}
				if err := cli.postRecvs(cs.Size); err != nil {
					return err
				}
				errc := make(chan error, 1)
				go func() { errc <- srv.latSend(cs.Size) }()
				return errors.Join(cli.latSend(cs.Size), <-errc)
			}
		} else {
			run = func() error { return cli.bwClient(cs.Size) }
		}
		for i := 0; i < 12; i++ { // warm-up (and a check that it works)
			if err := run(); err != nil {
				t.Fatal(err)
			}
		}
		var runErr error
		allocs := testing.AllocsPerRun(3, func() {
			if err := run(); err != nil {
				runErr = err
			}
		})
		if runErr != nil {
			t.Fatal(runErr)
		}
		// per run: a goroutine and a channel for the ping-pong's server side (lat), nothing
		// per message; allow a few amortized engine allocations.
		if per := allocs / float64(cs.Iters); per > 0.05 {
			t.Errorf("%v: %.1f allocations per run of %d messages", args, allocs, cs.Iters)
		} else {
			t.Logf("%v: %.1f allocations per run of %d messages", args, allocs, cs.Iters)
		}
	}
}

// TestPerfTwoProcesses builds the CLI and runs server and client as separate processes
// (127.0.0.1 and 127.0.0.2, random ports), bandwidth and latency, checking exit statuses and
// outputs; then a client with no server exits 1 within its timeout.
func TestPerfTwoProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "softroce")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/softroce/softroce/cmd/softroce").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	run := func(args ...string) (status int, stdout, stderr string) {
		cmd := exec.CommandContext(ctx, bin, append([]string{"perf"}, args...)...)
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); ok {
			status = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return status, o.String(), e.String()
	}
	for _, args := range [][]string{
		{"write", "-s", "65536", "-n", "500", "-m", "4096", "--report_gbits"},
		{"send", "--lat", "-s", "8", "-n", "500"},
	} {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
		ln.Close()
		common := append(append([]string{}, args...), "-p", port, "--roce-port", strconv.Itoa(int(tooltest.FreeUDPPort(t))), "--timeout", "20s")
		srv := exec.CommandContext(ctx, bin, append(append([]string{"perf"}, common...), "-d", "127.0.0.1")...)
		sw := rocetest.NewWatch("Waiting for client")
		var se bytes.Buffer
		srv.Stdout, srv.Stderr = sw, &se
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-sw.Seen(): // the server listens before it prints the banner
		case <-ctx.Done():
			t.Fatal("server never listened")
		}
		cst, cout, cerr := run(append(append([]string{}, common...), "-d", "127.0.0.2", "127.0.0.1")...)
		sst := 0
		if err := srv.Wait(); err != nil {
			sst = -1
			if ee, ok := err.(*exec.ExitError); ok {
				sst = ee.ExitCode()
			}
		}
		if sst != 0 || cst != 0 || se.Len() != 0 || cerr != "" {
			t.Errorf("%v: server exit %d stderr %q, client exit %d stderr %q", args, sst, se.String(), cst, cerr)
		}
		cfg, _ := parsePerf(args, new(bytes.Buffer))
		checkPerfPair(t, sw.String(), cout, cfg.Test, []int{cfg.Size}, cfg.Iters, 1, cfg.Gbits)
		t.Logf("%v\nserver:\n%s\nclient:\n%s", args, sw.String(), cout)
	}
	start := time.Now()
	st, _, serr := run("read", "-d", "127.0.0.2", "-p", "1", "--roce-port", strconv.Itoa(int(tooltest.FreeUDPPort(t))), "--timeout", "1s", "127.0.0.1")
	if st != 1 || time.Since(start) > 15*time.Second || !strings.Contains(serr, "Couldn't connect") {
		t.Errorf("client without server: exit %d after %v, stderr %q", st, time.Since(start), serr)
	}
}

// TestPerfLoopback runs the in-process mode (the former tool) briefly on the in-memory link.
func TestPerfLoopback(t *testing.T) {
	for _, op := range []string{"write", "read", "send"} {
		var out, errb bytes.Buffer
		if rc := Main(context.Background(), []string{op, "--loopback", "--mem", "-s", "10000", "-n", "50", "-t", "4", "-m", "1024"}, &out, &errb); rc != 0 {
			t.Fatalf("%s: exit %d\n%s%s", op, rc, out.String(), errb.String())
		}
		if !strings.Contains(out.String(), "bandwidth") || !strings.Contains(out.String(), "size 10000, MTU 1024, depth 4, 50 messages") {
			t.Fatalf("%s: output %s", op, out.String())
		}
	}
	var out, errb bytes.Buffer
	if rc := Main(context.Background(), []string{"atomic", "--loopback", "--mem"}, &out, &errb); rc != 1 {
		t.Fatalf("atomic loopback: exit %d", rc)
	}
}

// BenchmarkPerfWriteBW is the BW client loop on the in-memory link (64 KiB WRITEs, MTU 4096).
func BenchmarkPerfWriteBW(b *testing.B) {
	nw := mem.NewNetwork(mem.Options{QueueDepth: 8192})
	c, err := parsePerf([]string{"write", "-n", "100", "-m", "4096"}, new(bytes.Buffer))
	if err != nil {
		b.Fatal(err)
	}
	cc := *c
	cc.Server = "peer"
	var rs []*perfRes
	for i, cfg := range []*perfConfig{c, &cc} {
		a := netip.AddrFrom4([4]byte{10, 8, 0, byte(i + 1)})
		l, err := nw.Attach(a)
		if err != nil {
			b.Fatal(err)
		}
		d, err := roce.Open(roce.Options{Link: l})
		if err != nil {
			b.Fatal(err)
		}
		defer d.Close()
		r, err := newPerfRes(cfg, d.Verbs(), a, d.GIDIndex(a))
		if err != nil {
			b.Fatal(err)
		}
		rs = append(rs, r)
	}
	if err := rs[0].connect(rs[1].mine, qp.MTU4096, netip.Addr{}); err != nil {
		b.Fatal(err)
	}
	if err := rs[1].connect(rs[0].mine, qp.MTU4096, netip.Addr{}); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(c.Size * c.Iters))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if err := rs[1].bwClient(c.Size); err != nil {
			b.Fatal(err)
		}
	}
}
