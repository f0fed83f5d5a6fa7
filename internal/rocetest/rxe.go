package rocetest

import (
	"github.com/softroce/softroce/pkg/bth"
)

// RxeFlushICRC is the ICRC kernel rxe (6.2 up to at least 6.12) computes for a FLUSH: its
// opcode table gives IB_OPCODE_RC_FLUSH no payload offset, so rxe_icrc_check and
// rxe_icrc_generate run the CRC over the headers (as IBTA A17.3.3 says) and then over
// BTH+FETH+RETH a second time, as if they were the payload. A FLUSH with the ICRC the spec
// defines fails rxe's check and is dropped before any counter sees it. pkt is the packet
// from the BTH to the ICRC (its last 4 bytes, not read).
func RxeFlushICRC(ep *bth.Endpoints, pkt []byte) uint32 {
	return bth.RxeFlushICRC(bth.ICRC(ep, pkt), pkt)
}
