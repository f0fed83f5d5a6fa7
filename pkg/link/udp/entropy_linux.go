package udp

// Entropy source ports (IBTA Annex A17.3.2; kernel rxe: rdma_get_udp_sport): a RoCEv2 sender puts
// a per-flow port from 0xC000..0xFFFF (the "entropy" of ECMP hashing) in the UDP source port of
// every packet, and the ICRC (A17.3.3) covers it. A userspace UDP socket sends from the port it
// is bound to, so the link keeps, per local address, a pool of send-only sockets bound to
// (address, entropy port), opened on first use and shared by every QP that folds to that port.
// A port whose socket cannot be opened (bind: EADDRINUSE, another program holds it; EACCES...)
// or that would exceed the pool's cap falls back to the main socket (port 4791) for good, so
// SourcePort's answer for a (local, entropy) never changes once given. docs/link.md.
//
// A send-only socket never queues a received datagram: a classic BPF program that returns 0
// (SO_ATTACH_FILTER, locked with SO_LOCK_FILTER) drops everything that arrives on its port before
// it is queued, and SO_RCVBUF is the kernel's minimum. It carries the main socket's sending
// options: DF (IP_PMTUDISC_DO / IPV6_PMTUDISC_DO, which also makes IPv4 ID 0), SO_SNDBUF,
// IPV6_V6ONLY; GSO (UDP_SEGMENT) and the traffic class (IP_TOS / IPV6_TCLASS) are per-message
// control data and need nothing on the socket.

import (
	"errors"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// DefaultEntropySockets is the default cap of send-only entropy sockets per local address
// (EntropyOptions.MaxSockets).
const DefaultEntropySockets = 1024

// The RoCEv2 entropy port range (IBTA A17.3.2; Linux rdma_flow_label_to_udp_sport and the UD
// port of rxe both give 0xC000 | 14 bits).
const (
	entropyBase  = 0xC000
	entropyPorts = 0x4000
)

// EntropyOptions configure the send-only sockets that give each flow its RoCEv2 entropy source
// port (Options.Entropy). The zero value enables them with DefaultEntropySockets per address.
type EntropyOptions struct {
	// Off sends every datagram from the main socket (source port 4791, or Port): SourcePort
	// then returns the main socket's port, as before entropy sockets existed.
	Off bool
	// MaxSockets caps the send-only sockets per local address; a port beyond the cap falls back
	// to the main socket (Stats.EntropyFallbacks). 0 means DefaultEntropySockets; at most 16384
	// (the size of the entropy range).
	MaxSockets int
}

// entSock is a socket datagrams leave from: the main socket (udpSock.self) or a send-only
// entropy socket. In a pool's table, an entSock with a nil f is the fallback marker: "send from
// the main socket of the link that asks".
type entSock struct {
	port uint16
	f    *os.File
	rc   syscall.RawConn
}

// entropyPool holds one local address's send-only sockets. The shards of ListenShards share
// their address's pool (refs counts the links using it; the last Close closes the sockets).
type entropyPool struct {
	owner    *Link // the link whose Stats report the pool
	addr     netip.Addr
	v6       bool
	zone     int
	sendBuf  int
	noForce  bool
	max      int
	fallback entSock // port 0, f nil: the marker stored for a port that fell back

	table [entropyPorts]atomic.Pointer[entSock]

	mu     sync.Mutex
	socks  []*entSock
	closed bool
	refs   atomic.Int32

	open      atomic.Uint64 // sockets open
	fallbacks atomic.Uint64 // ports that fell back to the main socket (bind refused or pool full)
}

// newEntropyPool prepares the (empty) pool of the main socket s, or returns nil when o turns
// the feature off.
func newEntropyPool(l *Link, s *udpSock, zone int, o *Options) *entropyPool {
	if o.Entropy.Off {
		return nil
	}
	p := &entropyPool{owner: l, addr: s.local.Addr(), v6: s.v6, zone: zone, sendBuf: o.SendBuf,
		noForce: o.NoForce, max: o.Entropy.MaxSockets}
	if p.max <= 0 {
		p.max = DefaultEntropySockets
	}
	p.max = min(p.max, entropyPorts)
	p.refs.Store(1)
	return p
}

// sender returns the socket a datagram from s's address with source port port leaves from: s
// itself for its own port, a port outside the entropy range, a link without a pool or a port
// that fell back; else the port's entropy socket (opened now if this is its first use).
func (s *udpSock) sender(port uint16) *entSock {
	if s.pool == nil || port == s.local.Port() || port < entropyBase {
		return &s.self
	}
	e := s.pool.table[port-entropyBase].Load()
	if e == nil {
		e = s.pool.get(port)
	}
	if e.f == nil {
		return &s.self
	}
	return e
}

// get opens the socket of port (once; the decision is stored in the table and never changes).
func (p *entropyPool) get(port uint16) *entSock {
	p.mu.Lock()
	defer p.mu.Unlock()
	slot := &p.table[port-entropyBase]
	if e := slot.Load(); e != nil {
		return e
	}
	if p.closed {
		return &p.fallback // not stored: the link is closing, Send fails anyway
	}
	e := &p.fallback
	if len(p.socks) >= p.max {
		p.fallbacks.Add(1)
	} else if ne, err := p.openSock(port); err != nil {
		p.fallbacks.Add(1)
	} else {
		p.socks = append(p.socks, ne)
		p.open.Add(1)
		e = ne
	}
	slot.Store(e)
	return e
}

// dropAll is the classic BPF program of a send-only socket: return 0 (keep no byte: drop).
var dropAll = []unix.SockFilter{{Code: unix.BPF_RET | unix.BPF_K, K: 0}}

// openSock opens the send-only socket bound to (p.addr, port).
func (p *entropyPool) openSock(port uint16) (*entSock, error) {
	fam := unix.AF_INET
	if p.v6 {
		fam = unix.AF_INET6
	}
	fd, err := unix.Socket(fam, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	fail := func(op string, err error) (*entSock, error) {
		unix.Close(fd)
		return nil, os.NewSyscallError(op, err)
	}
	// The filter goes on before bind: no datagram can be queued in between.
	fprog := unix.SockFprog{Len: uint16(len(dropAll)), Filter: &dropAll[0]}
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &fprog); err != nil {
		return fail("setsockopt SO_ATTACH_FILTER", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_LOCK_FILTER, 1); err != nil {
		return fail("setsockopt SO_LOCK_FILTER", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 0); err != nil { // the minimum
		return fail("setsockopt SO_RCVBUF", err)
	}
	if op, err := setSendOpts(fd, p.v6, p.sendBuf, p.noForce); err != nil { // as the main sockets
		return fail(op, err)
	}
	var sa unix.Sockaddr
	if p.v6 {
		sa = &unix.SockaddrInet6{Port: int(port), Addr: p.addr.As16(), ZoneId: uint32(p.zone)}
	} else {
		sa = &unix.SockaddrInet4{Port: int(port), Addr: p.addr.As4()}
	}
	if err := unix.Bind(fd, sa); err != nil {
		return fail("bind", err)
	}
	f := os.NewFile(uintptr(fd), "udp-send:"+netip.AddrPortFrom(p.addr, port).String())
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &entSock{port: port, f: f, rc: rc}, nil
}

// release drops one link's reference; the last one closes the sockets.
func (p *entropyPool) release() error {
	if p == nil || p.refs.Add(-1) > 0 {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	var errs []error
	for _, e := range p.socks {
		if err := e.f.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
			errs = append(errs, err)
		}
	}
	p.open.Store(0)
	p.socks = nil
	return errors.Join(errs...)
}

// EntropySocket reports the port a send from local with the given entropy port leaves from and
// whether a send-only entropy socket carries it (false: the main socket). It is SourcePort with
// the reason, for tests and diagnostics.
func (l *Link) EntropySocket(local netip.Addr, entropy uint16) (port uint16, pooled bool) {
	s := l.sock(local)
	if s == nil {
		return 0, false
	}
	e := s.sender(entropy)
	return e.port, e != &s.self
}

// entropyStats adds the pools this link owns to st.
func (l *Link) entropyStats(st *Stats) {
	for _, s := range l.socks {
		if p := s.pool; p != nil && p.owner == l {
			st.EntropySockets += p.open.Load()
			st.EntropyFallbacks += p.fallbacks.Load()
		}
	}
}
