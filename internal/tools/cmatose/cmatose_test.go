package cmatose

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// runWith runs `softroce ucmatose` or `softroce udaddy` (args[0]) with the server's listen
// hook.
func runWith(onListen func(), args []string, stdout, stderr io.Writer) int {
	return main(context.Background(), args[0] == "udaddy", args[1:], stdout, stderr, func(c *Config) { c.OnListen = onListen })
}

// runCMPair runs a softroce ucmatose/udaddy server on 127.0.0.2 and a client from 127.0.0.1
// (portable UDP sockets on a random RoCE port) and returns both outputs and statuses.
func runCMPair(t *testing.T, tool string, extra ...string) (sout, cout string, sst, cst int) {
	t.Helper()
	port := fmt.Sprint(20000 + rand.IntN(40000))
	listening := make(chan struct{})
	onListen := func() { close(listening) }
	common := append([]string{"--roce-port", port, "--portable", "--timeout", "20s"}, extra...)
	var so, se bytes.Buffer
	done := make(chan int)
	go func() { done <- runWith(onListen, append([]string{tool, "-b", "127.0.0.2"}, common...), &so, &se) }()
	select {
	case <-listening:
	case st := <-done:
		t.Fatalf("server exited %d: %s%s", st, so.String(), se.String())
	}
	var co, ce bytes.Buffer
	cst = runWith(nil, append([]string{tool, "-s", "127.0.0.2", "-b", "127.0.0.1"}, common...), &co, &ce)
	sst = <-done
	if se.Len() != 0 || ce.Len() != 0 {
		t.Errorf("stderr: server %q client %q", se.String(), ce.String())
	}
	return so.String(), co.String(), sst, cst
}

// TestUcmatoseLoopback: one RC connection, 10 x 100-byte SENDs each way, the server
// disconnects; both print ucmatose's lines and return status 0.
func TestUcmatoseLoopback(t *testing.T) {
	sout, cout, sst, cst := runCMPair(t, "ucmatose")
	wantS := "cmatose: starting server\ninitiating data transfers\ncompleting sends\nreceiving data transfers\n" +
		"data transfers complete\ncmatose: disconnecting\ndisconnected\ntest complete\nreturn status 0\n"
	wantC := "cmatose: starting client\ncmatose: connecting\nreceiving data transfers\nsending replies\n" +
		"data transfers complete\ntest complete\nreturn status 0\n"
	if sst != 0 || cst != 0 || sout != wantS || cout != wantC {
		t.Fatalf("server %d:\n%s\nclient %d:\n%s", sst, sout, cst, cout)
	}
}

// TestUcmatoseTwoConnections: -c 2 -C 4 -S 3000 (multi-packet SENDs).
func TestUcmatoseTwoConnections(t *testing.T) {
	sout, cout, sst, cst := runCMPair(t, "ucmatose", "-c", "2", "-C", "4", "-S", "3000")
	if sst != 0 || cst != 0 {
		t.Fatalf("server %d:\n%s\nclient %d:\n%s", sst, sout, cst, cout)
	}
}

// TestUdaddyLoopback: SIDR resolves the server's UD QP; 10 SENDs with immediate go to it,
// it answers through an AH made from the first receive's GRH and the immediate (the
// client's QPN).
func TestUdaddyLoopback(t *testing.T) {
	sout, cout, sst, cst := runCMPair(t, "udaddy")
	wantS := "udaddy: starting server\nreceiving data transfers\nsending replies\ndata transfers complete\n" +
		"test complete\nreturn status 0\n"
	wantC := "udaddy: starting client\nudaddy: connecting\ninitiating data transfers\nreceiving data transfers\n" +
		"data transfers complete\ntest complete\nreturn status 0\n"
	if sst != 0 || cst != 0 || sout != wantS || cout != wantC {
		t.Fatalf("server %d:\n%s\nclient %d:\n%s", sst, sout, cst, cout)
	}
}

// TestUcmatoseRejected: a client to a port nobody listens on prints the REJECTED event with
// reason 8 (invalid service ID) and returns it.
func TestUcmatoseRejected(t *testing.T) {
	port := fmt.Sprint(20000 + rand.IntN(40000))
	listening := make(chan struct{})
	onListen := func() { close(listening) }
	done := make(chan int)
	var so, se bytes.Buffer
	go func() {
		done <- runWith(onListen, []string{"ucmatose", "-b", "127.0.0.2", "-p", "7471", "--roce-port", port, "--portable", "--timeout", "1s"}, &so, &se)
	}()
	<-listening
	var co, ce bytes.Buffer
	st := runWith(nil, []string{"ucmatose", "-s", "127.0.0.2", "-b", "127.0.0.1", "-p", "7472", "--roce-port", port, "--portable", "--timeout", "5s"}, &co, &ce)
	if st != 8 || !bytes.Contains(co.Bytes(), []byte("cmatose: event: RDMA_CM_EVENT_REJECTED, error: 8\n")) {
		t.Fatalf("exit %d:\n%s%s", st, co.String(), ce.String())
	}
	<-done
}

// TestCmatoseGetopt: ucmatose's and udaddy's command lines as their getopt reads them (short
// options only, grouped or attached values, atoi numbers, operands ignored) are accepted and
// refused as the tools accept and refuse them; where rdmacm-utils is installed (the lab's
// packages, CI) each is also run through the tool itself, without an RDMA device: its parser
// refused the line when it printed its usage.
func TestCmatoseGetopt(t *testing.T) {
	for _, tc := range []struct {
		tool, args string
		accept     bool
		check      func(c Config) bool
	}{
		{"ucmatose", "-s 127.0.0.1", true, func(c Config) bool {
			return c.Dst.String() == "127.0.0.1" && c.Port == 7471 && c.Count == 10 && c.Size == 100
		}},
		{"ucmatose", "-s127.0.0.1 -C5 -S 1x", true, func(c Config) bool { return c.Count == 5 && c.Size == 1 }},
		{"ucmatose", "-b 127.0.0.2 -c 2 -C 10 -S 100 extra", true, func(c Config) bool { return c.Src.String() == "127.0.0.2" && c.Conns == 2 }},
		{"ucmatose", "-s 127.0.0.1 -t 5 -a 14 -m -f ip -P tcp -p 7472", true, func(c Config) bool { return c.Port == 7472 }},
		{"ucmatose", "-x", false, nil},
		{"ucmatose", "-s", false, nil},
		{"ucmatose", "-s 127.0.0.1 --timeout=x", false, nil},
		{"udaddy", "-s 127.0.0.1 -c 2 -C 3 -S 50", true, func(c Config) bool { return c.UD && c.Port == 7174 && c.Conns == 2 && c.Size == 50 }},
		{"udaddy", "-b 127.0.0.2 -p 0x111 -P udp -f ip -t 0", true, nil},
		{"udaddy", "-m", false, nil},
		{"udaddy", "-a 5", false, nil},
		{"udaddy", "-x", false, nil},
	} {
		args := strings.Fields(tc.args)
		c, err := ParseArgs(tc.tool == "udaddy", args)
		if (err == nil) != tc.accept || (err == nil && tc.check != nil && !tc.check(c)) {
			t.Errorf("%s %s: %+v, %v (accept %v)", tc.tool, tc.args, c, err, tc.accept)
		}
		bin, lerr := exec.LookPath(tc.tool)
		if lerr != nil || strings.Contains(tc.args, "--") {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, _ := exec.CommandContext(ctx, bin, args...).CombinedOutput()
		cancel()
		if accepted := !strings.Contains(string(out), "usage: "); accepted != tc.accept {
			t.Errorf("%s %s: accepted %v, the table says %v:\n%s", bin, tc.args, accepted, tc.accept, out)
		}
	}
}
