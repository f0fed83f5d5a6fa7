package qp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
)

const allRemote = mr.AccessLocalWrite | mr.AccessRemoteWrite | mr.AccessRemoteRead | mr.AccessRemoteAtomic

// placementPair connects a and b with FLUSH access on both QPs (unless qpAcc is given).
func placementPair(t *testing.T, qpAcc mr.Access) (*net, *side, *side) {
	if qpAcc == 0 {
		qpAcc = allRemote | mr.AccessFlushGlobal | mr.AccessFlushPersistent
	}
	n := newNet(t)
	a := n.newSide("10.0.0.1", sideOpts{qpn: 0x11})
	b := n.newSide("10.0.0.2", sideOpts{qpn: 0x12})
	n.connect(a, b, connOpts{accessA: qpAcc, accessB: qpAcc, psnA: 0xFFFFF0, psnB: 77, retry: 3})
	return n, a, b
}

// recorder records the requests and responses the net delivers.
type recorder struct{ pkts []bth.Packet }

func (r *recorder) filter(_ *side, d *link.Datagram, p *bth.Packet) bool {
	q, _ := bth.Parse(append([]byte(nil), d.Buf...))
	r.pkts = append(r.pkts, q)
	return true
}

func (r *recorder) ops() []bth.Opcode {
	var out []bth.Opcode
	for i := range r.pkts {
		out = append(out, r.pkts[i].BTH.Opcode())
	}
	return out
}

// fakePersister records what a persistent FLUSH asked to make durable.
type fakePersister struct {
	base  []byte
	calls [][2]int // offset and length into base
	err   error
}

func (f *fakePersister) Persist(b []byte) error {
	off := 0
	if len(b) > 0 {
		for off = range f.base {
			if &f.base[off] == &b[0] {
				break
			}
		}
	}
	f.calls = append(f.calls, [2]int{off, len(b)})
	return f.err
}

// TestAtomicWrite: an ATOMIC WRITE is a BTH+RETH(DMA length 8)+8 bytes request with AckReq,
// answered with an empty READ Response Only; the 8 bytes land as sent; the completion is
// IBV_WC_ATOMIC_WRITE with byte_len 8. Inline data works too.
func TestAtomicWrite(t *testing.T) {
	n, a, b := placementPair(t, 0)
	var rec recorder
	n.filter = rec.filter
	copy(a.buf[64:], []byte{1, 2, 3, 4, 5, 6, 7, 8})
	const word = dstOff + 8*100
	a.postSend(t, SendWR{WRID: 1, Opcode: WRAtomicWrite, SGL: []SGE{a.sge(64, 8)}, Flags: SendSignaled,
		RemoteAddr: b.va(word), RKey: b.mr.RKey()})
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpAtomicWrite, ByteLen: 8})
	eq(t, "ATOMIC WRITE", b.buf[word:word+8], []byte{1, 2, 3, 4, 5, 6, 7, 8})
	if got := rec.ops(); len(got) != 2 || got[0] != bth.OpRCAtomicWrite || got[1] != bth.OpRCReadRespOnly {
		t.Fatalf("packets %v, want ATOMIC WRITE then READ Response Only", got)
	}
	req, resp := rec.pkts[0], rec.pkts[1]
	if f := req.RETH.Fields(); f.VA != b.va(word) || f.RKey != b.mr.RKey() || f.DMALen != 8 ||
		!req.BTH.AckReq() || len(req.Payload) != 8 || req.BTH.PSN() != 0xFFFFF0 {
		t.Fatalf("request RETH %+v ackreq %v payload %d psn %#x", f, req.BTH.AckReq(), len(req.Payload), uint32(req.BTH.PSN()))
	}
	if a := resp.AETH.Fields(); len(resp.Payload) != 0 || a.Syndrome != bth.SyndromeACK(0x1F) || a.MSN != 1 ||
		resp.BTH.PSN() != 0xFFFFF0 {
		t.Fatalf("response AETH %+v payload %d psn %#x", a, len(resp.Payload), uint32(resp.BTH.PSN()))
	}
	// inline: the bytes are taken at post time
	v := []byte{9, 9, 9, 9, 8, 8, 8, 8}
	copy(a.buf[128:], v)
	a.postSend(t, SendWR{WRID: 2, Opcode: WRAtomicWrite, SGL: []SGE{a.sge(128, 8)}, Flags: SendSignaled | SendInline,
		RemoteAddr: b.va(word), RKey: b.mr.RKey()})
	clear(a.buf[128:136])
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 2, Opcode: cq.OpAtomicWrite, ByteLen: 8})
	eq(t, "inline ATOMIC WRITE", b.buf[word:word+8], v)
}

// TestAtomicWriteOperand: on a QP with no inline capacity (max_inline_data 0, pyverbs'
// default), an ATOMIC WRITE's 8 bytes given inline — by value, as the daemon decodes what
// ibv_wr_atomic_write copied, or from two SGEs — are its operand, taken at post time, and
// land as sent (rxe keeps them in the WQE whatever max_inline_data is). A SEND with inline
// data is still refused on that QP.
func TestAtomicWriteOperand(t *testing.T) {
	n := newNet(t)
	c := Cap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 2, MaxRecvSGE: 2}
	a := n.newSide("10.0.0.1", sideOpts{qpn: 0x11, cap: c})
	b := n.newSide("10.0.0.2", sideOpts{qpn: 0x12, cap: c})
	n.connect(a, b, connOpts{accessA: allRemote, accessB: allRemote, retry: 3})
	const word = dstOff + 8*50
	v := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	a.postSend(t, SendWR{WRID: 1, Opcode: WRAtomicWrite, Flags: SendSignaled | SendInline, Inline: v,
		RemoteAddr: b.va(word), RKey: b.mr.RKey()})
	v[0] = 9 // taken at post time
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpAtomicWrite, ByteLen: 8})
	eq(t, "ATOMIC WRITE by value", b.buf[word:word+8], []byte{1, 2, 3, 4, 5, 6, 7, 8})
	copy(a.buf[256:], []byte{8, 7, 6, 5, 4, 3, 2, 1})
	a.postSend(t, SendWR{WRID: 2, Opcode: WRAtomicWrite, Flags: SendSignaled | SendInline,
		SGL: []SGE{a.sge(260, 4), a.sge(256, 4)}, RemoteAddr: b.va(word), RKey: b.mr.RKey()})
	clear(a.buf[256:264])
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 2, Opcode: cq.OpAtomicWrite, ByteLen: 8})
	eq(t, "ATOMIC WRITE from two SGEs", b.buf[word:word+8], []byte{4, 3, 2, 1, 8, 7, 6, 5})
	if _, err := a.qp.PostSend([]SendWR{{WRID: 3, Opcode: WRSend, Flags: SendInline, Inline: v}}); !errors.Is(err, ErrWRInlineSize) {
		t.Fatalf("inline SEND on a QP without inline capacity: %v", err)
	}
}

// TestFlush: WRITEs then a FLUSH (global; range and whole region): the FLUSH carries the FETH
// (placement type bits 3..0, selectivity bits 5..4) and a RETH with the range; it is answered
// with an empty READ Response Only once the WRITEs before it are placed; the completion is
// IBV_WC_FLUSH with the range's length. A persistent FLUSH calls the region's Persister on
// exactly the range, or the whole region.
func TestFlush(t *testing.T) {
	n, a, b := placementPair(t, 0)
	pers := &fakePersister{base: b.buf[dstOff : dstOff+64<<10]}
	fm, err := b.tbl.RegMRWith(b.pd, pers.base, 0x9000000, allRemote|mr.AccessFlushGlobal|mr.AccessFlushPersistent,
		mr.RegMROptions{Persist: pers})
	if err != nil {
		t.Fatal(err)
	}
	var rec recorder
	n.filter = rec.filter
	a.fill(srcOff, 5000, 3)
	a.postSend(t,
		SendWR{WRID: 1, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(srcOff, 5000)}, RemoteAddr: 0x9000000 + 100, RKey: fm.RKey()},
		SendWR{WRID: 2, Opcode: WRFlush, Flags: SendSignaled, RemoteAddr: 0x9000000 + 100, RKey: fm.RKey(),
			FlushLength: 5000, FlushType: FlushGlobal | FlushPersistent, FlushLevel: FlushRange},
		SendWR{WRID: 3, Opcode: WRFlush, Flags: SendSignaled, RemoteAddr: 0x1234, RKey: fm.RKey(),
			FlushLength: 7, FlushType: FlushPersistent, FlushLevel: FlushMR},
		SendWR{WRID: 4, Opcode: WRFlush, Flags: SendSignaled, RemoteAddr: 0x9000000, RKey: fm.RKey(),
			FlushType: FlushGlobal})
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 2, Opcode: cq.OpFlush, ByteLen: 5000},
		cq.WC{WRID: 3, Opcode: cq.OpFlush, ByteLen: 7}, cq.WC{WRID: 4, Opcode: cq.OpFlush})
	eq(t, "WRITE before FLUSH", pers.base[100:5100], a.buf[srcOff:srcOff+5000])
	if len(pers.calls) != 2 || pers.calls[0] != [2]int{100, 5000} || pers.calls[1] != [2]int{0, len(pers.base)} {
		t.Fatalf("Persist calls %v, want the range [100, 5100) then the whole region", pers.calls)
	}
	var flushes []bth.Packet
	for _, p := range rec.pkts {
		if p.BTH.Opcode() == bth.OpRCFlush {
			flushes = append(flushes, p)
		}
	}
	if len(flushes) != 3 {
		t.Fatalf("%d FLUSH packets, want 3 (%v)", len(flushes), rec.ops())
	}
	f0 := flushes[0]
	if fe := f0.FETH.Fields(); fe.Placement != 3 || fe.Selectivity != 0 || f0.FETH.Raw() != 3 ||
		f0.RETH.Fields() != (bth.RETHFields{VA: 0x9000000 + 100, RKey: fm.RKey(), DMALen: 5000}) || !f0.BTH.AckReq() {
		t.Fatalf("FLUSH FETH %#x RETH %+v", f0.FETH.Raw(), f0.RETH.Fields())
	}
	if flushes[1].FETH.Raw() != 0x12 {
		t.Fatalf("FLUSH (persistent, whole region) FETH %#x, want 0x12", flushes[1].FETH.Raw())
	}
	// every response to a FLUSH is an empty READ Response Only at its PSN
	for _, f := range flushes {
		found := false
		for _, p := range rec.pkts {
			if p.BTH.Opcode() == bth.OpRCReadRespOnly && p.BTH.PSN() == f.BTH.PSN() && len(p.Payload) == 0 {
				found = true
			}
		}
		if !found {
			t.Fatalf("no empty READ Response Only for the FLUSH at %#x", uint32(f.BTH.PSN()))
		}
	}
}

// TestPlacementErrors: the responder's NAKs, in rxe's classes, and the completions they give
// the requester: a QP without the access (invalid request), an R_Key without it or out of
// range (remote access), a failing Persister (remote operational error).
func TestPlacementErrors(t *testing.T) {
	cases := []struct {
		name   string
		qpAcc  mr.Access
		mrAcc  mr.Access
		wr     func(b *side, m *mr.MR) SendWR
		persEr error
		status cq.Status
		nak    uint8
	}{
		{"atomic write, QP without remote write", allRemote &^ mr.AccessRemoteWrite, allRemote,
			func(b *side, m *mr.MR) SendWR {
				return SendWR{Opcode: WRAtomicWrite, RemoteAddr: m.IOVA(), RKey: m.RKey()}
			}, nil, cq.StatusRemInvReqErr, bth.NAKInvalidRequest},
		{"atomic write, MR without remote write", 0, mr.AccessLocalWrite | mr.AccessRemoteRead,
			func(b *side, m *mr.MR) SendWR {
				return SendWR{Opcode: WRAtomicWrite, RemoteAddr: m.IOVA(), RKey: m.RKey()}
			}, nil, cq.StatusRemAccessErr, bth.NAKRemoteAccessErr},
		{"atomic write, bad rkey", 0, allRemote,
			func(b *side, m *mr.MR) SendWR {
				return SendWR{Opcode: WRAtomicWrite, RemoteAddr: m.IOVA(), RKey: m.RKey() ^ 0x80}
			}, nil, cq.StatusRemAccessErr, bth.NAKRemoteAccessErr},
		{"atomic write, past the end", 0, allRemote,
			func(b *side, m *mr.MR) SendWR {
				return SendWR{Opcode: WRAtomicWrite, RemoteAddr: m.IOVA() + uint64(m.Len()), RKey: m.RKey()}
			}, nil, cq.StatusRemAccessErr, bth.NAKRemoteAccessErr},
		{"flush, QP without flush global", allRemote | mr.AccessFlushPersistent, allRemote | mr.AccessFlushGlobal,
			func(b *side, m *mr.MR) SendWR {
				return SendWR{Opcode: WRFlush, RemoteAddr: m.IOVA(), RKey: m.RKey(), FlushLength: 8, FlushType: FlushGlobal}
			}, nil, cq.StatusRemInvReqErr, bth.NAKInvalidRequest},
		{"flush, MR without flush global", 0, allRemote,
			func(b *side, m *mr.MR) SendWR {
				return SendWR{Opcode: WRFlush, RemoteAddr: m.IOVA(), RKey: m.RKey(), FlushLength: 8, FlushType: FlushGlobal}
			}, nil, cq.StatusRemAccessErr, bth.NAKRemoteAccessErr},
		{"flush persistent, MR with global only", 0, allRemote | mr.AccessFlushGlobal,
			func(b *side, m *mr.MR) SendWR {
				return SendWR{Opcode: WRFlush, RemoteAddr: m.IOVA(), RKey: m.RKey(), FlushLength: 8, FlushType: FlushPersistent}
			}, nil, cq.StatusRemAccessErr, bth.NAKRemoteAccessErr},
		{"flush, range past the end", 0, allRemote | mr.AccessFlushGlobal,
			func(b *side, m *mr.MR) SendWR {
				return SendWR{Opcode: WRFlush, RemoteAddr: m.IOVA() + 8, RKey: m.RKey(), FlushLength: uint32(m.Len()), FlushType: FlushGlobal}
			}, nil, cq.StatusRemAccessErr, bth.NAKRemoteAccessErr},
		{"flush persistent, msync fails", 0, allRemote | mr.AccessFlushPersistent,
			func(b *side, m *mr.MR) SendWR {
				return SendWR{Opcode: WRFlush, RemoteAddr: m.IOVA(), RKey: m.RKey(), FlushLength: 8, FlushType: FlushPersistent}
			}, errors.New("EIO"), cq.StatusRemOpErr, bth.NAKRemoteOpErr},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n, a, b := placementPair(t, c.qpAcc)
			pers := &fakePersister{base: b.buf[:4096], err: c.persEr}
			o := mr.RegMROptions{}
			if c.mrAcc&mr.AccessFlushPersistent != 0 {
				o.Persist = pers
			}
			m, err := b.tbl.RegMRWith(b.pd, pers.base, 0x40000, c.mrAcc, o)
			if err != nil {
				t.Fatal(err)
			}
			var rec recorder
			n.filter = rec.filter
			wr := c.wr(b, m)
			wr.WRID, wr.Flags = 5, SendSignaled
			if wr.Opcode == WRAtomicWrite {
				wr.SGL = []SGE{a.sge(0, 8)}
			}
			a.postSend(t, wr)
			n.pump()
			expectWC(t, pollAll(a.scq), cq.WC{WRID: 5, Opcode: wcOpcode(wr.Opcode), Status: c.status})
			last := rec.pkts[len(rec.pkts)-1]
			if last.BTH.Opcode() != bth.OpRCAck || last.AETH.Fields().Syndrome != bth.SyndromeNAK(c.nak) {
				t.Fatalf("last packet %v syndrome %#x, want NAK %d", last.BTH.Opcode(), last.AETH.Fields().Syndrome, c.nak)
			}
			if a.qp.State() != StateErr || b.qp.State() != StateErr {
				t.Fatalf("states %v %v, want ERR (a NAK other than a PSN sequence error is fatal)", a.qp.State(), b.qp.State())
			}
			if c.persEr == nil && len(pers.calls) != 0 {
				t.Fatalf("Persist called %v on a refused FLUSH", pers.calls)
			}
		})
	}
}

// TestPlacementRequestNAKs: requests no softroce requester sends (it refuses them at post),
// rewritten on the wire: an unaligned ATOMIC WRITE, a 4-byte one, a DMA length of 16, a FLUSH
// with an undefined placement type or selectivity level. Each is NAKed invalid request and
// places nothing.
func TestPlacementRequestNAKs(t *testing.T) {
	cases := []struct {
		name    string
		op      WROpcode
		rewrite func(b []byte) []byte // the request's UDP payload
	}{
		{"atomic write at va+4", WRAtomicWrite, func(b []byte) []byte {
			r := bth.RETH(b[bth.BTHSize:])
			r.SetVA(r.VA() + 4)
			return b
		}},
		{"atomic write of 4 bytes", WRAtomicWrite, func(b []byte) []byte {
			bth.RETH(b[bth.BTHSize:]).SetDMALen(4)
			h := bth.BTHSize + bth.RETHSize
			return append(b[:h+4:h+4], 0, 0, 0, 0) // payload 4, then the ICRC
		}},
		{"atomic write dma length 16", WRAtomicWrite, func(b []byte) []byte {
			bth.RETH(b[bth.BTHSize:]).SetDMALen(16)
			return b
		}},
		{"flush placement type 4", WRFlush, func(b []byte) []byte {
			bth.FETH(b[bth.BTHSize:]).SetPlacement(4)
			return b
		}},
		{"flush selectivity 2", WRFlush, func(b []byte) []byte {
			bth.FETH(b[bth.BTHSize:]).SetSelectivity(2)
			return b
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n, a, b := placementPair(t, 0)
			m, err := b.tbl.RegMR(b.pd, b.buf[:4096], 0x40000, allRemote|mr.AccessFlushGlobal)
			if err != nil {
				t.Fatal(err)
			}
			var rec recorder
			n.filter = func(from *side, d *link.Datagram, p *bth.Packet) bool {
				if from == a && p.Info.Request {
					d.Buf = c.rewrite(d.Buf)
					reencode(d)
					q, err := bth.Parse(d.Buf)
					if err != nil {
						t.Fatalf("rewritten request: %v", err)
					}
					*p = q
				}
				return rec.filter(from, d, p)
			}
			copy(a.buf, []byte{0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 0xAA})
			wr := SendWR{WRID: 5, Opcode: c.op, Flags: SendSignaled, RemoteAddr: 0x40000 + 64, RKey: m.RKey(),
				FlushLength: 8, FlushType: FlushGlobal}
			if c.op == WRAtomicWrite {
				wr.SGL = []SGE{a.sge(0, 8)}
			}
			a.postSend(t, wr)
			n.pump()
			expectWC(t, pollAll(a.scq), cq.WC{WRID: 5, Opcode: wcOpcode(c.op), Status: cq.StatusRemInvReqErr})
			last := rec.pkts[len(rec.pkts)-1]
			if last.BTH.Opcode() != bth.OpRCAck || last.AETH.Fields().Syndrome != bth.SyndromeNAK(bth.NAKInvalidRequest) {
				t.Fatalf("response %v %#x, want NAK invalid request", last.BTH.Opcode(), last.AETH.Fields().Syndrome)
			}
			if !bytes.Equal(b.buf[56:80], make([]byte, 24)) {
				t.Fatalf("memory written by a refused request: % x", b.buf[56:80])
			}
		})
	}
}

// TestPlacementDuplicate: the response to an ATOMIC WRITE is lost; the requester's retry is a
// duplicate the responder answers from its resource without storing again (the local CPU's
// newer value at the address survives); the completion is one success.
func TestPlacementDuplicate(t *testing.T) {
	for _, op := range []WROpcode{WRAtomicWrite, WRFlush} {
		t.Run(op.String(), func(t *testing.T) {
			n, a, b := placementPair(t, 0)
			m, err := b.tbl.RegMR(b.pd, b.buf[:4096], 0x40000, allRemote|mr.AccessFlushGlobal)
			if err != nil {
				t.Fatal(err)
			}
			dropped := 0
			var rec recorder
			n.filter = func(from *side, d *link.Datagram, p *bth.Packet) bool {
				if from == b && p.BTH.Opcode() == bth.OpRCReadRespOnly && dropped == 0 {
					dropped++
					// the responder executed it: the CPU now stores a newer value
					binary.LittleEndian.PutUint64(b.buf[64:], 0x5555)
					return false
				}
				return rec.filter(from, d, p)
			}
			binary.LittleEndian.PutUint64(a.buf, 0x1111)
			a.postSend(t, SendWR{WRID: 9, Opcode: op, Flags: SendSignaled, SGL: sglFor(a, op), RemoteAddr: 0x40000 + 64,
				RKey: m.RKey(), FlushLength: 8, FlushType: FlushGlobal})
			n.pump()
			if dropped != 1 {
				t.Fatal("response not dropped")
			}
			expectWC(t, pollAll(a.scq))
			n.clk.Advance(AckTimeout(14) + 1)
			n.pump()
			expectWC(t, pollAll(a.scq), cq.WC{WRID: 9, Opcode: wcOpcode(op), ByteLen: 8})
			if got := binary.LittleEndian.Uint64(b.buf[64:]); got != 0x5555 {
				t.Fatalf("word %#x after the duplicate, want 0x5555 (executed again)", got)
			}
			if b.cnt.DuplicateRequest.Load() != 1 {
				t.Fatalf("duplicate_request %d, want 1", b.cnt.DuplicateRequest.Load())
			}
			if got := rec.ops(); len(got) != 3 || got[0] != opOf(op) || got[1] != opOf(op) || got[2] != bth.OpRCReadRespOnly {
				t.Fatalf("packets %v, want the request, after the timeout the request again, and its response", got)
			}
		})
	}
}

func sglFor(a *side, op WROpcode) []SGE {
	if op == WRAtomicWrite {
		return []SGE{a.sge(0, 8)}
	}
	return nil
}

func opOf(op WROpcode) bth.Opcode {
	if op == WRFlush {
		return bth.OpRCFlush
	}
	return bth.OpRCAtomicWrite
}

// TestPlacementImplicitAck: a FLUSH's and an ATOMIC WRITE's responses are lost, but the ACK of
// the SEND after them says the responder executed them in order (IBTA 9.7.5.1.2): both
// complete successfully, with no retransmission. The same ACK covering a READ whose response
// was lost makes the requester resend it (it needs its data).
func TestPlacementImplicitAck(t *testing.T) {
	n, a, b := placementPair(t, 0)
	m, err := b.tbl.RegMR(b.pd, b.buf[:4096], 0x40000, allRemote|mr.AccessFlushGlobal)
	if err != nil {
		t.Fatal(err)
	}
	n.filter = func(from *side, d *link.Datagram, p *bth.Packet) bool {
		return !(from == b && p.BTH.Opcode() == bth.OpRCReadRespOnly)
	}
	b.postRecv(t, RecvWR{WRID: 70, SGL: []SGE{b.sge(dstOff, 64)}})
	a.postSend(t,
		SendWR{WRID: 1, Opcode: WRAtomicWrite, SGL: []SGE{a.sge(0, 8)}, RemoteAddr: 0x40000, RKey: m.RKey(), Flags: SendSignaled},
		SendWR{WRID: 2, Opcode: WRFlush, RemoteAddr: 0x40000, RKey: m.RKey(), FlushLength: 8, FlushType: FlushGlobal, Flags: SendSignaled},
		SendWR{WRID: 3, Opcode: WRSend, SGL: []SGE{a.sge(0, 16)}, Flags: SendSignaled})
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpAtomicWrite, ByteLen: 8},
		cq.WC{WRID: 2, Opcode: cq.OpFlush, ByteLen: 8}, cq.WC{WRID: 3, Opcode: cq.OpSend, ByteLen: 16})
	if r := a.cnt.RetransPkts.Load(); r != 0 {
		t.Fatalf("%d packets sent again", r)
	}
}

// TestPlacementRDAtomic: with max_rd_atomic 1, a FLUSH and an ATOMIC WRITE wait for the READ
// before them (and each other): one outstanding at a time.
func TestPlacementRDAtomic(t *testing.T) {
	n := newNet(t)
	a := n.newSide("10.0.0.1", sideOpts{qpn: 0x11})
	b := n.newSide("10.0.0.2", sideOpts{qpn: 0x12})
	acc := allRemote | mr.AccessFlushGlobal
	n.connect(a, b, connOpts{accessA: acc, accessB: acc, rdAtomic: 1})
	m, err := b.tbl.RegMR(b.pd, b.buf[:4096], 0x40000, acc)
	if err != nil {
		t.Fatal(err)
	}
	var rec recorder
	n.filter = rec.filter
	a.postSend(t,
		SendWR{WRID: 1, Opcode: WRRDMARead, SGL: []SGE{a.sge(0, 8)}, RemoteAddr: 0x40000, RKey: m.RKey(), Flags: SendSignaled},
		SendWR{WRID: 2, Opcode: WRFlush, RemoteAddr: 0x40000, RKey: m.RKey(), FlushLength: 8, FlushType: FlushGlobal, Flags: SendSignaled},
		SendWR{WRID: 3, Opcode: WRAtomicWrite, SGL: []SGE{a.sge(0, 8)}, RemoteAddr: 0x40000, RKey: m.RKey(), Flags: SendSignaled})
	if q := a.out.q; len(q) != 1 {
		t.Fatalf("%d requests sent at once, want 1 (max_rd_atomic 1)", len(q))
	}
	n.pump()
	expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Opcode: cq.OpRDMARead, ByteLen: 8},
		cq.WC{WRID: 2, Opcode: cq.OpFlush, ByteLen: 8}, cq.WC{WRID: 3, Opcode: cq.OpAtomicWrite, ByteLen: 8})
	want := []bth.Opcode{bth.OpRCReadRequest, bth.OpRCReadRespOnly, bth.OpRCFlush, bth.OpRCReadRespOnly,
		bth.OpRCAtomicWrite, bth.OpRCReadRespOnly}
	if got := rec.ops(); len(got) != len(want) {
		t.Fatalf("packets %v, want %v", got, want)
	}
}

// TestPlacementPostErrors: what ibv_post_send refuses.
func TestPlacementPostErrors(t *testing.T) {
	_, a, _ := placementPair(t, 0)
	s8 := []SGE{a.sge(0, 8)}
	cases := []struct {
		wr   SendWR
		want error
	}{
		{SendWR{Opcode: WRAtomicWrite, SGL: []SGE{a.sge(0, 4)}, RemoteAddr: 0x40000}, ErrWRLength},
		{SendWR{Opcode: WRAtomicWrite, SGL: s8, RemoteAddr: 0x40004}, ErrWRAtomicAlign},
		{SendWR{Opcode: WRFlush, SGL: s8, FlushType: FlushGlobal}, ErrWRLength},
		{SendWR{Opcode: WRFlush}, ErrBadWR},
		{SendWR{Opcode: WRFlush, FlushType: 4}, ErrBadWR},
		{SendWR{Opcode: WRFlush, FlushType: FlushGlobal, FlushLevel: 2}, ErrBadWR},
	}
	for i, c := range cases {
		if _, err := a.qp.PostSend([]SendWR{c.wr}); !errors.Is(err, c.want) {
			t.Errorf("case %d (%v): %v, want %v", i, c.wr.Opcode, err, c.want)
		}
	}
	for _, typ := range []Type{TypeUC, TypeUD} {
		for _, op := range []WROpcode{WRFlush, WRAtomicWrite} {
			wr := SendWR{Opcode: op, SGL: s8, FlushType: FlushGlobal, AH: &AH{}}
			if op == WRFlush {
				wr.SGL = nil
			}
			if _, err := ValidateSend(typ, &wr, WRLimits{MaxSGE: 4}); !errors.Is(err, ErrWROpcode) {
				t.Errorf("%v on %v: %v, want ErrWROpcode", op, typ, err)
			}
		}
	}
	if WRFlush.String() != "FLUSH" || WRAtomicWrite.String() != "ATOMIC_WRITE" || WROpcode(12).Valid() ||
		WROpcode(12).String() != "UNKNOWN" || !WRFlush.Valid() || !WRAtomicWrite.Valid() {
		t.Error("opcode names or validity")
	}
}
