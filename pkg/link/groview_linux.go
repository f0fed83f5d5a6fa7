package link

import "net"

// ViewReceiver is implemented by links that can hand out received datagrams without copying
// them: RecvView is Recv, except that batch[i].Buf may point into the link's own receive memory
// (a GRO buffer) instead of the caller's buffer, valid only until the next Recv or RecvView call.
// The device's receive loop checks and places every packet before reading again, so a GRO
// segment is copied once, from the socket buffer's copy straight into the memory region.
type ViewReceiver interface {
	RecvView(batch []Datagram) (int, error)
}

var _ ViewReceiver = (*UDPLink)(nil)

// RecvView implements ViewReceiver: on a one-address link with GRO, segments are returned as
// views of the GRO buffers; otherwise it is Recv.
func (l *UDPLink) RecvView(batch []Datagram) (int, error) {
	if len(l.socks) != 1 || !l.socks[0].gro {
		return l.Recv(batch)
	}
	if l.closed.Load() {
		return 0, net.ErrClosed
	}
	defer raceReceived()
	if len(batch) == 0 {
		return 0, nil
	}
	s := l.socks[0]
	l.rmu.Lock()
	defer l.rmu.Unlock()
	for {
		if !s.groPending() {
			s.prepGRO()
			if err := s.rc.Read(s.groFn); err != nil || s.rerr != nil {
				return l.recvResult(s, 0, err)
			}
		}
		if n := s.viewGRO(batch); n > 0 {
			return n, nil
		}
	}
}

// viewGRO is drainGRO without the copy: batch[k].Buf is a view of the held segment.
func (s *udpSock) viewGRO(batch []Datagram) int {
	k := 0
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
		batch[k].Buf = s.gbufs[s.gmi][s.goff:end:end]
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
	return k
}
