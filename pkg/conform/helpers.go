package conform

import (
	"encoding/binary"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/rocetest"
	"github.com/softroce/softroce/pkg/bth"
)

// Shorthands the scenarios share.

func p[T any](v T) *T { return &v }

func sendOnly(psn bth.PSN, payload []byte, ackReq bool) rocetest.Spec {
	return rocetest.Spec{Opcode: bth.OpRCSendOnly, PSN: psn, AckReq: ackReq, Payload: payload}
}

func writeOnly(psn bth.PSN, m MRInfo, off int, payload []byte, ackReq bool) rocetest.Spec {
	return rocetest.Spec{Opcode: bth.OpRCWriteOnly, PSN: psn, AckReq: ackReq, Payload: payload,
		RETH: &bth.RETHFields{VA: m.VA + uint64(off), RKey: m.RKey, DMALen: uint32(len(payload))}}
}

func readReq(psn bth.PSN, va uint64, rkey, n uint32) rocetest.Spec {
	return rocetest.Spec{Opcode: bth.OpRCReadRequest, PSN: psn, RETH: &bth.RETHFields{VA: va, RKey: rkey, DMALen: n}}
}

func atomicReq(op bth.Opcode, psn bth.PSN, va uint64, rkey uint32, swapAdd, compare uint64) rocetest.Spec {
	return rocetest.Spec{Opcode: op, PSN: psn, AtomicETH: &bth.AtomicETHFields{VA: va, RKey: rkey, SwapAdd: swapAdd, Compare: compare}}
}

// memU64 reads an 8-byte value as the DUT's CPU stores it: both DUTs are little-endian
// hosts and atomics operate on host-order words (IBTA 9.4.5 leaves the byte order to the
// host; ibverbs uses the CPU's).
func memU64(b []byte) uint64 { return binary.LittleEndian.Uint64(b) }

func leU64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }

// sendMessage sends msg as an RC SEND (First/Middle/Last at the case's MTU, AckReq on the
// last packet) from c's next PSNs and returns the last PSN.
func sendMessage(c *Case, msg []byte, ops [4]bth.Opcode) bth.PSN {
	var last bth.PSN
	segs := segmentOps(len(msg), c.Cfg.MTU, ops)
	for i, s := range segs {
		last = c.Next()
		c.Send(rocetest.Spec{Opcode: s.Opcode, PSN: last, AckReq: i == len(segs)-1, Payload: msg[s.Off : s.Off+s.Len]})
	}
	return last
}

var sendOps = [4]bth.Opcode{bth.OpRCSendOnly, bth.OpRCSendFirst, bth.OpRCSendMiddle, bth.OpRCSendLast}

func segmentOps(n, mtu int, ops [4]bth.Opcode) []rocetest.Segment {
	segs := rocetest.SegmentSend(n, mtu)
	for i := range segs {
		switch segs[i].Opcode {
		case bth.OpRCSendOnly:
			segs[i].Opcode = ops[0]
		case bth.OpRCSendFirst:
			segs[i].Opcode = ops[1]
		case bth.OpRCSendMiddle:
			segs[i].Opcode = ops[2]
		case bth.OpRCSendLast:
			segs[i].Opcode = ops[3]
		}
	}
	return segs
}

// alive proves the QP still works after a packet it had to drop: a SEND Only at the
// PSN the dropped packet did not consume is ACKed with MSN msn+1 and completes.
func alive(c *Case, msn uint32) {
	c.Recv(1, 0)
	psn := c.Next()
	data := Pattern(32, 0x77)
	c.Send(sendOnly(psn, data, true))
	c.ExpectAck(psn, msn+1)
	c.ExpectCompletions(Completion{Status: cq.StatusSuccess, Opcode: cq.OpRecv, ByteLen: 32})
}

func recvWC(n int) Completion {
	return Completion{Status: cq.StatusSuccess, Opcode: cq.OpRecv, ByteLen: uint32(n)}
}
