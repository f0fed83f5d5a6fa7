// Package afxdp is the AF_XDP path, a link.Link for the latency of kernel rxe (docs/link.md
// "AF_XDP path"). A UDP socket's receive costs a system call per read and its send runs the
// IP/UDP stack; kernel rxe does neither (its receive runs in the sender's softirq, its post is
// one system call). An XDP program on the link's interface redirects the link's own RoCEv2
// datagrams (IPv4, no IP options, not fragmented, to the link's address and port, at most
// MaxFrame bytes) to an AF_XDP socket, whose receive ring the link reads in memory: no system
// call per read. Sends of datagrams that fit go as Ethernet frames the link builds (IPv4 ID 0
// and DF, as the UDP socket's; UDP checksum 0, which IPv4 allows) through the socket's transmit
// ring, one sendto per Send.
//
// Everything else goes through a link/udp socket bound to the same address and port, which the
// Link owns and keeps open: frames the program passes (ARP, IPv6, larger or fragmented
// datagrams) and sends the ring cannot take (no MAC address known for the peer yet, too large,
// ring full); SourcePort's entropy ports are that link's too. The dependency runs one way,
// afxdp -> udp: an AF_XDP socket cannot carry all of a device's traffic and always needs a
// socket beside it, while a UDP socket needs nothing of AF_XDP, so link/udp stays readable
// alone and this package adds the rings, the UMEM, the neighbour table, the XDP programs, the
// GSO pairs (pair_linux.go) and the write responder (write_linux.go) on top of it.
//
// The peer's MAC address is learned from the frames it sends (their Ethernet source: the peer,
// or the router it sits behind) or, before its first frame, from the kernel's neighbour table
// (an on-link peer the host has talked to, e.g. over the out-of-band TCP connection); until
// then sends to it go through the UDP socket, whose kernel path resolves ARP. Copy mode
// (XDP_COPY) and the generic (SKB) XDP hook work on any driver and MTU; one socket on one
// receive queue (Options.Queue): on a multi-queue NIC the other queues' datagrams reach the
// UDP socket (one flow keeps one queue).
//
// On a veth or loopback a peer's UDP GSO message crosses unsegmented and reaches the ring as
// one datagram holding several RoCE packets; SegmentSize finds its segments (split.go).
//
// Linux only (the split of GSO messages is portable).
package afxdp
