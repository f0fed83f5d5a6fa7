package qp

import (
	"errors"
	"testing"
)

func TestWROpcodeNumbering(t *testing.T) {
	// ibv_wr_opcode values.
	want := map[WROpcode]uint8{WRRDMAWrite: 0, WRRDMAWriteWithImm: 1, WRSend: 2, WRSendWithImm: 3,
		WRRDMARead: 4, WRAtomicCmpAndSwp: 5, WRAtomicFetchAndAdd: 6, WRLocalInv: 7, WRBindMW: 8, WRSendWithInv: 9}
	for op, v := range want {
		if uint8(op) != v || !op.Valid() || op.String() == "UNKNOWN" {
			t.Errorf("%v = %d, want %d", op, op, v)
		}
	}
	if WROpcode(10).Valid() || SendFence != 1 || SendSignaled != 2 || SendSolicited != 4 || SendInline != 8 {
		t.Error("flags/opcode range")
	}
}

func TestValidateSend(t *testing.T) {
	lim := WRLimits{MaxSGE: 2, MaxInlineData: 16, MaxMsgSize: 1 << 20}
	sgl := func(ls ...uint32) []SGE {
		var s []SGE
		for _, l := range ls {
			s = append(s, SGE{Length: l})
		}
		return s
	}
	ah := &AH{}
	cases := []struct {
		name string
		t    Type
		wr   SendWR
		n    uint32
		err  error
	}{
		{"rc send", TypeRC, SendWR{Opcode: WRSend, SGL: sgl(10, 20)}, 30, nil},
		{"too many sge", TypeRC, SendWR{Opcode: WRSend, SGL: sgl(1, 1, 1)}, 0, ErrWRTooManySGE},
		{"inline ok", TypeRC, SendWR{Opcode: WRSend, Flags: SendInline, SGL: sgl(16)}, 16, nil},
		{"inline too big", TypeRC, SendWR{Opcode: WRSend, Flags: SendInline, SGL: sgl(17)}, 0, ErrWRInlineSize},
		{"inline by value", TypeRC, SendWR{Opcode: WRRDMAWrite, Flags: SendInline, Inline: make([]byte, 16)}, 16, nil},
		{"inline by value too big", TypeRC, SendWR{Opcode: WRSend, Flags: SendInline, Inline: make([]byte, 17)}, 0, ErrWRInlineSize},
		{"inline by value and SGL", TypeRC, SendWR{Opcode: WRSend, Flags: SendInline, Inline: []byte{1}, SGL: sgl(1)}, 0, ErrBadWR},
		{"inline by value without the flag", TypeRC, SendWR{Opcode: WRSend, Inline: []byte{1}}, 0, ErrBadWR},
		{"inline by value for a READ", TypeRC, SendWR{Opcode: WRRDMARead, Flags: SendInline, Inline: []byte{1}}, 0, ErrBadWR},
		{"msg too long", TypeRC, SendWR{Opcode: WRRDMAWrite, SGL: sgl(1<<20, 1)}, 0, ErrWRLength},
		{"uint32 overflow", TypeRC, SendWR{Opcode: WRRDMAWrite, SGL: sgl(0xFFFFFFFF, 1)}, 0, ErrWRLength},
		{"atomic", TypeRC, SendWR{Opcode: WRAtomicFetchAndAdd, RemoteAddr: 8, SGL: sgl(8)}, 8, nil},
		{"atomic write operand by value", TypeRC, SendWR{Opcode: WRAtomicWrite, RemoteAddr: 8, Flags: SendInline, Inline: make([]byte, 8)}, 8, nil},
		{"atomic write operand inline", TypeRC, SendWR{Opcode: WRAtomicWrite, RemoteAddr: 8, Flags: SendInline, SGL: sgl(4, 4)}, 8, nil},
		{"atomic write operand of 9", TypeRC, SendWR{Opcode: WRAtomicWrite, RemoteAddr: 8, Flags: SendInline, Inline: make([]byte, 9)}, 0, ErrWRLength},
		{"atomic write operand without the flag", TypeRC, SendWR{Opcode: WRAtomicWrite, RemoteAddr: 8, Inline: make([]byte, 8)}, 0, ErrBadWR},
		{"atomic misaligned", TypeRC, SendWR{Opcode: WRAtomicCmpAndSwp, RemoteAddr: 4, SGL: sgl(8)}, 0, ErrWRAtomicAlign},
		{"atomic 4 bytes", TypeRC, SendWR{Opcode: WRAtomicCmpAndSwp, RemoteAddr: 8, SGL: sgl(4)}, 0, ErrWRLength},
		{"uc read", TypeUC, SendWR{Opcode: WRRDMARead, SGL: sgl(4)}, 0, ErrWROpcode},
		{"uc atomic", TypeUC, SendWR{Opcode: WRAtomicFetchAndAdd, SGL: sgl(8)}, 0, ErrWROpcode},
		{"uc write imm", TypeUC, SendWR{Opcode: WRRDMAWriteWithImm, SGL: sgl(4)}, 4, nil},
		{"ud write", TypeUD, SendWR{Opcode: WRRDMAWrite, AH: ah}, 0, ErrWROpcode},
		{"ud no ah", TypeUD, SendWR{Opcode: WRSend}, 0, ErrWRNoAH},
		{"ud send", TypeUD, SendWR{Opcode: WRSendWithImm, AH: ah, SGL: sgl(5)}, 5, nil},
		{"gsi send", TypeGSI, SendWR{Opcode: WRSend, AH: ah}, 0, nil},
		{"bad opcode", TypeRC, SendWR{Opcode: 42}, 0, ErrWROpcode},
		{"bind without info", TypeRC, SendWR{Opcode: WRBindMW}, 0, ErrWRNoBind},
		{"bind", TypeUC, SendWR{Opcode: WRBindMW, Bind: &BindInfo{}}, 0, nil},
		{"ud bind", TypeUD, SendWR{Opcode: WRBindMW, AH: ah, Bind: &BindInfo{}}, 0, ErrWROpcode},
	}
	for _, c := range cases {
		n, err := ValidateSend(c.t, &c.wr, lim)
		if !errors.Is(err, c.err) || (c.err == nil && err != nil) || n != c.n {
			t.Errorf("%s: %d %v, want %d %v", c.name, n, err, c.n, c.err)
		}
	}
	if n, err := ValidateRecv(&RecvWR{SGL: sgl(1, 2)}, 2); n != 3 || err != nil {
		t.Error("recv")
	}
	if _, err := ValidateRecv(&RecvWR{SGL: sgl(1, 2, 3)}, 2); !errors.Is(err, ErrWRTooManySGE) {
		t.Error("recv sge")
	}
}

func TestDefaultDeviceAttr(t *testing.T) {
	d := DefaultDeviceAttr()
	// No smaller than rxe_param.h.
	checks := []struct {
		name     string
		got, min int
	}{
		{"MaxQP", d.MaxQP, 0x10000}, {"MaxQPWR", d.MaxQPWR, 0x4000}, {"MaxSGE", d.MaxSGE, 32},
		{"MaxSGERD", d.MaxSGERD, 32}, {"MaxCQ", d.MaxCQ, 16384}, {"MaxCQE", d.MaxCQE, 1<<15 - 1},
		{"MaxMR", d.MaxMR, 256 * 1024}, {"MaxPD", d.MaxPD, 0x7ffc}, {"MaxQPRDAtom", d.MaxQPRDAtom, 128},
		{"MaxQPInitRDAtom", d.MaxQPInitRDAtom, 128}, {"MaxResRDAtom", d.MaxResRDAtom, 0x3f000},
		{"MaxSRQ", d.MaxSRQ, 960}, {"MaxSRQWR", d.MaxSRQWR, 0x4000}, {"MaxSRQSGE", d.MaxSRQSGE, 27},
		{"MaxMW", d.MaxMW, 4096}, {"MaxInlineData", d.MaxInlineData, 400}, {"MaxPKeys", d.MaxPKeys, 1},
	}
	for _, c := range checks {
		if c.got < c.min {
			t.Errorf("%s = %d < rxe %d", c.name, c.got, c.min)
		}
	}
	if d.VendorID != 0xFFFFFF || d.AtomicCap != AtomicGlob || d.MaxMRSize != ^uint64(0) || d.MaxMsgSize < 0x800000 {
		t.Error("vendor/atomic/mr size/msg size")
	}
	if d.DeviceCapFlags&DevCapMemMgtExt == 0 || d.DeviceCapFlags&DevCapMemWindowType2B == 0 {
		t.Error("cap flags must advertise fast-reg and type 2B windows")
	}
	o := d.TableOptions()
	if o.MaxMR != d.MaxMR || o.MaxMW != d.MaxMW || o.MaxPD != d.MaxPD {
		t.Error("TableOptions")
	}
	p := DefaultPortAttr(1500)
	if p.State != PortActive || p.LinkLayer != LinkLayerEthernet || p.MaxMTU != MTU4096 || p.GIDTblLen < 2 || p.PKeyTblLen != 1 {
		t.Errorf("port %+v", p)
	}
	if DefaultPortAttr(100).State != PortDown {
		t.Error("MTU below 256 must leave the port down")
	}
}
