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

// TestDemoArgs: the command line in GNU getopt style.
func TestDemoArgs(t *testing.T) {
	c, err := ParseArgs([]string{"--mem", "-m1024", "-b", "8388608", "--port=14791"})
	if err != nil || !c.Mem || c.MTU.Bytes() != 1024 || c.Bytes != 8388608 || c.Port != 14791 {
		t.Errorf("%+v %v", c, err)
	}
	if c, err = ParseArgs([]string{"--portab", "--by", "1024"}); err != nil || !c.Portable || c.Bytes != 1024 {
		t.Errorf("abbreviations: %+v %v", c, err)
	}
	for _, args := range [][]string{{"-mem"}, {"-m", "1000"}, {"--bytes", "0"}, {"-p", "0"}, {"extra"}} {
		if _, err := ParseArgs(args); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
}
