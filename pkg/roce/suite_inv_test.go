package roce

import (
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
)

// sendWithInv (TestSuite, every link): a WRITE through a fast-registered
// MR of b works; SEND_WITH_INV of its R_Key (IBTA 9.4.1.1.6, IETH) lands in
// b's receive WQE with IBV_WC_WITH_INV and the key; the same WRITE is then
// NAKed remote access error and a's QP enters ERR (IBTA 10.6.7.2.2).
func sendWithInv(t *testing.T, da, db *Device) {
	a, b := newEnd(t, da, qp.TypeRC, 4<<20), newEnd(t, db, qp.TypeRC, 4<<20)
	connect(t, a, b, qp.MTU1024, 77, 88)
	target := make([]byte, 8192)
	fr, err := db.MRTable().AllocMR(b.pd, mr.AllocMROptions{Buf: target})
	if err != nil {
		t.Fatal(err)
	}
	const iova = 0x5000_0000
	if err := fr.FastReg(mr.FastRegOptions{IOVA: iova, Length: 8192, Access: mr.AccessLocalWrite | mr.AccessRemoteWrite, Key: 9}); err != nil {
		t.Fatal(err)
	}
	key := fr.RKey()
	a.fill(0, 5000, 0x33)
	write := qp.SendWR{WRID: 1, Opcode: qp.WRRDMAWrite, SGL: a.sgl(0, 5000, 3), Flags: qp.SendSignaled, RemoteAddr: iova, RKey: key}
	post(t, a, write)
	checkWC(t, waitWC(t, a.scq, 1)[0], cq.WC{WRID: 1, Opcode: cq.OpRDMAWrite, ByteLen: 5000})
	same(t, "write through the fast-registered MR", target[:5000], a.buf[:5000])

	postRecv(t, b, qp.RecvWR{WRID: 2, SGL: b.sgl(dst, 3000, 2)})
	post(t, a, qp.SendWR{WRID: 3, Opcode: qp.WRSendWithInv, SGL: a.sgl(0, 2500, 2), Flags: qp.SendSignaled, InvRKey: key})
	checkWC(t, waitWC(t, a.scq, 1)[0], cq.WC{WRID: 3, Opcode: cq.OpSend, ByteLen: 2500})
	g := waitWC(t, b.rcq, 1)[0]
	checkWC(t, g, cq.WC{WRID: 2, Opcode: cq.OpRecv, ByteLen: 2500, Flags: cq.FlagWithInv})
	if g.InvalidatedRKey != key {
		t.Fatalf("invalidated R_Key %#x, want %#x", g.InvalidatedRKey, key)
	}
	same(t, "SEND_WITH_INV", b.buf[dst:dst+2500], a.buf[:2500])

	write.WRID = 4
	post(t, a, write)
	checkWC(t, waitWC(t, a.scq, 1)[0], cq.WC{WRID: 4, Status: cq.StatusRemAccessErr, Opcode: cq.OpRDMAWrite})
	if s := a.qp.State(); s != qp.StateErr {
		t.Fatalf("requester state %v after REM_ACCESS_ERR, want ERR", s)
	}
}
