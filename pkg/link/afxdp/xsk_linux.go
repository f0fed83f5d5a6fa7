package afxdp

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	ebpflink "github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// xdpPass is XDP_PASS, the verdict that leaves a frame to the stack.
const xdpPass = 2

const (
	xdpRing   = 512 // entries of each of the four rings
	xdpFrames = 2 * xdpRing
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
	l      *Link
	fd     int
	ev     int // eventfd: Close wakes a Recv blocked in poll
	udpFD  int // the UDP socket's descriptor (poll only)
	umem   []byte
	fill   *xring
	comp   *xring
	rx     *xring
	tx     *xring
	lk     netlink.Link
	prog   xdpLoaded     // the program and its XSKMAP
	attach ebpflink.Link // the BPF link holding the program on the interface: closing it detaches
	addr   netip.Addr
	addr4  [4]byte
	port   uint16
	mac    [6]byte
	mtu    int // the interface's: a larger IP packet goes through the socket (DF: refused, counted)

	// receive side (Link.rmu held)
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
	// csumErrors counts ring datagrams dropped for a wrong UDP checksum.
	csumErrors atomic.Uint64
	// the ring's batches: kicks that sent frames (and pairs), reads that returned frames
	sendBatches, recvBatches atomic.Uint64

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
func openXDP(l *Link, o Options) (_ *xdpSock, err error) {
	local := l.u.LocalAddrPorts()[0]
	a := local.Addr()
	if !a.Is4() {
		return nil, errors.New("AF_XDP path: IPv4 addresses only")
	}
	x := &xdpSock{l: l, fd: -1, ev: -1, pfd: -1, addr: a,
		sockNext: xdpSocketEvery, sockEvery: xdpSocketEvery, addr4: a.As4(), port: local.Port(),
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
	if err := l.u.RawConn(a).Control(func(fd uintptr) { x.udpFD = int(fd) }); err != nil {
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
	if o.WriteMemory > 0 {
		if x.writes, err = newXDPWrite(o.WriteMemory); err != nil {
			return nil, err
		}
	}
	if x.prog, err = loadXDP(xdpConsts{addr: x.addr4, port: x.port, noSocket: xdpPass}, o.Queue, x.writes, o.Native); err != nil {
		return nil, err
	}
	if err := x.prog.Xsks.Update(o.Queue, uint32(x.fd), ebpf.UpdateAny); err != nil {
		return nil, fmt.Errorf("XSKMAP: %w", err)
	}
	// a BPF link, not netlink: it goes with its descriptor (Close from any thread or
	// namespace, or the process's exit), and it refuses an interface that has a program
	mode := ebpflink.XDPGenericMode
	if o.Native {
		mode = ebpflink.XDPDriverMode
	}
	if x.attach, err = ebpflink.AttachXDP(ebpflink.XDPOptions{Program: x.prog.Prog, Interface: lk.Attrs().Index, Flags: mode}); err != nil {
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
	if x.attach != nil {
		x.attach.Close()
		x.attach = nil
	}
	x.prog.Close()
	x.prog = xdpLoaded{}
	for _, fd := range []*int{&x.fd, &x.ev, &x.pfd} {
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
