package pingpong

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/softroce/softroce/internal/daemontest"
	tooltest "github.com/softroce/softroce/internal/tools/tooltest"
	"github.com/softroce/softroce/pkg/roce"
)

// TestPingpongDaemon runs every pingpong tool with one side through the softroce daemon
// (`--daemon SOCKET`, the daemon's device on that side's address) and the other embedded, in
// both directions: the same output checks as TestPingpongPairs (-c, each message
// byte-exact against the client's buffer, UD GRHs), exit status 0, and the daemon holds no
// object once the tool is gone.
func TestPingpongDaemon(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	cases := []struct {
		tool        string
		size, iters int
		numQP       int
		flags       []string
	}{
		{"rc", 3000, 40, 1, []string{"-e"}},
		{"rc", 64, 40, 1, []string{"-r", "4"}},
		{"uc", 3000, 40, 1, nil},
		{"ud", 512, 40, 1, []string{"-e"}},
		{"srq", 64, 40, 4, []string{"-q", "4", "-r", "8", "-e"}},
	}
	for _, c := range cases {
		for _, serverViaDaemon := range []bool{true, false} {
			name := fmt.Sprintf("%s-%dx%d-%s-server-daemon-%v", c.tool, c.size, c.iters, strings.Join(c.flags, ""), serverViaDaemon)
			t.Run(name, func(t *testing.T) {
				port := uint16(20000 + rand.IntN(40000))
				addr := netip.MustParseAddr("127.0.0.2")
				if serverViaDaemon {
					addr = netip.MustParseAddr("127.0.0.1")
				}
				sock, srv := daemontest.ServeUDP(t, roce.UDPOptions{Addrs: []netip.Addr{addr}, Port: port, Portable: true, Name: "softroce0"})
				sd, cd := "", sock
				if serverViaDaemon {
					sd, cd = sock, ""
				}
				flags := append([]string{"-c", "-s", strconv.Itoa(c.size), "-n", strconv.Itoa(c.iters)}, c.flags...)
				s, cl := ppPairVia(t, c.tool, port, sd, cd, flags...)
				checkPPOutput(t, "server", s, cl, c.tool, c.size, c.iters, c.numQP, "::ffff:127.0.0.1")
				checkPPOutput(t, "client", cl, s, c.tool, c.size, c.iters, c.numQP, "::ffff:127.0.0.2")
				if s.recvs < c.iters || cl.recvs < c.iters {
					t.Errorf("received %d (server) and %d (client) messages, want >= %d", s.recvs, cl.recvs, c.iters)
				}
				if d := srv.Debug(); d.RingPosts+d.SocketPosts < uint64(c.iters) {
					t.Errorf("the daemon carried %d ring and %d socket posts, want >= %d", d.RingPosts, d.SocketPosts, c.iters)
				}
				tooltest.DaemonIdle(t, srv)
			})
		}
	}
}

// TestPingpongDaemonFlags: --roce-port and --portable name the RoCE socket, which the daemon
// owns: refused with --daemon; a daemon socket nobody listens on is a clear error.
func TestPingpongDaemonFlags(t *testing.T) {
	for _, args := range [][]string{{"rc", "--daemon", "/nonexistent", "--roce-port", "5000"}, {"ud", "--daemon", "/x", "--portable"}} {
		if _, err := ParseArgs(args); err == nil || !strings.Contains(err.Error(), "--daemon") {
			t.Errorf("%q: %v", args, err)
		}
	}
	var out, errb strings.Builder
	st := pingpongMain([]string{"rc", "--daemon", t.TempDir() + "/none.sock", "-d", "127.0.0.1", "--timeout", "300ms", "127.0.0.1"},
		&ppEnv{Stdout: &out, Stderr: &errb})
	if st != 1 || !strings.Contains(errb.String(), "daemon") || out.String() != "" {
		t.Fatalf("exit %d, stdout %q, stderr %q", st, out.String(), errb.String())
	}
}
