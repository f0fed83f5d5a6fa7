package udp

import (
	"net"

	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/internal/race"
)

var _ link.ViewReceiver = (*Link)(nil)

// RecvView implements link.ViewReceiver: on a one-address link with GRO, segments are returned as
// views of the GRO buffers; otherwise it is Recv.
func (l *Link) RecvView(batch []link.Datagram) (int, error) {
	if len(l.socks) != 1 || !l.socks[0].gro {
		return l.Recv(batch)
	}
	if l.closed.Load() {
		return 0, net.ErrClosed
	}
	defer race.Received()
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
func (s *udpSock) viewGRO(batch []link.Datagram) int {
	k := 0
	for k < len(batch) && s.gmi < s.gn {
		m := &s.gmsgs[s.gmi]
		total := int(m.len)
		seg, tc := s.groControl(s.gmi)
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
		batch[k].TClass = tc
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
