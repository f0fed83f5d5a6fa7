//go:build interop

package interop

// softroce rping through the softroce daemon (rdma_cm in the daemon, pkg/daemon cm.go: the
// client's CM IDs are daemon handles bound to its QPs) against rdmacm-utils' rping on kernel
// rxe, both directions (issue #10, "usable ... through the daemon"):
//
//   - softroce->rxe: `softroce daemon --listen 198.18.0.1` runs in the lab netns; the guest
//     serves (`rping -s -a 198.18.0.2 -v -d`); `softroce rping -c --daemon SOCK` connects;
//   - rxe->softroce: the same daemon; `softroce rping -s --daemon SOCK -a 198.18.0.1` serves,
//     the guest's `rping -c -a 198.18.0.1 -v -V -C 3` connects.
//
// Checks as the embedded rping pairings (cm_test.go): exit statuses, rping's ping lines, and
// the tap capture (ICRCs over the real IP headers, REQ/REP/RTU/DREQ/DREP, READ and WRITE).

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softroce/softroce/test/rxelab"
)

func init() {
	const size, count = 64, 3
	name := fmt.Sprintf("rping-daemon-%dx%d", size, count)
	pairings = append(pairings,
		pairing{Name: name, Direction: SoftroceToRxe, Run: func(t *testing.T, lab *rxelab.Lab) { rpingDaemonInterop(t, lab, true, size, count) }},
		pairing{Name: name, Direction: RxeToSoftroce, Run: func(t *testing.T, lab *rxelab.Lab) { rpingDaemonInterop(t, lab, false, size, count) }},
	)
}

// startLabDaemon runs `softroce daemon` on the host address in the lab netns and returns its
// socket once it is ready; the daemon is stopped (SIGTERM, then killed) at cleanup.
func startLabDaemon(t *testing.T, ctx context.Context, lab *rxelab.Lab, bin string) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "softroce.sock")
	log := newLineWatch("softroce daemon ready")
	cmd := lab.NSCommand(ctx, bin, "daemon", "--listen", rxelab.HostIP, "--socket", sock)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		t.Logf("softroce daemon log:\n%s", log.String())
	})
	select {
	case <-log.seen:
	case <-time.After(30 * time.Second):
		t.Fatalf("softroce daemon never became ready:\n%s", log.String())
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	return sock
}

func rpingDaemonInterop(t *testing.T, lab *rxelab.Lab, client bool, size, count int) {
	bin := buildSoftroce(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	sock := startLabDaemon(t, ctx, lab, bin)
	stopCapture := ppStartCapture(t, lab)

	var guestCmd string
	var ourArgs []string
	if client {
		guestCmd = fmt.Sprintf("rping -s -a %s -v -d -S %d", rxelab.GuestIP, size)
		ourArgs = []string{"rping", "-c", "-a", rxelab.GuestIP, "-C", fmt.Sprint(count), "-S", fmt.Sprint(size), "-v", "-V", "--timeout", "30s", "--daemon", sock}
	} else {
		guestCmd = fmt.Sprintf("rping -c -a %s -v -V -C %d -S %d", rxelab.HostIP, count, size)
		ourArgs = []string{"rping", "-s", "-a", rxelab.HostIP, "-v", "-d", "-S", fmt.Sprint(size), "--timeout", "30s", "--daemon", sock}
	}
	ours := newLineWatch("rdma_listen")
	var ourErr bytes.Buffer
	// the rping client needs no netns of its own: it talks to the daemon's socket only
	cmd := exec.CommandContext(ctx, bin, ourArgs...)
	cmd.Stdout, cmd.Stderr = ours, &ourErr
	var job *rxelab.Job
	var err error
	if client {
		if job, err = lab.ExecBG(ctx, "exec stdbuf -oL "+guestCmd, rxelab.ExecOptions{Timeout: 60 * time.Second}); err != nil {
			t.Fatalf("guest: %v", err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			out, _ := job.Log()
			if bytes.Contains(out, []byte("rdma_listen")) {
				break
			}
			if time.Now().After(deadline) {
				_ = job.Kill()
				t.Fatalf("guest rping never listened:\n%s", out)
			}
			select {
			case <-time.After(200 * time.Millisecond):
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			}
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
	} else {
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ours.seen:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("softroce rping server never listened:\n%s%s", ours.String(), ourErr.String())
		}
		if job, err = lab.ExecBG(ctx, "exec stdbuf -oL "+guestCmd, rxelab.ExecOptions{Timeout: 60 * time.Second}); err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("guest: %v", err)
		}
	}
	waited := false
	defer func() {
		if !waited {
			_ = job.Kill()
			out, st, _ := job.Wait(context.Background())
			t.Logf("guest %s (killed) status %d:\n%s", guestCmd, st, out)
		}
	}()
	ourStatus := 0
	if err := cmd.Wait(); err != nil {
		ourStatus = -1
		if ee, ok := err.(*exec.ExitError); ok {
			ourStatus = ee.ExitCode()
		}
	}
	t.Logf("softroce %s (exit %d):\nstdout:\n%s\nstderr:\n%s", strings.Join(ourArgs, " "), ourStatus, ours.String(), ourErr.String())
	guestOut, guestStatus, err := job.Wait(ctx)
	waited = true
	if err != nil {
		t.Fatalf("guest job: %v", err)
	}
	t.Logf("guest %s (exit %d):\n%s", guestCmd, guestStatus, guestOut)
	if ourStatus != 0 {
		t.Errorf("softroce rping --daemon exit status %d, want 0", ourStatus)
	}
	if guestStatus != 0 {
		t.Errorf("guest rping exit status %d, want 0", guestStatus)
	}
	cliOut, srvOut := ours.String(), string(guestOut)
	if !client {
		cliOut, srvOut = srvOut, cliOut
	}
	if got, want := rpingLines(cliOut, ""), rpingExpect("", count, size); got != want {
		t.Errorf("client ping lines:\n%s\nwant:\n%s", got, want)
	}
	if got, want := rpingLines(srvOut, "server "), rpingExpect("server ", count, size); got != want {
		t.Errorf("server ping lines:\n%s\nwant:\n%s", got, want)
	}
	if strings.Contains(ourErr.String(), "data mismatch") || strings.Contains(string(guestOut), "data mismatch") {
		t.Errorf("-V reported a data mismatch")
	}
	wire, lost := stopCapture()
	rpingCheckWire(t, wire, lost, client, count, (size+pathMTU-1)/pathMTU)
}
