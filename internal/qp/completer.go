package qp

import (
	"encoding/binary"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/pkg/bth"
)

// The completer processes responses on an RC QP (IBTA 9.7.6 "requester
// side: receiving responses"): ACKs, NAKs, RNR NAKs, READ responses and
// atomic ACKs. It retires WQEs strictly in order (IBTA 10.8.3: completions
// are returned in the order the WRs were posted).

// completer is the response-side state.
type completer struct {
	psn bth.PSN // oldest PSN not yet acknowledged
	// gapRetried: a response gap already caused a resend from psn; later
	// responses of the same burst must not cause another (they are the
	// rest of the burst, not new losses).
	gapRetried bool
	// seqRetried: a PSN sequence error NAK made the requester go back to psn; another one
	// for the same PSN before any progress or timeout is not another retry (rxe's
	// started_retry: the resent packets are on their way).
	seqRetried bool
	seqPSN     bth.PSN
	// atomicBuf holds an atomic response's original value on its way into the SGE.
	atomicBuf [8]byte
}

// complete handles one response packet (the caller holds q.mu).
func (q *QP) complete(now time.Time, p *bth.Packet) {
	if q.typ != TypeRC || (q.state != StateRTS && q.state != StateSQD) {
		return
	}
	psn := p.BTH.PSN()
	// A response for a PSN never sent is a ghost (IBTA 9.7.6.1.1): drop.
	if !psn.LessThan(q.req.next) {
		return
	}
	before := q.comp.psn
	q.cc.rp.Sample(now) // the rate a first CNP starts from (congestion.go)
	switch p.Info.Kind {
	case bth.KindAck:
		q.onAck(now, p, psn)
	case bth.KindReadResp:
		q.onReadResp(now, p, psn)
	case bth.KindAtomicAck:
		q.onAtomicAck(now, p, psn)
	default:
		return
	}
	if q.comp.psn != before {
		q.progress(now)
		q.comp.gapRetried = false
	}
	q.retire()
	if q.state == StateRTS || q.state == StateSQD {
		q.runRequester()
	}
}

// progress resets the retry counters and the ACK timer after forward
// progress (IBTA 9.7.6.1.3: the retry count applies to consecutive
// timeouts without progress).
func (q *QP) progress(now time.Time) {
	q.tmr.retryLeft = q.attr.RetryCnt
	q.tmr.rnrLeft = q.attr.RNRRetry
	q.tmr.lastProgress = now
}

func (q *QP) onAck(now time.Time, p *bth.Packet, psn bth.PSN) {
	syn := p.AETH.Fields().Syndrome
	switch bth.SyndromeType(syn) {
	case bth.AckTypeACK:
		if psn.LessThan(q.comp.psn) {
			return // old or duplicate ACK
		}
		if q.ackUpTo(psn) && !q.srAckGap(now, psn) {
			q.gapRetry(now)
		}
	case bth.AckTypeRNR:
		// IBTA 9.7.5.2.8 / 9.7.6.1.5: RNR NAK implicitly ACKs the PSNs
		// before it; retry from its PSN after the RNR timer.
		if psn.LessThan(q.comp.psn) {
			return
		}
		q.cnt.RcvdRNRErr.Add(1)
		if q.tmr.rnrWait && psn == q.comp.psn {
			// A copy of the RNR NAK we are already waiting on (the
			// network duplicated it): not another retry, and the wait
			// does not start again (IBTA 9.7.5.2.8 counts retries).
			return
		}
		if q.ackUpTo(psn.Add(bth.PSNMask)) { // psn-1
			q.goBack(now)
			return
		}
		q.comp.psn = psn
		// The responder is alive: a run of transport retries (ACK
		// timeouts and sequence NAKs without a response, retry_cnt)
		// ends here; RNR retries are counted by rnr_retry. Without
		// this, a receiver short of WQEs for a while fails the QP with
		// RETRY_EXC_ERR as soon as retry_cnt+1 resends were lost.
		q.tmr.retryLeft = q.attr.RetryCnt
		if q.attr.RNRRetry != 7 { // 7 = retry forever (IBTA 9.7.6.1.5)
			if q.tmr.rnrLeft == 0 {
				q.cnt.RetryRNRExceededErr.Add(1)
				q.failOldest(cq.StatusRNRRetryExcErr)
				return
			}
			q.tmr.rnrLeft--
		}
		q.tmr.rnrWait = true
		q.tmr.rnrDeadline = now.Add(bth.RNRTimer(bth.SyndromeValue(syn)))
		q.rewind()
	case bth.AckTypeNAK:
		if psn.LessThan(q.comp.psn) {
			return
		}
		if q.ackUpTo(psn.Add(bth.PSNMask)) {
			q.goBack(now)
			return
		}
		switch bth.SyndromeValue(syn) {
		case bth.NAKPSNSeqErr:
			if p.SACK != nil && q.attr.SelectiveRepeat && q.onSACK(now, p, psn) {
				return // resent what the responder lacks (selective.go)
			}
			if q.tmr.rnrWait && psn == q.comp.psn {
				return // already waiting to resend from there
			}
			// IBTA 9.7.5.2.1: everything before the NAKed PSN arrived;
			// go back to it.
			q.cnt.RcvdSeqErr.Add(1)
			if q.comp.seqRetried && psn == q.comp.seqPSN {
				return // a copy, or a SACK's repeat: the resend from psn is under way
			}
			q.comp.psn = psn
			q.comp.seqRetried, q.comp.seqPSN = true, psn
			q.retryOrFail(now, true)
		case bth.NAKInvalidRequest:
			q.failAt(psn, cq.StatusRemInvReqErr)
		case bth.NAKRemoteAccessErr:
			q.failAt(psn, cq.StatusRemAccessErr)
		case bth.NAKRemoteOpErr:
			q.failAt(psn, cq.StatusRemOpErr)
		case bth.NAKInvalidRDRequest:
			q.failAt(psn, cq.StatusRemInvRDReqErr)
		default:
			q.failAt(psn, cq.StatusBadRespErr)
		}
	}
}

// ackUpTo retires the SEND/WRITE WQEs whose PSNs are all at or before psn
// (IBTA 9.7.5.1.1 coalesced ACKs). It stops at a READ or atomic WQE that
// psn covers but whose response has not arrived and reports true: that
// response was lost, and the request must be retried.
func (q *QP) ackUpTo(psn bth.PSN) (lost bool) {
	for i := q.sqHead; i != q.sqTail; i++ {
		w := q.slot(i)
		if !w.started {
			break
		}
		if w.done {
			continue
		}
		if psn.LessThan(w.firstPSN) {
			break
		}
		if kindOf(w.wr.Opcode).ownResponse() {
			// Covered entirely: its response was lost. A PSN inside a
			// READ's range (a NAK for a resumed READ) says nothing
			// about the responses before it.
			return !psn.LessThan(w.lastPSN)
		}
		if psn.LessThan(w.lastPSN) {
			if q.comp.psn.LessThan(psn.Add(1)) {
				q.comp.psn = psn.Add(1)
			}
			return false
		}
		if !w.sentAll && !w.sentOnce {
			// acknowledged everything sent so far of the WQE being sent for the first time.
			// One that is being resent (a rewind) had every packet out before, so an ACK of
			// its last PSN completes it (IBTA 9.7.5.1.1), as the late ACK of a paced
			// requester that timed out too early does.
			if q.comp.psn.LessThan(psn.Add(1)) {
				q.comp.psn = psn.Add(1)
			}
			return false
		}
		w.done = true
		w.status = cq.StatusSuccess
		q.comp.psn = w.lastPSN.Add(1)
	}
	return false
}

// oldest returns the oldest started, not yet done WQE (nil if none).
func (q *QP) oldest() *sendWQE {
	for i := q.sqHead; i != q.sqTail; i++ {
		w := q.slot(i)
		if !w.started {
			return nil
		}
		if !w.done {
			return w
		}
	}
	return nil
}

func (q *QP) onReadResp(now time.Time, p *bth.Packet, psn bth.PSN) {
	// A READ response implicitly ACKs the SEND/WRITEs before it (IBTA 9.7.5.1.2).
	q.ackUpTo(psn.Add(bth.PSNMask))
	w := q.oldest()
	if w == nil {
		return
	}
	switch kindOf(w.wr.Opcode) {
	case kindRead:
	case kindFlush, kindAtomicWrite:
		q.onPlacementResp(w, p, psn) // placement.go
		return
	default:
		// The oldest is an atomic: a response to a later request means
		// its atomic ACK was lost (IBTA 9.7.6.1.3): resend now.
		q.respGap(now, w, psn)
		return
	}
	expect := w.firstPSN.Add(w.readDone / q.mtu)
	sr := q.attr.SelectiveRepeat
	if sr && !w.lastPSN.LessThan(psn) {
		if !psn.LessThan(expect) {
			q.srPlace(now, w, p, psn) // at its offset, whatever is missing before it (srread.go)
		}
		return
	}
	if psn != expect {
		if expect.LessThan(psn) {
			// Responses of w were lost. Those of a later READ are kept
			// (placeLaterRead) and only w is asked again (readGap; with
			// selective repeat only its missing responses, srTail).
			q.placeLaterRead(now, w, p, psn)
			if q.state != StateErr {
				q.comp.psn = expect
				if sr {
					q.srTail(now, w)
				} else {
					q.readGap(now, w)
				}
			}
		}
		return // older: duplicate
	}
	q.placeRead(w, p, psn)
}

// placeRead places the READ response psn, the next one w expects, into
// w's SGL (or fails w on a malformed response or a local error).
func (q *QP) placeRead(w *sendWQE, p *bth.Packet, psn bth.PSN) {
	info := p.Info
	n := uint32(len(p.Payload))
	last := info.Last
	// IBTA 9.7.6.1.3 malformed response: a FIRST/MIDDLE, or a LAST
	// ending a chunk (readChunk) rather than the message, carries one
	// MTU; a LAST ends the message or a chunk.
	end := w.readDone + n
	if (!last && n != q.mtu) || n > q.mtu || end > w.length ||
		(last && end != w.length && (n != q.mtu || (end/q.mtu)%readChunk != 0)) {
		q.failWQE(w, cq.StatusBadRespErr)
		return
	}
	if ok, err := q.scatter(w.sge, w.readDone, p.Payload); err != nil || !ok {
		q.failWQE(w, cq.StatusLocProtErr)
		return
	}
	w.readDone += n
	if w == q.oldest() {
		q.comp.psn = psn.Add(1)
	}
	if last && w.readDone == w.length {
		w.done = true
		w.status = cq.StatusSuccess
	}
	// a chunk's LAST: complete() runs the requester, which asks for
	// the next chunk
}

// placeLaterRead keeps a response that belongs to a READ after w (the
// oldest, still missing responses) when it is the next one that READ
// expects: READ responses carry their own PSN and place their own bytes,
// so they need not be thrown away and asked for again (rxe and plain
// go-back-N do; against rxe at 5% loss that made 16 responses per one
// needed). The response also shows that the responder executed every
// request before that READ (IBTA 9.7.5.1.2): the SEND/WRITE WQEs between
// w and it are complete. Completions stay in posting order (retire).
func (q *QP) placeLaterRead(now time.Time, w *sendWQE, p *bth.Packet, psn bth.PSN) {
	var v *sendWQE
	for i := q.sqHead; i != q.sqTail; i++ {
		x := q.slot(i)
		if !x.started {
			return
		}
		if x == w || x.done {
			continue
		}
		if psn.LessThan(x.firstPSN) {
			return
		}
		if !x.lastPSN.LessThan(psn) {
			v = x
			break
		}
	}
	sr := q.attr.SelectiveRepeat // any response within v's outstanding ones (srread.go)
	if v == nil || kindOf(v.wr.Opcode) != kindRead || (!sr && psn != v.firstPSN.Add(v.readDone/q.mtu)) {
		return
	}
	for i := q.sqHead; i != q.sqTail; i++ {
		x := q.slot(i)
		if x == v {
			break
		}
		if x.done || x == w || !x.sentAll {
			continue
		}
		if k := kindOf(x.wr.Opcode); k == kindSend || k == kindWrite {
			x.done = true
			x.status = cq.StatusSuccess
		}
	}
	if sr {
		if !psn.LessThan(v.firstPSN.Add(v.readDone / q.mtu)) {
			q.srPlace(now, v, p, psn)
		}
		return
	}
	q.placeRead(v, p, psn)
}

// readGap asks the oldest READ w again from its first missing byte, alone
// and once per gap (the timer covers a lost request): the requests after
// it were executed by the responder, and the responses of later READs
// are kept (placeLaterRead). While w's own chunks are still being
// requested, or something else is wrong, it falls back to go-back-N.
func (q *QP) readGap(now time.Time, w *sendWQE) {
	if q.comp.gapRetried {
		return
	}
	if !w.sentAll {
		q.gapRetry(now)
		return
	}
	q.comp.gapRetried = true
	q.tmr.lastProgress = now
	psn := q.req.psn
	w.readReq = 0
	q.cc.run++ // outside a requester run: the pacer's accounting reads the clock afresh
	q.sendRead(w)
	q.req.psn = psn
}

func (q *QP) onAtomicAck(now time.Time, p *bth.Packet, psn bth.PSN) {
	q.ackUpTo(psn.Add(bth.PSNMask))
	w := q.oldest()
	if w == nil {
		return
	}
	k := kindOf(w.wr.Opcode)
	if k != kindCmpSwap && k != kindFetchAdd {
		// The oldest is a READ whose last responses were lost: resend
		// it from the first missing byte now.
		q.respGap(now, w, psn)
		return
	}
	if psn != w.firstPSN {
		if w.firstPSN.LessThan(psn) {
			q.comp.psn = w.firstPSN
			q.gapRetry(now)
		}
		return
	}
	// Memory holds host-order (little-endian) 64-bit words; the wire is
	// big-endian (IBTA 9.3.6). The QP's own buffer: a stack array would escape to the heap
	// through a copied MR's Memory.
	v := q.comp.atomicBuf[:]
	binary.LittleEndian.PutUint64(v, p.AtomicAck.Fields().OrigData)
	if ok, err := q.scatter(w.sge, 0, v); err != nil || !ok {
		q.failWQE(w, cq.StatusLocProtErr)
		return
	}
	w.done = true
	w.status = cq.StatusSuccess
	q.comp.psn = psn.Add(1)
}

// respGap handles a response with PSN psn for a request after w, the
// oldest outstanding READ or atomic: w's response (or its tail) was lost,
// so resend from the first PSN of w not yet answered (go-back-N, IBTA
// 9.7.6.1.3; once per gap). Responses at or before w's range are
// duplicates and ignored.
func (q *QP) respGap(now time.Time, w *sendWQE, psn bth.PSN) {
	if !w.lastPSN.LessThan(psn) || (!w.rdAtomic && kindOf(w.wr.Opcode) != kindRead) {
		return
	}
	q.comp.psn = w.firstPSN
	if kindOf(w.wr.Opcode) == kindRead {
		q.comp.psn = w.firstPSN.Add(w.readDone / q.mtu)
	}
	q.gapRetry(now)
}

// failAt completes the WQE holding psn with st, then ERR (IBTA 9.9.2:
// NAKs other than PSN sequence error are fatal to the QP).
func (q *QP) failAt(psn bth.PSN, st cq.Status) {
	w := q.oldest()
	if w == nil {
		q.enterError()
		return
	}
	q.failWQE(w, st)
}

// failOldest completes the oldest outstanding WQE with st, then ERR.
func (q *QP) failOldest(st cq.Status) { q.failAt(q.comp.psn, st) }

// retire pops done WQEs from the head of the send queue in order, posting
// completions: signaled ones on success, every one on error (IBTA 10.8.3).
func (q *QP) retire() {
	overrun := false
	for q.sqHead != q.sqTail {
		w := q.slot(q.sqHead)
		if !w.done {
			break
		}
		if w.status != cq.StatusSuccess || w.signaled(q.cfg.SigAll) {
			wc := cq.WC{
				WRID: w.wr.WRID, Status: w.status, Opcode: wcOpcode(w.wr.Opcode),
				ByteLen: w.length, QPNum: q.num,
			}
			if w.status != cq.StatusSuccess {
				wc.ByteLen = 0
			}
			if !q.cfg.SendCQ.Push(&wc, false) {
				overrun = true
			}
		}
		if w.status == cq.StatusSuccess && kindOf(w.wr.Opcode) == kindSend {
			q.cnt.RDMASends.Add(1)
		}
		if w.rdAtomic {
			q.rdAtomicInFlight--
		}
		if q.typ == TypeRC && w.started && !w.wr.Opcode.Local() && w.status == cq.StatusSuccess &&
			q.comp.psn.LessThan(w.lastPSN.Add(1)) {
			// completed out of order (placeLaterRead): the oldest
			// unacknowledged PSN moves past it
			q.comp.psn = w.lastPSN.Add(1)
		}
		w.reset()
		q.sqHead++
		if int32(q.sqReq-q.sqHead) < 0 {
			q.sqReq = q.sqHead
		}
	}
	if overrun {
		q.cqOverrun()
	}
	q.maybeDrained()
}

// scatter copies src into the SGL at byte offset off through internal/mr with
// local write access. ok is false if the SGL is too short (length error).
func (q *QP) scatter(sgl []SGE, off uint32, src []byte) (ok bool, err error) {
	var pos uint32
	for i := range sgl {
		if len(src) == 0 {
			return true, nil
		}
		s := &sgl[i]
		if off >= pos+s.Length {
			pos += s.Length
			continue
		}
		start := off - pos
		n := s.Length - start
		if int(n) > len(src) {
			n = uint32(len(src))
		}
		if err := q.cfg.MRs.CopyIn(q.cfg.PD, mr.NoQPN, s.LKey, s.Addr+uint64(start), src[:n], mr.OpLocalWrite); err != nil {
			return false, err
		}
		src = src[n:]
		off += n
		pos += s.Length
	}
	return len(src) == 0, nil
}

// gapRetry resends from comp.psn after a response gap, once per gap
// (go-back-N, IBTA 9.7.6): the timer covers a lost resend.
func (q *QP) gapRetry(now time.Time) {
	if q.comp.gapRetried {
		return
	}
	q.comp.gapRetried = true
	q.goBack(now)
}
