package afxdp

import (
	"net"
	"net/netip"
	"os"
	"sync/atomic"

	"github.com/softroce/softroce/pkg/link"
	"golang.org/x/sys/unix"
)

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
func (x *xdpSock) recv(batch []link.Datagram, copyOut bool) int {
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
		x.recvBatches.Add(1)
	}
	return k
}

// parse fills d from an Ethernet frame the program redirected (checked again: it is remote
// input); false drops it.
func (x *xdpSock) parse(d *link.Datagram, f []byte, copyOut bool) bool {
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
	// the UDP checksum, as the kernel's UDP receive would have checked it: 0 is none (RFC 768;
	// kernel rxe and this path send 0), a wrong one drops the datagram (docs/link.md)
	if (f[40] != 0 || f[41] != 0) && !udp4ChecksumOK(f[26:34], f[34:34+ul]) {
		x.csumErrors.Add(1)
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
	d.TClass = f[15] // the IPv4 TOS: its ECN field tells a CE-marked packet (IBTA A17.9.1)
	d.HasIPv4ID, d.IPv4ID = true, uint16(f[18])<<8|uint16(f[19])
	return true
}

// tryRecvXDP is one non-blocking read of a link with the AF_XDP path (rmu held): the ring;
// every xdpSocketEvery-th call, up to every xdpSocketMax-th while it finds nothing (every
// call with socket), the UDP socket first, so that what reaches the socket is read however
// busy the ring is.
func (l *Link) tryRecvXDP(batch []link.Datagram, copyOut, socket bool) (int, error) {
	x := l.x
	if x.polls++; socket || x.polls >= x.sockNext {
		n, err := l.u.TryRecv(batch)
		if n > 0 || err != nil {
			x.sockEvery = xdpSocketEvery
			x.sockNext = x.polls + x.sockEvery
			return n, err
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
func (l *Link) recvXDP(batch []link.Datagram) (int, error) {
	const copyOut = true
	l.rmu.Lock()
	defer l.rmu.Unlock()
	x := l.x
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
