//go:build interop

package interop

// The memory placement peer built against Debian 13's rdma-core 56 (placement.c with
// ibv_wr_flush: placementFlushPeer's build), run as that build is on softroce's side, through
// the drop-in libraries (clib/) and a softroce daemon started with --rxe-flush-icrc, as the
// client of the rdma-core 44 peer serving its region on kernel rxe (placementReady):
//
//   - placement-lib softroce->rxe: the client's WRITE, FLUSHes at both selectivity levels,
//     ATOMIC WRITEs and READs all complete successfully (the FLUSHes as IBV_WC_FLUSH), the
//     region rxe's server prints is byte for byte what they placed, and on the wire every
//     FLUSH the daemon sent carries kernel rxe's ICRC (rxe drops one with the A17.3.3 ICRC,
//     and the client would end in IBV_WC_RETRY_EXC_ERR).
//
// Like the other placement pairings it skips unless rxe0 has ATOMIC WRITE and FLUSH (run with
// RXE_LAB_TARGET=6.12).

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/softroce/softroce/pkg/bth"
	conformlab "github.com/softroce/softroce/test/conform"
	"github.com/softroce/softroce/test/rxelab"
)

func init() {
	pairings = append(pairings, pairing{Name: "placement-lib", Direction: SoftroceToRxe, Run: placementLibToRxe})
}

func placementLibToRxe(t *testing.T, lab *rxelab.Lab) {
	server := placementReady(t, lab) // (skips without the operations)
	placementFlushPeer(t)            // builds the rdma-core 56 client into the lab share
	client := filepath.Join(conformlab.ShareDir(), plTrixieRoot, "placement")
	lib := buildLibs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	sock := startLabDaemon(t, ctx, lab, buildSoftroce(t), netV4, "--rxe-flush-icrc")
	stopCapture := plStartCapture(t, lab)
	g := plStartPeer(t, lab, server, "", "placement: listening")
	// the daemon's GID 1 is ::ffff:198.18.0.1 (0 is the tap's link-local one)
	cmd := lab.NSCommand(ctx, "stdbuf", "-oL", client, "-d", libDev, "-g", "1", "-p", strconv.Itoa(plPort), rxelab.GuestIP)
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+lib, "SOFTROCE_SOCKET="+sock)
	out, err := cmd.CombinedOutput()
	t.Logf("softroce's client (rdma-core 56 build, drop-in libraries):\n%s", out)
	if err != nil {
		var ee *exec.ExitError
		if ctx.Err() != nil || !errors.As(err, &ee) {
			t.Fatalf("client: %v", err)
		}
		t.Errorf("client exit: %v", err)
	}
	plCheckClient(t, "client", string(out))
	if got, err := plRegionOf(plWaitPeer(t, g)); err != nil {
		t.Error(err)
	} else {
		plCompare(t, "rxe's region", got, plClientImage())
	}
	wire, lost := stopCapture()
	plCheckWire(t, wire, lost, hostIP, []bth.Opcode{bth.OpRCWriteOnly, bth.OpRCFlush, bth.OpRCAtomicWrite, bth.OpRCAtomicWrite,
		bth.OpRCReadRequest, bth.OpRCAtomicWrite, bth.OpRCReadRequest, bth.OpRCFlush}, false)
}
