package perf

import (
	"fmt"
	"math"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/oob/perftest"
	"github.com/softroce/softroce/internal/qp"
)

// bwClient is run_iter_bw for one message size: up to tx_depth WRs in flight per QP, every
// cq_mod-th signaled. With -n it fills tposted and tcompleted; in the duration mode (-D) it
// posts until the measurement ends and counts the completions of the sample.
func (r *perfRes) bwClient(size int) error {
	c := r.c
	r.setSendWQEs(size)
	r.t0 = time.Now()
	r.dur, r.sampled = newPerfDuration(c), 0
	tot := c.Iters * len(r.qps)
	if r.dur != nil {
		tot = 0
	}
	totS, totC := 0, 0
	for totS < tot || totC < tot || (r.dur != nil && !r.dur.ended(time.Now())) {
		if err := r.postSends(size, &totS); err != nil {
			return err
		}
		if totC >= totS && r.dur == nil {
			continue
		}
		n := r.scq.Poll(r.wcs)
		if n == 0 {
			var err error
			if n, err = r.wait(r.scq, perfSpinBW); err != nil {
				return err
			}
		}
		done, err := r.sendCompletions(n, tot, &totC)
		if err != nil {
			return err
		}
		totC += done
	}
	return nil
}

// postSends posts, on every QP, the WRs its send queue has room for (scnt - ccnt below
// tx_depth; with -n at most -n), each cq_mod-th and the last signaled, addresses advancing in
// the cycle buffer (increase_loc_addr / increase_rem_addr); *totS counts them.
func (r *perfRes) postSends(size int, totS *int) error {
	c := r.c
	inc := perfInc(size)
	slots := r.slots(size)
	cyc := r.cycles(size)
	for i, q := range r.qps {
		for (c.Duration != 0 || r.scnt[i] < c.Iters) && r.scnt[i]-r.ccnt[i]+1 <= c.TxDepth {
			k := r.scnt[i]
			w := &r.wr[i]
			if c.CQMod == 1 || k%c.CQMod == c.CQMod-1 || (c.Duration == 0 && k == c.Iters-1) {
				w.Flags = qp.SendSignaled
			} else {
				w.Flags = 0
			}
			if cyc {
				off := uint64((k % slots) * inc)
				r.sge[i].Addr = r.sendIOVA(i) + off
				if c.Verb != "send" {
					w.RemoteAddr = r.rem[i].VAddr + off
				}
			}
			if c.Duration == 0 {
				r.tposted[*totS] = r.since()
			}
			if _, err := q.PostSend(r.wr[i : i+1]); err != nil {
				return fmt.Errorf("%w: Couldn't post send: qp %d scnt=%d: %w", errPerfVerbs, i, k, err)
			}
			r.scnt[i]++
			*totS++
		}
	}
	return nil
}

// sendCompletions accounts for the n send completions in r.wcs: a signaled WR completes the
// messages since the previous one, cq_mod of them, or (with -n) fewer for the last WR when
// -n is not a multiple of cq_mod (counting a full cq_mod there made the total reach its end
// while another QP still had messages to post, and the loop stopped polling and spun). With
// -n it stamps tcompleted (tot messages in all, *totC so far); in the duration mode it
// counts the sample. It returns how many messages completed.
func (r *perfRes) sendCompletions(n, tot int, totC *int) (int, error) {
	c := r.c
	now := time.Now()
	since := now.Sub(r.t0)
	if n > 0 {
		r.polls++
	}
	all := 0
	for j := 0; j < n; j++ {
		w := &r.wcs[j]
		if w.Status != cq.StatusSuccess {
			return 0, r.wcErr(w, false)
		}
		qi := int(w.WRID)
		if qi < 0 || qi >= len(r.qps) {
			return 0, fmt.Errorf("%w: completion for unknown wr_id %d", errPerfVerbs, w.WRID)
		}
		done := c.CQMod
		if c.Duration == 0 {
			done = min(c.CQMod, c.Iters-r.ccnt[qi])
		}
		r.ccnt[qi] += done
		all += done
		switch {
		case c.Duration == 0:
			r.tcompleted[min(*totC+all, tot)-1] = since
		case r.dur != nil && r.dur.sampling(now):
			r.sampled += done
		}
	}
	return all, nil
}

// bwReport is print_report_bw for this side's run of size bytes: from the first post to the
// last completion with -n (and the peak, unless -N), over the sample in the duration mode.
func (r *perfRes) bwReport(size int) perftest.BWReport {
	if r.c.Duration != 0 && r.dur != nil {
		return perftest.NewBWReport(uint64(size), uint64(r.sampled), r.dur.window(), 0, r.c.Gbits)
	}
	tot := r.c.Iters * len(r.qps)
	total := r.tcompleted[tot-1] - r.tposted[0]
	var best time.Duration
	if !r.c.NoPeak {
		best = perfPeak(r.tposted[:tot], r.tcompleted[:tot], r.c.CQMod)
	}
	return perftest.NewBWReport(uint64(size), uint64(tot), total, best, r.c.Gbits)
}

// perfPeak is print_report_bw's peak search: the smallest (tcompleted[j]-tposted[i])/(j-i+1)
// (truncated, as perftest's integer cycles) over i <= j where j is a completion that was
// signaled (every cq_mod-th and the last). perftest tries every pair, O(n^2/cq_mod): 0.5 s
// for 20000 messages here. The same minimum comes from a binary search on its value d:
// some pair has (C[j]-P[i])/(j-i+1) <= d iff C[j]-P[i] < (d+1)(j-i+1), i.e.
// C[j]-(d+1)j < max over i <= j of (P[i]-(d+1)i) + (d+1): one pass per step, O(n log T).
func perfPeak(posted, completed []time.Duration, cqMod int) time.Duration {
	n := len(posted)
	signaled := func(j int) bool { return j%cqMod == cqMod-1 || j == n-1 }
	feasible := func(d int64) bool {
		k := d + 1
		best := int64(math.MinInt64)
		for j := 0; j < n; j++ {
			if v := int64(posted[j]) - k*int64(j); v > best {
				best = v
			}
			if signaled(j) && int64(completed[j])-k*int64(j) < best+k {
				return true
			}
		}
		return false
	}
	lo, hi := int64(0), max(int64(completed[n-1]-posted[0]), 0) // feasible(hi) holds (i=0, j=n-1)
	for lo < hi {
		mid := lo + (hi-lo)/2
		if feasible(mid) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return time.Duration(lo)
}

// bwServerSend is run_iter_bw_server: count receive completions, repost, time the run from
// the first receive to the last; in the duration mode the clock starts at the first receive
// (set_on_first_rx_packet) and the sample is counted.
func (r *perfRes) bwServerSend(size int) (perftest.BWReport, error) {
	c := r.c
	dm := c.Duration != 0
	tot := c.Iters * len(r.qps)
	if dm {
		tot = 0
	}
	rcnt := 0
	var first, last time.Time
	r.dur, r.sampled = nil, 0 // the clock starts at the first receive: until then --run-timeout bounds the wait
	for rcnt < tot || (dm && (r.dur == nil || !r.dur.ended(time.Now()))) {
		n, err := r.wait(r.rcq, perfSpinBW)
		if err != nil {
			return perftest.BWReport{}, err
		}
		now := time.Now()
		if n > 0 && first.IsZero() {
			first = now
			r.dur = newPerfDuration(c)
		}
		if err := r.recvCompletions(n, size, now, &rcnt); err != nil {
			return perftest.BWReport{}, err
		}
	}
	last = time.Now()
	if dm {
		return perftest.NewBWReport(uint64(size), uint64(r.sampled), r.dur.window(), 0, c.Gbits), nil
	}
	return perftest.NewBWReport(uint64(size), uint64(tot), last.Sub(first), 0, c.Gbits), nil
}

// recvCompletions accounts for the n receive completions in r.wcs (polled at now): each
// counts one message; its receive is posted again while fewer than -n were posted (always in
// the duration mode, where those of the sample are counted).
func (r *perfRes) recvCompletions(n, size int, now time.Time, rcnt *int) error {
	for j := 0; j < n; j++ {
		w := &r.wcs[j]
		if w.Status != cq.StatusSuccess {
			return r.wcErr(w, true)
		}
		qi := int(w.WRID)
		if qi < 0 || qi >= len(r.qps) {
			return fmt.Errorf("%w: receive completion for unknown wr_id %d", errPerfVerbs, w.WRID)
		}
		*rcnt++
		if r.dur != nil && r.dur.sampling(now) {
			r.sampled++
		}
		if r.c.Duration != 0 || r.rpost[qi]+1 <= r.c.Iters {
			if err := r.postRecv(qi, size); err != nil {
				return err
			}
		}
	}
	return nil
}
