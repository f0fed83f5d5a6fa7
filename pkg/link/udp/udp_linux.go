package udp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softroce/softroce/pkg/link"
	"golang.org/x/sys/unix"
)

// GSOMode selects UDP generic segmentation offload on send.
type GSOMode uint8

const (
	// GSOAuto (the zero value) uses GSO for IPv6 sockets only: IPv6 has no IP ID, while for IPv4
	// the kernel numbers GSO segments' IDs upward (see docs/link.md), which the ICRC covers.
	GSOAuto GSOMode = iota
	// GSOOff never uses GSO.
	GSOOff
	// GSOOn uses GSO for IPv4 and IPv6 sockets (IPv4 segments after the first then carry
	// non-zero IDs: only for peers that do not check the ICRC over the ID, or for benchmarks).
	GSOOn
)

// Defaults of Options (docs/link.md).
const (
	DefaultRecvBuf   = 16 << 20 // bytes; SO_RCVBUFFORCE as root, else capped by net.core.rmem_max
	DefaultSendBuf   = 4 << 20  // bytes; SO_SNDBUFFORCE as root, else capped by net.core.wmem_max
	DefaultBatchSize = 64
	// maxGSOSegments bounds the datagrams of one GSO message, maxGSOBytes its payload (the
	// limits of a run, link.MaxRunSegments and link.MaxRunBytes).
	maxGSOSegments = link.MaxRunSegments
	maxGSOBytes    = link.MaxRunBytes
)

// Options configure Listen.
type Options struct {
	// Addrs are the local addresses; one socket is bound to each (IPv4 or IPv6; an IPv6
	// link-local address needs its zone).
	Addrs []netip.Addr
	// Port is the local port of every socket; 0 means 4791 (IBTA A17.2.3).
	Port uint16
	// AnyPort binds each socket to a kernel-chosen port instead of Port (tests that must not
	// collide with other users of 4791); read the ports back with Link.LocalAddrPorts.
	AnyPort bool
	// RecvBuf and SendBuf size SO_RCVBUF/SO_SNDBUF in bytes: 0 means DefaultRecvBuf /
	// DefaultSendBuf, negative leaves the kernel default.
	RecvBuf, SendBuf int
	// NoForce skips SO_RCVBUFFORCE/SO_SNDBUFFORCE (which need CAP_NET_ADMIN and ignore the
	// rmem_max/wmem_max caps); the plain options are used when the FORCE ones are refused anyway.
	NoForce bool
	// BatchSize is the preferred batch length (and the size of the preallocated arrays);
	// 0 means DefaultBatchSize.
	BatchSize int
	// GSO selects UDP_SEGMENT on send; falls back to plain sends if the kernel refuses.
	GSO GSOMode
	// GRO enables UDP_GRO on receive: the kernel may coalesce same-size datagrams from one peer
	// into one read, which Recv splits again by the segment size (copying each segment into the
	// caller's buffers). If the kernel refuses the option, plain receives are used
	// (Stats.Fallbacks counts it).
	GRO bool
	// BusyPoll, if > 0, makes Recv on a one-address link poll the empty socket (non-blocking
	// recvmmsg, yielding between attempts) for up to BusyPoll before parking in the network
	// poller: lower latency for a CPU spent polling (busypoll_linux.go).
	BusyPoll time.Duration
	// SchedSyscalls makes the sockets' sendmmsg/recvmmsg ordinary system calls (syscall.Syscall:
	// the runtime may hand the goroutine's P to another thread while one runs) instead of raw
	// ones (the default; always raw with BusyPoll). The sockets are non-blocking, so a raw call
	// never blocks; an ordinary one that runs longer than a sysmon tick (20 us: a loopback
	// sendmmsg of GSO messages runs the receiver's UDP input too) has its P retaken, and the
	// goroutine then continues on another thread after a futex wake and a context switch.
	// Measured (bench/run, interleaved): raw calls cut the two-process 64 KiB WRITE's CPU per
	// message by ~20%.
	SchedSyscalls bool
	// Entropy configures the send-only sockets that give each flow its RoCEv2 entropy UDP
	// source port (IBTA A17.3.2, entropy_linux.go); the zero value enables them.
	Entropy EntropyOptions

	// reusePort sets SO_REUSEPORT before binding (ListenShards, shard_linux.go).
	reusePort bool
}

// Link is the link.Link over UDP sockets returned by Listen.
type Link struct {
	socks   []*udpSock
	batch   int
	maxSegs int // datagrams per GSO message (maxGSOSegments; tests raise it to provoke EINVAL)
	closed  atomic.Bool
	closing chan struct{}
	wg      sync.WaitGroup

	// multi-socket receive
	rmu   sync.Mutex
	ready chan struct{}
	next  int

	sent, received, sendBatches, recvBatches, gsoSends, groReceives, drops, truncated, fallbacks atomic.Uint64

	// busyParks counts busy polls that ran out of budget and parked (busypoll_linux.go).
	busyParks atomic.Uint64
}

var _ link.StatsLink = (*Link)(nil)

// mmsghdr is struct mmsghdr.
type mmsghdr struct {
	hdr unix.Msghdr
	len uint32
	_   [4]byte
}

// udpSock is one bound socket with its preallocated syscall arrays.
type udpSock struct {
	l     *Link
	local netip.AddrPort
	v6    bool
	gso   atomic.Bool
	// runGSO: SendRuns may send engine-marked runs as GSO messages (gsorun_linux.go)
	runGSO atomic.Bool
	f      *os.File
	rc     syscall.RawConn
	self   entSock      // this socket as a sender (port, rc)
	pool   *entropyPool // send-only entropy sockets of this address (nil: EntropyOptions.Off)

	smu    sync.Mutex
	smsgs  []mmsghdr
	siov   []unix.Iovec
	ssa    []unix.RawSockaddrInet6 // large enough for an IPv4 sockaddr too
	scmsg  []byte                  // one UDP_SEGMENT cmsg per message
	scount int                     // messages filled
	sidx   int                     // next message to send
	sfail  int                     // datagrams lost to send errors in this run
	sgsoEr unix.Errno              // the error that refused a GSO message (0 = none)
	sendFn func(uintptr) bool

	rmsgs  []mmsghdr
	riov   []unix.Iovec
	rsa    []unix.RawSockaddrInet6
	rctl   []byte // one traffic-class cmsg per message (recvCtlSpace each)
	rcount int
	rn     int
	rerr   error
	again  bool
	recvFn func(uintptr) bool
	tryFn  func(uintptr)
	peekFn func(uintptr) bool
	rearm  chan struct{}

	// GRO receive: the ring of private 64 KiB buffers (groring_linux.go).
	gro      bool
	gbufs    [][]byte
	giov     []unix.Iovec
	gsa      []unix.RawSockaddrInet6
	gctl     []byte
	gslot    []groSlot
	gq       []uint8   // queued slots, oldest first
	gscr     []mmsghdr // the next read's messages: the free slots
	gscrSlot []uint8   // the slot of each of gscr
	gscrN    int       // how many of gscr are prepared
	gn       int       // messages the last read returned
	gclean   bool      // gscr is prepared for the current free slots and no read has filled it since
	groFn    func(uintptr) bool
	gtryFn   func(uintptr)
	busy     time.Duration // Options.BusyPoll (busypoll_linux.go)
	raw      bool          // sendmmsg/recvmmsg as raw system calls (!SchedSyscalls or BusyPoll; busypoll_linux.go)
}

// Listen opens one unconnected UDP socket per address, bound to ADDR:Port, with DF set
// (IP_PMTUDISC_DO / IPV6_PMTUDISC_DO: Linux then writes IPv4 ID 0 on unconnected sockets, the
// value the sender's ICRC assumes, IBTA A17.3.3), sized buffers and preallocated batch arrays.
// It returns the concrete link: its methods beyond link.Link (LocalAddrPorts, BufferSizes,
// UDPStats...) need no type assertion.
func Listen(o Options) (*Link, error) {
	if len(o.Addrs) == 0 {
		return nil, fmt.Errorf("listen udp: no addresses: %w", link.ErrInvalidAddr)
	}
	if o.Port == 0 {
		o.Port = link.UDPPort
	}
	if o.BatchSize <= 0 {
		o.BatchSize = DefaultBatchSize
	}
	if o.RecvBuf == 0 {
		o.RecvBuf = DefaultRecvBuf
	}
	if o.SendBuf == 0 {
		o.SendBuf = DefaultSendBuf
	}
	l := &Link{batch: o.BatchSize, maxSegs: maxGSOSegments, closing: make(chan struct{}), ready: make(chan struct{}, 1)}
	for i, a := range o.Addrs {
		if !a.IsValid() {
			l.closeSocks()
			return nil, fmt.Errorf("listen udp %v: %w", a, link.ErrInvalidAddr)
		}
		a = a.Unmap()
		for _, s := range l.socks {
			if s.local.Addr() == a {
				l.closeSocks()
				return nil, fmt.Errorf("listen udp %v: %w", a, link.ErrAddrInUse)
			}
		}
		s, err := openSock(l, a, &o)
		if err != nil {
			l.closeSocks()
			return nil, fmt.Errorf("listen udp %v (address %d): %w", a, i, err)
		}
		l.socks = append(l.socks, s)
	}
	if len(l.socks) > 1 {
		for _, s := range l.socks {
			l.wg.Add(1)
			go s.waiter()
		}
	}
	return l, nil
}

func openSock(l *Link, a netip.Addr, o *Options) (*udpSock, error) {
	s := &udpSock{l: l, v6: a.Is6()}
	fam := unix.AF_INET
	if s.v6 {
		fam = unix.AF_INET6
	}
	fd, err := unix.Socket(fam, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	fail := func(op string, err error) (*udpSock, error) {
		unix.Close(fd)
		return nil, os.NewSyscallError(op, err)
	}
	if op, err := setSendOpts(fd, s.v6, o.SendBuf, o.NoForce); err != nil {
		return fail(op, err)
	}
	if err := setBuf(fd, unix.SO_RCVBUF, unix.SO_RCVBUFFORCE, o.RecvBuf, o.NoForce); err != nil {
		return fail("setsockopt SO_RCVBUF", err)
	}
	if s.v6 {
		if err := AcceptZeroChecksum6(fd); err != nil {
			return fail("setsockopt UDP_NO_CHECK6_RX", err)
		}
	}
	if op, err := recvTClass(fd, s.v6); err != nil {
		return fail(op, err)
	}
	port := int(o.Port)
	if o.AnyPort {
		port = 0
	}
	var sa unix.Sockaddr
	zone := 0
	if s.v6 {
		sa6 := &unix.SockaddrInet6{Port: port, Addr: a.As16()}
		if z := a.Zone(); z != "" {
			ifi, err := net.InterfaceByName(z)
			if err != nil {
				unix.Close(fd)
				return nil, err
			}
			zone = ifi.Index
			sa6.ZoneId = uint32(ifi.Index)
		}
		sa = sa6
	} else {
		sa = &unix.SockaddrInet4{Port: port, Addr: a.As4()}
	}
	if o.reusePort {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
			return fail("setsockopt SO_REUSEPORT", err)
		}
	}
	if err := unix.Bind(fd, sa); err != nil {
		return fail("bind", err)
	}
	bound, err := unix.Getsockname(fd)
	if err != nil {
		return fail("getsockname", err)
	}
	switch b := bound.(type) {
	case *unix.SockaddrInet4:
		s.local = netip.AddrPortFrom(a, uint16(b.Port))
	case *unix.SockaddrInet6:
		s.local = netip.AddrPortFrom(a, uint16(b.Port))
	}
	s.gso.Store(o.GSO == GSOOn || (o.GSO == GSOAuto && s.v6))
	s.runGSO.Store(o.GSO != GSOOff && l.batch >= maxGSOSegments)
	if o.GRO {
		if unix.SetsockoptInt(fd, unix.SOL_UDP, unix.UDP_GRO, 1) == nil {
			s.gro = true
		} else {
			l.fallbacks.Add(1)
		}
	}
	s.f = os.NewFile(uintptr(fd), "udp:"+s.local.String())
	if s.rc, err = s.f.SyscallConn(); err != nil {
		s.f.Close()
		return nil, err
	}
	s.self = entSock{port: s.local.Port(), f: s.f, rc: s.rc}
	s.pool = newEntropyPool(l, s, zone, o)
	n := o.BatchSize
	s.smsgs = make([]mmsghdr, n)
	s.siov = make([]unix.Iovec, n)
	s.ssa = make([]unix.RawSockaddrInet6, n)
	s.scmsg = make([]byte, n*sendCtlSpace)
	s.rmsgs = make([]mmsghdr, n)
	s.riov = make([]unix.Iovec, n)
	s.rsa = make([]unix.RawSockaddrInet6, n)
	s.rctl = make([]byte, n*recvCtlSpace)
	s.rearm = make(chan struct{}, 1)
	s.sendFn = s.doSend
	s.recvFn = s.doRecv
	s.tryFn = s.tryRecv
	s.peekFn = s.peek
	if s.gro {
		s.groInit()
	}
	s.raw = !o.SchedSyscalls
	s.setBusyPoll(o.BusyPoll)
	return s, nil
}

// setSendOpts sets up the sending side every UDP socket of a link shares (the main sockets
// and the send-only entropy ones): IPV6_V6ONLY on an IPv6 socket (IPv4 traffic has sockets
// of its own), DF as kernel rxe sends (IP_MTU_DISCOVER / IPV6_MTU_DISCOVER = PMTUDISC_DO,
// which on an unconnected socket also makes Linux write IPv4 ID 0, the header the ICRC is
// computed over, IBTA Vol 1 Annex A17.3.3; docs/link.md) and the send buffer (setBuf;
// sendBuf < 0 keeps the default). On failure it returns the operation that failed, for
// os.NewSyscallError.
func setSendOpts(fd int, v6 bool, sendBuf int, noForce bool) (string, error) {
	if v6 {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1); err != nil {
			return "setsockopt IPV6_V6ONLY", err
		}
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO); err != nil {
			return "setsockopt IPV6_MTU_DISCOVER", err
		}
	} else if err := unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO); err != nil {
		return "setsockopt IP_MTU_DISCOVER", err
	}
	if err := setBuf(fd, unix.SO_SNDBUF, unix.SO_SNDBUFFORCE, sendBuf, noForce); err != nil {
		return "setsockopt SO_SNDBUF", err
	}
	return "", nil
}

// recvTClass asks for each datagram's IPv4 TOS / IPv6 Traffic Class as a control message
// (IP_RECVTOS / IPV6_RECVTCLASS): link.Datagram.TClass on receive, whose ECN field tells a
// CE-marked packet (IBTA A17.9.1). On failure it returns the operation that failed.
func recvTClass(fd int, v6 bool) (string, error) {
	if v6 {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_RECVTCLASS, 1); err != nil {
			return "setsockopt IPV6_RECVTCLASS", err
		}
		return "", nil
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_RECVTOS, 1); err != nil {
		return "setsockopt IP_RECVTOS", err
	}
	return "", nil
}

// AcceptZeroChecksum6 lets the IPv6 UDP socket fd receive datagrams whose UDP checksum is
// zero (UDP_NO_CHECK6_RX, RFC 6935/6936): kernel rxe and RDMA NICs send RoCEv2 over IPv6 with
// checksum 0, the ICRC protecting the packet (IBTA Vol 1 Annex A17.3.3), and without the
// option Linux drops them before the socket (Udp6InCsumErrors). A non-zero checksum is still
// verified and a wrong one dropped. docs/link.md, "IPv6 and the UDP checksum".
func AcceptZeroChecksum6(fd int) error {
	return unix.SetsockoptInt(fd, unix.IPPROTO_UDP, unix.UDP_NO_CHECK6_RX, 1)
}

func setBuf(fd, opt, force, size int, noForce bool) error {
	if size < 0 {
		return nil
	}
	if !noForce && unix.SetsockoptInt(fd, unix.SOL_SOCKET, force, size) == nil {
		return nil
	}
	return unix.SetsockoptInt(fd, unix.SOL_SOCKET, opt, size)
}

// sock returns the socket bound to a (nil if none).
func (l *Link) sock(a netip.Addr) *udpSock {
	a = a.Unmap()
	for _, s := range l.socks {
		if s.local.Addr().WithZone("") == a.WithZone("") {
			return s
		}
	}
	return nil
}

// BatchSize returns Options.BatchSize.
func (l *Link) BatchSize() int { return l.batch }

// LocalAddrs returns the bound addresses.
func (l *Link) LocalAddrs() []netip.Addr {
	out := make([]netip.Addr, len(l.socks))
	for i, s := range l.socks {
		out[i] = s.local.Addr()
	}
	return out
}

// LocalAddrPorts returns the bound address and port of each socket.
func (l *Link) LocalAddrPorts() []netip.AddrPort {
	out := make([]netip.AddrPort, len(l.socks))
	for i, s := range l.socks {
		out[i] = s.local
	}
	return out
}

// SourcePort returns the UDP source port a send from local with the RoCE entropy port entropy
// (IBTA A17.3.2) carries on the wire: entropy itself when the send-only socket bound to (local,
// entropy) is open or can be opened now (entropy_linux.go), else the main socket's port (the
// port fell back, for good: pool full or bind refused; EntropyOptions.Off; entropy outside
// 0xC000..0xFFFF). The answer for a (local, entropy) never changes. 0 if local is not one of the
// link's addresses.
func (l *Link) SourcePort(local netip.Addr, entropy uint16) uint16 {
	if s := l.sock(local); s != nil {
		return s.sender(entropy).port
	}
	return 0
}

// GSOEnabled reports whether sends from local currently use UDP GSO.
func (l *Link) GSOEnabled(local netip.Addr) bool {
	s := l.sock(local)
	return s != nil && s.gso.Load()
}

// BufferSizes returns SO_RCVBUF and SO_SNDBUF of the socket bound to local as the kernel reports
// them (twice the requested size: the kernel doubles it for bookkeeping).
func (l *Link) BufferSizes(local netip.Addr) (recv, send int, err error) {
	s := l.sock(local)
	if s == nil {
		return 0, 0, fmt.Errorf("buffer sizes of %v: %w", local, link.ErrNoLocalAddr)
	}
	cerr := s.rc.Control(func(fd uintptr) {
		recv, err = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF)
		if err == nil {
			send, err = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF)
		}
	})
	if cerr != nil {
		return 0, 0, cerr
	}
	return recv, send, err
}

// GROEnabled reports whether the socket bound to local receives with UDP_GRO.
func (l *Link) GROEnabled(local netip.Addr) bool {
	s := l.sock(local)
	return s != nil && s.gro
}

// Close closes the sockets, unblocks Recv and Send, and waits for the link's goroutines.
func (l *Link) Close() error {
	if l.closed.Swap(true) {
		return nil
	}
	close(l.closing)
	err := l.closeSocks()
	l.wg.Wait()
	return err
}

func (l *Link) closeSocks() error {
	var errs []error
	for _, s := range l.socks {
		if err := s.f.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
			errs = append(errs, err)
		}
		if err := s.pool.release(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
