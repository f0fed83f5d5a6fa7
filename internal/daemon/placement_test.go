package daemon_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
)

// TestClientPlacement: ATOMIC WRITE and FLUSH (global visibility, both selectivity levels)
// from one daemon's client to another's, through the post encoding; the responder client's
// memfd is volatile, so a region over it cannot take AccessFlushPersistent (EINVAL), and a
// persistent FLUSH at a global-only region is NAKed (remote access error).
func TestClientPlacement(t *testing.T) {
	da, db := memPair(t)
	ca, cb := da.dial(t), db.dial(t)
	a := newEnd(t, ca, 64<<10, 16, rcAccess)
	b := newEnd(t, cb, 64<<10, 16, rcAccess|mr.AccessFlushGlobal)
	if _, err := cb.RegMR(b.pd, b.buf, 0x900000, rcAccess|mr.AccessFlushPersistent); !errors.Is(err, mr.ErrInvalidArg) {
		t.Fatalf("persistent region over a memfd: %v, want ErrInvalidArg", err)
	}
	a.connect(t, ipB, b.q.Num(), 1)
	b.connect(t, ipA, a.q.Num(), 1)
	if err := b.q.Modify(&qp.Attr{AccessFlags: rcAccess | mr.AccessFlushGlobal | mr.AccessFlushPersistent}, qp.AttrAccessFlags); err != nil {
		t.Fatal(err)
	}
	pattern(a.buf, 5)
	if _, err := a.q.PostSend([]qp.SendWR{
		{WRID: 1, Opcode: qp.WRRDMAWrite, SGL: []qp.SGE{{Addr: a.iova, Length: 4096, LKey: a.m.LKey()}}, RemoteAddr: b.iova, RKey: b.m.RKey()},
		{WRID: 2, Opcode: qp.WRAtomicWrite, Flags: qp.SendSignaled, SGL: []qp.SGE{{Addr: a.iova + 8192, Length: 8, LKey: a.m.LKey()}},
			RemoteAddr: b.iova + 8192, RKey: b.m.RKey()},
		{WRID: 3, Opcode: qp.WRFlush, Flags: qp.SendSignaled, RemoteAddr: b.iova, RKey: b.m.RKey(), FlushLength: 8200,
			FlushType: qp.FlushGlobal},
		{WRID: 4, Opcode: qp.WRFlush, Flags: qp.SendSignaled, RKey: b.m.RKey(), FlushType: qp.FlushGlobal, FlushLevel: qp.FlushMR},
	}); err != nil {
		t.Fatal(err)
	}
	wcs := a.wait(t, 3)
	want := []cq.WC{{WRID: 2, Opcode: cq.OpAtomicWrite, ByteLen: 8}, {WRID: 3, Opcode: cq.OpFlush, ByteLen: 8200},
		{WRID: 4, Opcode: cq.OpFlush}}
	for i, w := range want {
		if g := wcs[i]; g.WRID != w.WRID || g.Status != cq.StatusSuccess || g.Opcode != w.Opcode || g.ByteLen != w.ByteLen {
			t.Fatalf("completion %d: %+v, want %+v", i, g, w)
		}
	}
	if !bytes.Equal(b.buf[:4096], a.buf[:4096]) || !bytes.Equal(b.buf[8192:8200], a.buf[8192:8200]) {
		t.Fatal("WRITE or ATOMIC WRITE bytes differ in B's memfd")
	}
	// The 8 bytes given inline (what ibv_wr_atomic_write copies) on a QP with no inline
	// capacity: the operand, carried in the post message.
	word := []byte("operand!")
	if _, err := a.q.PostSend([]qp.SendWR{{WRID: 9, Opcode: qp.WRAtomicWrite, Flags: qp.SendSignaled | qp.SendInline,
		Inline: word, RemoteAddr: b.iova + 8208, RKey: b.m.RKey()}}); err != nil {
		t.Fatal("inline ATOMIC WRITE:", err)
	}
	if wc := a.wait(t, 1)[0]; wc.WRID != 9 || wc.Status != cq.StatusSuccess || wc.Opcode != cq.OpAtomicWrite ||
		!bytes.Equal(b.buf[8208:8216], word) {
		t.Fatalf("inline ATOMIC WRITE: %+v, B's word %q", wc, b.buf[8208:8216])
	}
	if _, err := a.q.PostSend([]qp.SendWR{{WRID: 5, Opcode: qp.WRFlush, Flags: qp.SendSignaled, RemoteAddr: b.iova,
		RKey: b.m.RKey(), FlushLength: 8, FlushType: qp.FlushPersistent}}); err != nil {
		t.Fatal(err)
	}
	if wc := a.wait(t, 1)[0]; wc.WRID != 5 || wc.Status != cq.StatusRemAccessErr {
		t.Fatalf("persistent FLUSH at a global-only region: %+v", wc)
	}
}
