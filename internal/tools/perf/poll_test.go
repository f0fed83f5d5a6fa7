package perf

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/softroce/softroce/internal/netnstest"
	"github.com/softroce/softroce/internal/oob/perftest"
	"github.com/softroce/softroce/internal/tools/cli"
	"github.com/softroce/softroce/internal/tools/tooltest"
)

// TestPerfPolledMode: --lat --busy-poll runs the embedded device in polled mode (not for
// bandwidth tests, --portable, --daemon, -R or --loopback), cli.OpenLocal opens it so, and
// every latency test completes in it softroce <-> softroce with perftest's output.
func TestPerfPolledMode(t *testing.T) {
	for _, c := range []struct {
		args []string
		want bool
	}{
		{[]string{"write", "--lat", "--busy-poll"}, true},
		{[]string{"send", "--lat", "--busy-poll"}, true},
		{[]string{"write", "--lat"}, false},
		{[]string{"write", "--busy-poll"}, false},
		{[]string{"write", "--lat", "--busy-poll", "--portable"}, false},
		{[]string{"write", "--lat", "--busy-poll", "--daemon", "/tmp/x.sock"}, false},
	} {
		pc, err := parsePerf(c.args, io.Discard)
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if got := pc.polled(); got != c.want {
			t.Errorf("%v: polled %v, want %v", c.args, got, c.want)
		}
	}
	f := cli.DevFlag{Addr: netip.MustParseAddr("127.0.0.1")}
	ld, err := cli.OpenLocal(&f, cli.DevOptions{Port: tooltest.FreeUDPPort(t), Polled: true})
	if err != nil {
		t.Fatal(err)
	}
	if !ld.Dev.Polled() {
		t.Error("cli.OpenLocal with Polled: the device has a receive goroutine")
	}
	ld.Dev.Close()

	for _, args := range [][]string{
		{"write", "--lat", "--busy-poll", "-s", "8", "-n", "300"},
		{"write", "--lat", "--busy-poll", "-s", "3000", "-n", "100", "-m", "1024"},
		{"send", "--lat", "--busy-poll", "-s", "8", "-n", "200"},
		{"read", "--lat", "--busy-poll", "-s", "64", "-n", "100"},
		{"atomic", "--lat", "--busy-poll", "-n", "100"},
		{"send", "--lat", "--busy-poll", "-a", "-n", "5"},
	} {
		t.Run(strings.Join(args, "_"), func(t *testing.T) {
			cfg, err := parsePerf(args, new(bytes.Buffer))
			if err != nil {
				t.Fatal(err)
			}
			_, _, so, co := perfPairInProcess(t, args...)
			sizes := []int{cfg.Size}
			if cfg.All {
				sizes = perfSizes(cfg, 0)
			}
			checkPerfPair(t, so, co, cfg.Test, sizes, cfg.Iters, 1, cfg.Gbits)
			if t.Failed() {
				t.Logf("server:\n%s\nclient:\n%s", so, co)
			}
		})
	}
}

// TestPerfXDP: --xdp is an embedded device's option (a usage error with --portable,
// --loopback or --daemon), and a polled 8-byte WRITE latency run between two network
// namespaces on a veth pair (root) goes through the AF_XDP rings on both sides: perftest's
// output from both ends, and the link counters (--stats) show the messages in the rings.
func TestPerfXDP(t *testing.T) {
	for _, args := range [][]string{
		{"write", "--lat", "--busy-poll", "--xdp", "--portable"},
		{"write", "--xdp", "--loopback"},
		{"write", "--lat", "--xdp", "--daemon", "/tmp/x.sock"},
		{"write", "--lat", "--xdp-no-pairs"},
		{"write", "--lat", "--dm"},
	} {
		if _, err := parsePerf(args, io.Discard); !errors.Is(err, errPerfUsage) {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
	for _, dm := range []bool{false, true} {
		name := "rings"
		if dm {
			name = "dm"
		}
		t.Run(name, func(t *testing.T) { perfXDPRun(t, dm) })
	}
}

// perfXDPRun is one TestPerfXDP run; dm: --dm on both sides (each side's WRITEs executed and
// ACKed by the peer's XDP program: a side's ring sends only its WRITEs, receives only ACKs).
func perfXDPRun(t *testing.T, dm bool) {
	net3, na, nb := 8, "srfa", "srfb" // a veth pair each: an AF_XDP socket's queue is free only some time after its Close
	if dm {
		net3, na, nb = 10, "srfc", "srfd"
	}
	ipA, ipB := fmt.Sprintf("198.18.%d.1", net3), fmt.Sprintf("198.18.%d.2", net3)
	x, y := netnstest.Veth(t, na, ipA+"/24", nb, ipB+"/24", 1500)
	var ln net.Listener
	if err := y.Do(func() (err error) { ln, err = net.Listen("tcp4", ipB+":0"); return err }); err != nil {
		t.Fatal(err)
	}
	const iters = 500
	common := func(more ...string) []string {
		args := []string{"write", "--lat", "--busy-poll", "--xdp", "-s", "8", "-n", strconv.Itoa(iters),
			"-p", strconv.Itoa(ln.Addr().(*net.TCPAddr).Port), "--timeout", "20s", "--run-timeout", "20s", "--stats"}
		if dm {
			args = append(args, "--dm")
		}
		return append(args, more...)
	}
	var so, se, co, ce bytes.Buffer
	var ss, cs int
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = y.Do(func() error {
			ss = perfMain(common("-d", ipB), &perfEnv{Stdout: &so, Stderr: &se, Listener: ln})
			return nil
		})
	}()
	_ = x.Do(func() error {
		cs = perfMain(common("-d", ipA, ipB), &perfEnv{Stdout: &co, Stderr: &ce})
		return nil
	})
	<-done
	if ss != 0 || cs != 0 {
		t.Fatalf("exit status server %d client %d\nserver:\n%s%s\nclient:\n%s%s", ss, cs, so.String(), se.String(), co.String(), ce.String())
	}
	gid := func(last int) string {
		return fmt.Sprintf("00:00:00:00:00:00:00:00:00:00:255:255:198:18:%02d:%02d", net3, last)
	}
	checkPerfPairAt(t, so.String(), co.String(), perftest.WriteLat, []int{8}, iters, 1, false, gid(2), gid(1))
	for side, e := range map[string]string{"server": se.String(), "client": ce.String()} {
		var sent, recv, fb int
		i := strings.Index(e, "stats: link AF_XDP path ")
		if i < 0 {
			t.Fatalf("%s: no AF_XDP counters in --stats:\n%s", side, e)
		}
		t.Logf("%s: %s", side, strings.SplitN(e[i:], "\n", 2)[0])
		if _, err := fmt.Sscanf(e[i:], "stats: link AF_XDP path sent %d, received %d, sends through the UDP socket %d", &sent, &recv, &fb); err != nil {
			t.Fatalf("%s: %v in %q", side, err, e[i:])
		}
		if dm {
			// the peer's program executed every WRITE but a first one through the socket (the
			// MAC address not yet known) and ACKed them all: no ACK from user space
			if sent+fb != iters || sent < iters-1 || recv < iters || recv > iters+1 {
				t.Errorf("%s: AF_XDP sent %d, received %d, socket sends %d; want the %d WRITEs sent and only their ACKs received", side, sent, recv, fb, iters)
			}
			var ex int
			if j := strings.Index(e[i:], "WRITEs executed by the XDP program "); j < 0 {
				t.Errorf("%s: no count of the XDP program's WRITEs", side)
			} else if _, err := fmt.Sscanf(e[i+j:], "WRITEs executed by the XDP program %d", &ex); err != nil || ex != iters {
				t.Errorf("%s: the XDP program executed %d of the peer's WRITEs (%v), want all %d", side, ex, err, iters)
			}
			continue
		}
		if sent < iters || recv < iters || fb > 1 {
			t.Errorf("%s: AF_XDP sent %d, received %d, socket sends %d; want the %d WRITEs and their ACKs in the rings", side, sent, recv, fb, iters)
		}
		// each WRITE after the first leaves with the ACK of the peer's last one: one GSO frame
		// where the kernel takes them (link.PairSender), else two ring frames. A WRITE posted
		// after the pending ACK went out alone (a side descheduled on a busy machine for
		// longer than the ACK's coalescing wait) leaves unpaired: 90% of them paired is the bar.
		minPairs := (iters - 1) * 9 / 10
		var pairs int
		if _, err := fmt.Sscanf(e[i:], "stats: link AF_XDP path sent %d, received %d, sends through the UDP socket %d, pairs as one GSO frame %d", &sent, &recv, &fb, &pairs); err != nil {
			t.Fatalf("%s: %v in %q", side, err, e[i:])
		}
		refused := strings.Contains(strings.SplitN(e[i:], "\n", 2)[0], "refused by the kernel")
		if on := netnstest.KernelAtLeast(t, 6, 2); !refused && pairs < minPairs || refused && (on || pairs != 0) {
			t.Errorf("%s: %d pairs as one frame, refused %v (kernel 6.2 or later: %v); want >= %d, or none and refused before 6.2", side, pairs, refused, on, minPairs)
		}
	}
}
