package qp

import (
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
)

// TestRemoteAccessErrorsCounted: every request the responder refuses for its R_Key (wrong key
// byte, out of bounds, no right) is counted on the QP (RemoteAccessErrors) and in the device's
// resp_remote_access_errors, whether RC NAKs it or UC drops it silently. The UC case is the
// blind guess RoCEv2 allows: UC has no NAK and accepts any PSN, so 256 WRITEs with every
// value of an MR's key byte land exactly one; the other 255 are the count that shows it.
func TestRemoteAccessErrorsCounted(t *testing.T) {
	n := newNet(t)
	a := n.newSide("10.0.0.1", sideOpts{typ: TypeUC, qpn: 0x21})
	b := n.newSide("10.0.0.2", sideOpts{typ: TypeUC, qpn: 0x22})
	n.connect(a, b, connOpts{})
	a.fill(0, 8, 0x5a)
	idx := b.mr.RKey() >> 8
	for k := 0; k < 256; k++ {
		a.postSend(t, SendWR{WRID: uint64(k), Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 8)},
			RemoteAddr: b.va(64), RKey: mr.MakeKey(idx, uint8(k))})
	}
	n.pump()
	if got := b.qp.RemoteAccessErrors(); got != 255 {
		t.Fatalf("UC: %d refused WRITEs counted on the QP, want 255", got)
	}
	if got := b.cnt.Snapshot().RespRemoteAccessErrors; got != 255 {
		t.Fatalf("UC: resp_remote_access_errors %d, want 255", got)
	}
	if m := b.cnt.Snapshot().Map(); m["resp_remote_access_errors"] != 255 {
		t.Fatalf("Map: %v", m["resp_remote_access_errors"])
	}
	eq(t, "the one right guess", b.buf[64:72], a.buf[:8])

	// RC: a WRITE out of bounds, a READ with a wrong key: each NAKed (remote access) and
	// counted; the QP goes to ERR at the first, so each on its own connection
	for _, wr := range []SendWR{
		{WRID: 1, Opcode: WRRDMAWrite, SGL: []SGE{{Length: 8}}, RemoteAddr: 1 << 40},
		{WRID: 2, Opcode: WRRDMARead, SGL: []SGE{{Length: 8}}, RemoteAddr: 0},
		{WRID: 3, Opcode: WRAtomicFetchAndAdd, SGL: []SGE{{Length: 8}}, RemoteAddr: 0},
	} {
		n := newNet(t)
		c := n.newSide("10.0.0.3", sideOpts{qpn: 0x31})
		d := n.newSide("10.0.0.4", sideOpts{qpn: 0x32, access: mr.AccessLocalWrite | mr.AccessRemoteWrite})
		n.connect(c, d, connOpts{})
		wr.SGL[0].Addr, wr.SGL[0].LKey = c.va(0), c.mr.LKey()
		wr.Flags = SendSignaled
		wr.RKey = d.mr.RKey()
		if wr.Opcode == WRRDMARead || wr.Opcode == WRAtomicFetchAndAdd {
			wr.RemoteAddr = d.va(0) // in bounds, but the MR allows no remote read or atomic
		}
		c.postSend(t, wr)
		n.pump()
		wcs := pollAll(c.scq)
		if len(wcs) != 1 || wcs[0].Status != cq.StatusRemAccessErr {
			t.Fatalf("%v: completions %+v, want REM_ACCESS_ERR", wr.Opcode, wcs)
		}
		if d.qp.RemoteAccessErrors() != 1 || d.cnt.Snapshot().RespRemoteAccessErrors != 1 {
			t.Fatalf("%v: %d counted on the QP, %d on the device; want 1", wr.Opcode,
				d.qp.RemoteAccessErrors(), d.cnt.Snapshot().RespRemoteAccessErrors)
		}
	}
}
