package conform

import (
	"github.com/softroce/softroce/internal/rocetest"
	"github.com/softroce/softroce/pkg/bth"
)

// lenScenarios complete the RDMA WRITE First/Middle/Last length rules (IBTA 9.7.4.1.6: every
// packet of a multi-packet message but the last carries exactly the path MTU; the First of
// a WRITE as well). Run after the others, so the earlier scenarios keep their PSN ranges.
var lenScenarios = []Scenario{
	{
		Name: "rc-write-first-short", Section: "9.7.4.1.6, 9.7.5.2.2",
		Summary: "RDMA WRITE First shorter than the MTU (512 of a 2000-byte DMA length): NAK Invalid Request at its PSN, memory untouched",
		Run: func(c *Case) {
			c.Setup(nil)
			m := c.MR(4096, AllAccess, 0xd0)
			p0 := c.Next()
			c.Send(rocetest.Spec{Opcode: bth.OpRCWriteFirst, PSN: p0, Payload: Pattern(512, 0xd1), RETH: &bth.RETHFields{VA: m.VA, RKey: m.RKey, DMALen: 2000}})
			c.ExpectNAK(p0, bth.NAKInvalidRequest, 0)
			c.ExpectMem("region after the refused First", m, 0, Pattern(4096, 0xd0)[:2000])
		},
	},
	{
		Name: "rc-write-first-long", Section: "9.7.4.1.6, 9.7.5.2.2",
		Summary: "RDMA WRITE First longer than the MTU (1100 bytes at MTU 1024, DMA length 3000): NAK Invalid Request at its PSN, memory untouched",
		Run: func(c *Case) {
			c.Setup(nil)
			m := c.MR(4096, AllAccess, 0xd2)
			p0 := c.Next()
			c.Send(rocetest.Spec{Opcode: bth.OpRCWriteFirst, PSN: p0, Payload: Pattern(1100, 0xd3), RETH: &bth.RETHFields{VA: m.VA, RKey: m.RKey, DMALen: 3000}})
			c.ExpectNAK(p0, bth.NAKInvalidRequest, 0)
			c.ExpectMem("region after the refused First", m, 0, Pattern(4096, 0xd2)[:3000])
		},
	},
}
