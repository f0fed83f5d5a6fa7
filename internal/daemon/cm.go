package daemon

// rdma_cm through the daemon (docs/daemon.md, "rdma_cm"): each session's
// CM IDs are pkg/rdmacm IDs on the daemon's device, kept in the session's
// handle table like its verbs objects, so a handle of another session
// names nothing. rdmacm's port table is the device's, so a port one
// session binds or listens on is refused to every other (ErrAddrInUse).
// QPs are bound by handle (the session's own QPs only). Events are queued
// on the session's rdmacm.EventChannel; each push bumps the CM word of the
// session's event ring and signals its eventfd, and the client fetches
// the queue with OpCMGetEvents. When the session ends, every ID is
// destroyed (connections DREQ'd, pending requests rejected, listens and
// ports freed), as are requests that arrived but were never fetched.

import (
	"errors"
	"fmt"
	"sync"

	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/pkg/rdmacm"
)

// sessionCM is a session's rdma_cm state (created by its first CM request).
type sessionCM struct {
	ch *rdmacm.EventChannel

	mu     sync.Mutex // closed, and draining the channel after it
	closed bool
}

// cmIDObj is a CM ID in the session's handle table.
type cmIDObj struct {
	id   *rdmacm.ID
	h    proto.Handle
	qp   *qpObj // bound with OpCMSetQP
	dead bool   // destroyed: its queued events are dropped
}

// cmIDCost is what a CM ID costs its user.
var cmIDCost = one(resCMIDs)

// cmState returns the session's CM state, creating it.
func (ss *session) cmState() *sessionCM {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.cm == nil {
		scm := &sessionCM{}
		scm.ch = rdmacm.NewEventChannelFunc(func() { ss.cmPushed(scm) })
		ss.cm = scm
	}
	return ss.cm
}

// cmPushed runs after each event is queued (CM goroutine; never blocks):
// it wakes the client, or, once the session is gone, destroys what the
// event brought (a late CONNECT_REQUEST's new ID).
func (ss *session) cmPushed(scm *sessionCM) {
	scm.mu.Lock()
	closed := scm.closed
	scm.mu.Unlock()
	if closed {
		ss.cmDrain(scm)
		return
	}
	ss.evMu.Lock()
	if ss.ev != nil {
		ss.ev.r.BumpCM()
		proto.Signal(ss.ev.fd)
	}
	ss.evMu.Unlock()
}

// cmDrain discards the queued events, destroying the IDs of requests the
// client never received.
func (ss *session) cmDrain(scm *sessionCM) {
	for {
		e, ok := scm.ch.TryGet()
		if !ok {
			return
		}
		if e.Type == rdmacm.EventConnectRequest {
			if o, _ := e.ID.Context.(*cmIDObj); o == nil || o.id != e.ID {
				_ = e.ID.Destroy() // REJ / SIDR_REP(reject)
			}
		}
	}
}

func cmID(ss *session, h proto.Handle) (*cmIDObj, error) {
	o, err := get[*cmIDObj](ss, h)
	if err != nil {
		return nil, err
	}
	return o, nil
}

// handleCM serves an rdma_cm request (session goroutine, postMu held).
func (ss *session) handleCM(op proto.Op, body []byte) (any, error) {
	switch op {
	case proto.OpCMCreateID:
		var r proto.CMCreateIDReq
		if err := unmarshal(body, &r); err != nil {
			return nil, err
		}
		if err := ss.charge(cmIDCost); err != nil {
			return nil, err
		}
		id, err := rdmacm.CreateID(ss.cmState().ch, rdmacm.IDOptions{Device: ss.s.dev, PortSpace: r.PortSpace})
		if err != nil {
			ss.release(cmIDCost)
			return nil, err
		}
		o := &cmIDObj{id: id}
		id.Context = o
		o.h = ss.add(o)
		ss.s.nCMID.Add(1)
		return proto.HandleResp{H: o.h}, nil
	case proto.OpCMGetEvents:
		return ss.cmEvents(), nil
	}
	// every other request names an ID the session holds
	var hr proto.HandleReq
	if err := unmarshal(body, &hr); err != nil {
		return nil, err
	}
	o, err := cmID(ss, hr.H)
	if err != nil {
		return nil, err
	}
	id := o.id
	switch op {
	case proto.OpCMBindAddr, proto.OpCMResolveAddr:
		var r proto.CMAddrReq
		if err := unmarshal(body, &r); err != nil {
			return nil, err
		}
		if op == proto.OpCMBindAddr {
			err = id.BindAddr(r.Addr)
		} else {
			err = id.ResolveAddr(r.Src, r.Addr, 0)
		}
		if err != nil {
			return nil, err
		}
		return proto.CMAddrResp{Local: id.LocalAddr(), Remote: id.RemoteAddr()}, nil
	case proto.OpCMResolveRoute:
		if err := id.ResolveRoute(0); err != nil {
			return nil, err
		}
		return id.Route(), nil
	case proto.OpCMSetQP:
		var r proto.CMSetQPReq
		if err := unmarshal(body, &r); err != nil {
			return nil, err
		}
		q, err := get[*qpObj](ss, r.QP)
		if err != nil {
			return nil, err
		}
		if err := id.AttachQP(q.q, q.pd.pd); err != nil {
			return nil, err
		}
		o.qp = q
		return nil, nil
	case proto.OpCMListen:
		var r proto.CMListenReq
		if err := unmarshal(body, &r); err != nil {
			return nil, err
		}
		if err := id.Listen(r.Backlog); err != nil {
			return nil, err
		}
		return proto.CMAddrResp{Local: id.LocalAddr()}, nil
	case proto.OpCMConnect, proto.OpCMAccept:
		var r proto.CMConnParamReq
		if err := unmarshal(body, &r); err != nil {
			return nil, err
		}
		if r.Param != nil {
			if err := ss.checkQKey(true, r.Param.QKey); err != nil {
				return nil, err
			}
		}
		if op == proto.OpCMAccept {
			return nil, id.Accept(r.Param)
		}
		if r.Param == nil {
			r.Param = &rdmacm.ConnParam{}
		}
		return nil, id.Connect(*r.Param)
	case proto.OpCMReject:
		var r proto.CMRejectReq
		if err := unmarshal(body, &r); err != nil {
			return nil, err
		}
		return nil, id.Reject(r.PrivateData)
	case proto.OpCMDisconnect:
		return nil, id.Disconnect()
	case proto.OpCMDestroyID:
		ss.destroyCMID(o)
		return nil, nil
	}
	return nil, fmt.Errorf("%w: unknown op %d", proto.ErrProtocol, op)
}

// destroyCMID destroys the ID (rdma_destroy_id) and forgets its handle.
func (ss *session) destroyCMID(o *cmIDObj) {
	o.dead = true
	_ = o.id.Destroy()
	ss.del(o.h)
	ss.s.nCMID.Add(-1)
	ss.release(cmIDCost)
}

// cmEvents takes the session's queued events (OpCMGetEvents), giving each
// new ID of a CONNECT_REQUEST its handle.
func (ss *session) cmEvents() proto.CMEvents {
	ss.mu.Lock()
	scm := ss.cm
	ss.mu.Unlock()
	var out proto.CMEvents
	if scm == nil {
		return out
	}
	for {
		e, ok := scm.ch.TryGet()
		if !ok {
			return out
		}
		var ce proto.CMEvent
		if e.Type == rdmacm.EventConnectRequest {
			lo, _ := e.Listen.Context.(*cmIDObj)
			if lo == nil || lo.dead {
				_ = e.ID.Destroy()
				continue
			}
			child := &cmIDObj{id: e.ID}
			e.ID.Context = child
			child.h = ss.add(child)
			ss.s.nCMID.Add(1)
			ss.s.acct.charge(ss.ten, cmIDCost, true) // counted, never refused (the peer made it)
			ce.Listen = lo.h
			ce.Local, ce.Remote, ce.Route = e.ID.LocalAddr(), e.ID.RemoteAddr(), e.ID.Route()
		}
		o, _ := e.ID.Context.(*cmIDObj)
		if o == nil || o.dead || o.id != e.ID {
			continue
		}
		ce.Type, ce.ID, ce.Param = e.Type, o.h, e.Param
		if e.Status != nil {
			var rj *rdmacm.RejectError
			if errors.As(e.Status, &rj) {
				ce.Rejected, ce.Reason = true, uint16(rj.Reason)
			} else {
				ce.Status, ce.StatusCode = e.Status.Error(), proto.CodeOf(e.Status)
			}
		}
		if e.Type == rdmacm.EventEstablished && e.UD.AH != nil {
			ce.UDQPN, ce.UDQKey, ce.AH = e.UD.QPN, e.UD.QKey, e.UD.AH
		}
		out.Events = append(out.Events, ce)
	}
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
		o.qp = nil
	}
}

// cleanupCM destroys every CM ID of the session (its end, for any
// reason): connections are DREQ'd, pending requests rejected, listens and
// ports freed; requests still queued (or arriving later) are rejected.
func (ss *session) cleanupCM() {
	ss.mu.Lock()
	scm := ss.cm
	var ids []*cmIDObj
	for _, x := range ss.objs {
		if o, ok := x.(*cmIDObj); ok {
			ids = append(ids, o)
		}
	}
	ss.mu.Unlock()
	if scm == nil {
		return
	}
	scm.mu.Lock()
	scm.closed = true
	scm.mu.Unlock()
	for _, o := range ids {
		ss.destroyCMID(o)
	}
	ss.cmDrain(scm)
}
