package daemon_test

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/client"
	"github.com/softroce/softroce/pkg/roce"
)

// TestTenantFairness is the two-tenant fairness benchmark (bench/fairness runs it): two
// `softroce daemon` processes on two loopback addresses, every program a process of its own
// through them. Two bandwidth clients of daemon A saturate it with 64 KiB RDMA WRITEs (each
// towards a sink of its own on daemon B) while a third, latency-sensitive client of daemon A
// ping-pongs 8-byte SENDs with an echo on daemon B. It reports each bandwidth client's
// throughput and their ratio (min/max: the fair share is 1), and the ping-pong's p99 loaded
// against its p99 with the daemons otherwise idle, all from one run. A measurement, not a
// pass/fail check (the machine is shared and noisy; the targets are printed next to the
// ratios; a FAIRCDF line carries the ping-pong's round-trip distributions, idle and loaded,
// for bench/fairplot):
//
//	SOFTROCE_FAIRNESS_BENCH=1 go test -run TestTenantFairness -v ./internal/daemon/
//
// Knobs (environment): SOFTROCE_FAIRNESS_SECS (seconds per phase, 5), _QPS (QPs of the two
// bandwidth clients, "1,1"; "4,1" makes the first a bully with four times the QPs), _DEPTH
// (WRITEs in flight per QP, 16), _SIZE (bytes per WRITE, 65536), _DAEMONARGS (extra
// `softroce daemon` flags), _BIN (the softroce binary the daemons run; default: built from
// this tree), _APART (1: the bandwidth clients go through a second pair of daemons, so the
// ping-pong's daemons carry none of their traffic and only share the CPUs with them: what
// the loaded p99 owes to CPU contention alone).
func TestTenantFairness(t *testing.T) {
	if os.Getenv("SOFTROCE_FAIRNESS_BENCH") == "" {
		t.Skip("set SOFTROCE_FAIRNESS_BENCH=1 to measure")
	}
	knob := func(name string, def int) int {
		if d, err := strconv.Atoi(os.Getenv("SOFTROCE_FAIRNESS_" + name)); err == nil && d > 0 {
			return d
		}
		return def
	}
	secs, depth, size := knob("SECS", 5), knob("DEPTH", 16), knob("SIZE", 65536)
	qps := []int{1, 1}
	if s := os.Getenv("SOFTROCE_FAIRNESS_QPS"); s != "" {
		a, b, _ := strings.Cut(s, ",")
		qps[0], _ = strconv.Atoi(a)
		qps[1], _ = strconv.Atoi(b)
	}
	dir := t.TempDir()
	bin := os.Getenv("SOFTROCE_FAIRNESS_BIN")
	if bin == "" {
		bin = filepath.Join(dir, "softroce")
		if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/softroce").CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
	}
	ipA, ipB := loopbackPair(30)
	sockA, sockB := filepath.Join(dir, "a.sock"), filepath.Join(dir, "b.sock")
	extra := strings.Fields(os.Getenv("SOFTROCE_FAIRNESS_DAEMONARGS"))
	pa := startProc(t, "daemon A", exec.Command(bin, append([]string{"daemon", "--listen", ipA.String(), "--socket", sockA}, extra...)...), true)
	pb := startProc(t, "daemon B", exec.Command(bin, append([]string{"daemon", "--listen", ipB.String(), "--socket", sockB}, extra...)...), true)
	pa.expect(t, "softroce daemon ready")
	pb.expect(t, "softroce daemon ready")
	daemons := []*proc{pa, pb}
	bwA, bwB, bwIPA, bwIPB := sockA, sockB, ipA, ipB
	if os.Getenv("SOFTROCE_FAIRNESS_APART") == "1" {
		bwIPA, bwIPB = loopbackPair(31)
		bwA, bwB = filepath.Join(dir, "c.sock"), filepath.Join(dir, "d.sock")
		pc := startProc(t, "daemon C", exec.Command(bin, append([]string{"daemon", "--listen", bwIPA.String(), "--socket", bwA}, extra...)...), true)
		pd := startProc(t, "daemon D", exec.Command(bin, append([]string{"daemon", "--listen", bwIPB.String(), "--socket", bwB}, extra...)...), true)
		pc.expect(t, "softroce daemon ready")
		pd.expect(t, "softroce daemon ready")
		daemons = append(daemons, pc, pd)
	}
	defer func() {
		for _, p := range daemons {
			p.cmd.Process.Signal(syscall.SIGTERM)
			p.cmd.Wait()
		}
	}()
	// As root, each bandwidth client runs as a user of its own (uid 64000+i): the daemon's
	// per-user limits, its in-flight budget among them, see two tenants, as on a shared host.
	// Otherwise every program is one user.
	users := os.Getuid() == 0
	self := os.Args[0]
	if users {
		self = reachableByAll(t, sockA, sockB, bwA, bwB)
	}
	child := func(name, role, sock string, local, peer netip.Addr, uid int, args ...int) *proc {
		s := make([]string, len(args))
		for i, a := range args {
			s[i] = strconv.Itoa(a)
		}
		cmd := exec.Command(self, "-test.run=^$")
		cmd.Env = append(os.Environ(), "SOFTROCE_DAEMON_CHILD="+role, "SRC_SOCK="+sock, "SRC_LOCAL="+local.String(),
			"SRC_PEER="+peer.String(), "SRC_ARGS="+strings.Join(s, ","))
		if uid > 0 && users {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
			cmd.Dir = filepath.Dir(self)
		}
		return startProc(t, name, cmd, false)
	}
	pair := func(x, y *proc) {
		ix, iy := x.expect(t, "INFO "), y.expect(t, "INFO ")
		fmt.Fprintln(x.in, iy)
		fmt.Fprintln(y.in, ix)
		x.expect(t, "READY")
		y.expect(t, "READY")
	}
	ping := func() (*proc, *proc) {
		p := child("ping", "fping", sockA, ipA, ipB, 0, secs)
		q := child("pong", "fpong", sockB, ipB, ipA, 0)
		pair(p, q)
		return p, q
	}
	lat := func(p *proc) (p50, p99 float64, n int, quant string) {
		line := p.expect(t, "LAT ")
		if _, err := fmt.Sscanf(line, "LAT %f %f %d", &p50, &p99, &n); err != nil {
			t.Fatalf("ping: %q", line)
		}
		quant = strings.Join(strings.Fields(strings.TrimPrefix(p.expect(t, "QUANT "), "QUANT ")), ",")
		return
	}
	finish := func(ps ...*proc) {
		for _, p := range ps {
			p.in.Close()
			if err := p.cmd.Wait(); err != nil {
				t.Fatalf("%s: %v", p.name, err)
			}
		}
	}

	// Idle: the ping-pong alone.
	p, q := ping()
	fmt.Fprintln(p.in, "GO")
	idle50, idle99, idleN, idleQ := lat(p)
	finish(p, q)

	// Loaded: the two bandwidth clients and the ping-pong, all started together.
	var bws, sinks []*proc
	for i, n := range qps {
		b := child(fmt.Sprintf("bw %d", i), "fbw", bwA, bwIPA, bwIPB, 64000+i, secs, n, depth, size)
		s := child(fmt.Sprintf("sink %d", i), "fsink", bwB, bwIPB, bwIPA, 0, secs, n, depth, size)
		pair(b, s)
		bws, sinks = append(bws, b), append(sinks, s)
	}
	p, q = ping()
	for _, x := range append(bws, p) {
		fmt.Fprintln(x.in, "GO")
	}
	mbps := make([]float64, len(bws))
	for i, b := range bws {
		line := b.expect(t, "BW ")
		var bytes, ns float64
		if _, err := fmt.Sscanf(line, "BW %f %f", &bytes, &ns); err != nil {
			t.Fatalf("bw %d: %q", i, line)
		}
		mbps[i] = bytes / ns * 1e3
	}
	load50, load99, loadN, loadQ := lat(p)
	finish(append(append(bws, sinks...), p, q)...)
	share := min(mbps[0], mbps[1]) / max(mbps[0], mbps[1])
	t.Logf("bandwidth clients (QPs %d and %d, %d x %d B in flight per QP): %.0f and %.0f MB/s, share min/max %.2f (target >= 0.80)",
		qps[0], qps[1], depth, size, mbps[0], mbps[1], share)
	t.Logf("8-byte ping-pong: idle p50 %.1f us p99 %.1f us (%d), loaded p50 %.1f us p99 %.1f us (%d): p99 loaded/idle %.2f (target <= 2)",
		idle50, idle99, idleN, load50, load99, loadN, load99/idle99)
	apart := ""
	if len(daemons) > 2 {
		apart = " apart"
	}
	fmt.Printf("FAIRNESS%s qps=%d,%d mbps=%.0f,%.0f share=%.2f p50_idle_us=%.1f p50_loaded_us=%.1f p99_idle_us=%.1f p99_loaded_us=%.1f p99_ratio=%.2f\n", apart,
		qps[0], qps[1], mbps[0], mbps[1], share, idle50, load50, idle99, load99, load99/idle99)
	// the round trips' distributions (bench/fairplot draws them): µs at the quantiles fping prints
	fmt.Printf("FAIRCDF%s qps=%d,%d idle=%s loaded=%s\n", apart, qps[0], qps[1], idleQ, loadQ)
}

// fairChild runs one program of TestTenantFairness (role fbw, fsink, fping or fpong).
func fairChild(role string) int {
	fail := func(f string, a ...any) int {
		fmt.Printf("FAIL "+f+"\n", a...)
		return 1
	}
	var args []int
	for _, s := range strings.Split(os.Getenv("SRC_ARGS"), ",") {
		if n, err := strconv.Atoi(s); err == nil {
			args = append(args, n)
		}
	}
	v, err := client.Dial(os.Getenv("SRC_SOCK"))
	if err != nil {
		return fail("dial: %v", err)
	}
	defer v.Close()
	local, peer := netip.MustParseAddr(os.Getenv("SRC_LOCAL")), netip.MustParseAddr(os.Getenv("SRC_PEER"))
	t := &childT{}
	defer func() {
		if r := recover(); r != nil {
			fmt.Printf("FAIL %v\n", r)
			os.Exit(1)
		}
	}()
	nq, depth, size := 1, 16, 64
	if role == "fbw" || role == "fsink" {
		nq, depth, size = args[1], args[2], args[3]
	}
	// One PD, CQ and MR; nq RC QPs.
	e := newEnd(t, v, size*depth+4096, uint32(depth), rcAccess)
	qs := []roce.QueuePair{e.q}
	for i := 1; i < nq; i++ {
		q, err := v.CreateQP(roce.VerbsQPInit{Type: qp.TypeRC, PD: e.pd, SendCQ: e.cq, RecvCQ: e.cq,
			Cap: qp.Cap{MaxSendWR: uint32(depth), MaxRecvWR: uint32(depth), MaxSendSGE: 2, MaxRecvSGE: 2}})
		if err != nil {
			return fail("QP %d: %v", i, err)
		}
		qs = append(qs, q)
	}
	info := fmt.Sprintf("INFO %d", e.m.RKey())
	for _, q := range qs {
		info += fmt.Sprintf(" %d", q.Num())
	}
	fmt.Println(info)
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() {
		return fail("no peer info")
	}
	f := strings.Fields(in.Text())
	if len(f) != 2+nq {
		return fail("peer info %q", in.Text())
	}
	prkey, _ := strconv.Atoi(f[1])
	e.timeout = 16
	for i, q := range qs {
		pqpn, _ := strconv.Atoi(f[2+i])
		x := *e
		x.q = q
		x.connect(t, peer, uint32(pqpn), uint8(v.GIDIndex(local)))
	}
	recv := func(q roce.QueuePair, id uint64) {
		if _, err := q.PostRecv([]qp.RecvWR{{WRID: id, SGL: []qp.SGE{{Addr: e.iova + uint64(id%8)*64, Length: 64, LKey: e.m.LKey()}}}}); err != nil {
			panic(err)
		}
	}
	send := func(id uint64) {
		if _, err := e.q.PostSend([]qp.SendWR{{WRID: id, Opcode: qp.WRSend, Flags: qp.SendSignaled,
			SGL: []qp.SGE{{Addr: e.iova + 1024, Length: 8, LKey: e.m.LKey()}}}}); err != nil {
			panic(err)
		}
	}
	if role == "fping" || role == "fpong" {
		for i := uint64(0); i < 8; i++ {
			recv(e.q, i)
		}
	}
	fmt.Println("READY")
	switch role {
	case "fsink":
		for in.Scan() { // until the test closes stdin
		}
		return 0
	case "fpong":
		go func() { // the test closes stdin when it is done
			for in.Scan() {
			}
			os.Exit(0)
		}()
		for {
			wc := e.wait(t, 1)[0]
			if wc.Status != cq.StatusSuccess {
				return 0 // the ping went away
			}
			if wc.Opcode == cq.OpRecv {
				recv(e.q, wc.WRID)
				send(wc.WRID)
			}
		}
	}
	if !in.Scan() || in.Text() != "GO" {
		return fail("no GO")
	}
	until := time.Now().Add(time.Duration(args[0]) * time.Second)
	switch role {
	case "fping":
		var rtts []time.Duration
		for id := uint64(0); time.Now().Before(until); id++ {
			t0 := time.Now()
			send(id)
			got := 0
			for got < 2 { // the SEND's completion and the echo
				for _, wc := range e.wait(t, 1) {
					if wc.Status != cq.StatusSuccess {
						return fail("ping: %+v", wc)
					}
					if wc.Opcode == cq.OpRecv {
						recv(e.q, wc.WRID)
					}
					got++
				}
			}
			rtts = append(rtts, time.Since(t0))
		}
		sort.Slice(rtts, func(i, j int) bool { return rtts[i] < rtts[j] })
		us := func(q float64) float64 { return float64(rtts[int(q*float64(len(rtts)-1))]) / 1e3 }
		fmt.Printf("LAT %.1f %.1f %d\n", us(0.5), us(0.99), len(rtts))
		// the distribution: the round trip at quantiles 0, 0.01, ..., 0.99, 0.999 and 1
		q := make([]string, 0, 102)
		for i := 0; i <= 99; i++ {
			q = append(q, fmt.Sprintf("%.1f", us(float64(i)/100)))
		}
		fmt.Printf("QUANT %s %.1f %.1f\n", strings.Join(q, " "), us(0.999), us(1))
		in.Scan()
		return 0
	case "fbw":
		t0 := time.Now()
		var bytes int64
		out := 0
		post := func(q roce.QueuePair, id uint64) {
			off := uint64(id%uint64(depth)) * uint64(size)
			if _, err := q.PostSend([]qp.SendWR{{WRID: id, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
				SGL:        []qp.SGE{{Addr: e.iova + off, Length: uint32(size), LKey: e.m.LKey()}},
				RemoteAddr: 0x10000 + off, RKey: uint32(prkey)}}); err != nil {
				panic(err)
			}
			out++
		}
		var id uint64
		for i := range qs {
			for k := 0; k < depth; k++ {
				post(qs[i], id<<8|uint64(i))
				id++
			}
		}
		for out > 0 {
			for _, wc := range e.wait(t, 1) {
				out--
				if wc.Status != cq.StatusSuccess {
					return fail("bw: %+v", wc)
				}
				bytes += int64(size)
				if time.Now().Before(until) {
					post(qs[wc.WRID&0xff], id<<8|(wc.WRID&0xff))
					id++
				}
			}
		}
		fmt.Printf("BW %d %d\n", bytes, time.Since(t0).Nanoseconds())
		in.Scan()
		return 0
	}
	return fail("unknown role %s", role)
}
