package bth

import (
	"math/rand/v2"
	"net/netip"
	"testing"
)

func rethPacket() []byte {
	r := rand.New(rand.NewPCG(50, 51))
	return buildPacket(r, OpRCWriteFirst, 1024, 0)
}

func BenchmarkParseRETH(b *testing.B) {
	pkt := rethPacket()
	b.ReportAllocs()
	for b.Loop() {
		p, err := Parse(pkt)
		if err != nil || p.RETH == nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodeRETH(b *testing.B) {
	buf := make([]byte, BTHSize+RETHSize)
	bf := BTHFields{Opcode: OpRCWriteFirst, PKey: 0xFFFF, DestQP: 0x17, AckReq: true, PSN: 361436}
	rf := RETHFields{VA: 0x5593f16ae000, RKey: 0x78c, DMALen: 3000}
	b.ReportAllocs()
	for b.Loop() {
		BTH(buf).Encode(&bf)
		RETH(buf[BTHSize:]).Encode(&rf)
		bf.PSN = bf.PSN.Add(1)
	}
}

func benchEP() Endpoints {
	return Endpoints{Src: netip.MustParseAddr("198.19.0.1"), Dst: netip.MustParseAddr("198.19.0.2"),
		SrcPort: 49681, DstPort: UDPPort}
}

func benchICRC(b *testing.B, payload int) {
	r := rand.New(rand.NewPCG(52, 53))
	pkt := buildPacket(r, OpRCSendMiddle, payload, 0)
	ep := benchEP()
	b.SetBytes(int64(len(pkt)))
	b.ReportAllocs()
	for b.Loop() {
		SetICRC(pkt, ICRC(&ep, pkt))
	}
}

func BenchmarkICRC1024(b *testing.B) { benchICRC(b, 1024) }
func BenchmarkICRC4096(b *testing.B) { benchICRC(b, 4096) }

// BenchmarkICRCContinue4096 is the data-path form: the pseudo-header state is
// cached per flow and length.
func BenchmarkICRCContinue4096(b *testing.B) {
	r := rand.New(rand.NewPCG(54, 55))
	pkt := buildPacket(r, OpRCSendMiddle, 4096, 0)
	ep := benchEP()
	st := PseudoHeaderCRC(&ep, len(pkt))
	b.SetBytes(int64(len(pkt)))
	b.ReportAllocs()
	for b.Loop() {
		SetICRC(pkt, ICRCContinue(st, pkt))
	}
}

func benchSolve(b *testing.B, id uint16) {
	r := rand.New(rand.NewPCG(56, 57))
	pkt := buildPacket(r, OpRCSendMiddle, 1024, 0)
	ep := benchEP()
	ep.IPID = id
	SetICRC(pkt, ICRC(&ep, pkt))
	if got, ok := SolveIPv4ID(&ep, pkt); !ok || got != id {
		b.Fatal("setup")
	}
	b.SetBytes(int64(len(pkt)))
	b.ReportAllocs()
	for b.Loop() {
		if got, ok := SolveIPv4ID(&ep, pkt); !ok || got != id {
			b.Fatal("solve")
		}
	}
}

// BenchmarkSolveIPv4ID: a packet with a non-zero ID (length cached).
func BenchmarkSolveIPv4ID(b *testing.B) { benchSolve(b, 0xDF78) }

// BenchmarkSolveIPv4IDZero: the fast path, ID 0.
func BenchmarkSolveIPv4IDZero(b *testing.B) { benchSolve(b, 0) }

// BenchmarkIDBasisBuild: cost of filling the cache for one new length.
func BenchmarkIDBasisBuild(b *testing.B) {
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		_ = newIDBasis(1000 + n%4000)
		n++
	}
}

// BenchmarkParseIntoRETH: the data-path form reusing one Packet.
func BenchmarkParseIntoRETH(b *testing.B) {
	pkt := rethPacket()
	var p Packet
	b.ReportAllocs()
	for b.Loop() {
		if err := ParseInto(&p, pkt); err != nil || p.RETH == nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkICRCContinueSmall: the data-path ICRC of the packets of an 8-byte WRITE latency
// test — a 40-byte RDMA WRITE ONLY (BTH, RETH, 8 bytes, ICRC) and a 20-byte ACK (BTH, AETH,
// ICRC) — with cached pseudo-header states.
func BenchmarkICRCContinueSmall(b *testing.B) {
	for _, c := range []struct {
		name string
		n    int
	}{{"write8", BTHSize + RETHSize + 8 + ICRCSize}, {"ack", BTHSize + AETHSize + ICRCSize}} {
		b.Run(c.name, func(b *testing.B) {
			r := rand.New(rand.NewPCG(58, 59))
			pkt := make([]byte, c.n)
			for i := range pkt {
				pkt[i] = byte(r.Uint32())
			}
			ep := benchEP()
			st := PseudoHeaderCRC(&ep, len(pkt))
			b.ReportAllocs()
			for b.Loop() {
				SetICRC(pkt, ICRCContinue(st, pkt))
			}
		})
	}
}
