package qp

import (
	"net/netip"
	"sync"
	"time"
	"unsafe"

	"github.com/softroce/softroce/pkg/bth"
)

// Held requests. The responder executes requests one at a time, in the order they arrive (IBTA
// 9.5: a responder executes requests in PSN order; rxe's responder takes the next packet from
// its queue only once the current one, a READ's responses included, is done). While it is busy
// with one — waiting for its owner to post receives (refill.go), or sending a READ's responses a
// burst at a time (readresp.go) — the request packets that arrive wait here, in order, as copies
// in a pooled buffer (the receive buffer is reused for the next datagram), and the goroutine
// that delivered them goes on with other QPs:
//
//   - Only requests wait. Responses (ACKs, READ responses, atomic ACKs) are the requester's and
//     the completer's; IBTA orders the two directions independently (9.7.1), so they are
//     executed at once.
//   - A duplicate READ is not held: it restarts the responses of the READ it repeats (a
//     requester resending a READ has gone back to it; readresp.go).
//   - At most heldPackets packets (heldBytes bytes) wait; more are dropped, as a full receive
//     queue on a network drops them, and on RC one PSN sequence error NAK after the held ones
//     asks the requester to resend from the expected PSN at once (IBTA 9.7.5.2.1) instead of
//     after its ACK timeout.
//   - Whoever ends the busy state runs the held packets (runHeld, q.mu held): the owner's
//     goroutine in Refilled, the responder scheduler's in RunResponder, until the responder is
//     busy again or none is left. RESET, ERR and Destroy drop them.

const (
	// heldPackets and heldBytes bound the request packets a QP holds.
	heldPackets = 32
	heldBytes   = 64 << 10
)

// heldQueue holds request packets that wait for the responder (q.mu).
type heldQueue struct {
	buf  []byte // the packets back to back (cap heldBytes)
	ents [heldPackets]heldEntry
	n    int // entries
	next int // the first not yet executed
	// lost: a request was dropped because the queue was full; lostPSN is the last one
	lost    bool
	lostPSN bth.PSN
	pkt     bth.Packet // the entry being executed (runHeld)
}

type heldEntry struct {
	off, n   int
	src, dst netip.AddrPort
	asked    bool // the owner was asked for a refill for it (refill.go)
}

// heldPool keeps idle queues (a mutex-guarded stack, as txPool: no allocation per packet).
var heldPool struct {
	mu   sync.Mutex
	free []*heldQueue
}

const heldPoolMax = 16

func getHeld() *heldQueue {
	heldPool.mu.Lock()
	if n := len(heldPool.free); n > 0 {
		h := heldPool.free[n-1]
		heldPool.free[n-1] = nil
		heldPool.free = heldPool.free[:n-1]
		heldPool.mu.Unlock()
		return h
	}
	heldPool.mu.Unlock()
	return &heldQueue{buf: make([]byte, 0, heldBytes)}
}

func putHeld(h *heldQueue) {
	h.buf = h.buf[:0]
	h.n, h.next = 0, 0
	h.lost = false
	h.pkt = bth.Packet{}
	for i := range h.ents {
		h.ents[i] = heldEntry{}
	}
	heldPool.mu.Lock()
	if len(heldPool.free) < heldPoolMax {
		heldPool.free = append(heldPool.free, h)
	}
	heldPool.mu.Unlock()
}

// busy reports whether the responder is in the middle of something a new request must wait
// for (q.mu held): the owner's refill, or a READ's responses.
func (q *QP) busy() bool { return q.waitRefill || q.asking || q.resp.rd.active }

// holdIfBusy holds a request packet that must wait: the responder is busy or requests already
// wait (q.mu held). A duplicate READ is let through (it restarts its responses).
func (q *QP) holdIfBusy(p *bth.Packet, src, dst netip.AddrPort) bool {
	if q.held == nil && !q.busy() {
		return false
	}
	if p.Info == nil || !p.Info.Request || q.dupRead(p) {
		return false
	}
	q.hold(p, src, dst)
	return true
}

// dupRead reports whether p is an RC READ request before the expected PSN: a duplicate.
func (q *QP) dupRead(p *bth.Packet) bool {
	return q.typ == TypeRC && p.Info.Kind == bth.KindReadReq && p.BTH.PSN().Sub(q.resp.epsn) < 0
}

// hold appends a copy of p to the held queue (q.mu held); a full queue drops it.
func (q *QP) hold(p *bth.Packet, src, dst netip.AddrPort) {
	if q.held == nil {
		q.held = getHeld()
	}
	h := q.held
	b := packetBytes(p)
	if b == nil || h.n == len(h.ents) || len(h.buf)+len(b) > cap(h.buf) {
		q.cnt.RcvdDropped.Add(1)
		if q.typ == TypeRC && p.Info != nil {
			h.lost, h.lostPSN = true, p.BTH.PSN()
		}
		return
	}
	h.ents[h.n] = heldEntry{off: len(h.buf), n: len(b), src: src, dst: dst}
	h.n++
	h.buf = append(h.buf, b...) // within cap: the entries already held never move
}

// runHeld executes the held packets in order while the responder is not busy (q.mu held; the
// refill hook is called with it released), then the packets selective repeat holds out of
// order that follow in PSN order (selective.go). What they produce is queued in the QP's burst.
func (q *QP) runHeld(now time.Time) {
	q.runHeldQueue(now)
	if q.resp.sr != nil && !q.busy() {
		q.srDrain(now, q.resp.epsn.Add(bth.PSNMask))
	}
}

func (q *QP) runHeldQueue(now time.Time) {
	for q.held != nil && !q.busy() && !q.dead {
		h := q.held
		if h.next == h.n {
			q.held = nil
			if h.lost && q.typ == TypeRC && (q.state == StateRTR || q.state == StateRTS) &&
				!q.resp.nakSent && h.lostPSN.Sub(q.resp.epsn) >= 0 {
				// requests past the expected PSN were dropped: one PSN sequence error NAK
				// (IBTA 9.7.5.2.1), and the requester resends from it at once
				q.cnt.OutOfSeqRequest.Add(1)
				q.resp.nakSent = true
				q.sendAck(bth.SyndromeNAK(bth.NAKPSNSeqErr), q.resp.epsn)
			}
			putHeld(h)
			return
		}
		e := &h.ents[h.next]
		if bth.ParseInto(&h.pkt, h.buf[e.off:e.off+e.n]) != nil {
			h.next++
			continue
		}
		if !e.asked && q.needsRefill(&h.pkt, e.src, e.dst) {
			e.asked = true
			if q.askOwner() {
				q.waitRefill = true // Refilled runs it
				return
			}
			continue // the QP may have changed while the hook ran: look again
		}
		h.next++
		q.receive(now, &h.pkt, e.src, e.dst)
	}
}

// dropHeld discards the held packets (q.mu held): RESET, ERR and Destroy.
func (q *QP) dropHeld() {
	q.waitRefill = false
	if h := q.held; h != nil {
		q.held = nil
		q.cnt.RcvdDropped.Add(uint64(h.n - h.next))
		putHeld(h)
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
