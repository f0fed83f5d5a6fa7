package perf

import (
	"fmt"
	"runtime"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/oob/perftest"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/roce"
)

// latWrite is run_iter_lat_write (QP 0): the server writes first. In the duration mode both
// sides run until their measurement ends, counting the completions of the sample.
func (r *perfRes) latWrite(size int) error {
	c := r.c
	r.setSendWQEs(size)
	r.wr[0].Flags = qp.SendSignaled
	postOff := r.sendOff(0) + size - 1
	pollOff := r.recvOff(0) + size - 1
	q := r.qps[0]
	scnt, ccnt, rcnt := 0, 0, 0
	r.t0 = time.Now()
	r.dur, r.sampled = newPerfDuration(c), 0
	dm, iters := r.dur != nil, c.Iters
	if dm {
		iters = 0
	}
	for scnt < iters || ccnt < iters || rcnt < iters || (dm && !r.dur.ended(time.Now())) {
		if (dm || rcnt < iters) && !(scnt < 1 && r.server()) {
			rcnt++
			if err := r.waitByte(q, pollOff, byte(rcnt)); err != nil {
				return err
			}
			if dm && r.dur.ended(time.Now()) {
				break
			}
		}
		if dm || scnt < iters {
			if !dm {
				r.tposted[scnt] = r.since()
			}
			scnt++
			r.buf[postOff] = byte(scnt)
			if _, err := q.PostSend(r.wr[:1]); err != nil {
				return fmt.Errorf("%w: Couldn't post send: scnt=%d: %w", errPerfVerbs, scnt, err)
			}
			if r.phases != nil && scnt <= len(r.phases.posted) {
				r.phases.posted[scnt-1] = r.since()
			}
		}
		if dm || ccnt < iters {
			n, err := r.wait(r.scq, perfSpinLat)
			if err != nil {
				return err
			}
			for j := 0; j < n; j++ {
				if r.wcs[j].Status != cq.StatusSuccess {
					return r.wcErr(&r.wcs[j], false)
				}
			}
			if r.phases != nil && ccnt < len(r.phases.acked) {
				r.phases.acked[ccnt] = r.since()
			}
			ccnt += n
			if dm && r.dur.sampling(time.Now()) {
				r.sampled += n
			}
		}
	}
	return nil
}

// waitByte waits until buf[off] == v. RDMA WRITE makes no completion at the target, so
// like perftest we poll the byte; we look at it only when the QP's count of executed WRITE
// messages moved (qp.RemoteWrites: its atomic load orders our read after the placement, and
// the peer's next WRITE only follows our own next one, so nothing writes the byte while we
// read it). Between looks we sleep on qp.RemoteWriteNotify (--busy-poll: yield first).
func (r *perfRes) waitByte(q roce.QueuePair, off int, v byte) error {
	rw, ok := q.(perfRemoteWrites)
	if !ok { // through the daemon: no count of the QP's WRITEs (verbs.go)
		return r.pollByte(q, off, v)
	}
	if r.poller != nil {
		return r.waitBytePolled(rw, off, v)
	}
	notify := rw.RemoteWriteNotify()
	deadline, end := r.deadline()
	for i := 0; ; i++ {
		if w := rw.RemoteWrites(); w != r.writesSeen {
			r.writesSeen = w
			if r.buf[off] == v {
				return nil
			}
			continue
		}
		if r.c.BusyPoll && i < perfSpinLat {
			runtime.Gosched()
			continue
		}
		if q.State() == qp.StateErr {
			return fmt.Errorf("%w: QP %#x entered the error state while waiting for the peer's WRITE", errPerfVerbs, q.Num())
		}
		left := time.Until(deadline)
		if left <= 0 {
			if end { // in the duration mode: the measurement ended
				return nil
			}
			return fmt.Errorf("%w: no WRITE from the peer within %v", errPerfTimeout, r.c.RunTimeout)
		}
		// wake at least every 100 ms to notice a QP in error (the peer gave up)
		r.timer.Reset(min(left, 100*time.Millisecond))
		select {
		case <-notify:
		case <-r.timer.C:
		}
		r.timer.Stop()
	}
}

// latSend is run_iter_lat_send (QP 0): the client sends first. In the duration mode the
// receives of the sample are counted.
func (r *perfRes) latSend(size int) error {
	c := r.c
	r.setSendWQEs(size)
	q := r.qps[0]
	scnt, rcnt := 0, 0
	r.t0 = time.Now()
	r.dur, r.sampled = newPerfDuration(c), 0
	dm, iters := r.dur != nil, c.Iters
	if dm {
		iters = 0
	}
	for scnt < iters || rcnt < iters || (dm && !r.dur.ended(time.Now())) {
		if (dm || rcnt < iters) && !(scnt < 1 && !r.server()) {
			n, err := r.waitOne(r.rcq, true)
			if err != nil {
				return err
			}
			if n == 0 { // the measurement ended
				break
			}
			rcnt += n
			if dm && r.dur.sampling(time.Now()) {
				r.sampled += n
			}
			if dm || rcnt+c.RxDepth <= iters {
				if err := r.postRecv(0, size); err != nil {
					return err
				}
			}
		}
		if dm || scnt < iters {
			if !dm {
				r.tposted[scnt] = r.since()
			}
			scnt++
			poll := scnt%c.CQMod == 0 || (!dm && scnt == iters)
			r.wr[0].Flags = 0
			if poll {
				r.wr[0].Flags = qp.SendSignaled
			}
			if _, err := q.PostSend(r.wr[:1]); err != nil {
				return fmt.Errorf("%w: Couldn't post send: scnt=%d: %w", errPerfVerbs, scnt, err)
			}
			if poll {
				if n, err := r.waitOne(r.scq, false); err != nil {
					return err
				} else if n == 0 {
					break
				}
			}
		}
	}
	return nil
}

// waitOne waits for one completion (ibv_poll_cq(cq, 1, &wc) in a loop) and checks it; 0 when
// a duration-mode measurement ended first.
func (r *perfRes) waitOne(c roce.CompletionQueue, recv bool) (int, error) {
	wcs := r.wcs
	r.wcs = r.wcs[:1]
	n, err := r.wait(c, perfSpinLat)
	r.wcs = wcs
	if err != nil || n == 0 {
		return 0, err
	}
	if r.wcs[0].Status != cq.StatusSuccess {
		return 0, r.wcErr(&r.wcs[0], recv)
	}
	return n, nil
}

// latReadAtomic is run_iter_lat (client, QP 0): one READ or atomic at a time.
func (r *perfRes) latReadAtomic(size int) error {
	c := r.c
	r.setSendWQEs(size)
	q := r.qps[0]
	r.t0 = time.Now()
	r.dur, r.sampled = newPerfDuration(c), 0
	for scnt := 0; scnt < c.Iters || (r.dur != nil && !r.dur.ended(time.Now())); scnt++ {
		if r.dur == nil {
			r.tposted[scnt] = r.since()
		}
		if _, err := q.PostSend(r.wr[:1]); err != nil {
			return fmt.Errorf("%w: Couldn't post send: scnt=%d: %w", errPerfVerbs, scnt, err)
		}
		n, err := r.waitOne(r.scq, false)
		if err != nil {
			return err
		}
		if r.dur != nil && r.dur.sampling(time.Now()) {
			r.sampled += n
		}
	}
	return nil
}

// latLine is this run's result line: print_report_lat over tposted, or in the duration mode
// print_report_lat_duration over the sample (write and send latency are half a round trip).
func (r *perfRes) latLine(size int) (string, error) {
	half := r.c.Verb == "write" || r.c.Verb == "send"
	if r.dur != nil {
		return perftest.FormatLatDur(uint64(size), uint64(r.sampled), r.dur.window(), half), nil
	}
	rep, err := r.latReport(size)
	if err != nil {
		return "", err
	}
	return perftest.FormatLat(rep), nil
}

// latReport is print_report_lat over tposted.
func (r *perfRes) latReport(size int) (perftest.LatReport, error) {
	n := r.c.Iters
	samples := make([]time.Duration, n-1)
	for i := range samples {
		samples[i] = r.tposted[i+1] - r.tposted[i]
	}
	half := r.c.Verb == "write" || r.c.Verb == "send"
	return perftest.NewLatReport(uint64(size), uint64(n), samples, half)
}
