//go:build interop

package interop

// rdma-core's own programs — ibverbs-utils' ibv_*_pingpong, perftest, rdmacm-utils' rping,
// ucmatose and udaddy, as Debian ships them — on softroce's side, through the drop-in
// libibverbs.so.1 / librdmacm.so.1 (clib/, docs/clib.md) and a softroce daemon in the lab
// netns, against the same programs on kernel rxe, both directions. Each pairing is the
// softroce CLI's (pingpong_test.go, perftest_test.go, cm_test.go) with the program swapped:
// the same output, exit status and capture checks.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/softroce/softroce/test/rxelab"
)

// ourSide says what runs on softroce's side of a pairing.
type ourSide int

const (
	sideEmbedded ourSide = iota // the softroce CLI, its engine in-process
	sideDaemon                  // the softroce CLI through a softroce daemon (--daemon)
	sideLib                     // the rdma-core program through the drop-in libraries and a daemon
)

// libDev is the daemon's device name, as the programs' -d/--ib-dev take it.
const libDev = "softroce0"

// The TCP ports of the programs' out-of-band exchange (their default -p).
const (
	pingpongPort = 18515 // ibv_*_pingpong
	perftestPort = 18515 // perftest without -R
)

var (
	probeBin   string
	libDir     string
	libDirErr  error
	libDirOnce sync.Once
)

// buildLibs builds the drop-in libraries once per test binary (make libs into a temporary
// directory) and returns their directory.
func buildLibs(t *testing.T) string {
	t.Helper()
	libDirOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(file), "..", "..")
		dir, err := os.MkdirTemp("", "softroce-interop-clib-")
		if err != nil {
			libDirErr = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "make", "-s", "-C", filepath.Join(root, "clib"), "libs", "probe", "BUILD="+dir).CombinedOutput()
		if err != nil {
			libDirErr = fmt.Errorf("make libs: %v\n%s", err, out)
			return
		}
		libDir = filepath.Join(dir, "lib")
		probeBin = filepath.Join(dir, "probe")
	})
	if libDirErr != nil {
		t.Fatal(libDirErr)
	}
	return libDir
}

// libSpec makes spec run prog with args on softroce's side through the drop-in libraries: a
// softroce daemon on the host address in the lab netns, the program in the lab netns (its
// out-of-band TCP exchange reaches the guest from there) with LD_LIBRARY_PATH naming the
// libraries and SOFTROCE_SOCKET the daemon, its stdout line-buffered (stdbuf) so that its
// readiness line is seen while it runs.
func libSpec(t *testing.T, ctx context.Context, lab *rxelab.Lab, softroce string, spec *pairSpec, prog string, args []string) {
	t.Helper()
	lib := buildLibs(t)
	sock := startLabDaemon(t, ctx, lab, softroce, netV4)
	// clib/tests/probe.c: skip, saying why, while the daemon cannot serve the libraries
	// (another protocol version, or no access to a program's memory)
	probe := exec.CommandContext(ctx, probeBin)
	probe.Env = append(os.Environ(), "SOFTROCE_SOCKET="+sock)
	if out, err := probe.CombinedOutput(); err != nil {
		t.Skipf("the lab's softroce daemon cannot serve the drop-in libraries yet: %v: %s", err, out)
	}
	spec.Bin = "stdbuf"
	spec.Ours = append([]string{"-oL", prog}, args...)
	spec.Env = []string{"LD_LIBRARY_PATH=" + lib, "SOFTROCE_SOCKET=" + sock}
	spec.libSocket = sock
	spec.HostNetns = false
}

func init() {
	for _, c := range []ppCase{
		{Tool: "rc", Size: 3000, Iters: 20, Lib: true}, {Tool: "rc", Size: 64, Iters: 20, Events: true, Lib: true},
		{Tool: "uc", Size: 3000, Iters: 20, Events: true, Lib: true},
		{Tool: "ud", Size: 512, Iters: 20, Lib: true},
		{Tool: "srq", Size: 3000, Iters: 32, Events: true, Lib: true},
	} {
		c := c
		pairings = append(pairings,
			pairing{Name: c.name(), Direction: SoftroceToRxe, Run: func(t *testing.T, lab *rxelab.Lab) { ppInterop(t, lab, c, true) }},
			pairing{Name: c.name(), Direction: RxeToSoftroce, Run: func(t *testing.T, lab *rxelab.Lab) { ppInterop(t, lab, c, false) }},
		)
	}
	var pf []pfCase
	for _, cm := range []bool{false, true} {
		pf = append(pf,
			pfCase{Verb: "write", Size: 3000, Iters: 200, Lib: true, CM: cm},
			pfCase{Verb: "read", Size: 3000, Iters: 200, Lib: true, CM: cm},
			pfCase{Verb: "send", Size: 3000, Iters: 200, Lib: true, CM: cm},
			pfCase{Verb: "atomic", Iters: 200, Atomic: "FETCH_AND_ADD", Lib: true, CM: cm},
			pfCase{Verb: "write", Lat: true, Size: 64, Iters: 100, Lib: true, CM: cm},
			pfCase{Verb: "send", Lat: true, Size: 64, Iters: 100, Lib: true, CM: cm},
			pfCase{Verb: "read", Lat: true, Size: 64, Iters: 100, Lib: true, CM: cm},
			pfCase{Verb: "atomic", Lat: true, Iters: 100, Atomic: "FETCH_AND_ADD", Lib: true, CM: cm})
	}
	for _, c := range pf {
		c := c
		pairings = append(pairings,
			pairing{Name: c.name(), Direction: SoftroceToRxe, Run: func(t *testing.T, lab *rxelab.Lab) { pfInterop(t, lab, c, true) }},
			pairing{Name: c.name(), Direction: RxeToSoftroce, Run: func(t *testing.T, lab *rxelab.Lab) { pfInterop(t, lab, c, false) }},
		)
	}
	const size, count = 64, 3
	name := fmt.Sprintf("rping-lib-%dx%d", size, count)
	pairings = append(pairings,
		pairing{Name: name, Direction: SoftroceToRxe, Run: func(t *testing.T, lab *rxelab.Lab) { rpingInterop(t, lab, true, size, count, sideLib, netV4) }},
		pairing{Name: name, Direction: RxeToSoftroce, Run: func(t *testing.T, lab *rxelab.Lab) { rpingInterop(t, lab, false, size, count, sideLib, netV4) }},
	)
}
