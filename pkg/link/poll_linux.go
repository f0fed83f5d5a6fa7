package link

import (
	"net"
	"sync"
)

var _ PollReceiver = (*UDPLink)(nil)

// TryRecv implements PollReceiver: one non-blocking recvmmsg per socket (the first that has
// datagrams wins; sockets are tried round-robin), made through RawConn.Control, so the calling
// goroutine never parks in the network poller. With GRO, segments are views of the link's GRO
// buffers (as RecvView), valid until the next receive call. The system calls are raw unless
// UDPOptions.SchedSyscalls is set (busypoll_linux.go explains why).
func (l *UDPLink) TryRecv(batch []Datagram) (int, error) {
	if l.closed.Load() {
		return 0, net.ErrClosed
	}
	if len(batch) == 0 {
		return 0, nil
	}
	// no defers: a polling loop calls this millions of times a second (roce's
	// BenchmarkPollEmpty); nothing under rmu panics
	l.rmu.Lock()
	n, err := l.tryRecvLocked(batch)
	l.rmu.Unlock()
	raceReceived()
	return n, err
}

var _ LockedPollReceiver = (*UDPLink)(nil)

// RecvMutex implements LockedPollReceiver: the lock of the link's receive side (Close takes
// it before it unmaps the AF_XDP rings).
func (l *UDPLink) RecvMutex() *sync.Mutex { return &l.rmu }

// TryRecvLocked implements LockedPollReceiver: TryRecv for a caller holding RecvMutex.
func (l *UDPLink) TryRecvLocked(batch []Datagram) (int, error) {
	if l.closed.Load() {
		return 0, net.ErrClosed
	}
	if len(batch) == 0 {
		return 0, nil
	}
	n, err := l.tryRecvLocked(batch)
	raceReceived()
	return n, err
}

// tryRecvLocked is TryRecv's read (rmu held).
func (l *UDPLink) tryRecvLocked(batch []Datagram) (int, error) {
	if l.xdp != nil {
		if l.closed.Load() {
			return 0, net.ErrClosed
		}
		return l.tryRecvXDP(batch, false, false)
	}
	for k := range l.socks {
		s := l.socks[(l.next+k)%len(l.socks)]
		n, err := s.tryRecvOnce(batch)
		if err != nil || s.rerr != nil {
			return l.recvResult(s, n, err)
		}
		if n > 0 {
			l.next = (l.next + k + 1) % len(l.socks)
			return n, nil
		}
	}
	return 0, nil
}

// tryRecvOnce is one non-blocking attempt on s (held GRO segments first).
func (s *udpSock) tryRecvOnce(batch []Datagram) (int, error) {
	if s.gro {
		if !s.groPending() {
			// an empty read (EAGAIN) leaves the message headers untouched: a polling loop
			// prepares them once per datagram received, not once per attempt
			if !s.gclean {
				s.prepGRO()
			}
			if err := s.rc.Control(s.gtryFn); err != nil || s.rerr != nil || s.again {
				return 0, err
			}
		}
		return s.viewGRO(batch), nil
	}
	s.prepRecv(batch)
	err := s.rc.Control(s.tryFn)
	return s.finishRecv(batch), err
}
