package qp

import (
	"net/netip"
	"testing"

	"github.com/softroce/softroce/pkg/bth"
)

// TestSendPseudoHeaderCache: the requester's pseudo-header CRC cache gives
// bth.PseudoHeaderCRC for every (endpoints, length) and keeps the last two, so a latency
// test's alternating ACKs and WRITEs on one QP both hit it (one entry missed on every packet).
func TestSendPseudoHeaderCache(t *testing.T) {
	var q QP
	e1 := bth.Endpoints{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), SrcPort: 0xC001, DstPort: 4791}
	e2 := e1
	e2.Dst = netip.MustParseAddr("10.0.0.3")
	seq := []struct {
		ep *bth.Endpoints
		n  int
	}{{&e1, 48}, {&e1, 20}, {&e1, 48}, {&e1, 20}, {&e2, 20}, {&e1, 20}, {&e2, 4200}}
	for i, c := range seq {
		if got, want := q.pseudoHeader(c.ep, c.n).state, bth.PseudoHeaderCRC(c.ep, c.n); got != want {
			t.Fatalf("step %d: %#x, want %#x", i, got, want)
		}
		if q.icrc[0].ep != *c.ep || q.icrc[0].n != c.n {
			t.Fatalf("step %d: most recent entry %+v", i, q.icrc[0])
		}
		if i > 0 {
			p := seq[i-1]
			if (*p.ep != *c.ep || p.n != c.n) && (q.icrc[1].ep != *p.ep || q.icrc[1].n != p.n) {
				t.Fatalf("step %d: the previous (endpoints, length) was dropped: %+v", i, q.icrc[1])
			}
		}
	}
}
