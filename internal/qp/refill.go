package qp

import (
	"net/netip"

	"github.com/softroce/softroce/pkg/bth"
)

// Receive-queue refill (Config.RecvRefill): the owner of a QP whose receive posts reach the
// engine after PostRecv returned (the daemon's post ring, docs/daemon.md) gets the chance to
// hand them over before the responder decides that a packet finds no receive WQE. Without it a
// SEND the peer sent after ibv_post_recv returned could be answered with an RNR NAK (RC, IBTA
// 9.7.5.2.8) or dropped (UC/UD, IBTA 9.8), which ibverbs semantics exclude.
//
// The packet arrives on a goroutine the QP shares with every other QP of its receive worker,
// while the owner's posts are handled on the owner's goroutines (a client's, in the daemon), so
// the receive path never waits for the owner and never runs the owner's work:
//
//  1. The QP's own checks come first (state, transport, addresses, P_Key, Q_Key: accept; on RC
//     the expected PSN): only a packet the responder would execute next, that consumes a
//     receive WQE, while the QP has none, asks the owner (needsRefill). Nothing a stranger
//     sends to a QP, and nothing a QP's peer sends while receives are queued, reaches the hook.
//  2. The hook runs with no QP lock held and must not block: it reports whether the owner holds
//     receives that are not posted yet (or may be posting them right now).
//  3. If so, the QP holds the packet and the requests after it (hold.go) and goes on with
//     other work. The owner posts its receives on its own goroutine and then calls Refilled,
//     which executes the held packets there.

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

// needsRefill reports whether p, which the responder would execute next, consumes a receive WQE
// while the QP has none, so the owner is to be asked (q.mu held). The QP's own receive checks
// come first; RC's PSN check too (a duplicate or a packet ahead of the expected PSN takes no
// WQE). With a write responder attached the program may have moved the PSN on: the check is
// left to the responder then (asking once too often costs a copy, not a wrong answer).
func (q *QP) needsRefill(p *bth.Packet, src, dst netip.AddrPort) bool {
	if q.cfg.RecvRefill == nil || q.cfg.SRQ != nil || q.dead || q.rqHead != q.rqTail || q.resp.haveWQE ||
		!consumesRecvWQE(p) || !q.accept(p, src, dst) {
		return false
	}
	return q.typ != TypeRC || q.wo != nil || p.BTH.PSN() == q.resp.epsn
}

// askOwner calls the refill hook with q.mu released (held on entry and on return) and reports
// whether the packet is to wait for Refilled: the owner holds receives not yet posted, and did
// not post them (Refilled) while the hook ran. While it runs, asking keeps the responder busy,
// so no other goroutine runs held packets meanwhile. A hook that panics (application code)
// leaves the QP as if it had answered false.
func (q *QP) askOwner() bool {
	q.asking = true
	gen := q.refillGen
	q.mu.Unlock()
	returned := false
	defer func() {
		if !returned {
			q.mu.Lock()
			q.asking = false
			q.mu.Unlock()
		}
	}()
	keep := q.cfg.RecvRefill(q)
	returned = true
	q.mu.Lock()
	q.asking = false
	return keep && q.refillGen == gen && !q.dead
}

// receiveHold is the receive path's first step (q.mu held on entry and on return): it reports
// whether the QP took p — held behind a busy responder (hold.go), or held for the owner's
// refill. false: execute it now.
func (q *QP) receiveHold(p *bth.Packet, src, dst netip.AddrPort) bool {
	if q.holdIfBusy(p, src, dst) {
		return true
	}
	if !q.needsRefill(p, src, dst) || !q.askOwner() {
		return false
	}
	q.waitRefill = true
	q.hold(p, src, dst)
	return true
}

// Refilled tells the QP that its owner has posted the receives it held when RecvRefill
// returned true: the packets the QP held since are executed now, in order, on the caller's
// goroutine, and what they produce is sent. Call it with no QP lock held, after every receive
// accepted before the hook was called has been posted. Calls when nothing waits cost a lock.
func (q *QP) Refilled() {
	q.mu.Lock()
	q.refillGen++
	if !q.waitRefill {
		q.mu.Unlock()
		return
	}
	q.waitRefill = false
	now := q.cfg.Clock.Now()
	q.runHeld(now) // the hook may run again (released lock): no defer
	q.flush()
	q.armTimerAt(now)
	q.mu.Unlock()
}
