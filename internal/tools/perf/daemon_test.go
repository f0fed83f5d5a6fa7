package perf

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/softroce/softroce/internal/daemontest"
	"github.com/softroce/softroce/internal/oob/perftest"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/internal/rocetest"
	"github.com/softroce/softroce/internal/tools/tooltest"
	"github.com/softroce/softroce/pkg/client"
	"github.com/softroce/softroce/pkg/roce"
)

// daemonStats returns the counters of the daemon's device, read through a client of it.
func daemonStats(t *testing.T, sock string) qp.Stats {
	t.Helper()
	c, err := client.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.Stats()
}

// perfDaemonSides says which side of a perf pair runs through the daemon, and how.
type perfDaemonSides struct {
	// Server is true when the server (127.0.0.1) goes through the daemon, else the client
	// (127.0.0.2) does.
	Server bool
	// RDMACM runs the pair with -R.
	RDMACM bool
	// NoDev leaves -d off the daemon side (the daemon's address is picked).
	NoDev bool
	// Extra are flags for the daemon side only.
	Extra []string
	// Workers is the daemon device's receive workers (roce.FastPathOptions.Workers).
	Workers int
}

// perfPairDaemon runs a perf server on 127.0.0.1 and a client on 127.0.0.2 in this process,
// one of them through an in-test softroce daemon whose device is on that side's address,
// and returns both outputs and stderrs. The daemon must end with no client and no object,
// having carried the side's posts.
func perfPairDaemon(t *testing.T, s perfDaemonSides, args ...string) (srvOut, cliOut, srvErr, cliErr string) {
	t.Helper()
	port := uint16(20000 + rand.IntN(40000))
	daddr := netip.MustParseAddr("127.0.0.2")
	if s.Server {
		daddr = netip.MustParseAddr("127.0.0.1")
	}
	sock, srv := daemontest.ServeUDP(t, roce.UDPOptions{Addrs: []netip.Addr{daddr}, Port: port, Portable: true, Name: "softroce0",
		FastPath: roce.FastPathOptions{Workers: s.Workers}})
	common := append(append([]string{}, args...), "--timeout", "20s", "--run-timeout", "20s")
	var ln net.Listener
	if s.RDMACM {
		common = append(common, "-R", "-p", "18515")
	} else {
		var err error
		if ln, err = net.Listen("tcp4", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		common = append(common, "-p", strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))
	}
	side := func(daemon bool, dev string, tail ...string) []string {
		a := append([]string{}, common...)
		if daemon {
			a = append(append(a, "--daemon", sock), s.Extra...)
			if s.NoDev {
				return append(a, tail...)
			}
		} else {
			a = append(a, "--roce-port", strconv.Itoa(int(port)))
		}
		return append(append(a, "-d", dev), tail...)
	}
	var se, co, ce bytes.Buffer
	so := rocetest.NewWatch(perftest.WaitingBanner)
	var wg sync.WaitGroup
	var srvStatus int
	wg.Add(1)
	go func() {
		defer wg.Done()
		srvStatus = perfMain(side(s.Server, "127.0.0.1"), &perfEnv{Stdout: so, Stderr: &se, Listener: ln})
	}()
	if s.RDMACM { // the client's requests need the server's device (perfCMPair)
		select {
		case <-so.Seen():
		case <-time.After(20 * time.Second):
			t.Fatal("the server did not start")
		}
	}
	cliStatus := perfMain(side(!s.Server, "127.0.0.2", "127.0.0.1"), &perfEnv{Stdout: &co, Stderr: &ce})
	wg.Wait()
	if srvStatus != 0 || cliStatus != 0 {
		t.Errorf("%v: exit status server %d client %d\nserver:\n%s%s\nclient:\n%s%s", args, srvStatus, cliStatus, so.String(), se.String(), co.String(), ce.String())
	}
	// the daemon's device carried the side's traffic (a one-sided server posts nothing)
	if st := daemonStats(t, sock); st.RcvdPkts == 0 || st.SentPkts == 0 {
		t.Errorf("the daemon's device sent %d and received %d packets", st.SentPkts, st.RcvdPkts)
	}
	tooltest.DaemonIdle(t, srv)
	return so.String(), co.String(), se.String(), ce.String()
}

// TestPerfDaemon runs the perftest tools with one side through the softroce daemon
// (--daemon SOCKET) and the other embedded, both directions, bandwidth and latency, the TCP
// exchange and -R: the outputs pass the checks of TestPerfPairs (each side's remote
// addresses are the other's local ones, perftest's frame and banner, plausible rows; the
// write/read/atomic server prints the client's report), nothing on stderr, and the daemon
// holds nothing afterwards. The workers rows run through a daemon whose device has two
// receive workers (softroce daemon --workers 2): four QPs, each packet steered to worker
// QPN mod 2.
func TestPerfDaemon(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	for _, c := range []struct {
		args       []string
		sizes      []int
		iters, qps int
		cm         bool
		workers    int
	}{
		{args: []string{"write", "-s", "3000", "-n", "100", "-m", "1024"}, sizes: []int{3000}, iters: 100, qps: 1},
		{args: []string{"write", "-s", "65536", "-n", "40", "-q", "2", "--report_gbits"}, sizes: []int{65536}, iters: 40, qps: 2},
		{args: []string{"read", "-s", "3000", "-n", "100", "-m", "1024"}, sizes: []int{3000}, iters: 100, qps: 1},
		{args: []string{"send", "-s", "3000", "-n", "100", "-m", "1024"}, sizes: []int{3000}, iters: 100, qps: 1},
		{args: []string{"send", "-s", "64", "-n", "150", "-q", "2", "-r", "16"}, sizes: []int{64}, iters: 150, qps: 2},
		{args: []string{"atomic", "-n", "100"}, sizes: []int{8}, iters: 100, qps: 1},
		{args: []string{"write", "--lat", "-s", "64", "-n", "100"}, sizes: []int{64}, iters: 100, qps: 1},
		{args: []string{"write", "--lat", "-s", "3000", "-n", "300", "-m", "1024"}, sizes: []int{3000}, iters: 300, qps: 1},
		{args: []string{"send", "--lat", "-s", "8", "-n", "100"}, sizes: []int{8}, iters: 100, qps: 1},
		{args: []string{"read", "--lat", "-s", "64", "-n", "100"}, sizes: []int{64}, iters: 100, qps: 1},
		{args: []string{"atomic", "--lat", "-n", "100"}, sizes: []int{8}, iters: 100, qps: 1},
		{args: []string{"send", "--lat", "-a", "-n", "5"}, sizes: perfSizes(&perfConfig{All: true}, 0), iters: 5, qps: 1},
		{args: []string{"write", "-s", "3000", "-n", "100"}, sizes: []int{3000}, iters: 100, qps: 1, cm: true},
		{args: []string{"send", "-s", "64", "-n", "150", "-q", "2", "-r", "16"}, sizes: []int{64}, iters: 150, qps: 2, cm: true},
		{args: []string{"read", "-s", "3000", "-n", "100", "-q", "2", "-o", "4"}, sizes: []int{3000}, iters: 100, qps: 2, cm: true},
		{args: []string{"write", "-s", "65536", "-n", "40", "-q", "4", "--report_gbits"}, sizes: []int{65536}, iters: 40, qps: 4, workers: 2},
		{args: []string{"send", "-s", "3000", "-n", "100", "-q", "4", "-m", "1024"}, sizes: []int{3000}, iters: 100, qps: 4, workers: 2},
	} {
		for _, server := range []bool{true, false} {
			name := strings.Join(c.args, "_")
			if c.cm {
				name += "_-R"
			}
			if c.workers > 1 {
				name += fmt.Sprintf("_workers=%d", c.workers)
			}
			if server {
				name += "/server-through-daemon"
			} else {
				name += "/client-through-daemon"
			}
			t.Run(name, func(t *testing.T) {
				cfg, err := parsePerf(c.args, new(bytes.Buffer))
				if err != nil {
					t.Fatal(err)
				}
				so, co, se, ce := perfPairDaemon(t, perfDaemonSides{Server: server, RDMACM: c.cm, NoDev: server, Workers: c.workers}, c.args...)
				if se != "" || ce != "" {
					t.Errorf("stderr: server %q client %q", se, ce)
				}
				checkPerfPair(t, so, co, cfg.Test, c.sizes, c.iters, c.qps, cfg.Gbits)
				if t.Failed() {
					t.Logf("server:\n%s\nclient:\n%s", so, co)
				}
			})
		}
	}
}

// TestPerfDaemonStats: --stats through the daemon prints the daemon device's counters and says
// there are no link counters.
func TestPerfDaemonStats(t *testing.T) {
	_, _, _, ce := perfPairDaemon(t, perfDaemonSides{Extra: []string{"--stats"}}, "write", "-s", "4096", "-n", "50")
	if !strings.Contains(ce, "stats: sent_pkts ") || !strings.Contains(ce, "stats: through the daemon") || strings.Contains(ce, "stats: link sent") {
		t.Fatalf("client stderr:\n%s", ce)
	}
}

// TestPerfDaemonFlags: the options naming the RoCE socket or the in-process devices are refused
// with --daemon; a daemon socket nobody listens on is an error naming it.
func TestPerfDaemonFlags(t *testing.T) {
	for _, args := range [][]string{
		{"write", "--daemon", "/x", "--roce-port", "5000"},
		{"write", "--daemon", "/x", "--portable"},
		{"write", "--daemon", "/x", "--loopback"},
		{"send", "--daemon", "/x", "--loopback", "--mem"},
	} {
		if _, err := parsePerf(args, new(bytes.Buffer)); err == nil || !strings.Contains(err.Error(), "--daemon") {
			t.Errorf("%q: %v", args, err)
		}
	}
	c, err := parsePerf([]string{"write", "-R", "--daemon", "/x"}, new(bytes.Buffer))
	if err != nil || c.Daemon != "/x" {
		t.Errorf("-R server through the daemon without -d: %+v, %v", c, err)
	}
	var out, errb bytes.Buffer
	sock := t.TempDir() + "/none.sock"
	st := perfMain([]string{"write", "--daemon", sock, "--timeout", "300ms", "127.0.0.1"}, &perfEnv{Stdout: &out, Stderr: &errb})
	if st != 1 || !strings.Contains(errb.String(), sock) {
		t.Fatalf("exit %d, stdout %q, stderr %q", st, out.String(), errb.String())
	}
}
