// Package link is the I/O seam between the RoCEv2 transport engine and the network: batches of UDP
// datagrams whose payloads are RoCEv2 packets (BTH .. ICRC, IBTA Annex A17.4), moved in the style of
// wireguard-go's conn.Bind (batched Send/Recv with caller-provided buffers).
//
// Two implementations:
//   - MemNetwork/Attach: an in-memory network for tests (routes by destination address, bounded
//     receive queues, drop-or-block when full, no allocation per datagram in steady state);
//   - ListenUDP: unconnected UDP sockets bound to ADDR:4791 (IBTA A17.2.3 fixes the destination
//     port 4791), with DF set (IP_PMTUDISC_DO, which makes Linux write IPv4 ID 0 — the ICRC of
//     IBTA A17.3.3 covers that field), batched sendmmsg/recvmmsg and optional UDP GSO/GRO.
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
	// grh.traffic_class there). 0 is the socket's default, 0. Links that cannot set it per
	// datagram (the in-memory network) ignore it; Recv leaves it 0.
	TClass uint8
	// HasIPv4ID, on Recv, says IPv4ID is the Identification of the IPv4 header the datagram
	// arrived with: a link that sees the whole frame (the AF_XDP path) knows it, a UDP socket
	// does not (false). The ICRC covers it (IBTA A17.3.3): a receiver that knows it checks the
	// ICRC with it instead of solving for it (docs/wire.md). Ignored on Send.
	HasIPv4ID bool
	IPv4ID    uint16
}

// Link moves batches of datagrams. Implementations: the in-memory network (tests) and UDP sockets.
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

// Stats are a link's counters. All are cumulative since the link was created.
type Stats struct {
	Sent        uint64 // datagrams handed to the network
	Received    uint64 // datagrams returned by Recv
	SendBatches uint64 // Send calls that sent at least one datagram (UDP: sendmmsg calls)
	RecvBatches uint64 // Recv calls that returned at least one datagram (UDP: recvmmsg calls)
	GSOSends    uint64 // UDP: messages sent with UDP_SEGMENT (each carries >= 2 datagrams)
	GROReceives uint64 // UDP: received messages coalesced by GRO (split into >= 2 datagrams)
	Drops       uint64 // datagrams dropped: receive queue full (mem), send errors (UDP)
	Truncated   uint64 // datagrams longer than the Recv buffer (cut to the buffer's capacity)
	Fallbacks   uint64 // UDP: GSO or GRO turned off after the kernel refused it
	// EntropySockets (UDP) is the number of send-only entropy-port sockets open now (a gauge).
	EntropySockets uint64
	// EntropyFallbacks (UDP) counts entropy ports that send from the main socket instead, for
	// good: their bind was refused (another program holds the port) or the pool was full.
	EntropyFallbacks uint64
	// XDPSent and XDPReceived (UDP with the AF_XDP path) count the datagrams that went through
	// the AF_XDP socket's rings (also in Sent and Received); XDPFallbacks the sends that took
	// the UDP socket instead (no MAC address known for the peer yet, too large, ring full).
	XDPSent, XDPReceived, XDPFallbacks uint64
	// XDPPairs counts the [request, response] pairs sent as one GSO frame on the AF_XDP path
	// (their datagrams are in XDPSent); XDPPairsOff is 1 once the kernel refused one and pairs
	// went off for good (a kernel before 6.2).
	XDPPairs, XDPPairsOff uint64
	// XDPWrites counts the RDMA WRITEs the AF_XDP path's write responder executed in its XDP
	// program (and ACKed there): requests and ACKs that no other counter sees
	// (XDPOptions.WriteMemory).
	XDPWrites uint64
}

// StatsLink is implemented by links that count (both implementations here).
type StatsLink interface {
	Link
	Stats() Stats
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
)
