//go:build interop

package interop

// The placement pairings' wire checks (placement_test.go): the tap capture through `softroce
// decode`, the request/response shapes of ATOMIC WRITE and FLUSH, and the FLUSH ICRC kernel
// rxe computes (docs/interop.md, "IBTA 1.5 memory placement").

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/rocetest"
	"github.com/softroce/softroce/internal/testcap"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/test/rxelab"
)

// plRxeFlush reports whether d is an RC FLUSH carrying kernel rxe's FLUSH ICRC
// (rocetest.RxeFlushICRC) rather than the one IBTA A17.3.3 defines.
func plRxeFlush(d *testcap.IPUDP) bool {
	if len(d.Payload) < bth.BTHSize+bth.ICRCSize || bth.BTH(d.Payload).Opcode() != bth.OpRCFlush {
		return false
	}
	ep := bth.Endpoints{Src: d.Src, Dst: d.Dst, SrcPort: d.SrcPort, DstPort: d.DstPort, IPID: d.ID}
	return bth.GetICRC(d.Payload) == rocetest.RxeFlushICRC(&ep, d.Payload) && !bth.VerifyICRC(&ep, d.Payload)
}

// plStartCapture is ppStartCapture for these pairings: the tap capture, checked by `softroce
// decode` when stopped. Every packet must pass the IBTA ICRC check except FLUSHes carrying
// rxe's ICRC (rxe's own, and softroce's with roce.Options.RxeFlushICRC), which decode must
// name as that variant.
func plStartCapture(t *testing.T, lab *rxelab.Lab) func() ([]testcap.IPUDP, bool) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tap.pcap")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
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
		lost := ppDropRe.FindStringSubmatch(c.Stderr())
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
		variant := 0
		for i := range out {
			if plRxeFlush(&out[i]) {
				variant++
			}
		}
		ds, _, err := runDecode(buildSoftroce(t), path)
		if err != nil {
			t.Error(err)
		} else if ds.RoCE != len(out) || ds.Bad != 0 || ds.RxeFlush != variant || ds.OK != ds.RoCE-variant || ds.Malformed != 0 {
			t.Errorf("softroce decode of the tap capture: %+v, want %d RoCE packets, %d of them FLUSHes with rxe's ICRC, none bad or malformed", ds, len(out), variant)
		}
		t.Logf("softroce decode: %d RoCE packets, ICRC ok %d, bad %d, rxe FLUSH ICRC %d, %d malformed", ds.RoCE, ds.OK, ds.Bad, ds.RxeFlush, ds.Malformed)
		return out, lost != nil && lost[1] != "0"
	}
}

// plCheckWire checks the capture: every RoCE packet's ICRC (a FLUSH's: rxe's variant, which
// softroce sends rxe with roce.Options.RxeFlushICRC); the requester's (from) requests,
// one per expected opcode in order (resends of a PSN allowed); each ATOMIC WRITE and FLUSH
// answered at its PSN by an RDMA READ Response Only with an ACK AETH and no payload
// (IBTA A19.4.1-A19.4.2, as rxe answers), except — when lastRefused — the last request,
// answered by a remote access error NAK (IBTA 9.7.5.2.4).
func plCheckWire(t *testing.T, wire []testcap.IPUDP, lost bool, from netip.Addr, want []bth.Opcode, lastRefused bool) {
	t.Helper()
	if lost {
		t.Logf("tcpdump dropped packets: the wire checks below are skipped")
		return
	}
	type req struct {
		op  bth.Opcode
		psn bth.PSN
	}
	var reqs []req
	seen := map[bth.PSN]bool{}
	resps := map[bth.PSN][]bth.Packet{}
	bad, rxeICRC := 0, 0
	for _, d := range wire {
		if d.DstPort != bth.UDPPort {
			continue
		}
		if plRxeFlush(&d) { // a FLUSH with rxe's ICRC: rxe's, or softroce's towards rxe
			rxeICRC++
		} else if !checkICRC(t, d, &bad) {
			continue
		} else if d.Src == hostIP && len(d.Payload) > 0 && bth.BTH(d.Payload).Opcode() == bth.OpRCFlush {
			t.Errorf("softroce's FLUSH PSN %v carries the A17.3.3 ICRC: roce.Options.RxeFlushICRC not honoured", bth.BTH(d.Payload).PSN())
		}
		p, err := bth.Parse(d.Payload)
		if err != nil {
			t.Errorf("captured %v -> %v: %v", d.Src, d.Dst, err)
			continue
		}
		psn := p.BTH.PSN()
		if d.Src == from {
			if !seen[psn] {
				seen[psn] = true
				reqs = append(reqs, req{p.BTH.Opcode(), psn})
			}
			continue
		}
		resps[psn] = append(resps[psn], p)
	}
	if bad > 0 {
		t.Errorf("%d captured packets with a bad ICRC", bad)
	}
	if len(reqs) != len(want) {
		t.Fatalf("%d requests on the wire %v, want %d (%v)", len(reqs), reqs, len(want), want)
	}
	placed := 0
	for i, r := range reqs {
		if r.op != want[i] {
			t.Errorf("request %d: opcode %v, want %v", i, r.op, want[i])
			continue
		}
		if r.op != bth.OpRCAtomicWrite && r.op != bth.OpRCFlush {
			continue
		}
		rs := resps[r.psn]
		if len(rs) == 0 {
			t.Errorf("%v PSN %v: no response on the wire", r.op, r.psn)
			continue
		}
		p := rs[0]
		if lastRefused && i == len(reqs)-1 {
			if p.BTH.Opcode() != bth.OpRCAck || p.AETH == nil || p.AETH.Syndrome() != bth.SyndromeNAK(bth.NAKRemoteAccessErr) {
				t.Errorf("%v PSN %v: answered by %v, want an ACK packet with a remote access error NAK", r.op, r.psn, p.BTH.Opcode())
			}
			continue
		}
		if p.BTH.Opcode() != bth.OpRCReadRespOnly || len(p.Payload) != 0 || p.AETH == nil ||
			bth.SyndromeType(p.AETH.Syndrome()) != bth.AckTypeACK {
			t.Errorf("%v PSN %v: answered by %v (payload %d bytes), want an RDMA READ Response Only with an ACK AETH and no payload",
				r.op, r.psn, p.BTH.Opcode(), len(p.Payload))
			continue
		}
		placed++
	}
	t.Logf("wire: %d requests %v; %d ATOMIC WRITE/FLUSH answered by an empty READ Response Only with an ACK AETH; %d FLUSH packets with rxe's ICRC", len(reqs), want, placed, rxeICRC)
}
