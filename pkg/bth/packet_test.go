package bth

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
)

// buildPacket encodes a packet of opcode op with random header contents,
// payloadLen bytes of payload and pad bytes of pad, and a random ICRC.
func buildPacket(r *rand.Rand, op Opcode, payloadLen, pad int) []byte {
	info := op.Info()
	b := make([]byte, info.HdrLen+payloadLen+pad+ICRCSize)
	f := randBTHFields(r)
	f.Opcode, f.TVer, f.PadCnt = op, 0, uint8(pad)
	BTH(b).Encode(&f)
	off := BTHSize
	for bit := Hdr(1); bit < hdrEnd; bit <<= 1 {
		if info.Hdrs&bit == 0 {
			continue
		}
		n := bit.Size()
		for i := 0; i < n; i++ {
			b[off+i] = byte(r.Uint32())
		}
		off += n
	}
	for i := off; i < len(b); i++ {
		b[i] = byte(r.Uint32())
	}
	// Pad bytes are zero, as rxe sends them (IBTA 9.2.4 leaves their value
	// to the sender; the ICRC covers them).
	end := len(b) - ICRCSize
	clear(b[end-pad : end])
	return b
}

func validOpcodes() []Opcode {
	var ops []Opcode
	for i := 0; i < 256; i++ {
		if Opcode(i).Valid() {
			ops = append(ops, Opcode(i))
		}
	}
	return ops
}

func payloadLenFor(r *rand.Rand, info *OpInfo) int {
	switch {
	case !info.Payload:
		return 0
	case info.FixedPayload > 0:
		return info.FixedPayload
	}
	return r.IntN(64)
}

// TestParseEveryOpcode: hand-built packets for every valid opcode parse,
// expose the right views, and re-encode from their Fields to the same bytes.
func TestParseEveryOpcode(t *testing.T) {
	r := rand.New(rand.NewPCG(30, 31))
	for _, op := range validOpcodes() {
		info := op.Info()
		for k := 0; k < 20; k++ {
			pl := payloadLenFor(r, info)
			pad := 0
			if info.Payload {
				pad = r.IntN(4)
			}
			b := buildPacket(r, op, pl, pad)
			p, err := Parse(b)
			if err != nil {
				t.Fatalf("%v: %v", op, err)
			}
			if p.Info != info || p.BTH.Opcode() != op || p.Pad != pad || len(p.Payload) != pl {
				t.Fatalf("%v: info %v pad %d payload %d", op, p.Info.Name, p.Pad, len(p.Payload))
			}
			if !bytes.Equal(p.ICRC, b[len(b)-4:]) || !bytes.Equal(p.Payload, b[info.HdrLen:info.HdrLen+pl]) {
				t.Fatalf("%v: ICRC/payload views wrong", op)
			}
			present := map[Hdr]bool{
				HdrRDETH: p.RDETH != nil, HdrDETH: p.DETH != nil, HdrXRCETH: p.XRCETH != nil,
				HdrFETH: p.FETH != nil, HdrRETH: p.RETH != nil, HdrAtomicETH: p.AtomicETH != nil,
				HdrAETH: p.AETH != nil, HdrAtomicAckETH: p.AtomicAck != nil, HdrImmDt: p.ImmDt != nil,
				HdrIETH: p.IETH != nil,
			}
			for h, ok := range present {
				if ok != (info.Hdrs&h != 0) {
					t.Fatalf("%v: header %v present=%v", op, h, ok)
				}
			}
			re := reencode(t, &p)
			if info.Kind == KindCNP {
				copy(re[BTHSize:], b[BTHSize:BTHSize+CNPResvSize])
			}
			if !bytes.Equal(re, b) {
				t.Fatalf("%v: re-encoded\n%x\nbuilt\n%x", op, re, b)
			}
			// Views alias the buffer: a setter through the parsed view is
			// visible in b.
			p.BTH.SetPSN(0x123456)
			if BTH(b).PSN() != 0x123456 {
				t.Fatalf("%v: BTH view does not alias", op)
			}
		}
	}
}

// TestParseTruncation: every prefix of every opcode's packet gives the
// right error or a valid shorter packet, never a panic.
func TestParseTruncation(t *testing.T) {
	r := rand.New(rand.NewPCG(32, 33))
	for _, op := range validOpcodes() {
		info := op.Info()
		pad := 0
		if info.Payload {
			pad = 3
		}
		b := buildPacket(r, op, payloadLenFor(r, info)+4*b2i(info.FixedPayload == 0 && info.Payload), pad)
		for n := 0; n <= len(b); n++ {
			p, err := Parse(b[:n])
			switch {
			case n < info.HdrLen+ICRCSize || n < BTHSize+ICRCSize:
				if !errors.Is(err, ErrTruncated) {
					t.Fatalf("%v len %d/%d: %v, want ErrTruncated", op, n, len(b), err)
				}
				var pe *ParseError
				if !errors.As(err, &pe) || pe.Len != n || (n > 0 && pe.Opcode != op) {
					t.Fatalf("%v len %d: ParseError %+v", op, n, pe)
				}
			case !info.Payload && n != len(b):
				t.Fatalf("unreachable")
			case info.Payload && n < info.HdrLen+pad+ICRCSize:
				if !errors.Is(err, ErrBadPad) {
					t.Fatalf("%v len %d: %v, want ErrBadPad", op, n, err)
				}
			default:
				if err != nil {
					t.Fatalf("%v len %d: %v", op, n, err)
				}
				if len(p.Payload) != n-info.HdrLen-pad-ICRCSize {
					t.Fatalf("%v len %d: payload %d", op, n, len(p.Payload))
				}
			}
		}
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestParseErrors(t *testing.T) {
	r := rand.New(rand.NewPCG(34, 35))
	ack := buildPacket(r, OpRCAck, 0, 0)
	tver := append([]byte(nil), ack...)
	BTH(tver).SetTVer(1)
	padded := append([]byte(nil), ack...)
	BTH(padded).SetPadCnt(1)
	extra := append(append([]byte(nil), ack...), 0)
	reserved := append([]byte(nil), ack...)
	reserved[0] = 0x15 // RC 0x15 is reserved
	vendor := append([]byte(nil), ack...)
	vendor[0] = 0xE0
	aw := buildPacket(r, OpRCAtomicWrite, 8, 0)
	awShort := append([]byte(nil), aw[:len(aw)-5]...)
	awShort = append(awShort, 0, 0, 0, 0) // 7-byte payload
	cases := []struct {
		name string
		b    []byte
		want error
	}{
		{"tver", tver, ErrBadTVer},
		{"pad on ack", padded, ErrBadPad},
		{"extra byte on ack", extra, ErrBadLength},
		{"reserved RC 0x15", reserved, ErrUnknownOpcode},
		{"vendor 0xE0", vendor, ErrUnknownOpcode},
		{"nil", nil, ErrTruncated},
	}
	for _, c := range cases {
		_, err := Parse(c.b)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
		var pe *ParseError
		if !errors.As(err, &pe) || pe.Error() == "" {
			t.Errorf("%s: not a *ParseError: %T", c.name, err)
		}
	}
	if _, err := Parse(aw); err != nil {
		t.Fatalf("atomic write: %v", err)
	}
	// A 7-byte ATOMIC WRITE parses: the responder NAKs its length (oA19-28).
	if p, err := Parse(awShort); err != nil || len(p.Payload) != 7 {
		t.Fatalf("atomic write 7 bytes: %v, payload %d", err, len(p.Payload))
	}
}

func TestParseAllocs(t *testing.T) {
	r := rand.New(rand.NewPCG(36, 37))
	b := buildPacket(r, OpRCWriteFirst, 1024, 0)
	if n := testing.AllocsPerRun(100, func() { _, _ = Parse(b) }); n != 0 {
		t.Fatalf("Parse: %v allocs", n)
	}
}

// TestParseRandomNeverPanics throws random bytes at Parse.
func TestParseRandomNeverPanics(t *testing.T) {
	r := rand.New(rand.NewPCG(38, 39))
	buf := make([]byte, 128)
	for i := 0; i < 200000; i++ {
		n := r.IntN(len(buf))
		for j := 0; j < n; j++ {
			buf[j] = byte(r.Uint32())
		}
		if r.IntN(2) == 0 && n > 1 {
			buf[1] &= 0x30 // TVer 0 so more inputs reach the header code
		}
		p, err := Parse(buf[:n])
		if err == nil && (p.Info == nil || !p.Info.Valid || len(p.ICRC) != 4) {
			t.Fatal("accepted packet without info")
		}
	}
}

// checkTruncatedInHeaders parses every prefix of an op packet that ends
// inside its extension headers: all must fail with ErrTruncated.
func checkTruncatedInHeaders(t *testing.T, op Opcode) {
	t.Helper()
	r := rand.New(rand.NewPCG(uint64(op), 42))
	info := op.Info()
	b := buildPacket(r, op, payloadLenFor(r, info), 0)
	for n := 0; n < info.HdrLen+ICRCSize; n++ {
		if _, err := Parse(b[:n]); !errors.Is(err, ErrTruncated) {
			t.Fatalf("%v truncated to %d: %v, want ErrTruncated", op, n, err)
		}
	}
	if _, err := Parse(b); err != nil {
		t.Fatalf("%v: %v", op, err)
	}
}
