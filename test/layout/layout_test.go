package layout

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/softroce/softroce/"

// layers ranks the module's packages, lowest first: a package imports only packages of a
// lower rank (its tests may import anything). An entry ending in "/" covers the packages
// below that path; the longest match wins. A package the table does not cover fails the
// test: place it, here and in DEVELOPERS.md.
var layers = []struct {
	path string
	rank int
}{
	// the wire format: the standard library only
	{"pkg/bth", 0},
	// leaves: nothing of softroce but pkg/bth
	{"pkg/bth/layer", 1},
	{"internal/clock", 1},
	{"internal/cc", 1},
	{"internal/event", 1},
	{"internal/gid", 1},
	{"internal/mr", 1},
	{"internal/oob", 1},
	{"internal/daemon/proto/wire", 1},
	{"internal/netnstest", 1},
	{"internal/testcap", 1},
	{"test/rxelab", 1},
	{"bench/internal/", 1}, // the benchmarks' shared helpers: the standard library only
	// the I/O seam (pkg/link imports nothing of softroce but pkg/bth), completion queues
	{"pkg/link", 2},
	{"internal/cq", 2},
	{"internal/oob/", 2},
	{"internal/rocetest", 2},
	// the link implementations (mem, udp, fault, their shared test suite); the QP engine,
	// which sees links only through the seam
	{"pkg/link/internal/race", 1},
	{"pkg/link/", 3},
	{"internal/qp", 3},
	// the AF_XDP path (over a link/udp socket); the IB CM on QP1
	{"pkg/link/afxdp", 4},
	{"internal/cm", 4},
	// the device and the Verbs API
	{"pkg/roce", 5},
	// on top of the device: rdma_cm, the conformance bench
	{"pkg/rdmacm", 6},
	{"pkg/conform", 6},
	// the daemon: its protocol, the server, the client
	{"internal/daemon/proto", 7},
	{"internal/daemon", 8},
	{"pkg/client", 8},
	// fixtures over the daemon, the tools' shared flags
	{"internal/daemontest", 9},
	{"internal/tools/cli", 9},
	{"internal/tools/tooltest", 9},
	{"internal/tools/demo", 10}, // stats runs the demo's endpoints
	{"test/conform", 9},
	// the tools, the binary, benchmarks and whole-system tests
	{"internal/tools/", 11},
	{"cmd/", 12},
	{"bench/", 12},
	{"test/", 12},
}

// rank returns the layer of a module-relative package path, or -1.
func rank(p string) int {
	best, r := -1, -1
	for _, l := range layers {
		var ok bool
		if strings.HasSuffix(l.path, "/") {
			ok = strings.HasPrefix(p, l.path)
		} else {
			ok = p == l.path
		}
		if ok && len(l.path) > best {
			best, r = len(l.path), l.rank
		}
	}
	return r
}

type listed struct {
	ImportPath string
	Imports    []string
	Deps       []string
	Standard   bool
}

// goList runs go list -json with args and decodes its packages.
func goList(t *testing.T, args ...string) []listed {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-json"}, args...)...)
	out, err := cmd.Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list %v: %v\n%s", args, err, ee.Stderr)
		}
		t.Fatalf("go list %v: %v", args, err)
	}
	var ps []listed
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p listed
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	return ps
}

// TestImportGraph: no package imports a package of its own or a higher layer.
func TestImportGraph(t *testing.T) {
	ps := goList(t, "-tags", "interop", module+"...")
	if len(ps) < 20 {
		t.Fatalf("go list found %d packages", len(ps))
	}
	for _, p := range ps {
		name, _, _ := strings.Cut(strings.TrimPrefix(p.ImportPath, module), " ")
		r := rank(name)
		if r < 0 {
			t.Errorf("%s has no layer: place it in layout_test.go and DEVELOPERS.md", name)
			continue
		}
		for _, imp := range p.Imports {
			imp, _, _ = strings.Cut(imp, " ") // "path [main]": a variant built for a PGO main package
			if !strings.HasPrefix(imp, module) {
				continue
			}
			dep := strings.TrimPrefix(imp, module)
			if dr := rank(dep); dr >= r {
				t.Errorf("%s (layer %d) imports %s (layer %d)", name, r, dep, dr)
			}
		}
	}
}

// TestBTHStandardLibraryOnly: pkg/bth, the wire format every other package builds on,
// depends on the standard library only (go list -deps), so it can be vendored or used alone.
func TestBTHStandardLibraryOnly(t *testing.T) {
	ps := goList(t, "-deps", module+"pkg/bth")
	var bad []string
	for _, p := range ps {
		if !p.Standard && p.ImportPath != module+"pkg/bth" {
			bad = append(bad, p.ImportPath)
		}
	}
	sort.Strings(bad)
	if len(bad) > 0 {
		t.Fatalf("pkg/bth depends on %v", bad)
	}
}

// TestLinkSeam: pkg/link, the interface between the engine and the I/O paths, imports
// nothing of softroce but pkg/bth; the engine (internal/qp) sees links only through it.
func TestLinkSeam(t *testing.T) {
	for _, p := range goList(t, module+"pkg/link", module+"internal/qp") {
		name := strings.TrimPrefix(p.ImportPath, module)
		for _, imp := range p.Imports {
			imp, _, _ = strings.Cut(imp, " ")
			dep, ok := strings.CutPrefix(imp, module)
			if !ok {
				continue
			}
			switch {
			case name == "pkg/link" && dep != "pkg/bth":
				t.Errorf("pkg/link imports %s", dep)
			case name == "internal/qp" && (dep == "pkg/roce" || strings.HasPrefix(dep, "pkg/link/")):
				t.Errorf("internal/qp imports %s", dep)
			}
		}
	}
}
