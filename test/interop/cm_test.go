//go:build interop

package interop

// softroce rping (internal/tools/rping: pkg/rdmacm over the device's QP1 CM) against
// rdmacm-utils' rping on kernel rxe, both directions:
//
//   - softroce->rxe: the guest serves (`rping -s -a 198.18.0.2 -v -d`), softroce rping -c
//     connects from 198.18.0.1 in the lab netns;
//   - rxe->softroce: softroce rping -s serves on 198.18.0.1, the guest's `rping -c -a
//     198.18.0.1 -v -V -C 3` connects.
//
// The ipv6-rping-*, ipv6-ucmatose-* and ipv6-udaddy-* pairings run the same tools with the
// lab's IPv6 addresses: rdma_cm resolves them to IPv6 GIDs and the CM REQ's CMA header says
// IP version 6 (net_test.go).
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

	"github.com/softroce/softroce/internal/cm"
	"github.com/softroce/softroce/internal/rocetest"
	"github.com/softroce/softroce/internal/testcap"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/test/rxelab"
)

func init() {
	for _, c := range []struct {
		size, count int
		n           labNet
	}{{64, 3, netV4}, {4000, 5, netV4}, {4000, 5, netV6}} {
		c := c
		name := fmt.Sprintf("%srping-%dx%d", c.n.Prefix, c.size, c.count)
		pairings = append(pairings,
			pairing{Name: name, Direction: SoftroceToRxe, Run: func(t *testing.T, lab *rxelab.Lab) { rpingInterop(t, lab, true, c.size, c.count, sideEmbedded, c.n) }},
			pairing{Name: name, Direction: RxeToSoftroce, Run: func(t *testing.T, lab *rxelab.Lab) { rpingInterop(t, lab, false, c.size, c.count, sideEmbedded, c.n) }},
		)
	}
}

// rpingExpect is rping's -v output for a size: the "rdma-ping-%d: " prefix, then the
// rotating A..z pattern starting one letter later each ping, size-1 characters.
func rpingExpect(prefix string, n, size int) string {
	var b strings.Builder
	start := byte('A')
	for i := 0; i < n; i++ {
		msg := []byte(fmt.Sprintf("rdma-ping-%d: ", i))
		c := start
		for len(msg) < size-1 {
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

// rpingInterop runs softroce rping against the guest's; client tells whether softroce is the
// client, side what runs on softroce's side (cm_daemon_test.go, clib_test.go), n the network.
func rpingInterop(t *testing.T, lab *rxelab.Lab, client bool, size, count int, side ourSide, n labNet) {
	bin := buildSoftroce(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	viaDaemon := side == sideDaemon
	daemonArgs := labDaemonArgs(t, ctx, lab, bin, viaDaemon, n)
	stopCapture := ppStartCapture(t, lab)

	var guestCmd string
	var ourArgs []string
	if client {
		guestCmd = fmt.Sprintf("rping -s -a %s -v -d -S %d", n.Guest, size)
		ourArgs = []string{"rping", "-c", "-a", n.Guest.String(), "-C", fmt.Sprint(count), "-S", fmt.Sprint(size), "-v", "-V", "--timeout", "30s"}
	} else {
		guestCmd = fmt.Sprintf("rping -c -a %s -v -V -C %d -S %d", n.Host, count, size)
		ourArgs = []string{"rping", "-s", "-a", n.Host.String(), "-v", "-d", "-S", fmt.Sprint(size), "--timeout", "30s"}
	}
	// through the daemon the rping program needs no netns of its own: it talks to the
	// daemon's socket only
	ourArgs = append(ourArgs, daemonArgs...)
	// the guest's "rdma_listen" debug line is printed before rdma_listen(3) returns; the CM
	// answers REQs as soon as the listen call has registered, and the job log is polled
	// through 9p, far slower than that
	spec := pairSpec{Client: client, Ours: ourArgs, Guest: guestCmd,
		OurReady: "rdma_listen", GuestReady: "rdma_listen", HostNetns: viaDaemon}
	if side == sideLib {
		args := []string{"-c", "-a", rxelab.GuestIP, "-C", fmt.Sprint(count), "-S", fmt.Sprint(size), "-v", "-V"}
		if !client {
			args = []string{"-s", "-a", rxelab.HostIP, "-v", "-d", "-S", fmt.Sprint(size)}
		}
		libSpec(t, ctx, lab, bin, &spec, "rping", args)
	}
	r := runPair(ctx, t, lab, bin, spec)
	wantExit0(t, "softroce rping", r.OurStatus)
	wantExit0(t, "guest rping", r.GuestStatus)
	cliOut, srvOut := r.OurOut, r.GuestOut
	if !client {
		cliOut, srvOut = srvOut, cliOut
	}
	if got, want := rpingLines(cliOut, ""), rpingExpect("", count, size); got != want {
		t.Errorf("client ping lines:\n%s\nwant:\n%s", got, want)
	}
	if got, want := rpingLines(srvOut, "server "), rpingExpect("server ", count, size); got != want {
		t.Errorf("server ping lines:\n%s\nwant:\n%s", got, want)
	}
	if strings.Contains(r.OurErr, "data mismatch") || strings.Contains(r.GuestOut, "data mismatch") {
		t.Errorf("-V reported a data mismatch")
	}
	wire, lost := stopCapture()
	rpingCheckWire(t, wire, lost, client, count, (size+pathMTU-1)/pathMTU, n)
}

// rpingCheckWire: every ICRC verifies; the CM messages, in order, are REQ from the client,
// REP from the server, RTU from the client, then a DREQ from the client answered by a DREP
// (the server may also send its own DREQ crossing ours); one READ request per ping and
// pkts WRITE packets per ping ran.
func rpingCheckWire(t *testing.T, wire []testcap.IPUDP, lost, softroceClient bool, count, pkts int, n labNet) {
	t.Helper()
	if lost {
		t.Errorf("tcpdump dropped packets: the capture is incomplete")
	}
	srvIP := n.Guest
	if !softroceClient {
		srvIP = n.Host
	}
	var msgs []string
	reads, writes, bad := 0, 0, 0
	for _, d := range wire {
		if !checkICRC(t, d, &bad) {
			continue
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
			checkCMAHeader(t, m, n)
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
	if reads != count || writes != count*pkts {
		t.Errorf("%d RDMA READ requests and %d WRITE packets, want %d and %d", reads, writes, count, count*pkts)
	}
}

func init() {
	for _, tool := range []string{"ucmatose", "udaddy"} {
		for _, side := range []ourSide{sideEmbedded, sideDaemon, sideLib} {
			tool, side := tool, side
			name := tool + "-100x10"
			switch side {
			case sideDaemon:
				name = tool + "-daemon-100x10" // softroce's tool through a softroce daemon
			case sideLib:
				name = tool + "-lib-100x10" // rdmacm-utils' own tool through the drop-in libraries
			}
			pairings = append(pairings,
				pairing{Name: name, Direction: SoftroceToRxe, Run: func(t *testing.T, lab *rxelab.Lab) { cmtInterop(t, lab, tool, true, 1, 10, 100, side, netV4) }},
				pairing{Name: name, Direction: RxeToSoftroce, Run: func(t *testing.T, lab *rxelab.Lab) { cmtInterop(t, lab, tool, false, 1, 10, 100, side, netV4) }},
			)
		}
		tool := tool // over IPv6 addresses
		pairings = append(pairings,
			pairing{Name: netV6.Prefix + tool + "-100x10", Direction: SoftroceToRxe, Run: func(t *testing.T, lab *rxelab.Lab) {
				cmtInterop(t, lab, tool, true, 1, 10, 100, sideEmbedded, netV6)
			}},
			pairing{Name: netV6.Prefix + tool + "-100x10", Direction: RxeToSoftroce, Run: func(t *testing.T, lab *rxelab.Lab) {
				cmtInterop(t, lab, tool, false, 1, 10, 100, sideEmbedded, netV6)
			}},
		)
	}
	// several connections; ucmatose with multi-packet SENDs (path MTU 1024)
	for _, c := range []struct {
		tool               string
		conns, count, size int
	}{{"ucmatose", 3, 20, 3000}, {"udaddy", 2, 20, 1000}} {
		c := c
		name := fmt.Sprintf("%s-c%d-%dx%d", c.tool, c.conns, c.size, c.count)
		pairings = append(pairings,
			pairing{Name: name, Direction: SoftroceToRxe, Run: func(t *testing.T, lab *rxelab.Lab) {
				cmtInterop(t, lab, c.tool, true, c.conns, c.count, c.size, sideEmbedded, netV4)
			}},
			pairing{Name: name, Direction: RxeToSoftroce, Run: func(t *testing.T, lab *rxelab.Lab) {
				cmtInterop(t, lab, c.tool, false, c.conns, c.count, c.size, sideEmbedded, netV4)
			}},
		)
	}
}

// cmtInterop runs softroce ucmatose/udaddy against the guest's tool (default 10 messages of
// 100 bytes): both must print "return status 0" after "data transfers complete", and the
// capture's ICRCs verify; ucmatose's CM exchange is REQ, REP, RTU, DREQ (server), DREP;
// udaddy's is SIDR_REQ, SIDR_REP, with 10 UD SEND-with-immediate packets each way. viaDaemon
// runs softroce's tool through a softroce daemon (cm_daemon_test.go); n is the network.
func cmtInterop(t *testing.T, lab *rxelab.Lab, tool string, client bool, conns, count, size int, side ourSide, n labNet) {
	bin := buildSoftroce(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	daemonArgs := labDaemonArgs(t, ctx, lab, bin, side == sideDaemon, n)
	stopCapture := ppStartCapture(t, lab)
	var guestCmd string
	var ourArgs []string
	opts := fmt.Sprintf(" -c %d -C %d -S %d", conns, count, size)
	host, guest := n.Host.String(), n.Guest.String()
	if client {
		guestCmd = tool + " -b " + guest + opts
		ourArgs = append([]string{tool, "-s", guest, "-b", host, "--timeout", "30s"}, strings.Fields(opts)...)
	} else {
		guestCmd = tool + " -s " + host + " -b " + guest + opts
		ourArgs = append([]string{tool, "-b", host, "--timeout", "30s"}, strings.Fields(opts)...)
	}
	ourArgs = append(ourArgs, daemonArgs...)
	// "starting server" is printed just before rdma_bind_addr/rdma_listen
	spec := pairSpec{Client: client, Ours: ourArgs, Guest: guestCmd,
		OurReady: "starting server", GuestReady: "starting server"}
	if side == sideLib {
		args := append([]string{"-s", rxelab.GuestIP, "-b", rxelab.HostIP}, strings.Fields(opts)...)
		if !client {
			args = append([]string{"-b", rxelab.HostIP}, strings.Fields(opts)...)
		}
		libSpec(t, ctx, lab, bin, &spec, tool, args)
	}
	r := runPair(ctx, t, lab, bin, spec)
	wantExit0(t, "softroce "+tool, r.OurStatus)
	wantExit0(t, "guest "+tool, r.GuestStatus)
	for who, out := range map[string]string{"softroce": r.OurOut, "guest": r.GuestOut} {
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
				checkCMAHeader(t, m, n)
				who := "g"
				if d.Src == n.Host {
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
	count1 := func(m string) int {
		n := 0
		for _, x := range msgs {
			if x == m {
				n++
			}
		}
		return n
	}
	want := map[string]int{cli + ":REQ": conns, srv + ":REP": conns, cli + ":RTU": conns, srv + ":DREQ": conns, cli + ":DREP": conns}
	if tool == "udaddy" {
		want = map[string]int{cli + ":SIDR_REQ": conns, srv + ":SIDR_REP": conns}
	}
	for m, n := range want {
		if count1(m) != n {
			t.Errorf("CM exchange %q: %d x %s, want %d", seq, count1(m), m, n)
		}
	}
	if strings.Contains(seq, "REJ") {
		t.Errorf("CM exchange has a REJ: %q", seq)
	}
	if data[n.Host] != conns*count || data[n.Guest] != conns*count {
		t.Errorf("data messages %v, want %d each way", data, conns*count)
	}
}

func init() {
	pairings = append(pairings,
		pairing{Name: "rping-no-listener", Direction: SoftroceToRxe, Run: func(t *testing.T, lab *rxelab.Lab) { rpingRejected(t, lab, true) }},
		pairing{Name: "rping-no-listener", Direction: RxeToSoftroce, Run: func(t *testing.T, lab *rxelab.Lab) { rpingRejected(t, lab, false) }},
	)
}

// rpingRejected: a client connecting to a port nobody listens on is rejected by the peer's
// CM with REJ reason 8 (invalid service ID, IBTA 12.6.7.2): softroce's CM rejects the kernel's
// REQ and the kernel's CM ours, and both rpings print "cma event RDMA_CM_EVENT_REJECTED,
// error 8" and exit 255 (rping exits with -1).
func rpingRejected(t *testing.T, lab *rxelab.Lab, client bool) {
	bin := buildSoftroce(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const rejLine = "cma event RDMA_CM_EVENT_REJECTED, error 8"
	if client {
		var out bytes.Buffer
		cmd := lab.NSCommand(ctx, bin, "rping", "-c", "-a", rxelab.GuestIP, "-p", "7999", "-C", "1", "--timeout", "20s")
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		st := 0
		if ee, ok := err.(*exec.ExitError); ok {
			st = ee.ExitCode()
		}
		t.Logf("softroce rping (exit %d):\n%s", st, out.String())
		if st != 255 || !strings.Contains(out.String(), rejLine) {
			t.Errorf("softroce rping exit %d, want 255 with %q", st, rejLine)
		}
		return
	}
	// our device listens on 7175 only; the guest asks for 7174
	ours := rocetest.NewWatch("rdma_listen")
	cmd := lab.NSCommand(ctx, bin, "rping", "-s", "-a", rxelab.HostIP, "-p", "7175", "-d", "--timeout", "30s")
	cmd.Stdout, cmd.Stderr = ours, ours
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	select {
	case <-ours.Seen():
	case <-time.After(30 * time.Second):
		t.Fatalf("softroce rping server never listened:\n%s", ours.String())
	}
	// 255 is the lab's own failure status: report rping's in the output instead
	out, _, err := lab.Exec(ctx, "rping -c -a "+rxelab.HostIP+" -C 1 2>&1; echo rping-status=$?", rxelab.ExecOptions{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatalf("guest: %v", err)
	}
	t.Logf("guest rping:\n%s", out)
	if !strings.Contains(string(out), "rping-status=255\n") || !strings.Contains(string(out), rejLine) {
		t.Errorf("guest rping: want exit 255 with %q", rejLine)
	}
}
