// Package clib runs rdma-core's own programs — Debian's ibverbs-utils, perftest and
// rdmacm-utils, unmodified — over softroce daemons through the drop-in libraries
// (clib/, docs/clib.md): the libraries are built once with make, each test starts its
// daemons in-process on 127.x addresses, and the programs run with LD_LIBRARY_PATH naming
// the libraries and SOFTROCE_SOCKET naming a daemon.
package clib

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	daemonpkg "github.com/softroce/softroce/internal/daemon"
	"github.com/softroce/softroce/internal/daemontest"
	"github.com/softroce/softroce/pkg/roce"
)

// softroceBin is the softroce CLI, built by TestMain (the Go tools of the C<->Go pairings).
var softroceBin string

// libDir is where TestMain built libibverbs.so.1 and librdmacm.so.1; asanTests holds the C
// tests (clib/tests) built with ASan/UBSan against sanitized builds of both.
var libDir, asanTests string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	build, err := os.MkdirTemp("", "softroce-clib-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(build)
	cmd := exec.Command("make", "-s", "-C", filepath.Join(root, "clib"), "libs", "asan-tests", "BUILD="+build)
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "make libs: %v\n%s", err, out)
		return 1
	}
	libDir = filepath.Join(build, "lib")
	asanTests = filepath.Join(build, "asan", "tests")
	softroceBin = filepath.Join(build, "softroce")
	if out, err := exec.Command("go", "build", "-o", softroceBin, "github.com/softroce/softroce/cmd/softroce").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build cmd/softroce: %v\n%s", err, out)
		return 1
	}
	probeDaemon()
	return m.Run()
}

// noDevice and noMem say why tests are skipped: the in-test daemon serves no device the
// libraries can open (it speaks another protocol version), or it cannot reach a program's
// memory (ibv_reg_mr of malloc'd memory, docs/daemon-protocol.md "Registered memory").
var noDevice, noMem string

// probeDaemon runs clib/tests/probe.c against an in-test daemon.
func probeDaemon() {
	dir, err := os.MkdirTemp("", "softroce-clib-probe-")
	if err != nil {
		return
	}
	defer os.RemoveAll(dir)
	a := loopbackAddr()
	dev, err := roce.OpenUDP(roce.UDPOptions{Addrs: []netip.Addr{a}})
	if err != nil {
		noDevice = err.Error()
		return
	}
	srv, err := daemonpkg.New(daemonpkg.Options{Device: dev, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		dev.Close()
		noDevice = err.Error()
		return
	}
	sock := filepath.Join(dir, "d.sock")
	ln, err := daemonpkg.Listen(sock, 0o600, -1)
	if err != nil {
		dev.Close()
		noDevice = err.Error()
		return
	}
	go func() { _ = srv.Serve(ln) }()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		dev.Close()
	}()
	cmd := exec.Command(filepath.Join(asanTests, "probe"))
	cmd.Env = append(os.Environ(), "SOFTROCE_SOCKET="+sock)
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	}
	switch code {
	case 0:
	case 3:
		noDevice = "the daemon serves no device to the libraries (not protocol v3): " + strings.TrimSpace(string(out))
		noMem = noDevice
	case 4:
		noMem = "the daemon cannot register process memory yet (SR_MR_PROCESS): " + strings.TrimSpace(string(out))
	default:
		noDevice = fmt.Sprintf("probe: %v\n%s", err, out)
		noMem = noDevice
	}
}

// needDevice and needMem skip a test the daemon cannot serve yet, saying why.
func needDevice(t *testing.T) {
	t.Helper()
	if noDevice != "" {
		t.Skip(noDevice)
	}
}

func needMem(t *testing.T) {
	t.Helper()
	needDevice(t)
	if noMem != "" {
		t.Skip(noMem)
	}
}

// daemon is one in-test softroce daemon.
type daemon struct {
	sock string
	addr netip.Addr
	srv  *daemonpkg.Server
	dev  *roce.Device
}

// nextAddr numbers the loopback addresses this process's daemons listen on.
var nextAddr atomic.Uint32

// loopbackAddr returns a loopback address no other test process uses (127.A.B.n, A and B from
// the pid): test packages run in parallel, each daemon needs its own UDP 4791.
func loopbackAddr() netip.Addr {
	pid := os.Getpid()
	return netip.AddrFrom4([4]byte{127, byte(150 + pid%50), byte(pid / 50 % 250), byte(1 + nextAddr.Add(1)%250)})
}

// startDaemon serves a UDP device on a fresh loopback address (UDP 4791) on a socket in
// t.TempDir().
func startDaemon(t *testing.T) daemon {
	t.Helper()
	return startDaemonLimited(t, daemonpkg.Limits{})
}

// startDaemonLimited is startDaemon with per-user limits (zero fields: the defaults).
func startDaemonLimited(t *testing.T, limits daemonpkg.Limits) daemon {
	t.Helper()
	a := loopbackAddr()
	dev, err := roce.OpenUDP(roce.UDPOptions{Addrs: []netip.Addr{a}})
	if err != nil {
		t.Fatal(err)
	}
	sock, srv := daemontest.ServeLimited(t, dev, limits)
	return daemon{sock: sock, addr: a, srv: srv, dev: dev}
}

// tool is an rdma-core program to run through the libraries.
type tool struct {
	name string
	args []string
	d    daemon
}

func need(t *testing.T, name string) string {
	t.Helper()
	if filepath.IsAbs(name) {
		return name
	}
	p, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s not installed (Debian: ibverbs-utils, perftest, rdmacm-utils)", name)
	}
	return p
}

func (tl tool) command(ctx context.Context, t *testing.T) *exec.Cmd {
	cmd := exec.CommandContext(ctx, need(t, tl.name), tl.args...)
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+libDir, "SOFTROCE_SOCKET="+tl.d.sock)
	return cmd
}

// runTool runs one program to completion and returns its output.
func runTool(t *testing.T, tl tool, timeout time.Duration) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := tl.command(ctx, t).CombinedOutput()
	return string(out), err
}

// pair runs a server and a client program, the client started once the server listens on
// its TCP port (the out-of-band exchange of the pingpongs and perftest), and returns both
// outputs.
func pair(t *testing.T, server, client tool, port int, timeout time.Duration) (sout, cout string) {
	t.Helper()
	return pairReady(t, server, client, func(ctx context.Context, exited <-chan error) error {
		return waitListen(ctx, port, exited)
	}, nil, timeout)
}

// pairCM is pair for programs whose exchange is rdma_cm: the client starts once the server's
// daemon holds a listening rdma_cm ID (Debug.CMListens: an ID that exists but does not listen
// yet would have the client's REQ rejected, invalid service ID). A client whose connect the
// peer's CM still rejected for want of a listener (REJ reason 8) is run again, up to ten runs.
func pairCM(t *testing.T, server, client tool, timeout time.Duration) (sout, cout string) {
	t.Helper()
	for try := 0; ; try++ {
		base := server.d.srv.Debug().CMListens
		rejected := server.d.dev.CM().Stats().NoListener
		sout, cout, err := pairReadyErr(t, server, client, func(ctx context.Context, exited <-chan error) error {
			for server.d.srv.Debug().CMListens <= base {
				select {
				case err := <-exited:
					return fmt.Errorf("exited: %v", err)
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(20 * time.Millisecond):
				}
			}
			return nil
		}, noListener, timeout)
		if err == nil {
			return sout, cout
		}
		// A program that opens a second connection after an exchange on the first (perftest
		// -R: its test QPs after the rdma_cm exchange channel) may send its REQ before the
		// server listens again; the REQ is rejected (reason 8), as on any CM. perftest 4.5's
		// retry after such a reject reuses the IDs and event channel it has just destroyed
		// (later perftest releases allocate them again), so that attempt proves nothing about
		// softroce: run the pair again, up to ten runs.
		if n := server.d.dev.CM().Stats().NoListener; n != rejected && try < 9 {
			t.Logf("a connect beat the server's listen (%d REQs rejected for no listener); running the pair again", n-rejected)
			continue
		}
		t.Fatal(err)
	}
}

// noListener matches what librdmacm's programs print when their connect was rejected with
// reason 8 (no listener on the port).
var noListener = regexp.MustCompile(`REJECTED[^\n]*(error|status)[:=]? ?8\b`)

func pairReady(t *testing.T, server, client tool, ready func(context.Context, <-chan error) error, retry *regexp.Regexp, timeout time.Duration) (sout, cout string) {
	t.Helper()
	sout, cout, err := pairReadyErr(t, server, client, ready, retry, timeout)
	if err != nil {
		t.Fatal(err)
	}
	return sout, cout
}

// pairReadyErr is pairReady returning the pair's failure instead of failing the test.
func pairReadyErr(t *testing.T, server, client tool, ready func(context.Context, <-chan error) error, retry *regexp.Regexp, timeout time.Duration) (sout, cout string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var sb bytes.Buffer
	s := server.command(ctx, t)
	s.Stdout, s.Stderr = &sb, &sb
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	sdone := make(chan error, 1)
	go func() { sdone <- s.Wait() }()
	if err := ready(ctx, sdone); err != nil {
		_ = s.Process.Kill()
		select { // unless ready saw it exit
		case <-sdone:
		case <-time.After(2 * time.Second):
		}
		return "", "", fmt.Errorf("%s did not get ready: %v\n%s", server.name, err, sb.String())
	}
	var cb bytes.Buffer
	var cerr error
	for try := 0; ; try++ {
		cb.Reset()
		c := client.command(ctx, t)
		c.Stdout, c.Stderr = &cb, &cb
		cerr = c.Run()
		if cerr == nil || retry == nil || try == 20 || !retry.Match(cb.Bytes()) || ctx.Err() != nil {
			break
		}
		select { // polled, as waitListen: the server's listen is one request away
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	var serr error
	if cerr != nil {
		// the server waits for a client that is not coming
		select {
		case serr = <-sdone:
		case <-time.After(2 * time.Second):
			_ = s.Process.Kill()
			serr = <-sdone
		}
	} else {
		serr = <-sdone
	}
	if cerr != nil || serr != nil {
		return sb.String(), cb.String(), fmt.Errorf("%s %v: %v\n--- server:\n%s--- client:\n%s", client.name, client.args, firstErr(serr, cerr), sb.String(), cb.String())
	}
	return sb.String(), cb.String(), nil
}

func firstErr(a, b error) error {
	if a != nil {
		return fmt.Errorf("server: %w", a)
	}
	return fmt.Errorf("client: %w", b)
}

// waitListen waits until something accepts TCP connections on port, or the server exited.
// It looks at /proc/net/tcp rather than connecting, since a probe connection would be taken
// as the peer by the programs' out-of-band exchange.
func waitListen(ctx context.Context, port int, exited <-chan error) error {
	want := fmt.Sprintf(":%04X ", port)
	for {
		for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
			b, _ := os.ReadFile(f)
			for _, line := range strings.Split(string(b), "\n") {
				fs := strings.Fields(line)
				if len(fs) > 3 && strings.HasSuffix(fs[1]+" ", want) && fs[3] == "0A" {
					return nil
				}
			}
		}
		select {
		case err := <-exited:
			return fmt.Errorf("exited: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// freePort returns a TCP port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
