package cmatose

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/daemontest"
	"github.com/softroce/softroce/pkg/roce"
)

// runCMPairDaemon is runCMPair with one side (the server if daemonServer, else the client)
// running through a softroce daemon on its address; it also checks that the daemon holds no
// CM IDs or QPs once that side exited.
func runCMPairDaemon(t *testing.T, tool string, daemonServer bool, extra ...string) (sout, cout string, sst, cst int) {
	t.Helper()
	port := uint16(20000 + rand.IntN(40000))
	daddr := netip.MustParseAddr("127.0.0.1")
	if daemonServer {
		daddr = netip.MustParseAddr("127.0.0.2")
	}
	sock, srv := daemontest.ServeUDP(t, roce.UDPOptions{Addrs: []netip.Addr{daddr}, Port: port, Portable: true, Name: "softroce0"})
	listening := make(chan struct{})
	onListen := func() { close(listening) }
	common := append([]string{"--roce-port", fmt.Sprint(port), "--portable", "--timeout", "20s"}, extra...)
	server := append([]string{tool, "-b", "127.0.0.2"}, common...)
	client := append([]string{tool, "-s", "127.0.0.2", "-b", "127.0.0.1"}, common...)
	if daemonServer {
		server = append(server, "--daemon", sock)
	} else {
		client = append(client, "--daemon", sock)
	}
	var so, se bytes.Buffer
	done := make(chan int)
	go func() { done <- runWith(onListen, server, &so, &se) }()
	select {
	case <-listening:
	case st := <-done:
		t.Fatalf("server exited %d: %s%s", st, so.String(), se.String())
	}
	var co, ce bytes.Buffer
	cst = runWith(nil, client, &co, &ce)
	sst = <-done
	if se.Len() != 0 || ce.Len() != 0 {
		t.Errorf("stderr: server %q client %q", se.String(), ce.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.WaitClients(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if d := srv.Debug(); d.CMIDs != 0 || d.QPs != 0 {
		t.Errorf("daemon still holds %+v", d)
	}
	return so.String(), co.String(), sst, cst
}

// TestUcmatoseDaemon: ucmatose with the client, then the server, through the daemon
// against an embedded peer; the same lines as TestUcmatoseLoopback.
func TestUcmatoseDaemon(t *testing.T) {
	wantS := "cmatose: starting server\ninitiating data transfers\ncompleting sends\nreceiving data transfers\n" +
		"data transfers complete\ncmatose: disconnecting\ndisconnected\ntest complete\nreturn status 0\n"
	wantC := "cmatose: starting client\ncmatose: connecting\nreceiving data transfers\nsending replies\n" +
		"data transfers complete\ntest complete\nreturn status 0\n"
	for _, daemonServer := range []bool{false, true} {
		t.Run(fmt.Sprintf("daemon-server=%v", daemonServer), func(t *testing.T) {
			sout, cout, sst, cst := runCMPairDaemon(t, "ucmatose", daemonServer, "-c", "2")
			if sst != 0 || cst != 0 || sout != wantS || cout != wantC {
				t.Fatalf("server %d:\n%s\nclient %d:\n%s", sst, sout, cst, cout)
			}
		})
	}
}

// TestUdaddyDaemon: udaddy (SIDR, UD SENDs with immediate, the reply AH from the GRH) with
// either side through the daemon.
func TestUdaddyDaemon(t *testing.T) {
	wantS := "udaddy: starting server\nreceiving data transfers\nsending replies\ndata transfers complete\n" +
		"test complete\nreturn status 0\n"
	wantC := "udaddy: starting client\nudaddy: connecting\ninitiating data transfers\nreceiving data transfers\n" +
		"data transfers complete\ntest complete\nreturn status 0\n"
	for _, daemonServer := range []bool{false, true} {
		t.Run(fmt.Sprintf("daemon-server=%v", daemonServer), func(t *testing.T) {
			sout, cout, sst, cst := runCMPairDaemon(t, "udaddy", daemonServer)
			if sst != 0 || cst != 0 || sout != wantS || cout != wantC {
				t.Fatalf("server %d:\n%s\nclient %d:\n%s", sst, sout, cst, cout)
			}
		})
	}
}
