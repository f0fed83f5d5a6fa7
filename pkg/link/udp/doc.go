// Package udp is the link.Link over UDP sockets: one unconnected socket per local address, bound
// to ADDR:4791 (IBTA A17.2.3 fixes the destination port), DF set (IP_PMTUDISC_DO, which makes
// Linux write IPv4 ID 0 — the ICRC of IBTA A17.3.3 covers that field), batched
// sendmmsg/recvmmsg, UDP GSO and GRO (with the engine's GSO runs, link.RunSender), send-only
// sockets that give each flow its RoCEv2 entropy source port (IBTA A17.3.2), SO_REUSEPORT
// shards steered by destination QP, busy polling and non-blocking reads for polled devices.
// Linux only. See docs/link.md.
//
// Pipeline (one Link, one socket per local address):
//
//	Send(batch): validate all -> split into runs of consecutive datagrams with the same source
//	socket -> per run, under the socket's send lock, fill preallocated mmsghdr/iovec/sockaddr
//	arrays (and UDP_SEGMENT cmsgs when GSO groups equal-size datagrams to one peer) -> sendmmsg
//	through RawConn.Write (the poller parks the goroutine on EAGAIN).
//	Recv(batch), one socket: under the receive lock, point the iovecs at the caller's buffers ->
//	recvmmsg through RawConn.Read (parks on EAGAIN).
//	Recv(batch), several sockets: a waiter goroutine per socket parks in RawConn.Read on a
//	MSG_PEEK probe and signals `ready`; Recv tries every socket without blocking (RawConn.Control)
//	and only waits on `ready` when all were empty, re-arming each waiter it found empty.
//
// All per-datagram state lives in arrays allocated at Listen: no allocation per datagram.
package udp
