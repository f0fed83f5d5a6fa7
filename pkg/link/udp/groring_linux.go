package udp

import (
	"unsafe"

	"github.com/softroce/softroce/pkg/link"
	"golang.org/x/sys/unix"
)

// The GRO receive ring: groSlots private 64 KiB buffers, each holding one message a GRO read
// returned (one datagram, or several of one flow coalesced by the kernel, with their segment
// size). A read fills the free slots only, so a receive can top the ring up while it still
// holds messages: what waits moves out of the socket's queue, where it is strictly first come
// first served, into the ring, where the order it is handed out in is chosen.
//
// The order: oldest message first, except that a message of one datagram whose flow (source
// address and port; RoCEv2 keeps a QP's source port fixed, IBTA A17.2.3) has nothing older in
// the ring is handed out ahead of the others, up to half of each batch. That is the sparse
// flow first rule of fq_codel (RFC 8290 section 1.3): a ping-pong's request, an ACK or a CNP
// does not wait behind another flow's backlog of 64 KiB messages, a flow's own datagrams never
// pass each other (a bulk flow's lone datagram with older messages queued is not eligible),
// and the oldest message keeps at least half of every batch, however many sparse flows arrive.
//
// A slot is free, queued (segments left to hand out), or lent: all handed out, its views
// still in the caller's hands until the next receive call, which frees it.
const groSlots = 32

const (
	slotFree uint8 = iota
	slotQueued
	slotLent
)

// groSlot is one slot's message: length, segment size, traffic class and handed-out offset.
type groSlot struct {
	len, seg, off int
	tc            uint8
	state         uint8
}

// groInit allocates the ring.
func (s *udpSock) groInit() {
	s.gbufs = make([][]byte, groSlots)
	s.giov = make([]unix.Iovec, groSlots)
	for i := range s.gbufs {
		s.gbufs[i] = make([]byte, link.MaxDatagram)
		s.giov[i].Base = &s.gbufs[i][0]
		s.giov[i].SetLen(link.MaxDatagram)
	}
	s.gsa = make([]unix.RawSockaddrInet6, groSlots)
	s.gctl = make([]byte, groSlots*groCtlSpace)
	s.gslot = make([]groSlot, groSlots)
	s.gq = make([]uint8, 0, groSlots)
	s.gscr = make([]mmsghdr, groSlots)
	s.gscrSlot = make([]uint8, groSlots)
	s.groFn = s.doGRORecv
	s.gtryFn = s.tryGRORecv
}

// groRelease frees the slots lent by the last receive call: the caller is done with their views.
func (s *udpSock) groRelease() {
	for i := range s.gslot {
		if s.gslot[i].state == slotLent {
			s.gslot[i].state = slotFree
			s.gclean = false
		}
	}
}

// groPrep points the read's messages at the free slots (once per change of the free set: an
// empty read leaves them as they were, so a polling loop prepares them once per datagram
// received, not once per attempt) and returns how many there are.
func (s *udpSock) groPrep() int {
	s.rerr, s.again, s.gn = nil, false, 0
	if s.gclean {
		return s.gscrN
	}
	space := groCtlSpace
	n := 0
	for i := range s.gslot {
		if s.gslot[i].state != slotFree {
			continue
		}
		h := &s.gscr[n].hdr
		h.Name = (*byte)(unsafe.Pointer(&s.gsa[i]))
		h.Namelen = unix.SizeofSockaddrInet6
		h.Iov = &s.giov[i]
		h.SetIovlen(1)
		h.Control = &s.gctl[i*space]
		h.SetControllen(space)
		h.Flags = 0
		s.gscr[n].len = 0
		s.gscrSlot[n] = uint8(i)
		n++
	}
	s.gscrN, s.gclean = n, true
	return n
}

// doGRORecv runs inside RawConn.Read; false = wait readable.
func (s *udpSock) doGRORecv(fd uintptr) bool {
	s.gn = s.recvmmsg(fd, s.gscr[:s.gscrN])
	return !s.again
}

// tryGRORecv runs inside RawConn.Control: one attempt.
func (s *udpSock) tryGRORecv(fd uintptr) { s.gn = s.recvmmsg(fd, s.gscr[:s.gscrN]) }

// groAccept queues the messages the last read returned, in arrival order.
func (s *udpSock) groAccept() {
	for j := 0; j < s.gn; j++ {
		i := int(s.gscrSlot[j])
		m := &s.gscr[j]
		n := min(int(m.hdr.Controllen), groCtlSpace)
		seg, tc := parseControl(s.gctl[i*groCtlSpace : i*groCtlSpace+n])
		total := int(m.len)
		if seg <= 0 || seg > total {
			seg = total
		}
		s.gslot[i] = groSlot{len: total, seg: seg, tc: tc, state: slotQueued}
		s.gq = append(s.gq, uint8(i))
	}
	s.gn = 0
}

// groPending reports queued segments not yet handed out.
func (s *udpSock) groPending() bool { return len(s.gq) > 0 }

// groTopUp tries once, without waiting, to read into the free slots while segments are queued.
// Its errors are left to the next read that has to wait (it meets them again).
func (s *udpSock) groTopUp() {
	if s.groPrep() == 0 {
		return
	}
	if err := s.rc.Control(s.gtryFn); err == nil && s.rerr == nil {
		s.groAccept()
	}
	s.rerr, s.again, s.gn = nil, false, 0
}

// groRecv readies the ring for a receive call that may wait: the last call's slots are freed;
// with nothing queued it waits for a read, else it tops the ring up. An error is the read's.
func (s *udpSock) groRecv() (int, error) {
	s.groRelease()
	if s.groPending() {
		s.groTopUp()
		return 0, nil
	}
	s.groPrep()
	if err := s.rc.Read(s.groFn); err != nil || s.rerr != nil {
		return 0, err
	}
	s.groAccept()
	return 0, nil
}

// groTry is groRecv for a receive call that never waits; an empty socket is s.again.
func (s *udpSock) groTry() error {
	s.groRelease()
	if s.groPending() {
		s.groTopUp()
		return nil
	}
	s.groPrep()
	if err := s.rc.Control(s.gtryFn); err != nil || s.rerr != nil || s.again {
		return err
	}
	s.groAccept()
	return nil
}

// groPick returns the position in the queue of the message to hand out next: a sparse flow's
// datagram while prio lasts, else the oldest.
func (s *udpSock) groPick(prio bool) int {
	if !prio {
		return 0
	}
next:
	for qi := 1; qi < len(s.gq); qi++ {
		sl := &s.gslot[s.gq[qi]]
		if sl.seg < sl.len { // several datagrams: a flow with a backlog
			continue
		}
		sa := &s.gsa[s.gq[qi]]
		for _, older := range s.gq[:qi] {
			if sameFlow(&s.gsa[older], sa) {
				continue next
			}
		}
		return qi
	}
	return 0
}

// sameFlow reports whether two peers' socket addresses are the same address and port.
func sameFlow(a, b *unix.RawSockaddrInet6) bool {
	if a.Family != b.Family || a.Port != b.Port {
		return false
	}
	if a.Family == unix.AF_INET {
		return (*unix.RawSockaddrInet4)(unsafe.Pointer(a)).Addr == (*unix.RawSockaddrInet4)(unsafe.Pointer(b)).Addr
	}
	return a.Addr == b.Addr && a.Scope_id == b.Scope_id
}

// groHandOut fills batch with queued segments in groPick's order: views of the ring's buffers
// (valid until the next receive call), or copies into the caller's buffers (copied). Returns
// how many.
func (s *udpSock) groHandOut(batch []link.Datagram, copied bool) int {
	k, trunc, prio := 0, 0, len(batch)/2
	for k < len(batch) && len(s.gq) > 0 {
		qi := s.groPick(prio > 0)
		if qi > 0 {
			prio--
		}
		i := int(s.gq[qi])
		sl := &s.gslot[i]
		for k < len(batch) {
			if sl.off == 0 && sl.seg < sl.len {
				s.l.groReceives.Add(1)
			}
			end := min(sl.off+sl.seg, sl.len)
			d := &batch[k]
			if copied {
				b := d.Buf[:cap(d.Buf)]
				c := copy(b, s.gbufs[i][sl.off:end])
				if c < end-sl.off {
					trunc++
				}
				d.Buf = b[:c]
			} else {
				d.Buf = s.gbufs[i][sl.off:end:end]
			}
			d.Src = getSockaddr(&s.gsa[i])
			d.Dst = s.local
			d.TClass = sl.tc
			d.HasIPv4ID = false
			k++
			sl.off = end
			if sl.off >= sl.len {
				sl.state = slotLent
				s.gq = append(s.gq[:qi], s.gq[qi+1:]...)
				break
			}
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
