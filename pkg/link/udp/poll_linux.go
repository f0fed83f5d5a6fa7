package udp

import (
	"net"
	"sync"

	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/internal/race"
)

var _ link.PollReceiver = (*Link)(nil)

// TryRecv implements link.PollReceiver: one non-blocking recvmmsg per socket (the first that has
// datagrams wins; sockets are tried round-robin), made through RawConn.Control, so the calling
// goroutine never parks in the network poller. With GRO, segments are views of the link's GRO
// buffers (as RecvView), valid until the next receive call. The system calls are raw unless
// Options.SchedSyscalls is set (busypoll_linux.go explains why).
func (l *Link) TryRecv(batch []link.Datagram) (int, error) {
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
	race.Received()
	return n, err
}

var _ link.LockedPollReceiver = (*Link)(nil)

// RecvMutex implements link.LockedPollReceiver: the lock of the link's receive side.
func (l *Link) RecvMutex() *sync.Mutex { return &l.rmu }

// TryRecvLocked implements link.LockedPollReceiver: TryRecv for a caller holding RecvMutex.
func (l *Link) TryRecvLocked(batch []link.Datagram) (int, error) {
	if l.closed.Load() {
		return 0, net.ErrClosed
	}
	if len(batch) == 0 {
		return 0, nil
	}
	n, err := l.tryRecvLocked(batch)
	race.Received()
	return n, err
}

// tryRecvLocked is TryRecv's read (rmu held).
func (l *Link) tryRecvLocked(batch []link.Datagram) (int, error) {
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
func (s *udpSock) tryRecvOnce(batch []link.Datagram) (int, error) {
	if s.gro {
		if err := s.groTry(); err != nil || s.rerr != nil || s.again {
			return 0, err
		}
		return s.groHandOut(batch, false), nil
	}
	s.prepRecv(batch)
	err := s.rc.Control(s.tryFn)
	return s.finishRecv(batch), err
}
