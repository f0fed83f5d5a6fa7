package daemon

// rdma_cm through the daemon (docs/daemon-protocol.md, "rdma_cm"): each
// session's CM IDs are pkg/rdmacm IDs on the daemon's device, kept in the
// session's handle table like its verbs objects, so a handle of another
// session names nothing. rdmacm's port table is the device's, so a port one
// session binds or listens on is refused to every other (ErrAddrInUse). QPs
// are bound by handle (the session's own QPs only).
//
// Events: every ID of the session delivers into one rdmacm.EventChannel; its
// push hook (on the CM's goroutine) converts each event at once — a
// CONNECT_REQUEST's new ID gets its handle then — and queues it on the
// client's event channel the ID belongs to (CM_CREATE_CHANNEL), writing that
// channel's eventfd; CM_GET_EVENTS takes them. When the session ends, every
// ID is destroyed (connections DREQ'd, pending requests rejected, listens
// and ports freed), and so are the IDs of requests arriving afterwards.

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/softroce/softroce/internal/cm"
	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/rdmacm"
)

// sessionCM is a session's rdma_cm state (created by its first CM request).
type sessionCM struct {
	src *rdmacm.EventChannel // every ID's events, converted by push

	mu     sync.Mutex // closed, and every channel's queue
	closed bool
}

// cmChanObj is a client event channel (rdma_create_event_channel).
type cmChanObj struct {
	h   proto.Handle
	fd  int        // the daemon's copy of the channel's eventfd
	q   []cmQueued // events not yet fetched (sessionCM.mu)
	ids int        // IDs on this channel (sessionCM.mu)
}

type cmQueued struct {
	ev  wire.CMEvent
	obj *cmIDObj
}

// cmIDObj is a CM ID in the session's handle table.
type cmIDObj struct {
	id   *rdmacm.ID
	h    proto.Handle
	ch   *cmChanObj // sessionCM.mu
	qp   *qpObj     // bound with CM_SET_QP
	qpH  proto.Handle
	dead bool // destroyed (sessionCM.mu): its events are dropped
	// listening: Listen succeeded (counted in Server.nCMListen until the ID is destroyed;
	// session goroutine only).
	listening bool
}

// cmIDCost is what a CM ID costs its user; a channel costs its eventfd.
var (
	cmIDCost   = one(resCMIDs)
	cmChanCost = one(resFDs)
)

// cmState returns the session's CM state, creating it.
func (ss *session) cmState() *sessionCM {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.cm == nil {
		scm := &sessionCM{}
		scm.src = rdmacm.NewEventChannelFunc(func() { ss.cmPushed(scm) })
		ss.cm = scm
	}
	return ss.cm
}

// cmPushed runs after each event is queued on the session's source channel
// (the CM's goroutine; never blocks): it converts the queued events and
// hands each to its client channel, or, once the session is gone, destroys
// what they brought (a late CONNECT_REQUEST's new ID).
func (ss *session) cmPushed(scm *sessionCM) {
	var refuse []*rdmacm.ID // requests no one takes: destroyed (REJ / SIDR_REP reject) outside the lock
	scm.mu.Lock()
	for {
		e, ok := scm.src.TryGet()
		if !ok {
			break
		}
		if scm.closed {
			if e.Type == rdmacm.EventConnectRequest {
				refuse = append(refuse, e.ID)
			}
			continue
		}
		if !ss.cmRoute(e) {
			refuse = append(refuse, e.ID)
		}
	}
	scm.mu.Unlock()
	for _, id := range refuse {
		_ = id.Destroy()
	}
}

// cmRoute converts one event and queues it on its ID's channel (scm.mu
// held); false for a CONNECT_REQUEST whose listener is gone (the caller
// destroys the new ID).
func (ss *session) cmRoute(e rdmacm.Event) bool {
	var ce wire.CMEvent
	if e.Type == rdmacm.EventConnectRequest {
		lo, _ := e.Listen.Context.(*cmIDObj)
		if lo == nil || lo.dead {
			return false
		}
		child := &cmIDObj{id: e.ID, ch: lo.ch}
		e.ID.Context = child
		child.h = ss.add(child)
		lo.ch.ids++
		ss.s.nCMID.Add(1)
		ss.s.acct.charge(ss.ten, cmIDCost, true) // counted, never refused (the peer made it)
		ce.ListenID = uint32(lo.h)
		ce.Local, ce.Remote = proto.AddrPortToWire(e.ID.LocalAddr()), proto.AddrPortToWire(e.ID.RemoteAddr())
		r := e.ID.Route()
		ce.Route = proto.RouteToWire(&r)
	}
	o, _ := e.ID.Context.(*cmIDObj)
	if o == nil || o.dead || o.id != e.ID {
		return true
	}
	ce.Event, ce.ID = uint32(e.Type), uint32(o.h)
	var err error
	if ce.Param, err = proto.ConnParamToWire(&e.Param); err != nil {
		ce.Param.PrivateDataLen = uint16(copy(ce.Param.PrivateData[:], e.Param.PrivateData))
	}
	if e.Status != nil {
		var rj *rdmacm.RejectError
		if errors.As(e.Status, &rj) {
			ce.Status = int32(rj.Reason)
		} else {
			ce.Status = -int32(proto.ErrnoOf(e.Status))
			ce.Code = uint32(proto.CodeOf(e.Status))
		}
	}
	if e.Type == rdmacm.EventEstablished && e.UD.AH != nil {
		ce.Flags |= wire.CMEventUD
		ce.Param.QPNum, ce.Param.QKey = e.UD.QPN, e.UD.QKey
		ce.AHAttr = proto.AHAttrToWire(&e.UD.AH.AHAttr)
	}
	o.ch.q = append(o.ch.q, cmQueued{ev: ce, obj: o})
	proto.Signal(o.ch.fd)
	return true
}

func cmID(ss *session, h uint32) (*cmIDObj, error) { return get[*cmIDObj](ss, proto.Handle(h)) }

func timeoutMS(ms uint32) time.Duration { return time.Duration(ms) * time.Millisecond }

// handleCM serves an rdma_cm request (session goroutine, postMu held); a
// response body goes into ss.wbuf, fds to send are returned.
func (ss *session) handleCM(op wire.Op, body []byte) ([]byte, error) {
	scm := ss.cmState()
	switch op {
	case wire.OpCMCreateChannel:
		return ss.cmCreateChannel()
	case wire.OpCMDestroyChannel:
		r, err := req[wire.Handle](body)
		if err != nil {
			return nil, err
		}
		c, err := get[*cmChanObj](ss, proto.Handle(r.Handle))
		if err != nil {
			return nil, err
		}
		scm.mu.Lock()
		busy := c.ids
		scm.mu.Unlock()
		if busy > 0 {
			return nil, fmt.Errorf("%w: event channel has %d IDs", mr.ErrBusy, busy)
		}
		ss.del(c.h)
		proto.CloseFD(c.fd)
		ss.s.nCMChan.Add(-1)
		ss.release(cmChanCost)
		return nil, nil
	case wire.OpCMCreateID:
		r, err := req[wire.CMCreateIDReq](body)
		if err != nil {
			return nil, err
		}
		c, err := get[*cmChanObj](ss, proto.Handle(r.Channel))
		if err != nil {
			return nil, err
		}
		ps := cm.PortSpace(r.PortSpace)
		switch qp.Type(r.QPType) {
		case 0:
		case qp.TypeRC, qp.TypeUC:
			if ps == cm.PSUDP {
				return nil, fmt.Errorf("%w: QP type %d in the UDP port space", rdmacm.ErrInvalidArg, r.QPType)
			}
		case qp.TypeUD:
			if ps != cm.PSUDP {
				return nil, fmt.Errorf("%w: UD in port space %#x", rdmacm.ErrInvalidArg, r.PortSpace)
			}
		default:
			return nil, fmt.Errorf("%w: QP type %d", rdmacm.ErrInvalidArg, r.QPType)
		}
		if err := ss.charge(cmIDCost); err != nil {
			return nil, err
		}
		id, err := rdmacm.CreateID(scm.src, rdmacm.IDOptions{Device: ss.s.dev, PortSpace: ps})
		if err != nil {
			ss.release(cmIDCost)
			return nil, err
		}
		o := &cmIDObj{id: id, ch: c}
		id.Context = o
		scm.mu.Lock()
		c.ids++
		scm.mu.Unlock()
		o.h = ss.add(o)
		ss.s.nCMID.Add(1)
		reply(ss, &wire.Handle{Handle: uint32(o.h)})
		return nil, nil
	case wire.OpCMGetEvents:
		r, err := req[wire.CMGetEventsReq](body)
		if err != nil {
			return nil, err
		}
		c, err := get[*cmChanObj](ss, proto.Handle(r.Channel))
		if err != nil {
			return nil, err
		}
		ss.cmEvents(scm, c, int(r.Max))
		return nil, nil
	}
	// every other request names an ID of the client first
	var hr wire.Handle
	if _, ok := wire.Read(body, &hr); !ok {
		return nil, fmt.Errorf("%w: %d-byte body", proto.ErrProtocol, len(body))
	}
	o, err := cmID(ss, hr.Handle)
	if err != nil {
		return nil, err
	}
	id := o.id
	switch op {
	case wire.OpCMMigrateID:
		r, err := req[wire.CMMigrateReq](body)
		if err != nil {
			return nil, err
		}
		c, err := get[*cmChanObj](ss, proto.Handle(r.Channel))
		if err != nil {
			return nil, err
		}
		ss.cmMigrate(scm, o, c)
		return nil, nil
	case wire.OpCMDestroyID:
		ss.destroyCMID(scm, o)
		return nil, nil
	case wire.OpCMBindAddr:
		r, err := req[wire.CMBindReq](body)
		if err != nil {
			return nil, err
		}
		if err := id.BindAddr(proto.AddrPortFromWire(&r.Addr)); err != nil {
			return nil, err
		}
	case wire.OpCMResolveAddr:
		r, err := req[wire.CMResolveAddrReq](body)
		if err != nil {
			return nil, err
		}
		if err := id.ResolveAddr(proto.AddrFromWire(&r.Src), proto.AddrPortFromWire(&r.Dst), timeoutMS(r.TimeoutMS)); err != nil {
			return nil, err
		}
	case wire.OpCMResolveRoute:
		r, err := req[wire.CMResolveRouteReq](body)
		if err != nil {
			return nil, err
		}
		if err := id.ResolveRoute(timeoutMS(r.TimeoutMS)); err != nil {
			return nil, err
		}
		rt := id.Route()
		w := proto.RouteToWire(&rt)
		reply(ss, &w)
		return nil, nil
	case wire.OpCMSetQP:
		r, err := req[wire.CMSetQPReq](body)
		if err != nil {
			return nil, err
		}
		q, err := get[*qpObj](ss, proto.Handle(r.QP))
		if err != nil {
			return nil, err
		}
		if err := id.AttachQP(q.q, q.pd.pd); err != nil {
			return nil, err
		}
		o.qp, o.qpH = q, proto.Handle(r.QP)
		return nil, nil
	case wire.OpCMInitQPAttr:
		r, err := req[wire.CMInitQPAttrReq](body)
		if err != nil {
			return nil, err
		}
		a, mask, err := id.InitQPAttr(qp.State(min(r.QPState, 255)))
		if err != nil {
			return nil, err
		}
		reply(ss, &wire.CMInitQPAttrResp{AttrMask: uint32(mask), Attr: proto.QPAttrToWire(&a)})
		return nil, nil
	case wire.OpCMListen:
		r, err := req[wire.CMListenReq](body)
		if err != nil {
			return nil, err
		}
		if err := id.Listen(int(r.Backlog)); err != nil {
			return nil, err
		}
		if !o.listening {
			o.listening = true
			ss.s.nCMListen.Add(1)
		}
	case wire.OpCMConnect, wire.OpCMAccept:
		r, err := req[wire.CMConnReq](body)
		if err != nil {
			return nil, err
		}
		p, err := proto.ConnParamFromWire(&r.Param)
		if err != nil {
			return nil, err
		}
		if r.HasParam != 0 || op == wire.OpCMConnect {
			if err := ss.checkQKey(true, p.QKey); err != nil {
				return nil, err
			}
		}
		if op == wire.OpCMAccept {
			if r.HasParam == 0 {
				return nil, id.Accept(nil)
			}
			return nil, id.Accept(&p)
		}
		return nil, id.Connect(p)
	case wire.OpCMReject:
		r, err := req[wire.CMRejectReq](body)
		if err != nil {
			return nil, err
		}
		if r.PrivateDataLen > wire.CMPrivateDataMax {
			return nil, fmt.Errorf("%w: %d bytes of private data", proto.ErrProtocol, r.PrivateDataLen)
		}
		return nil, id.Reject(append([]byte(nil), r.PrivateData[:r.PrivateDataLen]...))
	case wire.OpCMDisconnect:
		return nil, id.Disconnect()
	case wire.OpCMEstablish:
		return nil, id.Establish()
	case wire.OpCMSetOption:
		r, err := req[wire.CMSetOptionReq](body)
		if err != nil {
			return nil, err
		}
		if r.Level != 0 { // RDMA_OPTION_ID only (RDMA_OPTION_IB's paths are InfiniBand's)
			return nil, fmt.Errorf("%w: rdma_cm option level %d", proto.ErrUnsupported, r.Level)
		}
		if rdmacm.Option(r.OptName) == rdmacm.OptionSelectiveRepeat {
			// the session's QPs take receives through the refill hook, which selective
			// repeat's reorder buffer does not serve (qp.ErrSelectiveRepeat)
			return nil, fmt.Errorf("%w: %w", proto.ErrUnsupported, qp.ErrSelectiveRepeat)
		}
		if err := id.SetOption(rdmacm.Option(r.OptName), r.Value); errors.Is(err, rdmacm.ErrUnsupported) {
			return nil, fmt.Errorf("%w: %w", proto.ErrUnsupported, err)
		} else if err != nil {
			return nil, err
		}
		return nil, nil
	case wire.OpCMQueryID:
		rt := id.Route()
		resp := wire.CMQueryIDResp{Local: proto.AddrPortToWire(id.LocalAddr()), Remote: proto.AddrPortToWire(id.RemoteAddr()),
			Route: proto.RouteToWire(&rt)}
		scm.mu.Lock()
		resp.Channel = uint32(o.ch.h)
		scm.mu.Unlock()
		if o.qp != nil {
			resp.QP = uint32(o.qpH)
		}
		reply(ss, &resp)
		return nil, nil
	default:
		return nil, fmt.Errorf("%w: op %d", proto.ErrUnsupported, op)
	}
	// bind, resolve addr, listen: the ID's addresses
	reply(ss, &wire.CMAddrResp{Local: proto.AddrPortToWire(id.LocalAddr()), Remote: proto.AddrPortToWire(id.RemoteAddr())})
	return nil, nil
}

// cmCreateChannel is CM_CREATE_CHANNEL: a new channel and its eventfd.
func (ss *session) cmCreateChannel() ([]byte, error) {
	if err := ss.charge(cmChanCost); err != nil {
		return nil, err
	}
	fd, err := proto.NewEventFD()
	if err != nil {
		ss.release(cmChanCost)
		return nil, err
	}
	dup, err := dupCloexec(fd)
	if err != nil {
		proto.CloseFD(fd)
		ss.release(cmChanCost)
		return nil, err
	}
	c := &cmChanObj{fd: fd}
	c.h = ss.add(c)
	ss.s.nCMChan.Add(1)
	reply(ss, &wire.Handle{Handle: uint32(c.h)})
	return proto.Rights(dup), nil
}

// cmEvents is CM_GET_EVENTS: up to max of the channel's events (as many as fit).
func (ss *session) cmEvents(scm *sessionCM, c *cmChanObj, max int) {
	fit := (proto.MaxMsg - proto.HdrSize - wire.Size[wire.CMEventsResp]()) / wire.Size[wire.CMEvent]()
	if max <= 0 || max > fit {
		max = fit
	}
	scm.mu.Lock()
	defer scm.mu.Unlock()
	var resp wire.CMEventsResp
	n := 0
	for n < len(c.q) && int(resp.Count) < max {
		if !c.q[n].obj.dead {
			resp.Count++
		}
		n++
	}
	if n < len(c.q) {
		resp.More = 1
	}
	reply(ss, &resp)
	for i := 0; i < n; i++ {
		if !c.q[i].obj.dead {
			reply(ss, &c.q[i].ev)
		}
	}
	c.q = append(c.q[:0], c.q[n:]...)
}

// cmMigrate moves an ID and its queued events to another channel (rdma_migrate_id).
func (ss *session) cmMigrate(scm *sessionCM, o *cmIDObj, to *cmChanObj) {
	scm.mu.Lock()
	defer scm.mu.Unlock()
	from := o.ch
	if from == to {
		return
	}
	kept := from.q[:0]
	for _, q := range from.q {
		if q.obj == o || q.ev.ListenID == uint32(o.h) && q.ev.Event == uint32(rdmacm.EventConnectRequest) {
			to.q = append(to.q, q)
			proto.Signal(to.fd)
			continue
		}
		kept = append(kept, q)
	}
	from.q = kept
	from.ids--
	to.ids++
	o.ch = to
}

// destroyCMID destroys the ID (rdma_destroy_id), drops its queued events and
// forgets its handle.
func (ss *session) destroyCMID(scm *sessionCM, o *cmIDObj) {
	scm.mu.Lock()
	o.dead = true
	o.ch.ids--
	scm.mu.Unlock()
	_ = o.id.Destroy()
	ss.del(o.h)
	ss.s.nCMID.Add(-1)
	if o.listening {
		o.listening = false
		ss.s.nCMListen.Add(-1)
	}
	ss.release(cmIDCost)
}

// cmDetachQP unbinds a QP the client destroys from its IDs.
func (ss *session) cmDetachQP(q *qpObj) {
	ss.mu.Lock()
	var ids []*cmIDObj
	for _, x := range ss.objs {
		if o, ok := x.(*cmIDObj); ok && o.qp == q {
			ids = append(ids, o)
		}
	}
	ss.mu.Unlock()
	for _, o := range ids {
		o.id.DetachQP()
		o.qp, o.qpH = nil, 0
	}
}

// cleanupCM destroys every CM ID of the session (its end, for any
// reason): connections are DREQ'd, pending requests rejected, listens and
// ports freed; requests still queued (or arriving later) are rejected; the
// channels' eventfds are closed.
func (ss *session) cleanupCM() {
	ss.mu.Lock()
	scm := ss.cm
	ss.mu.Unlock()
	if scm == nil {
		return
	}
	// Closed first: from here no event adds an ID to the table.
	scm.mu.Lock()
	scm.closed = true
	scm.mu.Unlock()
	ss.mu.Lock()
	var ids []*cmIDObj
	var chans []*cmChanObj
	for _, x := range ss.objs {
		switch o := x.(type) {
		case *cmIDObj:
			ids = append(ids, o)
		case *cmChanObj:
			chans = append(chans, o)
		}
	}
	ss.mu.Unlock()
	for _, o := range ids {
		ss.destroyCMID(scm, o)
	}
	ss.cmPushed(scm) // whatever arrived meanwhile
	for _, c := range chans {
		ss.del(c.h)
		proto.CloseFD(c.fd)
		ss.s.nCMChan.Add(-1)
		ss.release(cmChanCost)
	}
}
