package perf

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/tools/pingpong"
	"github.com/softroce/softroce/internal/tools/tooltest"
)

// TestPingpongPerfMismatch: a mismatched setup — a pingpong tool and a perftest tool on the
// same TCP port (both default to 18515) — is refused with a clear message and exit 1 on
// both sides, within the --timeout bound, never a hang. perftest server, pingpong client:
// the server names the bad version string it got (the client's record); pingpong server,
// perftest client: the server's wait for the rest of a record is bounded.
func TestPingpongPerfMismatch(t *testing.T) {
	ppMain := func(args []string, ln net.Listener, stdout, stderr io.Writer) int {
		c, err := pingpong.ParseArgs(args)
		if err == nil {
			c.Listener = ln
			err = pingpong.Run(context.Background(), c, stdout)
		}
		if err != nil {
			fmt.Fprintf(stderr, "pingpong: %v\n", err)
			return 1
		}
		return 0
	}
	for _, perfServes := range []bool{true, false} {
		t.Run("perf-server="+strconv.FormatBool(perfServes), func(t *testing.T) {
			ln, err := net.Listen("tcp4", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
			var sout, serr, cout, cerr bytes.Buffer
			done := make(chan int, 1)
			start := time.Now()
			var cst int
			if perfServes {
				go func() {
					done <- perfMain([]string{"write", "-d", "127.0.0.1", "--roce-port", strconv.Itoa(int(tooltest.FreeUDPPort(t))), "--timeout", "2s"},
						&perfEnv{Stdout: &sout, Stderr: &serr, Listener: ln})
				}()
				cst = ppMain([]string{"rc", "-d", "127.0.0.2", "-p", port, "--timeout", "2s", "--roce-port", strconv.Itoa(int(tooltest.FreeUDPPort(t))), "127.0.0.1"},
					nil, &cout, &cerr)
			} else {
				go func() {
					done <- ppMain([]string{"rc", "-d", "127.0.0.1", "--timeout", "2s", "--roce-port", strconv.Itoa(int(tooltest.FreeUDPPort(t)))},
						ln, &sout, &serr)
				}()
				cst = perfMain([]string{"write", "-d", "127.0.0.2", "-p", port, "--roce-port", strconv.Itoa(int(tooltest.FreeUDPPort(t))), "--timeout", "2s", "127.0.0.1"},
					&perfEnv{Stdout: &cout, Stderr: &cerr})
			}
			var sst int
			select {
			case sst = <-done:
			case <-time.After(30 * time.Second): // a bound on a hang, not a sleep
				t.Fatal("the server did not give up")
			}
			el := time.Since(start)
			t.Logf("server exit %d: %s\nclient exit %d: %s", sst, serr.String(), cst, cerr.String())
			if sst != 1 || cst != 1 {
				t.Errorf("exit statuses server %d client %d, want 1 and 1", sst, cst)
			}
			if el > 15*time.Second {
				t.Errorf("took %v with 2 s step timeouts", el)
			}
			perfErr, ppErr := serr.String(), cerr.String()
			if !perfServes {
				perfErr, ppErr = cerr.String(), serr.String()
			}
			if !strings.Contains(perfErr, "Failed to exchange data between server and clients") {
				t.Errorf("perf stderr %q", perfErr)
			}
			if perfServes && !strings.Contains(perfErr, `peer perftest version "0000:`) { // the LID, then the QPN
				t.Errorf("perf server does not name the bad version: %q", perfErr)
			}
			if !strings.Contains(ppErr, "remote address") {
				t.Errorf("pingpong stderr %q", ppErr)
			}
		})
	}
}
