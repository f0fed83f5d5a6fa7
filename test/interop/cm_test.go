//go:build interop

package interop

// softroce rping (cmd/softroce rping.go: pkg/rdmacm over the device's QP1 CM) against
// rdmacm-utils' rping on kernel rxe, both directions (GitHub-style issue #10):
//
//   - softroce->rxe: the guest serves (`rping -s -a 198.18.0.2 -v -d`), softroce rping -c
//     connects from 198.18.0.1 in the lab netns;
//   - rxe->softroce: softroce rping -s serves on 198.18.0.1, the guest's `rping -c -a
//     198.18.0.1 -v -V -C 3` connects.
//
// Checks: both exit 0; the client prints the three "ping data: rdma-ping-N: ..." lines rping's
// pattern gives, the server three "server ping data: ..." lines; and the tap capture: every
// RoCE packet's ICRC verifies over its real IP header (IBTA A17.3.3), the CM messages
// (UD SEND ONLY to QP1, Q_Key 0x80010000, IBTA 12.6 / 13.5) are REQ, REP, RTU, then DREQ and
// DREP in the right directions, and the data QPs carried RDMA READ and WRITE (IBTA 9.2.1).

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/rocetest"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/cm"
	"github.com/softroce/softroce/test/rxelab"
)

func init() {
	pairings = append(pairings,
		pairing{Name: "rping-64x3", Direction: SoftroceToRxe, Run: func(t *testing.T, lab *rxelab.Lab) { rpingInterop(t, lab, true) }},
		pairing{Name: "rping-64x3", Direction: RxeToSoftroce, Run: func(t *testing.T, lab *rxelab.Lab) { rpingInterop(t, lab, false) }},
	)
}

// rpingExpect is rping's -v output for size 64: the "rdma-ping-%d: " prefix, then the
// rotating A..z pattern starting one letter later each ping, 63 characters.
func rpingExpect(prefix string, n int) string {
	var b strings.Builder
	start := byte('A')
	for i := 0; i < n; i++ {
		msg := []byte(fmt.Sprintf("rdma-ping-%d: ", i))
		c := start
		for len(msg) < 63 {
			msg = append(msg, c)
			if c++; c > 'z' {
				c = 'A'
			}
		}
		if start++; start > 'z' {
			start = 'A'
		}
		fmt.Fprintf(&b, "%sping data: %s\n", prefix, msg)
	}
	return b.String()
}

// rpingLines keeps the lines of out that start with prefix+"ping data:".
func rpingLines(out, prefix string) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(out, "\n") {
		if strings.HasPrefix(l, prefix+"ping data:") {
			b.WriteString(l)
		}
	}
	return b.String()
}

func rpingInterop(t *testing.T, lab *rxelab.Lab, client bool) {
	bin := buildSoftroce(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	stopCapture := ppStartCapture(t, lab)

	var guestCmd string
	var ourArgs []string
	if client {
		guestCmd = "rping -s -a " + rxelab.GuestIP + " -v -d"
		ourArgs = []string{"rping", "-c", "-a", rxelab.GuestIP, "-C", "3", "-v", "-V", "--timeout", "30s"}
	} else {
		guestCmd = "rping -c -a " + rxelab.HostIP + " -v -V -C 3"
		ourArgs = []string{"rping", "-s", "-a", rxelab.HostIP, "-v", "-d", "--timeout", "30s"}
	}
	ours := newLineWatch("rdma_listen")
	var ourErr bytes.Buffer
	cmd := lab.NSCommand(ctx, bin, ourArgs...)
	cmd.Stdout, cmd.Stderr = ours, &ourErr
	var job *rxelab.Job
	var err error
	if client {
		if job, err = lab.ExecBG(ctx, "exec stdbuf -oL "+guestCmd, rxelab.ExecOptions{Timeout: 60 * time.Second}); err != nil {
			t.Fatalf("guest: %v", err)
		}
		// wait for the guest's "rdma_listen" debug line (printed before rdma_listen(3)
		// returns; the CM answers REQs as soon as the listen call has registered)
		deadline := time.Now().Add(30 * time.Second)
		for {
			out, _ := job.Log()
			if bytes.Contains(out, []byte("rdma_listen")) {
				break
			}
			if time.Now().After(deadline) {
				_ = job.Kill()
				t.Fatalf("guest rping never listened:\n%s", out)
			}
			select {
			case <-time.After(200 * time.Millisecond):
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			}
		}
		// rdma_listen's debug line precedes the call by microseconds; the guest's 9p job
		// log polling is far slower than that
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
	} else {
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ours.seen:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("softroce rping server never listened:\n%s%s", ours.String(), ourErr.String())
		}
		if job, err = lab.ExecBG(ctx, "exec stdbuf -oL "+guestCmd, rxelab.ExecOptions{Timeout: 60 * time.Second}); err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("guest: %v", err)
		}
	}
	waited := false
	defer func() {
		if !waited {
			_ = job.Kill()
			out, st, _ := job.Wait(context.Background())
			t.Logf("guest %s (killed) status %d:\n%s", guestCmd, st, out)
		}
	}()
	ourStatus := 0
	if err := cmd.Wait(); err != nil {
		ourStatus = -1
		if ee, ok := err.(*exec.ExitError); ok {
			ourStatus = ee.ExitCode()
		}
	}
	t.Logf("softroce %s (exit %d):\nstdout:\n%s\nstderr:\n%s", strings.Join(ourArgs, " "), ourStatus, ours.String(), ourErr.String())
	guestOut, guestStatus, err := job.Wait(ctx)
	waited = true
	if err != nil {
		t.Fatalf("guest job: %v", err)
	}
	t.Logf("guest %s (exit %d):\n%s", guestCmd, guestStatus, guestOut)
	if ourStatus != 0 {
		t.Errorf("softroce rping exit status %d, want 0", ourStatus)
	}
	if guestStatus != 0 {
		t.Errorf("guest rping exit status %d, want 0", guestStatus)
	}
	cliOut, srvOut := ours.String(), string(guestOut)
	if !client {
		cliOut, srvOut = srvOut, cliOut
	}
	if got, want := rpingLines(cliOut, ""), rpingExpect("", 3); got != want {
		t.Errorf("client ping lines:\n%s\nwant:\n%s", got, want)
	}
	if got, want := rpingLines(srvOut, "server "), rpingExpect("server ", 3); got != want {
		t.Errorf("server ping lines:\n%s\nwant:\n%s", got, want)
	}
	if strings.Contains(ourErr.String(), "data mismatch") || strings.Contains(string(guestOut), "data mismatch") {
		t.Errorf("-V reported a data mismatch")
	}
	wire, lost := stopCapture()
	rpingCheckWire(t, wire, lost, client)
}

// rpingCheckWire: every ICRC verifies; the CM messages, in order, are REQ from the client,
// REP from the server, RTU from the client, then a DREQ from the client answered by a DREP
// (the server may also send its own DREQ crossing ours); READ and WRITE traffic ran.
func rpingCheckWire(t *testing.T, wire []rocetest.IPv4UDP, lost, softroceClient bool) {
	t.Helper()
	if lost {
		t.Errorf("tcpdump dropped packets: the capture is incomplete")
	}
	srvIP := guestIP
	if !softroceClient {
		srvIP = hostIP
	}
	var msgs []string
	reads, writes, bad := 0, 0, 0
	for _, d := range wire {
		want, err := bth.ICRCFromIP(d.IP)
		if err != nil {
			t.Errorf("ICRCFromIP: %v", err)
			continue
		}
		if got := bth.GetICRC(d.Payload); got != want {
			if bad++; bad <= 5 {
				t.Errorf("captured %v -> %v id %d: ICRC %#08x, computed over the real header %#08x", d.Src, d.Dst, d.ID, got, want)
			}
		}
		p, err := bth.Parse(d.Payload)
		if err != nil {
			t.Errorf("captured %v -> %v: %v", d.Src, d.Dst, err)
			continue
		}
		if p.BTH.DestQP() == cm.GSIQPN {
			if p.BTH.Opcode() != bth.OpUDSendOnly || p.DETH.Fields().QKey != cm.GSIQKey || p.DETH.Fields().SrcQP != cm.GSIQPN {
				t.Errorf("QP1 packet %v Q_Key %#x src QP %d", p.BTH.Opcode(), p.DETH.Fields().QKey, p.DETH.Fields().SrcQP)
				continue
			}
			m, err := cm.Parse(p.Payload)
			if err != nil {
				t.Errorf("MAD from %v: %v", d.Src, err)
				continue
			}
			who := "c"
			if d.Src == srvIP {
				who = "s"
			}
			msgs = append(msgs, who+":"+m.Attr.String())
			continue
		}
		switch p.Info.Kind {
		case bth.KindReadReq:
			reads++
		case bth.KindWrite:
			writes++
		}
	}
	t.Logf("CM messages: %v", msgs)
	seq := strings.Join(msgs, " ")
	if !strings.HasPrefix(seq, "c:REQ s:REP c:RTU") {
		t.Errorf("CM exchange %q, want REQ, REP, RTU first", seq)
	}
	if !strings.Contains(seq, "c:DREQ") || !strings.Contains(seq, "s:DREP") {
		t.Errorf("CM release %q: want the client's DREQ answered by a DREP", seq)
	}
	if strings.Contains(seq, "REJ") {
		t.Errorf("CM exchange has a REJ: %q", seq)
	}
	if reads != 3 || writes != 3 {
		t.Errorf("%d RDMA READ requests and %d WRITE packets, want 3 each", reads, writes)
	}
}

func init() {
	for _, tool := range []string{"ucmatose", "udaddy"} {
		tool := tool
		pairings = append(pairings,
			pairing{Name: tool + "-100x10", Direction: SoftroceToRxe, Run: func(t *testing.T, lab *rxelab.Lab) { cmtInterop(t, lab, tool, true) }},
			pairing{Name: tool + "-100x10", Direction: RxeToSoftroce, Run: func(t *testing.T, lab *rxelab.Lab) { cmtInterop(t, lab, tool, false) }},
		)
	}
}

// cmtInterop runs softroce ucmatose/udaddy against the guest's tool (default 10 messages of
// 100 bytes): both must print "return status 0" after "data transfers complete", and the
// capture's ICRCs verify; ucmatose's CM exchange is REQ, REP, RTU, DREQ (server), DREP;
// udaddy's is SIDR_REQ, SIDR_REP, with 10 UD SEND-with-immediate packets each way.
func cmtInterop(t *testing.T, lab *rxelab.Lab, tool string, client bool) {
	bin := buildSoftroce(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	stopCapture := ppStartCapture(t, lab)
	var guestCmd string
	var ourArgs []string
	if client {
		guestCmd = tool + " -b " + rxelab.GuestIP
		ourArgs = []string{tool, "-s", rxelab.GuestIP, "-b", rxelab.HostIP, "--timeout", "30s"}
	} else {
		guestCmd = tool + " -s " + rxelab.HostIP + " -b " + rxelab.GuestIP
		ourArgs = []string{tool, "-b", rxelab.HostIP, "--timeout", "30s"}
	}
	ours := newLineWatch("starting server")
	var ourErr bytes.Buffer
	cmd := lab.NSCommand(ctx, bin, ourArgs...)
	cmd.Stdout, cmd.Stderr = ours, &ourErr
	var job *rxelab.Job
	var err error
	if client {
		if job, err = lab.ExecBG(ctx, "exec stdbuf -oL "+guestCmd, rxelab.ExecOptions{Timeout: 60 * time.Second}); err != nil {
			t.Fatalf("guest: %v", err)
		}
		// "starting server" is printed just before rdma_bind_addr/rdma_listen; the job log
		// is polled through 9p, far slower than that
		deadline := time.Now().Add(30 * time.Second)
		for {
			out, _ := job.Log()
			if bytes.Contains(out, []byte("starting server")) {
				break
			}
			if time.Now().After(deadline) {
				_ = job.Kill()
				t.Fatalf("guest %s never started:\n%s", tool, out)
			}
			select {
			case <-time.After(200 * time.Millisecond):
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			}
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
	} else {
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ours.seen:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("softroce %s server never started:\n%s%s", tool, ours.String(), ourErr.String())
		}
		if job, err = lab.ExecBG(ctx, "exec stdbuf -oL "+guestCmd, rxelab.ExecOptions{Timeout: 60 * time.Second}); err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("guest: %v", err)
		}
	}
	waited := false
	defer func() {
		if !waited {
			_ = job.Kill()
			out, st, _ := job.Wait(context.Background())
			t.Logf("guest %s (killed) status %d:\n%s", guestCmd, st, out)
		}
	}()
	ourStatus := 0
	if err := cmd.Wait(); err != nil {
		ourStatus = -1
		if ee, ok := err.(*exec.ExitError); ok {
			ourStatus = ee.ExitCode()
		}
	}
	t.Logf("softroce %s (exit %d):\n%s%s", strings.Join(ourArgs, " "), ourStatus, ours.String(), ourErr.String())
	guestOut, guestStatus, err := job.Wait(ctx)
	waited = true
	if err != nil {
		t.Fatalf("guest job: %v", err)
	}
	t.Logf("guest %s (exit %d):\n%s", guestCmd, guestStatus, guestOut)
	for who, st := range map[string]int{"softroce": ourStatus, "guest": guestStatus} {
		if st != 0 {
			t.Errorf("%s %s exit status %d, want 0", who, tool, st)
		}
	}
	for who, out := range map[string]string{"softroce": ours.String(), "guest": string(guestOut)} {
		if !strings.Contains(out, "data transfers complete\n") || !strings.Contains(out, "return status 0\n") {
			t.Errorf("%s %s did not complete", who, tool)
		}
	}
	wire, lost := stopCapture()
	if lost {
		t.Errorf("tcpdump dropped packets: the capture is incomplete")
	}
	var msgs []string
	data := map[netip.Addr]int{}
	for _, d := range wire {
		want, err := bth.ICRCFromIP(d.IP)
		if err != nil || bth.GetICRC(d.Payload) != want {
			t.Errorf("captured %v -> %v: ICRC %#08x, computed %#08x (%v)", d.Src, d.Dst, bth.GetICRC(d.Payload), want, err)
			continue
		}
		p, err := bth.Parse(d.Payload)
		if err != nil {
			t.Errorf("captured %v -> %v: %v", d.Src, d.Dst, err)
			continue
		}
		if p.BTH.DestQP() == cm.GSIQPN {
			if m, err := cm.Parse(p.Payload); err == nil {
				who := "g"
				if d.Src == hostIP {
					who = "s"
				}
				msgs = append(msgs, who+":"+m.Attr.String())
			}
			continue
		}
		if p.Info.Kind == bth.KindSend && p.Info.Last && len(p.Payload) > 0 {
			data[d.Src]++
			if tool == "udaddy" && (p.BTH.Opcode() != bth.OpUDSendOnlyImm || p.DETH.Fields().QKey != cm.RDMAUDPQKey) {
				t.Errorf("udaddy data %v Q_Key %#x", p.BTH.Opcode(), p.DETH.Fields().QKey)
			}
		}
	}
	t.Logf("CM messages (s = softroce, g = guest): %v; messages per sender %v", msgs, data)
	seq := strings.Join(msgs, " ")
	cli, srv := "s", "g"
	if !client {
		cli, srv = "g", "s"
	}
	want := cli + ":REQ " + srv + ":REP " + cli + ":RTU"
	if tool == "udaddy" {
		want = cli + ":SIDR_REQ " + srv + ":SIDR_REP"
	}
	if !strings.HasPrefix(seq, want) {
		t.Errorf("CM exchange %q, want %q first", seq, want)
	}
	if tool == "ucmatose" && (!strings.Contains(seq, srv+":DREQ") || !strings.Contains(seq, cli+":DREP")) {
		t.Errorf("CM release %q: want the server's DREQ answered by a DREP", seq)
	}
	if data[hostIP] != 10 || data[guestIP] != 10 {
		t.Errorf("data messages %v, want 10 each way", data)
	}
}
