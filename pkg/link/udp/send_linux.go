package udp

import (
	"fmt"
	"net"
	"net/netip"
	"unsafe"

	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/internal/race"
	"golang.org/x/sys/unix"
)

// Send transmits the batch in order with sendmmsg, one call per run of datagrams from the same
// local address (more if a run exceeds BatchSize). Invalid input (zero source port, foreign or
// wrong-family addresses, oversized payload) fails the whole batch before anything is sent.
// Datagrams the kernel refuses (ENOBUFS, EMSGSIZE, unreachable...) are dropped and counted in
// Stats.Drops, as a lossy network would; Send then still returns nil.
func (l *Link) Send(batch []link.Datagram) error {
	if l.closed.Load() {
		return net.ErrClosed
	}
	race.Sent()
	for i := range batch {
		d := &batch[i]
		if !d.Src.IsValid() || d.Src.Port() == 0 || !d.Dst.IsValid() || d.Dst.Port() == 0 {
			return fmt.Errorf("send %v -> %v: %w", d.Src, d.Dst, link.ErrInvalidAddr)
		}
		s := l.sock(d.Src.Addr())
		if s == nil {
			return fmt.Errorf("send from %v: %w", d.Src.Addr(), link.ErrNoLocalAddr)
		}
		if dst := d.Dst.Addr().Unmap(); dst.Is6() != s.v6 {
			return fmt.Errorf("send %v -> %v: address families differ: %w", d.Src, d.Dst, link.ErrInvalidAddr)
		}
		if len(d.Buf) > link.MaxDatagram {
			return fmt.Errorf("send %d bytes: %w", len(d.Buf), link.ErrTooLarge)
		}
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
func (s *udpSock) send(run []link.Datagram, e *entSock) error {
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
func (s *udpSock) fill(run []link.Datagram, gso bool) int {
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
