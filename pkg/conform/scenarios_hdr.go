package conform

import (
	"github.com/softroce/softroce/internal/rocetest"
	"github.com/softroce/softroce/pkg/bth"
)

// dropScenario: the bench sends a request broken by edit (built from a valid 32-byte
// SEND Only with AckReq at the expected PSN); the DUT must drop it silently (IBTA 9.6:
// packet header validation failures are silent drops), and the QP must be unaffected: a
// valid SEND at the same PSN is then ACKed with MSN 1.
func dropScenario(name, section, summary string, edit func(c *Case, s *rocetest.Spec)) Scenario {
	return Scenario{
		Name: name, Section: section, Summary: summary + ": dropped silently, the QP then ACKs a valid SEND at the same PSN",
		Run: func(c *Case) {
			c.Setup(nil)
			c.Recv(1, 0)
			s := sendOnly(c.PSN, Pattern(32, 0x80), true)
			s.DestQP = c.QPN
			edit(c, &s)
			c.SendRaw(s)
			c.ExpectNothing("broken packet")
			c.ExpectNoCompletion("broken packet")
			alive(c, 0)
		},
	}
}

func truncateTo(n int) func([]byte) []byte {
	return func(b []byte) []byte { return b[:min(n, len(b))] }
}

var hdrScenarios = []Scenario{
	dropScenario("hdr-bad-pkey", "9.6.1.1, 10.9.3", "SEND with P_Key 0x1234 (not the QP's partition)",
		func(c *Case, s *rocetest.Spec) { s.PKey = 0x1234 }),
	dropScenario("hdr-pkey-invalid-zero", "9.6.1.1, 10.9.1.2", "SEND with P_Key 0x8000 (the invalid P_Key)",
		func(c *Case, s *rocetest.Spec) { s.PKey = 0x8000 }),
	{
		Name: "hdr-pkey-limited-member", Section: "10.9.3",
		Summary: "SEND with P_Key 0x7FFF (limited member of the default partition) to a full member (0xFFFF): P_Keys match, ACKed",
		Run: func(c *Case) {
			c.Setup(nil)
			c.Recv(1, 0)
			psn := c.Next()
			s := sendOnly(psn, Pattern(16, 0x81), true)
			s.PKey = 0x7fff
			c.Send(s)
			c.ExpectAck(psn, 1)
		},
	},
	dropScenario("hdr-bad-tver", "9.2, 9.6.1.1", "SEND with transport header version 1",
		func(c *Case, s *rocetest.Spec) { s.TVer = 1 }),
	dropScenario("hdr-bad-icrc", "A17.3.3, 9.6", "SEND with a corrupted ICRC",
		func(c *Case, s *rocetest.Spec) { s.CorruptICRC = true }),
	{
		Name: "hdr-icrc-wrong-ipid", Section: "A17.3.3",
		Summary:           "SEND whose ICRC was computed for IPv4 ID 1 while the wire carries 0: dropped silently; the QP then ACKs a valid SEND at the same PSN",
		SoftroceDeviation: "accepted: a UDP-socket receiver cannot see the IPv4 ID, so softroce solves for the sender's ID (bth.SolveIPv4ID, 16 of the 32 ICRC bits still checked); any ID is plausible, so an ICRC computed for the wrong ID verifies",
		Softroce:          "solves the IPv4 ID on its UDP socket path (docs/wire.md); its AF_XDP path (link/afxdp) sees the ID and drops such a packet, as rxe does (TestICRCKnownIPv4ID)",
		Run: func(c *Case) {
			c.Setup(nil)
			c.Recv(1, 0)
			psn := c.PSN
			s := sendOnly(psn, Pattern(32, 0x80), true)
			s.ICRCIPID = 1
			c.Send(s)
			if c.SoftroceDeviates() {
				c.ExpectAck(psn, 1)
				return
			}
			c.ExpectNothing("ICRC for the wrong IPv4 ID")
			c.ExpectNoCompletion("ICRC for the wrong IPv4 ID")
			alive(c, 0)
		},
	},
	dropScenario("hdr-unknown-destqp", "9.6.1.1", "SEND to a QPN the DUT does not have",
		func(c *Case, s *rocetest.Spec) { s.DestQP = c.QPN + 0x4000 }),
	dropScenario("hdr-destqp-zero", "9.6.1.1, A17.2", "SEND to QP0 (no SMI on RoCE)",
		func(c *Case, s *rocetest.Spec) { s.DestQP = 0 }),
	dropScenario("hdr-truncated-bth", "9.6, 9.2", "a datagram holding 8 bytes of a BTH and an ICRC",
		func(c *Case, s *rocetest.Spec) { s.Payload = nil; s.Mutate = truncateTo(8 + bth.ICRCSize) }),
	dropScenario("hdr-truncated-reth", "9.6, 9.3.3", "RDMA WRITE Only cut inside its RETH (8 of 16 bytes)",
		func(c *Case, s *rocetest.Spec) {
			s.Opcode, s.Payload = bth.OpRCWriteOnly, nil
			s.RETH = &bth.RETHFields{VA: 0x1000, RKey: 1, DMALen: 0}
			s.Mutate = truncateTo(bth.BTHSize + 8 + bth.ICRCSize)
		}),
	dropScenario("hdr-truncated-atomiceth", "9.6, 9.3.4", "FETCH_ADD cut inside its AtomicETH (20 of 28 bytes)",
		func(c *Case, s *rocetest.Spec) {
			s.Opcode, s.Payload = bth.OpRCFetchAdd, nil
			s.AtomicETH = &bth.AtomicETHFields{VA: 0x1000, RKey: 1, SwapAdd: 1}
			s.Mutate = truncateTo(bth.BTHSize + 20 + bth.ICRCSize)
		}),
	dropScenario("hdr-no-icrc", "9.6, A17.3.3", "SEND Only of BTH + 2 bytes (shorter than BTH + ICRC)",
		func(c *Case, s *rocetest.Spec) { s.Payload = nil; s.Mutate = truncateTo(bth.BTHSize + 2) }),
	dropScenario("hdr-pad-exceeds-payload", "9.2.5, 9.6", "SEND Only with no payload but PadCnt 3",
		func(c *Case, s *rocetest.Spec) { s.Payload = nil; s.PadCnt = p(uint8(3)) }),
	dropScenario("hdr-reserved-opcode", "9.2.1, 9.6.1.1", "a packet with the reserved RC opcode 0x15",
		func(c *Case, s *rocetest.Spec) {
			s.Mutate = func(b []byte) []byte { b[0] = 0x15; return b }
		}),
	dropScenario("hdr-uc-opcode-on-rc", "9.6.1.1, 9.2.1", "UC SEND Only to an RC QP",
		func(c *Case, s *rocetest.Spec) { s.Opcode = bth.OpUCSendOnly }),
	dropScenario("hdr-ud-opcode-on-rc", "9.6.1.1, 9.2.1", "UD SEND Only to an RC QP",
		func(c *Case, s *rocetest.Spec) {
			s.Opcode = bth.OpUDSendOnly
			s.DETH = &bth.DETHFields{QKey: 0x11111111, SrcQP: c.BenchQPN}
		}),
	dropScenario("hdr-unsolicited-ack", "9.7.6.1, 9.6", "an ACK for a PSN the DUT never sent (its requester is idle)",
		func(c *Case, s *rocetest.Spec) {
			s.Opcode, s.Payload, s.AckReq = bth.OpRCAck, nil, false
			s.PSN = c.Cfg.DUTPSN.Add(5)
			s.AETH = &bth.AETHFields{Syndrome: bth.SyndromeACK(31), MSN: 3}
		}),
	dropScenario("hdr-unsolicited-read-response", "9.7.6.1, 9.6", "a READ Response Only the DUT never asked for",
		func(c *Case, s *rocetest.Spec) {
			s.Opcode, s.AckReq = bth.OpRCReadRespOnly, false
			s.PSN = c.Cfg.DUTPSN
			s.AETH = &bth.AETHFields{Syndrome: bth.SyndromeACK(31), MSN: 1}
		}),
	{
		Name: "hdr-fecn-becn-accepted", Section: "9.2, A17.3.3, A17.9",
		Summary: "SEND with FECN and BECN set (congestion marks, masked out of the ICRC): accepted and ACKed",
		Run: func(c *Case) {
			c.Setup(nil)
			c.Recv(1, 0)
			psn := c.Next()
			s := sendOnly(psn, Pattern(16, 0x82), true)
			s.FECN, s.BECN = true, true
			c.Send(s)
			c.ExpectAck(psn, 1)
		},
	},
	{
		Name: "hdr-ack-pkey-and-destqp", Section: "9.2, 9.7.5.1",
		Summary: "the DUT's ACK carries P_Key 0xFFFF, TVer 0, the bench's QPN and a valid ICRC",
		Run: func(c *Case) {
			c.Setup(nil)
			c.Recv(1, 0)
			psn := c.Next()
			c.Send(sendOnly(psn, Pattern(16, 0x83), true))
			r := c.ExpectAck(psn, 1)
			f := r.Pkt.BTH.Fields()
			c.Check(f.PKey == 0xffff && f.TVer == 0 && f.DestQP == c.BenchQPN && r.IDSolved, "ACK header %+v (ICRC ok %v)", f, r.IDSolved)
		},
	},
}
