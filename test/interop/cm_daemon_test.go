//go:build interop

package interop

// softroce rping through the softroce daemon (rdma_cm in the daemon, internal/daemon cm.go: the
// client's CM IDs are daemon handles bound to its QPs) against rdmacm-utils' rping on kernel
// rxe, both directions (the tools are usable through the daemon too):
//
//   - softroce->rxe: `softroce daemon --listen 198.18.0.1` runs in the lab netns; the guest
//     serves (`rping -s -a 198.18.0.2 -v -d`); `softroce rping -c --daemon SOCK` connects;
//   - rxe->softroce: the same daemon; `softroce rping -s --daemon SOCK -a 198.18.0.1` serves,
//     the guest's `rping -c -a 198.18.0.1 -v -V -C 3` connects.
//
// Run and checked by the embedded rping pairings' code (cm_test.go rpingInterop): exit statuses, rping's ping lines, and
// the tap capture (ICRCs over the real IP headers, REQ/REP/RTU/DREQ/DREP, READ and WRITE).

import (
	"context"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/rocetest"
	"github.com/softroce/softroce/test/rxelab"
)

func init() {
	const size, count = 64, 3
	name := fmt.Sprintf("rping-daemon-%dx%d", size, count)
	pairings = append(pairings,
		pairing{Name: name, Direction: SoftroceToRxe, Run: func(t *testing.T, lab *rxelab.Lab) { rpingInterop(t, lab, true, size, count, sideDaemon, netV4) }},
		pairing{Name: name, Direction: RxeToSoftroce, Run: func(t *testing.T, lab *rxelab.Lab) { rpingInterop(t, lab, false, size, count, sideDaemon, netV4) }},
	)
}

// startLabDaemon runs `softroce daemon` (with the extra flags) in the lab netns and returns
// its socket once it is ready; the daemon is stopped (SIGTERM, then killed) at cleanup. Over IPv4 it listens on the
// host address; over IPv6 on the tap, whose GID table (gid.FromInterface: the link-local GID,
// ::ffff:198.18.0.1, 2001:db8:198:18::1) the tools then pick their address from.
func startLabDaemon(t *testing.T, ctx context.Context, lab *rxelab.Lab, bin string, n labNet, extra ...string) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "softroce.sock")
	log := rocetest.NewWatch("softroce daemon ready")
	listen := rxelab.HostIP
	if n.V6() {
		listen = rxelab.Tap
	}
	cmd := lab.NSCommand(ctx, bin, append([]string{"daemon", "--listen", listen, "--socket", sock}, extra...)...)
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
	case <-log.Seen():
	case <-time.After(30 * time.Second):
		t.Fatalf("softroce daemon never became ready:\n%s", log.String())
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	return sock
}

// labDaemonArgs starts a softroce daemon in the lab netns when viaDaemon and returns the
// `--daemon SOCKET` arguments that send a softroce tool through it (nil otherwise). A tool
// through the daemon still runs in the lab netns when it has an out-of-band exchange
// (pingpong, perf): a unix socket path is reachable from any netns.
func labDaemonArgs(t *testing.T, ctx context.Context, lab *rxelab.Lab, bin string, viaDaemon bool, n labNet) []string {
	t.Helper()
	if !viaDaemon {
		return nil
	}
	return []string{"--daemon", startLabDaemon(t, ctx, lab, bin, n)}
}
