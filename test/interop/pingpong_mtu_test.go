//go:build interop

package interop

// ibv_ud_pingpong above the MTU: a UD message is one packet, so "sizes above the MTU" for
// ud is the tools' refusal (rdma-core ud_pingpong.c pp_init_ctx: "Requested size larger
// than port MTU (%d)", exit 1, before any exchange). Both sides of both directions must
// refuse the same way: the guest tool on rxe0 (active MTU 1024 on the 1500-byte tap) and
// softroce's pingpong on 198.18.0.1 (port MTU 1024 by the same rule), neither waiting for
// a peer. The rc/uc/srq pairings cover sizes above the MTU with real traffic (-s 3000).

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/test/rxelab"
)

func init() {
	for _, d := range []string{SoftroceToRxe, RxeToSoftroce} {
		client := d == SoftroceToRxe
		pairings = append(pairings, pairing{Name: "pingpong-ud-1100-refused", Direction: d,
			Run: func(t *testing.T, lab *rxelab.Lab) { udAboveMTU(t, lab, client) }})
	}
}

const udRefusal = "Requested size larger than port MTU (1024)"

// udAboveMTU: client tells whether softroce is the client (the guest then the server).
func udAboveMTU(t *testing.T, lab *rxelab.Lab, client bool) {
	bin := buildSoftroce(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	guest := fmt.Sprintf("ibv_ud_pingpong -d %s -g %d -s 1100 -n 5", rxelab.GuestDev, rxelab.GuestGIDIndex)
	ours := []string{"pingpong", "ud", "-d", rxelab.HostIP, "-s", "1100", "-n", "5", "--timeout", "10s"}
	if client {
		ours = append(ours, rxelab.GuestIP)
	} else {
		guest += " " + rxelab.HostIP
	}
	start := time.Now()
	out, st, err := lab.Exec(ctx, guest+" 2>&1", rxelab.ExecOptions{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatalf("guest %s: %v", guest, err)
	}
	t.Logf("guest %s (exit %d):\n%s", guest, st, out)
	if st != 1 || !strings.Contains(string(out), udRefusal) {
		t.Errorf("guest ibv_ud_pingpong -s 1100: exit %d, output %q; want exit 1 and %q", st, out, udRefusal)
	}
	var so, se bytes.Buffer
	cmd := lab.NSCommand(ctx, bin, ours...)
	cmd.Stdout, cmd.Stderr = &so, &se
	err = cmd.Run()
	code := cmd.ProcessState.ExitCode()
	t.Logf("softroce %s (exit %d, %v):\nstdout:\n%s\nstderr:\n%s", strings.Join(ours, " "), code, err, so.String(), se.String())
	if code != 1 || !strings.Contains(se.String(), udRefusal) {
		t.Errorf("softroce pingpong ud -s 1100: exit %d, stderr %q; want exit 1 and %q", code, se.String(), udRefusal)
	}
	if el := time.Since(start); el > 45*time.Second {
		t.Errorf("the refusals took %v: a side waited for its peer", el)
	}
}
