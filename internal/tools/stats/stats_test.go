package stats

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestStatsDemo: the demo moves verified traffic over a lossy link, so its
// counters show recovery (retransmissions, duplicates, out-of-sequence
// requests); the snapshot it writes reads back to the same output.
func TestStatsDemo(t *testing.T) {
	file := filepath.Join(t.TempDir(), "stats.json")
	var out, errb bytes.Buffer
	if rc := Main(context.Background(), []string{"--demo", "--rounds", "6", "--write", file}, &out, &errb); rc != 0 {
		t.Fatalf("rc %d: %s", rc, errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "link softroce0/1 sent_pkts ") || !strings.HasPrefix(lines[1], "link softroce1/1 sent_pkts ") {
		t.Fatalf("output:\n%s", out.String())
	}
	sum := map[string]uint64{}
	for _, l := range lines {
		f := strings.Fields(l)[2:]
		for i := 0; i+1 < len(f); i += 2 {
			v, err := strconv.ParseUint(f[i+1], 10, 64)
			if err != nil {
				t.Fatalf("%q: %v", l, err)
			}
			sum[f[i]] += v
		}
	}
	for _, name := range append(rxeCounterOrder, "retransmitted_pkts", "rcvd_icrc_solved", "rcvd_dropped", "rcvd_gso_split") {
		if _, ok := sum[name]; !ok {
			t.Errorf("counter %s missing", name)
		}
	}
	// 10% loss both ways over 24 messages of up to 64 KiB: recovery happened
	if sum["retransmitted_pkts"] == 0 || sum["duplicate_request"] == 0 || sum["out_of_seq_request"] == 0 || sum["rcvd_dropped"] == 0 {
		t.Errorf("no recovery counted: %v", sum)
	}
	if sum["rdma_sends"] != 6 || sum["rdma_recvs"] != 6 || sum["retry_exceeded_err"] != 0 {
		t.Errorf("rdma_sends %d rdma_recvs %d retry_exceeded_err %d, want 6 6 0", sum["rdma_sends"], sum["rdma_recvs"], sum["retry_exceeded_err"])
	}
	var again bytes.Buffer
	if rc := Main(context.Background(), []string{file}, &again, &errb); rc != 0 {
		t.Fatalf("stats FILE: rc %d: %s", rc, errb.String())
	}
	if again.String() != out.String() {
		t.Fatalf("read back:\n%s\nwant:\n%s", again.String(), out.String())
	}
}

func TestStatsBadInput(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"device":"x"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	for _, args := range [][]string{{}, {bad}, {filepath.Join(dir, "none.json")},
		{"--demo", "--faults", "drop=2"}, {"--demo", "x.json"}, {"--demo", "-rounds", "6"}, {"--daemon", "s", "--demo"}} {
		if rc := Main(context.Background(), args, &out, &errb); rc == 0 {
			t.Errorf("%v: rc 0", args)
		}
	}
}
