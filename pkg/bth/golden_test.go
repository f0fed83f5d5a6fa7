package bth

import (
	"bytes"
	"path/filepath"
	"testing"

	"github.com/softroce/softroce/internal/testcap"
)

const capturesDir = "../../testdata/captures"

// captureFrames returns the RoCE frames of every capture, by file name.
func captureFrames(t testing.TB) map[string][]testcap.Frame {
	t.Helper()
	files, err := testcap.Files(capturesDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 18 {
		t.Fatalf("found %d captures in %s, want the 18 reference captures", len(files), capturesDir)
	}
	out := make(map[string][]testcap.Frame)
	for _, f := range files {
		fr, err := testcap.ReadRoCE(f)
		if err != nil {
			t.Fatal(err)
		}
		if len(fr) == 0 {
			t.Fatalf("%s: no RoCE frames", f)
		}
		out[filepath.Base(f)] = fr
	}
	return out
}

func endpointsOf(f *testcap.Frame) Endpoints {
	return Endpoints{Src: f.Src, Dst: f.Dst, SrcPort: f.SrcPort, DstPort: f.DstPort, IPID: f.IPv4ID}
}

// reencode builds a fresh buffer header by header from the parsed Fields and
// returns it (payload, pad and ICRC copied).
func reencode(t testing.TB, p *Packet) []byte {
	t.Helper()
	info := p.Info
	out := make([]byte, 0, 64+len(p.Payload))
	grow := func(n int) []byte {
		out = append(out, make([]byte, n)...)
		return out[len(out)-n:]
	}
	bf := p.BTH.Fields()
	BTH(grow(BTHSize)).Encode(&bf)
	if p.RDETH != nil {
		RDETH(grow(RDETHSize)).SetEEContext(p.RDETH.EEContext())
		out[len(out)-RDETHSize] = p.RDETH[0]
	}
	if p.DETH != nil {
		f := p.DETH.Fields()
		DETH(grow(DETHSize)).Encode(&f)
	}
	if p.XRCETH != nil {
		XRCETH(grow(XRCETHSize)).SetXRCSRQ(p.XRCETH.XRCSRQ())
		out[len(out)-XRCETHSize] = p.XRCETH[0]
	}
	if p.FETH != nil {
		f := p.FETH.Fields()
		FETH(grow(FETHSize)).Encode(&f)
	}
	if p.RETH != nil {
		f := p.RETH.Fields()
		RETH(grow(RETHSize)).Encode(&f)
	}
	if p.AtomicETH != nil {
		f := p.AtomicETH.Fields()
		AtomicETH(grow(AtomicETHSize)).Encode(&f)
	}
	if p.AETH != nil {
		f := p.AETH.Fields()
		AETH(grow(AETHSize)).Encode(&f)
	}
	if p.AtomicAck != nil {
		f := p.AtomicAck.Fields()
		AtomicAckETH(grow(AtomicAckETHSize)).Encode(&f)
	}
	if p.ImmDt != nil {
		f := p.ImmDt.Fields()
		ImmDt(grow(ImmDtSize)).Encode(&f)
	}
	if p.IETH != nil {
		f := p.IETH.Fields()
		IETH(grow(IETHSize)).Encode(&f)
	}
	if info.Kind == KindCNP {
		grow(CNPResvSize) // reserved bytes are not parsed; the test copies them below
	}
	if len(out) != info.HdrLen {
		t.Fatalf("%v: re-encoded headers are %d bytes, table says %d", info.Name, len(out), info.HdrLen)
	}
	if p.SACK != nil {
		f := p.SACK.Fields()
		SACK(grow(SACKSize)).Encode(&f)
		out[len(out)-SACKSize] = p.SACK[0] // reserved: not a field
	}
	out = append(out, p.Payload...)
	grow(p.Pad)
	out = append(out, p.ICRC...)
	return out
}

func TestGoldenCaptures(t *testing.T) {
	total, v6 := 0, 0
	for name, frames := range captureFrames(t) {
		for i := range frames {
			f := &frames[i]
			total++
			p, err := Parse(f.UDPPayload)
			if err != nil {
				t.Fatalf("%s frame %d: Parse: %v", name, f.Number, err)
			}
			// ICRC recomputed from the whole IP packet.
			c, err := ICRCFromIP(f.IP)
			if err != nil {
				t.Fatalf("%s frame %d: ICRCFromIP: %v", name, f.Number, err)
			}
			if c != GetICRC(f.UDPPayload) {
				t.Fatalf("%s frame %d: ICRCFromIP %#08x, captured %#08x", name, f.Number, c, GetICRC(f.UDPPayload))
			}
			// From the endpoints, including the captured IP ID.
			ep := endpointsOf(f)
			if !VerifyICRC(&ep, f.UDPPayload) {
				t.Fatalf("%s frame %d: VerifyICRC failed (id %#04x)", name, f.Number, f.IPv4ID)
			}
			if f.IsIPv6 {
				v6++
			} else if f.IPv4ID != 0 {
				// The ID is covered: the wrong ID must fail.
				ep.IPID = 0
				if VerifyICRC(&ep, f.UDPPayload) {
					t.Fatalf("%s frame %d: ICRC does not depend on the IP ID", name, f.Number)
				}
			}
			// Split form.
			if got := ICRCContinue(PseudoHeaderCRC(&ep, len(f.UDPPayload)), f.UDPPayload); got != ICRC(&ep, f.UDPPayload) {
				t.Fatalf("%s frame %d: split ICRC %#x != ICRC %#x", name, f.Number, got, ICRC(&ep, f.UDPPayload))
			}
			// Re-encode every header from its Fields.
			re := reencode(t, &p)
			if p.Info.Kind == KindCNP {
				copy(re[BTHSize:], f.UDPPayload[BTHSize:BTHSize+CNPResvSize])
			}
			if !bytes.Equal(re, f.UDPPayload) {
				t.Fatalf("%s frame %d (%v): re-encoded\n%x\ncaptured\n%x", name, f.Number, p.Info.Name, re, f.UDPPayload)
			}
		}
	}
	if v6 == 0 {
		t.Fatal("no IPv6 RoCE packet covered")
	}
	t.Logf("%d RoCE packets, %d over IPv6", total, v6)
}
