package conform

import (
	"bytes"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/rocetest"
	"github.com/softroce/softroce/pkg/bth"
)

// GRHSize is the 40-byte GRH space at the start of every UD receive buffer (IBTA 11.4.1.1,
// ibv_post_recv on UD QPs): the payload lands after it and byte_len includes it.
const GRHSize = 40

const benchQKey = 0x11111111

var ucScenarios = []Scenario{
	{
		Name: "uc-send-no-ack", Section: "9.8.3, 9.4.1",
		Summary: "UC SEND Only with AckReq set: delivered (receive completion), and no ACK (UC has none)",
		Run: func(c *Case) {
			c.Setup(func(q *QPConfig) { q.Type = UC })
			c.Recv(1, 0)
			data := Pattern(100, 0x90)
			c.Send(rocetest.Spec{Opcode: bth.OpUCSendOnly, PSN: c.Next(), AckReq: true, Payload: data})
			c.ExpectCompletions(recvWC(100))
			c.ExpectNothing("UC SEND")
			c.Check(bytes.Equal(c.RecvData(0, 100), data), "received bytes differ")
		},
	},
	{
		Name: "uc-send-multi", Section: "9.8.3, 9.7.2",
		Summary: "UC SEND First/Middle/Last of 2500 bytes: one receive completion with the message",
		Run: func(c *Case) {
			c.Setup(func(q *QPConfig) { q.Type = UC })
			c.Recv(1, 0)
			data := Pattern(2500, 0x91)
			sendMessage(c, data, [4]bth.Opcode{bth.OpUCSendOnly, bth.OpUCSendFirst, bth.OpUCSendMiddle, bth.OpUCSendLast})
			c.ExpectCompletions(recvWC(2500))
			c.Check(bytes.Equal(c.RecvData(0, 2500), data), "received bytes differ")
		},
	},
	{
		Name: "uc-write", Section: "9.8.3, 9.4.3",
		Summary: "UC RDMA WRITE Only: memory written, no ACK, no completion",
		Run: func(c *Case) {
			c.Setup(func(q *QPConfig) { q.Type = UC })
			m := c.MR(1024, AllAccess, 0x92)
			data := Pattern(200, 0x93)
			c.Send(rocetest.Spec{Opcode: bth.OpUCWriteOnly, PSN: c.Next(), Payload: data, RETH: &bth.RETHFields{VA: m.VA + 10, RKey: m.RKey, DMALen: 200}})
			c.ExpectNothing("UC WRITE")
			c.ExpectMem("written bytes", m, 10, data)
			c.ExpectNoCompletion("UC WRITE")
		},
	},
	{
		Name: "uc-psn-gap-drops-message", Section: "9.8.3.1",
		Summary:      "UC SEND First, then a Last two PSNs later (a packet lost): the message is dropped; the next SEND Only starts a new message and completes",
		RxeDeviation: "kernel rxe also drops the first SEND Only after the broken message (class D1/E handling: it resets the receive WQE and drops the packet that ended the partial message); the SEND Only after it completes",
		Softroce:     "the SEND Only that follows the gap starts a new message and completes",
		Run: func(c *Case) {
			c.Setup(func(q *QPConfig) { q.Type = UC })
			c.Recv(2, 0)
			c.Send(rocetest.Spec{Opcode: bth.OpUCSendFirst, PSN: c.Next(), Payload: Pattern(1024, 0x94)})
			c.Next() // lost Middle
			c.Send(rocetest.Spec{Opcode: bth.OpUCSendLast, PSN: c.Next(), Payload: Pattern(100, 0x94)})
			c.ExpectNoCompletion("a message with a PSN gap")
			data := Pattern(60, 0x95)
			if c.RxeDeviates() {
				c.Send(rocetest.Spec{Opcode: bth.OpUCSendOnly, PSN: c.Next(), Payload: Pattern(60, 0x9a)})
				c.ExpectNoCompletion("rxe: the SEND Only right after the broken message")
			}
			c.Send(rocetest.Spec{Opcode: bth.OpUCSendOnly, PSN: c.Next(), Payload: data})
			c.ExpectCompletions(recvWC(60))
			c.Check(bytes.Equal(c.RecvData(0, 60), data), "the completed message is not the SEND Only")
			c.ExpectNothing("UC")
		},
	},
	{
		Name: "uc-rc-opcode-dropped", Section: "9.6.1.1, 9.2.1",
		Summary: "RC SEND Only to a UC QP: dropped (opcode of the wrong transport); a UC SEND then completes",
		Run: func(c *Case) {
			c.Setup(func(q *QPConfig) { q.Type = UC })
			c.Recv(1, 0)
			c.Send(rocetest.Spec{Opcode: bth.OpRCSendOnly, PSN: c.PSN, AckReq: true, Payload: Pattern(20, 0x96)})
			c.ExpectNothing("RC opcode on UC")
			c.ExpectNoCompletion("RC opcode on UC")
			c.Send(rocetest.Spec{Opcode: bth.OpUCSendOnly, PSN: c.Next(), Payload: Pattern(24, 0x97)})
			c.ExpectCompletions(recvWC(24))
		},
	},
	{
		Name: "uc-no-recv-drops", Section: "9.8.3, 9.7.5.2.8",
		Summary: "UC SEND with no receive WQE: dropped silently (no RNR NAK on UC); after posting a receive the next SEND completes",
		Run: func(c *Case) {
			c.Setup(func(q *QPConfig) { q.Type = UC })
			c.Send(rocetest.Spec{Opcode: bth.OpUCSendOnly, PSN: c.Next(), AckReq: true, Payload: Pattern(20, 0x98)})
			c.ExpectNothing("UC SEND without a receive WQE")
			c.Recv(1, 0)
			c.Send(rocetest.Spec{Opcode: bth.OpUCSendOnly, PSN: c.Next(), Payload: Pattern(28, 0x99)})
			c.ExpectCompletions(recvWC(28))
		},
	},
}

func udSend(c *Case, qkey uint32, payload []byte) rocetest.Spec {
	return rocetest.Spec{Opcode: bth.OpUDSendOnly, PSN: c.Next(), Payload: payload,
		DETH: &bth.DETHFields{QKey: qkey, SrcQP: c.BenchQPN}}
}

func udWC(n int, src uint32) Completion {
	return Completion{Status: cq.StatusSuccess, Opcode: cq.OpRecv, ByteLen: uint32(GRHSize + n), Flags: cq.FlagGRH, SrcQP: src}
}

var udScenarios = []Scenario{
	{
		Name: "ud-send", Section: "9.8.4, 9.3.2, 11.4.1.1",
		Summary: "UD SEND Only with the QP's Q_Key: completion with byte_len = 40 (GRH) + payload, IBV_WC_GRH, src_qp = the DETH source QP; payload after the GRH",
		Run: func(c *Case) {
			c.Setup(func(q *QPConfig) { q.Type = UD })
			c.Recv(1, 0)
			data := Pattern(300, 0xa0)
			c.Send(udSend(c, benchQKey, data))
			c.ExpectCompletions(udWC(300, c.BenchQPN))
			c.Check(bytes.Equal(c.RecvData(0, GRHSize+300)[GRHSize:], data), "received bytes differ")
			c.ExpectNothing("UD has no ACK")
		},
	},
	{
		Name: "ud-send-imm", Section: "9.8.4, 9.3.7",
		Summary: "UD SEND Only with Immediate: completion with the immediate and IBV_WC_WITH_IMM|IBV_WC_GRH",
		Run: func(c *Case) {
			c.Setup(func(q *QPConfig) { q.Type = UD })
			c.Recv(1, 0)
			s := udSend(c, benchQKey, Pattern(16, 0xa1))
			s.Opcode, s.Imm = bth.OpUDSendOnlyImm, 0x0badf00d
			c.Send(s)
			w := udWC(16, c.BenchQPN)
			w.Imm, w.Flags = 0x0badf00d, cq.FlagGRH|cq.FlagWithImm
			c.ExpectCompletions(w)
		},
	},
	{
		Name: "ud-wrong-qkey", Section: "10.2.4, 9.6.1.2",
		Summary: "UD SEND with a Q_Key other than the QP's: dropped (no completion); the right Q_Key then completes",
		Run: func(c *Case) {
			c.Setup(func(q *QPConfig) { q.Type = UD })
			c.Recv(1, 0)
			c.Send(udSend(c, benchQKey^1, Pattern(16, 0xa2)))
			c.ExpectNoCompletion("wrong Q_Key")
			c.Send(udSend(c, benchQKey, Pattern(16, 0xa3)))
			c.ExpectCompletions(udWC(16, c.BenchQPN))
		},
	},
	{
		Name: "ud-too-long", Section: "9.8.4, 9.6",
		Summary:      "UD SEND Only with more payload than the path MTU (1100 > 1024): dropped",
		RxeDeviation: "kernel rxe 6.1 delivers a UD SEND longer than the MTU (no length check on receive): completion with byte_len 40 + 1100",
		Softroce:     "drops it (a UD message is one packet of at most the path MTU)",
		Run: func(c *Case) {
			c.Setup(func(q *QPConfig) { q.Type = UD })
			c.Recv(1, 0)
			c.Send(udSend(c, benchQKey, Pattern(1100, 0xa4)))
			if c.RxeDeviates() {
				c.ExpectCompletions(udWC(1100, c.BenchQPN))
				return
			}
			c.ExpectNoCompletion("UD message longer than the MTU")
		},
	},
	{
		Name: "ud-rc-opcode-dropped", Section: "9.6.1.1, 9.2.1",
		Summary: "RC SEND Only to a UD QP: dropped",
		Run: func(c *Case) {
			c.Setup(func(q *QPConfig) { q.Type = UD })
			c.Recv(1, 0)
			c.Send(rocetest.Spec{Opcode: bth.OpRCSendOnly, PSN: c.Next(), AckReq: true, Payload: Pattern(16, 0xa5)})
			c.ExpectNothing("RC opcode on UD")
			c.ExpectNoCompletion("RC opcode on UD")
		},
	},
	{
		Name: "ud-no-recv-drops", Section: "9.8.4",
		Summary: "UD SEND with no receive WQE: dropped silently (no RNR on UD); after posting one, the next SEND completes",
		Run: func(c *Case) {
			c.Setup(func(q *QPConfig) { q.Type = UD })
			c.Send(udSend(c, benchQKey, Pattern(16, 0xa6)))
			c.ExpectNothing("UD without a receive WQE")
			c.Recv(1, 0)
			c.Send(udSend(c, benchQKey, Pattern(20, 0xa7)))
			c.ExpectCompletions(udWC(20, c.BenchQPN))
		},
	},
	{
		Name: "ud-any-psn", Section: "9.8.4",
		Summary: "UD does not check PSNs: SENDs with unrelated PSNs all complete",
		Run: func(c *Case) {
			c.Setup(func(q *QPConfig) { q.Type = UD })
			c.Recv(2, 0)
			s := udSend(c, benchQKey, Pattern(8, 0xa8))
			s.PSN = 0x123456
			c.Send(s)
			s.PSN = 0x000001
			c.Send(s)
			c.ExpectCompletions(udWC(8, c.BenchQPN), udWC(8, c.BenchQPN))
		},
	},
}
