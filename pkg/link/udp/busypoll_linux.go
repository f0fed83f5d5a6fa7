package udp

import (
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// Busy polling (Options.BusyPoll): the receive side of a latency mode, the idea of Linux's
// SO_BUSY_POLL in user space. A plain Recv parks its goroutine in the runtime's network poller
// when the socket is empty; the datagram then arrives through epoll, a futex wake of an idle
// thread and a context switch in each process on the path. perftest polls its completion queue
// instead, and kernel rxe runs in softirq context, so neither sleeps between packets. With
// BusyPoll the receiving goroutine retries the non-blocking recvmmsg (yielding its processor to
// the other goroutines between attempts, so GOMAXPROCS=1 works) for up to BusyPoll and parks
// only then; the next Recv polls again. It burns a CPU while idle for at most BusyPoll.
// docs/lab.md "What the guest costs" measures why: in a TCG guest one wakeup costs ~100 us.

// busyCheckEvery is how many empty attempts pass between two clock reads of the budget.
const busyCheckEvery = 64

// setBusyPoll selects the busy-polling receive functions (at Listen, before any Recv).
func (s *udpSock) setBusyPoll(d time.Duration) {
	if d <= 0 {
		return
	}
	s.busy = d
	s.raw = true
	s.recvFn = s.busyRecv
	if s.gro {
		s.groFn = s.busyGRORecv
	}
}

// sys6 makes the socket's sendmmsg/recvmmsg system calls (on a non-blocking socket: they
// never block). By default (Options.SchedSyscalls off) and always with busy polling they are
// raw system calls, invisible to the scheduler: a
// system call the runtime knows of and that lasts longer than one sysmon tick (20 us, and in
// the TCG lab guest a sendmmsg takes 100-500 us) gets its P retaken and handed to another
// thread, which with GOMAXPROCS=1 happens even when there is nothing else to run
// (handoffp starts a spinning M); the calling thread then finds its P gone and sleeps, and
// the goroutine continues on a thread that first has to be scheduled — a futex wake and a
// context switch per packet, milliseconds when the guest's CPUs are busy polling. A raw
// system call keeps the P, as a busy poll means to.
func (s *udpSock) sys6(trap, a1, a2, a3 uintptr) (r1, r2 uintptr, err unix.Errno) {
	if s.raw {
		return unix.RawSyscall6(trap, a1, a2, a3, 0, 0, 0)
	}
	return unix.Syscall6(trap, a1, a2, a3, 0, 0, 0)
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
		s.gn = s.recvmmsg(fd, s.gscr[:s.gscrN])
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
// network poller (Options.BusyPoll).
func (l *Link) BusyPollParks() uint64 { return l.busyParks.Load() }
