//go:build interop

package interop

// softroce pingpong (internal/tools/pingpong, softroce's own QP engine behind the CLI)
// against rdma-core's ibv_rc_pingpong, ibv_uc_pingpong, ibv_ud_pingpong and
// ibv_srq_pingpong on kernel rxe, both directions:
//
//   - softroce->rxe: the guest tool serves (`ibv_X_pingpong -d rxe0 -g 1 [-m 1024] ...`),
//     the softroce CLI, run in the lab netns with `ip netns exec rxelab`, is its client;
//   - rxe->softroce: the softroce CLI serves on 198.18.0.1, the guest tool connects.
//
// The ipv6-pingpong-* pairings do the same over the lab's IPv6 addresses (GIDs
// 2001:db8:198:18::1 and ::2, rxe0's GID index 2; net_test.go).
//
// Each pairing checks both exit statuses, both outputs (each side's remote lines are the
// other's local lines, the result lines, no "invalid data" under -c) and captures the tap:
// every RoCE packet's ICRC must verify over its real IP header (bth.ICRCFromIP, IBTA
// A17.3.3), with the transport (RC/UC/UD opcodes, IBTA 9.2.1) and message count expected.

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/testcap"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/test/rxelab"
)

// ppCase is one pingpong pairing configuration.
type ppCase struct {
	Tool  string // rc, uc, ud, srq
	Size  int
	Iters int
	// Events runs both sides with -e (sleep on the completion channel instead of polling).
	Events bool
	// Daemon runs softroce's side through a softroce daemon (--daemon).
	Daemon bool
	// Lib runs rdma-core's own ibv_X_pingpong on softroce's side, through the drop-in
	// libraries and a softroce daemon (clib_test.go).
	Lib bool
	// V6 runs the pairing over IPv6 GIDs (netV6).
	V6 bool
}

// net is the network the pairing runs over.
func (c ppCase) net() labNet {
	if c.V6 {
		return netV6
	}
	return netV4
}

func (c ppCase) name() string {
	e := ""
	if c.Events {
		e = "-e"
	}
	d := ""
	if c.Daemon {
		d = "daemon-"
	}
	if c.Lib {
		d = "lib-"
	}
	return fmt.Sprintf("%spingpong-%s%s-%dx%d%s", c.net().Prefix, d, c.Tool, c.Size, c.Iters, e)
}

func init() {
	for _, c := range []ppCase{
		{"rc", 64, 20, false, false, false, false}, {"rc", 3000, 20, false, false, false, false},
		{"uc", 64, 20, false, false, false, false}, {"uc", 3000, 20, true, false, false, false},
		{"ud", 512, 20, true, false, false, false},
		{"srq", 64, 32, false, false, false, false}, {"srq", 3000, 32, true, false, false, false},
		// softroce's side through a softroce daemon
		{"rc", 3000, 20, false, true, false, false}, {"uc", 3000, 20, true, true, false, false}, {"ud", 512, 20, true, true, false, false}, {"srq", 3000, 32, true, true, false, false},
		// over IPv6 GIDs (one size each; the daemon listening on the tap interface)
		{"rc", 3000, 20, false, false, false, true}, {"uc", 64, 20, true, false, false, true}, {"ud", 512, 20, true, false, false, true},
		{"srq", 3000, 32, false, false, false, true}, {"rc", 3000, 20, false, true, false, true},
	} {
		c := c
		pairings = append(pairings,
			pairing{Name: c.name(), Direction: SoftroceToRxe, Run: func(t *testing.T, lab *rxelab.Lab) { ppInterop(t, lab, c, true) }},
			pairing{Name: c.name(), Direction: RxeToSoftroce, Run: func(t *testing.T, lab *rxelab.Lab) { ppInterop(t, lab, c, false) }},
		)
	}
}

var (
	softroceBin     string
	softroceBinErr  error
	softroceBinOnce sync.Once
)

// buildSoftroce builds the CLI once per test binary ($INTEROP_SOFTROCE_BIN names a
// prebuilt one instead).
func buildSoftroce(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("INTEROP_SOFTROCE_BIN"); bin != "" {
		return bin
	}
	softroceBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "softroce-interop-")
		if err != nil {
			softroceBinErr = err
			return
		}
		softroceBin = filepath.Join(dir, "softroce")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "go", "build", "-o", softroceBin, "github.com/softroce/softroce/cmd/softroce").CombinedOutput()
		if err != nil {
			softroceBinErr = fmt.Errorf("go build cmd/softroce: %v\n%s", err, out)
		}
	})
	if softroceBinErr != nil {
		t.Fatal(softroceBinErr)
	}
	return softroceBin
}

// ppInterop runs one pairing; client tells whether softroce is the client.
func ppInterop(t *testing.T, lab *rxelab.Lab, c ppCase, client bool) {
	bin := buildSoftroce(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	n := c.net()
	daemonArgs := labDaemonArgs(t, ctx, lab, bin, c.Daemon, n)
	stopCapture := ppStartCapture(t, lab)

	common := fmt.Sprintf("-s %d -n %d -c", c.Size, c.Iters)
	if c.Events {
		common += " -e"
	}
	if c.Tool != "ud" { // ud_pingpong has no -m: its messages are one packet
		common += fmt.Sprintf(" -m %d", pathMTU)
	}
	guestCmd := fmt.Sprintf("ibv_%s_pingpong -d %s -g %d %s", c.Tool, rxelab.GuestDev, n.GuestGID, common)
	ourArgs := append([]string{"pingpong", c.Tool, "-d", n.OurDev, "--timeout", "30s"}, strings.Fields(common)...)
	if n.V6() {
		ourArgs = append(ourArgs, "-g", fmt.Sprint(n.GuestGID)) // the tap's GID 2, as rxe0's
	}
	ourArgs = append(ourArgs, daemonArgs...)
	if client {
		ourArgs = append(ourArgs, n.oobGuest().String())
	} else {
		guestCmd += " " + n.Host.String() // our server listens on both families
	}

	// our server listens before it prints its local address; our client retries its
	// connection until the guest's server listens
	spec := pairSpec{Client: client, Ours: ourArgs, Guest: guestCmd, OurReady: "local address:"}
	if c.Lib {
		args := append([]string{"-d", libDev, "-g", "1"}, strings.Fields(common)...)
		if client {
			args = append(args, rxelab.GuestIP)
		}
		libSpec(t, ctx, lab, bin, &spec, "ibv_"+c.Tool+"_pingpong", args)
		// rdma-core's pingpong client tries its connection once, and its server prints its
		// local address before it listens: start once the guest's server listens
		spec.GuestListen = pingpongPort
	}
	r := runPair(ctx, t, lab, bin, spec)
	wantExit0(t, "softroce pingpong", r.OurStatus)
	wantExit0(t, "guest ibv_"+c.Tool+"_pingpong", r.GuestStatus)
	if r.OurErr != "" {
		t.Errorf("softroce stderr: %q", r.OurErr)
	}
	numQP := 1
	if c.Tool == "srq" {
		numQP = 16 // srq_pingpong's default -q, on both sides
	}
	ourQPs, rxeQPs := ppCheckOutputs(t, c, numQP, r.OurOut, r.GuestOut)
	wire, lost := stopCapture()
	ppCheckWire(t, c, wire, lost, ourQPs, rxeQPs)
}

var (
	ppLocalRe  = regexp.MustCompile(`(?m)^  local address:  LID 0x([0-9a-f]{4}), QPN 0x([0-9a-f]{6}), PSN 0x([0-9a-f]{6})[,:] GID (\S+)$`)
	ppRemoteRe = regexp.MustCompile(`(?m)^  remote address: LID 0x([0-9a-f]{4}), QPN 0x([0-9a-f]{6}), PSN 0x([0-9a-f]{6}), GID (\S+)$`)
)

// ppCheckOutputs: each side prints numQP local and remote lines, its remote lines are the
// other side's local lines, the GIDs are the network's (IPv4: ::ffff:198.18.0.1 for us and
// ::ffff:198.18.0.2 for rxe, GID index 1), both print the result lines and neither reports invalid data (-c).
// It returns the QP numbers of each side, from their local address lines.
func ppCheckOutputs(t *testing.T, c ppCase, numQP int, ours, guest string) (ourQPs, rxeQPs map[uint32]bool) {
	t.Helper()
	side := func(who, out, gid string) (locals, remotes [][]string) {
		locals = ppLocalRe.FindAllStringSubmatch(out, -1)
		remotes = ppRemoteRe.FindAllStringSubmatch(out, -1)
		if len(locals) != numQP || len(remotes) != numQP {
			t.Errorf("%s: %d local and %d remote address lines, want %d each", who, len(locals), len(remotes), numQP)
		}
		for _, l := range locals {
			if l[4] != gid {
				t.Errorf("%s: local GID %s, want %s", who, l[4], gid)
			}
		}
		sep := ","
		if c.Tool == "ud" {
			sep = ":" // ud_pingpong.c prints "PSN 0x%06x: GID"
		}
		if len(locals) > 0 && !strings.Contains(out, "PSN 0x"+locals[0][3]+sep+" GID") {
			t.Errorf("%s: local address line does not use %q", who, sep)
		}
		re := regexp.MustCompile(fmt.Sprintf(`(?m)^%d bytes in [0-9.]+ seconds = [0-9.]+ Mbit/sec\n%d iters in [0-9.]+ seconds = [0-9.]+ usec/iter$`,
			c.Size*c.Iters*2, c.Iters))
		if !re.MatchString(out) {
			t.Errorf("%s: no result lines for %d x %d", who, c.Size, c.Iters)
		}
		if strings.Contains(out, "invalid data") {
			t.Errorf("%s: -c reported invalid data", who)
		}
		return locals, remotes
	}
	oL, oR := side("softroce", ours, pingpongGID(c.net().Host))
	gL, gR := side("rxe", guest, pingpongGID(c.net().Guest))
	cross := func(who string, remotes, peerLocals [][]string) {
		for i := 0; i < len(remotes) && i < len(peerLocals); i++ {
			if strings.Join(remotes[i][1:], " ") != strings.Join(peerLocals[i][1:], " ") {
				t.Errorf("%s remote address %d %v is not the peer's local address %v", who, i, remotes[i][1:], peerLocals[i][1:])
			}
		}
	}
	cross("softroce", oR, gL)
	cross("rxe", gR, oL)
	qps := func(locals [][]string) map[uint32]bool {
		m := map[uint32]bool{}
		for _, l := range locals {
			n, _ := strconv.ParseUint(l[2], 16, 32)
			m[uint32(n)] = true
		}
		return m
	}
	return qps(oL), qps(gL)
}

// ppCheckWire checks the tap capture: every RoCE packet's ICRC verifies over its real IP
// header (IPv4 ID included, IBTA A17.3.3), ours carry DF, the opcodes are
// those of the tool's transport, no request PSN is skipped per (sender, QP) (IBTA 9.7.1; a
// PSN repeated is a retransmission, legal and logged — a busy TCG guest can be later than the
// 67 ms ACK timeout), and each side sent iters distinct messages (srq: at least iters, a few
// more may be in flight at the end) with, for rc, one ACK per message of the peer.
// Packets to QPs of neither side (another lab user in the netns) are ignored and counted.
func ppCheckWire(t *testing.T, c ppCase, wire []testcap.IPUDP, lost bool, ourQPs, rxeQPs map[uint32]bool) {
	t.Helper()
	hostIP, guestIP := c.net().Host, c.net().Guest
	if lost {
		t.Errorf("tcpdump dropped packets: the capture is incomplete")
	}
	type flow struct {
		src netip.Addr
		qp  uint32
	}
	type msgKey struct {
		f   flow
		psn bth.PSN
	}
	msgs := map[netip.Addr]int{}
	acks := map[netip.Addr]int{}
	seenMsg := map[msgKey]bool{}
	nextPSN := map[flow]bth.PSN{}
	bad, foreign := 0, 0
	retrans := map[netip.Addr]int{}
	for _, d := range wire {
		p, err := bth.Parse(d.Payload)
		if err != nil {
			t.Errorf("captured %v -> %v: %v", d.Src, d.Dst, err)
			continue
		}
		dqp := p.BTH.DestQP()
		if !(d.Src == hostIP && d.Dst == guestIP && rxeQPs[dqp]) && !(d.Src == guestIP && d.Dst == hostIP && ourQPs[dqp]) {
			foreign++
			continue
		}
		if !checkICRC(t, d, &bad) {
			continue
		}
		// Our IPv4 IDs are 0, or 0, 1, 2, ... for the segments of a UDP GSO send (docs/link.md);
		// either way the ICRC, checked above over the real header, must have assumed them.
		if d.Src == hostIP && hostIP.Is4() && !d.DF {
			t.Errorf("our packet id %d without DF", d.ID)
		}
		info := p.Info
		switch c.Tool {
		case "rc", "srq":
			if info.Transport != bth.TransportRC {
				t.Errorf("%v on an %s pairing", p.BTH.Opcode(), c.Tool)
			}
		case "uc":
			if info.Transport != bth.TransportUC {
				t.Errorf("%v on a uc pairing", p.BTH.Opcode())
			}
		case "ud":
			if p.BTH.Opcode() != bth.OpUDSendOnly {
				t.Errorf("%v on a ud pairing", p.BTH.Opcode())
			} else if q := p.DETH.Fields().QKey; q != 0x11111111 {
				t.Errorf("UD Q_Key %#x, want ud_pingpong's 0x11111111", q)
			} else if len(p.Payload) != c.Size {
				t.Errorf("UD payload %d bytes, want %d", len(p.Payload), c.Size)
			}
		}
		f := flow{d.Src, dqp}
		if info.Request && c.Tool != "ud" { // UD PSNs are not checked by the receiver
			psn := p.BTH.PSN()
			if next, ok := nextPSN[f]; ok && psn != next {
				if next.LessThan(psn) {
					t.Errorf("%v -> QP %#x: %v PSN %#x, expected %#x: PSNs skipped", d.Src, dqp, p.BTH.Opcode(), uint32(psn), uint32(next))
				} else {
					retrans[d.Src]++
				}
			}
			if next, ok := nextPSN[f]; !ok || next.LessThan(psn.Add(1)) {
				nextPSN[f] = psn.Add(1)
			}
		}
		switch {
		case info.Kind == bth.KindSend && info.Last:
			k := msgKey{f, p.BTH.PSN()}
			if !seenMsg[k] || c.Tool == "ud" {
				seenMsg[k] = true
				msgs[d.Src]++
			}
		case info.Kind == bth.KindAck:
			acks[d.Src]++
		}
	}
	for _, a := range []netip.Addr{hostIP, guestIP} {
		// rc/uc/ud alternate strictly: iters messages each way. srq counts over all QPs
		// and may have a few more in flight when a side reaches iters.
		if msgs[a] < c.Iters || (c.Tool != "srq" && msgs[a] != c.Iters) {
			t.Errorf("%v sent %d SEND messages on the wire, want %d", a, msgs[a], c.Iters)
		}
		if (c.Tool == "rc" || c.Tool == "srq") && acks[a] == 0 {
			t.Errorf("%v sent no ACK", a)
		}
		// rxe and softroce set AckReq on the last packet of a message and ACK exactly those
		// (IBTA 9.7.5.1 coalescing): one ACK per message of the peer, without retransmissions
		peer := guestIP
		if a == guestIP {
			peer = hostIP
		}
		if c.Tool == "rc" && len(retrans) == 0 && acks[a] != msgs[peer] {
			t.Errorf("%v sent %d ACKs for %d messages", a, acks[a], msgs[peer])
		}
	}
	t.Logf("wire: %d RoCE packets (%d of other lab users ignored), messages %v, ACKs %v, packets retransmitted %v, %d bad ICRCs",
		len(wire), foreign, msgs, acks, retrans, bad)
}

// ppStartCapture is startCapture (rc_send_test.go) that also reports what tcpdump says at
// exit ("N packets dropped by kernel"): the returned func gives the datagrams and whether
// tcpdump lost any.
func ppStartCapture(t *testing.T, lab *rxelab.Lab) func() ([]testcap.IPUDP, bool) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tap.pcap")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// tcpdump in immediate mode uses a TPACKET_V2 ring whose slots are snaplen-sized: with
	// the default 256 KiB snaplen and 2 MiB buffer it holds 8 packets, and srq_pingpong's
	// bursts (16 QPs x 3 packets) overflow it. A 9000-byte snaplen and a 32 MiB buffer
	// (glibc getopt lets these options follow -w) hold thousands.
	c, err := lab.Tcpdump(ctx, path, "-s", "9000", "-B", "32768", "udp", "port", "4791")
	if err != nil {
		t.Fatalf("tcpdump: %v", err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = c.Stop()
		}
	})
	return func() ([]testcap.IPUDP, bool) {
		stopped = true
		if err := c.Stop(); err != nil {
			t.Errorf("tcpdump: %v", err)
		}
		msg := c.Stderr()
		t.Logf("tcpdump: %s", strings.TrimSpace(msg))
		lost := ppDropRe.FindStringSubmatch(msg)
		f, err := os.Open(path)
		if err != nil {
			t.Fatalf("capture: %v", err)
		}
		defer f.Close()
		frames, err := testcap.ReadStream(f)
		if err != nil {
			t.Fatalf("capture: %v", err)
		}
		var out []testcap.IPUDP
		for i := range frames {
			if d, ok := testcap.DecodeIPUDP(&frames[i]); ok {
				out = append(out, d)
			}
		}
		if keep := os.Getenv("INTEROP_KEEP_PCAP"); keep != "" {
			b, _ := os.ReadFile(path)
			_ = os.WriteFile(filepath.Join(keep, strings.NewReplacer("/", "_", ">", "").Replace(t.Name())+".pcap"), b, 0o644)
		}
		decodeClean(t, path, len(out)) // the same capture through `softroce decode`
		return out, lost != nil && lost[1] != "0"
	}
}

var ppDropRe = regexp.MustCompile(`(\d+) packets? dropped by kernel`)
