//go:build interop

package interop

// Lossy-wire pairings (docs/reliability.md, "Against kernel rxe over a lossy wire"): the
// softroce CLI (pingpong, perf: softroce's RC engine) against rdma-core's ibv_rc_pingpong -c
// and perftest's ib_write_bw / ib_read_bw on kernel rxe, both directions, with netem on the
// guest's eth0 (`tc qdisc add dev eth0 root netem loss 5% duplicate 2% reorder 5% delay 1ms`,
// docs/lab.md) and, when the guest kernel has ifb, the same on eth0's ingress through ifb0
// (the host kernel has no sch_netem, so the softroce->rxe direction is made lossy in the
// guest; when the host has nft, 5% of softroce's datagrams are dropped in the lab netns
// instead: loss only). Both tools must finish successfully (pingpong -c checks every byte); the test logs
// rxe's counters (hw_counters, as `rdma statistic show link rxe0/1`) before/after, and the
// retransmissions of each side counted on the host tap capture (request PSNs sent again), and
// every captured packet's ICRC must verify over its real IP header (IBTA A17.3.3).

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/testcap"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/test/rxelab"
)

// netemSpec is the lossy wire.
const netemSpec = "loss 5% duplicate 2% reorder 5% delay 1ms"

// nmCase is one lossy pairing.
type nmCase struct {
	Name string
	// Guest is the guest tool and its flags (without the server address); Ours the softroce
	// CLI arguments (without it).
	Guest string
	Ours  []string
	// Marker is the line our server prints once it listens.
	Marker string
	// Result must appear in both outputs.
	Result string
	// LastACKRace, when set, is the line (e.g. "300 iters in") by which a side reports it
	// completed every iteration, for tools with no closing handshake (ibv_rc_pingpong): when
	// one side printed it and exited 0 and the other failed ONLY with "transport retry counter
	// exceeded" on its send, the failed side's last SEND reached the peer (the peer needed it to
	// count its last iteration; an earlier failed SEND would have moved the QP to the error
	// state and flushed the rest), the peer's ACK of it was lost on the lossy wire, and the peer
	// had destroyed its QP before the retransmission came. Real RNICs do the same; the run is
	// accepted and logged as such. softroce's side runs with --linger, so that rxe's last SEND
	// is acknowledged again when its ACK was lost: rxe retries forever (retry_cnt 7) and would
	// never report the failure this excuses.
	LastACKRace string
}

func init() {
	mtu := strconv.Itoa(pathMTU)
	gid := strconv.Itoa(rxelab.GuestGIDIndex)
	cases := []nmCase{
		{Name: "netem-pingpong-rc-3000x300",
			Guest: "ibv_rc_pingpong -d " + rxelab.GuestDev + " -g " + gid + " -m " + mtu + " -s 3000 -n 300 -c",
			// --linger: rxe retries a SEND whose ACK was lost forever (retry_cnt 7), so a
			// softroce that exits right after its last iteration would leave it hanging
			Ours: []string{"pingpong", "rc", "-d", rxelab.HostIP, "--timeout", "60s", "-m", mtu, "-s", "3000", "-n", "300", "-c",
				"--linger", "3s"},
			Marker: "local address:", Result: "iters in", LastACKRace: "300 iters in"},
	}
	for _, verb := range []string{"write", "read"} {
		f := []string{"-x", gid, "-m", mtu, "-F", "-n", "300", "-s", "16384"}
		cases = append(cases, nmCase{Name: "netem-perftest-" + verb + "_bw-16384",
			Guest:  "ib_" + verb + "_bw -d " + rxelab.GuestDev + " " + strings.Join(f, " "),
			Ours:   append([]string{"perf", verb, "-d", rxelab.HostIP, "--timeout", "60s", "--run-timeout", "150s"}, f...),
			Marker: "Waiting for client to connect", Result: "BW average["})
	}
	// softroce with selective repeat on against kernel rxe, which has none: as requester it
	// reads rxe's plain PSN sequence NAKs and goes back N; as responder its SACKs reach rxe as
	// the standard NAK they begin with (the extension after the AETH is ignored), so rxe goes
	// back N. Both tools must finish as in the plain pairing (docs/reliability.md, "Selective
	// repeat").
	f := []string{"-x", gid, "-m", mtu, "-F", "-n", "300", "-s", "16384"}
	cases = append(cases, nmCase{Name: "netem-perftest-write_bw-16384-sr",
		Guest:  "ib_write_bw -d " + rxelab.GuestDev + " " + strings.Join(f, " "),
		Ours:   append([]string{"perf", "write", "--selective-repeat", "-d", rxelab.HostIP, "--timeout", "60s", "--run-timeout", "150s"}, f...),
		Marker: "Waiting for client to connect", Result: "BW average["})
	for _, c := range cases {
		c := c
		pairings = append(pairings,
			pairing{Name: c.Name, Direction: SoftroceToRxe, Run: func(t *testing.T, lab *rxelab.Lab) { nmInterop(t, lab, c, true) }},
			pairing{Name: c.Name, Direction: RxeToSoftroce, Run: func(t *testing.T, lab *rxelab.Lab) { nmInterop(t, lab, c, false) }},
		)
	}
}

// netemOn makes the guest's eth0 lossy (egress always; ingress through ifb0 if the guest
// kernel can) until the test ends. It reports whether ingress is lossy too.
func netemOn(t *testing.T, lab *rxelab.Lab) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, st, err := lab.Exec(ctx, "modprobe sch_netem 2>/dev/null; tc qdisc replace dev eth0 root netem "+netemSpec+" && tc qdisc show dev eth0",
		rxelab.ExecOptions{Timeout: 30 * time.Second})
	if err != nil || st != 0 {
		t.Fatalf("netem on eth0: status %d %v\n%s", st, err, out)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		out, st, err := lab.Exec(ctx, "tc qdisc del dev eth0 root; tc qdisc del dev eth0 ingress 2>/dev/null; ip link del ifb0 2>/dev/null; tc qdisc show dev eth0",
			rxelab.ExecOptions{Timeout: 30 * time.Second})
		if err != nil {
			t.Errorf("netem off: status %d %v\n%s", st, err, out)
		}
	})
	in := "modprobe ifb numifbs=0 2>/dev/null; modprobe act_mirred 2>/dev/null; modprobe cls_matchall 2>/dev/null; " +
		"ip link add ifb0 type ifb && ip link set ifb0 up && tc qdisc replace dev eth0 ingress && " +
		"tc filter replace dev eth0 parent ffff: matchall action mirred egress redirect dev ifb0 && " +
		"tc qdisc replace dev ifb0 root netem " + netemSpec + " && tc qdisc show dev ifb0"
	out2, st2, err2 := lab.Exec(ctx, in, rxelab.ExecOptions{Timeout: 30 * time.Second})
	ingress := err2 == nil && st2 == 0
	t.Logf("netem egress: %s; ingress via ifb0: %v (%s)", strings.TrimSpace(string(out)), ingress, strings.TrimSpace(string(out2)))
	return ingress
}

// hostLossOn drops 5% of the datagrams softroce sends (198.18.0.1 -> UDP 4791) in the lab
// netns with nftables (numgen random), when the host has nft: the host kernel has no
// sch_netem and the guest kernel no ifb, so this is the only loss on that direction. It
// returns a func reading how many datagrams the rule dropped (nil without nft).
func hostLossOn(t *testing.T, lab *rxelab.Lab) func() string {
	t.Helper()
	count, err := nftTable(t, lab, "softroce_netem", " chain out {\n  type filter hook output priority 0; policy accept;\n"+
		"  ip saddr "+rxelab.HostIP+" udp dport 4791 numgen random mod 100 < 5 counter drop\n }\n")
	if err != nil {
		t.Logf("nft in the lab netns: %v: softroce->rxe datagrams are not dropped", err)
		return nil
	}
	return func() string { return count() + " dropped" }
}

// nftTable adds the nftables table inet NAME with the given chains to the lab netns until the
// test ends, and returns a func reading its rule's packet counter (nft's own words when it
// has none). An error: no nft on the host, or nft refused the table.
func nftTable(t *testing.T, lab *rxelab.Lab, name, chains string) (func() string, error) {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		return nil, err
	}
	nft := func(stdin string, args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cmd := lab.NSCommand(ctx, "nft", args...)
		if stdin != "" {
			cmd.Stdin = strings.NewReader(stdin)
		}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := nft("table inet "+name+" {\n"+chains+"}\n", "-f", "-"); err != nil {
		return nil, fmt.Errorf("%v %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := nft("delete table inet "+name+"\n", "-f", "-"); err != nil {
			t.Errorf("nft cleanup: %v %s", err, out)
		}
	})
	return func() string {
		out, err := nft("", "list", "table", "inet", name)
		if err != nil {
			return err.Error()
		}
		if m := nftCounterRe.FindStringSubmatch(out); m != nil {
			return m[1]
		}
		return strings.TrimSpace(out)
	}, nil
}

var nftCounterRe = regexp.MustCompile(`counter packets (\d+)`)

// rxeCounters reads rxe0's hw_counters (the values `rdma statistic show link rxe0/1` shows).
func rxeCounters(t *testing.T, lab *rxelab.Lab) map[string]uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, st, err := lab.Exec(ctx, "cd /sys/class/infiniband/"+rxelab.GuestDev+"/ports/1/hw_counters && grep -H . *",
		rxelab.ExecOptions{Timeout: 30 * time.Second})
	if err != nil || st != 0 {
		t.Fatalf("rxe counters: status %d %v\n%s", st, err, out)
	}
	m := map[string]uint64{}
	for _, l := range strings.Split(string(out), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(l), ":")
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64); err == nil {
			m[k] = n
		}
	}
	return m
}

// counterDelta formats after-before for the nonzero counters, sorted.
func counterDelta(before, after map[string]uint64) string {
	var names []string
	for k := range after {
		names = append(names, k)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, k := range names {
		if d := after[k] - before[k]; d != 0 {
			fmt.Fprintf(&b, " %s=%d", k, d)
		}
	}
	return b.String()
}

// wireSide is what one address sent, from the tap capture.
type wireSide struct {
	requests, retrans, responses, acks, seqNAKs, rnrNAKs, otherNAKs int
}

// nmWire counts each side's packets; a request whose PSN is not above every PSN seen before
// on its flow (source, destination QP) was sent again (a retransmission, or for rxe's
// packets also a netem duplicate: both pass the tap after the guest's qdisc).
func nmWire(t *testing.T, wire []testcap.IPUDP) map[netip.Addr]*wireSide {
	t.Helper()
	type flow struct {
		src netip.Addr
		qp  uint32
	}
	next := map[flow]bth.PSN{}
	out := map[netip.Addr]*wireSide{hostIP: {}, guestIP: {}}
	bad := 0
	for _, d := range wire {
		s := out[d.Src]
		if s == nil {
			continue
		}
		p, err := bth.Parse(d.Payload)
		if err != nil {
			t.Errorf("captured %v -> %v: %v", d.Src, d.Dst, err)
			continue
		}
		if want, err := bth.ICRCFromIP(d.IP); err != nil || bth.GetICRC(d.Payload) != want {
			if bad++; bad <= 5 {
				t.Errorf("captured %v -> %v id %d: ICRC does not verify over the real header (%v)", d.Src, d.Dst, d.ID, err)
			}
		}
		if !p.Info.Request {
			s.responses++
			if p.Info.Kind == bth.KindAck {
				s.acks++
				syn := p.AETH.Fields().Syndrome
				switch bth.SyndromeType(syn) {
				case bth.AckTypeRNR:
					s.rnrNAKs++
				case bth.AckTypeNAK:
					if bth.SyndromeValue(syn) == bth.NAKPSNSeqErr {
						s.seqNAKs++
					} else {
						s.otherNAKs++
					}
				}
			}
			continue
		}
		s.requests++
		f := flow{d.Src, p.BTH.DestQP()}
		psn := p.BTH.PSN()
		last := psn
		if p.Info.Kind == bth.KindReadReq {
			// a READ request covers one PSN per response packet
			n := (p.RETH.Fields().DMALen + uint32(pathMTU) - 1) / uint32(pathMTU)
			if n > 1 {
				last = psn.Add(n - 1)
			}
		}
		if nx, ok := next[f]; ok && psn.LessThan(nx) {
			s.retrans++
		}
		if nx, ok := next[f]; !ok || nx.LessThan(last.Add(1)) {
			next[f] = last.Add(1)
		}
	}
	return out
}

// nmRun is one run of an nmCase pairing, with rxe's counters around it and the tap capture.
type nmRun struct {
	r             pairResult
	before, after map[string]uint64
	wire          []testcap.IPUDP
	lost          bool // tcpdump dropped packets
	wall          time.Duration
}

// runNM runs pairing c once over the wire as the caller set it up (netem, nftables); client
// tells whether softroce is the client.
func runNM(t *testing.T, lab *rxelab.Lab, c nmCase, client bool) nmRun {
	t.Helper()
	bin := buildSoftroce(t)
	var n nmRun
	n.before = rxeCounters(t, lab)
	ctx, cancel := context.WithTimeout(context.Background(), 240*time.Second)
	defer cancel()
	stopCapture := ppStartCapture(t, lab)
	guestCmd := c.Guest
	ourArgs := append([]string(nil), c.Ours...)
	if client {
		ourArgs = append(ourArgs, rxelab.GuestIP)
	} else {
		guestCmd += " " + rxelab.HostIP
	}
	start := time.Now()
	n.r = runPair(ctx, t, lab, bin, pairSpec{Client: client, Ours: ourArgs, Guest: guestCmd,
		OurReady: c.Marker, GuestTimeout: 200 * time.Second})
	n.wall = time.Since(start)
	n.after = rxeCounters(t, lab)
	n.wire, n.lost = stopCapture()
	return n
}

// nmInterop runs one lossy pairing; client tells whether softroce is the client.
func nmInterop(t *testing.T, lab *rxelab.Lab, c nmCase, client bool) {
	ingress := netemOn(t, lab)
	hostDrops := hostLossOn(t, lab)
	n := runNM(t, lab, c, client)
	r, before, after, wire, lost, wall := n.r, n.before, n.after, n.wire, n.lost, n.wall
	excused := lastACKRace(t, c, r)
	if excused != "softroce" {
		wantExit0(t, "softroce", r.OurStatus)
	}
	if excused != "guest" {
		wantExit0(t, "guest", r.GuestStatus)
	}
	for who, out := range map[string]string{"softroce": r.OurOut + r.OurErr, "guest": r.GuestOut} {
		if who == excused {
			continue
		}
		if !strings.Contains(out, c.Result) {
			t.Errorf("%s output has no %q result", who, c.Result)
		}
		if strings.Contains(out, "invalid data") || strings.Contains(out, "Failed status") {
			t.Errorf("%s reports bad data or a failed completion", who)
		}
	}
	w := nmWire(t, wire)
	if lost {
		t.Logf("tcpdump dropped packets: the wire counts below are lower bounds")
	}
	f := func(s *wireSide) string {
		return fmt.Sprintf("requests %d (sent again %d), responses %d (ACKs %d, seq NAKs %d, RNR NAKs %d, other NAKs %d)",
			s.requests, s.retrans, s.responses, s.acks, s.seqNAKs, s.rnrNAKs, s.otherNAKs)
	}
	host := "off"
	if hostDrops != nil {
		host = "5% (" + hostDrops() + ")"
	}
	t.Logf("NETEM %s %s: wall %v, guest ingress netem %v, softroce->rxe loss %s\n  rxe counters:%s\n  wire softroce (198.18.0.1): %s\n  wire rxe (198.18.0.2): %s",
		c.Name, map[bool]string{true: SoftroceToRxe, false: RxeToSoftroce}[client], wall.Round(time.Millisecond), ingress, host,
		counterDelta(before, after), f(w[hostIP]), f(w[guestIP]))
}

// retryExcLast is the only failure lastACKRace excuses: ibv_rc_pingpong's (and softroce
// pingpong's) report of a send (wr_id 2) completing with IBV_WC_RETRY_EXC_ERR.
const retryExcLast = "Failed status transport retry counter exceeded (12) for wr_id 2"

// lastACKRace returns which side ("softroce" or "guest") failed only because the ACK of its
// last SEND was lost after the peer had finished (nmCase.LastACKRace), or "".
func lastACKRace(t *testing.T, c nmCase, r pairResult) string {
	t.Helper()
	if c.LastACKRace == "" || (r.OurStatus == 0) == (r.GuestStatus == 0) {
		return ""
	}
	failed, failedOut, peerOut := "softroce", r.OurOut+r.OurErr, r.GuestOut
	if r.GuestStatus != 0 {
		failed, failedOut, peerOut = "guest", r.GuestOut, r.OurOut+r.OurErr
	}
	if !strings.Contains(peerOut, c.LastACKRace) || strings.Contains(peerOut, "Failed status") ||
		strings.Count(failedOut, "Failed status") != 1 || !strings.Contains(failedOut, retryExcLast) ||
		strings.Contains(failedOut, "invalid data") || strings.Contains(peerOut, "invalid data") {
		return ""
	}
	t.Logf("LAST-ACK RACE: the peer of %s completed every iteration (%q) and exited; %s's last SEND got no ACK (lost on the lossy wire) before the peer's QP was gone: %q — accepted (nmCase.LastACKRace)",
		failed, c.LastACKRace, failed, retryExcLast)
	return failed
}
