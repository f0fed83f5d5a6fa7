package daemon

import (
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
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

	hello bool // HELLO answered: other requests are served

	// The client's /proc/self/mem (SR_OP_ATTACH_MEM, mem.go), for SR_MR_PROCESS MRs.
	memFD  int
	hasMem bool

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

	cm *sessionCM // rdma_cm event channels and queues (cm.go); guarded by mu

	rbuf, wbuf, oob []byte
	sdec            proto.SendDecoder
	rdec            proto.RecvDecoder
}

func newSession(s *Server, c *net.UnixConn, id uint64) *session {
	ss := &session{s: s, conn: c, id: id, next: 1, objs: map[proto.Handle]any{}, memFD: -1,
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
	h, _, _ := proto.ParseHdr(ss.rbuf[:n])
	ss.wbuf = proto.AppendError(ss.wbuf, h.Op, ss.refuse, 0)
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
		if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || n < proto.HdrSize || n > proto.MaxMsg {
			var op wire.Op
			if n >= 2 {
				op = wire.Op(ss.rbuf[0]) | wire.Op(ss.rbuf[1])<<8
			}
			ss.wbuf = proto.AppendError(ss.wbuf, op, fmt.Errorf("%w: truncated message", proto.ErrProtocol), 0)
		} else {
			h, _, _ := proto.ParseHdr(ss.rbuf[:n])
			if h.Op == wire.OpPostSendAsync || h.Op == wire.OpPostRecvAsync {
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

// req decodes a request body into a T (ErrProtocol if it is shorter).
func req[T wire.Struct](body []byte) (T, error) {
	var v T
	if _, ok := wire.Read(body, &v); !ok {
		return v, fmt.Errorf("%w: %d-byte body, want %d", proto.ErrProtocol, len(body), wire.Size[T]())
	}
	return v, nil
}

// reply appends a response body to the session's response.
func reply[T wire.Struct](ss *session, v *T) { ss.wbuf = wire.Append(ss.wbuf, v) }

// handle serves one request (b starts with its header), leaving the response
// in wbuf; it takes the fds it keeps out of *fds and returns the fds to send
// (SCM_RIGHTS).
func (ss *session) handle(b []byte, fds *[]int) (rights []byte) {
	defer ss.unparkDue() // after postMu is released: the drain below may satisfy a refill
	ss.postMu.Lock()
	defer ss.postMu.Unlock()
	ss.drainLocked()
	h, body, _ := proto.ParseHdr(b)
	op := h.Op
	switch op {
	case wire.OpPostSend, wire.OpPostRecv, wire.OpPostSRQRecv, wire.OpPostSendAsync, wire.OpPostRecvAsync:
		ss.s.socketPosts.Add(1)
	}
	if !ss.hello && op != wire.OpHello {
		if op != wire.OpPostSendAsync && op != wire.OpPostRecvAsync {
			ss.wbuf = proto.AppendError(ss.wbuf, op, fmt.Errorf("%w: HELLO first", proto.ErrProtocol), 0)
		}
		return nil
	}
	switch op {
	case wire.OpPostSend:
		ss.postSend(b)
		return nil
	case wire.OpPostRecv, wire.OpPostSRQRecv:
		ss.postRecv(op, b)
		return nil
	case wire.OpPostSendAsync:
		ss.postSendAsync(b)
		return nil
	case wire.OpPostRecvAsync:
		ss.postRecvAsync(b)
		return nil
	}
	ss.wbuf = proto.AppendOK(ss.wbuf, op)
	var err error
	switch op {
	case wire.OpHello:
		err = ss.helloOp(body)
	case wire.OpOpenRings:
		var r wire.OpenRingsResp
		var fdsOut []int
		if r, fdsOut, err = ss.openPostRing(); err == nil {
			reply(ss, &r)
			rights = proto.Rights(fdsOut...)
		}
	case wire.OpAttachMem:
		err = ss.attachMem(fds)
	case wire.OpQueryDevice:
		a := ss.s.dev.Attr()
		r := proto.DeviceAttrToWire(&a)
		reply(ss, &r)
	case wire.OpQueryPort:
		var r wire.PortReq
		if r, err = req[wire.PortReq](body); err == nil {
			if err = checkPort(r.Port); err == nil {
				a := ss.s.verb.PortAttr()
				w := proto.PortAttrToWire(&a)
				reply(ss, &w)
			}
		}
	case wire.OpQueryGIDs:
		var r wire.PortReq
		if r, err = req[wire.PortReq](body); err == nil {
			if err = checkPort(r.Port); err == nil {
				ents := ss.s.gidEntries()
				n := wire.GIDsResp{Count: uint32(len(ents))}
				reply(ss, &n)
				for i := range ents {
					reply(ss, &ents[i])
				}
			}
		}
	case wire.OpQueryPKey:
		var r wire.PKeyReq
		if r, err = req[wire.PKeyReq](body); err == nil {
			if err = checkPort(r.Port); err == nil && r.Index != 0 {
				err = fmt.Errorf("%w: P_Key index %d (the table has one entry)", proto.ErrNoObject, r.Index)
			}
			if err == nil {
				reply(ss, &wire.PKeyResp{PKey: 0xFFFF})
			}
		}
	case wire.OpStats:
		s := ss.s.dev.Stats()
		w := proto.StatsToWire(&s)
		reply(ss, &w)
	case wire.OpDebug:
		d := ss.debug()
		w := proto.DebugToWire(&d)
		reply(ss, &w)
	case wire.OpAllocPD:
		var h proto.Handle
		if h, err = ss.allocPD(); err == nil {
			reply(ss, &wire.Handle{Handle: uint32(h)})
		}
	case wire.OpDeallocPD:
		var r wire.Handle
		if r, err = req[wire.Handle](body); err == nil {
			err = ss.deallocPD(proto.Handle(r.Handle))
		}
	case wire.OpRegMR, wire.OpReregMR, wire.OpDeregMR:
		err = ss.handleMR(op, body, fds)
	case wire.OpCreateCQ, wire.OpResizeCQ, wire.OpModifyCQ, wire.OpDestroyCQ:
		rights, err = ss.handleCQ(op, body)
	case wire.OpCreateSRQ:
		var r wire.CreateSRQReq
		if r, err = req[wire.CreateSRQReq](body); err == nil {
			var resp wire.CreateSRQResp
			if resp, err = ss.createSRQ(r); err == nil {
				reply(ss, &resp)
			}
		}
	case wire.OpModifySRQ:
		var r wire.ModifySRQReq
		if r, err = req[wire.ModifySRQReq](body); err == nil {
			var o *srqObj
			if o, err = get[*srqObj](ss, proto.Handle(r.Handle)); err == nil {
				err = o.s.Modify(qp.SRQAttr{MaxWR: int(min(r.MaxWR, 1<<30)), SRQLimit: int(min(r.SRQLimit, 1<<30))},
					qp.SRQAttrMask(r.AttrMask))
			}
		}
	case wire.OpQuerySRQ:
		var r wire.Handle
		if r, err = req[wire.Handle](body); err == nil {
			var o *srqObj
			if o, err = get[*srqObj](ss, proto.Handle(r.Handle)); err == nil {
				a := o.s.Query()
				reply(ss, &wire.SRQAttr{MaxWR: uint32(a.MaxWR), MaxSGE: uint32(a.MaxSGE), SRQLimit: uint32(a.SRQLimit)})
			}
		}
	case wire.OpDestroySRQ:
		var r wire.Handle
		if r, err = req[wire.Handle](body); err == nil {
			err = ss.destroySRQ(proto.Handle(r.Handle))
		}
	case wire.OpCreateQP:
		var r wire.CreateQPReq
		if r, err = req[wire.CreateQPReq](body); err == nil {
			var resp wire.CreateQPResp
			if resp, err = ss.createQP(r); err == nil {
				reply(ss, &resp)
			}
		}
	case wire.OpModifyQP:
		var r wire.ModifyQPReq
		if r, err = req[wire.ModifyQPReq](body); err == nil {
			var o *qpObj
			if o, err = get[*qpObj](ss, proto.Handle(r.Handle)); err == nil {
				a := proto.QPAttrFromWire(&r.Attr)
				if err = ss.checkQKey(qp.AttrMask(r.AttrMask)&qp.AttrQKey != 0, a.QKey); err == nil {
					err = o.q.Modify(&a, qp.AttrMask(r.AttrMask))
				}
			}
		}
	case wire.OpQueryQP:
		var r wire.QueryQPReq
		if r, err = req[wire.QueryQPReq](body); err == nil {
			var o *qpObj
			if o, err = get[*qpObj](ss, proto.Handle(r.Handle)); err == nil {
				a := o.q.Query()
				a.State = o.q.State()
				w := proto.QPAttrToWire(&a)
				reply(ss, &w)
			}
		}
	case wire.OpDestroyQP:
		var r wire.Handle
		if r, err = req[wire.Handle](body); err == nil {
			err = ss.destroyQP(proto.Handle(r.Handle))
		}
	case wire.OpAllocMW:
		var r wire.AllocMWReq
		if r, err = req[wire.AllocMWReq](body); err == nil {
			var resp wire.AllocMWResp
			if resp, err = ss.allocMW(r); err == nil {
				reply(ss, &resp)
			}
		}
	case wire.OpDeallocMW:
		var r wire.Handle
		if r, err = req[wire.Handle](body); err == nil {
			err = ss.deallocMW(proto.Handle(r.Handle))
		}
	case wire.OpCreateAH:
		var r wire.CreateAHReq
		if r, err = req[wire.CreateAHReq](body); err == nil {
			var pd *pdObj
			if pd, err = get[*pdObj](ss, proto.Handle(r.PD)); err == nil {
				var ah *qp.AH
				if ah, err = ss.s.dev.CreateAH(pd.pd, proto.AHAttrFromWire(&r.Attr)); err == nil {
					reply(ss, &wire.CreateAHResp{Attr: proto.AHAttrToWire(&ah.AHAttr), SGID: proto.AddrToGID(ah.SGID)})
				}
			}
		}
	default:
		if op >= wire.OpCMCreateChannel && op <= wire.OpCMEstablish {
			rights, err = ss.handleCM(op, body)
			break
		}
		err = fmt.Errorf("%w: op %d", proto.ErrUnsupported, op)
	}
	if err != nil {
		ss.wbuf = proto.AppendError(ss.wbuf, op, err, 0)
		return nil
	}
	return rights
}

// helloOp is HELLO: the version check, then the device's identity.
func (ss *session) helloOp(body []byte) error {
	r, err := req[wire.HelloReq](body)
	if err != nil {
		return err
	}
	if r.Magic != wire.Magic || r.Version != wire.Version {
		return fmt.Errorf("%w: client magic %#x version %d, daemon %#x version %d", proto.ErrVersion,
			r.Magic, r.Version, uint32(wire.Magic), wire.Version)
	}
	ss.hello = true
	a := ss.s.dev.Attr()
	resp := wire.HelloResp{Magic: wire.Magic, Version: wire.Version, MaxMsg: wire.MaxMsg, PhysPortCnt: 1,
		NodeGUID: a.NodeGUID, SysImageGUID: a.SysImageGUID}
	wire.CString(resp.DevName[:], ss.s.verb.Name())
	reply(ss, &resp)
	return nil
}

func checkPort(p uint32) error {
	if p != 1 {
		return fmt.Errorf("%w: port %d (the device has port 1)", proto.ErrNoObject, p)
	}
	return nil
}

// debug is the server's counts plus the client's own objects.
func (ss *session) debug() proto.Debug {
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
		case *cmChanObj:
			d.Mine.CMChannels++
		}
	}
	ss.mu.Unlock()
	d.UID = ss.uid
	if ss.ten != nil {
		d.User = ss.s.acct.usedBy(ss.ten).proto()
	}
	d.UserLimit = ss.s.acct.limit.proto()
	return d
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
	return ss.addLocked(o)
}

func (ss *session) addLocked(o any) proto.Handle {
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
