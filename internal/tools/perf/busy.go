package perf

import (
	"time"
)

// perfBusyPoll is how long, with --busy-poll, the device's receive loop polls its empty socket
// before it parks in the network poller (udp.Options.BusyPoll). perftest and kernel rxe
// never sleep between the packets of a latency test; a softroce receive loop that parks pays
// an epoll wakeup, a futex and a context switch per packet in each process instead, which on
// an idle host costs a few microseconds and in the TCG lab guest ~100 us (docs/performance.md
// "rxe lab"). Longer than any gap inside a run; short enough that an idle process stops
// burning its CPU soon.
const perfBusyPoll = 200 * time.Millisecond

// linkBusyPoll is the device's receive busy-poll budget for this run: perfBusyPoll with
// --busy-poll on the batched link, else 0 (the receive loop sleeps when the socket is empty).
func (c *perfConfig) linkBusyPoll() time.Duration {
	if c.BusyPoll && !c.Portable {
		return perfBusyPoll
	}
	return 0
}
