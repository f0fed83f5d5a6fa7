package conform

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/rocetest"
	"github.com/softroce/softroce/pkg/bth"
)

// The DUT as requester: the bench plays the responder.

// ackSpec is an ACK (or NAK/RNR: syndrome) from the bench to the DUT QP.
func ackSpec(c *Case, psn bth.PSN, syndrome uint8, msn uint32) rocetest.Spec {
	return rocetest.Spec{Opcode: bth.OpRCAck, PSN: psn, AETH: &bth.AETHFields{Syndrome: syndrome, MSN: msn}}
}

func expectReq(c *Case, op bth.Opcode, psn bth.PSN, payload []byte, ackReq *bool) *rocetest.Received {
	e := rocetest.Expect{Opcode: &op, DestQP: &c.BenchQPN, PSN: &psn, AckReq: ackReq}
	if payload != nil {
		e.Payload = payload
	}
	return c.Expect(fmt.Sprintf("%v psn %#x", op, uint32(psn)), e)
}

func expectSendWC(c *Case, op cq.Opcode, status cq.Status) {
	got := c.Poll(1)
	if len(got) != 1 || got[0].Status != status || (status == cq.StatusSuccess && got[0].Opcode != op) || got[0].WRID != 77 {
		c.Fatalf("send completion %v, want wrid 77 status %v opcode %d", got, status, op)
	}
}

func reqSetup(c *Case) MRInfo {
	return reqSetupTimeout(c, reqAckTimeout)
}

// reqAckTimeout is the DUT's local ACK timeout code in the requester scenarios that do not
// test the timer: 4.096 us * 2^16 = 268 ms (IBTA 9.7.6.1.1), long against a control round
// trip to the agent (several ms in the lab's TCG guest), so the DUT does not retransmit
// before the bench answers (TestRequesterScenariosSlowControl).
const reqAckTimeout = 16

// reqTimerTimeout is the short ACK timeout (code 10, ~4 ms) of the scenarios that test the
// timer itself.
const reqTimerTimeout = 10

func reqSetupTimeout(c *Case, timeout uint8) MRInfo {
	c.Setup(func(q *QPConfig) { q.Timeout = timeout; q.RetryCnt = 3; q.RNRRetry = 3 })
	return c.MR(4096, AllAccess, 0xb0)
}

var reqScenarios = []Scenario{
	{
		Name: "req-send-format", Section: "9.7.2, 9.2, 9.7.5.1",
		Summary: "the DUT's 3000-byte SEND: First/Middle/Last from its sq_psn with 1024/1024/952 bytes, AckReq on the Last; the bench's ACK completes the WR",
		Run: func(c *Case) {
			m := reqSetup(c)
			if err := c.B.DUT.PostSend(c.QPN, SendConfig{Op: SendSend, MR: m.ID, Len: 3000, WRID: 77}); err != nil {
				c.Fatalf("post send: %v", err)
			}
			data := Pattern(4096, 0xb0)
			d := c.Cfg.DUTPSN
			expectReq(c, bth.OpRCSendFirst, d, data[:1024], nil)
			expectReq(c, bth.OpRCSendMiddle, d.Add(1), data[1024:2048], nil)
			expectReq(c, bth.OpRCSendLast, d.Add(2), data[2048:3000], p(true))
			c.Send(ackSpec(c, d.Add(2), bth.SyndromeACK(31), 1))
			expectSendWC(c, cq.OpSend, cq.StatusSuccess)
		},
	},
	{
		Name: "req-nak-seq-go-back", Section: "9.7.5.2.1, 9.7.6.1.2",
		Summary: "a PSN Sequence Error NAK for the DUT's second packet: the DUT resends from that PSN (go-back-N), then completes on the ACK",
		Run: func(c *Case) {
			m := reqSetup(c)
			if err := c.B.DUT.PostSend(c.QPN, SendConfig{Op: SendSend, MR: m.ID, Len: 3000, WRID: 77}); err != nil {
				c.Fatalf("post send: %v", err)
			}
			data := Pattern(4096, 0xb0)
			d := c.Cfg.DUTPSN
			expectReq(c, bth.OpRCSendFirst, d, nil, nil)
			expectReq(c, bth.OpRCSendMiddle, d.Add(1), nil, nil)
			expectReq(c, bth.OpRCSendLast, d.Add(2), nil, nil)
			c.Send(ackSpec(c, d.Add(1), bth.SyndromeNAK(bth.NAKPSNSeqErr), 0))
			expectReq(c, bth.OpRCSendMiddle, d.Add(1), data[1024:2048], nil)
			expectReq(c, bth.OpRCSendLast, d.Add(2), data[2048:3000], p(true))
			c.Send(ackSpec(c, d.Add(2), bth.SyndromeACK(31), 1))
			expectSendWC(c, cq.OpSend, cq.StatusSuccess)
		},
	},
	{
		Name: "req-rnr-retry", Section: "9.7.5.2.8, 9.7.6.1.5",
		Summary: "an RNR NAK (timer code 1) for the DUT's SEND: the same packet is resent after the timer, and the ACK completes it",
		Run: func(c *Case) {
			m := reqSetup(c)
			if err := c.B.DUT.PostSend(c.QPN, SendConfig{Op: SendSend, MR: m.ID, Len: 100, WRID: 77}); err != nil {
				c.Fatalf("post send: %v", err)
			}
			d := c.Cfg.DUTPSN
			data := Pattern(4096, 0xb0)[:100]
			expectReq(c, bth.OpRCSendOnly, d, data, p(true))
			c.Send(ackSpec(c, d, bth.SyndromeRNR(1), 0))
			expectReq(c, bth.OpRCSendOnly, d, data, p(true))
			c.Send(ackSpec(c, d, bth.SyndromeACK(31), 1))
			expectSendWC(c, cq.OpSend, cq.StatusSuccess)
		},
	},
	{
		Name: "req-ack-timeout-retransmit", Section: "9.7.6.1.1",
		Summary: "no ACK for the DUT's SEND: it is retransmitted with the same PSN after the local ACK timeout (code 10, ~4 ms), and the late ACK completes it",
		Run: func(c *Case) {
			m := reqSetupTimeout(c, reqTimerTimeout)
			if err := c.B.DUT.PostSend(c.QPN, SendConfig{Op: SendSend, MR: m.ID, Len: 64, WRID: 77}); err != nil {
				c.Fatalf("post send: %v", err)
			}
			d := c.Cfg.DUTPSN
			data := Pattern(4096, 0xb0)[:64]
			expectReq(c, bth.OpRCSendOnly, d, data, p(true))
			expectReq(c, bth.OpRCSendOnly, d, data, p(true))
			c.Send(ackSpec(c, d, bth.SyndromeACK(31), 1))
			expectSendWC(c, cq.OpSend, cq.StatusSuccess)
		},
	},
	{
		Name: "req-read", Section: "9.4.4, 9.7.6.1",
		Summary: "the DUT's 2000-byte RDMA READ: a READ request with the RETH (VA, R_Key, DMA length); the bench's First/Last responses land in the DUT's buffer and complete the WR",
		Run: func(c *Case) {
			m := reqSetup(c)
			const va, rkey = 0x5500_0000_0010, 0x00abcd12
			if err := c.B.DUT.PostSend(c.QPN, SendConfig{Op: SendRead, MR: m.ID, Off: 8, Len: 2000, RemoteVA: va, RKey: rkey, WRID: 77}); err != nil {
				c.Fatalf("post send: %v", err)
			}
			d := c.Cfg.DUTPSN
			r := expectReq(c, bth.OpRCReadRequest, d, nil, nil)
			if r.Pkt.RETH == nil {
				c.Fatalf("READ request without RETH")
			}
			if f := r.Pkt.RETH.Fields(); f.VA != va || f.RKey != rkey || f.DMALen != 2000 {
				c.Fatalf("RETH %+v, want va %#x rkey %#x len 2000", f, uint64(va), rkey)
			}
			data := Pattern(2000, 0xb1)
			c.Send(rocetest.Spec{Opcode: bth.OpRCReadRespFirst, PSN: d, AETH: &bth.AETHFields{Syndrome: bth.SyndromeACK(31), MSN: 1}, Payload: data[:1024]})
			c.Send(rocetest.Spec{Opcode: bth.OpRCReadRespLast, PSN: d.Add(1), AETH: &bth.AETHFields{Syndrome: bth.SyndromeACK(31), MSN: 1}, Payload: data[1024:]})
			expectSendWC(c, cq.OpRDMARead, cq.StatusSuccess)
			c.ExpectMem("READ data", m, 8, data)
		},
	},
	{
		Name: "req-fetch-add", Section: "9.4.5, 9.3.4, 9.3.6",
		Summary: "the DUT's FETCH_ADD: AtomicETH with VA, R_Key and the add value; the bench's ATOMIC Acknowledge value lands in the DUT's buffer",
		Run: func(c *Case) {
			m := reqSetup(c)
			const va, rkey = 0x6600_0000_0008, 0x00abcd34
			if err := c.B.DUT.PostSend(c.QPN, SendConfig{Op: SendFetchAdd, MR: m.ID, Off: 16, Len: 8, RemoteVA: va, RKey: rkey, CompareAdd: 9, WRID: 77}); err != nil {
				c.Fatalf("post send: %v", err)
			}
			d := c.Cfg.DUTPSN
			r := expectReq(c, bth.OpRCFetchAdd, d, nil, nil)
			if f := r.Pkt.AtomicETH.Fields(); f.VA != va || f.RKey != rkey || f.SwapAdd != 9 {
				c.Fatalf("AtomicETH %+v, want va %#x rkey %#x add 9", f, uint64(va), rkey)
			}
			c.Send(rocetest.Spec{Opcode: bth.OpRCAtomicAck, PSN: d, AETH: &bth.AETHFields{Syndrome: bth.SyndromeACK(31), MSN: 1}, AtomicAck: &bth.AtomicAckETHFields{OrigData: 0x42}})
			expectSendWC(c, cq.OpFetchAdd, cq.StatusSuccess)
			got := c.Mem(m, 16, 8)
			c.Check(bytes.Equal(got, binary.LittleEndian.AppendUint64(nil, 0x42)), "fetched value % x, want 0x42 in host order", got)
		},
	},
	{
		Name: "req-remote-access-nak", Section: "9.7.5.2.4, 9.9.2",
		Summary: "a Remote Access Error NAK for the DUT's RDMA WRITE: the WR completes with IBV_WC_REM_ACCESS_ERR and the QP goes to ERR",
		Run: func(c *Case) {
			m := reqSetup(c)
			if err := c.B.DUT.PostSend(c.QPN, SendConfig{Op: SendWrite, MR: m.ID, Len: 64, RemoteVA: 0x1000, RKey: 0x77, WRID: 77}); err != nil {
				c.Fatalf("post send: %v", err)
			}
			d := c.Cfg.DUTPSN
			expectReq(c, bth.OpRCWriteOnly, d, nil, p(true))
			c.Send(ackSpec(c, d, bth.SyndromeNAK(bth.NAKRemoteAccessErr), 0))
			expectSendWC(c, cq.OpRDMAWrite, cq.StatusRemAccessErr)
			c.ExpectState(StateErr)
		},
	},
}

// Scenarios returns every scenario, in run order.
func Scenarios() []Scenario {
	var all []Scenario
	for _, g := range [][]Scenario{rcSendScenarios, rcSeqScenarios, rcWriteScenarios, rcReadScenarios,
		rcAtomicScenarios, moreScenarios, hdrScenarios, ucScenarios, udScenarios, reqScenarios, req2Scenarios, lenScenarios, placementScenarios} {
		all = append(all, g...)
	}
	return all
}
