package proto

// rdma_cm through the daemon (docs/daemon.md, "rdma_cm"): a client's CM IDs
// are handles in its session like its other objects; the requests below
// are JSON like the other control requests. Events: the daemon queues the
// session's rdma_cm events, bumps the CM sequence word in the event ring's
// page (CMSeqOff) and signals the event ring's eventfd; the client, woken,
// sees the word changed and fetches every queued event with OpCMGetEvents.
// A word instead of ring entries: a CM event carries up to 196 bytes of
// private data, and a word cannot overflow, so no wake-up is ever lost.

import (
	"net/netip"
	"sync/atomic"

	"github.com/softroce/softroce/internal/cm"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/rdmacm"
)

// rdma_cm requests (numbered apart from the verbs requests, so both lists
// grow independently).
const (
	OpCMCreateID     Op = 64 + iota // CMCreateIDReq -> HandleResp
	OpCMBindAddr                    // CMAddrReq -> CMAddrResp
	OpCMResolveAddr                 // CMAddrReq -> CMAddrResp
	OpCMResolveRoute                // HandleReq -> rdmacm.Route
	OpCMSetQP                       // CMSetQPReq
	OpCMListen                      // CMListenReq -> CMAddrResp
	OpCMConnect                     // CMConnParamReq
	OpCMAccept                      // CMConnParamReq (Param nil = rdma_accept(NULL))
	OpCMReject                      // CMRejectReq
	OpCMDisconnect                  // HandleReq
	OpCMDestroyID                   // HandleReq
	OpCMGetEvents                   // -> CMEvents
	opCMMax
)

// IsCM reports whether op is an rdma_cm request.
func (op Op) IsCM() bool { return op >= OpCMCreateID && op < opCMMax }

// CMCreateIDReq is rdma_create_id.
type CMCreateIDReq struct{ PortSpace cm.PortSpace }

// CMAddrReq is rdma_bind_addr (Addr) and rdma_resolve_addr (Src, Addr =
// the destination).
type CMAddrReq struct {
	H    Handle
	Src  netip.Addr
	Addr netip.AddrPort
}

// CMAddrResp returns an ID's addresses.
type CMAddrResp struct{ Local, Remote netip.AddrPort }

// CMSetQPReq binds the client's QP (handle QP) to the ID (rdma_create_qp).
type CMSetQPReq struct{ H, QP Handle }

// CMListenReq is rdma_listen.
type CMListenReq struct {
	H       Handle
	Backlog int
}

// CMConnParamReq is rdma_connect / rdma_accept.
type CMConnParamReq struct {
	H     Handle
	Param *rdmacm.ConnParam
}

// CMRejectReq is rdma_reject.
type CMRejectReq struct {
	H           Handle
	PrivateData []byte
}

// CMEvent is one rdma_cm event of the session, IDs by handle.
type CMEvent struct {
	Type   cm.EventType
	ID     Handle
	Listen Handle `json:",omitempty"`
	// Rejected: the REJ reason (REJECTED events); Status: the error text
	// of any other failed event; StatusCode its sentinel (CodeOf).
	Rejected   bool   `json:",omitempty"`
	Reason     uint16 `json:",omitempty"`
	Status     string `json:",omitempty"`
	StatusCode int    `json:",omitempty"`
	Param      rdmacm.ConnParam
	// UD: ESTABLISHED of a UD ID (the SIDR answer; AH resolved by the daemon).
	UDQPN, UDQKey uint32 `json:",omitempty"`
	AH            *qp.AH `json:",omitempty"`
	// CONNECT_REQUEST: the new ID's addresses and route.
	Local, Remote netip.AddrPort
	Route         rdmacm.Route
}

// CMEvents is the OpCMGetEvents response: every event queued, in order.
type CMEvents struct{ Events []CMEvent }

// CMSeqOff is the offset, in the event ring's region, of the CM sequence
// word (after the ring's entries).
const CMSeqOff = 2048

// BumpCM advances the CM sequence word (producer: the daemon).
func (r *EventRing) BumpCM() { atomic.AddUint64(r.u64(CMSeqOff), 1) }

// CMSeq reads the CM sequence word (consumer: the client).
func (r *EventRing) CMSeq() uint64 { return atomic.LoadUint64(r.u64(CMSeqOff)) }
