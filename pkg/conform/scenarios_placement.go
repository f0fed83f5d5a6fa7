package conform

import (
	"fmt"

	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/internal/rocetest"
	"github.com/softroce/softroce/pkg/bth"
)

// IBTA 1.5 memory placement (Annex A19): RDMA ATOMIC WRITE and FLUSH, each an RC request of
// one packet with a RETH, answered by an RDMA READ Response Only that carries an ACK AETH and
// no payload (as kernel rxe answers them). These scenarios need the DUT to have the
// operations: Scenario.Needs names the device_cap_flags_ex bits, and a DUT that cannot
// register a region or create a QP with IBV_ACCESS_FLUSH_GLOBAL skips the FLUSH scenarios
// (kernel rxe before 6.2 has neither).

// Capability bits of device_cap_flags_ex (IB_DEVICE_ATOMIC_WRITE, IB_DEVICE_FLUSH_GLOBAL).
const (
	CapAtomicWrite = uint64(qp.DevCapAtomicWrite)
	CapFlushGlobal = uint64(qp.DevCapFlushGlobal)
)

// capNames names the capability bits the scenarios need, for skip reasons.
func capNames(bits uint64) string {
	s := ""
	for _, c := range []struct {
		b uint64
		n string
	}{{CapAtomicWrite, "ATOMIC_WRITE (bit 40)"}, {CapFlushGlobal, "FLUSH_GLOBAL (bit 38)"}} {
		if bits&c.b != 0 {
			if s != "" {
				s += ", "
			}
			s += c.n
		}
	}
	return s
}

// flushAccess is the QP and region access of the FLUSH scenarios.
const flushAccess = AllAccess | mr.AccessFlushGlobal

func atomicWriteReq(psn bth.PSN, va uint64, rkey uint32, payload []byte) rocetest.Spec {
	return rocetest.Spec{Opcode: bth.OpRCAtomicWrite, PSN: psn, AckReq: true, Payload: payload,
		RETH: &bth.RETHFields{VA: va, RKey: rkey, DMALen: uint32(len(payload))}}
}

// flushReq builds a FLUSH (FETH global visibility at level, RETH range). Against kernel rxe
// when the scenario documents the rxe deviation, it carries rxe's ICRC (RxeFlushICRC):
// rxe drops the one IBTA A17.3.3 defines (rc-flush-icrc shows it).
func flushReq(c *Case, psn bth.PSN, level uint8, va uint64, rkey, n uint32) rocetest.Spec {
	s := rocetest.Spec{Opcode: bth.OpRCFlush, PSN: psn, AckReq: true,
		FETH: &bth.FETHFields{Placement: bth.FlushGlobal, Selectivity: level},
		RETH: &bth.RETHFields{VA: va, RKey: rkey, DMALen: n}}
	if c.RxeDeviates() {
		s.ICRC = rocetest.RxeFlushICRC
	}
	return s
}

// expectPlacementAck expects the answer to an ATOMIC WRITE or FLUSH at psn: an RDMA READ
// Response Only with an ACK AETH carrying msn and no payload.
func expectPlacementAck(c *Case, psn bth.PSN, msn uint32) {
	c.Expect(fmt.Sprintf("empty READ Response Only psn %#x msn %d", uint32(psn), msn), rocetest.Expect{
		Opcode: p(bth.OpRCReadRespOnly), PSN: &psn, AckType: p(bth.AckTypeACK), MSN: &msn, PayloadLen: p(0)})
}

// setupFlush creates the scenario's QP with IBV_ACCESS_FLUSH_GLOBAL, skipping when the DUT
// refuses the flag.
func setupFlush(c *Case) {
	cfg := c.baseConfig()
	cfg.Access = flushAccess
	qpn, err := c.B.DUT.CreateQP(cfg)
	if err != nil {
		c.Skipf("the DUT cannot create a QP with IBV_ACCESS_FLUSH_GLOBAL: %v", err)
	}
	c.adopt(cfg, qpn)
}

// flushMR registers a region like Case.MR, skipping when the DUT refuses the access (the
// FLUSH flags).
func flushMR(c *Case, size int, acc mr.Access, seed byte) MRInfo {
	m, err := c.B.DUT.RegMR(MRConfig{Size: size, Access: acc})
	if err != nil {
		c.Skipf("the DUT cannot register a region with %s: %v", accessString(acc), err)
	}
	return c.adoptMR(m, acc, seed)
}

const softroceFlushICRC = "checks a FLUSH's ICRC as A17.3.3 defines it, like every packet's, and also accepts kernel rxe's variant (the headers covered twice) on an RC FLUSH alone, so that rxe's FLUSHes are served (pkg/roce, rxeflush.go)"

const rxeFlushICRC = "kernel rxe's opcode table gives RC FLUSH no payload offset, so its ICRC covers BTH, FETH and RETH twice and it drops a FLUSH with the A17.3.3 ICRC uncounted; the bench sends rxe's variant (rocetest.RxeFlushICRC) to check the rest"

var placementScenarios = []Scenario{
	{
		Name: "rc-atomic-write", Section: "A19.4.2, 9.7.5.1.3", Needs: CapAtomicWrite,
		Summary:  "ATOMIC WRITE of 8 bytes at an aligned address: an empty RDMA READ Response Only at its PSN with an ACK AETH (MSN 1); the 8 bytes placed, nothing around them touched",
		Softroce: "answers an ATOMIC WRITE with an empty RDMA READ Response Only carrying an ACK AETH, as kernel rxe does (rxe_resp.c send_read_response_ack)",
		Run: func(c *Case) {
			c.Setup(nil)
			m := c.MR(64, AllAccess, 0x81)
			word := leU64(0x1122334455667788)
			psn := c.Next()
			c.Send(atomicWriteReq(psn, m.VA+16, m.RKey, word))
			expectPlacementAck(c, psn, 1)
			want := Pattern(64, 0x81)
			copy(want[16:], word)
			c.ExpectMem("region", m, 0, want)
		},
	},
	{
		Name: "rc-atomic-write-bad-rkey", Section: "A19.4.2, 9.7.5.2.4", Needs: CapAtomicWrite,
		Summary: "ATOMIC WRITE with an R_Key no region has: NAK Remote Access Error at its PSN, memory unchanged, QP to ERR",
		Run: func(c *Case) {
			c.Setup(nil)
			m := c.MR(64, AllAccess, 0x82)
			psn := c.Next()
			c.Send(atomicWriteReq(psn, m.VA+8, m.RKey^0x00ff0000, leU64(0xdead)))
			c.ExpectNAK(psn, bth.NAKRemoteAccessErr, 0)
			c.ExpectMem("region", m, 0, Pattern(64, 0x82))
			c.ExpectState(StateErr)
		},
	},
	{
		Name: "rc-atomic-write-misaligned", Section: "A19.4.2, 9.7.5.2.2", Needs: CapAtomicWrite,
		Summary: "ATOMIC WRITE at an address that is not 8-byte aligned: NAK Invalid Request, memory unchanged, QP to ERR",
		Run: func(c *Case) {
			c.Setup(nil)
			m := c.MR(64, AllAccess, 0x83)
			psn := c.Next()
			c.Send(atomicWriteReq(psn, m.VA+4, m.RKey, leU64(0xbeef)))
			c.ExpectNAK(psn, bth.NAKInvalidRequest, 0)
			c.ExpectMem("region", m, 0, Pattern(64, 0x83))
			c.ExpectState(StateErr)
		},
	},
	{
		Name: "rc-atomic-write-length", Section: "A19.4.2, 9.7.5.2.2", Needs: CapAtomicWrite,
		Summary: "ATOMIC WRITE whose DMA length and payload are 4 bytes, not 8: NAK Invalid Request, memory unchanged, QP to ERR",
		Run: func(c *Case) {
			c.Setup(nil)
			m := c.MR(64, AllAccess, 0x84)
			psn := c.Next()
			c.Send(atomicWriteReq(psn, m.VA+8, m.RKey, []byte{1, 2, 3, 4}))
			c.ExpectNAK(psn, bth.NAKInvalidRequest, 0)
			c.ExpectMem("region", m, 0, Pattern(64, 0x84))
			c.ExpectState(StateErr)
		},
	},
	{
		Name: "rc-dup-atomic-write", Section: "9.7.5.1.2, A19.4.2", Needs: CapAtomicWrite,
		Summary: "duplicate ATOMIC WRITE after the word was changed locally: answered again (empty READ Response Only, same PSN) and not executed again; the QP goes on",
		Run: func(c *Case) {
			c.Setup(nil)
			m := c.MR(64, AllAccess, 0)
			psn := c.Next()
			c.Send(atomicWriteReq(psn, m.VA+24, m.RKey, leU64(0xaaaa)))
			expectPlacementAck(c, psn, 1)
			c.SetMem(m, 24, leU64(0xbbbb))
			c.Send(atomicWriteReq(psn, m.VA+24, m.RKey, leU64(0xaaaa)))
			expectPlacementAck(c, psn, 1)
			expectWord(c, m, 24, 0xbbbb)
			alive(c, 1)
		},
	},
	{
		Name: "rc-flush-icrc", Section: "A17.3.3, A19.4.1", Needs: CapFlushGlobal,
		Summary:      "FLUSH (global, range) carrying the ICRC A17.3.3 defines: an empty RDMA READ Response Only at its PSN with an ACK AETH",
		RxeDeviation: "the FLUSH with the A17.3.3 ICRC is dropped without an answer; the same FLUSH carrying rxe's ICRC (BTH, FETH and RETH covered twice) is answered",
		Softroce:     softroceFlushICRC + "; the next FLUSH, carrying rxe's ICRC, is answered too (MSN 2)",
		Run: func(c *Case) {
			setupFlush(c)
			m := flushMR(c, 1024, flushAccess, 0x85)
			psn := c.Next()
			s := flushReq(c, psn, bth.FlushRange, m.VA+100, m.RKey, 300)
			s.ICRC = nil
			c.Send(s)
			if c.RxeDeviates() {
				c.ExpectNothing("FLUSH with the A17.3.3 ICRC")
				s.ICRC = rocetest.RxeFlushICRC
				c.Send(s)
			}
			expectPlacementAck(c, psn, 1)
			if c.B.Softroce {
				psn = c.Next()
				s = flushReq(c, psn, bth.FlushRange, m.VA+100, m.RKey, 300)
				s.ICRC = rocetest.RxeFlushICRC
				c.Send(s)
				expectPlacementAck(c, psn, 2)
			}
		},
	},
	{
		Name: "rc-flush", Section: "A19.4.1, 9.5", Needs: CapFlushGlobal,
		Summary:      "WRITE then FLUSH (global) of its range: the FLUSH answered by an empty RDMA READ Response Only with MSN 2, after the WRITE is placed",
		RxeDeviation: rxeFlushICRC,
		Softroce:     softroceFlushICRC,
		Run: func(c *Case) {
			setupFlush(c)
			m := flushMR(c, 1024, flushAccess, 0)
			data := Pattern(200, 0x86)
			w, f := c.Next(), c.Next()
			c.Send(writeOnly(w, m, 100, data, false))
			c.Send(flushReq(c, f, bth.FlushRange, m.VA+100, m.RKey, 200))
			expectPlacementAck(c, f, 2)
			c.ExpectMem("flushed range", m, 100, data)
		},
	},
	{
		Name: "rc-flush-whole-region", Section: "A19.4.1", Needs: CapFlushGlobal,
		Summary:      "FLUSH at the Memory Region selectivity level with a RETH range outside the region: the range is ignored, acknowledged",
		RxeDeviation: rxeFlushICRC,
		Softroce:     softroceFlushICRC,
		Run: func(c *Case) {
			setupFlush(c)
			m := flushMR(c, 1024, flushAccess, 0)
			psn := c.Next()
			c.Send(flushReq(c, psn, bth.FlushMR, m.VA+1<<20, m.RKey, 4096))
			expectPlacementAck(c, psn, 1)
		},
	},
	{
		Name: "rc-flush-no-mr-access", Section: "A19.4.1, 9.7.5.2.4", Needs: CapFlushGlobal,
		Summary:      "FLUSH (global) of a region registered without IBV_ACCESS_FLUSH_GLOBAL: NAK Remote Access Error at its PSN, QP to ERR",
		RxeDeviation: rxeFlushICRC,
		Softroce:     softroceFlushICRC,
		Run: func(c *Case) {
			setupFlush(c)
			m := c.MR(1024, AllAccess, 0)
			psn := c.Next()
			c.Send(flushReq(c, psn, bth.FlushRange, m.VA, m.RKey, 64))
			c.ExpectNAK(psn, bth.NAKRemoteAccessErr, 0)
			c.ExpectState(StateErr)
		},
	},
	{
		Name: "rc-flush-bad-rkey", Section: "A19.4.1, 9.7.5.2.4", Needs: CapFlushGlobal,
		Summary:      "FLUSH with an R_Key no region has: NAK Remote Access Error at its PSN, QP to ERR",
		RxeDeviation: rxeFlushICRC,
		Softroce:     softroceFlushICRC,
		Run: func(c *Case) {
			setupFlush(c)
			m := flushMR(c, 1024, flushAccess, 0)
			psn := c.Next()
			c.Send(flushReq(c, psn, bth.FlushRange, m.VA, m.RKey^0x00ff0000, 64))
			c.ExpectNAK(psn, bth.NAKRemoteAccessErr, 0)
			c.ExpectState(StateErr)
		},
	},
	{
		Name: "rc-dup-flush", Section: "9.7.5.1.2, A19.4.1", Needs: CapFlushGlobal,
		Summary:      "duplicate FLUSH: answered again (empty READ Response Only, same PSN, same MSN); the QP goes on",
		RxeDeviation: "the duplicate is dropped unanswered (class D): rxe_prepare_res records no PSN range for a FLUSH's responder resource, so duplicate_request's find_resource never finds the FLUSH; the QP goes on. (FLUSHes carry rxe's ICRC, see rc-flush-icrc)",
		Softroce:     "answers the duplicate from its responder resource, not executed again (as for an atomic: oA19-14, oA19-15); " + softroceFlushICRC,
		Run: func(c *Case) {
			setupFlush(c)
			m := flushMR(c, 1024, flushAccess, 0)
			psn := c.Next()
			c.Send(flushReq(c, psn, bth.FlushRange, m.VA, m.RKey, 512))
			expectPlacementAck(c, psn, 1)
			c.Send(flushReq(c, psn, bth.FlushRange, m.VA, m.RKey, 512))
			if c.RxeDeviates() {
				c.ExpectNothing("duplicate FLUSH")
			} else {
				expectPlacementAck(c, psn, 1)
			}
			alive(c, 1)
		},
	},
}
