package qp

import (
	"net/netip"
	"time"

	"github.com/softroce/softroce/pkg/bth"
)

// Selective repeat between two softroce RC QPs that both have Attr.SelectiveRepeat (IRN-style;
// softroce's own, not IBTA; docs/reliability.md "Selective repeat"). IBTA's RC is go-back-N: the
// responder NAKs the first request after a gap and drops everything until the expected PSN
// comes back (9.7.4.1.3, 9.7.5.2.1), the requester resends from there (9.7.6.1.3), the whole
// window. With selective repeat:
//
//   - Responder: a request packet ahead of the expected PSN, within the requester window
//     (MaxUnackedPSNs), is copied into the reorder buffer (one preallocated slot per PSN of the
//     window, allocated at the first one) instead of dropped, and answered with a SACK: the
//     standard PSN sequence error NAK carrying the expected PSN, followed by bth.SACK (the
//     PSN that triggered it and a bitmap of the PSNs held), for every packet newly held. When
//     the expected PSN arrives it is executed, then every held packet that follows it, in PSN
//     order, through the same code as if it had just arrived: execution order, the MSN, the
//     responder resources, atomics (executed once) and RNR NAKs are what they would be
//     without a loss. If held packets remain after the drain, a SACK says which.
//   - Requester: a SACK acknowledges what a NAK acknowledges (everything before its PSN) and
//     resends only the PSNs between it and the highest held PSN that are not held, one packet
//     each, rebuilt from its WQE; a PSN resent once is resent again only when a SACK triggered
//     by a packet first sent after that resend still shows it missing (the resend was lost).
//     Nothing beyond the window is sent: every PSN resent was sent before. A plain sequence
//     NAK, an ACK timeout or an RNR NAK goes back N as IBTA says.
//
// A requester without selective repeat (any IBTA requester: the SACK is a valid NAK to one
// that reads the AETH and ignores the rest) goes back N on a SACK, which stays correct; a
// responder without it never sends one.

// srRecv is the responder's reorder buffer (q.mu).
type srRecv struct {
	buf   []byte // MaxUnackedPSNs slots of size bytes: slot PSN % MaxUnackedPSNs
	size  int
	slots [MaxUnackedPSNs]srSlot
	n     int     // slots holding a packet
	hi    bth.PSN // the highest PSN held (n > 0)
	pkt   bth.Packet
	// draining: srDrain is executing held packets (the responder it calls must not start
	// another drain)
	draining bool
}

type srSlot struct {
	psn bth.PSN
	n   int // the packet's length; 0: empty
}

// srSend is the requester's record of PSNs resent one by one (q.mu).
type srSend struct {
	slots [MaxUnackedPSNs]srResent
}

type srResent struct {
	psn bth.PSN
	at  bth.PSN // req.sentEnd when psn was resent: a packet at or past it was first sent after
	ok  bool
}

func (s *srRecv) clear() {
	if s == nil {
		return
	}
	for i := range s.slots {
		s.slots[i].n = 0
	}
	s.n = 0
	s.draining = false
	s.pkt = bth.Packet{}
}

func (s *srSend) clear() {
	if s != nil {
		*s = srSend{}
	}
}

func srIndex(psn bth.PSN) uint32 { return uint32(psn) % MaxUnackedPSNs }

// srHolds reports whether the slot of psn holds psn.
func (s *srRecv) holds(psn bth.PSN) bool {
	sl := &s.slots[srIndex(psn)]
	return sl.n > 0 && sl.psn == psn
}

// srBuffer returns the reorder buffer, allocated at first use with slots for the QP's MTU.
func (q *QP) srBuffer() *srRecv {
	s := q.resp.sr
	size := int(q.mtu) + 64 // BTH, RETH, ImmDt, pad and ICRC around one MTU of payload
	if s == nil {
		s = new(srRecv)
		q.resp.sr = s
	}
	if s.size < size {
		s.clear()
		s.buf = make([]byte, MaxUnackedPSNs*size)
		s.size = size
	}
	return s
}

// responding reports whether the responder may execute requests (the states accept takes).
func (q *QP) responding() bool {
	switch q.state {
	case StateRTR, StateRTS, StateSQD, StateSQE:
		return !q.dead
	}
	return false
}

// srStore holds an RC request packet ahead of the expected PSN (q.attr.SelectiveRepeat) and
// answers it with a SACK: every packet newly held (IRN answers each out-of-order packet too:
// the requester learns of a lost resend from the next packet it sent after it), a copy of
// one held only if it asks for an ACK.
func (q *QP) srStore(p *bth.Packet, psn bth.PSN) {
	d := psn.Sub(q.resp.epsn)
	fresh := false
	b := packetBytes(p)
	if d < MaxUnackedPSNs && b != nil && len(b) <= int(q.mtu)+64 {
		s := q.srBuffer()
		sl := &s.slots[srIndex(psn)]
		if sl.n == 0 || sl.psn != psn {
			if sl.n == 0 {
				s.n++
			}
			fresh = true
			if s.n == 1 || s.hi.LessThan(psn) {
				s.hi = psn
			}
			off := int(srIndex(psn)) * s.size
			sl.psn, sl.n = psn, copy(s.buf[off:off+s.size], b)
		}
	} else {
		// beyond the window (no requester sends there) or larger than any request: dropped
		q.cnt.RcvdDropped.Add(1)
	}
	if !q.resp.nakSent || fresh || p.BTH.AckReq() {
		q.resp.nakSent = true
		q.sendSACK(psn)
	}
}

// srExecuted follows the execution of the request at psn, the expected one: held copies of
// the PSNs it consumed are dropped, and the held packets that now follow in order run.
func (q *QP) srExecuted(now time.Time, psn bth.PSN) {
	s := q.resp.sr
	if s.n > 0 {
		// a READ consumes several PSNs; one pass over the window visits every slot
		for k, m := 0, psn; k < MaxUnackedPSNs && m != q.resp.epsn; k, m = k+1, m.Add(1) {
			if s.holds(m) {
				s.slots[srIndex(m)].n = 0
				s.n--
			}
		}
	}
	if !s.draining {
		q.srDrain(now, psn)
	}
}

// srDrain executes the held packets from the expected PSN on, in order, while the responder
// is free (a READ's responses or a refill make it wait: runHeld calls it again), then tells the
// requester where it stands: a SACK if packets are still held behind a gap, else an ACK of the
// last one if it did not ask for one. trigger is the request PSN whose arrival led here.
func (q *QP) srDrain(now time.Time, trigger bth.PSN) {
	s := q.resp.sr
	if s == nil || s.n == 0 || s.draining {
		return
	}
	s.draining = true
	ran, ack := false, false
	for s.n > 0 && !q.busy() && q.responding() {
		e := q.resp.epsn
		if !s.holds(e) {
			break
		}
		sl := &s.slots[srIndex(e)]
		off, n := int(srIndex(e))*s.size, sl.n
		sl.n = 0
		s.n--
		if bth.ParseInto(&s.pkt, s.buf[off:off+n]) != nil {
			break
		}
		k, ackReq := s.pkt.Info.Kind, s.pkt.BTH.AckReq() // (an error clears s.pkt)
		q.respond(now, &s.pkt, netip.AddrPort{}, netip.AddrPort{})
		ran = true
		ack = !ackReq && (k == bth.KindSend || k == bth.KindWrite) && q.resp.epsn == e.Add(1)
	}
	s.draining = false
	if !ran || q.busy() || !q.responding() {
		return
	}
	switch {
	case s.n > 0 && !q.resp.nakSent:
		q.resp.nakSent = true
		q.sendSACK(trigger)
	case s.n == 0 && ack:
		// IBTA 9.7.5.1.1: an ACK covers every request before it
		q.sendAck(bth.SyndromeACK(bth.CreditNone), q.resp.epsn.Add(bth.PSNMask))
	}
}

// sendSACK sends the PSN sequence error NAK with the expected PSN (IBTA 9.7.5.2.1) and the
// SACK extension: the PSNs held after it (bth.SACK).
func (q *QP) sendSACK(trigger bth.PSN) {
	f := bth.SACKFields{Trigger: trigger}
	if s := q.resp.sr; s != nil && s.n > 0 {
		e := q.resp.epsn
		for i := 0; i < bth.SACKBits; i++ {
			m := e.Add(uint32(i + 1))
			if s.holds(m) {
				f.SetHeld(i)
			}
			if m == s.hi {
				break
			}
		}
	}
	buf := q.txBuf()
	h := bth.BTHSize
	bth.AETH(buf[h:]).Encode(&bth.AETHFields{Syndrome: bth.SyndromeNAK(bth.NAKPSNSeqErr), MSN: q.resp.msn})
	h += bth.AETHSize
	bth.SACK(buf[h:]).Encode(&f)
	h += bth.SACKSize
	q.finish(buf, bth.OpRCAck, false, false, q.attr.DestQPN, q.resp.epsn, h, 0, &q.path)
	q.cnt.SentSACK.Add(1)
}

// onSACK handles a SACK with PSN psn at or after comp.psn on a requester with selective repeat:
// the requests before psn were executed (IBTA 9.7.5.2.1, as for any sequence NAK), and the
// PSNs from psn up to the highest one held that the responder lacks are resent one by one.
// The caller acknowledged the WQEs before psn. false: go back N instead (the requester has
// not sent psn yet since a rewind).
func (q *QP) onSACK(now time.Time, p *bth.Packet, psn bth.PSN) bool {
	if q.req.psn.LessThan(psn) {
		return false
	}
	q.cnt.RcvdSACK.Add(1)
	q.comp.psn = psn
	if q.tmr.rnrWait {
		return true // the RNR wait ends in a rewind from comp.psn
	}
	sack := p.SACK
	end := psn.Add(1) // one past the highest PSN to look at
	for i := bth.SACKBits - 1; i >= 0; i-- {
		if sack.Held(i) {
			end = psn.Add(uint32(i + 1))
			break
		}
	}
	if q.req.psn.LessThan(end) {
		end = q.req.psn // never more than was sent
	}
	if q.req.sr == nil {
		q.req.sr = new(srSend)
	}
	s := q.req.sr
	trigger := sack.Trigger()
	q.cc.run++ // outside a requester run: the pacer reads the clock afresh (congestion.go)
	cur, resent := q.sqHead, false
	for i, m := 0, psn; m != end; i, m = i+1, m.Add(1) {
		if i > 0 && sack.Held(i-1) {
			continue
		}
		r := &s.slots[srIndex(m)]
		if r.ok && r.psn == m && trigger.LessThan(r.at) {
			continue // resent already, and nothing sent after that resend reported it missing
		}
		sent, ok := q.resendOne(m, &cur)
		if !ok {
			break
		}
		if sent {
			*r = srResent{psn: m, at: q.req.sentEnd, ok: true}
			q.cnt.SelectiveRetrans.Add(1)
			resent = true
		}
		if q.state != StateRTS && q.state != StateSQD {
			break
		}
	}
	if resent {
		q.tmr.lastProgress = now // the ACK timer covers the resends from now (IBTA 9.7.6.1.3)
	}
	return true
}

// resendOne rebuilds and sends the request packet at psn (a SEND or WRITE segment, a READ
// request at the start of its outstanding part, an atomic, an ATOMIC WRITE or a FLUSH); a PSN
// inside a READ's responses, or of a WQE completed already, is nobody's request to send. sent:
// a packet left; ok false: it cannot be sent now (paced, or a local error moved the QP to
// ERR). *cur is where the search for the WQE starts: the PSNs asked come in order.
func (q *QP) resendOne(psn bth.PSN, cur *uint32) (sent, ok bool) {
	var w *sendWQE
	for i := *cur; i != q.sqTail; i++ {
		x := q.slot(i)
		if !x.started || psn.LessThan(x.firstPSN) {
			break
		}
		*cur = i
		if !x.wr.Opcode.Local() && psn.LessThanEq(x.lastPSN) {
			if !x.done {
				w = x
			}
			break
		}
	}
	if w == nil {
		return false, true
	}
	next := q.req.psn
	defer func() { q.req.psn = next }()
	switch kindOf(w.wr.Opcode) {
	case kindSend, kindWrite:
		ok = q.sendSegment(w, uint32(psn.Sub(w.firstPSN)), psn, true)
		return ok, ok
	case kindRead:
		skip := w.readDone / q.mtu
		if psn != w.firstPSN.Add(skip) || w.readReq <= skip {
			return false, true // not where its outstanding request starts, or none is outstanding
		}
		req := w.readReq
		w.readReq = 0
		if !q.sendRead(w) && w.readReq == 0 {
			w.readReq = req
			return false, false
		}
		return true, true
	case kindCmpSwap, kindFetchAdd:
		if q.paceHold() {
			return false, false
		}
		q.sendAtomic(w)
		return true, true
	case kindFlush, kindAtomicWrite:
		ok = q.sendPlacement(w)
		return ok, ok
	}
	return false, true
}
