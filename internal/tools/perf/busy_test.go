package perf

import (
	"io"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/tools/cli"
	"github.com/softroce/softroce/internal/tools/tooltest"
)

// TestPerfLinkBusyPoll: --busy-poll gives the device's link a receive busy-poll budget (not
// with --portable, whose plain sockets have none), and cli.OpenLocal hands it to the link:
// the device's receive goroutine is then found polling (busyRecv) instead of parked.
func TestPerfLinkBusyPoll(t *testing.T) {
	for _, c := range []struct {
		args []string
		want time.Duration
	}{
		{[]string{"write", "--lat"}, 0},
		{[]string{"write", "--lat", "--busy-poll"}, perfBusyPoll},
		{[]string{"write", "--busy-poll", "--portable"}, 0},
	} {
		pc, err := parsePerf(c.args, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if got := pc.linkBusyPoll(); got != c.want {
			t.Errorf("%v: link busy poll %v, want %v", c.args, got, c.want)
		}
	}

	f := cli.DevFlag{Addr: netip.MustParseAddr("127.0.0.1")}
	ld, err := cli.OpenLocal(&f, cli.DevOptions{Port: tooltest.FreeUDPPort(t), BusyPoll: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer ld.Dev.Close()
	buf := make([]byte, 1<<20)
	deadline := time.Now().Add(10 * time.Second) // safety bound, not a wait
	for {
		if strings.Contains(string(buf[:runtime.Stack(buf, true)]), "udp.(*udpSock).busy") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no receive goroutine busy-polling the device's socket")
		}
		runtime.Gosched()
	}
}
