package main

import (
	"bytes"
	"io"
	"net/netip"
	"strings"
	"testing"
)

// TestPerfPolledMode: --lat --busy-poll runs the embedded device in polled mode (not for
// bandwidth tests, --portable, --daemon, -R or --loopback), openLocalDevice opens it so, and
// every latency test completes in it softroce <-> softroce with perftest's output.
func TestPerfPolledMode(t *testing.T) {
	for _, c := range []struct {
		args []string
		want bool
	}{
		{[]string{"write", "--lat", "--busy-poll"}, true},
		{[]string{"send", "--lat", "--busy-poll"}, true},
		{[]string{"write", "--lat"}, false},
		{[]string{"write", "--busy-poll"}, false},
		{[]string{"write", "--lat", "--busy-poll", "--portable"}, false},
		{[]string{"write", "--lat", "--busy-poll", "--daemon", "/tmp/x.sock"}, false},
	} {
		pc, err := parsePerf(c.args, io.Discard)
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if got := pc.polled(); got != c.want {
			t.Errorf("%v: polled %v, want %v", c.args, got, c.want)
		}
	}
	f := devFlag{Addr: netip.MustParseAddr("127.0.0.1")}
	ld, err := openLocalDevice(&f, devOpenOptions{Port: freeUDPPort(t), Polled: true})
	if err != nil {
		t.Fatal(err)
	}
	if !ld.Dev.Polled() {
		t.Error("openLocalDevice with Polled: the device has a receive goroutine")
	}
	ld.Dev.Close()

	for _, args := range [][]string{
		{"write", "--lat", "--busy-poll", "-s", "8", "-n", "300"},
		{"write", "--lat", "--busy-poll", "-s", "3000", "-n", "100", "-m", "1024"},
		{"send", "--lat", "--busy-poll", "-s", "8", "-n", "200"},
		{"read", "--lat", "--busy-poll", "-s", "64", "-n", "100"},
		{"atomic", "--lat", "--busy-poll", "-n", "100"},
		{"send", "--lat", "--busy-poll", "-a", "-n", "5"},
	} {
		t.Run(strings.Join(args, "_"), func(t *testing.T) {
			cfg, err := parsePerf(args, new(bytes.Buffer))
			if err != nil {
				t.Fatal(err)
			}
			_, _, so, co := perfPairInProcess(t, args...)
			sizes := []int{cfg.Size}
			if cfg.All {
				sizes = perfSizes(cfg)
			}
			checkPerfPair(t, so, co, cfg.Test, sizes, cfg.Iters, 1, cfg.Gbits)
			if t.Failed() {
				t.Logf("server:\n%s\nclient:\n%s", so, co)
			}
		})
	}
}
