package rocetest

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/softroce/softroce/pkg/bth"
)

// The negative-test knobs of Spec (conformance bench): each breaks exactly one rule and
// leaves the ICRC valid for what is sent (unless the knob is about the ICRC).
func TestSpecNegativeKnobs(t *testing.T) {
	ep := bth.Endpoints{Src: netip.MustParseAddr("198.18.0.1"), Dst: netip.MustParseAddr("198.18.0.2"), SrcPort: 4791, DstPort: 4791}
	base := Spec{Opcode: bth.OpRCSendOnly, DestQP: 0x11, PSN: 5, AckReq: true, Payload: []byte{1, 2, 3, 4, 5}}

	s := base
	s.TVer = 1
	b, err := s.Append(nil, &ep)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bth.Parse(b); !errors.Is(err, bth.ErrBadTVer) {
		t.Errorf("TVer 1: Parse error %v, want ErrBadTVer", err)
	}
	if !bth.VerifyICRC(&ep, b) {
		t.Error("TVer 1: ICRC not valid")
	}

	s = base
	s.PadCnt = new(uint8)
	*s.PadCnt = 0
	b, _ = s.Append(nil, &ep)
	if got := bth.BTH(b).PadCnt(); got != 0 || len(b) != bth.BTHSize+8+bth.ICRCSize {
		t.Errorf("PadCnt override: pad %d, length %d", got, len(b))
	}

	s = base
	s.FECN, s.BECN, s.MigReq = true, true, true
	b, _ = s.Append(nil, &ep)
	if f := bth.BTH(b).Fields(); !f.FECN || !f.BECN || !f.MigReq || !bth.VerifyICRC(&ep, b) {
		t.Errorf("FECN/BECN/MigReq: %+v, ICRC ok %v", f, bth.VerifyICRC(&ep, b))
	}

	s = base
	s.Mutate = func(p []byte) []byte { return p[:10] }
	b, _ = s.Append([]byte{0xEE}, &ep)
	if len(b) != 11 || b[0] != 0xEE || bth.GetICRC(b[1:]) != bth.ICRC(&ep, b[1:]) {
		t.Errorf("Mutate to 10 bytes: %d bytes, ICRC %#x, computed %#x", len(b), bth.GetICRC(b[1:]), bth.ICRC(&ep, b[1:]))
	}
	if _, err := bth.Parse(b[1:]); err == nil {
		t.Error("a 10-byte packet parsed")
	}

	s = base
	s.ICRCIPID = 1
	b, _ = s.Append(nil, &ep)
	if bth.VerifyICRC(&ep, b) {
		t.Error("ICRCIPID 1: ICRC verifies for ID 0")
	}
	ep1 := ep
	ep1.IPID = 1
	if !bth.VerifyICRC(&ep1, b) {
		t.Error("ICRCIPID 1: ICRC does not verify for ID 1")
	}
}
