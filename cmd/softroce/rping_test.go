package main

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

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
	rpingOnListen = func() { close(listening) }
	defer func() { rpingOnListen = nil }()
	var sout, serr bytes.Buffer
	done := make(chan int)
	go func() {
		done <- run([]string{"rping", "-s", "-a", "127.0.0.2", "-p", "7175", "-v", "--roce-port", port, "--portable", "--timeout", "20s"}, &sout, &serr)
	}()
	select {
	case <-listening:
	case st := <-done:
		t.Fatalf("server exited %d: %s", st, serr.String())
	}
	var cout, cerr bytes.Buffer
	st := run([]string{"rping", "-c", "-a", "127.0.0.2", "-I", "127.0.0.1", "-p", "7175", "-C", "3", "-vV", "--roce-port", port, "--portable", "--timeout", "20s"}, &cout, &cerr)
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

// TestRpingNoServer: the client against a port nobody listens on is rejected (REJ invalid
// service ID, 8) and exits 255 like rping.
func TestRpingNoServer(t *testing.T) {
	port := fmt.Sprint(20000 + rand.IntN(40000))
	var sout, serr bytes.Buffer
	done := make(chan int)
	listening := make(chan struct{})
	rpingOnListen = func() { close(listening) }
	defer func() { rpingOnListen = nil }()
	go func() {
		done <- run([]string{"rping", "-s", "-a", "127.0.0.2", "-p", "7175", "--roce-port", port, "--portable", "--timeout", "1s"}, &sout, &serr)
	}()
	<-listening
	var cout, cerr bytes.Buffer
	st := run([]string{"rping", "-c", "-a", "127.0.0.2", "-I", "127.0.0.1", "-p", "7999", "--roce-port", port, "--portable", "--timeout", "5s"}, &cout, &cerr)
	if st != 255 || !strings.Contains(cerr.String(), "cma event RDMA_CM_EVENT_REJECTED, error 8") {
		t.Fatalf("exit %d stderr %q", st, cerr.String())
	}
	<-done
}

func TestRpingUsage(t *testing.T) {
	for _, args := range [][]string{{"-x"}, {}, {"-c"}, {"-s", "-S", "10"}, {"-s", "-C", "-1"}} {
		var o, e bytes.Buffer
		if st := run(append([]string{"rping"}, args...), &o, &e); st != 22 {
			t.Errorf("%v: exit %d", args, st)
		}
	}
}
