package daemon

import (
	"fmt"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/roce"
)

type pdObj struct {
	pd   *mr.PD
	refs int // MRs, MWs, QPs using it
}

type srqObj struct {
	s    *qp.SRQ
	refs int
	cost usage
}

type qpObj struct {
	q        *roce.QP
	pd       *pdObj
	scq, rcq *cqObj
	srq      *srqObj
	cost     usage
}

func (ss *session) allocPD() (proto.Handle, error) {
	if err := ss.charge(one(resPDs)); err != nil {
		return 0, err
	}
	pd, err := ss.s.dev.AllocPD()
	if err != nil {
		ss.release(one(resPDs))
		return 0, err
	}
	ss.s.nPD.Add(1)
	return ss.add(&pdObj{pd: pd}), nil
}

func (ss *session) deallocPD(h proto.Handle) error {
	o, err := get[*pdObj](ss, h)
	if err != nil {
		return err
	}
	if o.refs > 0 {
		return fmt.Errorf("%w: PD still has %d objects", mr.ErrBusy, o.refs)
	}
	if err := o.pd.Dealloc(); err != nil {
		return err
	}
	ss.del(h)
	ss.s.nPD.Add(-1)
	ss.release(one(resPDs))
	return nil
}

// createSRQ is ibv_create_srq; the PD, if named, must be the client's.
func (ss *session) createSRQ(r wire.CreateSRQReq) (wire.CreateSRQResp, error) {
	if r.PD != 0 {
		if _, err := get[*pdObj](ss, proto.Handle(r.PD)); err != nil {
			return wire.CreateSRQResp{}, err
		}
	}
	a := ss.s.dev.Attr()
	maxWR, maxSGE := int(min(r.MaxWR, 1<<30)), int(min(r.MaxSGE, 1<<30))
	if maxWR < 1 || maxWR > a.MaxSRQWR || maxSGE < 1 || maxSGE > a.MaxSRQSGE {
		return wire.CreateSRQResp{}, qp.ErrSRQArg // (before sizing the charge from them)
	}
	cost := usage{resSRQs: 1, resEngineBytes: qp.SRQFootprint(maxWR, maxSGE)}
	if err := ss.charge(cost); err != nil {
		return wire.CreateSRQResp{}, err
	}
	s, err := ss.s.dev.CreateSRQ(qp.SRQOptions{MaxWR: maxWR, MaxSGE: maxSGE, Limit: int(min(r.SRQLimit, 1<<30))})
	if err != nil {
		ss.release(cost)
		return wire.CreateSRQResp{}, err
	}
	ss.s.nSRQ.Add(1)
	h := ss.add(&srqObj{s: s, cost: cost})
	ss.s.own(s, owner{ss, h, proto.EventOnSRQ})
	sa := s.Query()
	return wire.CreateSRQResp{Handle: uint32(h), MaxWR: uint32(sa.MaxWR), MaxSGE: uint32(sa.MaxSGE)}, nil
}

func (ss *session) destroySRQ(h proto.Handle) error {
	o, err := get[*srqObj](ss, h)
	if err != nil {
		return err
	}
	if o.refs > 0 {
		return fmt.Errorf("%w: SRQ still used by %d QPs", mr.ErrBusy, o.refs)
	}
	ss.s.verb.DestroySRQ(o.s)
	ss.s.disown(o.s)
	ss.del(h)
	ss.s.nSRQ.Add(-1)
	ss.release(o.cost)
	return nil
}

func (ss *session) createQP(r wire.CreateQPReq) (wire.CreateQPResp, error) {
	var resp wire.CreateQPResp
	pd, err := get[*pdObj](ss, proto.Handle(r.PD))
	if err != nil {
		return resp, err
	}
	scq, err := get[*cqObj](ss, proto.Handle(r.SendCQ))
	if err != nil {
		return resp, err
	}
	rcq, err := get[*cqObj](ss, proto.Handle(r.RecvCQ))
	if err != nil {
		return resp, err
	}
	var srq *srqObj
	in := roce.QPInit{Type: qp.Type(r.QPType), PD: pd.pd, SendCQ: scq.c, RecvCQ: rcq.c,
		Cap: proto.CapFromWire(&r.Cap), SigAll: r.SQSigAll != 0, Budget: ss.ten.budget}
	if r.SRQ == 0 {
		in.RecvRefill = ss.refill // receives posted through the ring are visible at once (postring.go)
	} else {
		if srq, err = get[*srqObj](ss, proto.Handle(r.SRQ)); err != nil {
			return resp, err
		}
		in.SRQ = srq.s
	}
	if in.Type == qp.TypeGSI {
		// The GSI QP (QPN 1) is the device's, not a client's.
		return resp, fmt.Errorf("%w: GSI QP", proto.ErrUnsupported)
	}
	a, c := ss.s.dev.Attr(), in.Cap
	if c.MaxSendWR > uint32(a.MaxQPWR) || c.MaxRecvWR > uint32(a.MaxQPWR) || c.MaxSendSGE > uint32(a.MaxSGE) ||
		c.MaxRecvSGE > uint32(a.MaxSGE) || c.MaxInlineData > uint32(a.MaxInlineData) {
		return resp, roce.ErrLimit // (before sizing the charge from them)
	}
	cost := usage{resQPs: 1, resEngineBytes: qp.Footprint(c, srq != nil)}
	if err := ss.charge(cost); err != nil {
		return resp, err
	}
	q, err := ss.s.dev.CreateQP(in)
	if err != nil {
		ss.release(cost)
		return resp, err
	}
	pd.refs++
	scq.refs++
	rcq.refs++
	if srq != nil {
		srq.refs++
	}
	ss.s.nQP.Add(1)
	h := ss.add(&qpObj{q: q, pd: pd, scq: scq, rcq: rcq, srq: srq, cost: cost})
	ss.s.own(q.Num(), owner{ss, h, proto.EventOnQP})
	got := q.Query().Cap
	return wire.CreateQPResp{Handle: uint32(h), QPN: q.Num(), Cap: proto.CapToWire(&got)}, nil
}

func (ss *session) destroyQP(h proto.Handle) error {
	o, err := get[*qpObj](ss, h)
	if err != nil {
		return err
	}
	ss.cmDetachQP(o)
	ss.releaseQP(o)
	ss.del(h)
	return nil
}

func (ss *session) releaseQP(o *qpObj) {
	ss.s.disown(o.q.Num())
	o.q.Destroy()
	o.pd.refs--
	o.scq.refs--
	o.rcq.refs--
	if o.srq != nil {
		o.srq.refs--
	}
	ss.s.nQP.Add(-1)
	ss.release(o.cost)
}

func (ss *session) postSend(b []byte) {
	op, h, n, rest, err := proto.PostHeader(b)
	if err != nil {
		ss.wbuf = proto.AppendError(ss.wbuf, op, err, 0)
		return
	}
	o, err := get[*qpObj](ss, h)
	if err != nil {
		ss.wbuf = proto.AppendError(ss.wbuf, op, err, 0)
		return
	}
	wrs, err := ss.sdec.Decode(rest, n)
	if err != nil {
		ss.wbuf = proto.AppendError(ss.wbuf, op, err, 0)
		return
	}
	posted, err := o.q.PostSend(wrs)
	if err != nil {
		ss.wbuf = proto.AppendError(ss.wbuf, op, err, posted)
		return
	}
	ss.wbuf = proto.AppendPosted(ss.wbuf, op, posted)
}

// postSendAsync posts without a response. A WR the engine refuses (the
// client's checks should have prevented it) completes with LOC_QP_OP_ERR,
// as does every later WR of the request, so the client still gets exactly
// one completion per WR.
// It returns the bytes the posted WRs send (a drain turn's budget counts them).
func (ss *session) postSendAsync(b []byte) (bytes int64) {
	_, h, n, rest, err := proto.PostHeader(b)
	if err != nil {
		ss.badPost("async post: bad message", "err", err)
		return 0
	}
	o, err := get[*qpObj](ss, h)
	if err != nil {
		ss.badPost("async post: no QP", "handle", h)
		return 0
	}
	wrs, err := ss.sdec.Decode(rest, n)
	if err != nil {
		ss.badPost("async post: bad WRs", "err", err)
		return 0
	}
	posted, err := o.q.PostSend(wrs)
	for i := posted; err != nil && i < len(wrs); i++ {
		wc := cq.WC{WRID: wrs[i].WRID, Status: cq.StatusLocQPOpErr, Opcode: sendWCOpcode(wrs[i].Opcode),
			QPNum: o.q.Num(), VendorErr: uint32(proto.CodeOf(err))}
		o.scq.c.Push(&wc, false)
	}
	for i := range wrs[:posted] {
		bytes += int64(len(wrs[i].Inline))
		for _, s := range wrs[i].SGL {
			bytes += int64(s.Length)
		}
	}
	return bytes
}

// postRecvAsync is postSendAsync for receive WRs.
func (ss *session) postRecvAsync(b []byte) {
	_, h, n, rest, err := proto.PostHeader(b)
	if err != nil {
		ss.badPost("async post: bad message", "err", err)
		return
	}
	o, err := get[*qpObj](ss, h)
	if err != nil {
		ss.badPost("async post: no QP", "handle", h)
		return
	}
	wrs, err := ss.rdec.Decode(rest, n)
	if err != nil {
		ss.badPost("async post: bad WRs", "err", err)
		return
	}
	posted, err := o.q.PostRecv(wrs)
	for i := posted; err != nil && i < len(wrs); i++ {
		wc := cq.WC{WRID: wrs[i].WRID, Status: cq.StatusLocQPOpErr, Opcode: cq.OpRecv,
			QPNum: o.q.Num(), VendorErr: uint32(proto.CodeOf(err))}
		o.rcq.c.Push(&wc, false)
	}
}

// controlledQKey is the Q_Key bit that makes a Q_Key a controlled one (IBTA 10.2.4).
const controlledQKey = 0x80000000

// checkQKey refuses a controlled Q_Key (the high-order bit set) to an unprivileged user
// (proto.ErrPermission; Options.Privileged): IBTA 10.2.4 reserves them to privileged
// consumers, since the host's own CM (QP1, Q_Key 0x80010000) is reached with one, and the
// kernel refuses them in ibv_modify_qp without CAP_NET_RAW. A QP that cannot hold one cannot
// send one either: a send WR's controlled Q_Key means the QP's own (IBTA 10.2.5, in the
// engine). set is whether the request sets a Q_Key at all.
func (ss *session) checkQKey(set bool, qkey uint32) error {
	if !set || qkey&controlledQKey == 0 || ss.s.priv(ss.uid) {
		return nil
	}
	ss.s.refusedPriv.Add(1)
	return fmt.Errorf("%w: controlled Q_Key 0x%08x (high-order bit set, IBTA 10.2.4) for user %d: reserved to privileged users",
		proto.ErrPermission, qkey, ss.uid)
}

// badPost counts an asynchronous post the daemon could not take and logs it (rate-limited:
// a client can send such records at will).
func (ss *session) badPost(msg string, args ...any) {
	ss.s.badPosts.Add(1)
	ss.s.limitedLog("badpost", msg, append([]any{"client", ss.id}, args...)...)
}

// sendWCOpcode is the completion opcode of a send WR opcode (ibv_wc_opcode).
func sendWCOpcode(op qp.WROpcode) cq.Opcode {
	switch op {
	case qp.WRRDMAWrite, qp.WRRDMAWriteWithImm:
		return cq.OpRDMAWrite
	case qp.WRRDMARead:
		return cq.OpRDMARead
	case qp.WRAtomicCmpAndSwp:
		return cq.OpCompSwap
	case qp.WRAtomicFetchAndAdd:
		return cq.OpFetchAdd
	case qp.WRLocalInv:
		return cq.OpLocalInv
	case qp.WRBindMW:
		return cq.OpBindMW
	case qp.WRAtomicWrite:
		return cq.OpAtomicWrite
	case qp.WRFlush:
		return cq.OpFlush
	}
	return cq.OpSend
}

func (ss *session) postRecv(op wire.Op, b []byte) {
	_, h, n, rest, err := proto.PostHeader(b)
	if err != nil {
		ss.wbuf = proto.AppendError(ss.wbuf, op, err, 0)
		return
	}
	wrs, err := ss.rdec.Decode(rest, n)
	if err != nil {
		ss.wbuf = proto.AppendError(ss.wbuf, op, err, 0)
		return
	}
	var posted int
	if op == wire.OpPostRecv {
		var o *qpObj
		if o, err = get[*qpObj](ss, h); err == nil {
			posted, err = o.q.PostRecv(wrs)
		}
	} else {
		var o *srqObj
		if o, err = get[*srqObj](ss, h); err == nil {
			posted, err = o.s.Post(wrs)
		}
	}
	if err != nil {
		ss.wbuf = proto.AppendError(ss.wbuf, op, err, posted)
		return
	}
	ss.wbuf = proto.AppendPosted(ss.wbuf, op, posted)
}
