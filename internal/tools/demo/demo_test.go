package demo

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestDemoMem runs the demo on the in-memory link: every check must pass
// and the exit status must be 0.
func TestDemoMem(t *testing.T) {
	var out, errb bytes.Buffer
	if rc := Main(context.Background(), []string{"--mem", "--bytes", "8388608", "--mtu", "1024"}, &out, &errb); rc != 0 {
		t.Fatalf("exit %d\n%s%s", rc, out.String(), errb.String())
	}
	for _, want := range []string{"SEND             ok", "RDMA_READ        ok", "ATOMIC_FETCH_ADD ok", "PASS: all 7 checks passed"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestDemoBadFlags(t *testing.T) {
	var out, errb bytes.Buffer
	if rc := Main(context.Background(), []string{"--mtu", "1000"}, &out, &errb); rc != 2 {
		t.Fatalf("exit %d", rc)
	}
}
