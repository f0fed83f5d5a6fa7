package client

// rdma_cm through the daemon: Conn implements rdmacm.Remote, so
// rdmacm.CreateID(ch, rdmacm.IDOptions{Verbs: conn}) creates IDs in the
// daemon, bound to this connection's QPs (docs/daemon.md, "rdma_cm").
// Events: the daemon bumps the CM word of the event ring and signals its
// eventfd; readEvents sees the word change and kicks cmLoop, which fetches
// every queued event (OpCMGetEvents) and hands them, in order, to rdmacm.

import (
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/softroce/softroce/internal/cm"
	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/rdmacm"
	"github.com/softroce/softroce/pkg/roce"
)

var _ rdmacm.Remote = (*Conn)(nil)

// clientCM is a connection's rdma_cm state.
type clientCM struct {
	once    sync.Once
	kick    atomic.Pointer[chan struct{}] // set once cmLoop runs
	kicked  uint64                        // readEvents only: the CM word last seen
	handler atomic.Pointer[func(rdmacm.RemoteEvent)]

	mu  sync.Mutex
	qps map[uint32]*qpc // by ID handle: QPs bound with CMSetQP
}

// cmWake is called by readEvents after each wake-up.
func (c *Conn) cmWake() {
	kick := c.cm.kick.Load()
	if kick == nil {
		return
	}
	if s := c.evRing.CMSeq(); s != c.cm.kicked {
		c.cm.kicked = s
		select {
		case *kick <- struct{}{}:
		default:
		}
	}
}

// CMSetEventHandler implements rdmacm.Remote.
func (c *Conn) CMSetEventHandler(h func(rdmacm.RemoteEvent)) {
	if h == nil {
		c.cm.handler.Store(nil)
		return
	}
	c.cm.handler.Store(&h)
	c.cm.once.Do(func() {
		if c.evDone == nil {
			return
		}
		kick := make(chan struct{}, 1)
		kick <- struct{}{} // fetch once: events may precede the handler
		c.cm.kick.Store(&kick)
		go c.cmLoop(kick)
	})
}

// cmLoop fetches the session's CM events when kicked; it ends with the
// event goroutine (Close).
func (c *Conn) cmLoop(kick chan struct{}) {
	for {
		select {
		case <-kick:
		case <-c.evDone:
			return
		}
		var r proto.CMEvents
		if _, err := c.call(proto.OpCMGetEvents, nil, &r); err != nil {
			continue
		}
		for i := range r.Events {
			c.cmDeliver(&r.Events[i])
		}
	}
}

func (c *Conn) cmDeliver(e *proto.CMEvent) {
	re := rdmacm.RemoteEvent{Type: e.Type, ID: uint32(e.ID), Listen: uint32(e.Listen), Param: e.Param,
		Local: e.Local, Remote: e.Remote, Route: e.Route}
	switch {
	case e.Rejected:
		re.Status = &rdmacm.RejectError{Reason: cm.RejectReason(e.Reason)}
	case e.Status != "":
		re.Status = proto.FromBody(proto.ErrorBody{Code: e.StatusCode, Msg: e.Status})
	}
	if e.AH != nil {
		re.UD = rdmacm.UDParam{QPN: e.UDQPN, QKey: e.UDQKey, AH: e.AH}
	}
	if e.Type == rdmacm.EventEstablished {
		// The CM moved the bound QP to RTS in the daemon: posts may take
		// the asynchronous path (see qpc), as after the client's own Modify.
		c.cm.mu.Lock()
		q := c.cm.qps[uint32(e.ID)]
		c.cm.mu.Unlock()
		if q != nil && !q.typ.Datagram() {
			q.sendOK.Store(true)
			q.recvOK.Store(true)
		}
	}
	if h := c.cm.handler.Load(); h != nil {
		(*h)(re)
	}
}

// CMCreateID implements rdmacm.Remote.
func (c *Conn) CMCreateID(ps cm.PortSpace) (uint32, error) {
	var r proto.HandleResp
	if _, err := c.call(proto.OpCMCreateID, proto.CMCreateIDReq{PortSpace: ps}, &r); err != nil {
		return 0, err
	}
	return uint32(r.H), nil
}

// CMBindAddr implements rdmacm.Remote.
func (c *Conn) CMBindAddr(h uint32, ap netip.AddrPort) (netip.AddrPort, error) {
	var r proto.CMAddrResp
	_, err := c.call(proto.OpCMBindAddr, proto.CMAddrReq{H: proto.Handle(h), Addr: ap}, &r)
	return r.Local, err
}

// CMResolveAddr implements rdmacm.Remote.
func (c *Conn) CMResolveAddr(h uint32, src netip.Addr, dst netip.AddrPort) (netip.AddrPort, netip.AddrPort, error) {
	var r proto.CMAddrResp
	_, err := c.call(proto.OpCMResolveAddr, proto.CMAddrReq{H: proto.Handle(h), Src: src, Addr: dst}, &r)
	return r.Local, r.Remote, err
}

// CMResolveRoute implements rdmacm.Remote.
func (c *Conn) CMResolveRoute(h uint32) (rdmacm.Route, error) {
	var r rdmacm.Route
	_, err := c.call(proto.OpCMResolveRoute, proto.HandleReq{H: proto.Handle(h)}, &r)
	return r, err
}

// CMSetQP implements rdmacm.Remote: q must be a QP of this connection.
func (c *Conn) CMSetQP(h uint32, q roce.QueuePair) error {
	x, ok := q.(*qpc)
	if !ok || x == nil || x.c != c {
		return roce.ErrInvalidArg
	}
	if _, err := c.call(proto.OpCMSetQP, proto.CMSetQPReq{H: proto.Handle(h), QP: x.h}, nil); err != nil {
		return err
	}
	if x.typ == qp.TypeRC || x.typ == qp.TypeUC {
		x.recvOK.Store(true) // rdma_create_qp left it in INIT
	}
	c.cm.mu.Lock()
	if c.cm.qps == nil {
		c.cm.qps = map[uint32]*qpc{}
	}
	c.cm.qps[h] = x
	c.cm.mu.Unlock()
	return nil
}

// CMListen implements rdmacm.Remote.
func (c *Conn) CMListen(h uint32, backlog int) (netip.AddrPort, error) {
	var r proto.CMAddrResp
	_, err := c.call(proto.OpCMListen, proto.CMListenReq{H: proto.Handle(h), Backlog: backlog}, &r)
	return r.Local, err
}

// CMConnect implements rdmacm.Remote.
func (c *Conn) CMConnect(h uint32, p rdmacm.ConnParam) error {
	_, err := c.call(proto.OpCMConnect, proto.CMConnParamReq{H: proto.Handle(h), Param: &p}, nil)
	return err
}

// CMAccept implements rdmacm.Remote.
func (c *Conn) CMAccept(h uint32, p *rdmacm.ConnParam) error {
	_, err := c.call(proto.OpCMAccept, proto.CMConnParamReq{H: proto.Handle(h), Param: p}, nil)
	return err
}

// CMReject implements rdmacm.Remote.
func (c *Conn) CMReject(h uint32, privateData []byte) error {
	_, err := c.call(proto.OpCMReject, proto.CMRejectReq{H: proto.Handle(h), PrivateData: privateData}, nil)
	return err
}

// CMDisconnect implements rdmacm.Remote.
func (c *Conn) CMDisconnect(h uint32) error {
	_, err := c.call(proto.OpCMDisconnect, proto.HandleReq{H: proto.Handle(h)}, nil)
	return err
}

// CMDestroy implements rdmacm.Remote.
func (c *Conn) CMDestroy(h uint32) error {
	c.cm.mu.Lock()
	delete(c.cm.qps, h)
	c.cm.mu.Unlock()
	_, err := c.call(proto.OpCMDestroyID, proto.HandleReq{H: proto.Handle(h)}, nil)
	return err
}
