package stats

import (
	"bytes"
	"context"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	"github.com/softroce/softroce/internal/daemontest"
	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/roce"
)

// TestStatsDaemon: `softroce stats --daemon SOCKET` prints the daemon device's live counters,
// with rdma's -p (one per line) and -j (JSON, one snapshot per line) grouped as getopt does.
func TestStatsDaemon(t *testing.T) {
	l, err := mem.NewNetwork(mem.Options{}).Attach(netip.MustParseAddr("10.7.0.3"))
	if err != nil {
		t.Fatal(err)
	}
	dev, err := roce.Open(roce.Options{Link: l, Name: "softrocestats"})
	if err != nil {
		t.Fatal(err)
	}
	sock, _ := daemontest.Serve(t, dev)
	var out, errb bytes.Buffer
	if rc := Main(context.Background(), []string{"--daemon", sock, "-p"}, &out, &errb); rc != 0 {
		t.Fatalf("exit %d: %s", rc, errb.String())
	}
	if !strings.HasPrefix(out.String(), "link softrocestats/1\n") || !strings.Contains(out.String(), "sent_pkts") ||
		!strings.Contains(out.String(), "daemon_refused_qps") {
		t.Fatalf("stats --daemon:\n%s", out.String())
	}
	out.Reset()
	if rc := Main(context.Background(), []string{"-pj", "--daemon=" + sock, "--count=2", "--interval", "1ms"}, &out, &errb); rc != 0 {
		t.Fatalf("exit %d: %s", rc, errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("--count=2 printed %d lines:\n%s", len(lines), out.String())
	}
	for _, l := range lines {
		var s Snapshot
		if err := json.Unmarshal([]byte(l), &s); err != nil || s.Device != "softrocestats" {
			t.Fatalf("%q: %v", l, err)
		}
	}
}

// TestStatsArgs: the command line is GNU getopt style (grouped short options, attached values,
// --name=value, unambiguous abbreviations of long names, operands anywhere); the single-dash
// long options of Go's flag package are not options.
func TestStatsArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want Config
	}{
		{[]string{"-pj", "f.json"}, Config{File: "f.json", Pretty: true, JSON: true}},
		{[]string{"f.json", "-p"}, Config{File: "f.json", Pretty: true}},
		{[]string{"--demo", "--rounds=6", "--seed", "7"}, Config{Demo: true, Rounds: 6, Seed: 7}},
		{[]string{"--demo", "--roun", "6", "--wr=x"}, Config{Demo: true, Rounds: 6, Seed: 1, Write: "x"}},
		{[]string{"--daemon", "s", "--count", "0"}, Config{Daemon: "s", Rounds: 100, Seed: 1}},
		{[]string{"--", "-p"}, Config{File: "-p", Rounds: 100, Seed: 1}},
	} {
		c, err := ParseArgs(tc.args)
		if err != nil {
			t.Errorf("%q: %v", tc.args, err)
			continue
		}
		if c.File != tc.want.File || c.Pretty != tc.want.Pretty || c.JSON != tc.want.JSON || c.Demo != tc.want.Demo ||
			(tc.want.Rounds != 0 && c.Rounds != tc.want.Rounds) || (tc.want.Seed != 0 && c.Seed != tc.want.Seed) ||
			c.Write != tc.want.Write || c.Daemon != tc.want.Daemon {
			t.Errorf("%q: %+v, want %+v", tc.args, c, tc.want)
		}
	}
	for _, args := range [][]string{{"-rounds", "6", "--demo"}, {"--d", "x"}, {"-x", "f"}, {"--demo", "--rounds"}, {"a", "b"}} {
		if _, err := ParseArgs(args); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
}
