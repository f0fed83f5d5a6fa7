package conform

import (
	"bytes"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/rocetest"
	"github.com/softroce/softroce/pkg/bth"
)

// RC responder: SEND, ACK generation, PSN checks and duplicates.
var rcSendScenarios = []Scenario{
	{
		Name: "rc-send-only-ack", Section: "9.7.5.1.1",
		Summary: "SEND Only with AckReq: ACK for its PSN with MSN 1; receive completion with the bytes",
		Run: func(c *Case) {
			c.Setup(nil)
			c.Recv(1, 0)
			data := Pattern(64, 1)
			psn := c.Next()
			c.Send(sendOnly(psn, data, true))
			c.ExpectAck(psn, 1)
			c.ExpectCompletions(recvWC(64))
			c.Check(bytes.Equal(c.RecvData(0, 64), data), "received bytes differ")
		},
	},
	{
		Name: "rc-send-multi-ack-last", Section: "9.7.2, 9.7.5.1.1",
		Summary: "3000-byte SEND as First/Middle/Last (MTU 1024), AckReq on Last only: exactly one ACK, for the Last PSN, MSN 1",
		Run: func(c *Case) {
			c.Setup(nil)
			c.Recv(1, 0)
			data := Pattern(3000, 2)
			last := sendMessage(c, data, sendOps)
			c.ExpectAck(last, 1)
			c.ExpectNothing("after the ACK of the message")
			c.ExpectCompletions(recvWC(3000))
			c.Check(bytes.Equal(c.RecvData(0, 3000), data), "reassembled bytes differ")
		},
	},
	{
		Name: "rc-ack-coalescing", Section: "9.7.5.1.1",
		Summary:  "three SEND Only without AckReq, then one with AckReq: no ACK until the fourth, then one coalesced ACK with MSN 4",
		Softroce: "ACKs only packets with AckReq (like rxe); the spec also allows unsolicited ACKs",
		Run: func(c *Case) {
			c.Setup(nil)
			c.Recv(4, 0)
			for range 3 {
				c.Send(sendOnly(c.Next(), Pattern(16, 3), false))
			}
			c.ExpectNothing("SENDs without AckReq")
			psn := c.Next()
			c.Send(sendOnly(psn, Pattern(16, 3), true))
			c.ExpectAck(psn, 4)
			c.ExpectCompletions(recvWC(16), recvWC(16), recvWC(16), recvWC(16))
		},
	},
	{
		Name: "rc-ackreq-mid-message", Section: "9.7.5.1.1",
		Summary: "AckReq on a SEND First: ACK for that PSN with MSN 0 (message incomplete), then ACK of the Last with MSN 1",
		Run: func(c *Case) {
			c.Setup(nil)
			c.Recv(1, 0)
			data := Pattern(2048+100, 4)
			p0 := c.Next()
			c.Send(rocetest.Spec{Opcode: bth.OpRCSendFirst, PSN: p0, AckReq: true, Payload: data[:1024]})
			c.ExpectAck(p0, 0)
			c.Send(rocetest.Spec{Opcode: bth.OpRCSendMiddle, PSN: c.Next(), Payload: data[1024:2048]})
			p2 := c.Next()
			c.Send(rocetest.Spec{Opcode: bth.OpRCSendLast, PSN: p2, AckReq: true, Payload: data[2048:]})
			c.ExpectAck(p2, 1)
			c.ExpectCompletions(recvWC(len(data)))
		},
	},
	{
		Name: "rc-send-imm", Section: "9.3.7, 9.4.1",
		Summary: "SEND Only with Immediate: ACK; completion RECV with IBV_WC_WITH_IMM and the immediate value",
		Run: func(c *Case) {
			c.Setup(nil)
			c.Recv(1, 0)
			psn := c.Next()
			c.Send(rocetest.Spec{Opcode: bth.OpRCSendOnlyImm, PSN: psn, AckReq: true, Imm: 0xdeadbeef, Payload: Pattern(40, 5)})
			c.ExpectAck(psn, 1)
			c.ExpectCompletions(Completion{Status: cq.StatusSuccess, Opcode: cq.OpRecv, ByteLen: 40, Imm: 0xdeadbeef, Flags: cq.FlagWithImm})
		},
	},
	{
		Name: "rc-send-zero-length", Section: "9.4.1, 9.7.2",
		Summary: "zero-length SEND Only: ACK MSN 1, receive completion with byte_len 0",
		Run: func(c *Case) {
			c.Setup(nil)
			c.Recv(1, 0)
			psn := c.Next()
			c.Send(sendOnly(psn, nil, true))
			c.ExpectAck(psn, 1)
			c.ExpectCompletions(recvWC(0))
		},
	},
	{
		Name: "rc-send-pad", Section: "9.2.5",
		Summary: "61-byte SEND (PadCnt 3): the pad is stripped, byte_len 61, bytes intact and nothing written past them",
		Run: func(c *Case) {
			c.Setup(nil)
			c.Recv(1, 0)
			data := Pattern(61, 6)
			psn := c.Next()
			c.Send(sendOnly(psn, data, true))
			c.ExpectAck(psn, 1)
			c.ExpectCompletions(recvWC(61))
			got := c.RecvData(0, 64)
			c.Check(bytes.Equal(got[:61], data), "received bytes differ")
			c.Check(bytes.Equal(got[61:], []byte{0, 0, 0}), "pad bytes written into the buffer: % x", got[61:])
		},
	},
	{
		Name: "rc-psn-wrap", Section: "9.7.1",
		Summary: "PSNs 0xfffffe, 0xffffff, 0x000000: all in order across the 24-bit wrap, ACKed with MSN 1, 2, 3",
		Run: func(c *Case) {
			c.Setup(func(q *QPConfig) { q.BenchPSN = 0xfffffe })
			c.Recv(3, 0)
			for i := range 3 {
				psn := c.Next()
				c.Send(sendOnly(psn, Pattern(8, 7), true))
				c.ExpectAck(psn, uint32(i+1))
			}
			c.Check(c.PSN == 1, "bench PSN did not wrap")
			c.ExpectCompletions(recvWC(8), recvWC(8), recvWC(8))
		},
	},
	{
		Name: "rc-send-rnr", Section: "9.7.5.2.8",
		Summary: "SEND with no receive WQE: RNR NAK for its PSN with the QP's min_rnr_timer code (14), MSN 0; after a receive is posted the same PSN is ACKed",
		Run: func(c *Case) {
			c.Setup(nil)
			psn := c.Next()
			c.Send(sendOnly(psn, Pattern(32, 8), true))
			c.ExpectRNR(psn, DefaultMinRNRTimer, 0)
			c.ExpectState(StateRTS)
			c.Recv(1, 0)
			c.Send(sendOnly(psn, Pattern(32, 8), true))
			c.ExpectAck(psn, 1)
			c.ExpectCompletions(recvWC(32))
		},
	},
	{
		Name: "rc-send-rnr-timer-code", Section: "9.7.5.2.8, 10.2.6",
		Summary: "the RNR NAK carries the responder's configured min_rnr_timer (code 1 here, 0.01 ms)",
		Run: func(c *Case) {
			c.Setup(func(q *QPConfig) { q.MinRNRTimer = 1 })
			psn := c.Next()
			c.Send(sendOnly(psn, Pattern(32, 9), true))
			c.ExpectRNR(psn, 1, 0)
		},
	},
	{
		Name: "rc-write-imm-rnr", Section: "9.7.5.2.8, 9.4.3",
		Summary: "RDMA WRITE Only with Immediate and no receive WQE: RNR NAK (it consumes a receive WQE), memory untouched",
		Run: func(c *Case) {
			c.Setup(nil)
			m := c.MR(256, AllAccess, 0x10)
			psn := c.Next()
			s := writeOnly(psn, m, 0, Pattern(64, 10), true)
			s.Opcode, s.Imm = bth.OpRCWriteOnlyImm, 0x01020304
			c.Send(s)
			c.ExpectRNR(psn, DefaultMinRNRTimer, 0)
		},
	},
	{
		Name: "rc-send-too-long", Section: "9.7.5.2.2, 9.9.3.1",
		Summary:      "SEND longer than the posted receive buffer: NAK Invalid Request, receive completion with a local length error, QP to ERR",
		RxeDeviation: "kernel rxe NAKs with Remote Operational Error (0x63) instead of Invalid Request, and completes the receive WQE with IBV_WC_LOC_QP_OP_ERR instead of IBV_WC_LOC_LEN_ERR (the copy into the receive WQE fails and rxe reports a malformed WQE)",
		Softroce:     "NAK Invalid Request (what hardware RNICs send: the requester sees IBV_WC_REM_INV_REQ_ERR), IBV_WC_LOC_LEN_ERR on the receive queue",
		Run: func(c *Case) {
			c.Setup(nil)
			c.Recv(1, 100)
			psn := c.Next()
			c.Send(sendOnly(psn, Pattern(200, 11), true))
			code, st := uint8(bth.NAKInvalidRequest), cq.StatusLocLenErr
			if c.RxeDeviates() {
				code, st = bth.NAKRemoteOpErr, cq.StatusLocQPOpErr
			}
			c.ExpectNAK(psn, code, 0)
			got := c.Poll(1)
			c.Check(len(got) == 1 && got[0].Status == st, "receive completion %v, want status %v", got, st)
			c.ExpectState(StateErr)
		},
	},
	{
		Name: "rc-psn-ahead-nak-once", Section: "9.7.5.2.1",
		Summary: "PSN ahead of the expected one: one PSN Sequence Error NAK carrying the expected PSN, then silence for further out-of-order packets; the expected PSN is then ACKed",
		Run: func(c *Case) {
			c.Setup(nil)
			c.Recv(2, 0)
			exp := c.PSN
			c.Send(sendOnly(exp.Add(2), Pattern(16, 12), true))
			c.ExpectNAK(exp, bth.NAKPSNSeqErr, 0)
			c.Send(sendOnly(exp.Add(3), Pattern(16, 12), true))
			c.ExpectNothing("second out-of-order packet")
			c.Send(sendOnly(c.Next(), Pattern(16, 12), true))
			c.ExpectAck(exp, 1)
			c.ExpectCompletions(recvWC(16))
		},
	},
	{
		Name: "rc-dup-send-reack", Section: "9.7.5.1.2",
		Summary: "duplicate SEND (already ACKed PSN, other bytes): re-ACKed with the last completed PSN and MSN, not delivered again",
		Run: func(c *Case) {
			c.Setup(nil)
			c.Recv(2, 0)
			psn := c.Next()
			a := Pattern(48, 13)
			c.Send(sendOnly(psn, a, true))
			c.ExpectAck(psn, 1)
			c.Send(sendOnly(psn, Pattern(48, 14), true))
			c.ExpectAck(psn, 1)
			c.ExpectCompletions(recvWC(48))
			c.ExpectNoCompletion("duplicate SEND")
			c.Check(bytes.Equal(c.RecvData(0, 48), a), "first receive buffer changed")
			c.Check(bytes.Equal(c.RecvData(1, 48), make([]byte, 48)), "duplicate written into the second receive buffer")
		},
	},
	{
		Name: "rc-dup-send-no-ackreq", Section: "9.7.5.1.2 (C9-105)",
		Summary: "a duplicate SEND is ACKed even without AckReq (the requester is retrying, its ACK was lost)",
		Run: func(c *Case) {
			c.Setup(nil)
			c.Recv(1, 0)
			psn := c.Next()
			c.Send(sendOnly(psn, Pattern(8, 15), true))
			c.ExpectAck(psn, 1)
			c.Send(sendOnly(psn, Pattern(8, 15), false))
			c.ExpectAck(psn, 1)
		},
	},
	{
		Name: "rc-dup-older-send", Section: "9.7.5.1.2",
		Summary: "duplicate of an older SEND (two messages back): ACK with the most recent completed PSN and MSN 2",
		Run: func(c *Case) {
			c.Setup(nil)
			c.Recv(2, 0)
			p0 := c.Next()
			c.Send(sendOnly(p0, Pattern(8, 16), true))
			c.ExpectAck(p0, 1)
			p1 := c.Next()
			c.Send(sendOnly(p1, Pattern(8, 16), true))
			c.ExpectAck(p1, 2)
			c.Send(sendOnly(p0, Pattern(8, 16), true))
			c.ExpectAck(p1, 2)
			c.ExpectCompletions(recvWC(8), recvWC(8))
			c.ExpectNoCompletion("duplicate")
		},
	},
	sendLengthScenario("rc-send-middle-short", "SEND Middle shorter than the MTU (First 1024, Middle 500)", []int{1024, 500, 100}, 1),
	sendLengthScenario("rc-send-first-short", "SEND First shorter than the MTU (First 512, Last 100)", []int{512, 100}, 0),
	sendLengthScenario("rc-send-last-long", "SEND Last longer than the MTU (First 1024, Last 1100)", []int{1024, 1100}, 1),
	sendLengthScenario("rc-send-only-long", "SEND Only longer than the MTU (1100 bytes)", []int{1100}, 0),
}

const rxeNoSendLengthCheck = "kernel rxe 6.1 does not check SEND packet lengths against the path MTU (its check_length() is empty in 6.1; length checks came later): the packet is accepted and the message completes with the bytes received"

// sendLengthScenario: a SEND message whose packet lengths break the MTU rule (IBTA
// 9.7.4.1.6: First and Middle carry exactly PMTU bytes, Last and Only 1..PMTU) must be
// NAKed Invalid Request at the offending packet (index bad of sizes).
func sendLengthScenario(name, what string, sizes []int, bad int) Scenario {
	return Scenario{
		Name: name, Section: "9.7.4.1.6, 9.7.5.2.2",
		Summary:      what + ": NAK Invalid Request at the offending PSN, no completion of the message",
		RxeDeviation: rxeNoSendLengthCheck,
		Softroce:     "NAK Invalid Request (class C), the receive WQE completes in error and the QP goes to ERR",
		Run: func(c *Case) {
			c.Setup(nil)
			c.Recv(1, 0)
			total := 0
			var last bth.PSN
			for i, n := range sizes {
				op := bth.OpRCSendMiddle
				switch {
				case len(sizes) == 1:
					op = bth.OpRCSendOnly
				case i == 0:
					op = bth.OpRCSendFirst
				case i == len(sizes)-1:
					op = bth.OpRCSendLast
				}
				last = c.Next()
				c.Send(rocetest.Spec{Opcode: op, PSN: last, AckReq: i == len(sizes)-1, Payload: Pattern(n, byte(17+i))})
				total += n
				if i == bad && !c.RxeDeviates() {
					c.ExpectNAK(last, bth.NAKInvalidRequest, 0)
					c.ExpectState(StateErr)
					got := c.Poll(1)
					c.Check(len(got) == 1 && got[0].Status != cq.StatusSuccess, "receive completion %v, want one in error", got)
					return
				}
			}
			// rxe: the message is accepted as sent
			c.ExpectAck(last, 1)
			c.ExpectCompletions(recvWC(total))
		},
	}
}

// RC responder: opcode sequence rules (IBTA 9.7.4.1.5 / 9.7.5.2.2, class C errors).
var rcSeqScenarios = []Scenario{
	seqScenario("rc-seq-send-middle-no-first", "SEND Middle without a First", nil, bth.OpRCSendMiddle),
	seqScenario("rc-seq-send-last-no-first", "SEND Last without a First", nil, bth.OpRCSendLast),
	seqScenario("rc-seq-write-middle-no-first", "RDMA WRITE Middle without a First", nil, bth.OpRCWriteMiddle),
	seqScenario("rc-seq-write-last-no-first", "RDMA WRITE Last without a First", nil, bth.OpRCWriteLast),
	seqScenario("rc-seq-send-only-inside-send", "SEND Only while a SEND message is open (First seen)", []bth.Opcode{bth.OpRCSendFirst}, bth.OpRCSendOnly),
	seqScenario("rc-seq-send-first-inside-send", "SEND First while a SEND message is open", []bth.Opcode{bth.OpRCSendFirst}, bth.OpRCSendFirst),
	seqScenario("rc-seq-write-middle-inside-send", "RDMA WRITE Middle while a SEND message is open", []bth.Opcode{bth.OpRCSendFirst}, bth.OpRCWriteMiddle),
	seqScenario("rc-seq-send-last-inside-write", "SEND Last while an RDMA WRITE message is open", []bth.Opcode{bth.OpRCWriteFirst}, bth.OpRCSendLast),
	seqScenario("rc-seq-read-inside-write", "RDMA READ request while an RDMA WRITE message is open", []bth.Opcode{bth.OpRCWriteFirst}, bth.OpRCReadRequest),
}

// seqScenario: the opcodes in before are sent in order (First packets carry MTU bytes),
// then bad: the responder must NAK Invalid Request at bad's PSN (IBTA 9.7.5.2.2), MSN 0.
func seqScenario(name, what string, before []bth.Opcode, bad bth.Opcode) Scenario {
	return Scenario{
		Name: name, Section: "9.7.4.1.5, 9.7.5.2.2",
		Summary: what + ": NAK Invalid Request at its PSN, QP to ERR (class C)",
		Run: func(c *Case) {
			c.Setup(nil)
			c.Recv(1, 0)
			m := c.MR(8192, AllAccess, 0x21)
			build := func(op bth.Opcode, psn bth.PSN) rocetest.Spec {
				s := rocetest.Spec{Opcode: op, PSN: psn}
				info := op.Info()
				if info.Payload {
					s.Payload = Pattern(c.Cfg.MTU, 0x22)
					if info.Last {
						s.Payload = s.Payload[:100]
					}
				}
				if info.Hdrs&bth.HdrRETH != 0 {
					s.RETH = &bth.RETHFields{VA: m.VA, RKey: m.RKey, DMALen: 4096}
					if info.Kind == bth.KindReadReq {
						s.RETH.DMALen = 64
					}
				}
				return s
			}
			for _, op := range before {
				c.Send(build(op, c.Next()))
			}
			psn := c.Next()
			s := build(bad, psn)
			s.AckReq = true
			c.Send(s)
			c.ExpectNAK(psn, bth.NAKInvalidRequest, 0)
			c.ExpectState(StateErr)
		},
	}
}

// RC responder: RDMA WRITE.
var rcWriteScenarios = []Scenario{
	{
		Name: "rc-write-only", Section: "9.4.3, 9.7.5.1.1",
		Summary: "RDMA WRITE Only: memory written at VA, ACK MSN 1, no completion at the responder",
		Run: func(c *Case) {
			c.Setup(nil)
			m := c.MR(4096, AllAccess, 0x30)
			data := Pattern(100, 0x31)
			psn := c.Next()
			c.Send(writeOnly(psn, m, 300, data, true))
			c.ExpectAck(psn, 1)
			c.ExpectMem("written bytes", m, 300, data)
			c.ExpectMem("bytes before the write", m, 0, Pattern(4096, 0x30)[:300])
			c.ExpectNoCompletion("RDMA WRITE without immediate")
		},
	},
	{
		Name: "rc-write-multi", Section: "9.4.3, 9.7.4.1.6",
		Summary: "3000-byte RDMA WRITE First/Middle/Last (RETH on the First only): memory written, one ACK for the Last, MSN 1",
		Run: func(c *Case) {
			c.Setup(nil)
			m := c.MR(8192, AllAccess, 0x32)
			data := Pattern(3000, 0x33)
			segs := rocetest.SegmentSend(len(data), c.Cfg.MTU)
			var last bth.PSN
			for i, s := range segs {
				last = c.Next()
				sp := rocetest.Spec{Opcode: []bth.Opcode{bth.OpRCWriteFirst, bth.OpRCWriteMiddle, bth.OpRCWriteLast}[min(i, 2)], PSN: last, Payload: data[s.Off : s.Off+s.Len], AckReq: i == len(segs)-1}
				if i == 0 {
					sp.RETH = &bth.RETHFields{VA: m.VA + 1000, RKey: m.RKey, DMALen: 3000}
				}
				c.Send(sp)
			}
			c.ExpectAck(last, 1)
			c.ExpectMem("written bytes", m, 1000, data)
		},
	},
	{
		Name: "rc-write-imm", Section: "9.4.3, 9.3.7",
		Summary: "RDMA WRITE Only with Immediate: memory written, ACK, receive completion RECV_RDMA_WITH_IMM with the immediate and byte_len = DMA length",
		Run: func(c *Case) {
			c.Setup(nil)
			c.Recv(1, 0)
			m := c.MR(1024, AllAccess, 0x34)
			data := Pattern(64, 0x35)
			psn := c.Next()
			s := writeOnly(psn, m, 8, data, true)
			s.Opcode, s.Imm = bth.OpRCWriteOnlyImm, 0xcafe0001
			c.Send(s)
			c.ExpectAck(psn, 1)
			c.ExpectCompletions(Completion{Status: cq.StatusSuccess, Opcode: cq.OpRecvRDMAWithImm, ByteLen: 64, Imm: 0xcafe0001, Flags: cq.FlagWithImm})
			c.ExpectMem("written bytes", m, 8, data)
		},
	},
	{
		Name: "rc-write-zero-length", Section: "9.4.3, 9.7.4.1.6",
		Summary: "zero-length RDMA WRITE Only with an invalid R_Key and VA 0: ACKed (no key check for a zero-length transfer)",
		Run: func(c *Case) {
			c.Setup(nil)
			psn := c.Next()
			c.Send(rocetest.Spec{Opcode: bth.OpRCWriteOnly, PSN: psn, AckReq: true, RETH: &bth.RETHFields{VA: 0, RKey: 0x00bad000, DMALen: 0}})
			c.ExpectAck(psn, 1)
			c.ExpectState(StateRTS)
		},
	},
	accessScenario("rc-write-bad-rkey", "RDMA WRITE with an R_Key no region has", "write", accBadKey),
	accessScenario("rc-write-out-of-bounds", "RDMA WRITE ending past the region", "write", accBounds),
	accessScenario("rc-write-no-permission", "RDMA WRITE to a region registered without REMOTE_WRITE", "write", accPerm),
	{
		Name: "rc-write-middle-short", Section: "9.7.4.1.6, 9.7.5.2.2",
		Summary: "RDMA WRITE Middle shorter than the MTU: NAK Invalid Request at its PSN",
		Run: func(c *Case) {
			c.Setup(nil)
			m := c.MR(8192, AllAccess, 0x36)
			c.Send(rocetest.Spec{Opcode: bth.OpRCWriteFirst, PSN: c.Next(), Payload: Pattern(1024, 0x37), RETH: &bth.RETHFields{VA: m.VA, RKey: m.RKey, DMALen: 2500}})
			p1 := c.Next()
			c.Send(rocetest.Spec{Opcode: bth.OpRCWriteMiddle, PSN: p1, Payload: Pattern(500, 0x37)})
			c.ExpectNAK(p1, bth.NAKInvalidRequest, 0)
		},
	},
	{
		Name: "rc-write-last-long", Section: "9.7.4.1.6, 9.7.5.2.2",
		Summary: "RDMA WRITE Last longer than the MTU: NAK Invalid Request at its PSN",
		Run: func(c *Case) {
			c.Setup(nil)
			m := c.MR(8192, AllAccess, 0x38)
			c.Send(rocetest.Spec{Opcode: bth.OpRCWriteFirst, PSN: c.Next(), Payload: Pattern(1024, 0x39), RETH: &bth.RETHFields{VA: m.VA, RKey: m.RKey, DMALen: 2124}})
			p1 := c.Next()
			c.Send(rocetest.Spec{Opcode: bth.OpRCWriteLast, PSN: p1, AckReq: true, Payload: Pattern(1100, 0x39)})
			c.ExpectNAK(p1, bth.NAKInvalidRequest, 0)
		},
	},
	{
		Name: "rc-write-exceeds-dmalen", Section: "9.4.3, 9.7.5.2.2",
		Summary: "RDMA WRITE whose packets carry more than the RETH DMA length (1024 + 1000 for 1500): NAK Invalid Request at the Last",
		Run: func(c *Case) {
			c.Setup(nil)
			m := c.MR(8192, AllAccess, 0x3a)
			c.Send(rocetest.Spec{Opcode: bth.OpRCWriteFirst, PSN: c.Next(), Payload: Pattern(1024, 0x3b), RETH: &bth.RETHFields{VA: m.VA, RKey: m.RKey, DMALen: 1500}})
			p1 := c.Next()
			c.Send(rocetest.Spec{Opcode: bth.OpRCWriteLast, PSN: p1, AckReq: true, Payload: Pattern(1000, 0x3b)})
			c.ExpectNAK(p1, bth.NAKInvalidRequest, 0)
			c.ExpectMem("bytes past the DMA length", m, 1500, Pattern(8192, 0x3a)[1500:2024])
		},
	},
	{
		Name: "rc-write-only-short-of-dmalen", Section: "9.4.3, 9.7.5.2.2",
		Summary: "RDMA WRITE Only carrying fewer bytes than its DMA length (100 of 200): NAK Invalid Request",
		Run: func(c *Case) {
			c.Setup(nil)
			m := c.MR(1024, AllAccess, 0x3c)
			psn := c.Next()
			s := writeOnly(psn, m, 0, Pattern(100, 0x3d), true)
			s.RETH.DMALen = 200
			c.Send(s)
			c.ExpectNAK(psn, bth.NAKInvalidRequest, 0)
		},
	},
	{
		Name: "rc-dup-write", Section: "9.7.5.1.2",
		Summary: "duplicate RDMA WRITE with other bytes: re-ACKed, memory keeps the first write",
		Run: func(c *Case) {
			c.Setup(nil)
			m := c.MR(1024, AllAccess, 0x3e)
			a := Pattern(64, 0x3f)
			psn := c.Next()
			c.Send(writeOnly(psn, m, 0, a, true))
			c.ExpectAck(psn, 1)
			c.Send(writeOnly(psn, m, 0, Pattern(64, 0x40), true))
			c.ExpectAck(psn, 1)
			c.ExpectMem("memory after the duplicate", m, 0, a)
		},
	},
	{
		Name: "rc-qp-no-remote-write", Section: "9.7.5.2.2, 10.2.2",
		Summary: "RDMA WRITE to a QP whose access flags lack REMOTE_WRITE (the region allows it): NAK Invalid Request (an operation the receive queue does not support), not executed",
		Run: func(c *Case) {
			c.Setup(func(q *QPConfig) { q.Access = mr.AccessLocalWrite | mr.AccessRemoteRead })
			m := c.MR(1024, AllAccess, 0x41)
			psn := c.Next()
			c.Send(writeOnly(psn, m, 0, Pattern(32, 0x42), true))
			c.ExpectNAK(psn, bth.NAKInvalidRequest, 0)
			c.ExpectMem("memory", m, 0, Pattern(1024, 0x41)[:32])
		},
	},
}

type accessFault uint8

const (
	accBadKey accessFault = iota
	accBounds
	accPerm
)

// accessScenario: a WRITE/READ/atomic that fails the R_Key check (IBTA 9.7.5.2.4? remote
// access error, class C, 9.9.3.1): NAK Remote Access Error at its PSN, nothing executed,
// the responder QP goes to ERR.
func accessScenario(name, what, op string, f accessFault) Scenario {
	return Scenario{
		Name: name, Section: "9.7.5.2.4, 9.9.3.1, 10.6.7.2",
		Summary: what + ": NAK Remote Access Error at its PSN, nothing executed, QP to ERR",
		Run: func(c *Case) {
			c.Setup(nil)
			acc := AllAccess
			if f == accPerm {
				switch op {
				case "write":
					acc &^= mr.AccessRemoteWrite
				case "read":
					acc &^= mr.AccessRemoteRead
				case "atomic":
					acc &^= mr.AccessRemoteAtomic
				}
			}
			m := c.MR(1024, acc, 0x50)
			va, rkey := m.VA+16, m.RKey
			n := 64
			switch f {
			case accBadKey:
				rkey ^= 0x00ff0000
			case accBounds:
				va = m.VA + 1024 - 32
			}
			psn := c.Next()
			var s rocetest.Spec
			switch op {
			case "write":
				s = rocetest.Spec{Opcode: bth.OpRCWriteOnly, PSN: psn, AckReq: true, Payload: Pattern(n, 0x51), RETH: &bth.RETHFields{VA: va, RKey: rkey, DMALen: uint32(n)}}
			case "read":
				s = readReq(psn, va, rkey, uint32(n))
			case "atomic":
				if f == accBounds {
					va = m.VA + 1024
				}
				s = atomicReq(bth.OpRCFetchAdd, psn, va, rkey, 1, 0)
			}
			c.Send(s)
			c.ExpectNAK(psn, bth.NAKRemoteAccessErr, 0)
			c.ExpectMem("region", m, 0, Pattern(1024, 0x50))
			c.ExpectState(StateErr)
		},
	}
}
