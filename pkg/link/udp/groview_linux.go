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
		if n, err := s.groRecv(); err != nil || s.rerr != nil {
			return l.recvResult(s, n, err)
		}
		if n := s.groHandOut(batch, false); n > 0 {
			return n, nil
		}
	}
}
