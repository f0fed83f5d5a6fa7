package clib

import (
	"strings"
	"testing"
	"time"
)

// TestRdmacmTools runs rdmacm-utils' rping, ucmatose and udaddy, unmodified, between two
// softroce daemons: rping verifies its ping data (-V) for every iteration; ucmatose and
// udaddy exchange their messages over connected RC and UD (SIDR) endpoints and say so.
func TestRdmacmTools(t *testing.T) {
	needMem(t)
	a := startDaemon(t)
	b := startDaemon(t)
	srv := a.addr.String()
	for _, tc := range []struct {
		name         string
		prog         string
		server, clnt []string
		want         string
	}{
		{"rping", "rping", []string{"-s", "-a", srv, "-C", "20", "-V", "-S", "64"},
			[]string{"-c", "-a", srv, "-C", "20", "-V", "-S", "64"}, ""},
		{"ucmatose", "ucmatose", []string{"-b", srv, "-c", "2", "-C", "10"},
			[]string{"-s", srv, "-c", "2", "-C", "10"}, "test complete"},
		{"udaddy", "udaddy", []string{"-b", srv, "-c", "2", "-C", "10"},
			[]string{"-s", srv, "-c", "2", "-C", "10"}, "test complete"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sout, cout := pairCM(t, tool{name: tc.prog, args: tc.server, d: a},
				tool{name: tc.prog, args: tc.clnt, d: b}, 60*time.Second)
			if tc.want != "" && (!strings.Contains(sout, tc.want) || !strings.Contains(cout, tc.want)) {
				t.Errorf("no %q:\n--- server:\n%s--- client:\n%s", tc.want, sout, cout)
			}
		})
	}
}
