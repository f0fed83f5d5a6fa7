package perf

// The bidirectional SEND test (-b with send: perftest_resources.c run_iter_bi): each side
// sends and receives on the same QPs at once. Its posting is run_iter_bw's (tx_depth in
// flight, every cq_mod-th signaled), its receives run_iter_bw_server's (one reposted per
// completion); the server posts nothing before its first receive, so that neither side sends
// before the other receives (on UC and UD a SEND without a receive is lost). The one-sided
// bidirectional tests need no loop of their own: both sides run bwClient.

import (
	"fmt"
	"runtime"
	"time"

	"github.com/softroce/softroce/internal/oob/perftest"
	"github.com/softroce/softroce/pkg/roce"
)

// bwBi is run_iter_bi for one message size; it fills tposted and tcompleted (the sends) and
// returns this side's report. In the duration mode the sample counts both the messages
// received and those sent, as perftest's does.
func (r *perfRes) bwBi(size int) (perftest.BWReport, error) {
	c := r.c
	r.setSendWQEs(size)
	r.t0 = time.Now()
	dm := c.Duration != 0
	r.dur, r.sampled = nil, 0
	tot := c.Iters * len(r.qps)
	if dm {
		tot = 0
	}
	sending := !r.server() // the server sends once it received
	if sending {
		r.dur = newPerfDuration(c) // the server's clock starts at its first receive
	}
	totS, totC, totR := 0, 0, 0
	idle := 0 // rounds without a completion: spin (--busy-poll), arm both CQs, sleep
	for totC < tot || totR < tot || (dm && (r.dur == nil || !r.dur.ended(time.Now()))) {
		if sending {
			if err := r.postSends(size, &totS); err != nil {
				return perftest.BWReport{}, err
			}
		}
		got := false
		if n := r.rcq.Poll(r.wcs); n > 0 {
			got = true
			now := time.Now()
			if !sending {
				sending = true
				r.dur = newPerfDuration(c)
			}
			if err := r.recvCompletions(n, size, now, &totR); err != nil {
				return perftest.BWReport{}, err
			}
		}
		if n := r.scq.Poll(r.wcs); n > 0 {
			got = true
			done, err := r.sendCompletions(n, tot, &totC)
			if err != nil {
				return perftest.BWReport{}, err
			}
			totC += done
		}
		if got {
			idle = 0
			continue
		}
		idle++
		armAt := 1
		if r.c.BusyPoll {
			armAt = perfSpinBW + 1
		}
		switch {
		case idle < armAt:
			runtime.Gosched()
		case idle == armAt:
			// armed now, so that a completion from here on wakes the sleep after the next
			// round's polls
			for _, q := range []roce.CompletionQueue{r.rcq, r.scq} {
				if err := q.ReqNotify(false); err != nil {
					return perftest.BWReport{}, fmt.Errorf("%w: Couldn't request CQ notification: %w", errPerfVerbs, err)
				}
			}
		default:
			if err := r.sleepEither(r.rcq, r.scq); err != nil {
				return perftest.BWReport{}, err
			}
			idle = 0
		}
	}
	return r.bwReport(size), nil
}

// sleepEither sleeps until a's or b's armed event (or, in the duration mode, the end of the
// measurement), for at most --run-timeout.
func (r *perfRes) sleepEither(a, b roce.CompletionQueue) error {
	deadline, end := r.deadline()
	left := time.Until(deadline)
	if left <= 0 {
		if end {
			return nil
		}
		return fmt.Errorf("%w: no completion within %v", errPerfTimeout, r.c.RunTimeout)
	}
	r.timer.Reset(left)
	r.sleeps++
	select {
	case <-a.Channel():
	case <-b.Channel():
	case <-r.timer.C:
		if !end {
			return fmt.Errorf("%w: no completion within %v", errPerfTimeout, r.c.RunTimeout)
		}
	}
	r.timer.Stop()
	return nil
}
