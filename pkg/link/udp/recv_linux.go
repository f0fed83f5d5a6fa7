package udp

import (
	"fmt"
	"net"
	"unsafe"

	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/internal/race"
	"golang.org/x/sys/unix"
)

// prepRecv points the receive iovecs at the caller's buffers.
func (s *udpSock) prepRecv(batch []link.Datagram) {
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
		h.Control = &s.rctl[i*recvCtlSpace]
		h.SetControllen(recvCtlSpace)
		h.Flags = 0
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
			if r > 0 && s.gro && &msgs[0] == &s.gscr[0] {
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

// The receive control buffers: IP_RECVTOS / IPV6_RECVTCLASS deliver each datagram's IPv4 TOS
// (one byte) or IPv6 Traffic Class (an int) as a control message, which carries the ECN field a
// switch marks CE (IBTA A17.9.1, RFC 3168); a GRO message has its UDP_GRO segment size too (the
// kernel coalesces only datagrams whose IP headers agree on the TOS, inet_gro_receive and
// ipv6_gro_receive, so the class holds for every segment).
var (
	recvCtlSpace = unix.CmsgSpace(4)
	groCtlSpace  = unix.CmsgSpace(4) + unix.CmsgSpace(4)
)

// recvTClass returns the traffic class in plain message i's control data (0 if none).
func (s *udpSock) recvTClass(i int) uint8 {
	n := min(int(s.rmsgs[i].hdr.Controllen), recvCtlSpace)
	_, tc := parseControl(s.rctl[i*recvCtlSpace : i*recvCtlSpace+n])
	return tc
}

// TClassOf returns the IPv4 TOS / IPv6 Traffic Class in the control data a socket with
// IP_RECVTOS / IPV6_RECVTCLASS received with a datagram (0 if none): for readers of plain
// sockets (roce's portable link).
func TClassOf(oob []byte) uint8 {
	if len(oob) == 0 {
		return 0
	}
	// align like the kernel-written buffer (cmsghdr needs 8-byte alignment)
	var buf [64]uint64
	b := unsafe.Slice((*byte)(unsafe.Pointer(&buf[0])), len(buf)*8)
	_, tc := parseControl(b[:copy(b, oob)])
	return tc
}

// parseControl walks control messages (kernel-written, but checked like remote input: never
// reads outside ctl) and returns the UDP_GRO segment size and the IPv4 TOS / IPv6 Traffic Class,
// each 0 if absent or malformed.
func parseControl(ctl []byte) (seg int, tclass uint8) {
	hdr := unix.SizeofCmsghdr
	for len(ctl) >= hdr {
		c := (*unix.Cmsghdr)(unsafe.Pointer(&ctl[0]))
		cl := uint64(c.Len) // uint32 or uint64 by architecture
		if cl < uint64(hdr) || cl > uint64(len(ctl)) {
			return seg, tclass
		}
		data := ctl[unix.CmsgLen(0):cl]
		switch {
		case c.Level == unix.SOL_UDP && c.Type == unix.UDP_GRO:
			switch {
			case len(data) >= 4:
				seg = int(*(*int32)(unsafe.Pointer(&data[0])))
			case len(data) >= 2:
				seg = int(*(*uint16)(unsafe.Pointer(&data[0])))
			}
		case c.Level == unix.IPPROTO_IP && c.Type == unix.IP_TOS && len(data) >= 1:
			tclass = data[0]
		case c.Level == unix.IPPROTO_IPV6 && c.Type == unix.IPV6_TCLASS && len(data) >= 4:
			tclass = uint8(*(*int32)(unsafe.Pointer(&data[0])))
		}
		next := unix.CmsgSpace(len(data))
		if next > len(ctl) {
			return seg, tclass
		}
		ctl = ctl[next:]
	}
	return seg, tclass
}

// finishRecv fills batch from the received messages and drops buffer references.
func (s *udpSock) finishRecv(batch []link.Datagram) int {
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
		batch[i].TClass = s.recvTClass(i)
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
func (l *Link) Recv(batch []link.Datagram) (int, error) {
	if l.closed.Load() {
		return 0, net.ErrClosed
	}
	defer race.Received()
	if len(batch) == 0 {
		return 0, nil
	}
	if len(l.socks) == 1 {
		s := l.socks[0]
		l.rmu.Lock()
		defer l.rmu.Unlock()
		for {
			var n int
			if s.gro {
				if n, err := s.groRecv(); err != nil || s.rerr != nil {
					return l.recvResult(s, n, err)
				}
				n = s.groHandOut(batch, true)
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
				s.groRelease()
				if !s.groPending() {
					s.groPrep()
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
					s.groAccept()
				}
				l.next = (l.next + k + 1) % len(l.socks)
				return s.groHandOut(batch, true), nil
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

func (l *Link) recvResult(s *udpSock, n int, err error) (int, error) {
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
