package rping

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

// TestRpingDaemon runs softroce rping through the daemon against an embedded softroce rping:
// `rping -c --daemon` (the daemon's device on 127.0.0.1) against `rping -s` on 127.0.0.2,
// and `rping -s --daemon` (127.0.0.2) against `rping -c` on 127.0.0.1. Three pings each
// way, rping's output, and the daemon holds no CM IDs or QPs once the clients are gone.
func TestRpingDaemon(t *testing.T) {
	for _, tc := range []struct {
		name           string
		daemonIsServer bool
		daemonAddr     netip.Addr
	}{
		{name: "client-through-daemon", daemonAddr: netip.MustParseAddr("127.0.0.1")},
		{name: "server-through-daemon", daemonIsServer: true, daemonAddr: netip.MustParseAddr("127.0.0.2")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port := uint16(20000 + rand.IntN(40000))
			sock, srv := daemontest.ServeUDP(t, roce.UDPOptions{Addrs: []netip.Addr{tc.daemonAddr}, Port: port, Portable: true, Name: "softroce0"})
			common := []string{"-p", "7176", "--roce-port", fmt.Sprint(port), "--portable", "--timeout", "20s"}
			server := append([]string{"rping", "-s", "-a", "127.0.0.2", "-v"}, common...)
			client := append([]string{"rping", "-c", "-a", "127.0.0.2", "-I", "127.0.0.1", "-C", "3", "-vV"}, common...)
			if tc.daemonIsServer {
				server = append(server, "--daemon", sock)
			} else {
				client = append(client, "--daemon", sock)
			}
			listening := make(chan struct{})
			onListen := func() { close(listening) }
			var sout, serr bytes.Buffer
			done := make(chan int)
			go func() { done <- runWith(onListen, server, &sout, &serr) }()
			select {
			case <-listening:
			case st := <-done:
				t.Fatalf("server exited %d: %s", st, serr.String())
			}
			var cout, cerr bytes.Buffer
			st := runWith(nil, client, &cout, &cerr)
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
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := srv.WaitClients(ctx, 0); err != nil {
				t.Fatal(err)
			}
			if d := srv.Debug(); d.CMIDs != 0 || d.QPs != 0 || d.MRs != 0 {
				t.Fatalf("daemon still holds %+v", d)
			}
		})
	}
}
