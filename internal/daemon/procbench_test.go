package daemon_test

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softroce/softroce/pkg/client"
	"github.com/softroce/softroce/pkg/roce"
)

// TestProcessThroughput measures 64 KiB WRITE throughput as deployed: the
// program in its own process, either embedded (two UDP devices in it) or as
// a client of two `softroce daemon` processes. A measurement, not a pass/fail
// check (the machine is shared and noisy): run it with
//
//	SOFTROCE_DAEMON_BENCH=1 go test -run TestProcessThroughput -v ./internal/daemon/
//
// Knobs (environment): SOFTROCE_DAEMON_BENCH_RUNS (interleaved runs, 5),
// _LAYOUT (split, one or both), _DEPTH (16), _N (WRITEs per run, 20000),
// _PROFILE (prefix: daemon CPU profiles PREFIX.a and PREFIX.b),
// _DAEMONPROCS / _CLIENTPROCS (GOMAXPROCS of the daemons / daemon-mode
// programs), _DAEMONARGS (extra `softroce daemon` flags, space-separated),
// _MOD, _PERIOD, _WAIT (how the programs wait: benchWait), and _VARIANTS:
// a comma-separated list of WAIT:MOD pairs (e.g. "channel:1,wait:1,channel:8,wait:8")
// measured interleaved within each run, each reported on its own.
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
	extra := strings.Fields(os.Getenv("SOFTROCE_DAEMON_BENCH_DAEMONARGS"))
	argsFor := func(addr netip.Addr, sock, prof string) []string {
		a := append([]string{"daemon", "--listen", addr.String(), "--socket", sock}, extra...)
		if p := os.Getenv("SOFTROCE_DAEMON_BENCH_PROFILE"); p != "" {
			a = append(a, "--cpuprofile", p+"."+prof)
		}
		return a
	}
	ca := exec.Command(bin, argsFor(dA, sockA, "a")...)
	cb := exec.Command(bin, argsFor(dB, sockB, "b")...)
	if p := os.Getenv("SOFTROCE_DAEMON_BENCH_DAEMONPROCS"); p != "" {
		ca.Env = append(os.Environ(), "GOMAXPROCS="+p)
		cb.Env = ca.Env
	}
	pa := startProc(t, "daemon A", ca, true)
	pb := startProc(t, "daemon B", cb, true)
	pa.expect(t, "softroce daemon ready")
	pb.expect(t, "softroce daemon ready")
	defer func() { // SIGTERM, so a --cpuprofile is written
		for _, p := range []*proc{pa, pb} {
			p.cmd.Process.Signal(syscall.SIGTERM)
			p.cmd.Wait()
		}
	}()
	knob := func(name string, def int) int {
		if d, err := strconv.Atoi(os.Getenv("SOFTROCE_DAEMON_BENCH_" + name)); err == nil && d > 0 {
			return d
		}
		return def
	}
	n, depth, runs := knob("N", 20000), knob("DEPTH", 16), knob("RUNS", 5)
	layout := os.Getenv("SOFTROCE_DAEMON_BENCH_LAYOUT")
	cpu := map[string][]float64{} // CPU microseconds per WRITE, all processes
	variant := []string{}         // the current variant's environment (_VARIANTS)
	vname := ""                   // and its name (a prefix of the cpu keys)
	measure := func(mode string) float64 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		a, b := dA, dB
		if mode == "embedded" {
			a, b = eA, eB
		}
		env := os.Environ()
		if mode == "daemon" && os.Getenv("SOFTROCE_DAEMON_BENCH_CLIENTPROCS") != "" {
			env = append(env, "GOMAXPROCS="+os.Getenv("SOFTROCE_DAEMON_BENCH_CLIENTPROCS"))
		}
		env = append(env, variant...)
		cmd.Env = append(env, "SOFTROCE_DAEMON_CHILD=bench", "SRC_MODE="+mode, "SRC_SOCK="+sockA+","+sockB,
			"SRC_LOCAL="+a.String(), "SRC_PEER="+b.String(), "SRC_ARGS="+strconv.Itoa(n)+","+strconv.Itoa(depth))
		a0, b0 := procCPU(pa.cmd.Process.Pid), procCPU(pb.cmd.Process.Pid)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", mode, err, out)
		}
		acpu, bcpu := procCPU(pa.cmd.Process.Pid)-a0, procCPU(pb.cmd.Process.Pid)-b0
		ccpu := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		t.Logf("one process, %s: program CPU %v, daemon CPU A %v B %v, output %s", mode, ccpu, acpu, bcpu, strings.TrimSpace(string(out)))
		cpu[vname+"program one "+mode] = append(cpu[vname+"program one "+mode], float64(ccpu)/float64(time.Microsecond)/float64(n))
		cpu[vname+"one "+mode] = append(cpu[vname+"one "+mode], float64(ccpu+acpu+bcpu)/float64(time.Microsecond)/float64(n))
		var mbps float64
		if _, err := fmt.Sscanf(strings.TrimSpace(string(out)), "MBPS %f", &mbps); err != nil {
			t.Fatalf("%s output %q", mode, out)
		}
		return mbps
	}
	// split: sender and receiver in two processes, each embedded (a device
	// of its own) or each a client of its daemon — as two hosts would run.
	measureSplit := func(mode string) float64 {
		mk := func(role string, sock string, local, peer netip.Addr) *proc {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(append(os.Environ(), variant...), "SOFTROCE_DAEMON_CHILD="+role, "SRC_MODE="+mode, "SRC_SOCK="+sock,
				"SRC_LOCAL="+local.String(), "SRC_PEER="+peer.String(), "SRC_ARGS="+strconv.Itoa(n)+","+strconv.Itoa(depth))
			return startProc(t, mode+" "+role, cmd, false)
		}
		a, b := eA, eB
		if mode == "daemon" {
			a, b = dA, dB
		}
		snd, rcv := mk("benchsend", sockA, a, b), mk("benchrecv", sockB, b, a)
		is, ir := snd.expect(t, "INFO "), rcv.expect(t, "INFO ")
		a0, b0 := procCPU(pa.cmd.Process.Pid), procCPU(pb.cmd.Process.Pid)
		fmt.Fprintln(snd.in, ir)
		fmt.Fprintln(rcv.in, is)
		line := snd.expect(t, "MBPS ")
		snd.cmd.Wait()
		acpu, bcpu := procCPU(pa.cmd.Process.Pid)-a0, procCPU(pb.cmd.Process.Pid)-b0
		rcv.in.Close()
		rcv.cmd.Wait()
		scpu := snd.cmd.ProcessState.UserTime() + snd.cmd.ProcessState.SystemTime()
		rcpu := rcv.cmd.ProcessState.UserTime() + rcv.cmd.ProcessState.SystemTime()
		t.Logf("split, %s: sender CPU %v, receiver CPU %v, daemon CPU A %v B %v, %s", mode, scpu, rcpu, acpu, bcpu, line)
		cpu[vname+"program split "+mode] = append(cpu[vname+"program split "+mode], float64(scpu+rcpu)/float64(time.Microsecond)/float64(n))
		cpu[vname+"split "+mode] = append(cpu[vname+"split "+mode], float64(scpu+rcpu+acpu+bcpu)/float64(time.Microsecond)/float64(n))
		var mbps float64
		fmt.Sscanf(line, "MBPS %f", &mbps)
		return mbps
	}
	variants := strings.Split(os.Getenv("SOFTROCE_DAEMON_BENCH_VARIANTS"), ",")
	med := func(v []float64) float64 { s := append([]float64(nil), v...); sort.Float64s(s); return s[len(s)/2] }
	if len(variants) > 1 {
		type res struct{ emb, dmn, embS, dmnS []float64 }
		rs := make([]res, len(variants))
		for i := 0; i < runs; i++ {
			for k, v := range variants {
				w, m, _ := strings.Cut(v, ":")
				variant = []string{"SOFTROCE_DAEMON_BENCH_WAIT=" + w, "SOFTROCE_DAEMON_BENCH_MOD=" + m}
				vname = v + " "
				if layout != "split" {
					rs[k].emb = append(rs[k].emb, measure("embedded"))
					rs[k].dmn = append(rs[k].dmn, measure("daemon"))
				}
				if layout != "one" {
					rs[k].embS = append(rs[k].embS, measureSplit("embedded"))
					rs[k].dmnS = append(rs[k].dmnS, measureSplit("daemon"))
				}
			}
			t.Logf("run %d done, load average %s", i, loadAvg())
		}
		for k, v := range variants {
			r := rs[k]
			for _, key := range []string{"split embedded", "split daemon", "program split daemon", "one embedded", "one daemon", "program one daemon"} {
				if c := cpu[v+" "+key]; len(c) > 0 {
					t.Logf("variant %s CPU per WRITE (programs + daemons), %s: median %.1f us %.1f", v, key, med(c), c)
				}
			}
			if layout != "one" {
				t.Logf("variant %s split MB/s: embedded %v (median %.0f) daemon %v (median %.0f): %.0f%%",
					v, r.embS, med(r.embS), r.dmnS, med(r.dmnS), 100*med(r.dmnS)/med(r.embS))
			}
			if layout != "split" {
				t.Logf("variant %s one MB/s: embedded %v (median %.0f) daemon %v (median %.0f): %.0f%%",
					v, r.emb, med(r.emb), r.dmn, med(r.dmn), 100*med(r.dmn)/med(r.emb))
			}
		}
		return
	}
	var emb, dmn, embS, dmnS []float64
	for i := 0; i < runs; i++ { // interleaved, so load changes hit both
		if layout != "split" {
			emb = append(emb, measure("embedded"))
			dmn = append(dmn, measure("daemon"))
		}
		if layout != "one" {
			embS = append(embS, measureSplit("embedded"))
			dmnS = append(dmnS, measureSplit("daemon"))
		}
	}
	t.Logf("load average %s", loadAvg())
	if layout != "one" {
		t.Logf("split (sender and receiver programs in two processes), 64 KiB WRITE, %d in flight, %d per run, MB/s: embedded %v (median %.0f), daemon %v (median %.0f): daemon/embedded = %.0f%%",
			depth, n, embS, med(embS), dmnS, med(dmnS), 100*med(dmnS)/med(embS))
	}
	for _, k := range []string{"split embedded", "split daemon", "one embedded", "one daemon"} {
		if len(cpu[k]) > 0 {
			t.Logf("CPU per WRITE (programs + daemons), %s: median %.1f us %v", k, med(cpu[k]), cpu[k])
		}
	}
	if layout != "split" {
		t.Logf("one program process (both ends), 64 KiB WRITE, %d in flight, %d per run, MB/s: embedded %v (median %.0f), daemon %v (median %.0f): daemon/embedded = %.0f%%",
			depth, n, emb, med(emb), dmn, med(dmn), 100*med(dmn)/med(emb))
	}
}

// childProfile starts a CPU profile of a bench child when
// SOFTROCE_DAEMON_BENCH_CHILDPROFILE names a prefix (PREFIX.MODE.ROLE);
// the returned func stops it.
func childProfile(role string) func() {
	p := os.Getenv("SOFTROCE_DAEMON_BENCH_CHILDPROFILE")
	if p == "" {
		return func() {}
	}
	f, err := os.Create(p + "." + os.Getenv("SRC_MODE") + "." + role)
	if err != nil {
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return func() {}
	}
	return func() { pprof.StopCPUProfile(); f.Close() }
}

// loadAvg is /proc/loadavg's first three fields.
func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// benchChild is the "bench" child role: n 64 KiB WRITEs (depth in flight), printing MB/s.
func benchChild() int {
	defer childProfile("bench")()
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
	ws := wakeStats(va, n)
	writeLoop(&childT{}, va, vb, a, b, 65536, depth, n, func() { t0 = time.Now(); ws.start() })
	el := time.Since(t0)
	fmt.Printf("MBPS %.1f%s\n", float64(n)*65536/el.Seconds()/1e6, ws.String())
	return 0
}

// wakeCount reports the daemon's data path wakeups per WRITE over a run
// (daemon mode; "" embedded): completion notifies (daemon -> program) and
// drainer doorbell wakeups (program -> daemon).
type wakeCount struct {
	c   *client.Conn
	n   int
	s0  client.DataPathStats
	rx0 uint64 // the daemon's received packets (in the split layout: the ACKs)
}

func wakeStats(v roce.Verbs, n int) *wakeCount {
	c, _ := v.(*client.Conn)
	return &wakeCount{c: c, n: n}
}

func (w *wakeCount) start() {
	if w.c != nil {
		w.s0 = w.c.DataPathStats()
		w.rx0 = w.c.Stats().RcvdPkts
	}
}

func (w *wakeCount) String() string {
	if w.c == nil {
		return ""
	}
	s := w.c.DataPathStats()
	per := func(a, b uint64) float64 { return float64(a-b) / float64(w.n) }
	return fmt.Sprintf(" per WRITE: notifies %.3f doorbells %.3f, packets received by the daemon %.3f",
		per(s.Notifies, w.s0.Notifies), per(s.Doorbells, w.s0.Doorbells), per(w.c.Stats().RcvdPkts, w.rx0))
}

// procCPU is a process's user+system CPU time from /proc/PID/stat.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	k, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+k) * 10 * time.Millisecond // USER_HZ = 100
}

// benchSplitChild is one end of the split measurement: "benchsend" streams
// n WRITEs into the peer and prints MB/s; "benchrecv" only exposes its
// buffer and waits for stdin to close.
func benchSplitChild(role string) int {
	defer childProfile(role)()
	args := strings.Split(os.Getenv("SRC_ARGS"), ",")
	n, _ := strconv.Atoi(args[0])
	depth, _ := strconv.Atoi(args[1])
	local := netip.MustParseAddr(os.Getenv("SRC_LOCAL"))
	peer := netip.MustParseAddr(os.Getenv("SRC_PEER"))
	var v roce.Verbs
	if os.Getenv("SRC_MODE") == "embedded" {
		d, err := roce.OpenUDP(roce.UDPOptions{Addrs: []netip.Addr{local}})
		if err != nil {
			fmt.Println("FAIL", err)
			return 1
		}
		defer d.Close()
		v = d.Verbs()
	} else {
		c, err := client.Dial(os.Getenv("SRC_SOCK"))
		if err != nil {
			fmt.Println("FAIL", err)
			return 1
		}
		defer c.Close()
		v = c
	}
	t := &childT{}
	e := newEnd(t, v, 65536*depth, uint32(depth), rcAccess)
	e.timeout = 16
	fmt.Printf("INFO %d %d\n", e.q.Num(), e.m.RKey())
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() {
		return 1
	}
	var pqpn, prkey uint32
	fmt.Sscanf(strings.TrimSpace(in.Text()), "INFO %d %d", &pqpn, &prkey)
	e.connect(t, peer, pqpn, uint8(v.GIDIndex(local)))
	if role == "benchrecv" {
		for in.Scan() {
		}
		return 0
	}
	var t0 time.Time
	ws := wakeStats(v, n)
	writeStream(t, e, 0x10000, prkey, 65536, depth, n, func() { t0 = time.Now(); ws.start() })
	fmt.Printf("MBPS %.1f%s\n", float64(n)*65536/time.Since(t0).Seconds()/1e6, ws.String())
	return 0
}
