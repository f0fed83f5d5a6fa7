// Long file: the responder of IBTA 9.7.4-9.7.5 and 9.8 in the order a request is checked and
// executed (PSN and opcode sequence, length, receive WQE, access, placement, ACK/NAK), the
// order a review follows; READ response scheduling is in readresp.go.

package qp

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/event"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/pkg/bth"
)

// The responder executes request packets (IBTA 9.7.4 "responder side",
// 9.7.5 response generation; 9.8 for UC and UD): PSN and opcode sequence
// checks, receive WQE consumption, access checks through internal/mr, data
// placement, READ responses from the responder resources, atomics, ACK
// coalescing and NAKs.

const (
	msgNone uint8 = iota
	msgSend
	msgWrite
)

// GSIQKey is the well-known Q_Key of QP1 (IBTA chapter 13 GSI; rxe GSI_QKEY).
const GSIQKey = 0x80010000

// responder is the receive-side state.
type responder struct {
	epsn    bth.PSN // expected PSN
	msn     uint32  // message sequence number (24-bit)
	nakSent bool    // one PSN sequence error NAK per gap (IBTA 9.7.5.2.1)
	sr      *srRecv // the reorder buffer of selective repeat (selective.go; allocated at first use)
	inMsg   uint8
	drop    bool // UC: drop until the next FIRST/ONLY (IBTA 9.8, unreliable connected)
	commEst bool

	haveWQE bool
	wqe     recvWQE
	recvOff uint32

	behind writeBehind // WRITE payloads into copied memory not yet placed (copybatch.go)

	atomicBuf [8]byte // an atomic's target bytes or an ATOMIC WRITE's payload, for copied memory (mr.Memory)

	wva   uint64
	wrkey uint32
	wlen  uint32
	woff  uint32

	res     []resource // READ/atomic responder resources (max_dest_rd_atomic)
	resNext int
	rd      readGen    // the READ whose responses are being sent (readresp.go)
	rdq     *srReplays // ranged duplicate READs waiting for rd (srread.go; first use)
	sched   bool       // the QP waits for its scheduler's RunResponder

	writes writeCount // RDMA WRITE messages executed (QP.RemoteWrites)

	grh [40]byte
}

// resource remembers an executed READ or atomic so a duplicate can be
// answered again (IBTA 9.7.4.1, duplicate READ/atomic requests).
type resource struct {
	valid  bool
	atomic bool
	place  bool // an ATOMIC WRITE or a FLUSH (atomic too: never a READ to replay; placement.go)
	first  bth.PSN
	last   bth.PSN
	rkey   uint32
	orig   uint64
	va     uint64 // a READ's first byte (a ranged duplicate must ask the same bytes, srread.go)
}

// Receive processes one parsed packet addressed to this QP (the device has
// checked the ICRC, the destination address, TVer and the QPN). src is the
// remote and dst the local address. It runs the responder for requests and
// the completer for responses, then sends what they produced and re-arms
// the timer. Remote input never panics: anything malformed is dropped or
// NAKed.
func (q *QP) Receive(now time.Time, p *bth.Packet, src, dst netip.AddrPort) {
	q.mu.Lock()
	held := q.receiveHold(p, src, dst) // the hook runs unlocked: if it panics there is nothing to unlock
	defer q.mu.Unlock()
	if held {
		return
	}
	if q.receive(now, p, src, dst) {
		q.flush()
		q.armTimerAt(now)
	}
}

// receive runs the responder or the completer for one packet under q.mu; false if the packet
// was dropped before either ran.
func (q *QP) receive(now time.Time, p *bth.Packet, src, dst netip.AddrPort) bool {
	if q.dead || p.Info == nil || !q.accept(p, src, dst) {
		q.cnt.RcvdDropped.Add(1)
		return false
	}
	if p.Info.Request {
		if q.state == StateRTR && !q.resp.commEst {
			q.resp.commEst = true
			if q.cfg.Events != nil {
				q.cfg.Events(event.Event{Type: event.CommEst, Object: q, QPN: q.num})
			}
		}
		if q.wo != nil {
			q.respondShared(now, p, src, dst)
		} else {
			q.respond(now, p, src, dst)
		}
	} else {
		q.complete(now, p)
	}
	return true
}

// accept applies the per-QP receive checks of rxe_recv.c: the QP state
// (IBTA 10.3.1: RESET/INIT/ERR drop), the opcode's transport class equals
// the QP type, RC/UC addresses equal the path, the P_Key, the UD Q_Key
// (IBTA 10.2.5).
func (q *QP) accept(p *bth.Packet, src, dst netip.AddrPort) bool {
	switch q.state {
	case StateRTR:
		if !p.Info.Request {
			return false
		}
	case StateRTS, StateSQD, StateSQE:
	default:
		return false
	}
	if p.BTH.PKey()&0x7FFF != 0x7FFF {
		return false // the one P_Key is 0xFFFF (IBTA 10.9.3)
	}
	switch q.typ {
	case TypeRC:
		if p.Info.Transport != bth.TransportRC {
			return false
		}
	case TypeUC:
		if p.Info.Transport != bth.TransportUC {
			return false
		}
	default:
		if p.Info.Transport != bth.TransportUD || p.DETH == nil {
			return false
		}
		want := q.attr.QKey
		if q.typ == TypeGSI {
			want = GSIQKey
		}
		if p.DETH.Fields().QKey != want {
			return false
		}
		return true
	}
	return src.Addr().Unmap() == q.path.Dst && dst.Addr().Unmap() == q.path.Src
}

// respond runs the responder for one request packet.
func (q *QP) respond(now time.Time, p *bth.Packet, src, dst netip.AddrPort) {
	switch q.typ {
	case TypeUD, TypeGSI:
		q.respondUD(p, src, dst)
		return
	case TypeUC:
		q.respondUC(p)
		return
	}
	psn := p.BTH.PSN()
	d := psn.Sub(q.resp.epsn)
	if d > 0 {
		// IBTA 9.7.4.1.3 / 9.7.5.2.1: a PSN ahead of the expected one
		// means packets were lost; NAK once, then stay silent until the
		// requester resends from the expected PSN.
		q.cnt.OutOfSeqRequest.Add(1)
		if q.attr.SelectiveRepeat {
			q.srStore(p, psn) // held, not dropped, and SACKed (selective.go)
			return
		}
		if !q.resp.nakSent {
			q.resp.nakSent = true
			q.sendAck(bth.SyndromeNAK(bth.NAKPSNSeqErr), q.resp.epsn)
		}
		return
	}
	if d < 0 {
		q.cnt.DuplicateRequest.Add(1)
		q.duplicate(p, psn)
		return
	}
	q.resp.nakSent = false
	q.execute(p, psn)
	if q.resp.sr != nil {
		q.srExecuted(now, psn) // the held packets that follow in order (selective.go)
	}
}

// execute executes the RC request at the expected PSN.
func (q *QP) execute(p *bth.Packet, psn bth.PSN) {
	if !q.opSeqOK(p.Info) {
		// IBTA 9.7.4.1 (opcode sequence): invalid request NAK.
		q.reqError(p, bth.NAKInvalidRequest, cq.StatusRemInvReqErr)
		return
	}
	switch p.Info.Kind {
	case bth.KindSend:
		q.recvSend(p, psn)
	case bth.KindWrite:
		q.recvWrite(p, psn)
	case bth.KindReadReq:
		q.recvRead(p, psn)
	case bth.KindCmpSwap, bth.KindFetchAdd:
		q.recvAtomic(p, psn)
	case bth.KindAtomicWrite:
		q.recvAtomicWrite(p, psn) // placement.go
	case bth.KindFlush:
		q.recvFlush(p, psn)
	default:
		q.reqError(p, bth.NAKInvalidRequest, cq.StatusRemInvReqErr)
	}
}

// opSeqOK checks the opcode sequence (IBTA 9.7.4.1; rxe check_op_seq): a
// MIDDLE or LAST must continue a message of the same kind; a FIRST, ONLY,
// READ or atomic may not interrupt one.
func (q *QP) opSeqOK(info *bth.OpInfo) bool {
	switch q.resp.inMsg {
	case msgSend:
		return info.Kind == bth.KindSend && !info.First
	case msgWrite:
		return info.Kind == bth.KindWrite && !info.First
	}
	if info.Kind == bth.KindSend || info.Kind == bth.KindWrite {
		return info.First
	}
	return true
}

// checkLen applies the IBTA 9.7.4.1 packet length rules: FIRST and MIDDLE
// carry exactly one MTU, LAST 1..MTU, ONLY 0..MTU.
func (q *QP) checkLen(info *bth.OpInfo, n int) bool {
	m := int(q.mtu)
	switch {
	case info.First && info.Last:
		return n <= m
	case info.First, !info.Last:
		return n == m
	default:
		return n > 0 && n <= m
	}
}

// reqError handles a request that cannot be executed: on RC a NAK with
// code (IBTA 9.7.5.2), the current receive WQE completes with st and the QP
// enters ERR (IBTA 9.9.3.1 responder class B/C/D errors); on UC the message
// is silently dropped (IBTA 9.8).
func (q *QP) reqError(p *bth.Packet, code uint8, st cq.Status) {
	q.nakError(p.BTH.PSN(), code, st)
}

// nakError is reqError for the request at psn.
func (q *QP) nakError(psn bth.PSN, code uint8, st cq.Status) {
	if code == bth.NAKRemoteAccessErr {
		q.remoteAccessError()
	}
	if q.typ == TypeUC {
		q.resp.inMsg = msgNone
		q.resp.recvOff = 0
		q.resp.drop = true
		return
	}
	q.sendAck(bth.SyndromeNAK(code), psn)
	q.raise(nakEvent(code))
	if q.resp.haveWQE {
		wc := cq.WC{WRID: q.resp.wqe.wrid, Status: st, Opcode: cq.OpRecv, QPNum: q.num}
		q.cfg.RecvCQ.Push(&wc, false)
		q.resp.haveWQE = false
	}
	q.enterError()
}

// remoteAccessError counts a request refused for its R_Key (Counters.RespRemoteAccessErrors).
func (q *QP) remoteAccessError() {
	q.cnt.RespRemoteAccessErrors.Add(1)
	q.remoteAccessErrs.Add(1)
}

// RemoteAccessErrors returns how many requests this QP's responder refused for their R_Key
// (unknown or invalidated key, out of bounds, no right: NAKed on RC, dropped on UC). A
// count that grows on a UC QP with no NAK to show for it is the sign of a sender guessing
// keys (docs/reliability.md, "What RoCEv2 cannot protect").
func (q *QP) RemoteAccessErrors() uint64 { return q.remoteAccessErrs.Load() }

// rnr answers a SEND (or WRITE with immediate) that finds no receive WQE:
// RC sends an RNR NAK with the QP's min_rnr_timer and does not advance the
// expected PSN (IBTA 9.7.5.2.8); UC drops the message.
func (q *QP) rnr(p *bth.Packet) {
	if q.typ == TypeUC {
		q.resp.drop = true
		q.resp.inMsg = msgNone
		return
	}
	q.cnt.SendRNRErr.Add(1)
	q.sendAck(bth.SyndromeRNR(q.attr.MinRNRTimer&31), p.BTH.PSN())
	// The RNR NAK already tells the requester to resend from this PSN:
	// the packets of the message still in flight are not NAKed again.
	q.resp.nakSent = true
}

// advance moves the expected PSN past an executed packet and ACKs it if
// asked (IBTA 9.7.5.1: ACK coalescing - the responder ACKs packets with
// AckReq set; the requester sets it on the last packet of each message).
func (q *QP) advance(p *bth.Packet, psn bth.PSN) {
	q.resp.epsn = psn.Add(1)
	if q.typ != TypeRC {
		return
	}
	if p.BTH.AckReq() {
		q.sendAck(bth.SyndromeACK(0x1F), psn)
	} else {
		q.cnt.AckDeferred.Add(1)
	}
}

// recvSend places one SEND packet into the receive WQE.
func (q *QP) recvSend(p *bth.Packet, psn bth.PSN) {
	info := p.Info
	r := &q.resp
	if info.First {
		if !r.haveWQE {
			if !q.popRecv(&r.wqe) {
				q.rnr(p)
				return
			}
			r.haveWQE = true
		}
		r.recvOff = 0 // a new message (UC may reuse the WQE of a dropped one)
	}
	if !r.haveWQE { // cannot happen on RC (opcode sequence); UC resync
		q.reqError(p, bth.NAKInvalidRequest, cq.StatusRemInvReqErr)
		return
	}
	if !q.checkLen(info, len(p.Payload)) {
		q.reqError(p, bth.NAKInvalidRequest, cq.StatusRemInvReqErr)
		return
	}
	ok, err := q.scatter(r.wqe.sge[:r.wqe.n], r.recvOff, p.Payload)
	if err != nil {
		q.reqError(p, bth.NAKRemoteOpErr, cq.StatusLocProtErr)
		return
	}
	if !ok {
		// IBTA 9.7.5.2: message longer than the receive buffer:
		// invalid request NAK, local length error on the receive.
		q.reqError(p, bth.NAKInvalidRequest, cq.StatusLocLenErr)
		return
	}
	r.recvOff += uint32(len(p.Payload))
	if !info.Last {
		r.inMsg = msgSend
		q.advance(p, psn)
		return
	}
	r.inMsg = msgNone
	wc := cq.WC{WRID: r.wqe.wrid, Status: cq.StatusSuccess, Opcode: cq.OpRecv, ByteLen: r.recvOff, QPNum: q.num}
	if p.ImmDt != nil {
		wc.ImmData = p.ImmDt.Imm()
		wc.Flags |= cq.FlagWithImm
	}
	if p.IETH != nil {
		key := p.IETH.RKey()
		if err := q.cfg.MRs.InvalidateQP(q.cfg.PD, q.num, key); err != nil {
			// IBTA 9.7.5.2: a key that cannot be invalidated is a
			// remote operational error.
			q.reqError(p, bth.NAKRemoteOpErr, cq.StatusRemOpErr)
			return
		}
		wc.InvalidatedRKey = key
		wc.Flags |= cq.FlagWithInv
	}
	r.haveWQE = false
	r.msn = (r.msn + 1) & bth.PSNMask
	q.cnt.RDMARecvs.Add(1)
	q.advance(p, psn)
	if !q.cfg.RecvCQ.Push(&wc, p.BTH.SE()) {
		q.cqOverrun()
	}
}

// recvWrite executes one RDMA WRITE packet (IBTA 9.4.3).
func (q *QP) recvWrite(p *bth.Packet, psn bth.PSN) {
	info := p.Info
	r := &q.resp
	if info.First {
		if q.attr.AccessFlags&mr.AccessRemoteWrite == 0 {
			q.reqError(p, bth.NAKInvalidRequest, cq.StatusRemInvReqErr)
			return
		}
		f := p.RETH.Fields()
		// A WRITE Only (no immediate) whose payload is the whole DMA length within the MTU has
		// one check, the payload's below: the same R_Key, address and length, and nothing runs
		// between the two (a ping-pong's 8-byte WRITE takes one MR lookup, not two).
		once := info.Last && p.ImmDt == nil && f.DMALen == uint32(len(p.Payload)) && q.checkLen(info, len(p.Payload))
		if f.DMALen > 0 && !once { // R_Key, bounds and rights (IBTA 9.7.4.1.5, C9-88)
			_, done, err := q.cfg.MRs.CheckQP(q.cfg.PD, q.num, f.RKey, f.VA, f.DMALen, mr.OpRemoteWrite)
			if err != nil {
				q.reqError(p, bth.NAKRemoteAccessErr, cq.StatusRemAccessErr)
				return
			}
			done()
		}
		r.wva, r.wrkey, r.wlen, r.woff = f.VA, f.RKey, f.DMALen, 0
	}
	n := uint32(len(p.Payload))
	if !q.checkLen(info, int(n)) || r.woff+n > r.wlen || (info.Last && r.woff+n != r.wlen) {
		q.reqError(p, bth.NAKInvalidRequest, cq.StatusRemInvReqErr)
		return
	}
	imm := p.ImmDt != nil
	if imm && !r.haveWQE {
		// WRITE with immediate consumes a receive WQE (IBTA 9.4.3)
		if !q.popRecv(&r.wqe) {
			q.rnr(p)
			return
		}
		r.haveWQE = true
	}
	if n > 0 { // copied memory: batched (copybatch.go), placed before this packet's ACK
		if !q.placeWrite(r.wrkey, r.wva+uint64(r.woff), p.Payload, psn, info.Last || p.BTH.AckReq()) {
			q.reqError(p, bth.NAKRemoteAccessErr, cq.StatusRemAccessErr)
			return
		}
	}
	r.woff += n
	if !info.Last {
		r.inMsg = msgWrite
		q.advance(p, psn)
		return
	}
	r.inMsg = msgNone
	r.msn = (r.msn + 1) & bth.PSNMask
	r.writes.done() // after the last byte is placed: see RemoteWrites
	q.advance(p, psn)
	if imm {
		wc := cq.WC{
			WRID: r.wqe.wrid, Status: cq.StatusSuccess, Opcode: cq.OpRecvRDMAWithImm,
			ByteLen: r.wlen, ImmData: p.ImmDt.Imm(), Flags: cq.FlagWithImm, QPNum: q.num,
		}
		r.haveWQE = false
		q.cnt.RDMARecvs.Add(1)
		if !q.cfg.RecvCQ.Push(&wc, p.BTH.SE()) {
			q.cqOverrun()
		}
	}
}

// recvRead executes an RDMA READ request (IBTA 9.4.4): checks, then one
// responder resource, then the responses.
func (q *QP) recvRead(p *bth.Packet, psn bth.PSN) {
	if q.attr.AccessFlags&mr.AccessRemoteRead == 0 {
		q.reqError(p, bth.NAKInvalidRequest, cq.StatusRemInvReqErr)
		return
	}
	f := p.RETH.Fields()
	if f.DMALen > 0 {
		_, done, err := q.cfg.MRs.CheckQP(q.cfg.PD, q.num, f.RKey, f.VA, f.DMALen, mr.OpRemoteRead)
		if err != nil {
			q.reqError(p, bth.NAKRemoteAccessErr, cq.StatusRemAccessErr)
			return
		}
		done()
	}
	n := uint32(1)
	if f.DMALen > q.mtu {
		n = (f.DMALen + q.mtu - 1) / q.mtu
	}
	res := q.newResource()
	*res = resource{valid: true, first: psn, last: psn.Add(n - 1), rkey: f.RKey, va: f.VA}
	q.resp.epsn = psn.Add(n)
	q.resp.msn = (q.resp.msn + 1) & bth.PSNMask
	q.startRead(psn, f.VA, f.RKey, f.DMALen) // a burst at a time (readresp.go)
}

func (q *QP) newResource() *resource {
	if len(q.resp.res) == 0 {
		q.resp.res = make([]resource, max(q.resN, 1))
		q.resp.resNext = 0
	}
	r := &q.resp.res[q.resp.resNext]
	q.resp.resNext = (q.resp.resNext + 1) % len(q.resp.res)
	return r
}

// recvAtomic executes CMP_SWAP / FETCH_ADD (IBTA 9.4.5): 8-byte aligned,
// under the device-wide atomic lock, result saved for duplicates.
func (q *QP) recvAtomic(p *bth.Packet, psn bth.PSN) {
	if q.attr.AccessFlags&mr.AccessRemoteAtomic == 0 {
		q.reqError(p, bth.NAKInvalidRequest, cq.StatusRemInvReqErr)
		return
	}
	f := p.AtomicETH.Fields()
	if f.VA&7 != 0 {
		q.reqError(p, bth.NAKInvalidRequest, cq.StatusRemInvReqErr)
		return
	}
	orig, err := q.cfg.MRs.Atomic(q.cfg.PD, q.num, f.RKey, f.VA, q.atomicMu, &q.resp.atomicBuf,
		p.Info.Kind == bth.KindCmpSwap, f.Compare, f.SwapAdd)
	if err != nil {
		if errors.Is(err, mr.ErrAlign) {
			q.reqError(p, bth.NAKInvalidRequest, cq.StatusRemInvReqErr)
		} else {
			q.reqError(p, bth.NAKRemoteAccessErr, cq.StatusRemAccessErr)
		}
		return
	}
	res := q.newResource()
	*res = resource{valid: true, atomic: true, first: psn, last: psn, rkey: f.RKey, orig: orig}
	q.resp.epsn = psn.Add(1)
	q.resp.msn = (q.resp.msn + 1) & bth.PSNMask
	q.sendAtomicAck(psn, orig)
}

// duplicate answers a request whose PSN is before the expected one (IBTA
// 9.7.4.1, duplicate requests): SEND/WRITE are re-ACKed with the last executed PSN (when the
// requester asks for an ACK), a READ is replayed from the requested PSN
// if it falls in a remembered resource with the same R_Key, an atomic gets
// its saved result. Anything else is dropped.
func (q *QP) duplicate(p *bth.Packet, psn bth.PSN) {
	switch p.Info.Kind {
	case bth.KindSend, bth.KindWrite:
		// C9-105: a duplicate SEND or WRITE is acknowledged again whether or
		// not it asks for an ACK (its original ACK may be what was lost), with
		// the PSN of the last request executed; rxe does the same.
		q.sendAck(bth.SyndromeACK(0x1F), q.resp.epsn.Add(bth.PSNMask))
	case bth.KindReadReq:
		f := p.RETH.Fields()
		for i := range q.resp.res {
			r := &q.resp.res[i]
			if r.valid && !r.atomic && r.rkey == f.RKey && r.first.LessThanEq(psn) && psn.LessThanEq(r.last) {
				// the resumed request must end where the original did
				n := uint32(1)
				if f.DMALen > q.mtu {
					n = (f.DMALen + q.mtu - 1) / q.mtu
				}
				if psn.Add(n-1) != r.last && !q.srRangedRead(r, psn, n, f.VA) {
					return
				}
				q.startRead(psn, f.VA, f.RKey, f.DMALen) // replaces a READ in progress (readresp.go)
				return
			}
		}
	case bth.KindAtomicWrite, bth.KindFlush:
		q.duplicatePlacement(psn) // placement.go
	case bth.KindCmpSwap, bth.KindFetchAdd:
		for i := range q.resp.res {
			r := &q.resp.res[i]
			if r.valid && r.atomic && !r.place && r.first == psn {
				q.sendAtomicAck(psn, r.orig)
				return
			}
		}
	}
}

// sendAck sends an ACK or NAK (IBTA 9.7.5.2: opcode ACKNOWLEDGE, AETH), once the WRITE bytes
// it acknowledges are placed (copybatch.go).
func (q *QP) sendAck(syndrome uint8, psn bth.PSN) {
	if !q.flushBeforeAck() {
		return
	}
	buf := q.txBuf()
	h := bth.BTHSize
	bth.AETH(buf[h:]).Encode(&bth.AETHFields{Syndrome: syndrome, MSN: q.resp.msn})
	h += bth.AETHSize
	q.finish(buf, bth.OpRCAck, false, false, q.attr.DestQPN, psn, h, 0, &q.path)
}

// sendAtomicAck sends an ATOMIC ACKNOWLEDGE (IBTA 9.3.6: AETH + AtomicAckETH).
func (q *QP) sendAtomicAck(psn bth.PSN, orig uint64) {
	buf := q.txBuf()
	h := bth.BTHSize
	bth.AETH(buf[h:]).Encode(&bth.AETHFields{Syndrome: bth.SyndromeACK(0x1F), MSN: q.resp.msn})
	h += bth.AETHSize
	bth.AtomicAckETH(buf[h:]).Encode(&bth.AtomicAckETHFields{OrigData: orig})
	h += bth.AtomicAckETHSize
	q.finish(buf, bth.OpRCAtomicAck, false, false, q.attr.DestQPN, psn, h, 0, &q.path)
}

// respondUC runs the UC responder (IBTA 9.8): no ACKs, no NAKs. A PSN
// gap drops the message in progress; the receiver then waits for the
// next FIRST or ONLY, and the receive WQE is reused.
func (q *QP) respondUC(p *bth.Packet) {
	info := p.Info
	r := &q.resp
	psn := p.BTH.PSN()
	if psn != r.epsn {
		q.cnt.OutOfSeqRequest.Add(1)
		r.inMsg = msgNone
		r.recvOff = 0
		r.drop = !info.First
	}
	r.epsn = psn.Add(1)
	if r.drop {
		if !info.First {
			return
		}
		r.drop = false
	}
	if !q.opSeqOK(info) {
		// a FIRST/ONLY interrupting a message: the old one is lost, start over
		if info.First {
			r.inMsg = msgNone
			r.recvOff = 0
		} else {
			r.drop = true
			return
		}
	}
	switch info.Kind {
	case bth.KindSend:
		q.recvSend(p, psn)
	case bth.KindWrite:
		q.recvWrite(p, psn)
	}
}

// respondUD delivers a UD SEND (IBTA 9.8, datagram): one packet, the 40-byte GRH
// at the head of the receive buffer (as ibverbs does: for IPv4 the IPv4
// header fills its last 20 bytes), WC flag GRH, the source QP from DETH.
// No receive WQE means a silent drop.
func (q *QP) respondUD(p *bth.Packet, src, dst netip.AddrPort) {
	info := p.Info
	if !info.First || !info.Last || len(p.Payload) > int(q.mtu) {
		return
	}
	r := &q.resp
	var w recvWQE
	if !q.popRecv(&r.wqe) {
		q.cnt.RcvdDropped.Add(1)
		return
	}
	w = r.wqe
	udpLen := p.Info.HdrLen + len(p.Payload) + p.Pad + bth.ICRCSize
	q.buildGRH(src.Addr().Unmap(), dst.Addr().Unmap(), udpLen)
	wc := cq.WC{WRID: w.wrid, Opcode: cq.OpRecv, QPNum: q.num, Flags: cq.FlagGRH, SrcQP: p.DETH.Fields().SrcQP}
	ok, err := q.scatter(w.sge[:w.n], 0, r.grh[:])
	if ok && err == nil {
		ok, err = q.scatter(w.sge[:w.n], 40, p.Payload)
	}
	switch {
	case err != nil:
		wc.Status = cq.StatusLocProtErr
	case !ok:
		wc.Status = cq.StatusLocLenErr
	default:
		wc.Status = cq.StatusSuccess
		wc.ByteLen = uint32(40 + len(p.Payload))
		if p.ImmDt != nil {
			wc.ImmData = p.ImmDt.Imm()
			wc.Flags |= cq.FlagWithImm
		}
		q.cnt.RDMARecvs.Add(1)
	}
	q.cfg.RecvCQ.Push(&wc, p.BTH.SE())
}

// buildGRH fills q.resp.grh with the network header the packet arrived
// with, reconstructed (a UDP socket does not see it): IPv4 -> 20 zero
// bytes then an IPv4 header; IPv6 -> the IPv6 header (IBTA A17.4).
func (q *QP) buildGRH(src, dst netip.Addr, udpPayloadLen int) {
	g := &q.resp.grh
	*g = [40]byte{}
	if src.Is4() && dst.Is4() {
		h := g[20:]
		h[0] = 0x45
		binary.BigEndian.PutUint16(h[2:], uint16(20+8+udpPayloadLen))
		h[6] = 0x40 // DF
		h[8] = 64
		h[9] = 17
		s, d := src.As4(), dst.As4()
		copy(h[12:16], s[:])
		copy(h[16:20], d[:])
		var sum uint32
		for i := 0; i < 20; i += 2 {
			sum += uint32(h[i])<<8 | uint32(h[i+1])
		}
		for sum > 0xFFFF {
			sum = sum&0xFFFF + sum>>16
		}
		binary.BigEndian.PutUint16(h[10:], ^uint16(sum))
		return
	}
	g[0] = 0x60
	binary.BigEndian.PutUint16(g[4:], uint16(8+udpPayloadLen))
	g[6] = 17
	g[7] = 64
	s, d := src.As16(), dst.As16()
	copy(g[8:24], s[:])
	copy(g[24:40], d[:])
}
