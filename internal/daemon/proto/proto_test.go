package proto

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/qp"
)

func TestPostSendRoundTrip(t *testing.T) {
	ah := &qp.AH{AHAttr: qp.AHAttr{DGID: netip.MustParseAddr("10.0.0.2"), SGIDIndex: 1, HopLimit: 64, TrafficClass: 3, SL: 2, FlowLabel: 0x12345}}
	in := []qp.SendWR{
		{WRID: 1, Opcode: qp.WRRDMAWriteWithImm, Flags: qp.SendSignaled | qp.SendFence, Imm: 7, RemoteAddr: 0x1000, RKey: 9,
			SGL: []qp.SGE{{Addr: 1, Length: 2, LKey: 3}, {Addr: 4, Length: 5, LKey: 6}}},
		{WRID: 2, Opcode: qp.WRSend, AH: ah, RemoteQPN: 0x11, RemoteQKey: 0x1234},
		{WRID: 3, Opcode: qp.WRAtomicCmpAndSwp, CompareAdd: 5, Swap: 6, SGL: []qp.SGE{{Addr: 8, Length: 8, LKey: 1}}},
		{WRID: 4, Opcode: qp.WRFlush, RemoteAddr: 0x2000, RKey: 10, FlushLength: 0xfedcba98, FlushType: qp.FlushPersistent | qp.FlushGlobal,
			FlushLevel: qp.FlushMR},
		{WRID: 5, Opcode: qp.WRAtomicWrite, RemoteAddr: 0x3008, RKey: 11, SGL: []qp.SGE{{Addr: 16, Length: 8, LKey: 1}}},
	}
	b, err := AppendPostSend(nil, OpPostSend, 42, in)
	if err != nil {
		t.Fatal(err)
	}
	h, n, rest, err := PostHeader(b)
	if err != nil || h != 42 || n != len(in) {
		t.Fatalf("header %d %d %v", h, n, err)
	}
	var d SendDecoder
	out, err := d.Decode(rest, n)
	if err != nil {
		t.Fatal(err)
	}
	for i := range in {
		w, g := in[i], out[i]
		if g.WRID != w.WRID || g.Opcode != w.Opcode || g.Flags != w.Flags || g.Imm != w.Imm || g.RemoteAddr != w.RemoteAddr ||
			g.RKey != w.RKey || g.CompareAdd != w.CompareAdd || g.Swap != w.Swap || g.RemoteQPN != w.RemoteQPN ||
			g.RemoteQKey != w.RemoteQKey || len(g.SGL) != len(w.SGL) || g.FlushLength != w.FlushLength ||
			g.FlushType != w.FlushType || g.FlushLevel != w.FlushLevel {
			t.Fatalf("WR %d: %+v, want %+v", i, g, w)
		}
		for j := range w.SGL {
			if g.SGL[j] != w.SGL[j] {
				t.Fatalf("WR %d SGE %d: %+v", i, j, g.SGL[j])
			}
		}
		if (w.AH == nil) != (g.AH == nil) || (w.AH != nil && (g.AH.AHAttr.DGID != w.AH.DGID || g.AH.SGIDIndex != 1 ||
			g.AH.HopLimit != 64 || g.AH.TrafficClass != 3 || g.AH.SL != 2 || g.AH.FlowLabel != 0x12345 || g.AH.SGID.IsValid())) {
			t.Fatalf("WR %d AH %+v", i, g.AH)
		}
	}
	if _, err := AppendPostSend(nil, OpPostSend, 1, []qp.SendWR{{Opcode: qp.WRBindMW}}); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("BIND_MW: %v", err)
	}
	// Zero allocations once the decoder's buffers have grown.
	if a := testing.AllocsPerRun(100, func() { d.Decode(rest, n) }); a != 0 {
		t.Fatalf("%v allocations per decode", a)
	}
}

func TestRecvRoundTripAndWC(t *testing.T) {
	in := []qp.RecvWR{{WRID: 9, SGL: []qp.SGE{{Addr: 1, Length: 2, LKey: 3}}}, {WRID: 10}}
	b, _ := AppendPostRecv(nil, OpPostRecv, 5, in)
	_, n, rest, _ := PostHeader(b)
	var d RecvDecoder
	out, err := d.Decode(rest, n)
	if err != nil || len(out) != 2 || out[0].WRID != 9 || out[0].SGL[0] != in[0].SGL[0] || out[1].WRID != 10 || len(out[1].SGL) != 0 {
		t.Fatalf("%+v %v", out, err)
	}
	wc := cq.WC{WRID: 1 << 60, Status: cq.StatusRemAccessErr, Opcode: cq.OpRecvRDMAWithImm, VendorErr: 7, ByteLen: 65536,
		ImmData: 0xdeadbeef, InvalidatedRKey: 4, QPNum: 0x123456, SrcQP: 0x11, Flags: cq.FlagWithImm, PKeyIndex: 1, SLID: 2, SL: 3, DLIDPathBits: 4}
	buf := make([]byte, RingEntrySize)
	EncodeWC(buf, &wc)
	var got cq.WC
	DecodeWC(buf, &got)
	if got != wc {
		t.Fatalf("WC %+v, want %+v", got, wc)
	}
}

func TestRingCorruptHead(t *testing.T) {
	mem := make([]byte, RingBytes(8))
	r, ok := NewRing(mem, 8)
	if !ok {
		t.Fatal("ring")
	}
	if r.Space(0) != 8 {
		t.Fatal("empty ring space")
	}
	r.Consume(1 << 40) // a client writes garbage
	if r.Space(5) != 0 {
		t.Fatal("a corrupt head must read as a full ring")
	}
	r.Consume(3)
	if r.Space(5) != 6 {
		t.Fatalf("space %d", r.Space(5))
	}
	if _, ok := NewRing(mem, 6); ok {
		t.Fatal("non-power-of-two capacity accepted")
	}
}

// FuzzDecode: arbitrary post messages (from a client) never panic the
// daemon's decoders, and what decodes re-encodes to the same bytes.
func FuzzDecode(f *testing.F) {
	b, _ := AppendPostSend(nil, OpPostSend, 1, []qp.SendWR{{WRID: 1, SGL: []qp.SGE{{Addr: 1, Length: 2, LKey: 3}}}})
	f.Add(b)
	r, _ := AppendPostRecv(nil, OpPostRecv, 1, []qp.RecvWR{{WRID: 1, SGL: []qp.SGE{{Addr: 1}}}})
	f.Add(r)
	f.Add([]byte{byte(OpPostSend), 1, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f})
	f.Fuzz(func(t *testing.T, msg []byte) {
		h, n, rest, err := PostHeader(msg)
		if err != nil {
			return
		}
		var sd SendDecoder
		if wrs, err := sd.Decode(rest, n); err == nil {
			again, err := AppendPostSend(nil, Op(msg[0]), h, wrs)
			if err == nil && len(again) == len(msg) && !bytes.Equal(again[postHdr:], msg[postHdr:]) {
				// Reserved/unused bytes may differ; the decoded WRs must match.
				var sd2 SendDecoder
				w2, err := sd2.Decode(again[postHdr:], n)
				if err != nil || len(w2) != len(wrs) {
					t.Fatalf("re-decode: %v", err)
				}
			}
		}
		var rd RecvDecoder
		rd.Decode(rest, n)
	})
}
