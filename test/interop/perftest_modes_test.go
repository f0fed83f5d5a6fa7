//go:build interop

package interop

// softroce perf's perftest modes against perftest 6.06 on kernel rxe, both directions, with
// the command lines a perftest user has: bidirectional (-b: both sides requesters, each
// printing the sum of both reports, which must be the same line), the duration mode (-D:
// as many messages as fit, no peak), and the unreliable transports perftest supports per test
// (-c UC: write and send; -c UD: send). The checks are perftest_test.go's, with the capture's
// transport the test's (UC or UD opcodes only), both sides' requests counted for -b, and
// any message count for -D.

import (
	"testing"

	"github.com/softroce/softroce/test/rxelab"
)

func init() {
	for _, c := range []pfCase{
		{Verb: "write", Size: 3000, Iters: 200, Bidir: true},
		{Verb: "send", Size: 3000, Iters: 200, Bidir: true},
		{Verb: "write", Size: 3000, Iters: 200, Dur: 2},
		{Verb: "send", Size: 3000, Iters: 200, Dur: 2},
		{Verb: "write", Size: 3000, Iters: 200, Conn: "UC"},
		{Verb: "send", Size: 3000, Iters: 200, Conn: "UC"},
		{Verb: "send", Size: 1024, Iters: 200, Conn: "UD"},
		{Verb: "write", Lat: true, Size: 64, Iters: 100, Conn: "UC"},
		{Verb: "send", Lat: true, Size: 512, Iters: 100, Conn: "UD"},
	} {
		c := c
		pairings = append(pairings,
			pairing{Name: c.name(), Direction: SoftroceToRxe, Run: func(t *testing.T, lab *rxelab.Lab) { pfInterop(t, lab, c, true) }},
			pairing{Name: c.name(), Direction: RxeToSoftroce, Run: func(t *testing.T, lab *rxelab.Lab) { pfInterop(t, lab, c, false) }},
		)
	}
}
