package link

// Pipeline (one UDPLink, one socket per local address):
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
// All per-datagram state lives in arrays allocated at ListenUDP: no allocation per datagram.

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
	"unsafe"

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

// Defaults of UDPOptions (see docs/link.md and /work/shared/reference/perf-ceilings.md).
const (
	DefaultRecvBuf   = 16 << 20 // bytes; SO_RCVBUFFORCE as root, else capped by net.core.rmem_max
	DefaultSendBuf   = 4 << 20  // bytes; SO_SNDBUFFORCE as root, else capped by net.core.wmem_max
	DefaultBatchSize = 64
	// maxGSOSegments bounds the datagrams of one GSO message (the kernel's UDP_MAX_SEGMENTS is 64
	// on older kernels, 128 on newer ones).
	maxGSOSegments = 64
	// maxGSOBytes bounds the payload of one GSO message (IPv4 total length 65535 - 20 - 8).
	maxGSOBytes = 65507
	// groBatch is the number of 64 KiB messages one GRO receive reads.
	groBatch = 8
)

// UDPOptions configure ListenUDP.
type UDPOptions struct {
	// Addrs are the local addresses; one socket is bound to each (IPv4 or IPv6; an IPv6
	// link-local address needs its zone).
	Addrs []netip.Addr
	// Port is the local port of every socket; 0 means 4791 (IBTA A17.2.3).
	Port uint16
	// AnyPort binds each socket to a kernel-chosen port instead of Port (tests that must not
	// collide with other users of 4791); read the ports back with UDPLink.LocalAddrPorts.
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
	// docs/performance.md, fast path: raw calls cut the two-process 64 KiB WRITE's CPU per
	// message by ~20%.
	SchedSyscalls bool
	// Entropy configures the send-only sockets that give each flow its RoCEv2 entropy UDP
	// source port (IBTA A17.3.2, entropy_linux.go); the zero value enables them.
	Entropy EntropyOptions
	// XDP adds the AF_XDP path (xdp_linux.go): datagrams that fit are received from and sent
	// through an AF_XDP socket's rings instead of the UDP socket (one IPv4 address; GSO and GRO
	// are off with it).
	XDP XDPOptions

	// reusePort sets SO_REUSEPORT before binding (ListenUDPShards, shard_linux.go).
	reusePort bool
}

// UDPLink is the Link over UDP sockets returned by ListenUDP.
type UDPLink struct {
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

	// xdp is the AF_XDP path (UDPOptions.XDP), nil without it.
	xdp *xdpSock
}

var _ StatsLink = (*UDPLink)(nil)

// mmsghdr is struct mmsghdr.
type mmsghdr struct {
	hdr unix.Msghdr
	len uint32
	_   [4]byte
}

// udpSock is one bound socket with its preallocated syscall arrays.
type udpSock struct {
	l     *UDPLink
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
	rcount int
	rn     int
	rerr   error
	again  bool
	recvFn func(uintptr) bool
	tryFn  func(uintptr)
	peekFn func(uintptr) bool
	rearm  chan struct{}

	// GRO receive: private 64 KiB buffers, split into the caller's buffers by drainGRO.
	gro    bool
	gbufs  [][]byte
	gmsgs  []mmsghdr
	giov   []unix.Iovec
	gsa    []unix.RawSockaddrInet6
	gctl   []byte
	gn     int  // messages held
	gclean bool // gmsgs are as prepGRO left them: no read has filled them since (poll_linux.go)
	gmi    int  // next message to hand out
	goff   int  // offset of the next segment in message gmi
	groFn  func(uintptr) bool
	gtryFn func(uintptr)
	busy   time.Duration // UDPOptions.BusyPoll (busypoll_linux.go)
	raw    bool          // sendmmsg/recvmmsg as raw system calls (!SchedSyscalls or BusyPoll; busypoll_linux.go)
}

// ListenUDP opens one unconnected UDP socket per address, bound to ADDR:Port, with DF set
// (IP_PMTUDISC_DO / IPV6_PMTUDISC_DO: Linux then writes IPv4 ID 0 on unconnected sockets, the
// value the sender's ICRC assumes, IBTA A17.3.3), sized buffers and preallocated batch arrays.
func ListenUDP(o UDPOptions) (Link, error) { return listenUDP(o) }

func listenUDP(o UDPOptions) (*UDPLink, error) {
	if len(o.Addrs) == 0 {
		return nil, fmt.Errorf("listen udp: no addresses: %w", ErrInvalidAddr)
	}
	if o.Port == 0 {
		o.Port = UDPPort
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
	if o.XDP.On {
		if len(o.Addrs) != 1 {
			return nil, fmt.Errorf("listen udp: the AF_XDP path takes one address, not %d: %w", len(o.Addrs), ErrInvalidAddr)
		}
		// the ring's frames carry IPv4 ID 0: no GSO runs; the socket gets single datagrams
		o.GSO, o.GRO = GSOOff, false
	}
	l := &UDPLink{batch: o.BatchSize, maxSegs: maxGSOSegments, closing: make(chan struct{}), ready: make(chan struct{}, 1)}
	for i, a := range o.Addrs {
		if !a.IsValid() {
			l.closeSocks()
			return nil, fmt.Errorf("listen udp %v: %w", a, ErrInvalidAddr)
		}
		a = a.Unmap()
		for _, s := range l.socks {
			if s.local.Addr() == a {
				l.closeSocks()
				return nil, fmt.Errorf("listen udp %v: %w", a, ErrAddrInUse)
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
	if o.XDP.On {
		x, err := openXDP(l.socks[0], o.XDP)
		if err != nil {
			l.closeSocks()
			return nil, fmt.Errorf("listen udp %v: %w", o.Addrs[0], err)
		}
		l.xdp = x
	}
	return l, nil
}

func openSock(l *UDPLink, a netip.Addr, o *UDPOptions) (*udpSock, error) {
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
	s.rearm = make(chan struct{}, 1)
	s.sendFn = s.doSend
	s.recvFn = s.doRecv
	s.tryFn = s.tryRecv
	s.peekFn = s.peek
	if s.gro {
		s.gbufs = make([][]byte, groBatch)
		for i := range s.gbufs {
			s.gbufs[i] = make([]byte, MaxDatagram)
		}
		s.gmsgs = make([]mmsghdr, groBatch)
		s.giov = make([]unix.Iovec, groBatch)
		s.gsa = make([]unix.RawSockaddrInet6, groBatch)
		s.gctl = make([]byte, groBatch*unix.CmsgSpace(4))
		s.groFn = s.doGRORecv
		s.gtryFn = s.tryGRORecv
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
func (l *UDPLink) sock(a netip.Addr) *udpSock {
	a = a.Unmap()
	for _, s := range l.socks {
		if s.local.Addr().WithZone("") == a.WithZone("") {
			return s
		}
	}
	return nil
}

// Send transmits the batch in order with sendmmsg, one call per run of datagrams from the same
// local address (more if a run exceeds BatchSize). Invalid input (zero source port, foreign or
// wrong-family addresses, oversized payload) fails the whole batch before anything is sent.
// Datagrams the kernel refuses (ENOBUFS, EMSGSIZE, unreachable...) are dropped and counted in
// Stats.Drops, as a lossy network would; Send then still returns nil.
func (l *UDPLink) Send(batch []Datagram) error {
	if l.closed.Load() {
		return net.ErrClosed
	}
	raceSent()
	for i := range batch {
		d := &batch[i]
		if !d.Src.IsValid() || d.Src.Port() == 0 || !d.Dst.IsValid() || d.Dst.Port() == 0 {
			return fmt.Errorf("send %v -> %v: %w", d.Src, d.Dst, ErrInvalidAddr)
		}
		s := l.sock(d.Src.Addr())
		if s == nil {
			return fmt.Errorf("send from %v: %w", d.Src.Addr(), ErrNoLocalAddr)
		}
		if dst := d.Dst.Addr().Unmap(); dst.Is6() != s.v6 {
			return fmt.Errorf("send %v -> %v: address families differ: %w", d.Src, d.Dst, ErrInvalidAddr)
		}
		if len(d.Buf) > MaxDatagram {
			return fmt.Errorf("send %d bytes: %w", len(d.Buf), ErrTooLarge)
		}
	}
	if l.xdp != nil {
		return l.sendXDP(batch)
	}
	for i := 0; i < len(batch); {
		s := l.sock(batch[i].Src.Addr())
		e := s.sender(batch[i].Src.Port())
		j := i + 1
		for j < len(batch) && l.sock(batch[j].Src.Addr()) == s && s.sender(batch[j].Src.Port()) == e {
			j++
		}
		if err := s.send(batch[i:j], e); err != nil {
			return err
		}
		i = j
	}
	return nil
}

// putSockaddr writes ap into sa (IPv4 or IPv6 layout) and returns its length.
func putSockaddr(sa *unix.RawSockaddrInet6, ap netip.AddrPort, v6 bool) uint32 {
	port := ap.Port()
	if !v6 {
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		sa4.Family = unix.AF_INET
		p := (*[2]byte)(unsafe.Pointer(&sa4.Port))
		p[0], p[1] = byte(port>>8), byte(port)
		sa4.Addr = ap.Addr().Unmap().As4()
		sa4.Zero = [8]uint8{}
		return unix.SizeofSockaddrInet4
	}
	sa.Family = unix.AF_INET6
	p := (*[2]byte)(unsafe.Pointer(&sa.Port))
	p[0], p[1] = byte(port>>8), byte(port)
	sa.Flowinfo = 0
	sa.Addr = ap.Addr().As16()
	sa.Scope_id = 0
	return unix.SizeofSockaddrInet6
}

// getSockaddr decodes a received sockaddr.
func getSockaddr(sa *unix.RawSockaddrInet6) netip.AddrPort {
	switch sa.Family {
	case unix.AF_INET:
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		p := (*[2]byte)(unsafe.Pointer(&sa4.Port))
		return netip.AddrPortFrom(netip.AddrFrom4(sa4.Addr), uint16(p[0])<<8|uint16(p[1]))
	case unix.AF_INET6:
		p := (*[2]byte)(unsafe.Pointer(&sa.Port))
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), uint16(p[0])<<8|uint16(p[1]))
	}
	return netip.AddrPort{}
}

// send transmits a run of datagrams that all leave from s's address through socket e (s itself
// or one of its entropy sockets: the arrays and lock are s's).
func (s *udpSock) send(run []Datagram, e *entSock) error {
	s.smu.Lock()
	defer s.smu.Unlock()
	plain := false // resend the datagrams of a refused GSO message one by one
	for len(run) > 0 {
		used := s.fill(run, s.gso.Load() && !plain)
		done, refused, err := s.flush(e)
		if err != nil {
			return err
		}
		// A refused GSO message: the messages before it were sent; resend from it, one
		// datagram per message.
		if plain = refused; refused {
			used = done
		}
		run = run[used:]
	}
	return nil
}

// flush sends the messages fill or fillRuns prepared with one sendmmsg and counts them. It
// returns how many datagrams left and whether the kernel refused a GSO message. EIO/EINVAL
// mean this socket or device cannot do UDP_SEGMENT at all (as wireguard-go treats them): GSO
// is turned off for good. Other errors (EMSGSIZE: a segment above the path MTU) are the
// datagrams' own and are met again, and counted, by the caller's plain resend.
func (s *udpSock) flush(e *entSock) (done int, refused bool, err error) {
	s.sidx, s.sfail, s.sgsoEr = 0, 0, 0
	err = e.rc.Write(s.sendFn)
	s.clear()
	if err != nil {
		if s.l.closed.Load() {
			return 0, false, net.ErrClosed
		}
		return 0, false, fmt.Errorf("sendmmsg from %v: %w", netip.AddrPortFrom(s.local.Addr(), e.port), err)
	}
	done = s.sentDatagrams()
	if s.sgsoEr != 0 {
		if s.sgsoEr == unix.EIO || s.sgsoEr == unix.EINVAL {
			s.gso.Store(false)
			s.runGSO.Store(false)
			s.l.fallbacks.Add(1)
		}
		refused = true
	}
	if s.sfail > 0 {
		s.l.drops.Add(uint64(s.sfail))
	}
	s.l.sent.Add(uint64(done - s.sfail))
	s.l.sendBatches.Add(1)
	return done, refused, nil
}

// fill builds up to len(s.smsgs) messages from the head of run and returns how many datagrams
// they hold. With gso, consecutive datagrams to the same peer of the same length (the last may be
// shorter) share one message with a UDP_SEGMENT cmsg carrying that length.
func (s *udpSock) fill(run []Datagram, gso bool) int {
	m, d := 0, 0
	for m < len(s.smsgs) && d < len(run) && d < len(s.siov) {
		first := d
		size := len(run[d].Buf)
		total := size
		d++
		if gso && size > 0 {
			for d < len(run) && d < len(s.siov) && d-first < s.l.maxSegs &&
				run[d].Dst == run[first].Dst && run[d].TClass == run[first].TClass && len(run[d].Buf) <= size && len(run[d].Buf) > 0 &&
				total+len(run[d].Buf) <= maxGSOBytes {
				total += len(run[d].Buf)
				short := len(run[d].Buf) < size
				d++
				if short {
					break // only the last segment may be shorter
				}
			}
		}
		for k := first; k < d; k++ {
			iov := &s.siov[k]
			if b := run[k].Buf; len(b) > 0 {
				iov.Base = &b[0]
			} else {
				iov.Base = nil
			}
			iov.SetLen(len(run[k].Buf))
		}
		h := &s.smsgs[m].hdr
		h.Name = (*byte)(unsafe.Pointer(&s.ssa[m]))
		h.Namelen = putSockaddr(&s.ssa[m], run[first].Dst, s.v6)
		h.Iov = &s.siov[first]
		h.SetIovlen(d - first)
		h.Flags = 0
		seg := 0
		if d-first > 1 {
			seg = size
		}
		putControl(h, s.scmsg, m, seg, run[first].TClass, !run[first].Dst.Addr().Unmap().Is4())
		s.smsgs[m].len = 0
		m++
	}
	s.scount = m
	return d
}

// sentDatagrams counts the datagrams in messages [0, sidx), and counts those messages that
// were GSO sends.
func (s *udpSock) sentDatagrams() int {
	n, gso := 0, 0
	for m := 0; m < s.sidx; m++ {
		n += int(s.smsgs[m].hdr.Iovlen)
		if s.smsgs[m].hdr.Iovlen > 1 {
			gso++
		}
	}
	if gso > 0 {
		s.l.gsoSends.Add(uint64(gso))
	}
	return n
}

// clear drops references to the caller's buffers (Send does not retain them).
func (s *udpSock) clear() {
	for i := range s.siov {
		s.siov[i].Base = nil
	}
}

// doSend runs inside RawConn.Write: sendmmsg until every message is sent; false = wait writable.
func (s *udpSock) doSend(fd uintptr) bool {
	for s.sidx < s.scount {
		r, _, e := s.sys6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&s.smsgs[s.sidx])),
			uintptr(s.scount-s.sidx))
		switch e {
		case 0:
			s.sidx += int(r)
		case unix.EAGAIN:
			return false
		case unix.EINTR:
		default:
			if s.smsgs[s.sidx].hdr.Iovlen > 1 {
				s.sgsoEr = e // a GSO message refused: the caller resends from here
				return true
			}
			// This message failed (ENOBUFS, EMSGSIZE, ENETUNREACH...): drop it, go on.
			s.sfail += int(s.smsgs[s.sidx].hdr.Iovlen)
			s.sidx++
		}
	}
	return true
}

// prepRecv points the receive iovecs at the caller's buffers.
func (s *udpSock) prepRecv(batch []Datagram) {
	n := min(len(batch), len(s.rmsgs))
	for i := 0; i < n; i++ {
		b := batch[i].Buf[:cap(batch[i].Buf)]
		iov := &s.riov[i]
		if len(b) > 0 {
			iov.Base = &b[0]
		} else {
			iov.Base = nil
		}
		iov.SetLen(len(b))
		h := &s.rmsgs[i].hdr
		h.Name = (*byte)(unsafe.Pointer(&s.rsa[i]))
		h.Namelen = unix.SizeofSockaddrInet6
		h.Iov = iov
		h.SetIovlen(1)
		h.Control, h.Controllen, h.Flags = nil, 0, 0
		s.rmsgs[i].len = 0
	}
	s.rcount = n
	s.rn, s.rerr, s.again = 0, nil, false
}

// recvmmsg is one non-blocking attempt to fill msgs; it sets s.again or s.rerr.
func (s *udpSock) recvmmsg(fd uintptr, msgs []mmsghdr) int {
	s.again, s.rerr = false, nil
	for {
		r, _, e := s.sys6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&msgs[0])),
			uintptr(len(msgs)))
		switch e {
		case 0:
			if r > 0 && s.gro && &msgs[0] == &s.gmsgs[0] {
				s.gclean = false // the kernel wrote lengths, names and control data
			}
			return int(r)
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			s.again = true
			return 0
		default:
			s.rerr = e
			return 0
		}
	}
}

// doRecv runs inside RawConn.Read; false = wait readable.
func (s *udpSock) doRecv(fd uintptr) bool {
	s.rn = s.recvmmsg(fd, s.rmsgs[:s.rcount])
	return !s.again
}

// tryRecv runs inside RawConn.Control: one attempt, never waits.
func (s *udpSock) tryRecv(fd uintptr) { s.rn = s.recvmmsg(fd, s.rmsgs[:s.rcount]) }

// prepGRO points the GRO messages at the private buffers.
func (s *udpSock) prepGRO() {
	space := unix.CmsgSpace(4)
	for i := range s.gmsgs {
		s.giov[i].Base = &s.gbufs[i][0]
		s.giov[i].SetLen(len(s.gbufs[i]))
		h := &s.gmsgs[i].hdr
		h.Name = (*byte)(unsafe.Pointer(&s.gsa[i]))
		h.Namelen = unix.SizeofSockaddrInet6
		h.Iov = &s.giov[i]
		h.SetIovlen(1)
		h.Control = &s.gctl[i*space]
		h.SetControllen(space)
		h.Flags = 0
		s.gmsgs[i].len = 0
	}
	s.gn, s.gmi, s.goff = 0, 0, 0
	s.rerr, s.again = nil, false
	s.gclean = true
}

// doGRORecv runs inside RawConn.Read; false = wait readable.
func (s *udpSock) doGRORecv(fd uintptr) bool {
	s.gn = s.recvmmsg(fd, s.gmsgs)
	return !s.again
}

// tryGRORecv runs inside RawConn.Control: one attempt.
func (s *udpSock) tryGRORecv(fd uintptr) { s.gn = s.recvmmsg(fd, s.gmsgs) }

// groSize returns the UDP_GRO segment size in message i's control data (0 if none).
func (s *udpSock) groSize(i int) int {
	space := unix.CmsgSpace(4)
	n := min(int(s.gmsgs[i].hdr.Controllen), space)
	return parseGROSize(s.gctl[i*space : i*space+n])
}

// parseGROSize walks control messages (kernel-written, but checked like remote input: never
// reads outside ctl) and returns the UDP_GRO segment size, 0 if absent or malformed.
func parseGROSize(ctl []byte) int {
	hdr := unix.SizeofCmsghdr
	for len(ctl) >= hdr {
		c := (*unix.Cmsghdr)(unsafe.Pointer(&ctl[0]))
		cl := uint64(c.Len) // uint32 or uint64 by architecture
		if cl < uint64(hdr) || cl > uint64(len(ctl)) {
			return 0
		}
		data := ctl[unix.CmsgLen(0):cl]
		if c.Level == unix.SOL_UDP && c.Type == unix.UDP_GRO {
			switch {
			case len(data) >= 4:
				return int(*(*int32)(unsafe.Pointer(&data[0])))
			case len(data) >= 2:
				return int(*(*uint16)(unsafe.Pointer(&data[0])))
			}
			return 0
		}
		next := unix.CmsgSpace(len(data))
		if next > len(ctl) {
			return 0
		}
		ctl = ctl[next:]
	}
	return 0
}

// drainGRO copies held segments into batch; returns how many.
func (s *udpSock) drainGRO(batch []Datagram) int {
	k, trunc := 0, 0
	for k < len(batch) && s.gmi < s.gn {
		m := &s.gmsgs[s.gmi]
		total := int(m.len)
		seg := s.groSize(s.gmi)
		if seg <= 0 || seg > total {
			seg = total
		}
		if s.goff == 0 && seg < total {
			s.l.groReceives.Add(1)
		}
		end := min(s.goff+seg, total)
		b := batch[k].Buf[:cap(batch[k].Buf)]
		c := copy(b, s.gbufs[s.gmi][s.goff:end])
		if c < end-s.goff {
			trunc++
		}
		batch[k].Buf = b[:c]
		batch[k].Src = getSockaddr(&s.gsa[s.gmi])
		batch[k].Dst = s.local
		batch[k].HasIPv4ID = false
		k++
		s.goff = end
		if s.goff >= total {
			s.gmi++
			s.goff = 0
		}
	}
	if k > 0 {
		s.l.received.Add(uint64(k))
		s.l.recvBatches.Add(1)
	}
	if trunc > 0 {
		s.l.truncated.Add(uint64(trunc))
	}
	return k
}

// groPending reports held segments not yet handed out.
func (s *udpSock) groPending() bool { return s.gmi < s.gn }

// finishRecv fills batch from the received messages and drops buffer references.
func (s *udpSock) finishRecv(batch []Datagram) int {
	trunc := 0
	for i := 0; i < s.rn; i++ {
		m := &s.rmsgs[i]
		b := batch[i].Buf[:cap(batch[i].Buf)]
		batch[i].Buf = b[:min(int(m.len), len(b))]
		if m.hdr.Flags&unix.MSG_TRUNC != 0 {
			trunc++
		}
		batch[i].Src = getSockaddr(&s.rsa[i])
		batch[i].Dst = s.local
		batch[i].HasIPv4ID = false
	}
	for i := 0; i < s.rcount; i++ {
		s.riov[i].Base = nil
	}
	if s.rn > 0 {
		s.l.received.Add(uint64(s.rn))
		s.l.recvBatches.Add(1)
	}
	if trunc > 0 {
		s.l.truncated.Add(uint64(trunc))
	}
	return s.rn
}

// peek runs inside RawConn.Read in the waiter: true once a datagram is queued (not consumed).
func (s *udpSock) peek(fd uintptr) bool {
	var b [1]byte
	for {
		_, _, e := unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1,
			unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
		switch e {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		}
		return true
	}
}

// waiter parks until s is readable, tells Recv, and waits to be re-armed (multi-socket links).
func (s *udpSock) waiter() {
	defer s.l.wg.Done()
	for {
		if err := s.rc.Read(s.peekFn); err != nil {
			return
		}
		select {
		case s.l.ready <- struct{}{}:
		default:
		}
		select {
		case <-s.rearm:
		case <-s.l.closing:
			return
		}
	}
}

// Recv waits for datagrams and fills batch[0:n] with them (up to BatchSize at a time). Src is the
// peer, Dst the local address and port of the socket it arrived on.
func (l *UDPLink) Recv(batch []Datagram) (int, error) {
	if l.closed.Load() {
		return 0, net.ErrClosed
	}
	defer raceReceived()
	if len(batch) == 0 {
		return 0, nil
	}
	if l.xdp != nil {
		return l.recvXDP(batch)
	}
	if len(l.socks) == 1 {
		s := l.socks[0]
		l.rmu.Lock()
		defer l.rmu.Unlock()
		for {
			var n int
			if s.gro {
				if !s.groPending() {
					s.prepGRO()
					if err := s.rc.Read(s.groFn); err != nil || s.rerr != nil {
						return l.recvResult(s, 0, err)
					}
				}
				n = s.drainGRO(batch)
			} else {
				s.prepRecv(batch)
				err := s.rc.Read(s.recvFn)
				n = s.finishRecv(batch)
				if err != nil || s.rerr != nil {
					return l.recvResult(s, n, err)
				}
			}
			if n > 0 {
				return n, nil
			}
		}
	}
	l.rmu.Lock()
	defer l.rmu.Unlock()
	for {
		for k := range l.socks {
			s := l.socks[(l.next+k)%len(l.socks)]
			if s.gro {
				if !s.groPending() {
					s.prepGRO()
					err := s.rc.Control(s.gtryFn)
					if s.again {
						select {
						case s.rearm <- struct{}{}:
						default:
						}
						continue
					}
					if err != nil || s.rerr != nil {
						return l.recvResult(s, 0, err)
					}
				}
				l.next = (l.next + k + 1) % len(l.socks)
				return s.drainGRO(batch), nil
			}
			s.prepRecv(batch)
			err := s.rc.Control(s.tryFn)
			if s.again {
				select {
				case s.rearm <- struct{}{}:
				default:
				}
				s.finishRecv(batch)
				continue
			}
			n := s.finishRecv(batch)
			l.next = (l.next + k + 1) % len(l.socks)
			return l.recvResult(s, n, err)
		}
		select {
		case <-l.ready:
		case <-l.closing:
			return 0, net.ErrClosed
		}
	}
}

func (l *UDPLink) recvResult(s *udpSock, n int, err error) (int, error) {
	if l.closed.Load() {
		return 0, net.ErrClosed
	}
	if err == nil {
		err = s.rerr
	}
	if err != nil {
		return n, fmt.Errorf("recvmmsg on %v: %w", s.local, err)
	}
	return n, nil
}

// BatchSize returns UDPOptions.BatchSize.
func (l *UDPLink) BatchSize() int { return l.batch }

// LocalAddrs returns the bound addresses.
func (l *UDPLink) LocalAddrs() []netip.Addr {
	out := make([]netip.Addr, len(l.socks))
	for i, s := range l.socks {
		out[i] = s.local.Addr()
	}
	return out
}

// LocalAddrPorts returns the bound address and port of each socket.
func (l *UDPLink) LocalAddrPorts() []netip.AddrPort {
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
func (l *UDPLink) SourcePort(local netip.Addr, entropy uint16) uint16 {
	if s := l.sock(local); s != nil {
		return s.sender(entropy).port
	}
	return 0
}

// GSOEnabled reports whether sends from local currently use UDP GSO.
func (l *UDPLink) GSOEnabled(local netip.Addr) bool {
	s := l.sock(local)
	return s != nil && s.gso.Load()
}

// BufferSizes returns SO_RCVBUF and SO_SNDBUF of the socket bound to local as the kernel reports
// them (twice the requested size: the kernel doubles it for bookkeeping).
func (l *UDPLink) BufferSizes(local netip.Addr) (recv, send int, err error) {
	s := l.sock(local)
	if s == nil {
		return 0, 0, fmt.Errorf("buffer sizes of %v: %w", local, ErrNoLocalAddr)
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
func (l *UDPLink) GROEnabled(local netip.Addr) bool {
	s := l.sock(local)
	return s != nil && s.gro
}

// Stats returns the link's counters.
func (l *UDPLink) Stats() Stats {
	st := Stats{Sent: l.sent.Load(), Received: l.received.Load(), SendBatches: l.sendBatches.Load(),
		RecvBatches: l.recvBatches.Load(), GSOSends: l.gsoSends.Load(), GROReceives: l.groReceives.Load(),
		Drops: l.drops.Load(), Truncated: l.truncated.Load(), Fallbacks: l.fallbacks.Load()}
	if x := l.xdp; x != nil {
		st.XDPSent, st.XDPReceived, st.XDPFallbacks = x.sent.Load(), x.received.Load(), x.fallbacks.Load()
		st.XDPPairs, st.XDPPairsOff = x.pairs.Load(), x.pairsOff.Load()
		if x.writes != nil {
			st.XDPWrites = x.writes.executed()
		}
	}
	l.entropyStats(&st)
	return st
}

// Close closes the sockets, unblocks Recv and Send, and waits for the link's goroutines.
func (l *UDPLink) Close() error {
	if l.closed.Swap(true) {
		return nil
	}
	close(l.closing)
	if x := l.xdp; x != nil {
		x.wake() // a Recv in poll(2) returns and lets go of the receive side
		l.rmu.Lock()
		x.txmu.Lock()
		x.close()
		x.txmu.Unlock()
		l.rmu.Unlock()
	}
	err := l.closeSocks()
	l.wg.Wait()
	return err
}

func (l *UDPLink) closeSocks() error {
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
