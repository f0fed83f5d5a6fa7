package link

import "net/netip"

// DeviceMemory is implemented by links that have device memory: memory a program in the
// kernel's receive path can write (link/afxdp: a BPF array map mapped into the process), as an
// RNIC's on-chip memory behind ibv_alloc_dm. A link of such a path without it returns nil.
type DeviceMemory interface {
	// DeviceMemory returns the device memory (nil: none). When the link closes, anonymous
	// memory replaces it at the same addresses: a late access does not fault, but nothing is
	// shared any more.
	DeviceMemory() []byte
}

// WriteResponder is implemented by links whose receive path can execute a peer's RC RDMA
// WRITE Only into device memory and send its ACK itself, before the engine sees the request
// (link/afxdp's XDP program, as kernel rxe does in the sender's softirq). The engine shares a
// QP's responder state with it through a WriteState (internal/qp writes.go). Methods return
// ErrNoWriteResponder when the link has none.
type WriteResponder interface {
	DeviceMemory
	// AddWriteQP lets the responder execute q's WRITEs from expected PSN epsn and MSN msn on;
	// the QP starts paused if paused is set (Resume lets the responder in).
	AddWriteQP(q WriteQP, epsn, msn uint32, paused bool) (WriteState, error)
	// RemoveWriteQP takes the QP out (first paused: a WRITE being executed is finished before
	// it returns); the state stays readable.
	RemoveWriteQP(s WriteState)
	// AddWriteMR lets the responder write R_Key rkey: length bytes at device memory offset
	// off, which the requester addresses from va on, in protection domain pd (only MRs that
	// allow remote writes belong here).
	AddWriteMR(rkey, pd uint32, va, length, off uint64) error
	// RemoveWriteMR takes rkey out and returns once no execution can still write through it
	// (IBTA 10.6.3.5: no access after deregistration).
	RemoveWriteMR(rkey uint32)
}

// WriteQP describes an RC QP whose WRITE Only requests a WriteResponder may execute.
type WriteQP struct {
	// QPN is the QP's number (the requests' destination QP).
	QPN uint32
	// PD identifies its protection domain (equal to an MR's for the MR to be writable).
	PD uint32
	// Local is the QP's address (the link's; invalid: the link's), Peer the requester's (the
	// QP's path), SrcPort and DstPort the UDP ports its ACKs carry (DstPort 0: 4791), TClass
	// their traffic class.
	Local, Peer      netip.Addr
	SrcPort, DstPort uint16
	TClass           uint8
	// ACK is the BTH and AETH of the QP's ACK as its engine responder builds it, with PSN 0
	// and MSN 0 (the responder fills them in).
	ACK [16]byte
}

// WriteState is one QP's responder state shared between the engine and a WriteResponder:
// who executes the request at the expected PSN. Once the QP is removed (or the link closed)
// it keeps the last state and count.
type WriteState interface {
	// Pause keeps the responder from executing (waiting out a request it is executing) and
	// returns the expected PSN and MSN.
	Pause() (epsn, msn uint32)
	// Resume publishes the expected PSN and MSN; unless paused, the responder executes the
	// WRITE at epsn and those after.
	Resume(epsn, msn uint32, paused bool)
	// Executed counts the WRITE messages the responder executed for the QP.
	Executed() uint64
}
