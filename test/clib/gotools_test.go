package clib

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestGoTools pairs rdma-core's programs, through the libraries, with softroce's own Go tools
// (softroce pingpong, perf, rping through the other daemon, --daemon), in both roles: the
// same wire and out-of-band exchanges, so each side must finish and print its results.
func TestGoTools(t *testing.T) {
	needMem(t)
	a := startDaemon(t)
	b := startDaemon(t)
	srv := a.addr.String()
	for _, tc := range []struct {
		name      string
		c, gotool []string
		cm        bool
		want      *regexp.Regexp // in both outputs
	}{
		{name: "pingpong-rc", c: []string{"ibv_rc_pingpong", "-g", "1", "-s", "4096", "-n", "100", "-c"},
			gotool: []string{"pingpong", "rc", "-s", "4096", "-n", "100", "-c"},
			want:   regexp.MustCompile(`(?m)^100 iters in [0-9.]+ seconds`)},
		{name: "pingpong-ud-e", c: []string{"ibv_ud_pingpong", "-g", "1", "-s", "512", "-n", "100", "-c", "-e"},
			gotool: []string{"pingpong", "ud", "-s", "512", "-n", "100", "-c", "-e"},
			want:   regexp.MustCompile(`(?m)^100 iters in [0-9.]+ seconds`)},
		{name: "write_bw", c: []string{"ib_write_bw", "-d", "softroce0", "-x", "1", "-F", "-s", "4096", "-n", "200"},
			gotool: []string{"perf", "write", "-F", "-s", "4096", "-n", "200"},
			want:   regexp.MustCompile(`(?m)^\s*4096\s+200\s+[0-9.]+`)},
		{name: "write_bw-R", c: []string{"ib_write_bw", "-d", "softroce0", "-x", "1", "-F", "-s", "4096", "-n", "200", "-R"},
			gotool: []string{"perf", "write", "-F", "-s", "4096", "-n", "200", "-R"}, cm: true},
		{name: "send_lat", c: []string{"ib_send_lat", "-d", "softroce0", "-x", "1", "-F", "-s", "8", "-n", "200"},
			gotool: []string{"perf", "send", "--lat", "-F", "-s", "8", "-n", "200"},
			want:   regexp.MustCompile(`(?m)^\s*8\s+200\s+[0-9.]+`)},
	} {
		for _, cServes := range []bool{true, false} {
			name := tc.name + "-go-client"
			if !cServes {
				name = tc.name + "-c-client"
			}
			t.Run(name, func(t *testing.T) {
				port := freePort(t)
				pp := []string{"-p", strconv.Itoa(port)}
				cArgs := append(append([]string{}, tc.c[1:]...), pp...)
				gArgs := append(append([]string{}, tc.gotool...), pp...)
				var server, client tool
				if cServes {
					server = tool{name: tc.c[0], args: cArgs, d: a}
					client = tool{name: softroceBin, args: append(append(gArgs, "--daemon", b.sock), srv), d: b}
				} else {
					server = tool{name: softroceBin, args: append(gArgs, "--daemon", a.sock), d: a}
					client = tool{name: tc.c[0], args: append(cArgs, srv), d: b}
				}
				var sout, cout string
				if tc.cm {
					sout, cout = pairCM(t, server, client, 60*time.Second)
				} else {
					sout, cout = pair(t, server, client, port, 60*time.Second)
				}
				if tc.want != nil && !tc.want.MatchString(cout) {
					t.Errorf("client: no result %q:\n%s", tc.want, cout)
				}
				if strings.Contains(sout+cout, "invalid data") {
					t.Errorf("invalid data:\n--- server:\n%s--- client:\n%s", sout, cout)
				}
			})
		}
	}
}

// TestGoRping pairs rdmacm-utils' rping with softroce rping, both roles, data verified.
func TestGoRping(t *testing.T) {
	needMem(t)
	a := startDaemon(t)
	b := startDaemon(t)
	srv := a.addr.String()
	for _, cServes := range []bool{true, false} {
		name := "c-server"
		if !cServes {
			name = "go-server"
		}
		t.Run(name, func(t *testing.T) {
			var server, client tool
			if cServes {
				server = tool{name: "rping", args: []string{"-s", "-a", srv, "-S", "64", "-v"}, d: a}
				client = tool{name: softroceBin, args: []string{"rping", "-c", "-a", srv, "-C", "10", "-S", "64", "-V", "-v", "--daemon", b.sock}, d: b}
			} else {
				server = tool{name: softroceBin, args: []string{"rping", "-s", "-a", srv, "-S", "64", "-v", "--daemon", a.sock}, d: a}
				client = tool{name: "rping", args: []string{"-c", "-a", srv, "-C", "10", "-S", "64", "-V", "-v"}, d: b}
			}
			_, cout := pairCM(t, server, client, 60*time.Second)
			if n := strings.Count(cout, "ping data: "); n != 10 {
				t.Errorf("client printed %d pings, want 10:\n%s", n, cout)
			}
		})
	}
}
