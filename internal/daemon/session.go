// Long file: a session's request dispatch and its object handlers (PD, MR, SRQ, QP, posts)
// share its handle table, its lock and the per-user accounting, and cleanup at the end undoes
// the creates in the reverse order of the handlers above it. Split the handlers by object
// kind when it grows further.

package daemon

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/roce"
)

// session is one connected client. Its goroutine (run) serves requests one
// at a time; objs is also read by Shutdown and the metrics handler, so it
// is guarded by mu.
type session struct {
	s    *Server
	conn *net.UnixConn
	id   uint64
	pid  int32
	uid  uint32
	// ten is the account of the client's user (limits.go); base the cost of the connection
	// itself, charged at accept; refuse, if set, is why the connection was refused (over a
	// limit): its first request is answered with it and the connection closed.
	ten    *tenant
	base   usage
	refuse error

	mu   sync.Mutex
	next proto.Handle
	objs map[proto.Handle]any

	// postMu serializes request handling with the post ring's drainer
	// (decoders, object use); every request first drains the ring, so
	// posts keep the order the client made them in.
	postMu sync.Mutex
	ring   *postRing
	evMu   sync.Mutex
	ev     *evRing

	// The engine's refill requests (postring.go): parkMu guards parkRing (the open
	// ring, nil once it stops), parked (QPs holding packets until the ring is drained
	// up to parkAt, the tail published when they asked). It is taken on the device's
	// receive goroutine and only ever held briefly. unparkMu serializes unparkDue,
	// which owns unparking.
	parkMu    sync.Mutex
	parkRing  *postRing
	parked    []*roce.QP
	parkAt    uint64
	unparkMu  sync.Mutex
	unparking []*roce.QP

	cm *sessionCM // rdma_cm IDs' event channel (cm.go); guarded by mu

	rbuf, wbuf, oob []byte
	sdec            proto.SendDecoder
	rdec            proto.RecvDecoder
}

type pdObj struct {
	pd   *mr.PD
	refs int // MRs, QPs, AHs using it
}

type mrObj struct {
	m       *mr.MR
	pd      *pdObj
	mapping []byte
	cost    usage
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

func newSession(s *Server, c *net.UnixConn, id uint64) *session {
	ss := &session{s: s, conn: c, id: id, next: 1, objs: map[proto.Handle]any{},
		rbuf: make([]byte, proto.MaxMsg+1), oob: make([]byte, unix.CmsgSpace(4*8))}
	ss.uid = nobody // no credentials: the unprivileged account of its own
	if rc, err := c.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) {
			if u, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
				ss.pid, ss.uid = u.Pid, u.Uid
			}
		})
	}
	ss.ten = s.acct.user(ss.uid)
	cost := usage{resConns: 1, resFDs: 1}
	if err := s.acct.charge(ss.ten, cost, false); err != nil {
		ss.refuse = err
	} else {
		ss.base = cost
	}
	return ss
}

// nobody is the uid of a peer whose credentials cannot be read (the overflow uid).
const nobody = 65534

// charge charges cost to the client's user (limits.go): proto.ErrQuota over a limit.
func (ss *session) charge(cost usage) error { return ss.s.acct.charge(ss.ten, cost, false) }

// release gives back a cost charge took.
func (ss *session) release(cost usage) { ss.s.acct.release(ss.ten, cost) }

// refused answers the first request of a connection refused over a limit with the reason,
// then ends the session (a client that sends nothing is dropped after refuseWait).
func (ss *session) refused() {
	ss.s.limitedLog("refused", "connection refused", "client", ss.id, "pid", ss.pid, "uid", ss.uid, "err", ss.refuse)
	ss.conn.SetReadDeadline(time.Now().Add(refuseWait))
	n, oobn, _, _, err := ss.conn.ReadMsgUnix(ss.rbuf, ss.oob)
	if oobn > 0 {
		proto.CloseFDs(proto.ParseRights(ss.oob[:oobn]))
	}
	if err != nil || n == 0 {
		return
	}
	ss.errResp(ss.refuse, 0)
	ss.conn.WriteMsgUnix(ss.wbuf, nil, nil)
}

// refuseWait bounds how long a refused connection waits for its first request.
const refuseWait = time.Second

func (ss *session) run() {
	defer ss.s.acct.leave(ss.ten)
	if ss.refuse != nil {
		ss.refused()
		ss.conn.Close()
		ss.s.remove(ss)
		return
	}
	ss.s.limitedLogLevel("conn", slog.LevelInfo, connLogBurst, "client connected", "client", ss.id, "pid", ss.pid, "uid", ss.uid)
	defer func() {
		closing, by := ss.s.shuttingDown()
		ss.stopRing(closing)
		if closing {
			ss.flush()
			ss.waitDrained(by)
		}
		ss.cleanup()
		ss.release(ss.base)
		ss.s.remove(ss)
		ss.s.limitedLogLevel("conn", slog.LevelInfo, connLogBurst, "client disconnected", "client", ss.id, "pid", ss.pid)
	}()
	for {
		n, oobn, flags, _, err := ss.conn.ReadMsgUnix(ss.rbuf, ss.oob)
		if err != nil {
			return
		}
		var fds []int
		if oobn > 0 {
			fds = proto.ParseRights(ss.oob[:oobn])
		}
		var rights []byte
		if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || n == 0 || n > proto.MaxMsg {
			ss.errResp(fmt.Errorf("%w: truncated message", proto.ErrProtocol), 0)
		} else {
			if op := proto.Op(ss.rbuf[0]); op == proto.OpPostSendAsync || op == proto.OpPostRecvAsync {
				proto.CloseFDs(fds)
				fds = nil
				ss.handle(ss.rbuf[:n], &fds)
				continue // no response
			}
			rights = ss.handle(ss.rbuf[:n], &fds)
		}
		proto.CloseFDs(fds) // whatever the handler did not keep
		_, _, err = ss.conn.WriteMsgUnix(ss.wbuf, rights, nil)
		if len(rights) > 0 {
			proto.CloseFDs(proto.ParseRights(rights)) // sent: the client has its own copies
		}
		if err != nil {
			return
		}
	}
}

// handle serves one request, leaving the response in wbuf; it takes the
// fds it keeps out of *fds and returns the fds to send (SCM_RIGHTS).
func (ss *session) handle(b []byte, fds *[]int) (rights []byte) {
	defer ss.unparkDue() // after postMu is released: the drain below may satisfy a refill
	ss.postMu.Lock()
	defer ss.postMu.Unlock()
	ss.drainLocked()
	op := proto.Op(b[0])
	body := b[1:]
	var out any
	var err error
	switch op {
	case proto.OpPostSend, proto.OpPostRecv, proto.OpPostSRQRecv, proto.OpPostSendAsync, proto.OpPostRecvAsync:
		ss.s.socketPosts.Add(1)
	}
	switch op {
	case proto.OpPostSend:
		ss.postSend(b)
		return nil
	case proto.OpPostRecv, proto.OpPostSRQRecv:
		ss.postRecv(op, b)
		return nil
	case proto.OpPostSendAsync:
		ss.postSendAsync(b)
		return nil
	case proto.OpPostRecvAsync:
		ss.postRecvAsync(b)
		return nil
	case proto.OpHello:
		v := ss.s.verb
		out = proto.Hello{Version: proto.Version, Name: v.Name(), Attr: v.Attr(), PortAttr: v.PortAttr(), GIDs: v.GIDs(),
			Limit: ss.s.acct.limit.proto()}
	case proto.OpStats:
		out = ss.s.dev.Stats()
	case proto.OpDebug:
		d := ss.s.Debug()
		ss.mu.Lock()
		for _, o := range ss.objs {
			switch o.(type) {
			case *pdObj:
				d.Mine.PDs++
			case *mrObj:
				d.Mine.MRs++
			case *cqObj:
				d.Mine.CQs++
			case *srqObj:
				d.Mine.SRQs++
			case *qpObj:
				d.Mine.QPs++
			case *cmIDObj:
				d.Mine.CMIDs++
			}
		}
		ss.mu.Unlock()
		d.UID = ss.uid
		if ss.ten != nil {
			d.User = ss.s.acct.usedBy(ss.ten).proto()
		}
		d.UserLimit = ss.s.acct.limit.proto()
		out = d
	case proto.OpAllocPD:
		out, err = ss.allocPD()
	case proto.OpDeallocPD:
		err = withReq(body, func(r proto.HandleReq) error { return ss.deallocPD(r.H) })
	case proto.OpRegMR:
		var r proto.RegMRReq
		if err = unmarshal(body, &r); err == nil {
			if len(*fds) != 1 {
				err = fmt.Errorf("%w: RegMR needs exactly one memfd", proto.ErrProtocol)
			} else {
				out, err = ss.regMR(r, (*fds)[0])
			}
		}
	case proto.OpDeregMR:
		err = withReq(body, func(r proto.HandleReq) error { return ss.deregMR(r.H) })
	case proto.OpCreateCQ:
		var r proto.CreateCQReq
		if err = unmarshal(body, &r); err == nil {
			var fdsOut []int
			out, fdsOut, err = ss.createCQ(r)
			if err == nil {
				rights = proto.Rights(fdsOut...)
			}
		}
	case proto.OpOpenPostRing:
		var fdsOut []int
		out, fdsOut, err = ss.openPostRing()
		if err == nil {
			rights = proto.Rights(fdsOut...)
		}
	case proto.OpDestroyCQ:
		err = withReq(body, func(r proto.HandleReq) error { return ss.destroyCQ(r.H) })
	case proto.OpModifyCQ:
		var r proto.ModifyCQReq
		if err = unmarshal(body, &r); err == nil {
			var o *cqObj
			if o, err = get[*cqObj](ss, r.H); err == nil {
				err = o.setModeration(r.Mod)
			}
		}
	case proto.OpCreateSRQ:
		var r proto.CreateSRQReq
		if err = unmarshal(body, &r); err == nil {
			out, err = ss.createSRQ(r)
		}
	case proto.OpModifySRQ:
		var r proto.ModifySRQReq
		if err = unmarshal(body, &r); err == nil {
			var o *srqObj
			if o, err = get[*srqObj](ss, r.H); err == nil {
				err = o.s.Modify(r.Attr, r.Mask)
			}
		}
	case proto.OpQuerySRQ:
		var r proto.HandleReq
		if err = unmarshal(body, &r); err == nil {
			var o *srqObj
			if o, err = get[*srqObj](ss, r.H); err == nil {
				out = o.s.Query()
			}
		}
	case proto.OpDestroySRQ:
		err = withReq(body, func(r proto.HandleReq) error { return ss.destroySRQ(r.H) })
	case proto.OpCreateQP:
		var r proto.CreateQPReq
		if err = unmarshal(body, &r); err == nil {
			out, err = ss.createQP(r)
		}
	case proto.OpModifyQP:
		var r proto.ModifyQPReq
		if err = unmarshal(body, &r); err == nil {
			var o *qpObj
			if o, err = get[*qpObj](ss, r.H); err == nil {
				if err = ss.checkQKey(r.Mask&qp.AttrQKey != 0, r.Attr.QKey); err == nil {
					err = o.q.Modify(&r.Attr, r.Mask)
				}
			}
		}
	case proto.OpQueryQP:
		var r proto.HandleReq
		if err = unmarshal(body, &r); err == nil {
			var o *qpObj
			if o, err = get[*qpObj](ss, r.H); err == nil {
				out = proto.QueryQPResp{Attr: o.q.Query(), State: o.q.State()}
			}
		}
	case proto.OpDestroyQP:
		err = withReq(body, func(r proto.HandleReq) error { return ss.destroyQP(r.H) })
	case proto.OpCreateAH:
		var r proto.CreateAHReq
		if err = unmarshal(body, &r); err == nil {
			var pd *pdObj
			if pd, err = get[*pdObj](ss, r.PD); err == nil {
				out, err = ss.s.dev.CreateAH(pd.pd, r.Attr)
			}
		}
	default:
		if op.IsCM() {
			out, err = ss.handleCM(op, body)
			break
		}
		err = fmt.Errorf("%w: unknown op %d", proto.ErrProtocol, op)
	}
	if err != nil {
		ss.errResp(err, 0)
		return nil
	}
	ss.wbuf = append(ss.wbuf[:0], proto.StatusOK)
	if out != nil {
		j, err := json.Marshal(out)
		if err != nil {
			ss.errResp(err, 0)
			return nil
		}
		ss.wbuf = append(ss.wbuf, j...)
	}
	return rights
}

func unmarshal(b []byte, v any) error {
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%w: %v", proto.ErrProtocol, err)
	}
	return nil
}

func withReq(body []byte, f func(proto.HandleReq) error) error {
	var r proto.HandleReq
	if err := unmarshal(body, &r); err != nil {
		return err
	}
	return f(r)
}

func (ss *session) errResp(err error, posted int) {
	j, _ := json.Marshal(proto.ErrorBody{Code: proto.CodeOf(err), Msg: err.Error(), Posted: posted})
	ss.wbuf = append(append(ss.wbuf[:0], proto.StatusErr), j...)
}

// get looks up a handle the session holds, of the wanted type.
func get[T any](ss *session, h proto.Handle) (T, error) {
	ss.mu.Lock()
	o, ok := ss.objs[h].(T)
	ss.mu.Unlock()
	if !ok {
		var zero T
		return zero, fmt.Errorf("%w: handle %d", proto.ErrNoObject, h)
	}
	return o, nil
}

func (ss *session) add(o any) proto.Handle {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for {
		h := ss.next
		ss.next++
		if ss.next == 0 {
			ss.next = 1
		}
		if _, used := ss.objs[h]; !used && h != 0 {
			ss.objs[h] = o
			return h
		}
	}
}

func (ss *session) del(h proto.Handle) {
	ss.mu.Lock()
	delete(ss.objs, h)
	ss.mu.Unlock()
}

func (ss *session) allocPD() (proto.HandleResp, error) {
	if err := ss.charge(one(resPDs)); err != nil {
		return proto.HandleResp{}, err
	}
	pd, err := ss.s.dev.AllocPD()
	if err != nil {
		ss.release(one(resPDs))
		return proto.HandleResp{}, err
	}
	ss.s.nPD.Add(1)
	return proto.HandleResp{H: ss.add(&pdObj{pd: pd})}, nil
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

// regMR maps the client's memfd and registers the view. The memfd stays the caller's (the
// request loop closes every descriptor a request came with; the mapping keeps the memory).
func (ss *session) regMR(r proto.RegMRReq, fd int) (proto.RegMRResp, error) {
	pd, err := get[*pdObj](ss, r.PD)
	if err != nil {
		return proto.RegMRResp{}, err
	}
	span, err := proto.MapSpan(r.Off, r.Len)
	if err != nil {
		return proto.RegMRResp{}, err
	}
	cost := usage{resMRs: 1, resMappings: 1, resMappedBytes: span}
	if err := ss.charge(cost); err != nil {
		return proto.RegMRResp{}, err
	}
	mapping, view, err := proto.MapShared(fd, r.Off, r.Len)
	if err != nil {
		ss.release(cost)
		return proto.RegMRResp{}, err
	}
	m, err := ss.s.dev.RegMR(pd.pd, view, r.IOVA, mr.Access(r.Access))
	if err != nil {
		proto.Unmap(mapping)
		ss.release(cost)
		return proto.RegMRResp{}, err
	}
	pd.refs++
	ss.s.nMR.Add(1)
	ss.s.mapped.Add(int64(len(mapping)))
	h := ss.add(&mrObj{m: m, pd: pd, mapping: mapping, cost: cost})
	return proto.RegMRResp{H: h, LKey: m.LKey(), RKey: m.RKey()}, nil
}

func (ss *session) deregMR(h proto.Handle) error {
	o, err := get[*mrObj](ss, h)
	if err != nil {
		return err
	}
	if err := ss.releaseMR(o); err != nil {
		return err
	}
	ss.del(h)
	return nil
}

// releaseMR deregisters (waiting for in-flight users) and only then unmaps:
// after a successful Dereg no data path touches the memory.
func (ss *session) releaseMR(o *mrObj) error {
	if err := o.m.Dereg(); err != nil {
		return err
	}
	proto.Unmap(o.mapping)
	ss.s.mapped.Add(-int64(len(o.mapping)))
	o.pd.refs--
	ss.s.nMR.Add(-1)
	ss.release(o.cost)
	return nil
}

func (ss *session) createSRQ(r proto.CreateSRQReq) (proto.HandleResp, error) {
	a := ss.s.dev.Attr()
	if r.MaxWR < 1 || r.MaxWR > a.MaxSRQWR || r.MaxSGE < 1 || r.MaxSGE > a.MaxSRQSGE {
		return proto.HandleResp{}, qp.ErrSRQArg // (before sizing the charge from them)
	}
	cost := usage{resSRQs: 1, resEngineBytes: qp.SRQFootprint(r.MaxWR, r.MaxSGE)}
	if err := ss.charge(cost); err != nil {
		return proto.HandleResp{}, err
	}
	s, err := ss.s.dev.CreateSRQ(qp.SRQOptions{MaxWR: r.MaxWR, MaxSGE: r.MaxSGE, Limit: r.Limit})
	if err != nil {
		ss.release(cost)
		return proto.HandleResp{}, err
	}
	ss.s.nSRQ.Add(1)
	h := ss.add(&srqObj{s: s, cost: cost})
	ss.s.own(s, owner{ss, h, proto.EventOnSRQ})
	return proto.HandleResp{H: h}, nil
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

func (ss *session) createQP(r proto.CreateQPReq) (proto.CreateQPResp, error) {
	pd, err := get[*pdObj](ss, r.PD)
	if err != nil {
		return proto.CreateQPResp{}, err
	}
	scq, err := get[*cqObj](ss, r.SendCQ)
	if err != nil {
		return proto.CreateQPResp{}, err
	}
	rcq, err := get[*cqObj](ss, r.RecvCQ)
	if err != nil {
		return proto.CreateQPResp{}, err
	}
	var srq *srqObj
	in := roce.QPInit{Type: r.Type, PD: pd.pd, SendCQ: scq.c, RecvCQ: rcq.c, Cap: r.Cap, SigAll: r.SigAll}
	if r.SRQ == 0 {
		in.RecvRefill = ss.refill // receives posted through the ring are visible at once (postring.go)
	} else {
		if srq, err = get[*srqObj](ss, r.SRQ); err != nil {
			return proto.CreateQPResp{}, err
		}
		in.SRQ = srq.s
	}
	if r.Type == qp.TypeGSI {
		// The GSI QP (QPN 1) is the device's, not a client's.
		return proto.CreateQPResp{}, fmt.Errorf("%w: GSI QP", proto.ErrUnsupported)
	}
	a, c := ss.s.dev.Attr(), r.Cap
	if c.MaxSendWR > uint32(a.MaxQPWR) || c.MaxRecvWR > uint32(a.MaxQPWR) || c.MaxSendSGE > uint32(a.MaxSGE) ||
		c.MaxRecvSGE > uint32(a.MaxSGE) || c.MaxInlineData > uint32(a.MaxInlineData) {
		return proto.CreateQPResp{}, roce.ErrLimit // (before sizing the charge from them)
	}
	cost := usage{resQPs: 1, resEngineBytes: qp.Footprint(c, srq != nil)}
	if err := ss.charge(cost); err != nil {
		return proto.CreateQPResp{}, err
	}
	q, err := ss.s.dev.CreateQP(in)
	if err != nil {
		ss.release(cost)
		return proto.CreateQPResp{}, err
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
	return proto.CreateQPResp{H: h, QPN: q.Num()}, nil
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
	h, n, rest, err := proto.PostHeader(b)
	if err != nil {
		ss.errResp(err, 0)
		return
	}
	o, err := get[*qpObj](ss, h)
	if err != nil {
		ss.errResp(err, 0)
		return
	}
	wrs, err := ss.sdec.Decode(rest, n)
	if err != nil {
		ss.errResp(err, 0)
		return
	}
	posted, err := o.q.PostSend(wrs)
	if err != nil {
		ss.errResp(err, posted)
		return
	}
	ss.wbuf = proto.AppendPosted(ss.wbuf, posted)
}

// postSendAsync posts without a response. A WR the engine refuses (the
// client's checks should have prevented it) completes with LOC_QP_OP_ERR,
// as does every later WR of the request, so the client still gets exactly
// one completion per WR.
// It returns the bytes the posted WRs send (a drain turn's budget counts them).
func (ss *session) postSendAsync(b []byte) (bytes int64) {
	h, n, rest, err := proto.PostHeader(b)
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
		for _, s := range wrs[i].SGL {
			bytes += int64(s.Length)
		}
	}
	return bytes
}

// postRecvAsync is postSendAsync for receive WRs.
func (ss *session) postRecvAsync(b []byte) {
	h, n, rest, err := proto.PostHeader(b)
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
	}
	return cq.OpSend
}

func (ss *session) postRecv(op proto.Op, b []byte) {
	h, n, rest, err := proto.PostHeader(b)
	if err != nil {
		ss.errResp(err, 0)
		return
	}
	wrs, err := ss.rdec.Decode(rest, n)
	if err != nil {
		ss.errResp(err, 0)
		return
	}
	var posted int
	if op == proto.OpPostRecv {
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
		ss.errResp(err, posted)
		return
	}
	ss.wbuf = proto.AppendPosted(ss.wbuf, posted)
}

// snapshot returns the session's objects by kind (for flush, cleanup, metrics).
func (ss *session) snapshot() (qps []*qpObj, cqs []*cqObj, srqs []*srqObj, mrs []*mrObj, pds []*pdObj) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for _, o := range ss.objs {
		switch x := o.(type) {
		case *qpObj:
			qps = append(qps, x)
		case *cqObj:
			cqs = append(cqs, x)
		case *srqObj:
			srqs = append(srqs, x)
		case *mrObj:
			mrs = append(mrs, x)
		case *pdObj:
			pds = append(pds, x)
		}
	}
	return
}

// flush moves every QP of the session to ERR: the engine completes their
// outstanding work requests with WR_FLUSH_ERR (IBTA 10.3.1).
func (ss *session) flush() {
	qps, _, _, _, _ := ss.snapshot()
	for _, o := range qps {
		_ = o.q.Modify(&qp.Attr{State: qp.StateErr}, qp.AttrState)
	}
}

// waitDrained waits until every CQ's pending completions reached its ring
// (or the ring is full, or the deadline passes).
func (ss *session) waitDrained(deadline time.Time) {
	_, cqs, _, _, _ := ss.snapshot()
	for _, c := range cqs {
		for c.c.Len() > 0 && time.Now().Before(deadline) {
			if c.ring.Space(c.tail.Load()) == 0 {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// cleanup releases everything the client created: QPs to ERR and destroyed,
// SRQs and CQs destroyed (ring unmapped, eventfds closed), MRs deregistered
// and their memory unmapped, PDs deallocated.
func (ss *session) cleanup() {
	if ss.conn != nil {
		ss.conn.Close()
	}
	ss.stopRing(false)
	ss.cleanupCM() // before the QPs: connections are DREQ'd, not just dropped
	qps, cqs, srqs, mrs, pds := ss.snapshot()
	for _, o := range qps {
		_ = o.q.Modify(&qp.Attr{State: qp.StateErr}, qp.AttrState)
		ss.releaseQP(o)
	}
	for _, o := range srqs {
		ss.s.verb.DestroySRQ(o.s)
		ss.s.disown(o.s)
		ss.s.nSRQ.Add(-1)
		ss.release(o.cost)
	}
	for _, o := range cqs {
		ss.releaseCQ(o)
	}
	for _, o := range mrs {
		if err := ss.releaseMR(o); err != nil {
			// Still in use after the bounded wait: keep the mapping (a leak
			// is safe, unmapping memory the engine touches is not).
			ss.s.log.Error("MR dereg failed; memory kept mapped", "client", ss.id, "err", err)
		}
	}
	for _, o := range pds {
		if err := o.pd.Dealloc(); err != nil {
			ss.s.log.Error("PD dealloc failed", "client", ss.id, "err", err)
			continue
		}
		ss.s.nPD.Add(-1)
		ss.release(one(resPDs))
	}
	ss.mu.Lock()
	ss.objs = map[proto.Handle]any{}
	ss.mu.Unlock()
}
