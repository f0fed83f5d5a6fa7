package conform

import (
	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/rocetest"
	"github.com/softroce/softroce/pkg/bth"
)

func postSend(c *Case, s SendConfig) {
	if err := c.B.DUT.PostSend(c.QPN, s); err != nil {
		c.Fatalf("post send: %v", err)
	}
}

var req2Scenarios = []Scenario{
	{
		Name: "req-coalesced-ack", Section: "9.7.5.1.1, 9.7.6.1",
		Summary: "two DUT SENDs, one ACK for the second PSN: the ACK covers both (coalesced), both WRs complete in order",
		Run: func(c *Case) {
			m := reqSetup(c)
			postSend(c, SendConfig{Op: SendSend, MR: m.ID, Len: 16, WRID: 76})
			postSend(c, SendConfig{Op: SendSend, MR: m.ID, Len: 16, WRID: 77})
			d := c.Cfg.DUTPSN
			expectReq(c, bth.OpRCSendOnly, d, nil, nil)
			expectReq(c, bth.OpRCSendOnly, d.Add(1), nil, nil)
			c.Send(ackSpec(c, d.Add(1), bth.SyndromeACK(31), 2))
			got := c.Poll(2)
			c.Check(len(got) == 2 && got[0].WRID == 76 && got[1].WRID == 77 && got[0].Status == cq.StatusSuccess && got[1].Status == cq.StatusSuccess,
				"completions %v, want WR 76 then 77, both successful", got)
		},
	},
	{
		Name: "req-read-resume", Section: "9.7.6.1.2, 9.7.4.1.4",
		Summary: "the DUT's 3000-byte READ gets First then Last (the Middle lost): the DUT re-issues the READ from the missing PSN with VA + 1024 and the remaining 1976 bytes, and completes with the whole data",
		Run: func(c *Case) {
			m := reqSetup(c)
			const va, rkey = 0x7700_0000_0000, 0x00abcd56
			postSend(c, SendConfig{Op: SendRead, MR: m.ID, Len: 3000, RemoteVA: va, RKey: rkey, WRID: 77})
			d := c.Cfg.DUTPSN
			expectReq(c, bth.OpRCReadRequest, d, nil, nil)
			data := Pattern(3000, 0xd0)
			ack := &bth.AETHFields{Syndrome: bth.SyndromeACK(31), MSN: 1}
			c.Send(rocetest.Spec{Opcode: bth.OpRCReadRespFirst, PSN: d, AETH: ack, Payload: data[:1024]})
			c.Send(rocetest.Spec{Opcode: bth.OpRCReadRespLast, PSN: d.Add(2), AETH: ack, Payload: data[2048:]})
			r := expectReq(c, bth.OpRCReadRequest, d.Add(1), nil, nil)
			if f := r.Pkt.RETH.Fields(); f.VA != va+1024 || f.RKey != rkey || f.DMALen != 3000-1024 {
				c.Fatalf("resumed READ RETH %+v, want va %#x rkey %#x len %d", f, uint64(va+1024), rkey, 3000-1024)
			}
			c.Send(rocetest.Spec{Opcode: bth.OpRCReadRespFirst, PSN: d.Add(1), AETH: ack, Payload: data[1024:2048]})
			c.Send(rocetest.Spec{Opcode: bth.OpRCReadRespLast, PSN: d.Add(2), AETH: ack, Payload: data[2048:]})
			expectSendWC(c, cq.OpRDMARead, cq.StatusSuccess)
			c.ExpectMem("READ data", m, 0, data)
		},
	},
	{
		Name: "req-nak-invalid-request", Section: "9.7.5.2.2, 9.9.2",
		Summary: "an Invalid Request NAK for the DUT's SEND: the WR completes with IBV_WC_REM_INV_REQ_ERR and the QP goes to ERR",
		Run: func(c *Case) {
			m := reqSetup(c)
			postSend(c, SendConfig{Op: SendSend, MR: m.ID, Len: 16, WRID: 77})
			d := c.Cfg.DUTPSN
			expectReq(c, bth.OpRCSendOnly, d, nil, nil)
			c.Send(ackSpec(c, d, bth.SyndromeNAK(bth.NAKInvalidRequest), 0))
			expectSendWC(c, cq.OpSend, cq.StatusRemInvReqErr)
			c.ExpectState(StateErr)
		},
	},
	{
		Name: "req-rnr-retry-exceeded", Section: "9.7.5.2.8, 9.9.2",
		Summary: "rnr_retry 0 and an RNR NAK for the DUT's SEND: no retry, the WR completes with IBV_WC_RNR_RETRY_EXC_ERR, QP to ERR",
		Run: func(c *Case) {
			c.Setup(func(q *QPConfig) { q.Timeout, q.RetryCnt, q.RNRRetry = reqAckTimeout, 3, 0 })
			m := c.MR(256, AllAccess, 0xd1)
			postSend(c, SendConfig{Op: SendSend, MR: m.ID, Len: 16, WRID: 77})
			d := c.Cfg.DUTPSN
			expectReq(c, bth.OpRCSendOnly, d, nil, nil)
			c.Send(ackSpec(c, d, bth.SyndromeRNR(1), 0))
			expectSendWC(c, cq.OpSend, cq.StatusRNRRetryExcErr)
			c.ExpectState(StateErr)
		},
	},
	{
		Name: "req-retry-exceeded", Section: "9.7.6.1.1, 9.9.2",
		Summary: "retry_cnt 1 and no answer: the DUT sends its SEND twice (original + 1 retry after the ACK timeout), then completes it with IBV_WC_RETRY_EXC_ERR, QP to ERR",
		Run: func(c *Case) {
			c.Setup(func(q *QPConfig) { q.Timeout, q.RetryCnt, q.RNRRetry = reqTimerTimeout, 1, 3 })
			m := c.MR(256, AllAccess, 0xd2)
			postSend(c, SendConfig{Op: SendSend, MR: m.ID, Len: 16, WRID: 77})
			d := c.Cfg.DUTPSN
			expectReq(c, bth.OpRCSendOnly, d, nil, nil)
			expectReq(c, bth.OpRCSendOnly, d, nil, nil)
			expectSendWC(c, cq.OpSend, cq.StatusRetryExcErr)
			c.ExpectNothing("after the retries ran out")
			c.ExpectState(StateErr)
		},
	},
}
