//go:build interop && failprobe

package interop

// Failure probes for the "nothing left behind, even on failure" rule (docs/interop.md):
// compiled only with -tags 'interop failprobe', they start what a pairing starts — a guest
// job, a tcpdump on the tap, a softroce process in the lab netns — and then fail
// (TestFailProbeFatal) or hang until the test binary's timeout panic
// (TestFailProbeHang). test/rxelab/leftover-check runs each through scripts/interop and
// requires a non-zero exit and no qemu, tap, netns, tcpdump or softroce left.

import (
	"context"
	"testing"

	"github.com/softroce/softroce/test/rxelab"
)

// failProbeSetup starts a guest pingpong server, a tap capture and a softroce pingpong
// server in the lab netns, none of which will finish on its own.
func failProbeSetup(t *testing.T, lab *rxelab.Lab) {
	bin := buildSoftroce(t)
	ctx := context.Background()
	if _, err := lab.ExecBG(ctx, "exec ibv_rc_pingpong -d "+rxelab.GuestDev+" -g 1 -p 18600", rxelab.ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	_ = ppStartCapture(t, lab)
	cmd := lab.NSCommand(ctx, bin, "pingpong", "rc", "-d", hostIP.String(), "-p", "18601", "--timeout", "10m")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Logf("started: guest ibv_rc_pingpong, tcpdump, softroce pid %d", cmd.Process.Pid)
}

// TestFailProbeFatal fails on purpose with everything running.
func TestFailProbeFatal(t *testing.T) {
	failProbeSetup(t, rxelab.Current)
	t.Fatal("failprobe: an injected failure")
}

// TestFailProbeHang blocks until the test binary's -timeout panic.
func TestFailProbeHang(t *testing.T) {
	failProbeSetup(t, rxelab.Current)
	t.Log("failprobe: hanging until the test timeout")
	select {}
}
