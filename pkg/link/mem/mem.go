// Package mem is an in-memory network of links (link.Link) for tests: it routes datagrams by
// destination address to the link attached to that address, with a bounded receive queue per
// link that drops (as a UDP socket does) or blocks when full, and no allocation per datagram
// once its slots have warmed up. See docs/link.md.
package mem

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/softroce/softroce/pkg/link"
)

// FullPolicy says what the in-memory network does when a receiver's queue is full.
type FullPolicy uint8

const (
	// DropWhenFull drops the datagram and counts it in the receiver's link.Stats.Drops, as a UDP
	// socket with a full receive buffer does. The default.
	DropWhenFull FullPolicy = iota
	// BlockWhenFull makes Send wait until the receiver has room (or is closed): lossless, for
	// tests that must not see loss. A receiver that never reads blocks its senders.
	BlockWhenFull
)

// Options configure an in-memory network. The zero value is usable.
type Options struct {
	// QueueDepth is each link's receive queue length in datagrams; 0 means 1024.
	QueueDepth int
	// Full is the policy when a receive queue is full; the zero value drops.
	Full FullPolicy
	// BatchSize is what the links report as BatchSize; 0 means 64.
	BatchSize int
}

// Network joins in-memory links by address: a datagram sent to Dst is queued at the link
// attached to Dst's address (the port is carried, not routed on). Datagrams to addresses with no
// link are dropped and counted (DroppedUnknown). Safe for concurrent use.
type Network struct {
	opts    Options
	mu      sync.RWMutex
	links   map[netip.Addr]*memLink
	unknown atomic.Uint64
}

// NewNetwork returns an empty in-memory network.
func NewNetwork(o Options) *Network {
	if o.QueueDepth <= 0 {
		o.QueueDepth = 1024
	}
	if o.BatchSize <= 0 {
		o.BatchSize = 64
	}
	return &Network{opts: o, links: make(map[netip.Addr]*memLink)}
}

// DroppedUnknown counts datagrams sent to an address no link is attached to.
func (n *Network) DroppedUnknown() uint64 { return n.unknown.Load() }

// Attach returns a link.Link receiving on addrs (IPv4-mapped IPv6 addresses are treated as IPv4).
// It fails with link.ErrAddrInUse if an address is already attached, link.ErrInvalidAddr if one is invalid.
func (n *Network) Attach(addrs ...netip.Addr) (link.Link, error) {
	l := &memLink{net: n, ring: make([]memSlot, n.opts.QueueDepth), policy: n.opts.Full,
		batch: n.opts.BatchSize}
	l.notEmpty.L = &l.mu
	l.notFull.L = &l.mu
	seen := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		if !a.IsValid() {
			return nil, fmt.Errorf("attach %v: %w", a, link.ErrInvalidAddr)
		}
		a = a.Unmap()
		if seen[a] {
			return nil, fmt.Errorf("attach %v: %w", a, link.ErrAddrInUse)
		}
		seen[a] = true
		l.addrs = append(l.addrs, a)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, a := range l.addrs {
		if n.links[a] != nil {
			return nil, fmt.Errorf("attach %v: %w", a, link.ErrAddrInUse)
		}
	}
	for _, a := range l.addrs {
		n.links[a] = l
	}
	return l, nil
}

func (n *Network) lookup(a netip.Addr) *memLink {
	n.mu.RLock()
	l := n.links[a.Unmap()]
	n.mu.RUnlock()
	return l
}

// memSlot is one queued datagram. Its buffer is kept and reused by later datagrams, so the queue
// stops allocating once every slot has held a datagram as large as the ones now sent.
type memSlot struct {
	buf      []byte
	src, dst netip.AddrPort
	tclass   uint8 // the sender's TClass: the in-memory network carries the IP header's byte
}

// memLink is a link.Link on a Network. The receive queue is a ring of slots under mu.
type memLink struct {
	net    *Network
	addrs  []netip.Addr
	policy FullPolicy
	batch  int

	mu       sync.Mutex
	notEmpty sync.Cond
	notFull  sync.Cond
	ring     []memSlot
	head     int
	count    int
	closed   bool

	sent, received, sendBatches, recvBatches, drops, truncated atomic.Uint64
}

var (
	_ link.StatsLink    = (*memLink)(nil)
	_ link.PollReceiver = (*memLink)(nil)
)

func (l *memLink) isLocal(a netip.Addr) bool {
	a = a.Unmap()
	for _, x := range l.addrs {
		if x == a {
			return true
		}
	}
	return false
}

// Send copies each datagram into the destination link's queue. Invalid input (zero ports,
// foreign Src, oversized payload) fails the whole batch before anything is sent.
func (l *memLink) Send(batch []link.Datagram) error {
	for i := range batch {
		d := &batch[i]
		if !d.Src.IsValid() || d.Src.Port() == 0 || !d.Dst.IsValid() {
			return fmt.Errorf("send %v -> %v: %w", d.Src, d.Dst, link.ErrInvalidAddr)
		}
		if !l.isLocal(d.Src.Addr()) {
			return fmt.Errorf("send from %v: %w", d.Src.Addr(), link.ErrNoLocalAddr)
		}
		if len(d.Buf) > link.MaxDatagram {
			return fmt.Errorf("send %d bytes: %w", len(d.Buf), link.ErrTooLarge)
		}
	}
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return net.ErrClosed
	}
	sent := 0
	for i := range batch {
		d := &batch[i]
		dl := l.net.lookup(d.Dst.Addr())
		if dl == nil {
			l.net.unknown.Add(1)
			continue
		}
		if dl.enqueue(d) {
			sent++
		}
	}
	if sent > 0 {
		l.sent.Add(uint64(sent))
		l.sendBatches.Add(1)
	}
	return nil
}

// enqueue copies d into the receive ring; false if dropped.
func (l *memLink) enqueue(d *link.Datagram) bool {
	l.mu.Lock()
	for l.count == len(l.ring) && !l.closed {
		if l.policy != BlockWhenFull {
			l.mu.Unlock()
			l.drops.Add(1)
			return false
		}
		l.notFull.Wait()
	}
	if l.closed {
		l.mu.Unlock()
		l.net.unknown.Add(1) // the receiver went away: like an unknown address
		return false
	}
	s := &l.ring[(l.head+l.count)%len(l.ring)]
	s.buf = append(s.buf[:0], d.Buf...)
	s.src = d.Src
	s.dst = d.Dst
	s.tclass = d.TClass
	l.count++
	l.notEmpty.Signal()
	l.mu.Unlock()
	return true
}

// Recv waits for at least one datagram, then moves up to len(batch) of them into the callers'
// buffers. Src is the sender's Src, Dst the Dst it was sent to (an address of this link).
func (l *memLink) Recv(batch []link.Datagram) (int, error) {
	if len(batch) == 0 {
		return 0, nil
	}
	l.mu.Lock()
	for l.count == 0 && !l.closed {
		l.notEmpty.Wait()
	}
	if l.closed {
		l.mu.Unlock()
		return 0, net.ErrClosed
	}
	return l.takeLocked(batch), nil
}

// takeLocked moves up to len(batch) queued datagrams (at least one is queued) into the callers'
// buffers, counts them and unlocks l.mu.
func (l *memLink) takeLocked(batch []link.Datagram) int {
	n := 0
	trunc := 0
	for n < len(batch) && l.count > 0 {
		s := &l.ring[l.head]
		b := batch[n].Buf[:cap(batch[n].Buf)]
		c := copy(b, s.buf)
		if c < len(s.buf) {
			trunc++
		}
		batch[n].Buf = b[:c]
		batch[n].Src = s.src
		batch[n].Dst = s.dst
		batch[n].TClass = s.tclass
		batch[n].HasIPv4ID = false
		l.head = (l.head + 1) % len(l.ring)
		l.count--
		n++
	}
	l.notFull.Broadcast()
	l.mu.Unlock()
	l.received.Add(uint64(n))
	l.recvBatches.Add(1)
	if trunc > 0 {
		l.truncated.Add(uint64(trunc))
	}
	return n
}

// BatchSize returns Options.BatchSize.
func (l *memLink) BatchSize() int { return l.batch }

// LocalAddrs returns the attached addresses (a copy).
func (l *memLink) LocalAddrs() []netip.Addr { return append([]netip.Addr(nil), l.addrs...) }

// SourcePort returns entropy: nothing rewrites ports on the in-memory network.
func (l *memLink) SourcePort(local netip.Addr, entropy uint16) uint16 { return entropy }

// Stats returns the link's counters (Drops: datagrams dropped because this link's queue was full).
func (l *memLink) Stats() link.Stats {
	return link.Stats{Sent: l.sent.Load(), Received: l.received.Load(), SendBatches: l.sendBatches.Load(),
		RecvBatches: l.recvBatches.Load(), Drops: l.drops.Load(), Truncated: l.truncated.Load()}
}

// TryRecv implements link.PollReceiver: Recv without waiting for a datagram.
func (l *memLink) TryRecv(batch []link.Datagram) (int, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return 0, net.ErrClosed
	}
	if l.count == 0 || len(batch) == 0 {
		l.mu.Unlock()
		return 0, nil
	}
	return l.takeLocked(batch), nil
}

// Close detaches the link's addresses, discards queued datagrams and wakes blocked Recv and Send
// calls. Closing twice is harmless.
func (l *memLink) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.count = 0
	l.notEmpty.Broadcast()
	l.notFull.Broadcast()
	l.mu.Unlock()
	l.net.mu.Lock()
	for _, a := range l.addrs {
		if l.net.links[a] == l {
			delete(l.net.links, a)
		}
	}
	l.net.mu.Unlock()
	return nil
}
