package udp

import (
	"fmt"
	"net"
	"net/netip"
	"unsafe"

	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/internal/race"
)

var (
	_ link.RunSender  = (*Link)(nil)
	_ link.PairSender = (*Link)(nil)
)

// RunGSO reports whether SendRuns from local sends runs as GSO messages: GSOAuto and GSOOn
// sockets (IPv4 and IPv6) until the kernel refused UDP_SEGMENT; never with GSOOff, nor with a
// BatchSize below link.MaxRunSegments (a run must fit one sendmmsg call).
func (l *Link) RunGSO(local netip.Addr) bool {
	s := l.sock(local)
	return s != nil && s.runGSO.Load()
}

// PairGSO implements link.PairSender: a UDP socket sends a pair as a GSO message when it
// sends runs so (RunGSO).
func (l *Link) PairGSO(local netip.Addr) bool { return l.RunGSO(local) }

// SendRuns implements link.RunSender: each run of two or more datagrams is one sendmmsg message with a
// UDP_SEGMENT cmsg (segment k = datagram k, IPv4 ID k on the wire); runs of one, and every run
// once GSO is off, go one datagram per message with the ICRC of datagrams k > 0 rewritten for
// IPv4 ID 0. Errors and drops as Send.
func (l *Link) SendRuns(batch []link.Datagram, runs []uint8) error {
	if l.closed.Load() {
		return net.ErrClosed
	}
	race.Sent()
	if err := l.validate(batch); err != nil {
		return err
	}
	if !link.ValidRuns(batch, runs) {
		return link.ErrInvalidRun
	}
	for _, c := range runs {
		if int(c) > l.batch { // a run must fit one sendmmsg call (fillRuns)
			return link.ErrInvalidRun
		}
	}
	i, r := 0, 0
	for i < len(batch) {
		// A run has one Src (link.RunRule), so one sending socket: split between runs whose
		// address or entropy socket differ.
		s := l.sock(batch[i].Src.Addr())
		e := s.sender(batch[i].Src.Port())
		j, rj := i, r
		for rj < len(runs) && l.sock(batch[j].Src.Addr()) == s && s.sender(batch[j].Src.Port()) == e {
			j += int(runs[rj])
			rj++
		}
		if err := s.sendRuns(batch[i:j], runs[r:rj], e); err != nil {
			return err
		}
		i, r = j, rj
	}
	return nil
}

// validate applies Send's checks to a whole batch.
func (l *Link) validate(batch []link.Datagram) error {
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
	return nil
}

// sendRuns transmits runs that all leave from s's address through socket e.
func (s *udpSock) sendRuns(batch []link.Datagram, runs []uint8, e *entSock) error {
	s.smu.Lock()
	defer s.smu.Unlock()
	plainRuns := 0 // the first plainRuns runs go one datagram per message (a refused GSO message)
	for len(runs) > 0 {
		used, usedRuns := s.fillRuns(batch, runs, plainRuns, e.port)
		plainRuns = 0
		done, refused, err := s.flush(e)
		if err != nil {
			return err
		}
		if refused {
			// As send: the refused run is resent plain (fillRuns rewrites its ICRCs for ID 0).
			plainRuns = 1
			used, usedRuns = done, 0
			for c := 0; c < done; usedRuns++ {
				c += int(runs[usedRuns])
			}
		}
		batch, runs = batch[used:], runs[usedRuns:]
	}
	return nil
}

// fillRuns builds messages from whole runs at the head of batch and returns the datagrams and
// runs they hold. A run goes as one GSO message when GSO is on and it is not among the first
// plain runs; otherwise one message per datagram, with ICRCs rewritten for ID 0 and sport, the
// source port of the socket they leave from.
func (s *udpSock) fillRuns(batch []link.Datagram, runs []uint8, plain int, sport uint16) (int, int) {
	m, d, r := 0, 0, 0
	gso := s.runGSO.Load()
	for r < len(runs) {
		c := int(runs[r])
		asGSO := c > 1 && gso && r >= plain
		need := c
		if asGSO {
			need = 1
		}
		if m+need > len(s.smsgs) || d+c > len(s.siov) {
			break
		}
		for k := d; k < d+c; k++ {
			iov := &s.siov[k]
			if b := batch[k].Buf; len(b) > 0 {
				iov.Base = &b[0]
			} else {
				iov.Base = nil
			}
			iov.SetLen(len(batch[k].Buf))
		}
		if asGSO {
			s.msg(m, &batch[d], d, c, len(batch[d].Buf))
			m++
		} else {
			for k := 0; k < c; k++ {
				if k > 0 && !s.v6 {
					link.RewriteICRC(&batch[d+k], sport)
				}
				s.msg(m, &batch[d+k], d+k, 1, 0)
				m++
			}
		}
		d += c
		r++
	}
	s.scount = m
	return d, r
}

// msg fills message m: iovecs [iov, iov+n) to dg.Dst, with a UDP_SEGMENT cmsg of seg if n > 1,
// and dg's traffic class (a run's datagrams share one IP header: the engine starts a new run
// when the class changes).
func (s *udpSock) msg(m int, dg *link.Datagram, iov, n, seg int) {
	h := &s.smsgs[m].hdr
	h.Name = (*byte)(unsafe.Pointer(&s.ssa[m]))
	h.Namelen = putSockaddr(&s.ssa[m], dg.Dst, s.v6)
	h.Iov = &s.siov[iov]
	h.SetIovlen(n)
	h.Flags = 0
	if n <= 1 {
		seg = 0
	}
	putControl(h, s.scmsg, m, seg, dg.TClass, !dg.Dst.Addr().Unmap().Is4())
	s.smsgs[m].len = 0
}
