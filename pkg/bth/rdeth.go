package bth

// RDETHSize is the size of the Reliable Datagram Extended Transport Header.
const RDETHSize = 4

// RDETH is a view of the Reliable Datagram Extended Transport Header (IBTA
// Vol 1 9.3.1), carried first after the BTH by every RD packet.
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|   Reserved    |                 EE Context                    |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
type RDETH []byte

// EEContext returns the 24-bit end-to-end context.
func (r RDETH) EEContext() uint32 { return get24(r[1:]) }

// SetEEContext sets the end-to-end context (low 24 bits).
func (r RDETH) SetEEContext(v uint32) { put24(r[1:], v) }

// XRCETHSize is the size of the XRC Extended Transport Header.
const XRCETHSize = 4

// XRCETH is a view of the XRC Extended Transport Header (IBTA Vol 1 Annex
// A14, eXtended Reliable Connected transport), carried first after the BTH
// by XRC requests: the destination shared receive queue.
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|   Reserved    |                  XRC SRQ                      |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
type XRCETH []byte

// XRCSRQ returns the 24-bit XRC shared receive queue number.
func (x XRCETH) XRCSRQ() uint32 { return get24(x[1:]) }

// SetXRCSRQ sets the XRC SRQ number (low 24 bits).
func (x XRCETH) SetXRCSRQ(v uint32) { put24(x[1:], v) }
