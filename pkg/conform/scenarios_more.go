package conform

import (
	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/rocetest"
	"github.com/softroce/softroce/pkg/bth"
)

var moreScenarios = []Scenario{
	{
		Name: "rc-write-needs-no-recv", Section: "9.4.3, 9.7.5.2.8",
		Summary: "RDMA WRITE Only without immediate and no receive WQE posted: ACKed (only SENDs and WRITE with Immediate consume receive WQEs; no RNR)",
		Run: func(c *Case) {
			c.Setup(nil)
			m := c.MR(256, AllAccess, 0xc0)
			psn := c.Next()
			data := Pattern(48, 0xc1)
			c.Send(writeOnly(psn, m, 0, data, true))
			c.ExpectAck(psn, 1)
			c.ExpectMem("written bytes", m, 0, data)
		},
	},
	{
		Name: "rc-write-imm-zero-length", Section: "9.4.3, 9.3.7",
		Summary: "zero-length RDMA WRITE Only with Immediate (R_Key not checked): ACK, receive completion RECV_RDMA_WITH_IMM with byte_len 0 and the immediate",
		Run: func(c *Case) {
			c.Setup(nil)
			c.Recv(1, 0)
			psn := c.Next()
			c.Send(rocetest.Spec{Opcode: bth.OpRCWriteOnlyImm, PSN: psn, AckReq: true, Imm: 0x5a5a0001, RETH: &bth.RETHFields{VA: 0, RKey: 0x00bad000, DMALen: 0}})
			c.ExpectAck(psn, 1)
			c.ExpectCompletions(Completion{Status: cq.StatusSuccess, Opcode: cq.OpRecvRDMAWithImm, ByteLen: 0, Imm: 0x5a5a0001, Flags: cq.FlagWithImm})
		},
	},
	{
		Name: "rc-error-state-silent", Section: "9.9.3.1, 10.3.1",
		Summary: "after a class C error (bad R_Key NAK) the responder QP is in ERR: its posted receive completes with a flush error; a valid SEND at the next PSN gets no ACK and is not delivered",
		Run: func(c *Case) {
			c.Setup(nil)
			c.Recv(1, 0)
			m := c.MR(256, AllAccess, 0xc2)
			psn := c.Next()
			s := writeOnly(psn, m, 0, Pattern(16, 0xc3), true)
			s.RETH.RKey ^= 0x00ff0000
			c.Send(s)
			c.ExpectNAK(psn, bth.NAKRemoteAccessErr, 0)
			c.ExpectState(StateErr)
			c.Send(sendOnly(c.Next(), Pattern(16, 0xc4), true))
			c.ExpectNothing("SEND to a QP in ERR")
			// the posted receive is flushed, never filled (IBTA 10.3.1: WQEs of a QP in
			// Error complete with a flush error)
			got := c.Poll(1)
			c.Check(len(got) == 1 && got[0].Status == cq.StatusWRFlushErr, "receive completions %v, want one flush error", got)
		},
	},
	{
		Name: "rc-psn-window-ahead-max", Section: "9.7.1, 9.7.5.2.1",
		Summary: "PSN = expected + 0x7FFFFF (the farthest ahead in the 24-bit window): out of sequence, NAK PSN Sequence Error with the expected PSN",
		Run: func(c *Case) {
			c.Setup(func(q *QPConfig) { q.BenchPSN = 0xfffff0 })
			c.Recv(1, 0)
			exp := c.PSN
			c.Send(sendOnly(exp.Add(0x7fffff), Pattern(8, 0xc5), true))
			c.ExpectNAK(exp, bth.NAKPSNSeqErr, 0)
		},
	},
	{
		Name: "rc-psn-window-old-duplicate", Section: "9.7.1, 9.7.5.1.2",
		Summary: "PSN = expected - 0x400000 (in the duplicate half of the 24-bit window, across the wrap): treated as a duplicate, re-ACKed with expected-1, not delivered",
		Run: func(c *Case) {
			c.Setup(func(q *QPConfig) { q.BenchPSN = 0x000010 })
			c.Recv(2, 0)
			p0 := c.Next()
			c.Send(sendOnly(p0, Pattern(8, 0xc6), true))
			c.ExpectAck(p0, 1)
			c.Send(sendOnly(c.PSN.Add(bth.PSNMask+1-0x400000), Pattern(8, 0xc7), true))
			c.ExpectAck(p0, 1)
			c.ExpectCompletions(recvWC(8))
			c.ExpectNoCompletion("old duplicate")
		},
	},
}
