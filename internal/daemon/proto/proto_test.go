package proto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/internal/mr"
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
		{WRID: 6, Opcode: qp.WRBindMW, Flags: qp.SendSignaled, Bind: &qp.BindInfo{MWRKey: 0x1234_56, NewRKey: 0x1234_57,
			MRLKey: 0xabcd_ef, Addr: 0x4000, Length: 1 << 33, Access: 0x2e}},
		{WRID: 7, Opcode: qp.WRLocalInv, InvRKey: 0x1234_57},
		{WRID: 8, Opcode: qp.WRSendWithInv, InvRKey: 0x99_01, SGL: []qp.SGE{{Addr: 24, Length: 4, LKey: 1}}},
	}
	b, err := AppendPostSend(nil, wire.OpPostSend, 42, in)
	if err != nil {
		t.Fatal(err)
	}
	op, h, n, rest, err := PostHeader(b)
	if err != nil || op != wire.OpPostSend || h != 42 || n != len(in) {
		t.Fatalf("header %d %d %d %v", op, h, n, err)
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
			g.FlushType != w.FlushType || g.FlushLevel != w.FlushLevel || g.InvRKey != w.InvRKey ||
			(w.Bind == nil) != (g.Bind == nil) || (w.Bind != nil && *g.Bind != *w.Bind) {
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
	if _, err := AppendPostSend(nil, wire.OpPostSend, 1, []qp.SendWR{{Opcode: qp.WRBindMW}}); !errors.Is(err, qp.ErrWRNoBind) {
		t.Fatalf("BIND_MW without bind: %v", err)
	}
	bind := qp.SendWR{Opcode: qp.WRBindMW, Bind: &qp.BindInfo{MWRKey: 0x100, NewRKey: 0x101}, SGL: []qp.SGE{{Length: 1}}}
	if _, err := AppendPostSend(nil, wire.OpPostSend, 1, []qp.SendWR{bind}); !errors.Is(err, qp.ErrWRTooManySGE) {
		t.Fatalf("BIND_MW with an SGE: %v", err)
	}
	// Zero allocations once the decoder's buffers have grown.
	if a := testing.AllocsPerRun(100, func() { d.Decode(rest, n) }); a != 0 {
		t.Fatalf("%v allocations per decode", a)
	}
}

func TestRecvRoundTripAndWC(t *testing.T) {
	in := []qp.RecvWR{{WRID: 9, SGL: []qp.SGE{{Addr: 1, Length: 2, LKey: 3}}}, {WRID: 10}}
	b, _ := AppendPostRecv(nil, wire.OpPostRecv, 5, in)
	_, _, n, rest, _ := PostHeader(b)
	var d RecvDecoder
	out, err := d.Decode(rest, n)
	if err != nil || len(out) != 2 || out[0].WRID != 9 || out[0].SGL[0] != in[0].SGL[0] || out[1].WRID != 10 || len(out[1].SGL) != 0 {
		t.Fatalf("%+v %v", out, err)
	}
	wc := cq.WC{WRID: 1 << 60, Status: cq.StatusRemAccessErr, Opcode: cq.OpRecvRDMAWithImm, VendorErr: 7, ByteLen: 65536,
		ImmData: 0xdeadbeef, QPNum: 0x123456, SrcQP: 0x11, Flags: cq.FlagWithImm, PKeyIndex: 1, SLID: 2, SL: 3, DLIDPathBits: 4}
	buf := make([]byte, RingEntrySize)
	EncodeWC(buf, &wc)
	var got cq.WC
	DecodeWC(buf, &got)
	if got != wc {
		t.Fatalf("WC %+v, want %+v", got, wc)
	}
	// ibv_wc's layout: the immediate in network byte order where ibv_wc has it.
	var w wire.WC
	wire.Read(buf, &w)
	if w.WRID != wc.WRID || w.Status != uint32(wc.Status) || w.Opcode != 129 || w.ByteLen != 65536 ||
		w.ImmData != binary.NativeEndian.Uint32([]byte{0xde, 0xad, 0xbe, 0xef}) || w.QPNum != 0x123456 ||
		w.WCFlags != 2 || w.SL != 3 || w.DLIDPathBits != 4 {
		t.Fatalf("wire WC %+v", w)
	}
	inv := cq.WC{WRID: 2, Opcode: cq.OpRecv, Flags: cq.FlagWithInv, InvalidatedRKey: 0x1234}
	EncodeWC(buf, &inv)
	DecodeWC(buf, &got)
	if wire.Read(buf, &w); got != inv || w.ImmData != 0x1234 || w.WCFlags != 8 {
		t.Fatalf("WITH_INV: %+v, wire %+v", got, w)
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

// TestRingClean: Clean takes one QP's entries out of the unconsumed ones, across the ring's
// wrap, keeps the others in order, and leaves a corrupt count alone.
func TestRingClean(t *testing.T) {
	mem := make([]byte, RingBytes(8))
	r, ok := NewRing(mem, 8)
	if !ok {
		t.Fatal("ring")
	}
	qpns := []uint32{7, 1, 2, 1, 3, 1, 1} // entries 5..11: across the wrap at 8
	head, tail := uint64(5), uint64(5+len(qpns))
	for i, n := range qpns {
		r.Put(head+uint64(i), &cq.WC{WRID: uint64(i), QPNum: n})
	}
	r.Publish(tail)
	r.Consume(head)
	h := r.Clean(head, tail, 1)
	if h != head+4 {
		t.Fatalf("head %d, want %d", h, head+4)
	}
	var wc cq.WC
	var got []uint64
	for i := h; i != tail; i++ {
		r.Get(i, &wc)
		got = append(got, wc.WRID)
	}
	if fmt.Sprint(got) != "[0 2 4]" {
		t.Fatalf("kept %v, want the WRIDs of QPs 7, 2 and 3 in order", got)
	}
	if r.Clean(h, tail, 9) != h {
		t.Fatal("cleaning a QP with no entries moved the head")
	}
	if r.Clean(0, 1<<40, 7) != 0 {
		t.Fatal("a corrupt count was cleaned")
	}
}

// FuzzDecode: arbitrary post messages (from a client) never panic the
// daemon's decoders, and what decodes re-encodes to a message that decodes to
// the same WRs.
func FuzzDecode(f *testing.F) {
	b, _ := AppendPostSend(nil, wire.OpPostSend, 1, []qp.SendWR{{WRID: 1, SGL: []qp.SGE{{Addr: 1, Length: 2, LKey: 3}}}})
	f.Add(b)
	inl, _ := AppendPostSend(nil, wire.OpPostSend, 1, []qp.SendWR{{WRID: 1, Flags: qp.SendInline, Inline: []byte("0123456789")}})
	f.Add(inl)
	r, _ := AppendPostRecv(nil, wire.OpPostRecv, 1, []qp.RecvWR{{WRID: 1, SGL: []qp.SGE{{Addr: 1}}}})
	f.Add(r)
	f.Add(AppendRequest(nil, wire.OpPostSend, []byte{1, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f}))
	bind, _ := AppendPostSend(nil, wire.OpPostSend, 1, []qp.SendWR{{WRID: 1, Opcode: qp.WRBindMW,
		Bind: &qp.BindInfo{MWRKey: 0x100, NewRKey: 0x1ff, MRLKey: 0x300, Addr: 8, Length: 8, Access: 2}},
		{WRID: 2, Opcode: qp.WRLocalInv, InvRKey: 0x1ff}})
	f.Add(bind)
	f.Fuzz(func(t *testing.T, msg []byte) {
		op, h, n, rest, err := PostHeader(msg)
		if err != nil {
			return
		}
		var sd SendDecoder
		if wrs, err := sd.Decode(rest, n); err == nil {
			again, err := AppendPostSend(nil, op, h, wrs)
			if err != nil {
				return
			}
			_, _, n2, rest2, _ := PostHeader(again)
			var sd2 SendDecoder
			w2, err := sd2.Decode(rest2, n2)
			if err != nil || len(w2) != len(wrs) {
				t.Fatalf("re-decode: %v", err)
			}
			for i := range wrs {
				if w2[i].WRID != wrs[i].WRID || len(w2[i].SGL) != len(wrs[i].SGL) || !bytes.Equal(w2[i].Inline, wrs[i].Inline) ||
					(w2[i].Bind == nil) != (wrs[i].Bind == nil) || (w2[i].Bind != nil && *w2[i].Bind != *wrs[i].Bind) {
					t.Fatalf("WR %d: %+v, then %+v", i, wrs[i], w2[i])
				}
			}
		}
		var rd RecvDecoder
		rd.Decode(rest, n)
	})
}

// TestInlinePost: inline data travels in the message, padded to 8, and a
// malformed inline WR (data without IBV_SEND_INLINE, data and SGEs) is refused.
func TestInlinePost(t *testing.T) {
	in := []qp.SendWR{{WRID: 7, Opcode: qp.WRSend, Flags: qp.SendInline | qp.SendSignaled, Inline: []byte("hello")},
		{WRID: 8, Opcode: qp.WRRDMAWrite, SGL: []qp.SGE{{Addr: 1, Length: 2, LKey: 3}}}}
	b, err := AppendPostSend(nil, wire.OpPostSendAsync, 3, in)
	if err != nil || len(b)%8 != 0 || len(b) != 16+96+8+96+16 {
		t.Fatalf("%d bytes, %v", len(b), err)
	}
	_, _, n, rest, _ := PostHeader(b)
	var d SendDecoder
	out, err := d.Decode(rest, n)
	if err != nil || string(out[0].Inline) != "hello" || len(out[0].SGL) != 0 || out[1].Inline != nil || out[1].SGL[0] != in[1].SGL[0] {
		t.Fatalf("%+v %v", out, err)
	}
	if _, err := AppendPostSend(nil, wire.OpPostSend, 3, []qp.SendWR{{Inline: []byte("x"), SGL: []qp.SGE{{Length: 1}}}}); err == nil {
		t.Fatal("inline data and SGEs accepted")
	}
	b[16+9] = 1 // num_sge with inline data
	if _, err := d.Decode(rest, n); !errors.Is(err, ErrProtocol) {
		t.Fatalf("inline data with an SGE count: %v", err)
	}
	b[16+9] = 0
	ne.PutUint32(b[16+12:], 0) // no IBV_SEND_INLINE
	if _, err := d.Decode(rest, n); !errors.Is(err, ErrProtocol) {
		t.Fatalf("inline data without the flag: %v", err)
	}
	if a := testing.AllocsPerRun(100, func() { AppendPostSend(b[:0], wire.OpPostSend, 3, in) }); a != 0 {
		t.Fatalf("%v allocations per encode", a)
	}
}

// TestErrors: every code maps to its sentinel and errno both ways, and a
// RemoteError matches both with errors.Is.
func TestErrors(t *testing.T) {
	seen := map[wire.Code]bool{}
	for _, c := range codes {
		if seen[c.code] {
			t.Fatalf("code %d twice", c.code)
		}
		seen[c.code] = true
		if got := CodeOf(fmt.Errorf("wrapped: %w", c.err)); got != c.code {
			t.Errorf("CodeOf(%v) = %d, want %d", c.err, got, c.code)
		}
		r := ErrorFrom(c.code.Errno(), c.code, "x")
		if !errors.Is(r, c.err) || !errors.Is(r, c.code.Errno()) || CodeOf(r) != c.code {
			t.Errorf("code %d: remote error does not match %v / %v", c.code, c.err, c.code.Errno())
		}
	}
	if len(seen) != wire.NumCodes-1 {
		t.Fatalf("%d codes mapped, %d defined", len(seen), wire.NumCodes-1)
	}
	if ErrnoOf(errors.New("no code")) != syscall.EIO || ErrnoOf(fmt.Errorf("x: %w", syscall.ENOENT)) != syscall.ENOENT {
		t.Fatal("errno of an error without a code")
	}
	b := AppendError(nil, wire.OpCreateQP, fmt.Errorf("%w: too many", ErrQuota), 3)
	h, body, _ := ParseHdr(b)
	bad, err := ResponseError(h, body)
	if h.Op != wire.OpCreateQP || h.Status != int32(syscall.EDQUOT) || bad != 3 || !errors.Is(err, ErrQuota) ||
		!errors.Is(err, syscall.EDQUOT) || err.Error() != "softroce daemon: limit reached: too many" {
		t.Fatalf("%+v %v %d", h, err, bad)
	}
}

// TestDecodeBindRefusals: a BIND_MW whose new R_Key is not of the window (another index, or 0:
// the client always picks the key byte), with SGEs, or with access bits beyond 32, is refused.
func TestDecodeBindRefusals(t *testing.T) {
	enc := func(sw wire.SendWR, extra ...wire.SGE) []byte {
		b := wire.Append(nil, &sw)
		for i := range extra {
			b = wire.Append(b, &extra[i])
		}
		return b
	}
	ok := wire.SendWR{Opcode: uint8(qp.WRBindMW), InvalidateRKey: 0x500, RKey: 0x5ff, ImmData: 0x700, CompareAdd: 8, Swap: 2}
	var d SendDecoder
	if wrs, err := d.Decode(enc(ok), 1); err != nil || wrs[0].Bind == nil || wrs[0].Bind.NewRKey != 0x5ff || wrs[0].RKey != 0 {
		t.Fatalf("valid bind: %v %+v", err, wrs)
	}
	for name, c := range map[string]struct {
		b    []byte
		want error
	}{
		"new key of another index": {enc(func() wire.SendWR { w := ok; w.RKey = 0x601; return w }()), mr.ErrInvalidArg},
		"no new key":               {enc(func() wire.SendWR { w := ok; w.RKey = 0; return w }()), mr.ErrInvalidArg},
		"an SGE":                   {enc(func() wire.SendWR { w := ok; w.NumSGE = 1; return w }(), wire.SGE{Length: 1}), ErrProtocol},
		"access beyond 32 bits":    {enc(func() wire.SendWR { w := ok; w.Swap = 1 << 32; return w }()), ErrProtocol},
	} {
		if _, err := d.Decode(c.b, 1); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
}
