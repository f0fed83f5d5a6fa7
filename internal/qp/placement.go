package qp

import (
	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/pkg/bth"
)

// Memory placement operations (IBTA Vol. 1 release 1.5, Annex A19): RDMA ATOMIC WRITE places 8
// bytes at an aligned address in one store; FLUSH makes what was placed before it in a range
// (or a whole region) globally visible or durable. Both are RC requests of one packet with a
// RETH (FLUSH a FETH before it), answered with an RDMA READ Response Only that carries an ACK
// AETH and no payload, as kernel rxe answers them (rxe_resp.c send_read_response_ack).
//
// Ordering: the responder executes requests one at a time in PSN order, so every WRITE, SEND
// and ATOMIC WRITE before a FLUSH is placed when the FLUSH runs, and an ATOMIC WRITE lands
// after everything before it (and before everything after it). The response to either is sent
// only after it executed: the requester's completion of a FLUSH means the placement it asked
// for is done.
//
// Responder resources: both take one (like a READ or an atomic, IBTA 9.7.4.1.5), so a
// duplicate request is answered again from it without being executed again (an ATOMIC WRITE
// run twice could overwrite a later store); a duplicate whose resource was recycled is
// dropped, as rxe drops it (class D). The requester counts both against max_rd_atomic.

// sendPlacement builds a FLUSH (BTH, FETH, RETH; IBTA A19.4.1) or an ATOMIC WRITE (BTH, RETH
// with DMA length 8, the 8 bytes; A19.4.2) for w. false if gathering the 8 bytes failed (w
// completed with a local error, the QP is in ERR).
func (q *QP) sendPlacement(w *sendWQE) bool {
	buf := q.txBuf()
	h := bth.BTHSize
	op, n := bth.OpRCAtomicWrite, 0
	if w.wr.Opcode == WRFlush {
		op = bth.OpRCFlush
		bth.FETH(buf[h:]).Encode(&bth.FETHFields{Placement: uint8(w.wr.FlushType), Selectivity: uint8(w.wr.FlushLevel)})
		h += bth.FETHSize
		bth.RETH(buf[h:]).Encode(&bth.RETHFields{VA: w.wr.RemoteAddr, RKey: w.wr.RKey, DMALen: w.wr.FlushLength})
		h += bth.RETHSize
	} else {
		bth.RETH(buf[h:]).Encode(&bth.RETHFields{VA: w.wr.RemoteAddr, RKey: w.wr.RKey, DMALen: 8})
		h += bth.RETHSize
		if w.hasOperand {
			copy(buf[h:h+8], w.operand[:])
		} else if !q.gather(w, 0, buf[h:h+8]) {
			return false
		}
		n = 8
	}
	q.req.noAck = 0
	q.finish(buf, op, false, true, q.attr.DestQPN, w.firstPSN, h, n, &q.path)
	q.sent(w.firstPSN, w.firstPSN)
	q.req.psn = w.firstPSN.Add(1)
	return true
}

// onPlacementResp handles a READ response while w, the oldest outstanding WQE, is a FLUSH or
// an ATOMIC WRITE (the caller ACKed what came before it). Its own response is an RDMA READ
// Response Only with an ACK AETH and no payload; anything else at its PSN is a malformed
// response (IBTA 9.7.6.1.3: BAD_RESP_ERR). Responses for earlier PSNs are duplicates.
func (q *QP) onPlacementResp(w *sendWQE, p *bth.Packet, psn bth.PSN) {
	if psn != w.firstPSN {
		return
	}
	if p.Info.Kind != bth.KindReadResp || !p.Info.First || !p.Info.Last || len(p.Payload) != 0 ||
		bth.SyndromeType(p.AETH.Fields().Syndrome) != bth.AckTypeACK {
		q.failWQE(w, cq.StatusBadRespErr)
		return
	}
	w.done = true
	w.status = cq.StatusSuccess
	q.comp.psn = psn.Add(1)
}

// maxDMALen is the largest RETH DMA length a responder accepts (IBTA C9-94: 2^31 bytes).
const maxDMALen = 1 << 31

// recvAtomicWrite executes an RDMA ATOMIC WRITE (IBTA A19.4.2), in rxe's order of checks: the
// QP allows remote writes (else invalid request, as for a WRITE), the R_Key allows a remote
// write of the RETH's range (else remote access error), the DMA length and the payload are 8
// bytes (oA19-28; else invalid request), the address is 8-byte aligned, in the registered
// range and in memory (A19.4.2; else invalid request). The 8 bytes are stored under the
// device's atomic lock (no CMP_SWAP or FETCH_ADD of another QP runs between its load and
// store): one aligned 64-bit store into mapped memory, one 8-byte copy into copied memory (a
// client's own memory, reached through its /proc/PID/mem; mr.Place.StoreWord says what that
// copy is atomic against). Then the empty READ response acknowledges it.
func (q *QP) recvAtomicWrite(p *bth.Packet, psn bth.PSN) {
	if q.attr.AccessFlags&mr.AccessRemoteWrite == 0 {
		q.reqError(p, bth.NAKInvalidRequest, cq.StatusRemInvReqErr)
		return
	}
	f := p.RETH.Fields()
	if f.DMALen > maxDMALen {
		q.reqError(p, bth.NAKInvalidRequest, cq.StatusRemInvReqErr)
		return
	}
	pl, done, err := q.cfg.MRs.CheckPlacementQP(q.cfg.PD, q.num, f.RKey, f.VA, f.DMALen, mr.AccessRemoteWrite, false)
	if err != nil {
		q.reqError(p, bth.NAKRemoteAccessErr, cq.StatusRemAccessErr)
		return
	}
	if f.DMALen != 8 || len(p.Payload) != 8 || p.Pad != 0 || f.VA&7 != 0 || !pl.Aligned8() {
		done()
		q.reqError(p, bth.NAKInvalidRequest, cq.StatusRemInvReqErr)
		return
	}
	// The payload's bytes land as they came (ibv_wr_atomic_write copies 8 bytes; rxe stores
	// them as one native word).
	copy(q.resp.atomicBuf[:], p.Payload)
	err = pl.StoreWord(&q.resp.atomicBuf, q.atomicMu)
	done()
	if err != nil { // copied memory gone: its owner unmapped it or exited
		q.reqError(p, bth.NAKRemoteAccessErr, cq.StatusRemAccessErr)
		return
	}
	q.placed(psn, f.RKey)
}

// recvFlush executes a FLUSH (IBTA A19.4.1): the placement type names defined types only and
// at least one, the selectivity level is Memory Region Range or Memory Region (else invalid
// request: a FLUSH the responder cannot honour is not acknowledged); the QP's access flags
// allow each placement type asked for (IBV_ACCESS_FLUSH_GLOBAL / _PERSISTENT on the QP, as
// rxe checks; else invalid request); the R_Key's region allows them too, and holds the range
// unless the level is Memory Region (else remote access error). Then:
//
//   - global visibility: every placement before the FLUSH was made by this responder before
//     it ran, into memory every observer shares (the Go heap, a memfd the daemon's clients
//     map, device memory, a client's own pages written through its /proc/PID/mem);
//     releasing the region (an atomic operation) orders those stores before the response.
//   - persistence: the region's Persister (mr.RegMROptions; a file mapping's msync) makes the
//     range, or the whole region, durable before the response; if it fails the FLUSH is
//     answered with a remote operational error NAK (IBTA 9.7.5.2.4), never acknowledged.
//
// A persistent FLUSH runs the msync on the receiving goroutine: only the embedded API
// registers persistent memory (the daemon's memory is a memfd), so the wait is the program's
// own.
func (q *QP) recvFlush(p *bth.Packet, psn bth.PSN) {
	fe := p.FETH.Fields()
	typ := FlushType(fe.Placement)
	if typ == 0 || typ&^(FlushGlobal|FlushPersistent) != 0 || FlushLevel(fe.Selectivity) > FlushMR {
		q.reqError(p, bth.NAKInvalidRequest, cq.StatusRemInvReqErr)
		return
	}
	var need mr.Access
	if typ&FlushGlobal != 0 {
		need |= mr.AccessFlushGlobal
	}
	if typ&FlushPersistent != 0 {
		need |= mr.AccessFlushPersistent
	}
	if q.attr.AccessFlags&need != need {
		q.reqError(p, bth.NAKInvalidRequest, cq.StatusRemInvReqErr)
		return
	}
	f := p.RETH.Fields()
	whole := FlushLevel(fe.Selectivity) == FlushMR
	if f.DMALen > maxDMALen { // even when the level makes the range unused, as rxe checks it
		q.reqError(p, bth.NAKInvalidRequest, cq.StatusRemInvReqErr)
		return
	}
	pl, done, err := q.cfg.MRs.CheckPlacementQP(q.cfg.PD, q.num, f.RKey, f.VA, f.DMALen, need, whole)
	if err != nil {
		q.reqError(p, bth.NAKRemoteAccessErr, cq.StatusRemAccessErr)
		return
	}
	if typ&FlushPersistent != 0 {
		// a region has AccessFlushPersistent only with a Persister (mr.RegMRWith)
		if pers := pl.Persister(); pers == nil || pers.Persist(pl.Bytes()) != nil {
			done()
			q.reqError(p, bth.NAKRemoteOpErr, cq.StatusRemOpErr)
			return
		}
	}
	done()
	q.placed(psn, f.RKey)
}

// placed records an executed ATOMIC WRITE or FLUSH at psn in a responder resource, advances
// the expected PSN and the MSN, and acknowledges it.
func (q *QP) placed(psn bth.PSN, rkey uint32) {
	res := q.newResource()
	*res = resource{valid: true, atomic: true, place: true, first: psn, last: psn, rkey: rkey}
	q.resp.epsn = psn.Add(1)
	q.resp.msn = (q.resp.msn + 1) & bth.PSNMask
	q.sendPlacementAck(psn)
}

// duplicatePlacement answers a duplicate ATOMIC WRITE or FLUSH (IBTA 9.7.4.1.5; oA19-14,
// oA19-15 as rxe cites them): acknowledged again, not executed again, if a responder resource
// still remembers its PSN; dropped otherwise (the requester's retry then times out, as after
// any lost duplicate).
func (q *QP) duplicatePlacement(psn bth.PSN) {
	for i := range q.resp.res {
		r := &q.resp.res[i]
		if r.valid && r.place && r.first == psn {
			q.sendPlacementAck(psn)
			return
		}
	}
}

// sendPlacementAck sends the response of an ATOMIC WRITE or FLUSH: an RDMA READ Response Only
// with an ACK AETH (the current MSN) and no payload.
func (q *QP) sendPlacementAck(psn bth.PSN) {
	buf := q.txBuf()
	h := bth.BTHSize
	bth.AETH(buf[h:]).Encode(&bth.AETHFields{Syndrome: bth.SyndromeACK(0x1F), MSN: q.resp.msn})
	h += bth.AETHSize
	q.finish(buf, bth.OpRCReadRespOnly, false, false, q.attr.DestQPN, psn, h, 0, &q.path)
}
