package clib

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestPingpong runs rdma-core's ibv_rc/uc/ud/srq_pingpong, unmodified, between two
// softroce daemons (two loopback addresses): the server on one, the client on the other,
// with -g 1 (the IPv4 GID) and -c (each side checks every received buffer), polling and with
// -e (waiting on the completion channel). Both sides must finish every iteration.
func TestPingpong(t *testing.T) {
	needMem(t)
	a := startDaemon(t)
	b := startDaemon(t)
	for _, tc := range []struct {
		tool   string
		size   int
		events bool
	}{
		{"rc", 4096, false}, {"rc", 4096, true}, {"rc", 1, false},
		{"uc", 4096, false}, {"uc", 1024, true},
		{"ud", 1024, false}, {"ud", 512, true},
		{"srq", 4096, false}, {"srq", 1024, true},
	} {
		name := fmt.Sprintf("%s-%d", tc.tool, tc.size)
		if tc.events {
			name += "-e"
		}
		t.Run(name, func(t *testing.T) {
			const iters = 200
			port := freePort(t)
			args := []string{"-g", "1", "-c", "-p", strconv.Itoa(port), "-s", strconv.Itoa(tc.size), "-n", strconv.Itoa(iters)}
			if tc.events {
				args = append(args, "-e")
			}
			prog := "ibv_" + tc.tool + "_pingpong"
			sout, cout := pair(t,
				tool{name: prog, args: args, d: a},
				tool{name: prog, args: append(append([]string{}, args...), a.addr.String()), d: b},
				port, 60*time.Second)
			for side, out := range map[string]string{"server": sout, "client": cout} {
				if strings.Contains(out, "invalid data") {
					t.Errorf("%s: received data does not match:\n%s", side, out)
				}
				want := fmt.Sprintf(`%d bytes in [0-9.]+ seconds = [0-9.]+ Mbit/sec`, iters*tc.size*2)
				if !regexp.MustCompile(want).MatchString(out) {
					t.Errorf("%s: no result line for %d iterations:\n%s", side, iters, out)
				}
				if !regexp.MustCompile(fmt.Sprintf(`%d iters in`, iters)).MatchString(out) {
					t.Errorf("%s: not %d iterations:\n%s", side, iters, out)
				}
			}
			// Each side prints its own address and the peer's: the peer's GID is the
			// other daemon's IPv4 GID.
			if !strings.Contains(cout, "::ffff:"+a.addr.String()) || !strings.Contains(sout, "::ffff:"+b.addr.String()) {
				t.Errorf("GIDs:\n--- server:\n%s--- client:\n%s", sout, cout)
			}
		})
	}
}
