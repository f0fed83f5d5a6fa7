package link

import (
	"runtime"
	"time"
)

// Busy polling (UDPOptions.BusyPoll): the receive side of a latency mode, the idea of Linux's
// SO_BUSY_POLL in user space. A plain Recv parks its goroutine in the runtime's network poller
// when the socket is empty; the datagram then arrives through epoll, a futex wake of an idle
// thread and a context switch in each process on the path. perftest polls its completion queue
// instead, and kernel rxe runs in softirq context, so neither sleeps between packets. With
// BusyPoll the receiving goroutine retries the non-blocking recvmmsg (yielding its processor to
// the other goroutines between attempts, so GOMAXPROCS=1 works) for up to BusyPoll and parks
// only then; the next Recv polls again. It burns a CPU while idle for at most BusyPoll.
// docs/performance.md "rxe lab" measures why: in a TCG guest one wakeup costs ~100 us.

// busyCheckEvery is how many empty attempts pass between two clock reads of the budget.
const busyCheckEvery = 64

// setBusyPoll selects the busy-polling receive functions (at ListenUDP, before any Recv).
func (s *udpSock) setBusyPoll(d time.Duration) {
	if d <= 0 {
		return
	}
	s.busy = d
	s.recvFn = s.busyRecv
	if s.gro {
		s.groFn = s.busyGRORecv
	}
}

// busyRecv is doRecv with busy polling; it runs inside RawConn.Read (false = park).
func (s *udpSock) busyRecv(fd uintptr) bool {
	var start time.Time
	for i := 0; ; i++ {
		s.rn = s.recvmmsg(fd, s.rmsgs[:s.rcount])
		if !s.again || !s.keepPolling(i, &start) {
			return !s.again
		}
	}
}

// busyGRORecv is doGRORecv with busy polling.
func (s *udpSock) busyGRORecv(fd uintptr) bool {
	var start time.Time
	for i := 0; ; i++ {
		s.gn = s.recvmmsg(fd, s.gmsgs)
		if !s.again || !s.keepPolling(i, &start) {
			return !s.again
		}
	}
}

// keepPolling decides after the i-th empty attempt whether to try again (after yielding the
// processor) or to park: the budget ran out, or the link is closing (Close waits for the read
// to return).
func (s *udpSock) keepPolling(i int, start *time.Time) bool {
	if s.l.closed.Load() {
		return false
	}
	if i%busyCheckEvery == 0 {
		now := time.Now()
		if i == 0 {
			*start = now
		} else if now.Sub(*start) >= s.busy {
			s.l.busyParks.Add(1)
			return false
		}
	}
	runtime.Gosched()
	return true
}

// BusyPollParks returns how many busy polls ran out of their budget and parked in the
// network poller (UDPOptions.BusyPoll).
func (l *UDPLink) BusyPollParks() uint64 { return l.busyParks.Load() }
