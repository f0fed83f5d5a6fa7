package link

// The AF_XDP path (UDPOptions.XDP; docs/link.md "AF_XDP"). A UDP socket's receive costs a
// system call per read and its send runs the IP/UDP stack; kernel rxe does neither (its
// receive runs in the sender's softirq, its post is one system call). With XDP on, an XDP
// program on the link's interface redirects the link's own RoCEv2 datagrams (IPv4, no IP
// options, not fragmented, to the link's address and port, at most XDPMaxFrame bytes) to an
// AF_XDP socket, whose receive ring the link reads in memory: no system call per read. Sends
// of datagrams that fit go as Ethernet frames the link builds (IPv4 ID 0 and DF, as the UDP
// socket's; UDP checksum 0, which IPv4 allows) through the socket's transmit ring, one
// sendto per Send. Everything else keeps working through the link's UDP socket, which stays
// open: frames the program passes (ARP, IPv6, larger or fragmented datagrams) and sends the
// ring cannot take (no MAC address known for the peer yet, too large, ring full).
//
// The peer's MAC address is learned from the frames it sends (their Ethernet source: the peer,
// or the router it sits behind) or, before its first frame, from the kernel's neighbour table
// (an on-link peer the host has talked to, e.g. over the out-of-band TCP connection); until
// then sends to it go through the UDP socket, whose kernel path resolves ARP. Copy mode (XDP_COPY) and the generic (SKB) XDP
// hook work on any driver and MTU; one socket on one receive queue (XDPOptions.Queue): on a
// multi-queue NIC the other queues' datagrams reach the UDP socket (one flow keeps one queue).

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// XDPOptions configure the AF_XDP path (UDPOptions.XDP). It needs CAP_NET_ADMIN, CAP_BPF
// (or root) and a link of one IPv4 address.
type XDPOptions struct {
	// On enables it.
	On bool
	// Interface is the interface that holds the link's address; "" finds it by the address.
	Interface string
	// Queue is the receive queue the socket binds to.
	Queue uint32
	// Native attaches the program in the driver's XDP hook (XDP_FLAGS_DRV_MODE, a
	// multi-buffer-aware program) instead of the generic one; the driver must support it
	// (veth does).
	Native bool
	// NoPairs keeps a [request, response] pair of one flow as two ring frames. By default, on
	// a veth, such a pair leaves as one AF_PACKET frame asking for UDP GSO (xdppair_linux.go),
	// where the kernel takes it (Linux 6.2 and later).
	NoPairs bool
	// WriteMemory, when > 0, gives the XDP program a write responder with this many bytes of
	// device memory (xdpwrite_linux.go): RC WRITE Only requests to QPs and MRs registered with
	// AddWriteQP / AddWriteMR are executed and ACKed in the program.
	WriteMemory int
}

const (
	xdpChunk    = 4096 // UMEM chunk (one page: the largest Linux before 6.6 takes)
	xdpRing     = 512  // entries of each of the four rings
	xdpFrames   = 2 * xdpRing
	xdpHeadroom = 256 // XDP_PACKET_HEADROOM: a copied frame starts this far into its chunk
	// XDPMaxFrame is the largest Ethernet frame the AF_XDP path carries (one chunk less the
	// kernel's headroom): UDP payloads up to XDPMaxFrame-42 bytes, enough for RoCE MTU 2048.
	XDPMaxFrame = xdpChunk - xdpHeadroom
	ethIPv4UDP  = 14 + 20 + 8
	// xdpSocketEvery: TryRecv reads the UDP socket every this many calls (what reaches it is
	// rare: frames the program passes on; each read is a system call, which a poll loop that
	// spins on the ring would otherwise make ~2 times per 8-byte round trip in the lab guest).
	// While those reads find nothing the interval doubles, up to xdpSocketMax calls (an idle
	// spin in the lab guest spent 7.6% of its time in them at 256); one that finds a datagram
	// sets it back.
	xdpSocketEvery = 256
	xdpSocketMax   = 8192
)

// xring is one mmapped AF_XDP ring: fill and completion rings hold UMEM addresses (8 bytes),
// receive and transmit rings XDP descriptors (16 bytes).
type xring struct {
	prod, cons *uint32
	desc       unsafe.Pointer
	mask       uint32
	mem        []byte
}

func mapXRing(fd int, off unix.XDPRingOffset, pgoff int64, entry uintptr) (*xring, error) {
	mem, err := unix.Mmap(fd, pgoff, int(off.Desc)+xdpRing*int(entry), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("mmap AF_XDP ring %#x: %w", pgoff, err)
	}
	b := unsafe.Pointer(&mem[0])
	return &xring{prod: (*uint32)(unsafe.Add(b, off.Producer)), cons: (*uint32)(unsafe.Add(b, off.Consumer)),
		desc: unsafe.Add(b, off.Desc), mask: xdpRing - 1, mem: mem}, nil
}

func (r *xring) addr(i uint32) *uint64 { return (*uint64)(unsafe.Add(r.desc, uintptr(i&r.mask)*8)) }

func (r *xring) xdesc(i uint32) *unix.XDPDesc {
	return (*unix.XDPDesc)(unsafe.Add(r.desc, uintptr(i&r.mask)*unsafe.Sizeof(unix.XDPDesc{})))
}

// xdpSock is the link's AF_XDP socket, its UMEM and the XDP program that feeds it.
type xdpSock struct {
	l      *UDPLink
	fd     int
	ev     int // eventfd: Close wakes a Recv blocked in poll
	udpFD  int // the UDP socket's descriptor (poll only)
	umem   []byte
	fill   *xring
	comp   *xring
	rx     *xring
	tx     *xring
	lk     netlink.Link
	prog   int
	xmap   int
	attach int // the BPF link holding the program on the interface: closing it detaches
	addr   netip.Addr
	addr4  [4]byte
	port   uint16
	mac    [6]byte
	mtu    int // the interface's: a larger IP packet goes through the socket (DF: refused, counted)

	// receive side (UDPLink.rmu held)
	held  []uint64 // chunks handed out as views, back to the fill ring at the next read
	polls int
	// the UDP socket's next read is at call sockNext (tryRecvXDP), sockEvery calls after the
	// last one
	sockNext, sockEvery int

	// send side
	txmu   sync.Mutex
	free   []uint64 // transmit chunks
	queued int      // descriptors written since the last kick
	txProd uint32   // the transmit ring's producer index as written; kick publishes it

	// peers: IPv4 address -> MAC address, learned from received frames or from the kernel's
	// neighbour table (asked through nl, a netlink socket of the link's namespace, at most
	// once per xdpNeighEvery per address: asked[a] is the last time)
	nmu   sync.Mutex
	peers map[[4]byte]*xdpPeer // entries never change: a new MAC is a new entry
	asked map[[4]byte]time.Time
	nl    *netlink.Handle
	last  atomic.Pointer[xdpPeer] // the last peer learned or looked up (no lock, no map)

	sent, received, fallbacks atomic.Uint64

	// GSO pairs (xdppair_linux.go; pfd -1 without them): the AF_PACKET socket, its
	// destination, the frame buffer (txmu held), whether pairs are on, and the counts of
	// pairs sent and of refusals
	pfd      int
	pto      unix.RawSockaddrLinklayer
	pbuf     []byte
	pairsOn  atomic.Bool
	pairs    atomic.Uint64
	pairsOff atomic.Uint64

	writes *xdpWrite // the write responder (nil without)
}

type xdpPeer struct {
	ip  [4]byte
	mac [6]byte
}

// openXDP sets up the AF_XDP path for the link's one IPv4 socket s.
func openXDP(s *udpSock, o XDPOptions) (_ *xdpSock, err error) {
	a := s.local.Addr()
	if !a.Is4() {
		return nil, errors.New("AF_XDP path: IPv4 addresses only")
	}
	x := &xdpSock{l: s.l, fd: -1, ev: -1, prog: -1, xmap: -1, attach: -1, pfd: -1, addr: a,
		sockNext: xdpSocketEvery, sockEvery: xdpSocketEvery, addr4: a.As4(), port: s.local.Port(),
		peers: make(map[[4]byte]*xdpPeer), asked: make(map[[4]byte]time.Time)}
	defer func() {
		if err != nil { // whatever was set up goes (x, not the result: a failing return set that nil)
			x.close()
		}
	}()
	if x.lk, err = xdpInterface(a, o.Interface); err != nil {
		return nil, err
	}
	if x.nl, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil { // this thread's namespace, the socket's
		return nil, fmt.Errorf("AF_XDP path: netlink: %w", err)
	}
	lk := x.lk
	if len(lk.Attrs().HardwareAddr) != 6 {
		return nil, fmt.Errorf("AF_XDP path: %s has no Ethernet address", lk.Attrs().Name)
	}
	copy(x.mac[:], lk.Attrs().HardwareAddr)
	x.mtu = lk.Attrs().MTU
	if err := s.rc.Control(func(fd uintptr) { x.udpFD = int(fd) }); err != nil {
		return nil, err
	}
	if x.ev, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	if x.fd, err = unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0); err != nil {
		return nil, fmt.Errorf("AF_XDP socket: %w", err)
	}
	if x.umem, err = unix.Mmap(-1, 0, xdpChunk*xdpFrames, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE); err != nil {
		return nil, fmt.Errorf("AF_XDP UMEM: %w", err)
	}
	reg := unix.XDPUmemReg{Addr: uint64(uintptr(unsafe.Pointer(&x.umem[0]))), Len: uint64(len(x.umem)), Size: xdpChunk}
	if _, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(x.fd), unix.SOL_XDP, unix.XDP_UMEM_REG, uintptr(unsafe.Pointer(&reg)), unsafe.Sizeof(reg), 0); e != 0 {
		return nil, fmt.Errorf("XDP_UMEM_REG: %w", e)
	}
	for _, opt := range []int{unix.XDP_UMEM_FILL_RING, unix.XDP_UMEM_COMPLETION_RING, unix.XDP_RX_RING, unix.XDP_TX_RING} {
		if err := unix.SetsockoptInt(x.fd, unix.SOL_XDP, opt, xdpRing); err != nil {
			return nil, fmt.Errorf("AF_XDP ring option %d: %w", opt, err)
		}
	}
	var off unix.XDPMmapOffsets
	ol := uint32(unsafe.Sizeof(off))
	if _, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(x.fd), unix.SOL_XDP, unix.XDP_MMAP_OFFSETS, uintptr(unsafe.Pointer(&off)), uintptr(unsafe.Pointer(&ol)), 0); e != 0 {
		return nil, fmt.Errorf("XDP_MMAP_OFFSETS: %w", e)
	}
	ds := unsafe.Sizeof(unix.XDPDesc{})
	if x.fill, err = mapXRing(x.fd, off.Fr, unix.XDP_UMEM_PGOFF_FILL_RING, 8); err != nil {
		return nil, err
	}
	if x.comp, err = mapXRing(x.fd, off.Cr, unix.XDP_UMEM_PGOFF_COMPLETION_RING, 8); err != nil {
		return nil, err
	}
	if x.rx, err = mapXRing(x.fd, off.Rx, unix.XDP_PGOFF_RX_RING, ds); err != nil {
		return nil, err
	}
	if x.tx, err = mapXRing(x.fd, off.Tx, unix.XDP_PGOFF_TX_RING, ds); err != nil {
		return nil, err
	}
	// the first half of the chunks to the fill ring (it never holds more: a chunk goes back
	// only after the kernel took one), the second half for sending
	for i := uint32(0); i < xdpRing; i++ {
		*x.fill.addr(i) = uint64(i) * xdpChunk
	}
	atomic.StoreUint32(x.fill.prod, xdpRing)
	x.free = make([]uint64, 0, xdpRing)
	for i := xdpRing; i < xdpFrames; i++ {
		x.free = append(x.free, uint64(i)*xdpChunk)
	}
	x.held = make([]uint64, 0, xdpRing)
	if err := unix.Bind(x.fd, &unix.SockaddrXDP{Flags: unix.XDP_COPY, Ifindex: uint32(lk.Attrs().Index), QueueID: o.Queue}); err != nil {
		return nil, fmt.Errorf("bind AF_XDP socket to %s queue %d: %w", lk.Attrs().Name, o.Queue, err)
	}
	if x.xmap, err = bpfXSKMap(int(o.Queue) + 1); err != nil {
		return nil, err
	}
	if err := bpfMapSet(x.xmap, o.Queue, uint32(x.fd)); err != nil {
		return nil, err
	}
	if o.WriteMemory > 0 {
		if x.writes, err = newXDPWrite(o.WriteMemory); err != nil {
			return nil, err
		}
	}
	if x.prog, err = bpfLoadXDP(xdpProgram(x.xmap, x.addr4, x.port, XDPMaxFrame, x.writes), o.Native); err != nil {
		return nil, err
	}
	// a BPF link, not netlink: it goes with its descriptor (Close from any thread or
	// namespace, or the process's exit), and it refuses an interface that has a program
	if x.attach, err = bpfAttachXDP(x.prog, lk.Attrs().Index, o.Native); err != nil {
		return nil, fmt.Errorf("attach XDP program to %s: %w", lk.Attrs().Name, err)
	}
	if !o.NoPairs {
		x.openPairs()
	}
	return x, nil
}

// xdpInterface returns the interface named name, or the one holding a.
func xdpInterface(a netip.Addr, name string) (netlink.Link, error) {
	if name != "" {
		return netlink.LinkByName(name)
	}
	as, err := netlink.AddrList(nil, unix.AF_INET)
	if err != nil {
		return nil, fmt.Errorf("AF_XDP path: listing addresses: %w", err)
	}
	for _, ad := range as {
		if ip, ok := netip.AddrFromSlice(ad.IP.To4()); ok && ip == a {
			return netlink.LinkByIndex(ad.LinkIndex)
		}
	}
	return nil, fmt.Errorf("AF_XDP path: no interface holds %v", a)
}

func (x *xdpSock) close() {
	for _, r := range []*xring{x.fill, x.comp, x.rx, x.tx} {
		if r != nil {
			_ = unix.Munmap(r.mem)
		}
	}
	x.fill, x.comp, x.rx, x.tx = nil, nil, nil, nil
	if x.nl != nil {
		x.nl.Close()
		x.nl = nil
	}
	x.pairsOn.Store(false)
	for _, fd := range []*int{&x.attach, &x.fd, &x.prog, &x.xmap, &x.ev, &x.pfd} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
	if x.umem != nil {
		_ = unix.Munmap(x.umem)
		x.umem = nil
	}
	if x.writes != nil {
		x.writes.close()
	}
}

// wake unblocks a Recv waiting in poll (Close).
func (x *xdpSock) wake() {
	var one = [8]byte{1}
	_, _ = unix.Write(x.ev, one[:])
}

// xdpMaxPeers caps the learned table (a frame's source address is remote input).
const xdpMaxPeers = 4096

// learn records mac as ip's (the source of a frame from ip, or the neighbour table's answer),
// for an address the link sends to (one looked up before: remote frames cannot fill the table
// with addresses of their choosing), while the table has room. A peer's later frames update
// its MAC (a moved peer), as ARP would; like ARP, a spoofed frame can mislead it until the
// peer's next frame.
func (x *xdpSock) learn(ip [4]byte, mac []byte) {
	if p := x.last.Load(); p != nil && p.ip == ip && string(p.mac[:]) == string(mac) {
		return
	}
	x.nmu.Lock()
	p, known := x.peers[ip]
	_, asked := x.asked[ip]
	switch {
	case known && string(p.mac[:]) == string(mac):
	case known || asked && len(x.peers) < xdpMaxPeers:
		p = &xdpPeer{ip: ip}
		copy(p.mac[:], mac)
		x.peers[ip] = p
	default:
		p = nil
	}
	x.nmu.Unlock()
	if p != nil {
		x.last.Store(p) // the same entry for as long as the MAC holds: no allocation per packet
	}
}

// lookup returns the MAC address learned for ip; not learned yet, it asks the kernel's
// neighbour table (the UDP socket's sends, or any other traffic, may have resolved it).
func (x *xdpSock) lookup(ip [4]byte) ([6]byte, bool) {
	if p := x.last.Load(); p != nil && p.ip == ip {
		return p.mac, true
	}
	x.nmu.Lock()
	p, ok := x.peers[ip]
	x.nmu.Unlock()
	if !ok {
		return x.neighbour(ip)
	}
	x.last.Store(p)
	return p.mac, true
}

// xdpNeighEvery bounds how often one address is looked up in the kernel's neighbour table.
const xdpNeighEvery = 100 * time.Millisecond

// neighbour looks ip up in the kernel's neighbour table of the link's interface (a usable
// entry: reachable, stale, delayed, probing or permanent) and learns it.
func (x *xdpSock) neighbour(ip [4]byte) ([6]byte, bool) {
	now := time.Now()
	x.nmu.Lock()
	if t, ok := x.asked[ip]; ok && now.Sub(t) < xdpNeighEvery {
		x.nmu.Unlock()
		return [6]byte{}, false
	}
	if len(x.asked) < xdpMaxPeers {
		x.asked[ip] = now
	}
	x.nmu.Unlock()
	ns, err := x.nl.NeighList(x.lk.Attrs().Index, unix.AF_INET)
	if err != nil {
		return [6]byte{}, false
	}
	const usable = netlink.NUD_REACHABLE | netlink.NUD_STALE | netlink.NUD_DELAY | netlink.NUD_PROBE | netlink.NUD_PERMANENT
	for _, n := range ns {
		if a, ok := netip.AddrFromSlice(n.IP.To4()); ok && a.As4() == ip && len(n.HardwareAddr) == 6 && n.State&usable != 0 {
			x.learn(ip, n.HardwareAddr)
			if p := x.last.Load(); p != nil && p.ip == ip {
				return p.mac, true
			}
			return [6]byte{}, false // the table is full
		}
	}
	return [6]byte{}, false
}

// reap returns the chunks of sent frames to the free list (txmu held).
func (x *xdpSock) reap() {
	c := atomic.LoadUint32(x.comp.cons)
	p := atomic.LoadUint32(x.comp.prod)
	for ; c != p; c++ {
		x.free = append(x.free, *x.comp.addr(c)&^(xdpChunk-1))
	}
	atomic.StoreUint32(x.comp.cons, c)
}

// queue writes d as an Ethernet frame into the transmit ring; false: it cannot go this way
// (no MAC for the peer, too large, not IPv4 from this address, no free chunk). txmu held.
func (x *xdpSock) queue(d *Datagram) bool {
	n := ethIPv4UDP + len(d.Buf)
	dst := d.Dst.Addr().Unmap()
	if n > XDPMaxFrame || n-14 > x.mtu || !dst.Is4() || d.Src.Addr().Unmap() != x.addr {
		return false
	}
	d4 := dst.As4()
	mac, ok := x.lookup(d4)
	if !ok {
		return false
	}
	if len(x.free) == 0 {
		x.reap()
		if len(x.free) == 0 {
			return false
		}
	}
	a := x.free[len(x.free)-1]
	x.free = x.free[:len(x.free)-1]
	f := x.umem[a : a+uint64(n)]
	x.headers(f, mac, d4, d.TClass, d.Src.Port(), d.Dst.Port())
	copy(f[42:], d.Buf)
	p := x.txProd
	if p-atomic.LoadUint32(x.tx.cons) >= xdpRing {
		x.free = append(x.free, a)
		return false
	}
	xd := x.tx.xdesc(p)
	xd.Addr, xd.Len, xd.Options = a, uint32(n), 0
	x.txProd = p + 1 // published by kick: one store per send, not per frame
	x.queued++
	return true
}

// headers writes the Ethernet, IPv4 and UDP headers of frame f (the whole frame: its length
// sets the IP and UDP lengths) from this link's address to dst at mac: IPv4 ID 0 and DF (as
// the UDP socket's; IBTA A17.3.3), TTL 64, the traffic class, UDP checksum 0.
func (x *xdpSock) headers(f []byte, mac [6]byte, dst [4]byte, tclass uint8, sp, dp uint16) {
	copy(f[0:6], mac[:])
	copy(f[6:12], x.mac[:])
	f[12], f[13] = 0x08, 0x00
	ip := f[14:34]
	tot := len(f) - 14
	ip[0], ip[1] = 0x45, tclass
	ip[2], ip[3] = byte(tot>>8), byte(tot)
	ip[4], ip[5], ip[6], ip[7] = 0, 0, 0x40, 0
	ip[8], ip[9], ip[10], ip[11] = 64, unix.IPPROTO_UDP, 0, 0
	copy(ip[12:16], x.addr4[:])
	copy(ip[16:20], dst[:])
	ipChecksum(ip)
	u := f[34:42]
	ul := tot - 20
	u[0], u[1], u[2], u[3] = byte(sp>>8), byte(sp), byte(dp>>8), byte(dp)
	u[4], u[5], u[6], u[7] = byte(ul>>8), byte(ul), 0, 0
}

// ipChecksum sets the IPv4 header checksum of h (20 bytes; its checksum field 0): the
// one's-complement sum of the ten 16-bit words, taken as five 32-bit words and folded.
func ipChecksum(h []byte) {
	_ = h[19]
	sum := uint64(binary.BigEndian.Uint32(h[0:])) + uint64(binary.BigEndian.Uint32(h[4:])) +
		uint64(binary.BigEndian.Uint32(h[8:])) + uint64(binary.BigEndian.Uint32(h[12:])) +
		uint64(binary.BigEndian.Uint32(h[16:]))
	sum = sum&0xffff + sum>>16
	sum = sum&0xffff + sum>>16
	sum = sum&0xffff + sum>>16
	h[10], h[11] = byte(^sum>>8), byte(^sum)
}

// kick has the kernel send what queue wrote (txmu held): sendto until the ring is consumed
// (the kernel takes a bounded batch per call and says EAGAIN for the rest).
func (x *xdpSock) kick() error {
	if x.queued == 0 {
		return nil
	}
	n := uint64(x.queued)
	x.queued = 0
	atomic.StoreUint32(x.tx.prod, x.txProd)
	x.sent.Add(n)
	x.l.sent.Add(n)
	x.l.sendBatches.Add(1)
	for try := 0; try < xdpKickTries; try++ {
		_, _, e := unix.RawSyscall6(unix.SYS_SENDTO, uintptr(x.fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
		switch e {
		case 0, unix.EAGAIN, unix.EBUSY, unix.ENOBUFS, unix.EINTR:
		default:
			return fmt.Errorf("AF_XDP send on %s: %w", x.lk.Attrs().Name, e)
		}
		if atomic.LoadUint32(x.tx.cons) == x.txProd {
			return nil
		}
		if try > 2 {
			runtime.Gosched()
		}
	}
	// the kernel is short of buffers: what is left in the ring leaves with the next kick
	return nil
}

// xdpKickTries bounds one kick's sendto calls (the kernel takes a bounded batch per call).
const xdpKickTries = 16

// sendXDP is Send on a link with the AF_XDP path: what fits goes through the transmit ring,
// the rest through the UDP socket, in order (queued frames leave before a socket send).
func (l *UDPLink) sendXDP(batch []Datagram) error {
	x := l.xdp
	x.txmu.Lock()
	defer x.txmu.Unlock()
	if x.umem == nil {
		return net.ErrClosed // Close took the rings
	}
	return l.sendXDPLocked(batch)
}

// sendXDPPair is SendRuns of one run of two on a link with the AF_XDP path: one GSO frame
// (xdppair_linux.go), else two frames as sendXDP with the second's ICRC rewritten for IPv4 ID
// 0, the ID a frame carries.
func (l *UDPLink) sendXDPPair(batch []Datagram) error {
	x := l.xdp
	x.txmu.Lock()
	defer x.txmu.Unlock()
	if x.umem == nil {
		return net.ErrClosed
	}
	if x.sendPair(batch) {
		return nil
	}
	if !batch[1].Src.Addr().Unmap().Is6() {
		fixICRC(&batch[1], batch[1].Src.Port())
	}
	return l.sendXDPLocked(batch)
}

// sendXDPLocked is sendXDP with txmu held and the rings open.
func (l *UDPLink) sendXDPLocked(batch []Datagram) error {
	x := l.xdp
	for i := range batch {
		d := &batch[i]
		if x.queue(d) {
			continue
		}
		if err := x.kick(); err != nil {
			return err
		}
		x.fallbacks.Add(1)
		s := l.sock(d.Src.Addr())
		if err := s.send(batch[i:i+1], s.sender(d.Src.Port())); err != nil {
			return err
		}
	}
	return x.kick()
}

// release gives the chunks handed out by the last read back to the fill ring (rmu held).
func (x *xdpSock) release() {
	if len(x.held) == 0 {
		return
	}
	p := atomic.LoadUint32(x.fill.prod)
	for _, a := range x.held {
		*x.fill.addr(p) = a
		p++
	}
	atomic.StoreUint32(x.fill.prod, p)
	x.held = x.held[:0]
}

// recv reads up to len(batch) frames from the receive ring (rmu held): views of the UMEM
// (valid until the next read) or, with copyOut, copies into batch[k].Buf.
func (x *xdpSock) recv(batch []Datagram, copyOut bool) int {
	x.release()
	c := atomic.LoadUint32(x.rx.cons)
	p := atomic.LoadUint32(x.rx.prod)
	if c == p {
		// an empty ring: no store to the consumer index (an atomic store is a locked
		// instruction, the most expensive step of a polling loop's empty read)
		return 0
	}
	k := 0
	for ; c != p && k < len(batch); c++ {
		xd := *x.rx.xdesc(c)
		if xd.Addr >= uint64(len(x.umem)) { // the kernel writes this ring; never trust it blindly
			continue
		}
		chunk := xd.Addr &^ (xdpChunk - 1)
		x.held = append(x.held, chunk)
		if uint64(xd.Len) > chunk+xdpChunk-xd.Addr {
			continue
		}
		if !x.parse(&batch[k], x.umem[xd.Addr:xd.Addr+uint64(xd.Len)], copyOut) {
			continue
		}
		k++
	}
	atomic.StoreUint32(x.rx.cons, c)
	if k > 0 {
		x.received.Add(uint64(k))
		x.l.received.Add(uint64(k))
		x.l.recvBatches.Add(1)
	}
	return k
}

// parse fills d from an Ethernet frame the program redirected (checked again: it is remote
// input); false drops it.
func (x *xdpSock) parse(d *Datagram, f []byte, copyOut bool) bool {
	if len(f) < ethIPv4UDP || f[12] != 0x08 || f[13] != 0x00 || f[14] != 0x45 || f[23] != unix.IPPROTO_UDP {
		return false
	}
	tot := int(f[16])<<8 | int(f[17])
	ul := int(f[38])<<8 | int(f[39])
	if tot < 28 || 14+tot > len(f) || ul < 8 || ul > tot-20 || f[20]&0x3f != 0 || f[21] != 0 {
		return false
	}
	var dst [4]byte
	copy(dst[:], f[30:34])
	dp := uint16(f[36])<<8 | uint16(f[37])
	if dst != x.addr4 || dp != x.port {
		return false
	}
	var src [4]byte
	copy(src[:], f[26:30])
	x.learn(src, f[6:12])
	pl := f[ethIPv4UDP : 34+ul : 34+ul]
	if copyOut {
		n := copy(d.Buf[:cap(d.Buf)], pl)
		d.Buf = d.Buf[:n]
	} else {
		d.Buf = pl
	}
	d.Src = netip.AddrPortFrom(netip.AddrFrom4(src), uint16(f[34])<<8|uint16(f[35]))
	d.Dst = netip.AddrPortFrom(x.addr, dp)
	d.TClass = 0
	d.HasIPv4ID, d.IPv4ID = true, uint16(f[18])<<8|uint16(f[19])
	return true
}

// tryRecvXDP is one non-blocking read of a link with the AF_XDP path (rmu held): the ring;
// every xdpSocketEvery-th call, up to every xdpSocketMax-th while it finds nothing (every
// call with socket), the UDP socket first, so that what reaches the socket is read however
// busy the ring is.
func (l *UDPLink) tryRecvXDP(batch []Datagram, copyOut, socket bool) (int, error) {
	x := l.xdp
	if x.polls++; socket || x.polls >= x.sockNext {
		s := l.socks[0]
		s.prepRecv(batch)
		err := s.rc.Control(s.tryFn)
		n := s.finishRecv(batch)
		if n > 0 || err != nil || s.rerr != nil {
			x.sockEvery = xdpSocketEvery
			x.sockNext = x.polls + x.sockEvery
			return l.recvResult(s, n, err)
		}
		if !socket {
			x.sockEvery = min(2*x.sockEvery, xdpSocketMax)
		}
		x.sockNext = x.polls + x.sockEvery
	}
	return x.recv(batch, copyOut), nil
}

// recvXDP is Recv on a link with the AF_XDP path (after Recv's checks): read, copying into
// the caller's buffers, else wait in poll(2) for the ring, the UDP socket or Close. RecvView
// comes here through Recv (the socket has no GRO with the AF_XDP path).
func (l *UDPLink) recvXDP(batch []Datagram) (int, error) {
	const copyOut = true
	l.rmu.Lock()
	defer l.rmu.Unlock()
	x := l.xdp
	fds := []unix.PollFd{{Fd: int32(x.fd), Events: unix.POLLIN}, {Fd: int32(x.udpFD), Events: unix.POLLIN}, {Fd: int32(x.ev), Events: unix.POLLIN}}
	for {
		if l.closed.Load() {
			return 0, net.ErrClosed
		}
		n, err := l.tryRecvXDP(batch, copyOut, true)
		if n > 0 || err != nil {
			return n, err
		}
		if _, err := unix.Poll(fds, -1); err != nil && err != unix.EINTR {
			return 0, os.NewSyscallError("poll", err)
		}
	}
}

// XDP instructions (struct bpf_insn) and the bpf(2) calls that load them.

type bpfInsn struct {
	code uint8
	regs uint8 // dst register in the low nibble, src in the high one
	off  int16
	imm  int32
}

func insn(code, dst, src uint8, off int16, imm int32) bpfInsn {
	return bpfInsn{code: code, regs: dst | src<<4, off: off, imm: imm}
}

// xdpProgram returns an XDP program that redirects IPv4 (header of 20 bytes, not a fragment)
// UDP datagrams to addr:port of at most maxFrame bytes (bpf_xdp_get_buff_len: all of the
// frame, also when a driver hands it over in several buffers) to the XSKMAP entry of the
// receive queue, and passes everything else (and everything, if the queue has no socket) to
// the stack. With w, RC WRITE Only requests that w's tables allow are executed in the program
// first (xdpwrite_linux.go); whatever it declines is redirected as before.
func xdpProgram(xmap int, addr [4]byte, port uint16, maxFrame int, w *xdpWrite) []bpfInsn {
	const xdpPassCode, redirectMap, getBuffLen = 2, 51, 188 // BPF_FUNC_redirect_map, BPF_FUNC_xdp_get_buff_len
	// packet loads are in the host's byte order: compare with the wire bytes loaded so
	ne := binary.NativeEndian
	addrC := int32(ne.Uint32(addr[:]))
	portC := int32(ne.Uint16([]byte{byte(port >> 8), byte(port)}))
	ipv4C := int32(ne.Uint16([]byte{0x08, 0x00}))
	fragC := int32(ne.Uint16([]byte{0x3f, 0xff})) // MF and the fragment offset
	a := newBPFAsm()
	a.op(bMovX, 6, 1, 0, 0) // r6 = ctx
	a.op(bCall, 0, 0, 0, getBuffLen)
	a.jmp(bJgtK, 0, 0, int32(maxFrame), "pass")
	if w != nil {
		a.op(bStxDW, 10, 0, wsFrameLen, 0)
	}
	a.op(bLdxW, 2, 6, 0, 0) // r2 = ctx->data
	a.op(bLdxW, 3, 6, 4, 0) // r3 = ctx->data_end
	a.op(bMovX, 4, 2, 0, 0)
	a.op(bAddK, 4, 0, 0, ethIPv4UDP)
	a.jmp(bJgtX, 4, 3, 0, "pass") // shorter than Ethernet + IPv4 + UDP
	a.op(bLdxH, 5, 2, 12, 0)
	a.jmp(bJneK, 5, 0, ipv4C, "pass") // EtherType 0x0800
	a.op(bLdxB, 5, 2, 14, 0)
	a.jmp(bJneK, 5, 0, 0x45, "pass") // IPv4, 20-byte header
	a.op(bLdxB, 5, 2, 23, 0)
	a.jmp(bJneK, 5, 0, unix.IPPROTO_UDP, "pass")
	a.op(bLdxH, 5, 2, 20, 0)
	a.op(bAndK, 5, 0, 0, fragC)
	a.jmp(bJneK, 5, 0, 0, "pass")
	a.op(bLdxW, 5, 2, 30, 0)
	a.jmp(0x56 /* jne32 K */, 5, 0, addrC, "pass")
	a.op(bLdxH, 5, 2, 36, 0)
	a.jmp(bJneK, 5, 0, portC, "pass")
	if w != nil {
		w.program(a, "redirect")
	}
	a.label("redirect")
	a.op(bLdxW, 2, 6, 16, 0) // r2 = ctx->rx_queue_index
	a.mapFD(1, xmap)
	a.op(bMovK, 3, 0, 0, xdpPassCode) // no socket on this queue: XDP_PASS
	a.op(bCall, 0, 0, 0, redirectMap)
	a.op(bExit, 0, 0, 0, 0)
	a.label("pass")
	a.op(bMovK, 0, 0, 0, xdpPassCode)
	a.op(bExit, 0, 0, 0, 0)
	return a.done()
}

func bpfCall(cmd int, attr unsafe.Pointer, size uintptr) (int, error) {
	r, _, e := unix.Syscall(unix.SYS_BPF, uintptr(cmd), uintptr(attr), size)
	if e != 0 {
		return -1, e
	}
	return int(r), nil
}

// bpfXSKMap creates an XSKMAP of n entries (queue index -> AF_XDP socket).
func bpfXSKMap(n int) (int, error) {
	fd, err := bpfMapCreate(unix.BPF_MAP_TYPE_XSKMAP, 4, 4, uint32(n), 0)
	if err != nil {
		return -1, fmt.Errorf("bpf: create XSKMAP: %w", err)
	}
	return fd, nil
}

func bpfMapSet(m int, key, val uint32) error {
	err := bpfMapUpdate(m, unsafe.Pointer(&key), unsafe.Pointer(&val))
	runtime.KeepAlive(&key)
	runtime.KeepAlive(&val)
	if err != nil {
		return fmt.Errorf("bpf: XSKMAP update: %w", err)
	}
	return nil
}

// bpfAttachXDP attaches prog to interface ifindex in generic (SKB) mode, or the driver's with
// native, as a BPF link (BPF_LINK_CREATE, Linux 5.9) and returns the link's descriptor.
func bpfAttachXDP(prog, ifindex int, native bool) (int, error) {
	mode := uint32(unix.XDP_FLAGS_SKB_MODE)
	if native {
		mode = unix.XDP_FLAGS_DRV_MODE
	}
	attr := struct{ prog, target, typ, flags uint32 }{uint32(prog), uint32(ifindex), unix.BPF_XDP, mode}
	fd, err := bpfCall(unix.BPF_LINK_CREATE, unsafe.Pointer(&attr), unsafe.Sizeof(attr))
	if err != nil {
		return -1, fmt.Errorf("bpf: BPF_LINK_CREATE: %w", err)
	}
	return fd, nil
}

// bpfLoadXDP loads prog as an XDP program (frags: one that accepts multi-buffer frames, which a
// driver hook with a large MTU requires); the verifier's log comes with a refusal.
func bpfLoadXDP(prog []bpfInsn, frags bool) (int, error) {
	fd, err := bpfLoadXDPLog(prog, frags, nil)
	if err == nil {
		return fd, nil
	}
	// again with the verifier's log (not the first time: a long program's log of a success
	// can overflow any buffer, which fails the load); its end says why
	vlog := make([]byte, 1<<20)
	if fd, err2 := bpfLoadXDPLog(prog, frags, vlog); err2 == nil {
		return fd, nil // refused once, not twice: take it
	}
	n := 0
	for n < len(vlog) && vlog[n] != 0 {
		n++
	}
	msg := vlog[:n]
	if len(msg) > 4096 {
		msg = msg[len(msg)-4096:]
	}
	return -1, fmt.Errorf("bpf: load XDP program: %w: %s", err, msg)
}

func bpfLoadXDPLog(prog []bpfInsn, frags bool, vlog []byte) (int, error) {
	license := []byte("Dual MIT/GPL\x00")
	attr := struct {
		typ, cnt       uint32
		insns, license uint64
		level, size    uint32
		log            uint64
		kver, flags    uint32
		name           [16]byte
		ifindex, eat   uint32
	}{typ: unix.BPF_PROG_TYPE_XDP, cnt: uint32(len(prog)), insns: uint64(uintptr(unsafe.Pointer(&prog[0]))),
		license: uint64(uintptr(unsafe.Pointer(&license[0])))}
	if vlog != nil {
		attr.level, attr.size, attr.log = 1, uint32(len(vlog)), uint64(uintptr(unsafe.Pointer(&vlog[0])))
	}
	copy(attr.name[:], "softroce_xsk")
	if frags {
		attr.flags = unix.BPF_F_XDP_HAS_FRAGS
	}
	fd, err := bpfCall(unix.BPF_PROG_LOAD, unsafe.Pointer(&attr), unsafe.Sizeof(attr))
	runtime.KeepAlive(prog)
	runtime.KeepAlive(license)
	runtime.KeepAlive(vlog)
	return fd, err
}
