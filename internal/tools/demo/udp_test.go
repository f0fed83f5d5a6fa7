package demo

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/softroce/softroce/internal/tools/tooltest"
)

// TestDemoUDP runs the README's demo as it runs by default: two devices on
// UDP 127.0.0.1 and 127.0.0.2 (here a free port both can bind instead of
// 4791, which another test may hold), all six operations checked byte for
// byte, and the throughput line.
func TestDemoUDP(t *testing.T) {
	for _, portable := range []bool{false, true} {
		t.Run(fmt.Sprintf("portable=%v", portable), func(t *testing.T) {
			args := []string{"--port", fmt.Sprint(tooltest.FreeUDPPort(t)), "--bytes", "8388608"}
			if portable {
				args = append(args, "--portable")
			}
			var out, errb bytes.Buffer
			if rc := Main(context.Background(), args, &out, &errb); rc != 0 {
				t.Fatalf("exit %d\n%s%s", rc, out.String(), errb.String())
			}
			s := out.String()
			for _, want := range []string{"UDP", "127.0.0.1 <-> 127.0.0.2", "path MTU 4096",
				"SEND             ok", "RDMA_WRITE       ok", "RDMA_WRITE_IMM   ok", "RDMA_READ        ok",
				"ATOMIC_CMP_SWP   ok", "ATOMIC_FETCH_ADD ok", "WRITE 8 MiB      ok", "PASS: all 7 checks passed"} {
				if !strings.Contains(s, want) {
					t.Fatalf("output lacks %q:\n%s", want, s)
				}
			}
			if !regexp.MustCompile(`throughput +[0-9.]+ Gbit/s \(8388608 bytes in `).MatchString(s) || strings.Contains(s, "FAIL") {
				t.Fatalf("no throughput report, or a failed check:\n%s", s)
			}
		})
	}
}
