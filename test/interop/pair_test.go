//go:build interop

package interop

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/rocetest"
	"github.com/softroce/softroce/internal/testcap"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/client"
	"github.com/softroce/softroce/test/rxelab"
)

// pairSpec is one softroce CLI command run against one tool in the guest: the server side
// starts first and the client only once the server is ready (docs/interop.md).
type pairSpec struct {
	// Client: softroce is the client, so the guest's tool is the server and starts first.
	Client bool
	// Ours are the softroce binary's arguments (run in the lab netns unless HostNetns).
	Ours []string
	// HostNetns runs softroce in the test's own network namespace (a program that talks
	// only to a daemon's unix socket needs no address of its own).
	HostNetns bool
	// Guest is the guest's command line, run as "exec stdbuf -oL <Guest>".
	Guest string
	// OurReady: softroce as the server prints this once it listens; the guest starts then.
	OurReady string
	// GuestReady: the guest as the server prints this right before it listens; softroce's
	// client starts once the guest's job log shows it. Empty: softroce starts at once (for
	// clients that retry until the server listens).
	GuestReady string
	// GuestListen, with Client, is the port on which the guest's server takes its connection:
	// softroce's client starts once the guest's kernel shows a TCP socket listening there, or
	// with GuestListenCM an rdma_cm ID (rdma resource show cm_id). For clients that try their
	// connection once (rdma-core's pingpongs, perftest), whose server prints nothing between
	// listening and accepting (perftest -R prints its banner before rdma_listen).
	GuestListen   int
	GuestListenCM bool
	// OurCMSocket, with softroce as the server, is the daemon socket of a program through
	// the drop-in libraries whose readiness line comes before its rdma_listen (perftest -R):
	// the guest starts once that daemon holds a listening rdma_cm ID (its Debug's CMListens),
	// not on the line, or its REQ may be rejected for want of a listener.
	OurCMSocket string
	// GuestTimeout bounds the guest job (default 60 s).
	GuestTimeout time.Duration
	// Bin, if set, runs instead of the softroce binary (with Ours as its arguments), and Env
	// is added to its environment: an rdma-core program through the drop-in libraries
	// (clib_test.go).
	Bin string
	Env []string
	// GuestKilledOK: a guest job that does not end by itself is killed and reported
	// (pairResult.GuestKilled) instead of failing the test, and a guest server whose client
	// (softroce's side) failed is killed at once.
	GuestKilledOK bool
	// libSocket is the daemon socket libSpec gave the program.
	libSocket string
}

// pairResult is what both sides printed and their exit statuses.
type pairResult struct {
	OurStatus   int
	OurOut      string // softroce's stdout
	OurErr      string // softroce's stderr
	GuestStatus int
	GuestOut    string // the guest's stdout and stderr
	GuestKilled bool   // the guest job was killed (pairSpec.GuestKilledOK)
}

// readyWait bounds how long either side may take to become ready as the server.
const readyWait = 30 * time.Second

// runPair starts both sides in order and waits for both to exit, logging their output. It
// stops the test (Fatal) only when a side cannot be started or never gets ready; exit
// statuses and outputs are the caller's to judge. Both processes are gone when it returns.
func runPair(ctx context.Context, t *testing.T, lab *rxelab.Lab, bin string, p pairSpec) pairResult {
	t.Helper()
	gopts := rxelab.ExecOptions{Timeout: p.GuestTimeout}
	if gopts.Timeout == 0 {
		gopts.Timeout = 60 * time.Second
	}
	ourReady := p.OurReady
	if ourReady == "" {
		ourReady = "\x00never" // a watch needs a marker; nobody waits on this one
	}
	ours := rocetest.NewWatch(ourReady)
	var ourErr bytes.Buffer
	if p.Bin != "" {
		bin = p.Bin
	}
	cmd := lab.NSCommand(ctx, bin, p.Ours...)
	if p.HostNetns {
		cmd = exec.CommandContext(ctx, bin, p.Ours...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // as Lab.NSCommand's
	}
	if p.Env != nil {
		cmd.Env = append(os.Environ(), p.Env...)
	}
	cmd.Stdout, cmd.Stderr = ours, &ourErr
	stopOurs := func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	var job *rxelab.Job
	var err error
	if p.Client {
		script, ready := "exec stdbuf -oL "+p.Guest, p.GuestReady
		if p.GuestListen != 0 {
			script, ready = guestListenScript(p.Guest, p.GuestListen, p.GuestListenCM), guestListening
		}
		if job, err = lab.ExecBG(ctx, script, gopts); err != nil {
			t.Fatalf("guest %s: %v", p.Guest, err)
		}
		if ready != "" {
			// the job log is polled through 9p, far slower than the gap between the
			// server's readiness line and its listen call
			if err := waitGuestLine(ctx, job, ready); err != nil {
				_ = job.Kill()
				out, _ := job.Log()
				t.Fatalf("guest %s: %v:\n%s", p.Guest, err, out)
			}
		}
		if err := cmd.Start(); err != nil {
			_ = job.Kill()
			t.Fatal(err)
		}
	} else {
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ours.Seen():
		case <-time.After(readyWait):
			stopOurs()
			t.Fatalf("softroce %s never printed %q:\n%s%s", strings.Join(p.Ours, " "), p.OurReady, ours.String(), ourErr.String())
		}
		if p.OurCMSocket != "" {
			if err := waitCMListen(ctx, p.OurCMSocket); err != nil {
				stopOurs()
				t.Fatalf("softroce %s: %v:\n%s%s", strings.Join(p.Ours, " "), err, ours.String(), ourErr.String())
			}
		}
		if job, err = lab.ExecBG(ctx, "exec stdbuf -oL "+p.Guest, gopts); err != nil {
			stopOurs()
			t.Fatalf("guest %s: %v", p.Guest, err)
		}
	}
	var r pairResult
	if err := cmd.Wait(); err != nil {
		r.OurStatus = -1
		if ee, ok := err.(*exec.ExitError); ok {
			r.OurStatus = ee.ExitCode()
		}
	}
	r.OurOut, r.OurErr = ours.String(), ourErr.String()
	t.Logf("softroce %s (exit %d):\nstdout:\n%s\nstderr:\n%s", strings.Join(p.Ours, " "), r.OurStatus, r.OurOut, r.OurErr)
	if p.GuestKilledOK && p.Client && r.OurStatus != 0 {
		_ = job.Kill() // the guest's server would wait for its client until its timeout
	}
	out, st, err := job.Wait(ctx)
	if err != nil {
		_ = job.Kill()
		out, st, _ = job.Wait(context.Background())
		if !p.GuestKilledOK {
			t.Fatalf("guest %s: %v (killed, status %d):\n%s", p.Guest, err, st, out)
		}
		t.Logf("guest %s: %v (killed, status %d):\n%s", p.Guest, err, st, out)
		r.GuestKilled = true
	}
	r.GuestOut, r.GuestStatus = string(out), st
	t.Logf("guest %s (exit %d):\n%s", p.Guest, st, out)
	return r
}

// guestListening is the line guestListenScript prints once the server listens.
const guestListening = "== rxelab: the server listens"

// guestListenScript runs cmd in the guest and prints guestListening once a TCP socket listens
// on port (the kernel's /proc/net/tcp and tcp6: local port, no remote, state 0A LISTEN), or
// with cm an rdma_cm ID listens there (iproute2's rdma resource show cm_id: state LISTEN,
// src-addr ADDR:PORT), or nothing if cmd exits first; its exit status is cmd's.
func guestListenScript(cmd string, port int, cm bool) string {
	check := fmt.Sprintf(`grep -Eq ':%04X [0-9A-F]+:0000 0A ' /proc/net/tcp /proc/net/tcp6`, port)
	if cm {
		check = fmt.Sprintf(`rdma resource show cm_id | grep -Eq 'state LISTEN .*src-addr [^ ]*:%d( |$)'`, port)
	}
	return fmt.Sprintf(`stdbuf -oL %s & p=$!
while kill -0 $p 2>/dev/null; do
  if %s 2>/dev/null; then echo %q; break; fi
  sleep 0.05
done
wait $p`, cmd, check, guestListening)
}

// waitCMListen polls the daemon at sock until it holds a listening rdma_cm ID.
func waitCMListen(ctx context.Context, sock string) error {
	c, err := client.Dial(sock)
	if err != nil {
		return err
	}
	defer c.Close()
	deadline := time.Now().Add(readyWait)
	for {
		d, err := c.Debug()
		if err != nil {
			return err
		}
		if d.CMListens > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no rdma_cm ID listening on the daemon after %v", readyWait)
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// waitGuestLine polls a guest job's log until it contains line.
func waitGuestLine(ctx context.Context, job *rxelab.Job, line string) error {
	deadline := time.NewTimer(readyWait)
	defer deadline.Stop()
	for {
		if out, _ := job.Log(); bytes.Contains(out, []byte(line)) {
			return nil
		}
		select {
		case <-time.After(200 * time.Millisecond):
		case <-deadline.C:
			return &lineTimeout{line}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

type lineTimeout struct{ line string }

func (e *lineTimeout) Error() string { return "never printed " + `"` + e.line + `"` }

// wantExit0 reports a side's non-zero exit status.
func wantExit0(t *testing.T, who string, status int) {
	t.Helper()
	if status != 0 {
		t.Errorf("%s exit status %d, want 0", who, status)
	}
}

// checkICRC verifies a captured packet's ICRC over its real IP header (IPv4 ID included),
// reporting the first 5 mismatches of a capture (*bad counts them all); false if the IP
// header could not be read (reported), so the caller skips the packet.
func checkICRC(t *testing.T, d testcap.IPUDP, bad *int) bool {
	t.Helper()
	want, err := bth.ICRCFromIP(d.IP)
	if err != nil {
		t.Errorf("ICRCFromIP: %v", err)
		return false
	}
	if got := bth.GetICRC(d.Payload); got != want {
		if *bad++; *bad <= 5 {
			t.Errorf("captured %v -> %v id %d: ICRC %#08x, computed over the real header %#08x", d.Src, d.Dst, d.ID, got, want)
		}
	}
	return true
}
