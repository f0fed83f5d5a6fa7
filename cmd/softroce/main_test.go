package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestNoSourceTree: the shipped binary depends on no package of the source tree's test side
// (test/...: the lab, the conformance agent's build) and none of its packages finds files
// through its own source path (runtime.Caller), so an installed binary runs anywhere.
func TestNoSourceTree(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "list", "-deps", "-f", "{{.ImportPath}} {{.Dir}} {{join .GoFiles \" \"}}",
		"github.com/softroce/softroce/cmd/softroce").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || !strings.HasPrefix(f[0], "github.com/softroce/softroce/") {
			continue
		}
		n++
		if strings.HasPrefix(f[0], "github.com/softroce/softroce/test/") {
			t.Errorf("the binary depends on %s", f[0])
		}
		for _, name := range f[2:] {
			b, err := os.ReadFile(filepath.Join(f[1], name))
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Contains(b, []byte("runtime.Caller(")) {
				t.Errorf("%s/%s locates files by its source path (runtime.Caller)", f[0], name)
			}
		}
	}
	if n < 10 {
		t.Fatalf("go list found %d of the module's packages:\n%s", n, out)
	}
}

// TestInstalledBinary builds softroce, copies it into a directory outside the source tree
// and runs it from there: `conform --dut softroce` passes its scenarios, `--list` lists them,
// and `--dut rxe` is refused with the name of the source tree's driver.
func TestInstalledBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	build := filepath.Join(t.TempDir(), "softroce")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", build, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dir := t.TempDir() // the installed copy, its working directory
	bin := filepath.Join(dir, "softroce")
	b, err := os.ReadFile(build)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if wd, _ := os.Getwd(); strings.HasPrefix(dir, filepath.Dir(filepath.Dir(wd))) {
		t.Fatalf("the temporary directory %s is inside the source tree %s", dir, wd)
	}
	run := func(args ...string) (int, string, string) {
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Dir = dir
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + dir}
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		st := 0
		if ee, ok := err.(*exec.ExitError); ok {
			st = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return st, o.String(), e.String()
	}
	if st, out, errs := run("conform", "--dut", "softroce", "--run", "^(rc-send-only-ack|hdr-bad-icrc)$"); st != 0 || !strings.Contains(out, "2 scenarios: 2 pass") {
		t.Errorf("conform --dut softroce: exit %d\n%s%s", st, out, errs)
	}
	if st, out, _ := run("conform", "--list"); st != 0 || strings.Count(out, "\n") < 100 {
		t.Errorf("conform --list: exit %d, %d lines", st, strings.Count(out, "\n"))
	}
	if st, _, errs := run("conform", "--dut", "rxe"); st != 2 || !strings.Contains(errs, "test/conform/cmd/conform-rxe") {
		t.Errorf("conform --dut rxe: exit %d: %s", st, errs)
	}
}

// TestDispatch: every tool is reachable by its name, once; unknown names and no name are
// usage errors.
func TestDispatch(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range commands {
		if seen[c.Name] || c.Main == nil || c.Summary == "" {
			t.Errorf("command %q: duplicate, or no Main or summary", c.Name)
		}
		seen[c.Name] = true
		// the rdma_cm tools print their usage for an option they lack, -h too, with the C
		// tools' statuses (rping: EINVAL; ucmatose, udaddy: 1)
		want := map[string]int{"rping": 22, "ucmatose": 1, "udaddy": 1}[c.Name]
		var o, e bytes.Buffer
		if st := run([]string{c.Name, "--help"}, &o, &e); st != want || o.Len() == 0 {
			t.Errorf("%s --help: exit %d, stdout %q, stderr %q", c.Name, st, o.String(), e.String())
		}
	}
	for _, name := range []string{"conform", "daemon", "decode", "demo", "devinfo", "perf", "pingpong", "rping", "stats", "ucmatose", "udaddy"} {
		if !seen[name] {
			t.Errorf("no command %s", name)
		}
	}
	var o, e bytes.Buffer
	if st := run(nil, &o, &e); st != 2 || !strings.Contains(o.String(), "pingpong") {
		t.Errorf("no arguments: exit %d\n%s", st, o.String())
	}
	if st := run([]string{"nosuch"}, &o, &e); st != 2 || !strings.Contains(e.String(), `unknown command "nosuch"`) {
		t.Errorf("unknown command: exit %d: %s", st, e.String())
	}
}
