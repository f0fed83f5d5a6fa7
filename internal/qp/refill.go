package qp

import "github.com/softroce/softroce/pkg/bth"

// Receive-queue refill (Config.RecvRefill): the owner of a QP whose receive posts reach the
// engine after PostRecv returned (the daemon's post ring, docs/daemon.md) gets one chance to
// hand them over before the responder decides that a packet finds no receive WQE. Without it a
// SEND the peer sent after ibv_post_recv returned could be answered with an RNR NAK (RC, IBTA
// 9.7.5.2.8) or dropped (UC/UD, IBTA 9.8), which ibverbs semantics exclude.

// consumesRecvWQE reports whether a request packet takes a receive WQE when it is executed: the
// FIRST or ONLY packet of a SEND (with immediate or invalidate included; UD SEND ONLY), and the
// LAST or ONLY packet of an RDMA WRITE with immediate (IBTA 9.4.3: only that packet carries
// ImmDt and consumes a WQE). Other packets continue a message whose WQE is already held.
func consumesRecvWQE(p *bth.Packet) bool {
	info := p.Info
	if info == nil || !info.Request {
		return false
	}
	switch info.Kind {
	case bth.KindSend:
		return info.First
	case bth.KindWrite:
		return info.Last && info.Hdrs&bth.HdrImmDt != 0
	}
	return false
}

// maybeRefill calls Config.RecvRefill when p consumes a receive WQE and the QP's own receive
// queue looks empty. It runs before the QP lock is taken, so the hook may post to this and other
// QPs. The emptiness test reads rqLen, an atomic copy of rqTail-rqHead kept by every change of
// the ring under the lock (rqNote): only this QP's responder (the receive goroutine calling here)
// consumes receives, so a non-empty reading stays true until the packet is executed, except
// when the QP leaves RTR/RTS meanwhile (its packets are then dropped anyway). A reading of empty
// that is stale costs one unneeded call. QPs on an SRQ never call it (SRQ posts are not
// deferred by the daemon: they are round trips).
func (q *QP) maybeRefill(p *bth.Packet) {
	if q.cfg.RecvRefill != nil && q.cfg.SRQ == nil && q.rqLen.Load() == 0 && consumesRecvWQE(p) {
		q.cfg.RecvRefill()
	}
}

// rqNote publishes the receive queue's length for maybeRefill (q.mu held).
func (q *QP) rqNote() { q.rqLen.Store(q.rqTail - q.rqHead) }
