//go:build interop

package interop

// CNPs to kernel rxe (docs/congestion.md, "Against kernel rxe"): rxe implements no congestion
// control and sends its RoCE packets Not-ECT, so nothing marks them on their own. An nftables
// rule in the lab netns sets Congestion Experienced on every RoCE packet rxe sends softroce
// (RFC 3168's CE codepoint in the IPv4 header: the ICRC does not cover the TOS byte, IBTA
// A17.3.3), so softroce's notification point answers with CNPs (BTH opcode 0x81, IBTA A17.9)
// as it would to an RNIC's marked traffic. The pairing is perftest's ib_write_bw both ways:
// rxe as the WRITE requester receives softroce's CNPs and must go on as if they were not there
// (its opcode table has no CNP: the packet is dropped), and as responder it gets them for its
// ACKs. Both tools must finish; with rxe sending the data softroce must have sent CNPs (counted
// on the tap capture), and every captured packet's ICRC must verify.

import (
	"strconv"
	"strings"
	"testing"

	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/test/rxelab"
)

func init() {
	f := []string{"-x", strconv.Itoa(rxelab.GuestGIDIndex), "-m", strconv.Itoa(pathMTU), "-F", "-n", "300", "-s", "16384"}
	c := nmCase{Name: "cnp-perftest-write_bw-16384",
		Guest:  "ib_write_bw -d " + rxelab.GuestDev + " " + strings.Join(f, " "),
		Ours:   append([]string{"perf", "write", "-d", rxelab.HostIP, "--timeout", "60s", "--run-timeout", "150s"}, f...),
		Marker: "Waiting for client to connect", Result: "BW average["}
	pairings = append(pairings,
		pairing{Name: c.Name, Direction: SoftroceToRxe, Run: func(t *testing.T, lab *rxelab.Lab) { cnpInterop(t, lab, c, true) }},
		pairing{Name: c.Name, Direction: RxeToSoftroce, Run: func(t *testing.T, lab *rxelab.Lab) { cnpInterop(t, lab, c, false) }},
	)
}

// hostCEOn marks every RoCE packet from the guest CE in the lab netns until the test ends
// (nftables, before the socket sees it); it returns a func reading how many it marked. The
// test skips without nft.
func hostCEOn(t *testing.T, lab *rxelab.Lab) func() string {
	t.Helper()
	count, err := nftTable(t, lab, "softroce_ce", " chain pre {\n  type filter hook prerouting priority 0; policy accept;\n"+
		"  ip saddr "+rxelab.GuestIP+" udp dport 4791 ip ecn set ce counter\n }\n")
	if err != nil {
		t.Skipf("nft in the lab netns: %v: cannot mark rxe's packets", err)
	}
	return count
}

// cnpInterop runs the pairing; client tells whether softroce is the client (the WRITE
// requester).
func cnpInterop(t *testing.T, lab *rxelab.Lab, c nmCase, client bool) {
	marked := hostCEOn(t, lab)
	n := runNM(t, lab, c, client)
	r, before, after, wire, lost := n.r, n.before, n.after, n.wire, n.lost
	wantExit0(t, "softroce", r.OurStatus)
	wantExit0(t, "guest", r.GuestStatus)
	for who, out := range map[string]string{"softroce": r.OurOut + r.OurErr, "guest": r.GuestOut} {
		if !strings.Contains(out, c.Result) {
			t.Errorf("%s output has no %q result", who, c.Result)
		}
	}
	cnps, other := 0, 0
	for _, d := range wire {
		if d.Src != hostIP {
			continue
		}
		p, err := bth.Parse(d.Payload)
		if err != nil {
			t.Errorf("captured %v -> %v: %v", d.Src, d.Dst, err)
			continue
		}
		if want, err := bth.ICRCFromIP(d.IP); err != nil || bth.GetICRC(d.Payload) != want {
			t.Errorf("captured %v -> %v: ICRC does not verify over the real header (%v)", d.Src, d.Dst, err)
		}
		if p.Info.Kind == bth.KindCNP {
			cnps++
		} else {
			other++
		}
	}
	if !client && cnps == 0 && !lost {
		t.Errorf("softroce sent no CNP for %s CE-marked packets", marked())
	}
	dir := map[bool]string{true: SoftroceToRxe, false: RxeToSoftroce}[client]
	t.Logf("CNP %s %s: rxe packets marked CE %s; softroce sent %d CNPs and %d other packets\n  rxe counters:%s",
		c.Name, dir, marked(), cnps, other, counterDelta(before, after))
	if lost {
		t.Logf("tcpdump dropped packets: the counts are lower bounds")
	}
}
