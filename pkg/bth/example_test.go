package bth_test

import (
	"fmt"
	"net/netip"

	"github.com/softroce/softroce/pkg/bth"
)

// An RC RDMA WRITE Only packet built header by header, its ICRC computed over the
// endpoints a UDP socket knows (IBTA A17.3.3), then parsed and checked as a receiver does.
func Example() {
	payload := []byte("hello")
	pad := (4 - len(payload)%4) % 4 // the payload is padded to a 4-byte multiple (IBTA 9.2.4)
	pkt := make([]byte, bth.BTHSize+bth.RETHSize+len(payload)+pad+bth.ICRCSize)
	bth.BTH(pkt).Encode(&bth.BTHFields{Opcode: bth.OpRCWriteOnly, PadCnt: uint8(pad), PKey: 0xffff,
		DestQP: 0x11, AckReq: true, PSN: 100})
	bth.RETH(pkt[bth.BTHSize:]).Encode(&bth.RETHFields{VA: 0x1000, RKey: 0x1234, DMALen: uint32(len(payload))})
	copy(pkt[bth.BTHSize+bth.RETHSize:], payload)
	ep := bth.Endpoints{Src: netip.MustParseAddr("198.18.0.1"), Dst: netip.MustParseAddr("198.18.0.2"),
		SrcPort: bth.SourcePort(0x12, 0x11), DstPort: bth.UDPPort}
	bth.SetICRC(pkt, bth.ICRC(&ep, pkt))

	p, err := bth.Parse(pkt)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(p.BTH.Opcode(), p.BTH.DestQP(), p.BTH.PSN(), p.BTH.AckReq())
	fmt.Printf("va %#x rkey %#x len %d: %q\n", p.RETH.VA(), p.RETH.RKey(), p.RETH.DMALen(), p.Payload)
	fmt.Println("ICRC ok:", bth.VerifyICRC(&ep, pkt))
	pkt[bth.BTHSize+bth.RETHSize] ^= 1 // a bit flipped on the way
	fmt.Println("ICRC ok:", bth.VerifyICRC(&ep, pkt))
	// Output:
	// RC RDMA Write Only 17 100 true
	// va 0x1000 rkey 0x1234 len 5: "hello"
	// ICRC ok: true
	// ICRC ok: false
}
