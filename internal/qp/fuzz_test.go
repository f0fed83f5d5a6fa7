package qp

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
)

// FuzzReceive feeds arbitrary packets (seeded with real ones from every
// operation) to an RC pair with work outstanding on both sides: remote
// input must never panic, whatever its opcode, headers, PSN or keys.
func FuzzReceive(f *testing.F) {
	// seeds: the packets of a run of every operation
	n, a, b := rcPair(f, connOpts{mtu: MTU256})
	var seeds [][]byte
	n.filter = func(_ *side, d *link.Datagram, _ *bth.Packet) bool {
		seeds = append(seeds, append([]byte(nil), d.Buf...))
		return true
	}
	b.postRecv(f, RecvWR{WRID: 1, SGL: []SGE{b.sge(0, 4096)}}, RecvWR{WRID: 2, SGL: []SGE{b.sge(4096, 4096)}})
	a.postSend(f,
		SendWR{Opcode: WRSend, SGL: []SGE{a.sge(0, 600)}},
		SendWR{Opcode: WRRDMAWriteWithImm, SGL: []SGE{a.sge(0, 600)}, RemoteAddr: b.va(0), RKey: b.mr.RKey()},
		SendWR{Opcode: WRRDMARead, SGL: []SGE{a.sge(0, 600)}, RemoteAddr: b.va(0), RKey: b.mr.RKey()},
		SendWR{Opcode: WRAtomicCmpAndSwp, SGL: []SGE{a.sge(0, 8)}, RemoteAddr: b.va(0), RKey: b.mr.RKey()},
		SendWR{Opcode: WRSendWithInv, SGL: []SGE{a.sge(0, 8)}, InvRKey: 0x1234})
	n.pump()
	for _, s := range seeds {
		f.Add(s, true)
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, pkt []byte, toB bool) {
		n, a, b := rcPair(t, connOpts{mtu: MTU256, retry: 1})
		b.postRecv(t, RecvWR{WRID: 1, SGL: []SGE{b.sge(0, 1024)}})
		a.postRecv(t, RecvWR{WRID: 1, SGL: []SGE{a.sge(0, 1024)}})
		a.postSend(t, SendWR{Opcode: WRRDMARead, SGL: []SGE{a.sge(0, 700)}, RemoteAddr: b.va(0), RKey: b.mr.RKey()},
			SendWR{Opcode: WRAtomicFetchAndAdd, SGL: []SGE{a.sge(800, 8)}, RemoteAddr: b.va(0), RKey: b.mr.RKey()})
		a.out.q, b.out.q = nil, nil // keep the work outstanding
		if len(pkt) < 12 {
			return
		}
		buf := append([]byte(nil), pkt...)
		to, from := b, a
		if !toB {
			to, from = a, b
		}
		// aim at the QP, near its PSNs, so the fuzzer reaches the rules
		binary.BigEndian.PutUint32(buf[4:], uint32(buf[4])<<24|to.qp.Num())
		p, err := bth.Parse(buf)
		if err != nil {
			return
		}
		for i := 0; i < 3; i++ {
			to.qp.Receive(n.clk.Now(), &p, d(from), d(to))
			n.pump()
			n.clk.Advance(AckTimeout(14))
		}
		pollAll(a.scq)
		pollAll(b.rcq)
		_ = cq.StatusSuccess
	})
}

func d(s *side) netip.AddrPort { return netip.AddrPortFrom(s.addr, 4791) }
