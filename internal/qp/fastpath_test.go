package qp

import (
	"net/netip"
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
)

// runOut is a chanOut that is also a link.RunSender: it records the runs it is given, checks
// that datagram k of every run carries an ICRC computed for IPv4 ID k (what the wire will carry
// when the run leaves as one GSO message), then re-encodes it for ID 0 so the harness can
// deliver it as the receiving device would after solving the ID.
type runOut struct {
	chanOut
	t        *testing.T
	gso      bool
	runs     []uint8
	sendRuns int
	plain    int
}

func (r *runOut) RunGSO(netip.Addr) bool { return r.gso }

func (r *runOut) Send(batch []link.Datagram) error {
	r.plain++
	for i := range batch {
		d := &batch[i]
		ep := bth.Endpoints{Src: d.Src.Addr(), Dst: d.Dst.Addr(), SrcPort: d.Src.Port(), DstPort: d.Dst.Port()}
		if !bth.VerifyICRC(&ep, d.Buf) {
			r.t.Fatalf("plain send: datagram %d has an ICRC not computed for ID 0", i)
		}
	}
	return r.chanOut.Send(batch)
}

func (r *runOut) SendRuns(batch []link.Datagram, runs []uint8) error {
	r.sendRuns++
	i := 0
	for _, c := range runs {
		var rule link.RunRule
		for k := 0; k < int(c); k++ {
			d := &batch[i+k]
			if got := rule.Join(len(d.Buf), d.Src, d.Dst); got != k {
				r.t.Fatalf("run breaks link.RunRule: datagram %d would be index %d, marked %d", i+k, got, k)
			}
			ep := bth.Endpoints{Src: d.Src.Addr(), Dst: d.Dst.Addr(), SrcPort: d.Src.Port(), DstPort: d.Dst.Port(), IPID: uint16(k)}
			if !bth.VerifyICRC(&ep, d.Buf) {
				r.t.Fatalf("datagram %d (index %d of a run of %d): ICRC not computed for IPv4 ID %d", i+k, k, c, k)
			}
		}
		r.runs = append(r.runs, c)
		i += int(c)
	}
	if i != len(batch) {
		r.t.Fatalf("runs cover %d of %d datagrams", i, len(batch))
	}
	n := len(r.q)
	if err := r.chanOut.Send(batch); err != nil {
		return err
	}
	for j := n; j < len(r.q); j++ {
		reencode(&r.q[j])
	}
	return nil
}

// TestGSORunICRC: with a RunSender Output using GSO, a 64 KiB WRITE leaves as marked runs whose
// k-th packets carry ICRCs for IPv4 ID k, and arrives intact; with GSO off every packet is a
// plain ID-0 datagram.
func TestGSORunICRC(t *testing.T) {
	for _, tc := range []struct {
		mtu  MTU
		gso  bool
		runs []uint8 // expected runs of the requester's 64 KiB WRITE
	}{
		// FIRST carries the RETH (16 bytes longer): the MIDDLE after it is "shorter" and closes
		// the run; the other 62 packets fill one run (the message has 64 packets).
		{MTU1024, true, []uint8{2, 62}},
		// 4 KiB: 15 packets per run (65507-byte limit), 64 per burst, 16 packets in all.
		{MTU4096, true, []uint8{2, 14}},
		{MTU1024, false, nil},
	} {
		n := newNet(t)
		a := n.newSide("10.0.0.1", sideOpts{qpn: 0x11, bufSize: 1 << 20})
		b := n.newSide("10.0.0.2", sideOpts{qpn: 0x12, bufSize: 1 << 20})
		ro := &runOut{t: t, gso: tc.gso}
		a.qp.cfg.Out, a.qp.runs = ro, ro
		// the harness pumps a's chanOut: share it
		a.out = &ro.chanOut
		n.connect(a, b, connOpts{mtu: tc.mtu})
		a.fill(0, 64<<10, 7)
		a.postSend(t, SendWR{WRID: 1, Opcode: WRRDMAWrite, SGL: []SGE{a.sge(0, 64<<10)}, Flags: SendSignaled,
			RemoteAddr: b.va(0), RKey: b.mr.RKey()})
		n.pump()
		expectWC(t, pollAll(a.scq), cq.WC{WRID: 1, Status: cq.StatusSuccess, Opcode: cq.OpRDMAWrite, ByteLen: 64 << 10, QPNum: 0x11})
		eq(t, "written data", b.buf[:64<<10], a.buf[:64<<10])
		if !tc.gso {
			if ro.sendRuns != 0 || ro.plain == 0 {
				t.Fatalf("GSO off: %d SendRuns, %d Sends", ro.sendRuns, ro.plain)
			}
			continue
		}
		if ro.plain != 0 {
			t.Fatalf("MTU %v: %d plain Sends with GSO runs available", tc.mtu, ro.plain)
		}
		if len(ro.runs) != len(tc.runs) {
			t.Fatalf("MTU %v: runs %v, want %v", tc.mtu, ro.runs, tc.runs)
		}
		for i := range tc.runs {
			if ro.runs[i] != tc.runs[i] {
				t.Fatalf("MTU %v: runs %v, want %v", tc.mtu, ro.runs, tc.runs)
			}
		}
	}
}
