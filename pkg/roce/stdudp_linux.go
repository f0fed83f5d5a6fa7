package roce

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/udp"
)

// stdUDP is a portable link.Link on plain net.UDPConn sockets: one
// datagram per system call, one reader goroutine per socket handing
// filled buffers to Recv through a channel (buffers are pooled; Recv
// copies into the caller's). It is the fallback selected by
// UDPOptions.Portable: slower than udp.Listen's sendmmsg/recvmmsg,
// but it only uses the standard library's socket calls.
type stdUDP struct {
	conns   []*net.UDPConn
	locals  []netip.AddrPort
	rx      chan stdRx
	free    chan []byte
	closing chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
}

// wire models the kernel's memory ordering between a send and a later
// receive in the same process (two devices on loopback): the race
// detector cannot see through sockets, so the sender releases and the
// receiver acquires this atomic, as the kernel's socket queues do.
var wire atomic.Uint64

type stdRx struct {
	buf      []byte
	n        int
	src, dst netip.AddrPort
	tclass   uint8
}

const stdPool = 256

// listenStdUDP binds one socket per address to addr:port with DF set
// (IP_PMTUDISC_DO: IPv4 ID 0 on the wire, which the ICRC covers); IPv6 sockets accept a
// zero UDP checksum (udp.AcceptZeroChecksum6).
func listenStdUDP(addrs []netip.Addr, port uint16) (*stdUDP, error) {
	if len(addrs) == 0 {
		return nil, fmt.Errorf("%w: no addresses", ErrInvalidArg)
	}
	l := &stdUDP{rx: make(chan stdRx, stdPool), free: make(chan []byte, stdPool), closing: make(chan struct{})}
	for i := 0; i < stdPool; i++ {
		l.free <- make([]byte, link.MaxDatagram)
	}
	for _, a := range addrs {
		a = a.Unmap()
		c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, port)))
		if err != nil {
			l.closeConns()
			return nil, err
		}
		l.conns = append(l.conns, c)
		l.locals = append(l.locals, netip.AddrPortFrom(a, uint16(c.LocalAddr().(*net.UDPAddr).Port)))
		if rc, err := c.SyscallConn(); err == nil {
			rc.Control(func(fd uintptr) {
				if a.Is4() {
					unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
					unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVTOS, 1) // the ECN field
				} else {
					unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO)
					unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVTCLASS, 1)
					udp.AcceptZeroChecksum6(int(fd)) // kernel rxe's zero UDP checksums
				}
			})
		}
		_ = c.SetReadBuffer(4 << 20)
		_ = c.SetWriteBuffer(4 << 20)
	}
	for i := range l.conns {
		l.wg.Add(1)
		go l.reader(i)
	}
	return l, nil
}

func (l *stdUDP) closeConns() {
	for _, c := range l.conns {
		c.Close()
	}
}

func (l *stdUDP) reader(i int) {
	defer l.wg.Done()
	c, local := l.conns[i], l.locals[i]
	oob := make([]byte, 64)
	for {
		var buf []byte
		select {
		case buf = <-l.free:
		case <-l.closing:
			return
		}
		n, oobn, _, src, err := c.ReadMsgUDPAddrPort(buf, oob)
		wire.Load()
		if err != nil {
			l.free <- buf
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		// a link-local peer comes with our interface as its zone: the device compares GIDs
		src = netip.AddrPortFrom(src.Addr().Unmap().WithZone(""), src.Port())
		select {
		case l.rx <- stdRx{buf: buf, n: n, src: src, dst: local, tclass: udp.TClassOf(oob[:oobn])}:
		case <-l.closing:
			return
		}
	}
}

// Send writes each datagram from the socket bound to its Src address.
func (l *stdUDP) Send(batch []link.Datagram) error {
	var first error
	wire.Add(1)
	for i := range batch {
		d := &batch[i]
		c := l.conn(d.Src.Addr())
		if c == nil {
			return link.ErrNoLocalAddr
		}
		var err error
		if d.TClass != 0 {
			_, _, err = c.WriteMsgUDPAddrPort(d.Buf, tclassCmsg(d.TClass, !d.Dst.Addr().Unmap().Is4()), d.Dst)
		} else {
			_, err = c.WriteToUDPAddrPort(d.Buf, d.Dst)
		}
		if err != nil && first == nil {
			first = err
		}
	}
	return first
}

// tclassCmsg is the IP_TOS (IPv4) or IPV6_TCLASS (IPv6) ancillary data that sends a datagram
// with traffic class tc (link.Datagram.TClass; IBTA A17.4.5).
func tclassCmsg(tc uint8, dst6 bool) []byte {
	b := make([]byte, unix.CmsgSpace(4))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = unix.IPPROTO_IP, unix.IP_TOS
	if dst6 {
		h.Level, h.Type = unix.IPPROTO_IPV6, unix.IPV6_TCLASS
	}
	h.SetLen(unix.CmsgLen(4))
	*(*int32)(unsafe.Pointer(&b[unix.CmsgLen(0)])) = int32(tc)
	return b
}

func (l *stdUDP) conn(a netip.Addr) *net.UDPConn {
	a = a.Unmap().WithZone("")
	for i, lp := range l.locals {
		if lp.Addr().WithZone("") == a {
			return l.conns[i]
		}
	}
	return nil
}

// Recv waits for one datagram, then takes those already queued.
func (l *stdUDP) Recv(batch []link.Datagram) (int, error) {
	if len(batch) == 0 {
		return 0, nil
	}
	var r stdRx
	select {
	case r = <-l.rx:
	case <-l.closing:
		return 0, net.ErrClosed
	}
	n := 0
	for {
		d := &batch[n]
		d.Buf = d.Buf[:copy(d.Buf[:cap(d.Buf)], r.buf[:r.n])]
		d.Src, d.Dst, d.TClass, d.HasIPv4ID = r.src, r.dst, r.tclass, false
		l.free <- r.buf
		n++
		if n == len(batch) {
			return n, nil
		}
		select {
		case r = <-l.rx:
		default:
			return n, nil
		}
	}
}

// BatchSize is the preferred batch length.
func (l *stdUDP) BatchSize() int { return 32 }

// LocalAddrs lists the bound addresses.
func (l *stdUDP) LocalAddrs() []netip.Addr {
	out := make([]netip.Addr, len(l.locals))
	for i, lp := range l.locals {
		out[i] = lp.Addr()
	}
	return out
}

// SourcePort is the bound port (unconnected sockets send from it).
func (l *stdUDP) SourcePort(local netip.Addr, _ uint16) uint16 {
	local = local.Unmap().WithZone("")
	for _, lp := range l.locals {
		if lp.Addr().WithZone("") == local {
			return lp.Port()
		}
	}
	return 0
}

// Close closes the sockets and waits for the readers.
func (l *stdUDP) Close() error {
	l.once.Do(func() {
		close(l.closing)
		l.closeConns()
	})
	l.wg.Wait()
	return nil
}
