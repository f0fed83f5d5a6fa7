package main

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
)

// runCMPair runs a softroce ucmatose/udaddy server on 127.0.0.2 and a client from 127.0.0.1
// (portable UDP sockets on a random RoCE port) and returns both outputs and statuses.
func runCMPair(t *testing.T, tool string, extra ...string) (sout, cout string, sst, cst int) {
	t.Helper()
	port := fmt.Sprint(20000 + rand.IntN(40000))
	listening := make(chan struct{})
	cmtOnListen = func() { close(listening) }
	defer func() { cmtOnListen = nil }()
	common := append([]string{"--roce-port", port, "--portable", "--timeout", "20s"}, extra...)
	var so, se bytes.Buffer
	done := make(chan int)
	go func() { done <- run(append([]string{tool, "-b", "127.0.0.2"}, common...), &so, &se) }()
	select {
	case <-listening:
	case st := <-done:
		t.Fatalf("server exited %d: %s%s", st, so.String(), se.String())
	}
	var co, ce bytes.Buffer
	cst = run(append([]string{tool, "-s", "127.0.0.2", "-b", "127.0.0.1"}, common...), &co, &ce)
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
	cmtOnListen = func() { close(listening) }
	defer func() { cmtOnListen = nil }()
	done := make(chan int)
	var so, se bytes.Buffer
	go func() {
		done <- run([]string{"ucmatose", "-b", "127.0.0.2", "-p", "7471", "--roce-port", port, "--portable", "--timeout", "1s"}, &so, &se)
	}()
	<-listening
	var co, ce bytes.Buffer
	st := run([]string{"ucmatose", "-s", "127.0.0.2", "-b", "127.0.0.1", "-p", "7472", "--roce-port", port, "--portable", "--timeout", "5s"}, &co, &ce)
	if st != 8 || !bytes.Contains(co.Bytes(), []byte("cmatose: event: RDMA_CM_EVENT_REJECTED, error: 8\n")) {
		t.Fatalf("exit %d:\n%s%s", st, co.String(), ce.String())
	}
	<-done
}
