package roce

import (
	"net/netip"
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/fault"
	"github.com/softroce/softroce/pkg/link/mem"
)

// TestDeviceCongestion: two devices on the in-memory network, the receiver's link marking a
// fifth of what arrives ECN CE (a switch's AQM, fault mark=0.2). The receiving device counts
// the marked packets (np_ecn_marked_roce_packets) and its QP answers with CNPs (np_cnp_sent);
// the sender's device gives them to its QP (rp_cnp_handled), whose DCQCN then limits it; the
// data arrives whole. A CNP for a QP that does not exist is dropped (rcvd_dropped), and one
// for a QP with DCQCN off is ignored (rp_cnp_ignored).
func TestDeviceCongestion(t *testing.T) {
	nw := mem.NewNetwork(mem.Options{QueueDepth: 4096})
	la, err := nw.Attach(addrA)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := nw.Attach(addrB)
	if err != nil {
		t.Fatal(err)
	}
	fb := fault.Wrap(lb, fault.Options{Seed1: 7, Seed2: 8, Recv: fault.DirOptions{Mark: 0.2}})
	p := DefaultCC()
	p.RateToSetOnFirstCNP = 10_000 // Mbit/s, so the cut rate is known to be below 10 Gbit/s
	da, err := Open(Options{Link: la, Name: "a", CC: &p})
	if err != nil {
		t.Fatal(err)
	}
	defer da.Close()
	db, err := Open(Options{Link: fb, Name: "b"})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	a, b := newEnd(t, da, qp.TypeRC, 4<<20), newEnd(t, db, qp.TypeRC, 4<<20)
	connect(t, a, b, qp.MTU1024, 1, 1)
	a.fill(0, 1<<20, 5)
	for i := 0; i < 4; i++ {
		post(t, a, qp.SendWR{WRID: uint64(i), Opcode: qp.WRRDMAWrite, SGL: []qp.SGE{a.sge(0, 1<<20)}, Flags: qp.SendSignaled,
			RemoteAddr: b.va(1 << 20), RKey: b.mr.RKey()})
		checkWC(t, waitWC(t, a.scq, 1)[0], cq.WC{WRID: uint64(i), Opcode: cq.OpRDMAWrite, ByteLen: 1 << 20})
	}
	same(t, "written", b.buf[1<<20:2<<20], a.buf[:1<<20])
	sa, sb := da.Stats(), db.Stats()
	if sb.NPECNMarked == 0 || sb.NPCNPSent == 0 || sb.NPCNPSent > sb.NPECNMarked {
		t.Fatalf("receiver: np_ecn_marked_roce_packets %d, np_cnp_sent %d", sb.NPECNMarked, sb.NPCNPSent)
	}
	if sa.RPCNPHandled != sb.NPCNPSent || sa.RPCNPIgnored != 0 {
		t.Fatalf("sender: rp_cnp_handled %d rp_cnp_ignored %d, receiver sent %d", sa.RPCNPHandled, sa.RPCNPIgnored, sb.NPCNPSent)
	}
	if m := sa.Map(); m["rp_cnp_handled"] != sa.RPCNPHandled || sb.Map()["np_cnp_sent"] != sb.NPCNPSent {
		t.Fatal("counters missing from Map")
	}
	if st := a.qp.CongestionState(); st.Target == 0 && !st.Limited && st.Alpha == 0 {
		t.Fatalf("sender's DCQCN never limited: %+v", st)
	}

	// a CNP for no QP, and one for a QP with DCQCN off, sent from b's address by hand, then a
	// WRITE from b whose completion shows a's receive loop has handled both (in order)
	off := DefaultCC()
	off.Enabled = false
	c, err := da.CreateQP(QPInit{Type: qp.TypeRC, PD: a.pd, SendCQ: a.scq, RecvCQ: a.rcq, CC: &off,
		Cap: qp.Cap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	x := &end{dev: da, pd: a.pd, scq: a.scq, rcq: a.rcq, qp: c, addr: addrA}
	y := newEnd(t, db, qp.TypeRC, 4096)
	connect(t, x, y, qp.MTU1024, 1, 1)
	dropped := da.Stats().RcvdDropped
	for _, ends := range [][2]uint32{{b.qp.Num(), 0x7FFFF0}, {y.qp.Num(), c.Num()}} {
		ep := bth.Endpoints{Src: addrB, Dst: addrA, SrcPort: bth.SourcePort(ends[0], ends[1]), DstPort: bth.UDPPort}
		cnp := bth.PutCNP(make([]byte, bth.CNPSize), &ep, &bth.CNPFields{DestQP: ends[1], PKey: bth.CNPPKey})
		d := link.Datagram{Buf: cnp, Src: netip.AddrPortFrom(addrB, ep.SrcPort), Dst: netip.AddrPortFrom(addrA, bth.UDPPort)}
		if err := fb.Send([]link.Datagram{d}); err != nil {
			t.Fatal(err)
		}
	}
	post(t, b, qp.SendWR{WRID: 9, Opcode: qp.WRRDMAWrite, SGL: []qp.SGE{b.sge(0, 64)}, Flags: qp.SendSignaled,
		RemoteAddr: a.va(2 << 20), RKey: a.mr.RKey()})
	checkWC(t, waitWC(t, b.scq, 1)[0], cq.WC{WRID: 9, Opcode: cq.OpRDMAWrite, ByteLen: 64})
	if s := da.Stats(); s.RPCNPIgnored != 1 || s.RcvdDropped != dropped+1 {
		t.Fatalf("rp_cnp_ignored %d (want 1), rcvd_dropped %d (want %d)", s.RPCNPIgnored, s.RcvdDropped, dropped+1)
	}
}
