package daemon_test

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/pkg/roce"
	"github.com/softroce/softroce/pkg/roce/client"
)

// TestProcessThroughput measures 64 KiB WRITE throughput as deployed: the
// program in its own process, either embedded (two UDP devices in it) or as
// a client of two `softroce daemon` processes. A measurement, not a pass/fail
// check (the machine is shared and noisy): run it with
//
//	SOFTROCE_DAEMON_BENCH=1 go test -run TestProcessThroughput -v ./pkg/daemon/
func TestProcessThroughput(t *testing.T) {
	if os.Getenv("SOFTROCE_DAEMON_BENCH") == "" {
		t.Skip("set SOFTROCE_DAEMON_BENCH=1 to measure")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "softroce")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/softroce").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dA, dB := loopbackPair(20)
	eA, eB := loopbackPair(21)
	sockA, sockB := filepath.Join(dir, "a.sock"), filepath.Join(dir, "b.sock")
	pa := startProc(t, "daemon A", exec.Command(bin, "daemon", "--listen", dA.String(), "--socket", sockA), true)
	pb := startProc(t, "daemon B", exec.Command(bin, "daemon", "--listen", dB.String(), "--socket", sockB), true)
	pa.expect(t, "softroce daemon ready")
	pb.expect(t, "softroce daemon ready")
	const n = 20000
	depth := 16
	if d, err := strconv.Atoi(os.Getenv("SOFTROCE_DAEMON_BENCH_DEPTH")); err == nil && d > 0 {
		depth = d
	}
	measure := func(mode string) float64 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		a, b := dA, dB
		if mode == "embedded" {
			a, b = eA, eB
		}
		cmd.Env = append(os.Environ(), "SOFTROCE_DAEMON_CHILD=bench", "SRC_MODE="+mode, "SRC_SOCK="+sockA+","+sockB,
			"SRC_LOCAL="+a.String(), "SRC_PEER="+b.String(), "SRC_ARGS="+strconv.Itoa(n)+","+strconv.Itoa(depth))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", mode, err, out)
		}
		var mbps float64
		if _, err := fmt.Sscanf(strings.TrimSpace(string(out)), "MBPS %f", &mbps); err != nil {
			t.Fatalf("%s output %q", mode, out)
		}
		return mbps
	}
	var emb, dmn []float64
	for i := 0; i < 5; i++ { // interleaved, so load changes hit both
		emb = append(emb, measure("embedded"))
		dmn = append(dmn, measure("daemon"))
	}
	med := func(v []float64) float64 { s := append([]float64(nil), v...); sort.Float64s(s); return s[len(s)/2] }
	t.Logf("64 KiB WRITE, %d in flight, %d per run, MB/s: embedded %v (median %.0f), daemon %v (median %.0f): daemon/embedded = %.0f%%",
		depth, n, emb, med(emb), dmn, med(dmn), 100*med(dmn)/med(emb))
}

// benchChild is the "bench" child role: n 64 KiB WRITEs (depth in flight), printing MB/s.
func benchChild() int {
	args := strings.Split(os.Getenv("SRC_ARGS"), ",")
	n, _ := strconv.Atoi(args[0])
	depth, _ := strconv.Atoi(args[1])
	a := netip.MustParseAddr(os.Getenv("SRC_LOCAL"))
	b := netip.MustParseAddr(os.Getenv("SRC_PEER"))
	var va, vb roce.Verbs
	if os.Getenv("SRC_MODE") == "embedded" {
		da, err := roce.OpenUDP(roce.UDPOptions{Addrs: []netip.Addr{a}})
		if err != nil {
			fmt.Println("FAIL", err)
			return 1
		}
		defer da.Close()
		db, err := roce.OpenUDP(roce.UDPOptions{Addrs: []netip.Addr{b}})
		if err != nil {
			fmt.Println("FAIL", err)
			return 1
		}
		defer db.Close()
		va, vb = da.Verbs(), db.Verbs()
	} else {
		socks := strings.Split(os.Getenv("SRC_SOCK"), ",")
		ca, err := client.Dial(socks[0])
		if err != nil {
			fmt.Println("FAIL", err)
			return 1
		}
		defer ca.Close()
		cb, err := client.Dial(socks[1])
		if err != nil {
			fmt.Println("FAIL", err)
			return 1
		}
		defer cb.Close()
		va, vb = ca, cb
	}
	var t0 time.Time
	writeLoop(&childT{}, va, vb, a, b, 65536, depth, n, func() { t0 = time.Now() })
	el := time.Since(t0)
	fmt.Printf("MBPS %.1f\n", float64(n)*65536/el.Seconds()/1e6)
	return 0
}
