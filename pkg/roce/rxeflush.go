package roce

import (
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
)

// rxeFlushSize is an RC FLUSH's UDP payload: BTH, FETH, RETH and the ICRC (IBTA A19.4.1: no
// payload).
const rxeFlushSize = bth.BTHSize + bth.FETHSize + bth.RETHSize + bth.ICRCSize

// rxeFlushICRC reports whether dg, whose ICRC is not the one IBTA A17.3.3 defines for it,
// is an RC FLUSH carrying the ICRC kernel rxe computes for a FLUSH. rxe's opcode table gives
// RC FLUSH no payload offset, so rxe (6.2 up to at least 6.12) runs the CRC over the masked
// headers, as A17.3.3 says, and then over the unmasked BTH, FETH and RETH a second time, as
// if they were the payload; rxe checks incoming FLUSHes the same way. softroce sends the
// spec's ICRC and accepts both from a peer, so that rxe's FLUSHes are served: rxe's value,
// unwound over those 32 header bytes (bth.ICRCUnwind), must be the spec's ICRC for the
// packet, with the IPv4 ID the link gave or, for a UDP socket, the one the solver finds. Only
// an RC FLUSH of exactly its size qualifies, so every other packet keeps the full check.
func (rx *rxState) rxeFlushICRC(p *bth.Packet, ep *bth.Endpoints, dg *link.Datagram) bool {
	buf := dg.Buf
	if p.BTH.Opcode() != bth.OpRCFlush || len(buf) != rxeFlushSize {
		return false
	}
	want := bth.ICRCUnwind(bth.GetICRC(buf), buf[:len(buf)-bth.ICRCSize])
	switch {
	case !ep.Src.Is4():
		return rx.icrcWithID(ep, buf, 0) == want
	case dg.HasIPv4ID:
		return rx.icrcWithID(ep, buf, dg.IPv4ID) == want
	default:
		_, ok := bth.SolveIPv4IDFor(ep, buf, want)
		return ok
	}
}
