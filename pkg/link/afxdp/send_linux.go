package afxdp

import (
	"encoding/binary"
	"fmt"
	"net"
	"runtime"
	"sync/atomic"

	"github.com/softroce/softroce/pkg/link"
	"golang.org/x/sys/unix"
)

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
func (x *xdpSock) queue(d *link.Datagram) bool {
	n := ethIPv4UDP + len(d.Buf)
	dst := d.Dst.Addr().Unmap()
	if n > MaxFrame || n-14 > x.mtu || !dst.Is4() || d.Src.Addr().Unmap() != x.addr {
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
	x.sendBatches.Add(1)
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
func (l *Link) sendXDP(batch []link.Datagram) error {
	x := l.x
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
func (l *Link) sendXDPPair(batch []link.Datagram) error {
	x := l.x
	x.txmu.Lock()
	defer x.txmu.Unlock()
	if x.umem == nil {
		return net.ErrClosed
	}
	if x.sendPair(batch) {
		return nil
	}
	if !batch[1].Src.Addr().Unmap().Is6() {
		link.RewriteICRC(&batch[1], batch[1].Src.Port())
	}
	return l.sendXDPLocked(batch)
}

// sendXDPLocked is sendXDP with txmu held and the rings open.
func (l *Link) sendXDPLocked(batch []link.Datagram) error {
	x := l.x
	for i := range batch {
		d := &batch[i]
		if x.queue(d) {
			continue
		}
		if err := x.kick(); err != nil {
			return err
		}
		x.fallbacks.Add(1)
		if err := l.u.Send(batch[i : i+1]); err != nil {
			return err
		}
	}
	return x.kick()
}
