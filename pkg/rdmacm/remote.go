package rdmacm

// rdma_cm through the softroce daemon: the ID is a handle of the client's
// daemon session; the daemon runs this package's embedded implementation
// on its device for the session and forwards the events (docs/cm.md,
// "rdma_cm through the daemon").

import (
	"fmt"
	"net/netip"
	"sync"

	"github.com/softroce/softroce/internal/cm"
	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/roce"
)

// Remote is an rdma_cm running in another process: the softroce daemon,
// reached through a client connection (pkg/client.Conn implements
// it). IDs are handles of the client's session; the daemon checks every
// state and ownership rule, these methods only forward. Programs do not
// call them: they pass the Verbs in IDOptions.Verbs.
type Remote interface {
	roce.Verbs
	// CMSetEventHandler installs the function receiving the session's
	// rdma_cm events, in order (nil removes it). It is called on one
	// goroutine and must not block.
	CMSetEventHandler(h func(RemoteEvent))
	// CMCreateID creates an ID in port space ps (rdma_create_id).
	CMCreateID(ps cm.PortSpace) (uint32, error)
	// CMBindAddr is rdma_bind_addr; it returns the bound address.
	CMBindAddr(h uint32, ap netip.AddrPort) (netip.AddrPort, error)
	// CMResolveAddr is rdma_resolve_addr; ADDR_RESOLVED (or ADDR_ERROR)
	// follows as an event.
	CMResolveAddr(h uint32, src netip.Addr, dst netip.AddrPort) (local, remote netip.AddrPort, err error)
	// CMResolveRoute is rdma_resolve_route; ROUTE_RESOLVED follows.
	CMResolveRoute(h uint32) (Route, error)
	// CMSetQP binds a QP of this client (in RESET) to the ID and moves it
	// as rdma_create_qp does.
	CMSetQP(h uint32, q roce.QueuePair) error
	// CMListen is rdma_listen; it returns the bound address.
	CMListen(h uint32, backlog int) (netip.AddrPort, error)
	// CMConnect, CMAccept, CMReject, CMDisconnect and CMDestroy are
	// rdma_connect, rdma_accept, rdma_reject, rdma_disconnect and
	// rdma_destroy_id.
	CMConnect(h uint32, p ConnParam) error
	CMAccept(h uint32, p *ConnParam) error
	CMReject(h uint32, privateData []byte) error
	CMDisconnect(h uint32) error
	CMDestroy(h uint32) error
	// CMSetOption is rdma_set_option (level RDMA_OPTION_ID; ID.SetOption) and CMEstablish
	// rdma_establish (ID.Establish).
	CMSetOption(h uint32, o Option, value uint32) error
	CMEstablish(h uint32) error
	// CMInitQPAttr is rdma_init_qp_attr (ID.InitQPAttr).
	CMInitQPAttr(h uint32, state qp.State) (qp.Attr, qp.AttrMask, error)
}

// RemoteEvent is an rdma_cm event as the daemon reports it: IDs by handle.
type RemoteEvent struct {
	Type EventType
	// ID is the handle of the ID the event is about (CONNECT_REQUEST: the
	// new ID); Listen, for CONNECT_REQUEST, the listener's.
	ID, Listen uint32
	Status     error
	Param      ConnParam
	UD         UDParam
	// CONNECT_REQUEST: the new ID's addresses and route.
	Local, Remote netip.AddrPort
	Route         Route
}

// remState is the rdma_cm state of one Remote: its live IDs by handle.
type remState struct {
	r    Remote
	mu   sync.Mutex
	ids  map[uint32]*ID
	refs int
}

var (
	remMu  sync.Mutex
	remMap = map[Remote]*remState{}
)

func acquireRemote(r Remote) *remState {
	remMu.Lock()
	defer remMu.Unlock()
	rs := remMap[r]
	if rs == nil {
		rs = &remState{r: r, ids: map[uint32]*ID{}}
		remMap[r] = rs
		r.CMSetEventHandler(rs.handle)
	}
	rs.refs++
	return rs
}

func releaseRemote(rs *remState) {
	remMu.Lock()
	defer remMu.Unlock()
	rs.refs--
	if rs.refs == 0 {
		rs.r.CMSetEventHandler(nil)
		delete(remMap, rs.r)
	}
}

func createRemote(ch *EventChannel, r Remote, o IDOptions) (*ID, error) {
	if o.PortSpace == 0 {
		o.PortSpace = cm.PSTCP
	}
	if o.PortSpace != cm.PSTCP && o.PortSpace != cm.PSUDP {
		return nil, fmt.Errorf("%w: port space %#x", ErrInvalidArg, uint16(o.PortSpace))
	}
	rs := acquireRemote(r)
	h, err := r.CMCreateID(o.PortSpace)
	if err != nil {
		releaseRemote(rs)
		return nil, err
	}
	id := &ID{Context: o.Context, ch: ch, ps: o.PortSpace, rem: rs, rh: h}
	rs.mu.Lock()
	rs.ids[h] = id
	rs.mu.Unlock()
	return id, nil
}

// Handle returns the daemon's handle of an ID in the daemon (0 for an
// embedded ID).
func (id *ID) Handle() uint32 { return id.rh }

func (id *ID) remBind(ap netip.AddrPort) error {
	local, err := id.rem.r.CMBindAddr(id.rh, ap)
	if err != nil {
		return err
	}
	id.mu.Lock()
	id.local = local
	id.mu.Unlock()
	return nil
}

func (id *ID) remResolveAddr(src netip.Addr, dst netip.AddrPort) error {
	local, remote, err := id.rem.r.CMResolveAddr(id.rh, src, dst)
	if err != nil {
		return err
	}
	id.mu.Lock()
	if local.IsValid() {
		id.local, id.remote = local, remote
	}
	id.mu.Unlock()
	return nil
}

func (id *ID) remResolveRoute() error {
	rt, err := id.rem.r.CMResolveRoute(id.rh)
	if err != nil {
		return err
	}
	id.mu.Lock()
	id.route = rt
	id.mu.Unlock()
	return nil
}

func (id *ID) remListen(backlog int) error {
	local, err := id.rem.r.CMListen(id.rh, backlog)
	if err != nil {
		return err
	}
	id.mu.Lock()
	id.local = local
	id.mu.Unlock()
	return nil
}

func (id *ID) remDestroy() error {
	id.mu.Lock()
	if id.state == stDestroyed {
		id.mu.Unlock()
		return ErrDestroyed
	}
	id.state = stDestroyed
	id.mu.Unlock()
	rs := id.rem
	rs.mu.Lock()
	delete(rs.ids, id.rh)
	rs.mu.Unlock()
	err := rs.r.CMDestroy(id.rh)
	releaseRemote(rs)
	return err
}

// handle turns a daemon event into an event on the ID's channel (the
// client's event goroutine, in the daemon's order).
func (rs *remState) handle(e RemoteEvent) {
	rs.mu.Lock()
	if e.Type == EventConnectRequest {
		lid := rs.ids[e.Listen]
		if lid == nil {
			rs.mu.Unlock()
			return // the listener was destroyed: the daemon rejects the request
		}
		child := &ID{ch: lid.ch, ps: lid.ps, Context: lid.Context, state: stConnectReq, rem: rs, rh: e.ID,
			local: e.Local, remote: e.Remote, route: e.Route, reqParam: e.Param}
		rs.ids[e.ID] = child
		rs.mu.Unlock()
		remMu.Lock()
		rs.refs++
		remMu.Unlock()
		lid.ch.push(Event{Type: e.Type, ID: child, Listen: lid, Param: e.Param})
		return
	}
	id := rs.ids[e.ID]
	rs.mu.Unlock()
	if id == nil {
		return
	}
	id.mu.Lock()
	if id.state == stDestroyed {
		id.mu.Unlock()
		return
	}
	if e.Type == EventEstablished && id.ps == cm.PSUDP {
		id.udRemote = e.UD
	}
	id.mu.Unlock()
	id.ch.push(Event{Type: e.Type, ID: id, Status: e.Status, Param: e.Param, UD: e.UD})
}

// CreateQPVerbs creates the ID's QP with v, the Verbs the ID was created
// on (rdma_create_qp): in pd, with in's CQs and capabilities (in.Type 0 =
// RC, or UD in the UDP port space), moved as CreateQP moves it. It works
// for an embedded device and through the daemon alike; in embedded mode
// the objects are the engine's own (*mr.PD, *cq.CQ, *qp.SRQ).
func (id *ID) CreateQPVerbs(pd roce.ProtectionDomain, in roce.VerbsQPInit) (roce.QueuePair, error) {
	if in.Type == 0 {
		in.Type = qp.TypeRC
		if id.ps == cm.PSUDP {
			in.Type = qp.TypeUD
		}
	}
	if id.rem == nil {
		p, ok1 := pd.(*mr.PD)
		scq, ok2 := in.SendCQ.(*cq.CQ)
		rcq, ok3 := in.RecvCQ.(*cq.CQ)
		if !ok1 || !ok2 || !ok3 {
			return nil, fmt.Errorf("%w: objects of another Verbs", ErrInvalidArg)
		}
		qi := roce.QPInit{Type: in.Type, SendCQ: scq, RecvCQ: rcq, Cap: in.Cap, SigAll: in.SigAll}
		if in.SRQ != nil {
			s, ok := in.SRQ.(*qp.SRQ)
			if !ok {
				return nil, fmt.Errorf("%w: SRQ of another Verbs", ErrInvalidArg)
			}
			qi.SRQ = s
		}
		q, err := id.CreateQP(p, qi)
		if err != nil {
			return nil, err
		}
		return q, nil
	}
	if (in.Type == qp.TypeUD) != (id.ps == cm.PSUDP) {
		return nil, fmt.Errorf("%w: QP type %v in port space %#x", ErrInvalidArg, in.Type, uint16(id.ps))
	}
	id.mu.Lock()
	busy := id.vqp != nil || id.state == stDestroyed
	id.mu.Unlock()
	if busy {
		return nil, ErrState
	}
	in.PD = pd
	q, err := id.rem.r.CreateQP(in)
	if err != nil {
		return nil, err
	}
	if err := id.rem.r.CMSetQP(id.rh, q); err != nil {
		q.Destroy()
		return nil, err
	}
	id.mu.Lock()
	id.vqp = q
	id.mu.Unlock()
	return q, nil
}

// QueuePair returns the ID's QP as a roce.QueuePair, in both modes (nil if
// none).
func (id *ID) QueuePair() roce.QueuePair {
	id.mu.Lock()
	defer id.mu.Unlock()
	if id.qp != nil {
		return id.qp
	}
	if id.vqp != nil {
		return id.vqp
	}
	return nil
}
