//go:build interop

package interop

// softroce perf -R (internal/tools/perf cm.go) against perftest 6.06's ib_send_bw -R,
// ib_write_bw -R, ib_read_bw -R and ib_atomic_bw -R on kernel rxe, both directions: the exchange runs over an RC QP that
// rdma_cm connects on port 18515 (no TCP at all) and the data QPs are connected by rdma_cm
// too (kernel rdma_cm in the guest, pkg/rdmacm here).
//
// Each pairing checks both exit statuses, both outputs (address lines crossed, the result
// table, the rdma_cm banner lines; for WRITE BW the server prints exactly the client's report,
// which crossed the rdma_cm exchange), and the tap: every RoCE packet's ICRC verifies over its
// real IP header (IBTA A17.3.3) and carries DF, CM MADs (UD SEND ONLY to QP 1, IBTA 12.6 /
// 13.4) connect the exchange and each data QP (REQ, REP, RTU at least, IBTA 12.9), and the
// client sent the test's messages (IBTA 9.2.1 opcodes: WRITE and SEND counted at their last
// packet, READ requests, atomics) in the number asked.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/testcap"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/test/rxelab"
)

func init() {
	var cases []pfCase
	for _, size := range []int{64, 3000} {
		for _, v := range []string{"write", "send"} {
			cases = append(cases, pfCase{Verb: v, Size: size, Iters: 200})
		}
	}
	cases = append(cases, pfCase{Verb: "write", Size: 3000, Iters: 100, QPs: 2}, pfCase{Verb: "send", Size: 3000, Iters: 100, QPs: 2},
		pfCase{Verb: "read", Size: 3000, Iters: 200}, pfCase{Verb: "atomic", Iters: 200, Atomic: "FETCH_AND_ADD"},
		// softroce's side through a softroce daemon
		pfCase{Verb: "write", Size: 3000, Iters: 200, Daemon: true}, pfCase{Verb: "send", Size: 3000, Iters: 200, Daemon: true})
	for _, c := range cases {
		c := c
		name := "perftest-R-" + strings.TrimPrefix(c.name(), "perftest-")
		pairings = append(pairings,
			pairing{Name: name, Direction: SoftroceToRxe, Run: func(t *testing.T, lab *rxelab.Lab) { pfcmInterop(t, lab, c, true) }},
			pairing{Name: name, Direction: RxeToSoftroce, Run: func(t *testing.T, lab *rxelab.Lab) { pfcmInterop(t, lab, c, false) }},
		)
	}
}

// pfcmInterop runs one -R pairing; client tells whether softroce is the client.
func pfcmInterop(t *testing.T, lab *rxelab.Lab, c pfCase, client bool) {
	bin := buildSoftroce(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	daemonArgs := labDaemonArgs(t, ctx, lab, bin, c.Daemon, c.net())
	stopCapture := ppStartCapture(t, lab)

	flags := "-R " + c.flags()
	guestCmd := fmt.Sprintf("%s -d %s %s", c.tool(), rxelab.GuestDev, flags)
	ourArgs := []string{"perf", c.Verb, "-d", rxelab.HostIP, "--timeout", "30s", "--run-timeout", "60s"}
	ourArgs = append(ourArgs, strings.Fields(flags)...)
	ourArgs = append(ourArgs, daemonArgs...)
	if client {
		ourArgs = append(ourArgs, rxelab.GuestIP)
	} else {
		guestCmd += " " + rxelab.HostIP
	}

	// perftest prints the waiting banner right before rdma_bind_addr/rdma_listen; our
	// client retries a refused request 10 times 100 ms apart (as perftest's), far longer
	// than that gap, but not as long as the guest tool takes to start. Our server listens
	// before it prints the banner.
	r := runPair(ctx, t, lab, bin, pairSpec{Client: client, Ours: ourArgs, Guest: guestCmd,
		OurReady: "Waiting for client to connect", GuestReady: "Waiting for client to connect", GuestTimeout: 90 * time.Second})
	wantExit0(t, "softroce perf", r.OurStatus)
	wantExit0(t, "guest "+c.tool(), r.GuestStatus)
	if r.OurErr != "" {
		t.Errorf("softroce stderr: %q", r.OurErr)
	}
	for who, out := range map[string]string{"softroce": r.OurOut, "rxe": r.GuestOut} {
		if !strings.Contains(out, "rdma_cm QPs\t : ON") || !strings.Contains(out, "Data ex. method : rdma_cm") {
			t.Errorf("%s: no rdma_cm banner lines", who)
		}
	}
	pfCheckOutputs(t, c, client, r.OurOut, r.GuestOut)
	wire, lost := stopCapture()
	pfcmCheckWire(t, c, client, wire, lost)
}

// pfcmCheckWire: ICRC over the real headers and DF on every packet; CM MADs as UD SEND ONLY
// to QP 1, at least REQ+REP+RTU per connection (the exchange and each data QP); everything
// else RC, with the client's test messages (WRITE or SEND, counted at their last packet)
// at least iters x QPs.
func pfcmCheckWire(t *testing.T, c pfCase, client bool, wire []testcap.IPUDP, lost bool) {
	t.Helper()
	requester := hostIP
	if !client {
		requester = guestIP
	}
	bad, mads, msgs := 0, 0, 0
	kinds := map[string]int{}
	want := map[string]bth.OpKind{"write": bth.KindWrite, "send": bth.KindSend, "read": bth.KindReadReq, "atomic": bth.KindFetchAdd}[c.Verb]
	if c.Atomic == "CMP_AND_SWAP" {
		want = bth.KindCmpSwap
	}
	for _, d := range wire {
		if !checkICRC(t, d, &bad) {
			continue
		}
		if !d.DF {
			t.Errorf("%v -> %v id %d without DF", d.Src, d.Dst, d.ID)
		}
		p, err := bth.Parse(d.Payload)
		if err != nil {
			t.Errorf("captured %v -> %v: %v", d.Src, d.Dst, err)
			continue
		}
		kinds[p.BTH.Opcode().String()]++
		switch p.Info.Transport {
		case bth.TransportUD:
			if p.BTH.DestQP() != 1 || p.Info.Kind != bth.KindSend {
				t.Errorf("%v -> %v: UD %v to QP %d (only CM MADs to QP 1 expected)", d.Src, d.Dst, p.BTH.Opcode(), p.BTH.DestQP())
			}
			mads++
		case bth.TransportRC:
			if d.Src == requester && p.Info.Kind == want && (p.Info.Last || c.Verb == "read" || c.Verb == "atomic") {
				msgs++
			}
		default:
			t.Errorf("%v -> %v: %v on an RC test", d.Src, d.Dst, p.BTH.Opcode())
		}
	}
	minMsgs, minMADs := c.Iters*c.qps(), 3*(1+c.qps())
	if lost {
		minMsgs, minMADs = 1, 1
		t.Logf("tcpdump dropped packets: counts not checked")
	}
	if mads < minMADs {
		t.Errorf("%d CM MADs on the wire, want >= %d", mads, minMADs)
	}
	if msgs < minMsgs {
		t.Errorf("the client (%v) sent %d %s messages, want >= %d", requester, msgs, c.Verb, minMsgs)
	}
	t.Logf("wire: %d RoCE packets %v; %d CM MADs, %d %s messages from the client; %d bad ICRCs", len(wire), kinds, mads, msgs, c.Verb, bad)
}
