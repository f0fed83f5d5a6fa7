package qp

import (
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/pkg/bth"
)

// Out-of-order placement of RDMA READ responses between two softroce RC QPs with selective
// repeat (IRN-style; docs/reliability.md "Selective repeat"). Every READ response packet carries
// its own PSN (IBTA 9.7.1: a READ request takes one PSN per response packet), so its offset in
// the READ is (PSN - the READ's first PSN) x MTU, whatever arrived before it.
//
//   - Requester: a response within the READ's outstanding chunk (readChunk) is placed at its
//     offset even when earlier ones are missing; a bitmap per send queue slot (one bit per
//     packet of the chunk, MaxUnackedPSNs, allocated for the whole send queue at the QP's first
//     out-of-order response) records what arrived ahead of readDone, which stays the first
//     missing byte. A response after a missing one asks again for that missing run only: a new
//     READ request for [first missing packet, the packet that arrived) with the PSN of the first
//     missing response (IBTA 9.7.6.1.3 lets a requester re-issue a READ from any point of it).
//     A response of a later request asks for the READ's missing tail; the ACK timer, a SACK or
//     a go-back-N rewind ask for every missing run of the chunk (sendRead). Duplicates are
//     ignored; the READ completes once every byte arrived, in posting order (retire).
//   - Responder: such a request is a duplicate READ (IBTA 9.7.4.1.5, 9.7.5.1.2) for part of a
//     remembered READ: it is answered with exactly that range, from its PSN (srRangedRead, as
//     kernel rxe serves a subset of a remembered READ); with selective repeat after the
//     responses in progress (srReplays) rather than replacing them.
//
// A QP without selective repeat places READ responses in order only (completer.go); its
// requester never asks for part of a READ, so answering such requests changes nothing for
// it, and keeps a requester with selective repeat facing a responder without it correct.

// srReadBits is one send queue slot's record of its READ's responses placed ahead of readDone
// (q.mu).
type srReadBits struct {
	got [readChunk / 64]uint64 // bit i % readChunk: response packet i (of the WQE) arrived
	hi  uint32                 // one past the highest packet received or asked again
}

func (b *srReadBits) has(i uint32) bool {
	i %= readChunk
	return b.got[i/64]&(1<<(i%64)) != 0
}

func (b *srReadBits) set(i uint32) { i %= readChunk; b.got[i/64] |= 1 << (i % 64) }
func (b *srReadBits) clr(i uint32) { i %= readChunk; b.got[i/64] &^= 1 << (i % 64) }

func (b *srReadBits) any() bool {
	for _, g := range b.got {
		if g != 0 {
			return true
		}
	}
	return false
}

// srBits returns w's record, allocating the send queue's at first use.
func (q *QP) srBits(w *sendWQE) *srReadBits {
	if w.srr == nil {
		q.req.srr = make([]srReadBits, len(q.sq))
		for i := range q.sq {
			q.sq[i].srr = &q.req.srr[i]
		}
	}
	return w.srr
}

// readChunkEnd is one past the last packet of the chunk holding packet i (readChunk).
func (q *QP) readChunkEnd(w *sendWQE, i uint32) uint32 {
	return min((i/readChunk+1)*readChunk, w.npsn)
}

// srPlace places the READ response psn of w at its offset (q.attr.SelectiveRepeat; psn is at or
// after the first missing response). Responses beyond the chunk outstanding were never asked
// for and are dropped, as are duplicates. A malformed response fails w: IBTA 9.7.6.1.3 and
// C9-174 (FIRST and MIDDLE responses carry exactly one PMTU): every packet but the READ's last
// carries one MTU, the last the READ's remainder and a LAST or ONLY opcode. A LAST or FIRST
// elsewhere is the end or start of a chunk or of a range asked again, so the opcode says no
// more than that.
func (q *QP) srPlace(now time.Time, w *sendWQE, p *bth.Packet, psn bth.PSN) {
	i := uint32(psn.Sub(w.firstPSN))
	skip := w.readDone / q.mtu
	if i < skip || i >= q.readChunkEnd(w, skip) || i >= w.readReq {
		return
	}
	n, want := uint32(len(p.Payload)), q.mtu
	final := i == w.npsn-1
	if final {
		want = w.length - i*q.mtu
	}
	if n != want || (final && !p.Info.Last) {
		q.failWQE(w, cq.StatusBadRespErr)
		return
	}
	b := w.srr
	if i != skip {
		b = q.srBits(w)
		if b.has(i) {
			return // a duplicate (one asked again that had only been late)
		}
	}
	// within the READ's SGL: the offset and the length are the READ's own (checked above)
	if ok, err := q.scatter(w.sge, i*q.mtu, p.Payload); err != nil || !ok {
		q.failWQE(w, cq.StatusLocProtErr)
		return
	}
	if i != skip {
		b.set(i)
		if from := max(b.hi, skip); from < i {
			q.srAsk(now, w, from, i) // the responses from..i-1 are missing: ask them again
		}
		b.hi = max(b.hi, i+1)
		return
	}
	oldest := w == q.oldest()
	w.readDone += n
	if b != nil {
		for w.readDone < w.length {
			j := w.readDone / q.mtu
			if !b.has(j) {
				break
			}
			b.clr(j)
			w.readDone += min(q.mtu, w.length-j*q.mtu)
		}
	}
	done := w.readDone == w.length
	if oldest {
		if done {
			q.comp.psn = w.lastPSN.Add(1)
		} else {
			q.comp.psn = w.firstPSN.Add(w.readDone / q.mtu)
		}
	}
	if done {
		w.done = true
		w.status = cq.StatusSuccess
	}
	// a chunk complete: complete() runs the requester, which asks for the next one
}

// srTail asks again for the responses of w's outstanding chunk after the last one received or
// asked: a response of a later request arrived, so they were lost (the responder answers in
// order, IBTA 9.5). Runs before it were asked when their gap showed; if such a request or its
// responses are lost too, the ACK timer asks every missing run (sendRead).
func (q *QP) srTail(now time.Time, w *sendWQE) {
	skip := w.readDone / q.mtu
	if w.readReq <= skip {
		return // no chunk outstanding: the requester asks for it (rewind, pacer)
	}
	b := q.srBits(w)
	if from := max(b.hi, skip); from < w.readReq {
		q.srAsk(now, w, from, w.readReq)
	}
}

// srAckGap handles an ACK of psn that covers the oldest WQE, a READ whose responses are not all
// in (ackUpTo): with selective repeat, when every WQE between it and psn is a SEND or WRITE, those
// are complete (IBTA 9.7.5.1.1: the ACK covers them) and the READ's missing tail is asked again
// (srTail). false: go back N (no selective repeat, or a READ or atomic after it lacks its
// response too).
func (q *QP) srAckGap(now time.Time, psn bth.PSN) bool {
	w := q.oldest()
	if !q.attr.SelectiveRepeat || w == nil || kindOf(w.wr.Opcode) != kindRead {
		return false
	}
	var head uint32
	for i := q.sqHead; i != q.sqTail; i++ {
		if q.slot(i) == w {
			head = i
			break
		}
	}
	for i := head + 1; i != q.sqTail; i++ {
		x := q.slot(i)
		if !x.started || psn.LessThan(x.firstPSN) {
			break
		}
		if x.done {
			continue
		}
		if k := kindOf(x.wr.Opcode); (k != kindSend && k != kindWrite) || !x.sentAll || psn.LessThan(x.lastPSN) {
			return false
		}
	}
	for i := head + 1; i != q.sqTail; i++ {
		x := q.slot(i)
		if !x.started || psn.LessThan(x.firstPSN) {
			break
		}
		if !x.done {
			x.done = true
			x.status = cq.StatusSuccess
		}
	}
	q.comp.psn = w.firstPSN.Add(w.readDone / q.mtu)
	q.srTail(now, w)
	return true
}

// srAsk sends a READ request for w's response packets [from, to) outside a requester run and
// moves the record's mark past them; the ACK timer covers the request from now (IBTA 9.7.6.1.3).
func (q *QP) srAsk(now time.Time, w *sendWQE, from, to uint32) {
	q.cc.run++ // outside a requester run: the pacer's accounting reads the clock afresh
	q.readRequest(w, from, to)
	b := q.srBits(w)
	b.hi = max(b.hi, to)
	q.tmr.lastProgress = now
}

// srReadRuns sends one READ request per run of w's responses missing in [skip, end), the
// chunk outstanding (sendRead: a timeout, a SACK or a rewind asks again for what is missing).
func (q *QP) srReadRuns(w *sendWQE, skip, end uint32) {
	b := w.srr
	for i := skip; i < end; {
		if b.has(i) {
			i++
			continue
		}
		j := i + 1
		for j < end && !b.has(j) {
			j++
		}
		q.readRequest(w, i, j)
		i = j
	}
	b.hi = max(b.hi, end)
}

// srRangedRead reports whether a duplicate READ for n packets from psn with VA va, inside the
// remembered READ r but not ending where r ends, is to be answered: IBTA 9.7.4.1.5 answers a
// duplicate READ from its PSN, and kernel rxe serves any part of a remembered READ
// (duplicate_request: "the same as the previous one or a subset of it"). Such requests come only
// from a requester with selective repeat (srAsk); every other requester resumes a READ to its
// end, so a responder without selective repeat answers them too (a requester that has it and a
// responder that does not stay correct), and nothing changes for anyone else. The part must
// lie inside r and ask r's own bytes.
func (q *QP) srRangedRead(r *resource, psn bth.PSN, n uint32, va uint64) bool {
	if r.last.LessThan(psn.Add(n - 1)) {
		return false
	}
	return va == r.va+uint64(psn.Sub(r.first))*uint64(q.mtu)
}

// srReplays holds the duplicate READs of a requester with selective repeat that arrived while
// other responses were being sent: each is answered after them, in arrival order (a ranged
// request asks for responses that are missing; replacing the ones in progress would lose
// those). Bounded: a duplicate beyond it is dropped, the requester's ACK timer asks again.
type srReplays struct {
	q    [srReplayMax]readGen
	h, n int
}

const srReplayMax = 16

func (s *srReplays) clear() {
	if s != nil {
		s.h, s.n = 0, 0
	}
}

// next moves the oldest waiting READ into g (readStep, when g is done).
func (s *srReplays) next(g *readGen) {
	if s == nil || s.n == 0 {
		return
	}
	*g = s.q[s.h]
	s.h = (s.h + 1) % srReplayMax
	s.n--
}

// srQueueRead queues the responses g (a duplicate READ) behind those in progress; a copy of
// one in progress or waiting is not queued twice.
func (q *QP) srQueueRead(g *readGen) {
	cur := &q.resp.rd
	if cur.psn.Add(cur.i) == g.psn && cur.n-cur.i == g.n && cur.rkey == g.rkey {
		return // the same responses are being sent
	}
	s := q.resp.rdq
	if s == nil {
		s = new(srReplays)
		q.resp.rdq = s
	}
	for k := 0; k < s.n; k++ {
		x := &s.q[(s.h+k)%srReplayMax]
		if x.psn == g.psn && x.n == g.n && x.rkey == g.rkey {
			return
		}
	}
	if s.n == srReplayMax {
		q.cnt.RcvdDropped.Add(1)
		return
	}
	s.q[(s.h+s.n)%srReplayMax] = *g
	s.n++
}
