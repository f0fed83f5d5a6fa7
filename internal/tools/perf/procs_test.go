package perf

import "testing"

// TestPerfProcs: a two-process perf run uses one P unless --procs or the GOMAXPROCS environment
// variable says otherwise (--procs 0: Go's default, left alone).
func TestPerfProcs(t *testing.T) {
	for _, tc := range []struct {
		flag int
		env  string
		want int
	}{
		{-1, "", 1},  // default: one P, like perftest's one thread
		{-1, "4", 0}, // the environment decides
		{2, "", 2},
		{2, "4", 2}, // --procs wins
		{0, "", 0},
	} {
		if got := perfProcs(tc.flag, tc.env); got != tc.want {
			t.Errorf("perfProcs(%d, %q) = %d, want %d", tc.flag, tc.env, got, tc.want)
		}
	}
	c, err := parsePerf([]string{"write", "--procs", "3"}, nil)
	if err != nil || c.Procs != 3 {
		t.Fatalf("--procs 3: %v, Procs %d", err, c.Procs)
	}
	if c, err = parsePerf([]string{"write"}, nil); err != nil || c.Procs != -1 {
		t.Fatalf("no --procs: %v, Procs %d", err, c.Procs)
	}
}
