package perf

import (
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/roce"
)

// softroce perf --lat --busy-poll: run to completion in the measuring goroutine, perftest's
// own model (one thread polls everything and never sleeps) and the nearest a user-space
// stack gets to kernel rxe doing its work in the sender's softirq. The embedded device is
// opened in polled mode (roce.UDPOptions.Polled): it starts no receive goroutine, and the
// latency loops (waitByte, wait) call Device.Poll — one non-blocking recvmmsg, the packets
// checked and placed on this goroutine — between their looks at the buffer or the CQ, with
// no yield, sleep or clock read in between (the deadline is checked every perfPollCheck
// empty polls). The ACK of the peer's WRITE that a Poll produced waits for our next
// PostSend, so it and our next WRITE leave in one sendmmsg (docs/api.md "Polled mode").
//
// Outside the measured loops (the out-of-band exchanges, the closing handshake, the tail
// after ib_write_lat's last WRITE) a background goroutine keeps polling with short sleeps,
// so the peer's last ACKs, retransmissions and the device's CM traffic are still answered.

const (
	// perfPollCheck is how many empty polls pass between two looks at the clock (run
	// timeout) and at the QP's state.
	perfPollCheck = 4096
	// perfIdlePoll is the background poller's sleep between polls that found nothing.
	perfIdlePoll = 200 * time.Microsecond
)

// polled reports whether this run uses the device's polled mode: latency tests with
// --busy-poll on an embedded batched-socket device, with the TCP exchange (-R's rdma_cm
// exchange and --daemon keep a receive goroutine; --portable sockets cannot be polled).
func (c *perfConfig) polled() bool {
	return c.BusyPoll && c.Lat && c.Daemon == "" && !c.Portable && !c.RDMACM && !c.Loopback
}

// perfPoller drives a polled device: the measuring loops call poll directly; between them a
// background goroutine polls (pause/resume hand the device over).
type perfPoller struct {
	dev *roce.Device
	mu  sync.Mutex // held by the background goroutine while it polls, and during a measurement
	// stop ends the background goroutine; done is closed when it has.
	stop, done chan struct{}
}

// newPerfPoller starts the background poller on dev (in polled mode).
func newPerfPoller(dev *roce.Device) *perfPoller {
	p := &perfPoller{dev: dev, stop: make(chan struct{}), done: make(chan struct{})}
	go p.background()
	return p
}

func (p *perfPoller) background() {
	defer close(p.done)
	t := time.NewTimer(perfIdlePoll)
	defer t.Stop()
	for {
		p.mu.Lock()
		n, err := p.dev.Poll()
		p.mu.Unlock()
		if err != nil {
			return // closed
		}
		if n > 0 {
			continue
		}
		t.Reset(perfIdlePoll)
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
	}
}

// pause stops the background polling for a measurement (the caller then polls itself).
func (p *perfPoller) pause() { p.mu.Lock() }

// resume hands polling back to the background goroutine.
func (p *perfPoller) resume() { p.mu.Unlock() }

// close stops the background goroutine (before the device closes).
func (p *perfPoller) close() {
	close(p.stop)
	<-p.done
}

// pollOnce is one Device.Poll of the measuring goroutine.
func (r *perfRes) pollOnce() error {
	n, err := r.poller.dev.Poll()
	if err != nil {
		return fmt.Errorf("%w: polling the device: %w", errPerfVerbs, err)
	}
	if n == 0 && r.phases != nil {
		r.phases.emptyPolls++
	}
	return nil
}

// waitBytePolled is waitByte in polled mode: look at the QP's WRITE count, else poll the
// device, never sleeping.
func (r *perfRes) waitBytePolled(q perfRemoteWrites, off int, v byte) error {
	var deadline time.Time
	for i := 1; ; i++ {
		if w := q.RemoteWrites(); w != r.writesSeen {
			r.writesSeen = w
			if r.buf[off] == v {
				return nil
			}
			continue
		}
		if err := r.pollOnce(); err != nil {
			return err
		}
		if i%perfPollCheck == 0 {
			if r.dur != nil && r.dur.ended(time.Now()) {
				return nil
			}
			if q.State() == qp.StateErr {
				return fmt.Errorf("%w: QP %#x entered the error state while waiting for the peer's WRITE", errPerfVerbs, q.Num())
			}
			if err := r.pollDeadline(&deadline, "no WRITE from the peer"); err != nil {
				return err
			}
		}
	}
}

// waitPolled is wait in polled mode: poll the CQ, else the device, never sleeping.
func (r *perfRes) waitPolled(c roce.CompletionQueue) (int, error) {
	var deadline time.Time
	for i := 1; ; i++ {
		if n := c.Poll(r.wcs); n > 0 {
			r.polls++
			return n, nil
		}
		if err := r.pollOnce(); err != nil {
			return 0, err
		}
		if i%perfPollCheck == 0 {
			if r.dur != nil && r.dur.ended(time.Now()) {
				return 0, nil
			}
			if err := r.pollDeadline(&deadline, "no completion"); err != nil {
				return 0, err
			}
		}
	}
}

// pollDeadline starts the --run-timeout clock at the first check and fails once it ran out.
func (r *perfRes) pollDeadline(deadline *time.Time, what string) error {
	now := time.Now()
	if deadline.IsZero() {
		*deadline = now.Add(r.c.RunTimeout)
		return nil
	}
	if now.After(*deadline) {
		return fmt.Errorf("%w: %s within %v", errPerfTimeout, what, r.c.RunTimeout)
	}
	return nil
}

// measure runs one measured loop: in polled mode with the background poller paused.
func (r *perfRes) measure(f func(size int) error, size int) error {
	if r.poller != nil {
		r.poller.pause()
		defer r.poller.resume()
	}
	return f(size)
}

// perfPhases are the time stamps of each write-latency iteration in polled mode (--stats):
// posted[i] when PostSend of WRITE i returned (the request built and handed to sendmmsg, which
// on a veth or loopback path also runs the peer's UDP receive), acked[i] when its completion
// was polled (the peer's ACK arrived, with the peer's next WRITE); tposted[i] is when the post
// began. emptyPolls counts Device.Poll calls that read nothing.
type perfPhases struct {
	posted, acked []time.Duration
	emptyPolls    int64
}

func newPerfPhases(iters int) *perfPhases {
	return &perfPhases{posted: make([]time.Duration, iters), acked: make([]time.Duration, iters)}
}

// printPhases writes the medians of the iteration's steps (--stats, polled write latency).
func (r *perfRes) printPhases(w io.Writer) {
	p := r.phases
	if p == nil {
		return
	}
	n := r.c.Iters
	med := func(f func(i int) time.Duration, k int) float64 {
		v := make([]time.Duration, 0, k)
		for i := 0; i < k; i++ {
			v = append(v, f(i))
		}
		if len(v) == 0 {
			return 0
		}
		slices.Sort(v)
		return float64(v[len(v)/2].Nanoseconds()) / 1e3
	}
	post := med(func(i int) time.Duration { return p.posted[i] - r.tposted[i] }, n)
	ack := med(func(i int) time.Duration { return p.acked[i] - p.posted[i] }, n)
	next := med(func(i int) time.Duration { return r.tposted[i+1] - p.acked[i] }, n-1)
	fmt.Fprintf(w, "stats: polled write latency, median us: post (build + sendmmsg) %.2f, post to completion %.2f, completion to next post %.2f; empty polls %.1f per iteration\n",
		post, ack, next, float64(p.emptyPolls)/float64(max(n, 1)))
}
