package qp

import (
	"net/netip"
	"time"

	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/pkg/bth"
)

// A write responder outside the engine (Config.Writes; docs/engine.md "Write responder"):
// the link's XDP program (pkg/link, xdpwrite_linux.go) executes an RC QP's RDMA WRITE
// Only requests at the expected PSN in the kernel, as kernel rxe does in the sender's softirq,
// and ACKs them itself. The QP and the program share the responder's expected PSN and MSN
// through a WriteState: before the QP's own responder runs for a request it pauses the state
// (the program then leaves every request to the QP) and adopts what the program advanced;
// after, it publishes its state, and keeps the program paused until its responder is at rest
// and what it queued has been sent (publishWrites). So each request
// is executed once, in PSN order, by one of the two, and a duplicate of a WRITE the program
// executed reaches the QP as a duplicate.

// WriteResponder attaches QPs to a write responder outside the engine.
type WriteResponder interface {
	// AttachWrites lets the responder execute the QP's WRITEs; nil, error: it cannot (the QP
	// works as without it).
	AttachWrites(w WriteQPInfo) (WriteState, error)
	// DetachWrites stops it; the state's Executed stays readable.
	DetachWrites(s WriteState)
}

// WriteQPInfo is what a write responder needs of a QP: its number, the peer's, the protection
// domain's handle, the path its ACKs take (addresses, ports, traffic class) and the BTH and
// AETH of its ACK with PSN 0 and MSN 0, as the QP's own responder builds it.
type WriteQPInfo struct {
	QPN, DestQPN, PD uint32
	Local, Peer      netip.Addr
	SrcPort, DstPort uint16
	TClass           uint8
	ACK              [16]byte
}

// WriteState is the responder state a QP shares with its write responder.
type WriteState interface {
	// Pause keeps the responder from executing (waiting out a request it is executing) and
	// returns the expected PSN and MSN.
	Pause() (epsn, msn uint32)
	// Resume publishes the expected PSN and MSN; unless paused, the responder may execute.
	Resume(epsn, msn uint32, paused bool)
	// Executed counts the WRITE messages the responder executed.
	Executed() uint64
}

// writesWanted reports whether the QP should be attached to Config.Writes now: an RC QP in
// RTR or RTS that allows remote writes, on an IPv4 path.
func (q *QP) writesWanted() bool {
	return q.cfg.Writes != nil && !q.dead && q.typ == TypeRC &&
		(q.state == StateRTR || q.state == StateRTS) &&
		q.attr.AccessFlags&mr.AccessRemoteWrite != 0 && q.path.Dst.Is4() && q.path.Src.Is4()
}

// writesInfo describes the QP to its write responder.
func (q *QP) writesInfo() WriteQPInfo {
	w := WriteQPInfo{QPN: q.num, DestQPN: q.attr.DestQPN, Local: q.path.Src, Peer: q.path.Dst,
		DstPort: q.cfg.DstPort, TClass: q.path.TClass}
	if q.cfg.PD != nil {
		w.PD = q.cfg.PD.Handle()
	}
	w.SrcPort = q.cfg.Out.SourcePort(q.path.Src, q.entropy(q.attr.DestQPN))
	bth.BTH(w.ACK[:]).Encode(&bth.BTHFields{Opcode: bth.OpRCAck, PKey: 0xFFFF, DestQP: q.attr.DestQPN})
	bth.AETH(w.ACK[bth.BTHSize:]).Encode(&bth.AETHFields{Syndrome: bth.SyndromeACK(0x1F)})
	return w
}

// syncWrites attaches, re-attaches (the path or the peer changed) or detaches the QP's
// write responder after a change of state or attributes (q.mu held).
func (q *QP) syncWrites() {
	if !q.writesWanted() {
		q.detachWrites()
		return
	}
	info := q.writesInfo()
	if q.wo != nil && info != q.woInfo {
		q.detachWrites()
	}
	if q.wo == nil {
		s, err := q.cfg.Writes.AttachWrites(info)
		if err != nil || s == nil {
			return
		}
		q.wo, q.woInfo, q.woHeld = s, info, true // attached paused
		// a new slice: RemoteWrites reads the old one without q.mu
		var n []WriteState
		if old := q.resp.writes.shared.Load(); old != nil {
			n = append(n, *old...)
		}
		n = append(n, s)
		q.resp.writes.shared.Store(&n)
	} else {
		// still attached: the program may have executed WRITEs since the QP last looked;
		// publishing the QP's own (older) PSN and MSN would undo them
		q.adoptWrites()
	}
	q.publishWrites()
}

// detachWrites takes the QP out of its write responder, adopting what it executed (q.mu held).
func (q *QP) detachWrites() {
	if q.wo == nil {
		return
	}
	q.adoptWrites()
	q.cfg.Writes.DetachWrites(q.wo)
	q.wo, q.woHeld = nil, false
}

// adoptWrites pauses the write responder, unless the QP holds it paused already, and takes
// over the PSN and MSN it advanced to.
func (q *QP) adoptWrites() {
	if q.woHeld {
		return
	}
	epsn, msn := q.wo.Pause()
	q.woHeld = true
	if bth.PSN(epsn) != q.resp.epsn {
		// it executed WRITEs from our expected PSN on: we were at rest then
		q.resp.epsn, q.resp.msn, q.resp.nakSent = bth.PSN(epsn), msn, false
	}
}

// publishWrites hands the responder's state back (the QP holding it paused): unpaused only
// if the responder is at rest — no NAK outstanding, no message in progress, no READ responses
// still to send and no request waiting (hold.go, readresp.go), communication established
// (IBTA 11.6.3: the first request in RTR raises CommEst, which only the engine does) — and
// nothing the engine queued is still to be sent (an ACK of the program's must not
// overtake a response the engine built first: flush publishes again after sending).
func (q *QP) publishWrites() {
	if q.wo == nil || !q.woHeld {
		return
	}
	rest := !q.resp.nakSent && q.resp.inMsg == msgNone && !q.busy() && q.held == nil && q.writesWanted() &&
		(q.resp.sr == nil || q.resp.sr.n == 0) &&
		(q.state != StateRTR || q.resp.commEst) && (q.out == nil || len(q.out.batch) == 0)
	q.wo.Resume(uint32(q.resp.epsn), q.resp.msn, !rest)
	q.woHeld = !rest
}

// respondShared is respond for a QP with a write responder: paused while it runs.
func (q *QP) respondShared(now time.Time, p *bth.Packet, src, dst netip.AddrPort) {
	q.adoptWrites()
	q.woResponding = true
	q.respond(now, p, src, dst)
	q.woResponding = false
	q.publishWrites()
}

// sharedWrites sums what the QP's write responders (this one and any before it since RESET)
// executed.
func (w *writeCount) sharedWrites() uint64 {
	p := w.shared.Load()
	if p == nil {
		return 0
	}
	var n uint64
	for _, s := range *p {
		n += s.Executed()
	}
	return n
}
