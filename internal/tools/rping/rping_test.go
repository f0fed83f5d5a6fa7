package rping

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// runWith runs `softroce rping` (args[0] is "rping") with the server's listen hook.
func runWith(onListen func(), args []string, stdout, stderr io.Writer) int {
	return main(context.Background(), args[1:], stdout, stderr, func(c *Config) { c.OnListen = onListen })
}

// rpingLines are the -v lines rping prints for size 64 (as in the reference capture's logs,
// testdata/captures: rping.client.log / rping.server.log).
func rpingLines(prefix string, n int) string {
	var b strings.Builder
	start := byte('A')
	for i := 0; i < n; i++ {
		msg := []byte(fmt.Sprintf("rdma-ping-%d: ", i))
		c := start
		for len(msg) < 63 {
			msg = append(msg, c)
			if c++; c > 'z' {
				c = 'A'
			}
		}
		if start++; start > 'z' {
			start = 'A'
		}
		fmt.Fprintf(&b, "%sping data: %s\n", prefix, msg)
	}
	return b.String()
}

func TestRpingLines(t *testing.T) {
	// the first two lines of the kernel rping run the reference capture logged
	want := "ping data: rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr\n" +
		"ping data: rdma-ping-1: BCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrs\n"
	if got := rpingLines("", 2); got != want {
		t.Fatalf("pattern\n%s\nwant\n%s", got, want)
	}
}

// TestRpingLoopback runs softroce rping -s and -c against each other on 127.0.0.2 /
// 127.0.0.1 (UDP on a random RoCE port, portable sockets: the race detector sees their ordering): the CM connects them through QP1, three pings run
// (client -v -V lines, server -v lines), the client disconnects, both exit 0 with rping's
// stderr lines.
func TestRpingLoopback(t *testing.T) {
	port := fmt.Sprint(20000 + rand.IntN(40000))
	listening := make(chan struct{})
	onListen := func() { close(listening) }
	var sout, serr bytes.Buffer
	done := make(chan int)
	go func() {
		done <- runWith(onListen, []string{"rping", "-s", "-a", "127.0.0.2", "-p", "7175", "-v", "--roce-port", port, "--portable", "--timeout", "20s"}, &sout, &serr)
	}()
	select {
	case <-listening:
	case st := <-done:
		t.Fatalf("server exited %d: %s", st, serr.String())
	}
	var cout, cerr bytes.Buffer
	st := runWith(nil, []string{"rping", "-c", "-a", "127.0.0.2", "-I", "127.0.0.1", "-p", "7175", "-C", "3", "-vV", "--roce-port", port, "--portable", "--timeout", "20s"}, &cout, &cerr)
	sst := <-done
	if st != 0 || sst != 0 {
		t.Fatalf("exit client %d server %d\nclient stderr %s\nserver stderr %s", st, sst, cerr.String(), serr.String())
	}
	if cout.String() != rpingLines("", 3) {
		t.Fatalf("client stdout\n%s", cout.String())
	}
	if sout.String() != rpingLines("server ", 3) {
		t.Fatalf("server stdout\n%s", sout.String())
	}
	if cerr.String() != "client DISCONNECT EVENT...\n" {
		t.Fatalf("client stderr %q", cerr.String())
	}
	if serr.String() != "server DISCONNECT EVENT...\nwait for RDMA_READ_ADV state 10\n" {
		t.Fatalf("server stderr %q", serr.String())
	}
}

// TestRpingSelectiveRepeat: --selective-repeat on both sides gives the connection selective
// repeat (rdma_cm negotiates it) and rping's usual output; on one side only, the pings run
// all the same and that side notes on stderr that it runs go-back-N. Refused with --daemon.
func TestRpingSelectiveRepeat(t *testing.T) {
	const note = "selective repeat not negotiated (the peer is not softroce, or was not asked): go-back-N\n"
	for i, c := range []struct {
		name             string
		srv, cli         bool
		srvNote, cliNote bool
	}{
		{"both", true, true, false, false},
		{"server only", true, false, true, false},
		{"client only", false, true, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			port := fmt.Sprint(20000 + rand.IntN(40000))
			cmPort := fmt.Sprint(7180 + i)
			sr := func(on bool) []string {
				if on {
					return []string{"--selective-repeat"}
				}
				return nil
			}
			listening := make(chan struct{})
			var sout, serr bytes.Buffer
			done := make(chan int)
			go func() {
				done <- runWith(func() { close(listening) }, append([]string{"rping", "-s", "-a", "127.0.0.2", "-p", cmPort, "--roce-port", port,
					"--portable", "--timeout", "20s"}, sr(c.srv)...), &sout, &serr)
			}()
			select {
			case <-listening:
			case st := <-done:
				t.Fatalf("server exited %d: %s", st, serr.String())
			}
			var cout, cerr bytes.Buffer
			st := runWith(nil, append([]string{"rping", "-c", "-a", "127.0.0.2", "-I", "127.0.0.1", "-p", cmPort, "-C", "3", "-vV",
				"--roce-port", port, "--portable", "--timeout", "20s"}, sr(c.cli)...), &cout, &cerr)
			sst := <-done
			if st != 0 || sst != 0 || cout.String() != rpingLines("", 3) {
				t.Fatalf("exit client %d server %d\nclient stdout %s\nclient stderr %s\nserver stderr %s", st, sst, cout.String(), cerr.String(), serr.String())
			}
			wantC, wantS := "client DISCONNECT EVENT...\n", "server DISCONNECT EVENT...\nwait for RDMA_READ_ADV state 10\n"
			if c.cliNote {
				wantC = note + wantC
			}
			if c.srvNote {
				wantS = note + wantS
			}
			if cerr.String() != wantC || serr.String() != wantS {
				t.Fatalf("stderr client %q server %q, want %q and %q", cerr.String(), serr.String(), wantC, wantS)
			}
		})
	}
	if _, err := ParseArgs([]string{"-c", "-a", "127.0.0.1", "--daemon", "/x", "--selective-repeat"}); !errors.Is(err, errRpingUsage) {
		t.Fatalf("--selective-repeat with --daemon: %v", err)
	}
}

// TestRpingNoServer: the client against a port nobody listens on is rejected (REJ invalid
// service ID, 8) and exits 255 like rping.
func TestRpingNoServer(t *testing.T) {
	port := fmt.Sprint(20000 + rand.IntN(40000))
	var sout, serr bytes.Buffer
	done := make(chan int)
	listening := make(chan struct{})
	onListen := func() { close(listening) }
	go func() {
		done <- runWith(onListen, []string{"rping", "-s", "-a", "127.0.0.2", "-p", "7175", "--roce-port", port, "--portable", "--timeout", "1s"}, &sout, &serr)
	}()
	<-listening
	var cout, cerr bytes.Buffer
	st := runWith(nil, []string{"rping", "-c", "-a", "127.0.0.2", "-I", "127.0.0.1", "-p", "7999", "--roce-port", port, "--portable", "--timeout", "5s"}, &cout, &cerr)
	if st != 255 || !strings.Contains(cerr.String(), "cma event RDMA_CM_EVENT_REJECTED, error 8") {
		t.Fatalf("exit %d stderr %q", st, cerr.String())
	}
	<-done
}

func TestRpingUsage(t *testing.T) {
	for _, args := range [][]string{{"-x"}, {}, {"-c"}, {"-s", "-S", "10"}, {"-s", "-C", "-1"}} {
		var o, e bytes.Buffer
		if st := runWith(nil, append([]string{"rping"}, args...), &o, &e); st != 22 || !strings.HasPrefix(o.String(), "rping -s [-vVd]") {
			t.Errorf("%v: exit %d, stdout %q", args, st, o.String())
		}
	}
}

// TestRpingGetopt: rping's command lines as its getopt reads them ("a:I:Pp:C:S:t:scvVdq":
// grouped flags, attached values, the last of -s and -c winning, atoi numbers) are accepted
// and refused as rping accepts and refuses them; where rdmacm-utils is installed (the lab's
// packages, CI) each is also run through rping itself, without an RDMA device: its parser
// accepted the line when it did not exit with EINVAL.
func TestRpingGetopt(t *testing.T) {
	for _, tc := range []struct {
		args   string
		accept bool
		check  func(c Config) bool
	}{
		{"-s -a 127.0.0.1", true, func(c Config) bool {
			return c.Server && c.Addr.String() == "127.0.0.1" && c.Port == 7174 && c.Size == 64
		}},
		{"-sva127.0.0.1 -C3", true, func(c Config) bool { return c.Server && c.Verbose && c.Count == 3 }},
		{"-c -a127.0.0.2 -I127.0.0.1 -vVd -C 3 -S 100 -p7175", true, func(c Config) bool {
			return c.Client && c.Source.String() == "127.0.0.1" && c.Validate && c.Debug && c.Size == 100 && c.Port == 7175
		}},
		{"-c -a 127.0.0.1 -S 64abc", true, func(c Config) bool { return c.Size == 64 }}, // atoi
		{"-s -c -a 127.0.0.1", true, func(c Config) bool { return c.Client && !c.Server }},
		{"-c -s -a 127.0.0.1", true, func(c Config) bool { return c.Server && !c.Client }},
		{"-s -P -q -a ::ffff:127.0.0.1", true, func(c Config) bool { return c.Persistent && c.Addr.String() == "127.0.0.1" }},
		{"-s -a 127.0.0.1 -S 23", true, nil},
		{"-s -a 127.0.0.1 extra", true, nil},
		{"-x", false, nil},
		{"-s -t 5", false, nil}, // in v44's getopt string, not in its switch
		{"-vVd", false, nil},    // neither -s nor -c
		{"-s -S 22", false, nil},
		{"-s -S 12abc", false, nil},
		{"-s -C -1", false, nil},
		{"-c -a 127.0.0.1 -S 65536", false, nil},
		{"-s -a", false, nil},
		{"-s --verbose", false, nil},
	} {
		args := strings.Fields(tc.args)
		c, err := ParseArgs(args)
		if (err == nil) != tc.accept || (err == nil && tc.check != nil && !tc.check(c)) {
			t.Errorf("rping %s: %+v, %v (accept %v)", tc.args, c, err, tc.accept)
		}
		bin, lerr := exec.LookPath("rping")
		if lerr != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
		cancel()
		var ee *exec.ExitError
		if accepted := !(errors.As(err, &ee) && ee.ExitCode() == rpingEINVAL); accepted != tc.accept { // EINVAL: its usage errors
			t.Errorf("%s %s: accepted %v, the table says %v:\n%s", bin, tc.args, accepted, tc.accept, out)
		}
	}
	var b bytes.Buffer
	Usage(&b)
	if !strings.Contains(b.String(), "--roce-port=<port>") || strings.Contains(b.String(), "---") {
		t.Errorf("usage:\n%s", b.String())
	}
}
