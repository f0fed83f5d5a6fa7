package client

// rdma_cm through the daemon: Conn implements rdmacm.Remote, so
// rdmacm.CreateID(ch, rdmacm.IDOptions{Verbs: conn}) creates IDs in the
// daemon, bound to this connection's QPs (docs/daemon-protocol.md, "rdma_cm").
// The connection's IDs share one daemon event channel (CM_CREATE_CHANNEL,
// made with the first ID); pkg/rdmacm sorts the events onto the program's own
// channels. The channel's goroutine waits on its eventfd in the Go poller and
// fetches what is queued (CM_GET_EVENTS) each time the daemon writes it.

import (
	"fmt"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/softroce/softroce/internal/cm"
	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/rdmacm"
	"github.com/softroce/softroce/pkg/roce"
)

var _ rdmacm.Remote = (*Conn)(nil)

// clientCM is a connection's rdma_cm state.
type clientCM struct {
	handler atomic.Pointer[func(rdmacm.RemoteEvent)]

	mu   sync.Mutex
	ch   proto.Handle    // the daemon event channel (0 until the first ID)
	file *os.File        // its eventfd
	done chan struct{}   // closed when the channel's goroutine ends
	qps  map[uint32]*qpc // by ID handle: QPs bound with CMSetQP
}

// CMSetEventHandler implements rdmacm.Remote.
func (c *Conn) CMSetEventHandler(h func(rdmacm.RemoteEvent)) {
	if h == nil {
		c.cm.handler.Store(nil)
		return
	}
	c.cm.handler.Store(&h)
}

// cmChannel returns the connection's daemon event channel, creating it (and
// its goroutine) on first use.
func (c *Conn) cmChannel() (proto.Handle, error) {
	c.cm.mu.Lock()
	defer c.cm.mu.Unlock()
	if c.cm.ch != 0 {
		return c.cm.ch, nil
	}
	var r wire.Handle
	fds, err := c.call(wire.OpCMCreateChannel, nil, wire.Bytes(&r))
	if err != nil {
		return 0, err
	}
	if len(fds) != 1 {
		proto.CloseFDs(fds)
		return 0, fmt.Errorf("%w: CM channel with %d fds", proto.ErrProtocol, len(fds))
	}
	c.cm.ch, c.cm.file, c.cm.done = proto.Handle(r.Handle), proto.EventFile(fds[0], "softroce-cm"), make(chan struct{})
	go c.cmLoop(c.cm.ch, c.cm.file, c.cm.done)
	return c.cm.ch, nil
}

// cmLoop fetches the channel's events each time the daemon signals it (a
// wakeup is an edge in the Go poller: no read), until Close closes the
// eventfd.
func (c *Conn) cmLoop(ch proto.Handle, f *os.File, done chan struct{}) {
	defer close(done)
	proto.WaitLoop(f, func(bool) bool {
		for {
			var evs []wire.CMEvent
			more := false
			req := wire.CMGetEventsReq{Channel: uint32(ch)}
			_, err := c.callFunc(wire.OpCMGetEvents, wire.Bytes(&req), func(b []byte) error {
				var r wire.CMEventsResp
				b, ok := wire.Read(b, &r)
				if !ok || uint64(r.Count) > uint64(len(b)/wire.Size[wire.CMEvent]()) {
					return proto.ErrProtocol
				}
				evs = make([]wire.CMEvent, r.Count)
				for i := range evs {
					b, _ = wire.Read(b, &evs[i])
				}
				more = r.More != 0
				return nil
			})
			if err != nil {
				return false // disconnected: Close ends the wait
			}
			for i := range evs {
				c.cmDeliver(&evs[i])
			}
			if !more {
				return false
			}
		}
	})
}

func (c *Conn) cmDeliver(e *wire.CMEvent) {
	param, _ := proto.ConnParamFromWire(&e.Param)
	re := rdmacm.RemoteEvent{Type: cm.EventType(e.Event), ID: e.ID, Listen: e.ListenID, Param: param,
		Local: proto.AddrPortFromWire(&e.Local), Remote: proto.AddrPortFromWire(&e.Remote), Route: proto.RouteFromWire(&e.Route)}
	switch {
	case re.Type == rdmacm.EventRejected:
		re.Status = &rdmacm.RejectError{Reason: cm.RejectReason(e.Status)}
	case e.Status != 0:
		re.Status = proto.ErrorFrom(syscall.Errno(-e.Status), wire.Code(e.Code),
			fmt.Sprintf("softroce daemon: rdma_cm %v: %v", re.Type, syscall.Errno(-e.Status)))
	}
	if e.Flags&wire.CMEventUD != 0 {
		re.UD = rdmacm.UDParam{QPN: e.Param.QPNum, QKey: e.Param.QKey, AH: &qp.AH{AHAttr: proto.AHAttrFromWire(&e.AHAttr)}}
		re.Param.QPNum, re.Param.QKey = 0, 0
	}
	if re.Type == rdmacm.EventEstablished {
		// The CM moved the bound QP to RTS in the daemon: posts may take
		// the asynchronous path (see qpc), as after the client's own Modify.
		c.cm.mu.Lock()
		q := c.cm.qps[e.ID]
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

// cmClose stops the channel's goroutine (Close).
func (c *Conn) cmClose() {
	c.cm.mu.Lock()
	f, done := c.cm.file, c.cm.done
	c.cm.file = nil
	c.cm.mu.Unlock()
	if f != nil {
		f.Close()
		<-done
	}
}

func cmHandle(h uint32) []byte { return wire.Bytes(&wire.Handle{Handle: h}) }

// CMCreateID implements rdmacm.Remote.
func (c *Conn) CMCreateID(ps cm.PortSpace) (uint32, error) {
	ch, err := c.cmChannel()
	if err != nil {
		return 0, err
	}
	var r wire.Handle
	req := wire.CMCreateIDReq{Channel: uint32(ch), PortSpace: uint16(ps)}
	if _, err := c.call(wire.OpCMCreateID, wire.Bytes(&req), wire.Bytes(&r)); err != nil {
		return 0, err
	}
	return r.Handle, nil
}

func (c *Conn) cmAddr(op wire.Op, body []byte) (local, remote netip.AddrPort, err error) {
	var r wire.CMAddrResp
	if _, err := c.call(op, body, wire.Bytes(&r)); err != nil {
		return netip.AddrPort{}, netip.AddrPort{}, err
	}
	return proto.AddrPortFromWire(&r.Local), proto.AddrPortFromWire(&r.Remote), nil
}

// CMBindAddr implements rdmacm.Remote.
func (c *Conn) CMBindAddr(h uint32, ap netip.AddrPort) (netip.AddrPort, error) {
	req := wire.CMBindReq{ID: h, Addr: proto.AddrPortToWire(ap)}
	local, _, err := c.cmAddr(wire.OpCMBindAddr, wire.Bytes(&req))
	return local, err
}

// CMResolveAddr implements rdmacm.Remote.
func (c *Conn) CMResolveAddr(h uint32, src netip.Addr, dst netip.AddrPort) (netip.AddrPort, netip.AddrPort, error) {
	req := wire.CMResolveAddrReq{ID: h, Dst: proto.AddrPortToWire(dst)}
	if src.IsValid() {
		req.Src = proto.AddrPortToWire(netip.AddrPortFrom(src, 0))
	}
	return c.cmAddr(wire.OpCMResolveAddr, wire.Bytes(&req))
}

// CMResolveRoute implements rdmacm.Remote.
func (c *Conn) CMResolveRoute(h uint32) (rdmacm.Route, error) {
	var r wire.CMRoute
	_, err := c.call(wire.OpCMResolveRoute, wire.Bytes(&wire.CMResolveRouteReq{ID: h}), wire.Bytes(&r))
	return proto.RouteFromWire(&r), err
}

// CMSetQP implements rdmacm.Remote: q must be a QP of this connection.
func (c *Conn) CMSetQP(h uint32, q roce.QueuePair) error {
	x, ok := q.(*qpc)
	if !ok || x == nil || x.c != c {
		return roce.ErrInvalidArg
	}
	if _, err := c.call(wire.OpCMSetQP, wire.Bytes(&wire.CMSetQPReq{ID: h, QP: uint32(x.h)}), nil); err != nil {
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
	local, _, err := c.cmAddr(wire.OpCMListen, wire.Bytes(&wire.CMListenReq{ID: h, Backlog: int32(min(max(backlog, 0), 1<<20))}))
	return local, err
}

func (c *Conn) cmConn(op wire.Op, h uint32, p *rdmacm.ConnParam) error {
	req := wire.CMConnReq{ID: h}
	if p != nil {
		w, err := proto.ConnParamToWire(p)
		if err != nil {
			return fmt.Errorf("%w: %d bytes of private data", rdmacm.ErrInvalidArg, len(p.PrivateData))
		}
		req.HasParam, req.Param = 1, w
	}
	_, err := c.call(op, wire.Bytes(&req), nil)
	return err
}

// CMConnect implements rdmacm.Remote.
func (c *Conn) CMConnect(h uint32, p rdmacm.ConnParam) error {
	return c.cmConn(wire.OpCMConnect, h, &p)
}

// CMAccept implements rdmacm.Remote.
func (c *Conn) CMAccept(h uint32, p *rdmacm.ConnParam) error { return c.cmConn(wire.OpCMAccept, h, p) }

// CMReject implements rdmacm.Remote.
func (c *Conn) CMReject(h uint32, privateData []byte) error {
	req := wire.CMRejectReq{ID: h}
	if len(privateData) > len(req.PrivateData) {
		return fmt.Errorf("%w: %d bytes of private data", rdmacm.ErrInvalidArg, len(privateData))
	}
	req.PrivateDataLen = uint32(copy(req.PrivateData[:], privateData))
	_, err := c.call(wire.OpCMReject, wire.Bytes(&req), nil)
	return err
}

// CMDisconnect implements rdmacm.Remote.
func (c *Conn) CMDisconnect(h uint32) error {
	_, err := c.call(wire.OpCMDisconnect, cmHandle(h), nil)
	return err
}

// CMSetOption implements rdmacm.Remote.
func (c *Conn) CMSetOption(h uint32, o rdmacm.Option, value uint32) error {
	_, err := c.call(wire.OpCMSetOption, wire.Bytes(&wire.CMSetOptionReq{ID: h, OptName: uint32(o), Value: value}), nil)
	return err
}

// CMInitQPAttr implements rdmacm.Remote.
func (c *Conn) CMInitQPAttr(h uint32, state qp.State) (qp.Attr, qp.AttrMask, error) {
	var r wire.CMInitQPAttrResp
	if _, err := c.call(wire.OpCMInitQPAttr, wire.Bytes(&wire.CMInitQPAttrReq{ID: h, QPState: uint32(state)}), wire.Bytes(&r)); err != nil {
		return qp.Attr{}, 0, err
	}
	return proto.QPAttrFromWire(&r.Attr), qp.AttrMask(r.AttrMask), nil
}

// CMEstablish implements rdmacm.Remote.
func (c *Conn) CMEstablish(h uint32) error {
	_, err := c.call(wire.OpCMEstablish, cmHandle(h), nil)
	return err
}

// CMDestroy implements rdmacm.Remote.
func (c *Conn) CMDestroy(h uint32) error {
	c.cm.mu.Lock()
	delete(c.cm.qps, h)
	c.cm.mu.Unlock()
	_, err := c.call(wire.OpCMDestroyID, cmHandle(h), nil)
	return err
}
