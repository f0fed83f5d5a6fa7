package qp

import (
	"net/netip"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
)

// The requester turns send WQEs into request packets (IBTA 9.4 operations,
// 9.5 segmentation, 9.7.1 PSN assignment). It keeps no copy of a sent
// packet: a retransmission rebuilds the packets from the WQE (go-back-N).

// wrKind classifies a WR opcode for the engine.
type wrKind uint8

const (
	kindInvalid wrKind = iota
	kindSend
	kindWrite
	kindRead
	kindCmpSwap
	kindFetchAdd
	kindFlush       // FLUSH (placement.go)
	kindAtomicWrite // ATOMIC WRITE (placement.go)
)

// rdAtomic reports whether the kind counts against max_rd_atomic while outstanding (IBTA
// 9.4.4 initiator depth): READ and the atomics, and the memory placement operations, which
// take a responder resource too (rxe counts ATOMIC WRITE; FLUSH is counted here as well, so
// a responder never sees more of them outstanding than it was told to hold).
func (k wrKind) rdAtomic() bool { return k >= kindRead }

// ownResponse reports whether only the request's own response completes it: a READ's data
// and an atomic's original value come in that response, so a later ACK covering the PSN
// means the response was lost (IBTA 9.7.6.1.3). FLUSH and ATOMIC WRITE return nothing: a
// coalesced ACK (or a later response) past their PSN says the responder executed them, in
// order (IBTA 9.7.5.1.2), and completes them, as rxe's completer does.
func (k wrKind) ownResponse() bool { return k == kindRead || k == kindCmpSwap || k == kindFetchAdd }

func kindOf(op WROpcode) wrKind {
	switch op {
	case WRSend, WRSendWithImm, WRSendWithInv:
		return kindSend
	case WRRDMAWrite, WRRDMAWriteWithImm:
		return kindWrite
	case WRRDMARead:
		return kindRead
	case WRAtomicCmpAndSwp:
		return kindCmpSwap
	case WRAtomicFetchAndAdd:
		return kindFetchAdd
	case WRFlush:
		return kindFlush
	case WRAtomicWrite:
		return kindAtomicWrite
	}
	return kindInvalid
}

// wcOpcode maps a WR opcode to its send completion opcode.
func wcOpcode(op WROpcode) cq.Opcode {
	switch op {
	case WRRDMAWrite, WRRDMAWriteWithImm:
		return cq.OpRDMAWrite
	case WRRDMARead:
		return cq.OpRDMARead
	case WRAtomicCmpAndSwp:
		return cq.OpCompSwap
	case WRAtomicFetchAndAdd:
		return cq.OpFetchAdd
	case WRLocalInv:
		return cq.OpLocalInv
	case WRBindMW:
		return cq.OpBindMW
	case WRFlush:
		return cq.OpFlush
	case WRAtomicWrite:
		return cq.OpAtomicWrite
	}
	return cq.OpSend
}

// requester is the send-side state.
type requester struct {
	ahead         readAhead // copied memory of the WQE being sent (copybatch.go)
	psn           bth.PSN   // next PSN to transmit
	next          bth.PSN   // one past the highest PSN ever assigned
	noAck         int       // packets since the last AckReq
	sentEnd       bth.PSN   // one past the highest request PSN transmitted (retransmission count)
	drainSignaled bool
	sr            *srSend      // PSNs resent one by one (selective.go; allocated at the first SACK)
	srr           []srReadBits // the send queue's READ placement records (srread.go; first use)
}

// transportBase returns the opcode base for the QP type (IBTA 9.2.1 table 36).
func (q *QP) transportBase() bth.Opcode {
	switch q.typ {
	case TypeUC:
		return 0x20
	case TypeUD, TypeGSI:
		return 0x60
	}
	return 0x00
}

// runRequester transmits as much of the send queue as the window, the
// fence and max_rd_atomic allow (IBTA 9.7 unacknowledged-PSN window,
// 10.8.3.3 fence, 9.4.4 initiator depth). The caller flushes and arms the
// timer.
func (q *QP) runRequester() {
	q.cc.run++ // a new run: the pacer reads the clock again (congestion.go)
	for q.sqReq != q.sqTail {
		if q.state != StateRTS && q.state != StateSQD {
			return
		}
		if q.tmr.rnrWait {
			return
		}
		w := q.slot(q.sqReq)
		if w.done {
			// Completed already, out of order (a local operation that
			// ran, a READ answered while an earlier one waits): after a
			// rewind it must not be sent or executed again; its PSNs
			// count as sent.
			if q.typ == TypeRC && w.started && !w.wr.Opcode.Local() {
				q.req.psn = w.lastPSN.Add(1)
			}
			q.sqReq++
			continue
		}
		if w.wr.Opcode.Local() {
			if q.state == StateSQD || (w.wr.Flags&SendFence != 0 && q.rdAtomicInFlight > 0) {
				return
			}
			if !q.localOp(w) {
				return
			}
			q.sqReq++
			q.retire()
			continue
		}
		if !w.started {
			if q.state == StateSQD || !q.canStart(w) {
				return
			}
			q.start(w)
		}
		if !q.transmit(w) {
			return
		}
		if q.state == StateErr {
			return
		}
		w.sentAll, w.sentOnce = true, true
		q.sqReq++
		if q.typ != TypeRC {
			// UC/UD: no responses; the WQE completes once sent (IBTA 9.8).
			w.done = true
			w.status = cq.StatusSuccess
			q.retire()
		}
	}
	q.maybeDrained()
}

func (q *QP) canStart(w *sendWQE) bool {
	if q.typ == TypeRC && (q.req.psn.Sub(q.comp.psn) >= MaxUnackedPSNs || !q.budgetFor(w)) {
		return false
	}
	k := kindOf(w.wr.Opcode)
	if w.wr.Flags&SendFence != 0 && q.rdAtomicInFlight > 0 {
		return false // IBTA 10.8.3.3: fenced WR waits for prior READ/atomics
	}
	if k.rdAtomic() {
		max := int(q.attr.MaxRDAtomic)
		if max < 1 {
			max = 1
		}
		if q.rdAtomicInFlight >= max {
			return false
		}
	}
	return true
}

// start assigns the WQE its PSN range (IBTA 9.7.1: a READ request takes
// one PSN per expected response packet).
func (q *QP) start(w *sendWQE) {
	k := kindOf(w.wr.Opcode)
	n := uint32(1)
	if k == kindSend || k == kindWrite || k == kindRead {
		if w.length > q.mtu {
			n = (w.length + q.mtu - 1) / q.mtu
		}
	}
	w.started = true
	// the PSNs after every PSN ever assigned (req.psn equals it here
	// unless WQEs were skipped; IBTA 9.7.1)
	q.req.psn = q.req.next
	w.firstPSN = q.req.psn
	w.npsn = n
	w.lastPSN = q.req.psn.Add(n - 1)
	q.req.next = w.lastPSN.Add(1)
	w.nextPkt = 0
	w.readDone = 0
	w.readReq = 0
	if w.srr != nil {
		*w.srr = srReadBits{}
	}
	if k.rdAtomic() {
		w.rdAtomic = true
		q.rdAtomicInFlight++
	}
}

// transmit sends the WQE's remaining packets; false if the window closed
// first (or the WQE failed and the QP went to ERR).
func (q *QP) transmit(w *sendWQE) bool {
	switch kindOf(w.wr.Opcode) {
	case kindRead:
		return q.sendRead(w)
	case kindCmpSwap, kindFetchAdd:
		if q.paceHold() {
			return false
		}
		q.sendAtomic(w)
		return true
	case kindFlush, kindAtomicWrite:
		return q.sendPlacement(w) // placement.go
	}
	for w.nextPkt < w.npsn {
		psn := w.firstPSN.Add(w.nextPkt)
		if q.typ == TypeRC && (psn.Sub(q.comp.psn) >= MaxUnackedPSNs || !q.budgetOK()) {
			return false
		}
		if !q.sendSegment(w, w.nextPkt, psn, false) {
			return false
		}
		w.nextPkt++
		q.req.psn = psn.Add(1)
	}
	return true
}

// sendSegment builds packet idx of a SEND or WRITE (IBTA 9.5:
// FIRST/MIDDLE/LAST/ONLY; RETH on the first, ImmDt/IETH on the last). A packet resent on
// its own (resend, selective.go) asks for an ACK only if it is the message's last and does not
// count towards the next AckReq.
func (q *QP) sendSegment(w *sendWQE, idx uint32, psn bth.PSN, resend bool) bool {
	if q.paceHold() {
		return false
	}
	first, last := idx == 0, idx == w.npsn-1
	off := idx * q.mtu
	n := w.length - off
	if n > q.mtu {
		n = q.mtu
	}
	op := w.wr.Opcode
	var base bth.Opcode
	write := op == WRRDMAWrite || op == WRRDMAWriteWithImm
	if write {
		base = 0x06 // WRITE FIRST
	}
	var pos bth.Opcode
	switch {
	case first && last:
		pos = 4 // ONLY
	case first:
		pos = 0
	case last:
		pos = 2
	default:
		pos = 1
	}
	imm := last && (op == WRSendWithImm || op == WRRDMAWriteWithImm)
	inv := last && op == WRSendWithInv
	if imm {
		pos++ // LAST_IMM = 3, ONLY_IMM = 5
	}
	opcode := q.transportBase() + base + pos
	if inv {
		if first {
			opcode = bth.OpRCSendOnlyInv
		} else {
			opcode = bth.OpRCSendLastInv
		}
	}
	buf := q.txBuf()
	h := bth.BTHSize
	if q.typ.Datagram() {
		bth.DETH(buf[h:]).Encode(&bth.DETHFields{QKey: w.qkey, SrcQP: q.num})
		h += bth.DETHSize
	}
	if write && first {
		bth.RETH(buf[h:]).Encode(&bth.RETHFields{VA: w.wr.RemoteAddr, RKey: w.wr.RKey, DMALen: w.length})
		h += bth.RETHSize
	}
	if imm {
		bth.ImmDt(buf[h:]).SetImm(w.wr.Imm)
		h += bth.ImmDtSize
	}
	if inv {
		bth.IETH(buf[h:]).SetRKey(w.wr.InvRKey)
		h += bth.IETHSize
	}
	if !q.gather(w, off, buf[h:h+int(n)]) {
		return false
	}
	ackReq := resend && last
	if q.typ == TypeRC && !resend {
		q.req.noAck++
		if last || q.req.noAck >= q.ackEvery() {
			ackReq = true
			q.req.noAck = 0
		}
	}
	se := last && w.wr.Flags&SendSolicited != 0 && op != WRRDMAWrite
	dqpn := q.attr.DestQPN
	path := &q.path
	if q.typ.Datagram() {
		dqpn, path = w.dqpn, &w.path
	}
	if q.paceSent(h+int(n)+(4-int(n)&3)&3+bth.ICRCSize, path) && q.typ == TypeRC { // with pad and ICRC
		ackReq = true // paused after this packet: its ACK keeps the ACK timer from expiring
		q.req.noAck = 0
	}
	q.finish(buf, opcode, se, ackReq, dqpn, psn, h, int(n), path)
	q.sent(psn, psn)
	return true
}

// sent records request packet psn, which covers PSNs up to last (a READ
// request covers its responses), for the retransmission count: a PSN
// below the highest one sent before is sent again (RC only).
func (q *QP) sent(psn, last bth.PSN) {
	if q.typ != TypeRC {
		return
	}
	if psn.LessThan(q.req.sentEnd) {
		q.cnt.RetransPkts.Add(1)
	}
	if !last.LessThan(q.req.sentEnd) {
		q.req.sentEnd = last.Add(1)
	}
}

// readChunk bounds the response packets one READ request asks for: a
// READ longer than readChunk MTUs is requested in chunks at fixed
// boundaries (first PSN + k x readChunk), the next chunk once the
// previous one has fully arrived. The responder would otherwise answer
// the whole READ in one burst, which a link queue or a socket buffer
// smaller than the READ truncates, every time, leaving only the ACK
// timeout to recover the tail (a 4 MiB READ over the in-memory link's
// default 1024-datagram queue: 209 ms and 3 timeouts; chunked: no loss).
// It is the requester window (MaxUnackedPSNs) applied to READ responses.
// Each chunk is an ordinary READ request (IBTA 9.4.4) for a part of the
// WQE's range with consecutive PSNs, so responders need nothing new; a
// WQE has at most one chunk outstanding, so it holds at most one
// responder resource (max_dest_rd_atomic). READs up to readChunk
// packets (perftest's 64 KiB at MTU 1024 ...) are one request as before.
const readChunk = MaxUnackedPSNs

// sendRead builds the READ request for the chunk holding the first byte
// not yet received, from that byte (IBTA 9.7.6.1.4 / rxe: va + done,
// PSN + done/MTU) to the chunk's end, so a resumed request ends where the
// original did (the responder replays only then). It returns whether the
// whole WQE has been requested; false while a chunk is outstanding or
// more chunks follow (later WQEs wait: their PSNs come after the READ's).
func (q *QP) sendRead(w *sendWQE) bool {
	skip := w.readDone / q.mtu
	if skip < w.readReq || w.readReq > 0 && !q.budgetOKRead(min((skip/readChunk+1)*readChunk, w.npsn)-skip) {
		return false // the chunk asked for is still arriving, or a later one waits for the budget
	}
	if !w.sentAll && q.paceHold() { // (a READ asked again for a gap, readGap, is not held)
		return false
	}
	end := min((skip/readChunk+1)*readChunk, w.npsn)
	w.readDone = skip * q.mtu
	if w.srr != nil && q.attr.SelectiveRepeat && w.srr.any() {
		q.srReadRuns(w, skip, end) // only the responses still missing (srread.go)
	} else {
		q.readRequest(w, skip, end)
	}
	w.readReq = end
	q.req.psn = w.firstPSN.Add(end)
	return end == w.npsn
}

// readRequest builds the READ request for response packets [from, to) of w (IBTA 9.4.4; a
// request from any packet of a READ is what IBTA 9.7.6.1.3 lets a requester resend): the PSN
// of packet from, the bytes from its offset to packet to's or the READ's end.
func (q *QP) readRequest(w *sendWQE, from, to uint32) {
	off := from * q.mtu
	psn := w.firstPSN.Add(from)
	n := min(to*q.mtu, w.length) - off
	buf := q.txBuf()
	h := bth.BTHSize
	bth.RETH(buf[h:]).Encode(&bth.RETHFields{
		VA: w.wr.RemoteAddr + uint64(off), RKey: w.wr.RKey, DMALen: n,
	})
	h += bth.RETHSize
	q.req.noAck = 0
	q.paceSent(h+bth.ICRCSize, &q.path)
	q.finish(buf, bth.OpRCReadRequest, false, true, q.attr.DestQPN, psn, h, 0, &q.path)
	q.sent(psn, w.firstPSN.Add(to-1))
}

// sendAtomic builds a CMP_SWAP or FETCH_ADD request (IBTA 9.4.5, AtomicETH 9.3.4).
func (q *QP) sendAtomic(w *sendWQE) {
	buf := q.txBuf()
	h := bth.BTHSize
	f := bth.AtomicETHFields{VA: w.wr.RemoteAddr, RKey: w.wr.RKey}
	opcode := bth.OpRCFetchAdd
	if w.wr.Opcode == WRAtomicCmpAndSwp {
		opcode = bth.OpRCCmpSwap
		f.SwapAdd, f.Compare = w.wr.Swap, w.wr.CompareAdd
	} else {
		f.SwapAdd = w.wr.CompareAdd
	}
	bth.AtomicETH(buf[h:]).Encode(&f)
	h += bth.AtomicETHSize
	q.req.noAck = 0
	q.paceSent(h+bth.ICRCSize, &q.path)
	q.finish(buf, opcode, false, true, q.attr.DestQPN, w.firstPSN, h, 0, &q.path)
	q.sent(w.firstPSN, w.firstPSN)
	q.req.psn = w.firstPSN.Add(1)
}

// gather copies n = len(dst) bytes of the message at offset off from the
// SGL (through internal/mr, local read) or the inline copy. On a local
// protection error the WQE completes with LOC_PROT_ERR and the QP enters
// ERR (IBTA 10.8.3.1 / 11.6.2).
func (q *QP) gather(w *sendWQE, off uint32, dst []byte) bool {
	if len(dst) == 0 {
		return true
	}
	if w.isInline {
		copy(dst, w.inline[off:])
		return true
	}
	if off == 0 { // a WQE's first packet: what was read ahead is another WQE's (copybatch.go)
		q.dropReadAhead()
	}
	var pos uint32
	for i := range w.sge {
		s := &w.sge[i]
		if off >= pos+s.Length {
			pos += s.Length
			continue
		}
		start := off - pos
		n := s.Length - start
		if int(n) > len(dst) {
			n = uint32(len(dst))
		}
		if !q.gatherSGE(w, i, start, dst[:n]) {
			q.failWQE(w, cq.StatusLocProtErr)
			return false
		}
		dst = dst[n:]
		off += n
		pos += s.Length
		if len(dst) == 0 {
			return true
		}
	}
	q.failWQE(w, cq.StatusLocLenErr)
	return false
}

// failWQE completes w with an error status and moves the QP to ERR; the
// WQEs before it complete first and the ones after it are flushed.
func (q *QP) failWQE(w *sendWQE, st cq.Status) {
	w.done = true
	w.status = st
	q.retire()
	q.enterError()
}

// txBuf returns the next pooled send buffer, flushing a full batch.
func (q *QP) txBuf() []byte {
	t := q.txSetFor()
	if len(t.batch) == cap(t.batch) {
		q.flush()
		t = q.txSetFor()
	}
	return t.bufs[len(t.batch)]
}

// entropy is the UDP source port's entropy (IBTA A17.3.2) as kernel rxe picks it
// (rdma_get_udp_sport): UD and QP1 from the QPN; RC/UC from the address vector's flow label
// when it has one (rdma_cm gives a connection bth.CMFlowLabel of its ports, on both ends),
// else from the QPN pair.
func (q *QP) entropy(dqpn uint32) uint16 {
	if q.typ.Datagram() {
		return bth.UDSourcePort(q.num)
	}
	if fl := q.attr.AH.FlowLabel; fl != 0 {
		return bth.FlowLabelToSourcePort(fl)
	}
	return bth.SourcePort(q.num, dqpn)
}

// finish writes the BTH, the pad and the ICRC of the packet in buf whose
// extension headers end at h and whose payload is n bytes, and queues it with
// the path's traffic class, ECN-capable if the QP is (congestion.go). BTH per
// IBTA 9.2 (P_Key 0xFFFF, TVer 0); ICRC per IBTA A17.3.3 with the IPv4 ID 0 a
// DF socket puts on the wire.
func (q *QP) finish(buf []byte, op bth.Opcode, se, ackReq bool, dqpn uint32, psn bth.PSN, h, n int, path *Path) {
	q.finishTC(buf, op, se, ackReq, dqpn, psn, h, n, path, q.ecnTClass(path))
}

// finishTC is finish with the IP header's traffic class byte tclass.
func (q *QP) finishTC(buf []byte, op bth.Opcode, se, ackReq bool, dqpn uint32, psn bth.PSN, h, n int, path *Path, tclass uint8) {
	pad := (4 - n&3) & 3
	end := h + n
	for i := 0; i < pad; i++ {
		buf[end+i] = 0
	}
	end += pad + bth.ICRCSize
	bth.BTH(buf).Encode(&bth.BTHFields{
		Opcode: op, SE: se, PadCnt: uint8(pad), PKey: 0xFFFF,
		DestQP: dqpn, AckReq: ackReq, PSN: psn,
	})
	pkt := buf[:end]
	sport := q.cfg.Out.SourcePort(path.Src, q.entropy(dqpn))
	ep := bth.Endpoints{Src: path.Src, Dst: path.Dst, SrcPort: sport, DstPort: q.cfg.DstPort}
	ph := q.pseudoHeader(&ep, end) // cached per (endpoints, length) (fastpath.go)
	t := q.txSetFor()
	src, dst := netip.AddrPortFrom(path.Src, sport), netip.AddrPortFrom(path.Dst, q.cfg.DstPort)
	state := ph.state
	if k := q.runIndex(t, end, src, dst, tclass); k > 0 {
		// segment k of a GSO run carries IPv4 ID k (fastpath.go)
		state = t.runICRCState(&ph.ep, end, k)
	}
	icrc := bth.ICRCContinue(state, pkt)
	if op == bth.OpRCFlush && q.cfg.RxeFlushICRC {
		// kernel rxe's FLUSH ICRC: BTH, FETH and RETH once more (pkg/roce, rxeflush.go)
		icrc = bth.RxeFlushICRC(icrc, pkt)
	}
	bth.SetICRC(pkt, icrc)
	t.batch = append(t.batch, link.Datagram{Buf: pkt, Src: src, Dst: dst, TClass: tclass})
}

// flush hands the pending batch to the Output.
func (q *QP) flush() {
	if t := q.out; t != nil {
		if n := len(t.batch); n > 0 {
			if err := q.sendBurst(t); err != nil {
				q.cnt.SendErr.Add(1)
			} else {
				q.cnt.SentPkts.Add(uint64(n))
			}
		}
		q.releaseTx()
	}
	if q.woHeld && !q.woResponding {
		q.publishWrites() // what the responder queued has left: the write responder may go on
	}
}

// localOp executes LOCAL_INV or BIND_MW through internal/mr (IBTA 10.6.7.2
// invalidate, 10.6.7.3 bind). Failures complete with LOC_PROT_ERR /
// MW_BIND_ERR and move the QP to ERR like any local work queue error.
func (q *QP) localOp(w *sendWQE) bool {
	w.started, w.sentAll, w.done = true, true, true
	w.status = cq.StatusSuccess
	switch w.wr.Opcode {
	case WRLocalInv:
		if err := q.cfg.MRs.Invalidate(q.cfg.PD, w.wr.InvRKey); err != nil {
			w.status = cq.StatusLocProtErr
		}
	case WRBindMW:
		b := &w.bind
		win := q.cfg.MRs.MWByKey(b.MWRKey)
		var region *mr.MR
		if b.Length > 0 {
			region = q.cfg.MRs.MRByKey(b.MRLKey)
		}
		if win == nil || (b.Length > 0 && region == nil) {
			w.status = cq.StatusMWBindErr
			break
		}
		if _, err := win.Bind(mr.BindOptions{PD: q.cfg.PD, QPN: q.num, MR: region, Addr: b.Addr,
			Length: b.Length, Access: mr.Access(b.Access), Key: uint8(b.NewRKey), KeyGiven: b.NewRKey != 0}); err != nil {
			w.status = cq.StatusMWBindErr
		}
	}
	if w.status != cq.StatusSuccess {
		q.retire()
		q.enterError()
		return false
	}
	return true
}
