package qp

import (
	"net/netip"
	"sync"
	"unsafe"

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
//  3. If so, the QP holds the packet (a copy, in a pooled buffer) and every request packet after
//     it, in order, and goes on with other work; responses (ACKs, READ responses) are not held:
//     IBTA orders the two directions independently (9.7.1). The owner posts its receives on its
//     own goroutine and then calls Refilled, which executes the held packets there.
//  4. A QP holds at most parkPackets packets (parkBytes bytes); more are dropped, as a full
//     receive queue on a network drops them, and on RC one PSN sequence error NAK after the
//     held packets asks the requester to resend from the expected PSN (IBTA 9.7.5.2.1) rather
//     than wait for its ACK timeout.

const (
	// parkPackets and parkBytes bound the packets a QP holds for its owner's refill.
	parkPackets = 32
	parkBytes   = 64 << 10
)

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

// parking holds the request packets of a QP that wait for the owner's refill.
type parking struct {
	buf  []byte // the packets back to back (cap parkBytes)
	ents [parkPackets]parkEntry
	n    int
	// lost: a request was dropped because the parking was full; lostPSN is the last one
	lost    bool
	lostPSN bth.PSN
	pkt     bth.Packet // the packet being replayed (Refilled)
}

type parkEntry struct {
	off, n   int
	src, dst netip.AddrPort
}

// parkPool keeps idle parkings (a mutex-guarded stack, as txPool).
var parkPool struct {
	mu   sync.Mutex
	free []*parking
}

const parkPoolMax = 16

func getParking() *parking {
	parkPool.mu.Lock()
	if n := len(parkPool.free); n > 0 {
		pk := parkPool.free[n-1]
		parkPool.free[n-1] = nil
		parkPool.free = parkPool.free[:n-1]
		parkPool.mu.Unlock()
		return pk
	}
	parkPool.mu.Unlock()
	return &parking{buf: make([]byte, 0, parkBytes)}
}

func putParking(pk *parking) {
	pk.buf = pk.buf[:0]
	pk.n = 0
	pk.lost = false
	pk.pkt = bth.Packet{}
	for i := range pk.ents {
		pk.ents[i] = parkEntry{}
	}
	parkPool.mu.Lock()
	if len(parkPool.free) < parkPoolMax {
		parkPool.free = append(parkPool.free, pk)
	}
	parkPool.mu.Unlock()
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

// refillHold is the receive path's refill step (q.mu held on entry and on return; the hook runs
// with it released). It reports whether the QP took the packet: held for the owner's refill (or
// dropped because the parking was full). false: execute it now.
func (q *QP) refillHold(p *bth.Packet, src, dst netip.AddrPort) bool {
	if q.cfg.RecvRefill == nil {
		return false
	}
	if q.park != nil {
		if p.Info == nil || !p.Info.Request {
			return false // responses are not held (IBTA 9.7.1: each direction has its own order)
		}
		q.hold(p, src, dst)
		return true
	}
	if !q.needsRefill(p, src, dst) {
		return false
	}
	gen := q.refillGen
	q.mu.Unlock()
	keep := q.cfg.RecvRefill(q)
	q.mu.Lock()
	// Refilled ran meanwhile (the owner was quick): the receives are posted, execute now
	if !keep || q.refillGen != gen || q.dead {
		return false
	}
	q.hold(p, src, dst)
	return true
}

// hold copies p into the QP's parking (q.mu held); a full parking drops it.
func (q *QP) hold(p *bth.Packet, src, dst netip.AddrPort) {
	if q.park == nil {
		q.park = getParking()
	}
	pk := q.park
	b := packetBytes(p)
	if b == nil || pk.n == len(pk.ents) || len(pk.buf)+len(b) > cap(pk.buf) {
		q.cnt.RcvdDropped.Add(1)
		if q.typ == TypeRC {
			pk.lost, pk.lostPSN = true, p.BTH.PSN()
		}
		return
	}
	pk.ents[pk.n] = parkEntry{off: len(pk.buf), n: len(b), src: src, dst: dst}
	pk.n++
	pk.buf = append(pk.buf, b...)
}

// Refilled tells the QP that its owner has posted the receives it held when RecvRefill
// returned true: the packets the QP held since are executed now, in order, on the caller's
// goroutine, and what they produce is sent. Call it with no QP lock held, after every receive
// accepted before the hook was called has been posted. Calls when nothing is held cost a lock.
func (q *QP) Refilled() {
	q.mu.Lock()
	q.refillGen++
	pk := q.park
	if pk == nil {
		q.mu.Unlock()
		return
	}
	q.park = nil
	now := q.cfg.Clock.Now()
	for i := 0; i < pk.n; i++ {
		e := &pk.ents[i]
		if bth.ParseInto(&pk.pkt, pk.buf[e.off:e.off+e.n]) == nil {
			q.receive(now, &pk.pkt, e.src, e.dst)
		}
	}
	if pk.lost && q.typ == TypeRC && !q.dead && (q.state == StateRTR || q.state == StateRTS) &&
		!q.resp.nakSent && pk.lostPSN.Sub(q.resp.epsn) >= 0 {
		// requests were dropped past the expected PSN: one PSN sequence error NAK (IBTA
		// 9.7.5.2.1) and the requester resends from it at once
		q.cnt.OutOfSeqRequest.Add(1)
		q.resp.nakSent = true
		q.sendAck(bth.SyndromeNAK(bth.NAKPSNSeqErr), q.resp.epsn)
	}
	q.flush()
	q.armTimerAt(now)
	q.mu.Unlock()
	putParking(pk)
}

// dropParking discards the held packets (q.mu held): RESET and Destroy.
func (q *QP) dropParking() {
	if pk := q.park; pk != nil {
		q.park = nil
		q.cnt.RcvdDropped.Add(uint64(pk.n))
		putParking(pk)
	}
}

// packetBytes returns the bytes p was parsed from: bth.ParseInto makes every view of a packet
// alias the one buffer it parsed, the BTH at its start and the ICRC at its end. nil if p does
// not look like that.
func packetBytes(p *bth.Packet) []byte {
	if p.Info == nil || len(p.BTH) != bth.BTHSize || len(p.ICRC) != bth.ICRCSize {
		return nil
	}
	n := p.Info.HdrLen + len(p.Payload) + p.Pad + bth.ICRCSize
	start := unsafe.Pointer(&p.BTH[0])
	if uintptr(unsafe.Pointer(&p.ICRC[bth.ICRCSize-1]))-uintptr(start) != uintptr(n-1) {
		return nil
	}
	return unsafe.Slice((*byte)(start), n)
}
