package bth

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"
)

// addCaptureSeeds adds the UDP payloads of a few packets per capture.
func addCaptureSeeds(f *testing.F, add func(udp []byte)) {
	for _, frames := range captureFrames(f) {
		for i := 0; i < len(frames) && i < 4; i++ {
			add(frames[i].UDPPayload)
		}
	}
	r := rand.New(rand.NewPCG(40, 41))
	for _, op := range validOpcodes() {
		info := op.Info()
		pad := 0
		if info.Payload {
			pad = 1
		}
		add(buildPacket(r, op, payloadLenFor(r, info), pad))
	}
}

// FuzzParse: Parse never panics; what it accepts is self-consistent (an RC
// Acknowledge's SACK extension included) and re-encodes, header by header, to
// the same bytes (pad bytes aside).
func FuzzParse(f *testing.F) {
	addCaptureSeeds(f, func(b []byte) { f.Add(b) })
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := Parse(b)
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("error %T is not a *ParseError", err)
			}
			for _, s := range []error{ErrTruncated, ErrBadTVer, ErrUnknownOpcode, ErrBadPad, ErrBadLength} {
				if errors.Is(err, s) {
					return
				}
			}
			t.Fatalf("error %v wraps no sentinel", err)
		}
		info := p.Info
		if !info.Valid || p.BTH.TVer() != 0 || info.HdrLen+len(p.SACK)+len(p.Payload)+p.Pad+ICRCSize != len(b) {
			t.Fatalf("inconsistent packet: %v hdr %d SACK %d payload %d pad %d len %d", info.Name, info.HdrLen, len(p.SACK), len(p.Payload), p.Pad, len(b))
		}
		if p.SACK != nil && (info.Kind != KindAck || len(p.SACK) != SACKSize) {
			t.Fatalf("%v parsed with a SACK of %d bytes", info.Name, len(p.SACK))
		}
		re := reencode(t, &p)
		if info.Kind == KindCNP {
			copy(re[BTHSize:], b[BTHSize:BTHSize+CNPResvSize])
		}
		end := len(b) - ICRCSize
		copy(re[end-p.Pad:end], b[end-p.Pad:end])
		if !bytes.Equal(re, b) {
			t.Fatalf("re-encode differs:\n%x\n%x", re, b)
		}
	})
}

// FuzzSolveIPv4ID: for any payload and ID, SolveIPv4ID recovers the ID the
// ICRC was computed with (IPv4) and the ICRC functions never panic on
// arbitrary input (including as a whole IP packet).
func FuzzSolveIPv4ID(f *testing.F) {
	addCaptureSeeds(f, func(b []byte) { f.Add(b, uint16(0xDF78), false) })
	f.Add([]byte{}, uint16(0), true)
	f.Fuzz(func(t *testing.T, b []byte, id uint16, v6 bool) {
		_, _ = ICRCFromIP(b)
		ep := Endpoints{Src: netip.MustParseAddr("198.19.0.1"), Dst: netip.MustParseAddr("198.19.0.2"),
			SrcPort: 49441, DstPort: UDPPort, IPID: id}
		if v6 {
			ep.Src, ep.Dst = netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8::2")
		}
		b = append([]byte(nil), b...)
		SetICRC(b, ICRC(&ep, b))
		got, ok := SolveIPv4ID(&ep, b)
		switch {
		case len(b) < BTHSize+ICRCSize:
			if ok {
				t.Fatal("short input accepted")
			}
		case v6:
			if !ok || got != 0 || !VerifyICRC(&ep, b) {
				t.Fatalf("IPv6: %v %v", got, ok)
			}
		default:
			if !ok || got != id {
				t.Fatalf("SolveIPv4ID = %#x %v, want %#x", got, ok, id)
			}
		}
	})
}
