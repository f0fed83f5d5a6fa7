package roce

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/mem"
)

// rxHarness is a device whose receive path a test drives directly: every datagram goes
// through Device.handle (parse, destination GID, ICRC, QP lookup, the QP's receive) on the
// test's goroutine, as the receive loop runs it. Its RC, UC and UD QPs are in RTS towards a
// peer address nobody reads, with receives posted and (RC) a READ and a WRITE outstanding, and
// one MR over the middle of a buffer whose edges are canaries.
type rxHarness struct {
	t     testing.TB
	d     *Device
	peer  netip.Addr
	buf   []byte
	m     *mr.MR
	qps   [3]*QP // RC, UC, UD
	cqs   []*cq.CQ
	rx    rxState
	rqpsn [3]uint32 // the next PSN each QP expects from the peer (as the harness sends them)
}

const (
	rxCanary = 4096
	rxMRLen  = 64 << 10
	rxQKey   = 0x1234567
	rxPeerQP = 0x77
	rxSQPSN  = 0x500
	rxRQPSN  = 0x100
)

func newRxHarness(t testing.TB) *rxHarness {
	nw := mem.NewNetwork(mem.Options{QueueDepth: 64})
	l, err := nw.Attach(addrA)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nw.Attach(addrB); err != nil { // the peer: attached, never read
		t.Fatal(err)
	}
	d, err := Open(Options{Link: l, Name: "rxfuzz"})
	if err != nil {
		t.Fatal(err)
	}
	h := &rxHarness{t: t, d: d, peer: addrB, buf: make([]byte, rxMRLen+2*rxCanary)}
	for i := range h.buf {
		h.buf[i] = byte(i*7 + 3)
	}
	pd, err := d.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	acc := mr.AccessLocalWrite | mr.AccessRemoteWrite | mr.AccessRemoteRead | mr.AccessRemoteAtomic
	if h.m, err = d.RegMR(pd, h.buf[rxCanary:rxCanary+rxMRLen], 0x7000_0000, acc); err != nil {
		t.Fatal(err)
	}
	for i, typ := range []qp.Type{qp.TypeRC, qp.TypeUC, qp.TypeUD} {
		c, err := d.CreateCQ(256)
		if err != nil {
			t.Fatal(err)
		}
		h.cqs = append(h.cqs, c)
		q, err := d.CreateQP(QPInit{Type: typ, PD: pd, SendCQ: c, RecvCQ: c,
			Cap: qp.Cap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 2, MaxRecvSGE: 2}})
		if err != nil {
			t.Fatal(err)
		}
		h.qps[i] = q
		steps := []struct {
			a qp.Attr
			m qp.AttrMask
		}{
			{qp.Attr{State: qp.StateInit, Port: 1, AccessFlags: acc, QKey: rxQKey}, qp.AttrState | qp.AttrPKeyIndex | qp.AttrPort},
			{qp.Attr{State: qp.StateRTR, AH: qp.AHAttr{DGID: h.peer, SGIDIndex: uint8(d.GIDIndex(addrA)), Port: 1}, PathMTU: qp.MTU1024,
				DestQPN: rxPeerQP, RQPSN: rxRQPSN, MaxDestRDAtomic: 4, MinRNRTimer: 1}, qp.AttrState},
			{qp.Attr{State: qp.StateRTS, SQPSN: rxSQPSN, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRDAtomic: 4}, qp.AttrState | qp.AttrSQPSN},
		}
		switch typ {
		case qp.TypeUD:
			steps[0].m |= qp.AttrQKey
		case qp.TypeUC:
			steps[0].m |= qp.AttrAccessFlags
			steps[1].m |= qp.AttrAV | qp.AttrPathMTU | qp.AttrDestQPN | qp.AttrRQPSN
		default:
			steps[0].m |= qp.AttrAccessFlags
			steps[1].m |= qp.AttrAV | qp.AttrPathMTU | qp.AttrDestQPN | qp.AttrRQPSN | qp.AttrMaxDestRDAtomic | qp.AttrMinRNRTimer
			steps[2].m |= qp.AttrTimeout | qp.AttrRetryCnt | qp.AttrRNRRetry | qp.AttrMaxQPRDAtomic
		}
		for _, s := range steps {
			if err := q.Modify(&s.a, s.m); err != nil {
				t.Fatalf("%v: %v", typ, err)
			}
		}
		for k := 0; k < 4; k++ {
			if _, err := q.PostRecv([]qp.RecvWR{{WRID: uint64(k), SGL: []qp.SGE{{Addr: h.m.IOVA() + uint64(k)*4096, Length: 4096, LKey: h.m.LKey()}}}}); err != nil {
				t.Fatal(err)
			}
		}
		h.rqpsn[i] = rxRQPSN
	}
	// RC work outstanding: a READ and a WRITE, whose responses and ACKs the fuzzer may send.
	if _, err := h.qps[0].PostSend([]qp.SendWR{
		{WRID: 10, Opcode: qp.WRRDMARead, Flags: qp.SendSignaled, SGL: []qp.SGE{{Addr: h.m.IOVA() + 32<<10, Length: 3000, LKey: h.m.LKey()}},
			RemoteAddr: 0x9000, RKey: 0x4242},
		{WRID: 11, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled, SGL: []qp.SGE{{Addr: h.m.IOVA() + 40<<10, Length: 2000, LKey: h.m.LKey()}},
			RemoteAddr: 0x9000, RKey: 0x4242}}); err != nil {
		t.Fatal(err)
	}
	return h
}

// packet builds one packet from a 12-byte spec: b0 the target (QP by b0%5: RC, UC, UD, an
// unknown QPN, QP1) and flags (b0>>3: AckReq, SE, a wrong ICRC, a wrong source, MigReq); b1
// the opcode within the target's transport (b1&0x1f; b1&0x80: any opcode at all); b2 a PSN
// offset from the next expected one (small, mostly 0); b3 PadCnt and header breakage (a wrong
// P_Key, TVer); b4 which R_Key (the MR's, another, garbage) and Q_Key; b5-6 a VA offset from
// the MR's start (may fall outside); b7-8 the DMA length; b9 the payload length; b10-11 the
// AETH syndrome and MSN / atomic operands.
func (h *rxHarness) packet(s []byte) ([]byte, netip.Addr) {
	sel := int(s[0] % 5)
	var dqpn uint32
	tr := bth.Opcode(0)
	idx := -1
	switch sel {
	case 0, 1, 2:
		idx = sel
		dqpn = h.qps[sel].Num()
		tr = [...]bth.Opcode{0x00, 0x20, 0x60}[sel]
	case 3:
		dqpn = 0x123456
	case 4:
		dqpn = 1
		tr = 0x60
	}
	op := tr | bth.Opcode(s[1]&0x1f)
	if s[1]&0x80 != 0 {
		op = bth.Opcode(s[1] ^ 0x80)
	}
	info := op.Info()
	hdrLen := bth.BTHSize + info.Hdrs.Size()
	if !info.Valid {
		hdrLen = bth.BTHSize + int(s[9]%40)
	} else if info.HdrLen > hdrLen {
		hdrLen = info.HdrLen
	}
	n := int(s[9]) * 5 // up to 1275: past a 1024 MTU
	if info.FixedPayload > 0 && s[9]&1 == 0 {
		n = info.FixedPayload
	}
	pad := int(s[3] & 3)
	pkt := make([]byte, hdrLen+n+pad+bth.ICRCSize)
	flags := s[0] >> 3
	psn := uint32(rxSQPSN) // responses answer the RC requests
	if info.Request || !info.Valid {
		if idx >= 0 {
			psn = h.rqpsn[idx]
		}
	}
	psn += uint32(int32(int8(s[2])) >> 5) // -4..3, mostly 0 for small bytes
	pkey := uint16(0xFFFF)
	if s[3]&0x40 != 0 {
		pkey = 0x7FFF
	}
	bth.BTH(pkt).Encode(&bth.BTHFields{Opcode: op, SE: flags&2 != 0, MigReq: flags&16 != 0, PadCnt: uint8(pad),
		TVer: (s[3] >> 7) & 1, PKey: pkey, DestQP: dqpn, AckReq: flags&1 != 0, PSN: bth.PSN(psn & bth.PSNMask)})
	rkey := h.m.RKey()
	switch s[4] % 4 {
	case 1:
		rkey ^= 0x100
	case 2:
		rkey = binary.BigEndian.Uint32(s[5:9])
	}
	qkey := uint32(rxQKey)
	if s[4]&0x10 != 0 {
		qkey = 0x80010000
	}
	va := h.m.IOVA() + uint64(binary.BigEndian.Uint16(s[5:])) - 1024
	dlen := uint32(binary.BigEndian.Uint16(s[7:]))
	off := bth.BTHSize
	for bit := bth.Hdr(1); bit != 0 && bit <= bth.HdrIETH; bit <<= 1 {
		if info.Hdrs&bit == 0 {
			continue
		}
		hb := pkt[off : off+bit.Size()]
		switch bit {
		case bth.HdrRETH:
			bth.RETH(hb).Encode(&bth.RETHFields{VA: va, RKey: rkey, DMALen: dlen})
		case bth.HdrDETH:
			bth.DETH(hb).Encode(&bth.DETHFields{QKey: qkey, SrcQP: rxPeerQP})
		case bth.HdrAETH:
			bth.AETH(hb).Encode(&bth.AETHFields{Syndrome: s[10], MSN: uint32(s[11])})
		case bth.HdrAtomicETH:
			bth.AtomicETH(hb).Encode(&bth.AtomicETHFields{VA: va &^ uint64(s[10]&7^7), RKey: rkey, SwapAdd: uint64(s[11]), Compare: uint64(s[10])})
		case bth.HdrIETH:
			bth.IETH(hb).SetRKey(rkey)
		default:
			copy(hb, s)
		}
		off += bit.Size()
	}
	for i := hdrLen; i < len(pkt)-bth.ICRCSize; i++ {
		pkt[i] = byte(i) ^ s[11]
	}
	src := h.peer
	if flags&8 != 0 {
		src = netip.MustParseAddr("127.0.0.9")
	}
	ep := bth.Endpoints{Src: src, Dst: addrA, SrcPort: 49152, DstPort: 4791}
	icrc := bth.ICRC(&ep, pkt)
	if flags&4 != 0 {
		icrc ^= 1
	}
	bth.SetICRC(pkt, icrc)
	if idx >= 0 && (info.Request || !info.Valid) && s[2]>>5 == 0 {
		h.rqpsn[idx] = (h.rqpsn[idx] + 1) & bth.PSNMask
	}
	return pkt, src
}

// deliver runs one datagram through the device's receive path.
func (h *rxHarness) deliver(pkt []byte, src netip.Addr) {
	dg := link.Datagram{Buf: pkt, Src: netip.AddrPortFrom(src, 49152), Dst: netip.AddrPortFrom(addrA, 4791)}
	h.d.batchMu.RLock()
	h.rx.now = h.d.clock.Now()
	h.d.handle(&h.rx, &dg)
	h.rx.flushPending()
	h.d.batchMu.RUnlock()
}

// check: the canaries around the MR are untouched, and the CQs can be drained.
func (h *rxHarness) check(t *testing.T) {
	want := func(i int) byte { return byte(i*7 + 3) }
	for _, r := range [][2]int{{0, rxCanary}, {rxCanary + rxMRLen, len(h.buf)}} {
		for i := r[0]; i < r[1]; i++ {
			if h.buf[i] != want(i) {
				t.Fatalf("byte %d outside the MR changed (0x%02x, was 0x%02x)", i-rxCanary, h.buf[i], want(i))
			}
		}
	}
	wc := make([]cq.WC, 16)
	for _, c := range h.cqs {
		for c.Poll(wc) > 0 {
		}
	}
}

// FuzzDeviceReceive: sequences of packets — multi-packet messages, READ responses, ACKs and
// NAKs, atomics, UD datagrams, wrong keys, PSNs, sources, ICRCs and headers — through the whole
// receive path of a device (parse, GID, ICRC, QP lookup, RC/UC/UD receive) never panic and
// never touch memory outside the registered region.
func FuzzDeviceReceive(f *testing.F) {
	spec := func(target, opcode byte, n byte) []byte {
		return []byte{target, opcode, 0, 0, 0, 0x04, 0x00, 0x04, 0x00, n, 0, 0}
	}
	// RC: a SEND FIRST/MIDDLE/LAST message, a WRITE ONLY, a READ request, the READ's responses,
	// an ACK; UC: a WRITE FIRST/LAST; UD: a SEND; QP1; an unknown QPN
	f.Add(bytes.Join([][]byte{spec(0, 0x00, 204), spec(0, 0x01, 204), spec(0, 0x02, 10),
		spec(0, 0x0A, 100), spec(0, 0x0C, 0), spec(0, 0x0D, 204), spec(0, 0x0F, 100), spec(0, 0x11, 0)}, nil))
	f.Add(bytes.Join([][]byte{spec(1, 0x06, 204), spec(1, 0x08, 50), spec(1, 0x04, 30)}, nil))
	f.Add(bytes.Join([][]byte{spec(2, 0x04, 60), spec(4, 0x04, 51), spec(3, 0x04, 1)}, nil))
	f.Add(bytes.Join([][]byte{spec(0, 0x13, 0), spec(0, 0x14, 0), spec(0, 0x12, 0), spec(0x20, 0x04, 3), spec(0x08, 0x80|0x81, 3)}, nil))
	f.Fuzz(func(t *testing.T, prog []byte) {
		h := newRxHarness(t)
		defer h.d.Close()
		for i := 0; len(prog) >= 12 && i < 32; i++ {
			pkt, src := h.packet(prog[:12])
			h.deliver(pkt, src)
			prog = prog[12:]
		}
		h.check(t)
	})
}
