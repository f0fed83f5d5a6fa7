package conform

import (
	"fmt"

	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/rocetest"
	"github.com/softroce/softroce/pkg/bth"
)

// expectReadResponses expects the READ responses for n bytes starting at psn with the
// data want (IBTA 9.4.4, 9.7.5.1.3: Only, or First/Middle.../Last at the MTU; First,
// Last and Only carry an AETH with msn, Middle none) and returns the PSN after them.
func expectReadResponses(c *Case, psn bth.PSN, want []byte, msn uint32) bth.PSN {
	mtu := c.Cfg.MTU
	n := len(want)
	k := max(1, (n+mtu-1)/mtu)
	for i := range k {
		lo, hi := i*mtu, min(n, (i+1)*mtu)
		op := bth.OpRCReadRespMiddle
		switch {
		case k == 1:
			op = bth.OpRCReadRespOnly
		case i == 0:
			op = bth.OpRCReadRespFirst
		case i == k-1:
			op = bth.OpRCReadRespLast
		}
		e := rocetest.Expect{Opcode: &op, PSN: p(psn.Add(uint32(i))), Payload: want[lo:hi]}
		if op != bth.OpRCReadRespMiddle {
			e.AckType, e.MSN = p(bth.AckTypeACK), &msn
		}
		c.Expect(fmt.Sprintf("%v psn %#x (%d bytes)", op, uint32(psn.Add(uint32(i))), hi-lo), e)
	}
	return psn.Add(uint32(k))
}

var rcReadScenarios = []Scenario{
	{
		Name: "rc-read-only", Section: "9.4.4, 9.7.5.1.3",
		Summary: "RDMA READ of 200 bytes: one READ Response Only at the request PSN with AETH ACK MSN 1 and the bytes; the request took one PSN",
		Run: func(c *Case) {
			c.Setup(nil)
			m := c.MR(4096, AllAccess, 0x60)
			psn := c.Next()
			c.Send(readReq(psn, m.VA+100, m.RKey, 200))
			expectReadResponses(c, psn, Pattern(4096, 0x60)[100:300], 1)
			c.ExpectNothing("after the READ response")
			alive(c, 1)
		},
	},
	{
		Name: "rc-read-multi", Section: "9.4.4, 9.7.5.1.3, 9.7.1",
		Summary: "RDMA READ of 3000 bytes at MTU 1024: First (AETH)/Middle (no AETH)/Last (AETH) with 1024/1024/952 bytes at PSN p..p+2; the next request PSN is p+3",
		Run: func(c *Case) {
			c.Setup(nil)
			m := c.MR(8192, AllAccess, 0x61)
			psn := c.Next()
			c.Send(readReq(psn, m.VA+5, m.RKey, 3000))
			next := expectReadResponses(c, psn, Pattern(8192, 0x61)[5:3005], 1)
			c.PSN = next
			w := c.Next()
			c.Send(writeOnly(w, m, 4096, Pattern(16, 0x62), true))
			c.ExpectAck(w, 2)
		},
	},
	{
		Name: "rc-read-zero-length", Section: "9.4.4, 9.7.4.1.6",
		Summary: "zero-length RDMA READ with an invalid R_Key: one READ Response Only with no payload (no key check)",
		Run: func(c *Case) {
			c.Setup(nil)
			psn := c.Next()
			c.Send(readReq(psn, 0, 0x00bad000, 0))
			expectReadResponses(c, psn, []byte{}, 1)
			c.ExpectState(StateRTS)
		},
	},
	{
		Name: "rc-read-exact-mtu", Section: "9.4.4",
		Summary: "RDMA READ of exactly 1024 bytes (one MTU): a single READ Response Only",
		Run: func(c *Case) {
			c.Setup(nil)
			m := c.MR(2048, AllAccess, 0x63)
			psn := c.Next()
			c.Send(readReq(psn, m.VA, m.RKey, 1024))
			expectReadResponses(c, psn, Pattern(2048, 0x63)[:1024], 1)
		},
	},
	accessScenario("rc-read-bad-rkey", "RDMA READ with an R_Key no region has", "read", accBadKey),
	accessScenario("rc-read-out-of-bounds", "RDMA READ ending past the region", "read", accBounds),
	accessScenario("rc-read-no-permission", "RDMA READ of a region registered without REMOTE_READ", "read", accPerm),
	{
		Name: "rc-qp-no-remote-read", Section: "9.7.5.2.2, 10.2.2",
		Summary: "RDMA READ to a QP whose access flags lack REMOTE_READ: NAK Invalid Request, no data",
		Run: func(c *Case) {
			c.Setup(func(q *QPConfig) { q.Access = mr.AccessLocalWrite | mr.AccessRemoteWrite })
			m := c.MR(1024, AllAccess, 0x64)
			psn := c.Next()
			c.Send(readReq(psn, m.VA, m.RKey, 64))
			c.ExpectNAK(psn, bth.NAKInvalidRequest, 0)
		},
	},
	{
		Name: "rc-dup-read-replay", Section: "9.7.5.1.2",
		Summary: "duplicate RDMA READ (same PSN, VA, R_Key, length): the responses are sent again with the same PSNs and the current memory",
		Run: func(c *Case) {
			c.Setup(nil)
			m := c.MR(4096, AllAccess, 0x65)
			psn := c.Next()
			c.Send(readReq(psn, m.VA, m.RKey, 2000))
			next := expectReadResponses(c, psn, Pattern(4096, 0x65)[:2000], 1)
			c.Send(readReq(psn, m.VA, m.RKey, 2000))
			expectReadResponses(c, psn, Pattern(4096, 0x65)[:2000], 1)
			c.PSN = next
			w := c.Next()
			c.Send(writeOnly(w, m, 3000, Pattern(8, 0x66), true))
			c.ExpectAck(w, 2)
		},
	},
	{
		Name: "rc-dup-read-partial", Section: "9.7.5.1.2",
		Summary:      "duplicate of a 3-packet READ restarting at its second PSN (VA + MTU, length - MTU): responses from that PSN on (First/Last of the rest)",
		RxeDeviation: "kernel rxe replays the original response stream from that PSN: Middle then Last (the opcodes of the first execution), not a new First/Last",
		Softroce:     "answers the duplicate as a new READ of the remaining bytes: First (AETH) then Last",
		Run: func(c *Case) {
			c.Setup(nil)
			m := c.MR(4096, AllAccess, 0x67)
			want := Pattern(4096, 0x67)[:3000]
			psn := c.Next()
			c.Send(readReq(psn, m.VA, m.RKey, 3000))
			expectReadResponses(c, psn, want, 1)
			c.Send(readReq(psn.Add(1), m.VA+1024, m.RKey, 3000-1024))
			if c.RxeDeviates() {
				c.Expect("READ Response Middle (replay)", rocetest.Expect{Opcode: p(bth.OpRCReadRespMiddle), PSN: p(psn.Add(1)), Payload: want[1024:2048]})
				c.Expect("READ Response Last (replay)", rocetest.Expect{Opcode: p(bth.OpRCReadRespLast), PSN: p(psn.Add(2)), Payload: want[2048:], AckType: p(bth.AckTypeACK), MSN: p(uint32(1))})
				return
			}
			expectReadResponses(c, psn.Add(1), want[1024:], 1)
		},
	},
	{
		Name: "rc-dup-read-evicted", Section: "9.7.5.1.2, 9.7.5.1.3",
		Summary:  "with one responder resource, a duplicate of a READ older than the last one is outside the remembered range: dropped silently; the QP still works",
		Softroce: "drops it silently like rxe (the spec lets the responder choose: it has no record to replay)",
		Run: func(c *Case) {
			c.Setup(func(q *QPConfig) { q.MaxDestRDAtomic = 1 })
			m := c.MR(1024, AllAccess, 0x68)
			mem := Pattern(1024, 0x68)
			p0 := c.Next()
			c.Send(readReq(p0, m.VA, m.RKey, 8))
			expectReadResponses(c, p0, mem[:8], 1)
			p1 := c.Next()
			c.Send(readReq(p1, m.VA+8, m.RKey, 8))
			expectReadResponses(c, p1, mem[8:16], 2)
			c.Send(readReq(p0, m.VA, m.RKey, 8))
			c.ExpectNothing("duplicate of an evicted READ")
			alive(c, 2)
		},
	},
}
