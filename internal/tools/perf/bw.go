package perf

import (
	"fmt"
	"math"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/oob/perftest"
	"github.com/softroce/softroce/internal/qp"
)

// bwClient is run_iter_bw for one message size; it fills tposted and tcompleted.
func (r *perfRes) bwClient(size int) error {
	c := r.c
	r.setSendWQEs(size)
	inc := perfInc(size)
	slots := r.slots(size)
	cyc := r.cycles(size)
	tot := c.Iters * len(r.qps)
	totS, totC := 0, 0
	r.t0 = time.Now()
	for totS < tot || totC < tot {
		for i, q := range r.qps {
			for r.scnt[i] < c.Iters && r.scnt[i]-r.ccnt[i]+1 <= c.TxDepth {
				k := r.scnt[i]
				w := &r.wr[i]
				if c.CQMod == 1 || k%c.CQMod == c.CQMod-1 || k == c.Iters-1 {
					w.Flags = qp.SendSignaled
				} else {
					w.Flags = 0
				}
				if cyc { // increase_loc_addr / increase_rem_addr
					off := uint64((k % slots) * inc)
					r.sge[i].Addr = r.sendIOVA(i) + off
					if c.Verb != "send" {
						w.RemoteAddr = r.rem[i].VAddr + off
					}
				}
				r.tposted[totS] = r.since()
				if _, err := q.PostSend(r.wr[i : i+1]); err != nil {
					return fmt.Errorf("%w: Couldn't post send: qp %d scnt=%d: %w", errPerfVerbs, i, k, err)
				}
				r.scnt[i]++
				totS++
			}
		}
		if totC >= tot {
			continue
		}
		n := r.scq.Poll(r.wcs)
		if n == 0 {
			var err error
			if n, err = r.wait(r.scq, perfSpinBW); err != nil {
				return err
			}
		}
		now := r.since()
		r.polls++
		for j := 0; j < n; j++ {
			w := &r.wcs[j]
			if w.Status != cq.StatusSuccess {
				return r.wcErr(w, false)
			}
			qi := int(w.WRID)
			if qi < 0 || qi >= len(r.qps) {
				return fmt.Errorf("%w: completion for unknown wr_id %d", errPerfVerbs, w.WRID)
			}
			// A signaled WR completes the messages since the previous one: cq_mod of
			// them, or fewer for the last WR when -n is not a multiple of cq_mod
			// (counting a full cq_mod there made totC reach tot while another QP
			// still had messages to post, and the loop stopped polling and spun).
			done := min(c.CQMod, c.Iters-r.ccnt[qi])
			r.ccnt[qi] += done
			totC += done
			r.tcompleted[min(totC, tot)-1] = now
		}
	}
	return nil
}

// bwReport is print_report_bw for the client's run of size bytes.
func (r *perfRes) bwReport(size int) perftest.BWReport {
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

// bwServerSend is run_iter_bw_server: count receive completions, repost, time the run.
func (r *perfRes) bwServerSend(size int) (perftest.BWReport, error) {
	c := r.c
	tot := c.Iters * len(r.qps)
	rcnt := 0
	var first, last time.Time
	for rcnt < tot {
		n, err := r.wait(r.rcq, perfSpinBW)
		if err != nil {
			return perftest.BWReport{}, err
		}
		if rcnt == 0 {
			first = time.Now()
		}
		for j := 0; j < n; j++ {
			w := &r.wcs[j]
			if w.Status != cq.StatusSuccess {
				return perftest.BWReport{}, r.wcErr(w, true)
			}
			qi := int(w.WRID)
			if qi < 0 || qi >= len(r.qps) {
				return perftest.BWReport{}, fmt.Errorf("%w: receive completion for unknown wr_id %d", errPerfVerbs, w.WRID)
			}
			rcnt++
			if r.rpost[qi]+1 <= c.Iters {
				if err := r.postRecv(qi, size); err != nil {
					return perftest.BWReport{}, err
				}
			}
		}
	}
	last = time.Now()
	return perftest.NewBWReport(uint64(size), uint64(tot), last.Sub(first), 0, c.Gbits), nil
}
