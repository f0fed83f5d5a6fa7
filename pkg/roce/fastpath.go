package roce

import (
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/roce/link"
)

// FastPathOptions select the data-path accelerations of a UDP device (docs/performance.md,
// "fast path"). The zero value enables them all.
//
//   - GSO: the engine groups each burst into link.RunRule runs and computes the ICRC of the k-th
//     packet of a run with IPv4 ID k (IBTA A17.3.3; the kernel numbers the segments of one GSO
//     send 0, 1, 2, ...); the link sends each run as one UDP_SEGMENT message and rewrites the
//     ICRC for ID 0 if it ever has to send a run plainly (link.RunSender).
//   - GRO: UDP_GRO on the sockets: a train of same-size datagrams is one read, split by the
//     segment size; the receive goroutine checks each packet's ICRC (solving the IPv4 ID) and
//     places its payload right after the read.
type FastPathOptions struct {
	// Disable turns every acceleration off: no GSO (not even for IPv6), no GRO.
	Disable bool
	// NoGSO keeps GSO off (link.GSOOff); NoGRO keeps GRO off.
	NoGSO, NoGRO bool
	// Workers is the number of receive workers (0 or 1: one). With n > 1 the device opens n
	// SO_REUSEPORT sockets per address (link.ListenUDPShards): the kernel steers each datagram
	// to worker DestQP mod n, which parses, checks and places it, and QP q sends through
	// socket q mod n, so n busy QPs use up to n cores.
	Workers int
	// Pin pins each receive worker to its own OS thread and CPU (Options.Pin).
	Pin bool
}

// apply sets the link options the fast path needs. An explicit Link.GSO other than GSOAuto is
// kept unless GSO is disabled.
func (f FastPathOptions) apply(o *link.UDPOptions) {
	if f.Disable || f.NoGSO {
		o.GSO = link.GSOOff
	}
	if !f.Disable && !f.NoGRO {
		o.GRO = true
	}
}

// rxState is one receive worker's scratch: the packet being handled and the pseudo-header CRC
// state of the last (endpoints, length) seen.
type rxState struct {
	pkt  bth.Packet
	icrc struct {
		ep    bth.Endpoints
		n     int
		state uint32
		ok    bool
	}
}

// pinWorker locks the calling goroutine to its OS thread (for good: the worker runs until the
// device closes) and pins the thread to CPU i mod the CPUs the process may use
// (sched_setaffinity). Failures leave the thread unpinned.
func pinWorker(i int) {
	runtime.LockOSThread()
	var allowed unix.CPUSet
	if unix.SchedGetaffinity(0, &allowed) != nil || allowed.Count() == 0 {
		return
	}
	k := i % allowed.Count()
	for cpu := 0; cpu < 1024; cpu++ {
		if allowed.IsSet(cpu) {
			if k == 0 {
				var one unix.CPUSet
				one.Set(cpu)
				_ = unix.SchedSetaffinity(0, &one)
				return
			}
			k--
		}
	}
}
