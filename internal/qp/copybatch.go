package qp

import (
	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/pkg/bth"
)

// Batched copies of copied memory (mr.Memory: a daemon client's own memory, reached through
// its /proc/PID/mem). Every copy there is a system call whose fixed cost is far larger than
// the bytes of one packet, so the requester and the responder move a message's bytes in runs
// of up to copyBatch bytes, not one packet at a time:
//
//   - read ahead (requester): gathering a packet of a WQE from copied memory reads the rest
//     of its SGE, up to copyBatch, in one copy, and the WQE's next packets are taken from that
//     copy. It is valid while the WQE is outstanding: ibverbs forbids changing the memory of a
//     posted send until it completes (a program that does gets undefined data, as on any
//     device that reads by DMA). It is dropped when a WQE's first packet is built again (a
//     new WQE, or a resend from the start), so a later WQE over the same memory reads it anew.
//   - write behind (responder): the payloads of an RDMA WRITE's packets that land next to each
//     other in copied memory are gathered and placed in one copy when the message ends, when
//     copyBatch bytes are waiting, when the next payload is not contiguous, and before any
//     ACK or NAK leaves (sendAck): an acknowledgement — explicit, or implied by a later PSN's
//     NAK — is never sent for bytes not yet placed. A placement that fails then (the memory
//     gone) is answered as the WRITE packet's own would have been: a remote access error NAK.
//     A QP that enters ERR drops the bytes that wait: that WRITE never completes, and its
//     bytes must not land later in memory the program may have reused.
//
// Both buffers are the QP's own, allocated the first time copied memory is used: no allocation
// per packet. Mapped memory is copied packet by packet, as before: there the copy is a memcpy.
const copyBatch = 64 << 10

// readAhead is the requester's copy of part of one SGE of the WQE being sent.
type readAhead struct {
	buf  []byte
	w    *sendWQE // nil: empty
	sge  int      // index in w.sge
	from uint32   // offset in the SGE of buf[0]
	n    uint32   // bytes held
}

// gatherSGE copies dst from SGE i of w at offset start of the SGE, through the read ahead
// when the SGE is copied memory and more of it follows dst. false: the access failed (the
// caller completes w with a local protection error).
func (q *QP) gatherSGE(w *sendWQE, i int, start uint32, dst []byte) bool {
	s := &w.sge[i]
	ra := &q.req.ahead
	n := uint32(len(dst))
	if ra.w == w && ra.sge == i && start >= ra.from && start+n <= ra.from+ra.n {
		copy(dst, ra.buf[start-ra.from:])
		return true
	}
	rest := s.Length - start
	if rest > n && q.cfg.MRs.Copied(s.LKey) {
		if ra.buf == nil {
			ra.buf = make([]byte, copyBatch)
		}
		m := min(rest, copyBatch)
		ra.w = nil
		if q.cfg.MRs.CopyOut(q.cfg.PD, mr.NoQPN, s.LKey, s.Addr+uint64(start), ra.buf[:m], mr.OpLocalRead) == nil {
			*ra = readAhead{buf: ra.buf, w: w, sge: i, from: start, n: m}
			copy(dst, ra.buf[:n])
			return true
		}
		// the run fails somewhere: copy exactly this packet's bytes, so that the error is
		// this packet's only if these bytes are the ones that fail
	}
	return q.cfg.MRs.CopyOut(q.cfg.PD, mr.NoQPN, s.LKey, s.Addr+uint64(start), dst, mr.OpLocalRead) == nil
}

// dropReadAhead forgets the read ahead (a WQE's first packet is built).
func (q *QP) dropReadAhead() { q.req.ahead.w = nil }

// writeBehind is the responder's run of WRITE payload bytes not yet placed.
type writeBehind struct {
	buf  []byte
	rkey uint32
	va   uint64  // where buf[0] goes
	n    int     // bytes waiting
	psn  bth.PSN // the first packet waiting (the NAK's PSN if placing fails)
}

// placeWrite places one RDMA WRITE payload at va under rkey: through the write behind for
// copied memory (last: the message's last packet, or one asking for an ACK, whose bytes must
// be placed before the response), directly otherwise. false: a placement failed (the caller
// NAKs with a remote access error).
func (q *QP) placeWrite(rkey uint32, va uint64, payload []byte, psn bth.PSN, last bool) bool {
	wb := &q.resp.behind
	if wb.n > 0 && (wb.rkey != rkey || wb.va+uint64(wb.n) != va || wb.n+len(payload) > copyBatch) {
		if !q.flushWrites() {
			return false
		}
	}
	if !q.cfg.MRs.Copied(rkey) || (last && wb.n == 0) {
		return q.cfg.MRs.CopyIn(q.cfg.PD, q.num, rkey, va, payload, mr.OpRemoteWrite) == nil
	}
	if wb.buf == nil {
		wb.buf = make([]byte, copyBatch)
	}
	if wb.n == 0 {
		wb.rkey, wb.va, wb.psn = rkey, va, psn
	}
	wb.n += copy(wb.buf[wb.n:], payload)
	if last || wb.n == copyBatch {
		return q.flushWrites()
	}
	return true
}

// flushWrites places the bytes waiting in the write behind. false if that failed: they are
// dropped (the memory is gone) and the caller answers with a remote access error.
func (q *QP) flushWrites() bool {
	wb := &q.resp.behind
	if wb.n == 0 {
		return true
	}
	err := q.cfg.MRs.CopyIn(q.cfg.PD, q.num, wb.rkey, wb.va, wb.buf[:wb.n], mr.OpRemoteWrite)
	wb.n = 0
	return err == nil
}

// flushBeforeAck places the waiting WRITE bytes before an ACK or NAK leaves (sendAck). false:
// they could not be placed; the WRITE packet they came with has been NAKed instead (remote
// access error, class C: the QP enters ERR) and the caller's response must not be sent.
func (q *QP) flushBeforeAck() bool {
	wb := &q.resp.behind
	if wb.n == 0 {
		return true
	}
	psn := wb.psn
	if q.flushWrites() {
		return true
	}
	q.nakError(psn, bth.NAKRemoteAccessErr, cq.StatusRemAccessErr) // sends the NAK: nothing waits now
	return false
}
