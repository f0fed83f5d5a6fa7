package bth

import (
	"encoding/binary"
	"testing"

	"github.com/softroce/softroce/internal/testcap"
)

func TestSourcePortKnownValues(t *testing.T) {
	// From the capture README: QPN 0x11<->0x11: 49441; 0x11 -> 0xabc: 63102;
	// UD QPN 0x14: 59626.
	if p := SourcePort(0x11, 0x11); p != 49441 {
		t.Errorf("SourcePort(0x11,0x11) = %d", p)
	}
	if p := SourcePort(0x11, 0xABC); p != 63102 {
		t.Errorf("SourcePort(0x11,0xabc) = %d", p)
	}
	if p := UDSourcePort(0x14); p != 59626 {
		t.Errorf("UDSourcePort(0x14) = %d", p)
	}
	if FlowLabel(0x11, 0xABC) != FlowLabel(0xABC, 0x11) {
		t.Error("FlowLabel not symmetric")
	}
	// Large QPNs exercise the folds: v = 0xFFFFFF^2.
	v := uint64(0xFFFFFF) * 0xFFFFFF
	v ^= v >> 20
	v ^= v >> 40
	if FlowLabel(0xFFFFFF, 0xFFFFFF) != uint32(v&0xFFFFF) {
		t.Error("fold")
	}
	for q := uint32(0); q < 5000; q += 7 {
		if p := SourcePort(q, q*3+1); p < 0xC000 {
			t.Fatalf("SourcePort %d below 0xC000", p)
		}
		if p := UDSourcePort(q); p < 0xC000 {
			t.Fatalf("UDSourcePort %d below 0xC000", p)
		}
	}
}

// cmREQPorts finds the rdma_cm CM REQ (a UD SEND to QP1 carrying a MAD with
// attribute 0x0010) in frames and returns the CMA header port (active side)
// and the service port (low 16 bits of the service ID).
func cmREQPorts(t *testing.T, frames []testcap.Frame) (sport, dport uint16, ok bool) {
	for _, f := range frames {
		p, err := Parse(f.UDPPayload)
		if err != nil || p.DETH == nil || p.BTH.DestQP() != 1 || len(p.Payload) < 24+140+4 {
			continue
		}
		mad := p.Payload
		if binary.BigEndian.Uint16(mad[16:]) != 0x0010 { // ConnectRequest
			continue
		}
		req := mad[24:]
		sid := binary.BigEndian.Uint64(req[8:])
		cma := req[140:]
		return binary.BigEndian.Uint16(cma[2:]), uint16(sid), true
	}
	return 0, 0, false
}

// TestSourcePortCaptures asserts the UDP source port of every captured RoCE
// packet from kernel rxe 6.1:
//   - UD (and the rdma_cm MADs on QP1): UDSourcePort(DETH.SrcQP);
//   - RC/UC set up with ibverbs: SourcePort(local QPN, remote QPN), the
//     local QPN being the DestQP of the packets in the other direction;
//   - RC set up by rdma_cm: FlowLabelToSourcePort(CMFlowLabel(REQ ports)).
//
// host-to-guest-rc.pcap's host side is a Python UDP socket bound to 4791.
func TestSourcePortCaptures(t *testing.T) {
	// Captures with one direction only: the local QPN comes from the
	// out-of-band exchange (guest-to-host-rc.txt frame 4:
	// "0000:000011:3ee086:..."); the IPv6 run is the same guest setup.
	oneWayLocal := map[string]uint32{"guest-to-host-rc.pcap": 0x11, "guest-to-host-rc-ipv6.pcap": 0x11}
	checked := 0
	for name, frames := range captureFrames(t) {
		// DestQPs seen per direction.
		dq := map[[2]string]map[uint32]bool{}
		for _, f := range frames {
			k := [2]string{f.Src.String(), f.Dst.String()}
			if dq[k] == nil {
				dq[k] = map[uint32]bool{}
			}
			p, err := Parse(f.UDPPayload)
			if err != nil {
				t.Fatal(err)
			}
			if p.DETH == nil {
				dq[k][p.BTH.DestQP()] = true
			}
		}
		cmS, cmD, isCM := cmREQPorts(t, frames)
		for _, f := range frames {
			p, _ := Parse(f.UDPPayload)
			switch {
			case name == "host-to-guest-rc.pcap" && f.Src.String() == "198.18.0.1":
				if f.SrcPort != UDPPort {
					t.Fatalf("%s frame %d: host sport %d", name, f.Number, f.SrcPort)
				}
			case p.DETH != nil:
				if want := UDSourcePort(p.DETH.SrcQP()); f.SrcPort != want {
					t.Fatalf("%s frame %d: UD sport %d, want %d (SrcQP %#x)", name, f.Number, f.SrcPort, want, p.DETH.SrcQP())
				}
			case isCM:
				if want := FlowLabelToSourcePort(CMFlowLabel(cmS, cmD)); f.SrcPort != want {
					t.Fatalf("%s frame %d: rdma_cm sport %d, want %d", name, f.Number, f.SrcPort, want)
				}
			default:
				rev := dq[[2]string{f.Dst.String(), f.Src.String()}]
				if len(rev) == 0 {
					q, ok := oneWayLocal[name]
					if !ok {
						t.Fatalf("%s: no reverse traffic and no known local QPN", name)
					}
					rev = map[uint32]bool{q: true}
				}
				match := false
				for l := range rev {
					if SourcePort(l, p.BTH.DestQP()) == f.SrcPort {
						match = true
					}
				}
				if !match || (len(rev) > 1 && name != "srq_pingpong.pcap") {
					t.Fatalf("%s frame %d: sport %d not SourcePort(local, %#x) for local in %v", name, f.Number, f.SrcPort, p.BTH.DestQP(), rev)
				}
			}
			checked++
		}
	}
	t.Logf("%d source ports checked", checked)
}
