//go:build interop

package interop

import "testing"

// TestLastACKRaceRule: lastACKRace excuses exactly one side's RETRY_EXC_ERR on its last SEND
// when the peer completed every iteration, and nothing else.
func TestLastACKRaceRule(t *testing.T) {
	c := nmCase{Name: "x", LastACKRace: "300 iters in"}
	const done = "1800000 bytes in 4.44 seconds = 3.25 Mbit/sec\n300 iters in 4.44 seconds = 14785.67 usec/iter\n"
	fail := "pingpong: " + retryExcLast + "\n"
	for _, tc := range []struct {
		name string
		r    pairResult
		c    nmCase
		want string
	}{
		{"softroce's last ACK lost", pairResult{OurStatus: 1, OurErr: fail, GuestOut: done}, c, "softroce"},
		{"guest's last ACK lost", pairResult{GuestStatus: 1, GuestOut: fail, OurOut: done}, c, "guest"},
		{"both passed", pairResult{OurOut: done, GuestOut: done}, c, ""},
		{"both failed", pairResult{OurStatus: 1, OurErr: fail, GuestStatus: 1, GuestOut: fail}, c, ""},
		{"peer did not finish", pairResult{OurStatus: 1, OurErr: fail, GuestOut: "299 iters in 4 seconds\n"}, c, ""},
		{"another failure", pairResult{OurStatus: 1, OurErr: "pingpong: Failed status remote access error (10) for wr_id 2\n", GuestOut: done}, c, ""},
		{"a receive failed", pairResult{OurStatus: 1, OurErr: "pingpong: Failed status transport retry counter exceeded (12) for wr_id 1\n", GuestOut: done}, c, ""},
		{"two failures", pairResult{OurStatus: 1, OurErr: fail + "pingpong: Failed status work request flushed error (5) for wr_id 1\n", GuestOut: done}, c, ""},
		{"bad data at the peer", pairResult{OurStatus: 1, OurErr: fail, GuestOut: done + "invalid data\n"}, c, ""},
		{"not a pingpong case", pairResult{OurStatus: 1, OurErr: fail, GuestOut: done}, nmCase{Name: "y"}, ""},
	} {
		if got := lastACKRace(t, tc.c, tc.r); got != tc.want {
			t.Errorf("%s: excused %q, want %q", tc.name, got, tc.want)
		}
	}
}
