// Package link is the I/O seam between the RoCEv2 transport engine and the network: batches of UDP
// datagrams whose payloads are RoCEv2 packets (BTH .. ICRC, IBTA Annex A17.4), moved in the style of
// wireguard-go's conn.Bind (batched Send/Recv with caller-provided buffers).
//
// The seam is small: Datagram, Link (Send, Recv, BatchSize, LocalAddrs, SourcePort, Close) and
// the errors every implementation returns. What only some paths can do is an optional capability,
// an interface a caller upgrades to with a type assertion (quic-go's interface upgrade): counters
// (StatsLink), non-blocking and zero-copy reads (PollReceiver, LockedPollReceiver, ViewReceiver),
// engine-marked GSO runs (RunSender, PairSender, with the grouping rule RunRule), device memory
// and the write responder of the XDP program (DeviceMemory, WriteResponder).
//
// One package per path implements it, each readable alone:
//   - link/mem: an in-memory network for tests (routes by destination address, bounded receive
//     queues, drop-or-block when full, no allocation per datagram in steady state);
//   - link/udp: unconnected UDP sockets bound to ADDR:4791 (IBTA A17.2.3), DF set, batched
//     sendmmsg/recvmmsg, UDP GSO/GRO, entropy source ports, SO_REUSEPORT shards, busy polling;
//   - link/afxdp: the AF_XDP path (an XDP program, the socket's rings and UMEM, the neighbour
//     table, GSO pairs, the write responder), over a link/udp socket for what the rings cannot carry;
//   - link/fault: a decorator that injects faults into any Link.
//
// See docs/link.md.
package link

import (
	"errors"
	"net/netip"
)

// MaxDatagram is the largest UDP payload a Link carries; Recv buffers must have at least this
// capacity to be sure never to truncate.
const MaxDatagram = 65535

// UDPPort is the RoCEv2 UDP destination port (IBTA A17.2.3).
const UDPPort = 4791

// Datagram is one UDP datagram whose payload is a RoCEv2 packet (BTH .. ICRC).
type Datagram struct {
	// Buf is the UDP payload; on Recv, a reslice of the caller's buffer.
	Buf []byte
	// Src, on Send, is the local address to send from (its port must be non-zero: the engine
	// always sets the RoCE source port it used in the ICRC, see Link.SourcePort); on Recv, the peer.
	Src netip.AddrPort
	// Dst, on Send, is the peer (port 4791); on Recv, the local address it arrived on.
	Dst netip.AddrPort
	// TClass, on Send, is the IPv4 TOS / IPv6 Traffic Class byte to send with: the address
	// vector's GRH TClass, which RoCEv2 carries in the IP header (IBTA A17.4.5; rxe puts
	// grh.traffic_class there), its low two bits the ECN field (ECT(0) on ECN-capable data,
	// IBTA A17.9.1, RFC 3168). 0 is the socket's default, 0. On Recv, the byte the datagram
	// arrived with, whose ECN field is CE (ECNCE) when a switch marked it: link/udp reads it
	// with IP_RECVTOS / IPV6_RECVTCLASS, link/afxdp from the IP header, link/mem delivers the
	// sender's (and link/fault may mark it); 0 where a path cannot know it.
	TClass uint8
	// HasIPv4ID, on Recv, says IPv4ID is the Identification of the IPv4 header the datagram
	// arrived with: a link that sees the whole frame (the AF_XDP path) knows it, a UDP socket
	// does not (false). The ICRC covers it (IBTA A17.3.3): a receiver that knows it checks the
	// ICRC with it instead of solving for it (docs/wire.md). Ignored on Send.
	HasIPv4ID bool
	IPv4ID    uint16
}

// ECN codepoints (RFC 3168 section 5): the low two bits of Datagram.TClass.
const (
	ECNMask   = 0b11
	ECNNotECT = 0b00 // not ECN-capable: a congested switch drops it
	ECNECT1   = 0b01
	ECNECT0   = 0b10 // ECN-capable, what softroce's data packets carry
	ECNCE     = 0b11 // congestion experienced: marked by a switch instead of dropped
)

// CE reports whether the datagram arrived marked Congestion Experienced.
func (d *Datagram) CE() bool { return d.TClass&ECNMask == ECNCE }

// Link moves batches of datagrams. Implementations: link/mem (tests), link/udp, link/afxdp.
type Link interface {
	// Send transmits the batch in order. It does not retain the buffers after returning.
	Send(batch []Datagram) error
	// Recv blocks until at least one datagram is available, then fills batch[0:n]: the caller
	// provides batch[i].Buf with cap >= MaxDatagram, Recv reslices them. Returns net.ErrClosed
	// after Close.
	Recv(batch []Datagram) (n int, err error)
	// BatchSize is the preferred batch length.
	BatchSize() int
	// LocalAddrs lists the addresses this link receives on (GID table source).
	LocalAddrs() []netip.Addr
	// SourcePort is the UDP source port a send from local will carry on the wire, given the
	// RoCE entropy port (bth.SourcePort, IBTA A17.3.2) the engine would like.
	SourcePort(local netip.Addr, entropy uint16) uint16
	// Close releases the link and unblocks Recv.
	Close() error
}

// Errors returned by this package. Wrapped errors can be matched with errors.Is.
var (
	// ErrAddrInUse: an address is already attached to the network, or listed twice.
	ErrAddrInUse = errors.New("link: address already in use")
	// ErrInvalidAddr: an address is not valid (zero netip.Addr, or a zero port on Send).
	ErrInvalidAddr = errors.New("link: invalid address")
	// ErrNoLocalAddr: a Send's Src address is not one of the link's local addresses.
	ErrNoLocalAddr = errors.New("link: source address is not local to this link")
	// ErrTooLarge: a datagram exceeds MaxDatagram.
	ErrTooLarge = errors.New("link: datagram larger than MaxDatagram")
	// ErrInvalidRun: SendRuns was given runs that do not cover the batch or break RunRule.
	ErrInvalidRun = errors.New("link: invalid GSO run")
	// ErrNoWriteResponder: the link has no XDP write responder (link/afxdp without
	// WriteMemory, or another path).
	ErrNoWriteResponder = errors.New("link: no XDP write responder")
)
