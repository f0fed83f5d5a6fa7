package layout

import (
	"os"
	"os/exec"
	"testing"
)

// portable are the packages that build and vet on any system Go supports: the wire format,
// the engine and the link seam with its in-memory and fault-injecting links. The others use
// Linux interfaces (batched and GSO/GRO sockets, AF_XDP, netlink, memfd, eventfd, peer
// credentials) and are Linux-only (DEVELOPERS.md "Platforms").
var portable = []string{
	"pkg/bth/...",
	"internal/clock",
	"internal/cc",
	"internal/event",
	"internal/mr",
	"internal/cq",
	"internal/gid",
	"internal/testcap",
	"pkg/link",
	"pkg/link/mem",
	"pkg/link/fault",
	"internal/qp",
	"internal/cm",
}

// TestPortable vets the portable packages, tests included, for other systems.
func TestPortable(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-compiles for three systems")
	}
	args := []string{"vet"}
	for _, p := range portable {
		args = append(args, "./"+p)
	}
	for _, goos := range []string{"darwin", "windows", "freebsd"} {
		cmd := exec.Command("go", args...)
		cmd.Dir = "../.."
		cmd.Env = append(os.Environ(), "GOOS="+goos, "GOARCH=amd64", "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("GOOS=%s go vet: %v\n%s", goos, err, out)
		}
	}
}
