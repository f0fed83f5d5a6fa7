package conform

import (
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/rocetest"
	"github.com/softroce/softroce/pkg/bth"
)

// expectAtomicAck expects an ATOMIC Acknowledge (IBTA 9.3.6: AETH + AtomicAckETH) for
// psn with msn carrying orig.
func expectAtomicAck(c *Case, psn bth.PSN, msn uint32, orig uint64) {
	r := c.Expect("ATOMIC Acknowledge", rocetest.Expect{Opcode: p(bth.OpRCAtomicAck), PSN: &psn, AckType: p(bth.AckTypeACK), MSN: &msn})
	if r.Pkt.AtomicAck == nil {
		c.Fatalf("ATOMIC Acknowledge without AtomicAckETH")
	}
	if got := r.Pkt.AtomicAck.Fields().OrigData; got != orig {
		c.Fatalf("ATOMIC Acknowledge original data %#x, want %#x", got, orig)
	}
}

func expectWord(c *Case, m MRInfo, off int, want uint64) {
	if got := memU64(c.Mem(m, off, 8)); got != want {
		c.Fatalf("memory word %#x, want %#x", got, want)
	}
}

var rcAtomicScenarios = []Scenario{
	{
		Name: "rc-fetch-add", Section: "9.4.5, 9.3.6",
		Summary: "FETCH_ADD: ATOMIC Acknowledge at its PSN with AETH MSN 1 and the original value; memory = original + add",
		Run: func(c *Case) {
			c.Setup(nil)
			m := c.MR(64, AllAccess, 0)
			c.SetMem(m, 8, leU64(0x1000))
			psn := c.Next()
			c.Send(atomicReq(bth.OpRCFetchAdd, psn, m.VA+8, m.RKey, 5, 0))
			expectAtomicAck(c, psn, 1, 0x1000)
			expectWord(c, m, 8, 0x1005)
		},
	},
	{
		Name: "rc-cmp-swap-hit", Section: "9.4.5, 9.3.6",
		Summary: "CMP_SWAP whose compare value matches: swapped, original value returned",
		Run: func(c *Case) {
			c.Setup(nil)
			m := c.MR(64, AllAccess, 0)
			c.SetMem(m, 16, leU64(0x1111))
			psn := c.Next()
			c.Send(atomicReq(bth.OpRCCmpSwap, psn, m.VA+16, m.RKey, 0x2222, 0x1111))
			expectAtomicAck(c, psn, 1, 0x1111)
			expectWord(c, m, 16, 0x2222)
		},
	},
	{
		Name: "rc-cmp-swap-miss", Section: "9.4.5, 9.3.6",
		Summary: "CMP_SWAP whose compare value differs: memory unchanged, original value returned",
		Run: func(c *Case) {
			c.Setup(nil)
			m := c.MR(64, AllAccess, 0)
			c.SetMem(m, 0, leU64(0x3333))
			psn := c.Next()
			c.Send(atomicReq(bth.OpRCCmpSwap, psn, m.VA, m.RKey, 0x4444, 0x1234))
			expectAtomicAck(c, psn, 1, 0x3333)
			expectWord(c, m, 0, 0x3333)
		},
	},
	{
		Name: "rc-dup-atomic", Section: "9.7.5.1.2, 9.4.5",
		Summary: "duplicate FETCH_ADD: the saved original value is returned again and the add is not executed twice",
		Run: func(c *Case) {
			c.Setup(nil)
			m := c.MR(64, AllAccess, 0)
			c.SetMem(m, 8, leU64(100))
			psn := c.Next()
			c.Send(atomicReq(bth.OpRCFetchAdd, psn, m.VA+8, m.RKey, 7, 0))
			expectAtomicAck(c, psn, 1, 100)
			c.Send(atomicReq(bth.OpRCFetchAdd, psn, m.VA+8, m.RKey, 7, 0))
			expectAtomicAck(c, psn, 1, 100)
			expectWord(c, m, 8, 107)
		},
	},
	{
		Name: "rc-atomic-sequence", Section: "9.4.5, 9.5",
		Summary: "FETCH_ADD then CMP_SWAP on the same word, in PSN order: each sees the previous one's result",
		Run: func(c *Case) {
			c.Setup(nil)
			m := c.MR(64, AllAccess, 0)
			p0, p1 := c.Next(), c.Next()
			c.Send(atomicReq(bth.OpRCFetchAdd, p0, m.VA, m.RKey, 10, 0))
			c.Send(atomicReq(bth.OpRCCmpSwap, p1, m.VA, m.RKey, 99, 10))
			expectAtomicAck(c, p0, 1, 0)
			expectAtomicAck(c, p1, 2, 10)
			expectWord(c, m, 0, 99)
		},
	},
	{
		Name: "rc-atomic-misaligned", Section: "9.4.5, 9.7.5.2.2",
		Summary: "FETCH_ADD at a VA that is not 8-byte aligned: NAK Invalid Request, memory unchanged, QP to ERR",
		Run: func(c *Case) {
			c.Setup(nil)
			m := c.MR(64, AllAccess, 0x70)
			psn := c.Next()
			c.Send(atomicReq(bth.OpRCFetchAdd, psn, m.VA+4, m.RKey, 1, 0))
			c.ExpectNAK(psn, bth.NAKInvalidRequest, 0)
			c.ExpectMem("region", m, 0, Pattern(64, 0x70))
			c.ExpectState(StateErr)
		},
	},
	accessScenario("rc-atomic-bad-rkey", "FETCH_ADD with an R_Key no region has", "atomic", accBadKey),
	accessScenario("rc-atomic-no-permission", "FETCH_ADD on a region registered without REMOTE_ATOMIC", "atomic", accPerm),
	accessScenario("rc-atomic-out-of-bounds", "FETCH_ADD at the first byte past the region", "atomic", accBounds),
	{
		Name: "rc-qp-no-remote-atomic", Section: "9.7.5.2.2, 10.2.2",
		Summary: "FETCH_ADD to a QP whose access flags lack REMOTE_ATOMIC: NAK Invalid Request, memory unchanged",
		Run: func(c *Case) {
			c.Setup(func(q *QPConfig) { q.Access = mr.AccessLocalWrite | mr.AccessRemoteWrite | mr.AccessRemoteRead })
			m := c.MR(64, AllAccess, 0)
			psn := c.Next()
			c.Send(atomicReq(bth.OpRCFetchAdd, psn, m.VA, m.RKey, 1, 0))
			c.ExpectNAK(psn, bth.NAKInvalidRequest, 0)
			expectWord(c, m, 0, 0)
		},
	},
}
