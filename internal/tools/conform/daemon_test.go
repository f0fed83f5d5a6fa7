package conform

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/softroce/softroce/internal/daemon"
	"github.com/softroce/softroce/internal/daemontest"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/internal/tools/tooltest"
	"github.com/softroce/softroce/pkg/conform"
	"github.com/softroce/softroce/pkg/roce"
)

// startConformDaemon serves a device on addr:port with the in-process DUT's MTU (1024) on a
// socket in a temporary directory.
func startConformDaemon(t *testing.T, addr netip.Addr, port uint16) (string, *daemon.Server) {
	t.Helper()
	return daemontest.ServeUDP(t, roce.UDPOptions{Addrs: []netip.Addr{addr}, Port: port, Portable: true, MTU: qp.MTU1024, Name: "softroce0"})
}

// TestConformDaemon runs every scenario with `softroce conform --dut softroce --daemon SOCKET`
// (the DUT's objects made through the daemon on 127.0.79.1, the bench on 127.0.79.2, the
// daemon's port): all pass, as against the in-process DUT (TestConformSoftroce's subset and
// pkg/conform TestSoftroce), and the daemon holds nothing afterwards.
func TestConformDaemon(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) }) // after the daemon's cleanup
	port := uint16(20000 + rand.IntN(40000))
	sock, srv := startConformDaemon(t, conform.LoopbackDUT, port)
	var out, errb bytes.Buffer
	st := run([]string{"conform", "--dut", "softroce", "--daemon", sock, "--roce", fmt.Sprintf("127.0.79.1:%d", port),
		"--reply", "2s", "--quiet", "150ms"}, &out, &errb)
	n := len(conform.Scenarios())
	if st != 0 || !strings.Contains(out.String(), fmt.Sprintf("%d scenarios: %d pass, 0 fail, 0 skip", n, n)) || errb.Len() != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", st, out.String(), errb.String())
	}
	if !strings.HasPrefix(out.String(), "DUT softroce\n") {
		t.Errorf("table header: %q", strings.SplitN(out.String(), "\n", 2)[0])
	}
	tooltest.DaemonIdle(t, srv)
}

// TestConformDaemonServe: `--serve HOST:PORT --daemon SOCKET` is an agent whose DUT is the
// daemon's device, driven by a --dut HOST:PORT bench.
func TestConformDaemonServe(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) }) // after the daemon's cleanup
	port := uint16(20000 + rand.IntN(40000))
	sock, srv := startConformDaemon(t, netip.MustParseAddr("127.0.79.3"), port)
	ln, err := net.Listen("tcp", "127.0.79.3:0")
	if err != nil {
		t.Fatal(err)
	}
	ctl := ln.Addr().String()
	ln.Close() // the agent binds it again below
	roceAddr := fmt.Sprintf("127.0.79.3:%d", port)
	done := make(chan int, 1)
	var aout, aerr bytes.Buffer
	go func() {
		done <- run([]string{"conform", "--serve", ctl, "--daemon", sock, "--roce", roceAddr}, &aout, &aerr)
	}()
	var out, errb bytes.Buffer
	st := -1
	for try := 0; try < 100 && st != 0; try++ { // until the agent listens
		out.Reset()
		errb.Reset()
		if st = run([]string{"conform", "--dut", ctl, "--roce", roceAddr, "--bench", fmt.Sprintf("127.0.79.4:%d", port),
			"--run", "^(rc-send-only-ack|rc-fetch-add|uc-send-no-ack)$"}, &out, &errb); st == 2 {
			<-time.After(20 * time.Millisecond)
			continue
		}
		break
	}
	if st != 0 || !strings.Contains(out.String(), "3 scenarios: 3 pass") {
		t.Fatalf("bench exit %d\n%s\n%s", st, out.String(), errb.String())
	}
	if st := <-done; st != 0 {
		t.Errorf("agent exit %d: %s %s", st, aout.String(), aerr.String())
	}
	if !strings.Contains(aout.String(), "DUT "+roceAddr) {
		t.Errorf("agent banner %q", aout.String())
	}
	tooltest.DaemonIdle(t, srv)
}

// TestConformDaemonUsage: --daemon only with the softroce DUT; --roce must name one of the
// daemon's addresses; a missing daemon is a setup error (2).
func TestConformDaemonUsage(t *testing.T) {
	port := uint16(20000 + rand.IntN(40000))
	sock, _ := startConformDaemon(t, netip.MustParseAddr("127.0.79.6"), port)
	for _, args := range [][]string{
		{"conform", "--dut", "rxe", "--daemon", sock},
		{"conform", "--dut", "softroce", "--daemon", sock, "--roce", "127.0.79.7"},
		{"conform", "--dut", "softroce", "--daemon", sock, "--bench", "127.0.79.6"},
		{"conform", "--dut", "softroce", "--daemon", filepath.Join(t.TempDir(), "none.sock")},
	} {
		var out, errb bytes.Buffer
		if st := run(args, &out, &errb); st != 2 || errb.Len() == 0 {
			t.Errorf("%v: exit %d, want 2 (%s)", args, st, errb.String())
		}
	}
}
