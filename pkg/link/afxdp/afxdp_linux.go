package afxdp

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/internal/race"
	"github.com/softroce/softroce/pkg/link/udp"
)

// Options configure Open. The path needs CAP_NET_ADMIN, CAP_BPF (or root) and one IPv4
// address.
type Options struct {
	// UDP configures the link's UDP socket (link/udp): Addrs must be one IPv4 address; GSO and
	// GRO are turned off (the ring's frames carry IPv4 ID 0: no GSO runs; the socket gets
	// single datagrams).
	UDP udp.Options
	// Interface is the interface that holds the link's address; "" finds it by the address.
	Interface string
	// Queue is the receive queue the socket binds to.
	Queue uint32
	// Native attaches the program in the driver's XDP hook (XDP_FLAGS_DRV_MODE, a
	// multi-buffer-aware program) instead of the generic one; the driver must support it
	// (veth does).
	Native bool
	// NoPairs keeps a [request, response] pair of one flow as two ring frames. By default, on
	// a veth, such a pair leaves as one AF_PACKET frame asking for UDP GSO (pair_linux.go),
	// where the kernel takes it (Linux 6.2 and later).
	NoPairs bool
	// WriteMemory, when > 0, gives the XDP program a write responder with this many bytes of
	// device memory (write_linux.go): RC WRITE Only requests to QPs and MRs registered with
	// AddWriteQP / AddWriteMR are executed and ACKed in the program.
	WriteMemory int
}

// Link is the link.Link of the AF_XDP path returned by Open: the rings for what fits, its UDP
// socket (a link/udp Link) for the rest.
type Link struct {
	u      *udp.Link
	x      *xdpSock
	closed atomic.Bool
	rmu    sync.Mutex // the receive side: the rings' consumer, the socket's reads, Close
}

var (
	_ link.StatsLink          = (*Link)(nil)
	_ link.LockedPollReceiver = (*Link)(nil)
	_ link.RunSender          = (*Link)(nil)
	_ link.PairSender         = (*Link)(nil)
	_ link.WriteResponder     = (*Link)(nil)
	_ udp.StatsLink           = (*Link)(nil)
	_ StatsLink               = (*Link)(nil)
)

// Open opens the UDP socket (o.UDP), the AF_XDP socket on the address's interface and queue,
// and attaches the XDP program that feeds it.
func Open(o Options) (*Link, error) {
	if len(o.UDP.Addrs) != 1 {
		return nil, fmt.Errorf("listen udp: the AF_XDP path takes one address, not %d: %w", len(o.UDP.Addrs), link.ErrInvalidAddr)
	}
	o.UDP.GSO, o.UDP.GRO = udp.GSOOff, false
	u, err := udp.Listen(o.UDP)
	if err != nil {
		return nil, err
	}
	l := &Link{u: u}
	if l.x, err = openXDP(l, o); err != nil {
		u.Close()
		return nil, fmt.Errorf("listen udp %v: %w", o.UDP.Addrs[0], err)
	}
	return l, nil
}

// UDP returns the link's UDP socket link (its LocalAddrPorts, BufferSizes...); sending and
// receiving through it bypasses the rings.
func (l *Link) UDP() *udp.Link { return l.u }

// validate applies Send's checks to a whole batch (those of link/udp, for the link's one
// address).
func (l *Link) validate(batch []link.Datagram) error {
	for i := range batch {
		d := &batch[i]
		if !d.Src.IsValid() || d.Src.Port() == 0 || !d.Dst.IsValid() || d.Dst.Port() == 0 {
			return fmt.Errorf("send %v -> %v: %w", d.Src, d.Dst, link.ErrInvalidAddr)
		}
		if d.Src.Addr().Unmap().WithZone("") != l.x.addr {
			return fmt.Errorf("send from %v: %w", d.Src.Addr(), link.ErrNoLocalAddr)
		}
		if d.Dst.Addr().Unmap().Is6() {
			return fmt.Errorf("send %v -> %v: address families differ: %w", d.Src, d.Dst, link.ErrInvalidAddr)
		}
		if len(d.Buf) > link.MaxDatagram {
			return fmt.Errorf("send %d bytes: %w", len(d.Buf), link.ErrTooLarge)
		}
	}
	return nil
}

// Send transmits the batch in order: what fits through the transmit ring, the rest through
// the UDP socket (queued frames leave before a socket send). Invalid input fails the whole
// batch before anything is sent; datagrams the kernel refuses are dropped and counted.
func (l *Link) Send(batch []link.Datagram) error {
	if l.closed.Load() {
		return net.ErrClosed
	}
	race.Sent()
	if err := l.validate(batch); err != nil {
		return err
	}
	return l.sendXDP(batch)
}

// RunGSO implements link.RunSender: never (the ring's frames carry IPv4 ID 0, and the socket
// has GSO off).
func (l *Link) RunGSO(local netip.Addr) bool { return l.u.RunGSO(local) }

// PairGSO implements link.PairSender: the GSO pairs are on for local (pair_linux.go).
func (l *Link) PairGSO(local netip.Addr) bool {
	if x := l.x; x.pairsOn.Load() && local.Unmap() == x.addr {
		return true
	}
	return l.u.RunGSO(local)
}

// SendRuns implements link.RunSender: a run of two goes as one GSO pair where it can, runs of
// one as Send, anything else through the UDP socket (link/udp's SendRuns, which rewrites the
// ICRCs of datagrams k > 0 for ID 0).
func (l *Link) SendRuns(batch []link.Datagram, runs []uint8) error {
	if l.closed.Load() {
		return net.ErrClosed
	}
	race.Sent()
	if err := l.validate(batch); err != nil {
		return err
	}
	if !link.ValidRuns(batch, runs) {
		return link.ErrInvalidRun
	}
	for _, c := range runs {
		if int(c) > l.u.BatchSize() { // a run must fit one sendmmsg call (link/udp)
			return link.ErrInvalidRun
		}
	}
	if len(runs) == 1 && runs[0] == 2 {
		return l.sendXDPPair(batch)
	}
	if slices.IndexFunc(runs, func(c uint8) bool { return c > 1 }) < 0 {
		return l.sendXDP(batch)
	}
	return l.u.SendRuns(batch, runs)
}

// Recv waits for datagrams (the ring, the UDP socket or Close, in poll(2)) and copies them
// into the caller's buffers. Src is the peer, Dst the link's address and port.
func (l *Link) Recv(batch []link.Datagram) (int, error) {
	if l.closed.Load() {
		return 0, net.ErrClosed
	}
	defer race.Received()
	if len(batch) == 0 {
		return 0, nil
	}
	return l.recvXDP(batch)
}

// TryRecv implements link.PollReceiver: one non-blocking read of the ring (views of the
// UMEM, valid until the next read) and, now and then, of the UDP socket (recv_linux.go).
func (l *Link) TryRecv(batch []link.Datagram) (int, error) {
	if l.closed.Load() {
		return 0, net.ErrClosed
	}
	if len(batch) == 0 {
		return 0, nil
	}
	// no defers: a polling loop calls this millions of times a second
	l.rmu.Lock()
	n, err := l.tryRecvLocked(batch)
	l.rmu.Unlock()
	race.Received()
	return n, err
}

// RecvMutex implements link.LockedPollReceiver: the lock of the link's receive side (Close
// takes it before it unmaps the rings).
func (l *Link) RecvMutex() *sync.Mutex { return &l.rmu }

// TryRecvLocked implements link.LockedPollReceiver: TryRecv for a caller holding RecvMutex.
func (l *Link) TryRecvLocked(batch []link.Datagram) (int, error) {
	if l.closed.Load() {
		return 0, net.ErrClosed
	}
	if len(batch) == 0 {
		return 0, nil
	}
	n, err := l.tryRecvLocked(batch)
	race.Received()
	return n, err
}

// tryRecvLocked is TryRecv's read (rmu held).
func (l *Link) tryRecvLocked(batch []link.Datagram) (int, error) {
	if l.closed.Load() {
		return 0, net.ErrClosed
	}
	return l.tryRecvXDP(batch, false, false)
}

// BatchSize returns the UDP socket's batch size (udp.Options.BatchSize).
func (l *Link) BatchSize() int { return l.u.BatchSize() }

// LocalAddrs returns the link's address.
func (l *Link) LocalAddrs() []netip.Addr { return l.u.LocalAddrs() }

// SourcePort is the UDP socket's (link/udp: the entropy port when its send-only socket is
// open); a ring frame carries the same port.
func (l *Link) SourcePort(local netip.Addr, entropy uint16) uint16 {
	return l.u.SourcePort(local, entropy)
}

// Stats implements link.StatsLink: the UDP socket's counters and the rings' together.
func (l *Link) Stats() link.Stats {
	st := l.u.Stats()
	x := l.x
	st.Add(link.Stats{Sent: x.sent.Load(), Received: x.received.Load(), SendBatches: x.sendBatches.Load(),
		RecvBatches: x.recvBatches.Load()})
	return st
}

// UDPStats implements udp.StatsLink: the UDP socket's own counters.
func (l *Link) UDPStats() udp.Stats { return l.u.UDPStats() }

// Stats are the AF_XDP path's own counters (StatsLink).
type Stats struct {
	// Sent and Received count the datagrams that went through the rings (also in link.Stats);
	// Fallbacks the sends that took the UDP socket instead (no MAC address known for the peer
	// yet, too large, ring full).
	Sent, Received, Fallbacks uint64
	// Pairs counts the [request, response] pairs sent as one GSO frame (their datagrams are in
	// Sent); PairsOff is 1 once the kernel refused one and pairs went off for good (a kernel
	// before 6.2).
	Pairs, PairsOff uint64
	// Writes counts the RDMA WRITEs the write responder executed in the XDP program (and
	// ACKed there): requests and ACKs that no other counter sees (Options.WriteMemory).
	Writes uint64
	// CsumErrors counts the datagrams the rings dropped for a wrong UDP checksum (the kernel's
	// UDP receive would have; the rings bypass it).
	CsumErrors uint64
}

// Add adds o's counters to s (a device sums its links').
func (s *Stats) Add(o Stats) {
	s.Sent += o.Sent
	s.Received += o.Received
	s.Fallbacks += o.Fallbacks
	s.Pairs += o.Pairs
	s.PairsOff += o.PairsOff
	s.Writes += o.Writes
	s.CsumErrors += o.CsumErrors
}

// StatsLink is implemented by links with the AF_XDP path.
type StatsLink interface {
	XDPStats() Stats
}

// XDPStats implements StatsLink.
func (l *Link) XDPStats() Stats {
	x := l.x
	st := Stats{Sent: x.sent.Load(), Received: x.received.Load(), Fallbacks: x.fallbacks.Load(), CsumErrors: x.csumErrors.Load(),
		Pairs: x.pairs.Load(), PairsOff: x.pairsOff.Load()}
	if x.writes != nil {
		st.Writes = x.writes.executed()
	}
	return st
}

// Close detaches the program, closes the AF_XDP socket and the UDP socket, and unblocks Recv
// and Send.
func (l *Link) Close() error {
	if l.closed.Swap(true) {
		return nil
	}
	x := l.x
	x.wake() // a Recv in poll(2) returns and lets go of the receive side
	l.rmu.Lock()
	x.txmu.Lock()
	x.close()
	x.txmu.Unlock()
	l.rmu.Unlock()
	return l.u.Close()
}
