package perf

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/spf13/pflag"

	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/roce"
)

// softroce perf --daemon SOCKET: the perftest tools through the softroce daemon. perfRes and
// the -R exchange are written on roce.Verbs (embedded: Device.Verbs(); daemon:
// client.Dial), so the measurement loops are the same code in both modes. What differs:
//
//   - write latency (run_iter_lat_write) waits for the peer's WRITE by watching the last byte
//     of its receive area, as perftest does. Embedded, the engine's per-QP count of executed
//     WRITEs (roce.QP.RemoteWrites) says when to look and its notify channel lets the waiter
//     sleep; through the daemon the WRITE lands in shared memory with no such signal (RDMA
//     WRITE without immediate makes no completion at the target, IBTA 9.4.3), so pollByte
//     polls the byte: yielding for perfPollSpin, then sleeping with a growing back-off (at
//     most perfPollMaxSleep), which adds up to that much to a sample once it sleeps;
//   - --stats prints the daemon device's counters (all its clients together), no link
//     counters;
//   - the RoCE socket is the daemon's: --roce-port, --portable, --loopback and --mem are
//     refused with --daemon, and --busy-poll spins on the CQ only (the daemon's receive loop
//     is configured by the daemon).

// perfRemoteWrites is what waitByte uses of an embedded QP (*roce.QP): the count of WRITE
// messages the responder executed and a channel signaled when it moves.
type perfRemoteWrites interface {
	roce.QueuePair
	RemoteWrites() uint64
	RemoteWriteNotify() <-chan struct{}
}

var _ perfRemoteWrites = (*roce.QP)(nil)

const (
	// perfPollSpin is how long pollByte polls (yielding) before it starts sleeping: longer
	// than a round trip through the daemon, as perftest spins through the whole test.
	perfPollSpin = 100 * time.Microsecond
	// perfPollMinSleep and perfPollMaxSleep bound pollByte's back-off between looks.
	perfPollMinSleep = 10 * time.Microsecond
	perfPollMaxSleep = 100 * time.Microsecond
	// perfPollStateEvery is how often pollByte asks for the QP's state (a round trip to
	// the daemon) to notice a QP in error.
	perfPollStateEvery = 100 * time.Millisecond
)

// perfCheckDaemon refuses the options that name the RoCE socket or the in-process device when
// --daemon gives the device.
func perfCheckDaemon(c *perfConfig, fs *pflag.FlagSet) error {
	if c.Daemon == "" {
		return nil
	}
	var bad []string
	fs.Visit(func(f *pflag.Flag) {
		switch f.Name {
		case "roce-port", "portable", "loopback", "mem":
			bad = append(bad, "--"+f.Name)
		}
	})
	if len(bad) > 0 {
		return fmt.Errorf("%w: %v with --daemon: the daemon owns the RoCE socket and the device", errPerfUsage, bad)
	}
	return nil
}

// pollByte waits until buf[off] == v by reading the byte (an atomic load of its aligned
// word: another process writes it) until it matches, for at most --run-timeout.
func (r *perfRes) pollByte(q roce.QueuePair, off int, v byte) error {
	base := off &^ 3
	if off < 0 || base+4 > len(r.buf) || uintptr(unsafe.Pointer(&r.buf[base]))&3 != 0 {
		return fmt.Errorf("%w: byte %d of a %d-byte buffer cannot be polled", errPerfVerbs, off, len(r.buf))
	}
	word := (*uint32)(unsafe.Pointer(&r.buf[base]))
	look := func() bool {
		w := atomic.LoadUint32(word)
		return (*[4]byte)(unsafe.Pointer(&w))[off-base] == v
	}
	start := time.Now()
	deadline, end := r.deadline()
	nextState, spinUntil := start.Add(perfPollStateEvery), start.Add(perfPollSpin)
	sleep := perfPollMinSleep
	for i := 0; ; i++ {
		if look() {
			return nil
		}
		if i&63 != 0 || time.Now().Before(spinUntil) {
			runtime.Gosched()
			continue
		}
		now := time.Now()
		if now.After(nextState) {
			nextState = now.Add(perfPollStateEvery)
			if q.State() == qp.StateErr {
				return fmt.Errorf("%w: QP %#x entered the error state while waiting for the peer's WRITE", errPerfVerbs, q.Num())
			}
		}
		if now.After(deadline) {
			if look() || end { // in the duration mode: the measurement ended
				return nil
			}
			return fmt.Errorf("%w: no WRITE from the peer within %v", errPerfTimeout, r.c.RunTimeout)
		}
		r.sleeps++
		time.Sleep(sleep)
		sleep = min(2*sleep, perfPollMaxSleep)
	}
}
