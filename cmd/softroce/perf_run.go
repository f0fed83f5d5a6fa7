package main

// The perftest-compatible run of softroce perf: resources (perftest_resources.c ctx_init,
// create_mr, ctx_modify_qp_to_*), the out-of-band exchange (internal/oob/perftest) and the
// message flows of perftest 6.06:
//
//   - BW client (run_iter_bw): up to tx_depth WRs in flight per QP, every cq_mod-th WR (and
//     the last) signaled, each signaled completion counting cq_mod messages; local and remote
//     addresses advance by the message size rounded up to the cache line within the cycle
//     buffer (increase_loc_addr / increase_rem_addr) when the size fits twice in it.
//   - write/read/atomic BW server: nothing during the run (the target of one-sided
//     operations, IBTA 9.4.3-9.4.5); it prints the client's report (xchg_bw_reports).
//   - send BW server (run_iter_bw_server): rx_depth receives posted before the last sync,
//     one reposted per completion until iters were posted; its bandwidth runs from the first
//     receive completion to the last, without a peak.
//   - write latency (run_iter_lat_write): ping-pong of RDMA WRITEs; the SERVER writes
//     first; each side waits until the last byte of its receive area holds the iteration
//     number (mod 256) that the peer's WRITE carries, then writes its own.
//   - send latency (run_iter_lat_send): ping-pong of SENDs; the CLIENT sends first.
//   - read/atomic latency (run_iter_lat): the client issues one READ or atomic at a time; the
//     server only answers.
//
// Latency samples are the times between consecutive posts (tposted[i+1]-tposted[i]); write and
// send latency report half of them (print_report_lat).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sort"
	"strconv"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/oob"
	"github.com/softroce/softroce/internal/oob/perftest"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/internal/tools/cli"
	"github.com/softroce/softroce/pkg/roce"
)

// perfEnv is where a run writes, plus test seams.
type perfEnv struct {
	Stdout, Stderr io.Writer
	// Listener, if set, is used by the server instead of listening on -p.
	Listener net.Listener
	// SetProcs applies --procs (perfProcs): the command does, tests that run perfMain in their
	// own process leave GOMAXPROCS alone.
	SetProcs bool
}

const (
	// perfIOVA is where the buffer is registered (perftest uses the buffer's virtual address;
	// any page-aligned value will do for the peer).
	perfIOVA = 0x7f5a00000000
	// perfCycleBuffer is our cycle buffer (the page size, check_sys_data) and perfCacheLine
	// our cache line (DEF_CACHE_LINE_SIZE).
	perfCycleBuffer = 4096
	perfCacheLine   = 64
	// perfMinRNRTimer and perfQPTimeout are perftest's MIN_RNR_TIMER and DEF_QP_TIME; retry
	// counts are DEF_RETRY_COUNT (7) and rnr_retry 7 (IBTA 9.7.5.2.8: infinite).
	perfMinRNRTimer = 12
	perfQPTimeout   = 14
	perfRetryCount  = 7
	perfPollBatch   = 16 // CTX_POLL_BATCH
	// perfSpinBW and perfSpinLat are how many yields a --busy-poll waiter polls before it
	// sleeps on the CQ channel. perftest always spins; on a shared 2-core machine a spinning
	// waiter starves the device goroutines of both processes (8-byte SEND latency: 247 us
	// typical spinning, 43 us sleeping), so by default a waiter sleeps at once.
	perfSpinBW  = 16
	perfSpinLat = 4000
)

// perfInc is perftest's INC(size, cache_line): the size rounded up to the cache line.
func perfInc(size int) int {
	if size <= perfCacheLine {
		return perfCacheLine
	}
	return (size + perfCacheLine - 1) / perfCacheLine * perfCacheLine
}

// perfDM is a device with device memory (roce.Device.AllocDM through the embedded verbs).
type perfDM interface {
	AllocDM(n int) ([]byte, error)
	FreeDM(b []byte) error
}

// allocBuffer is the run's buffer: device memory with --dm, else dev.AllocBuffer.
func (r *perfRes) allocBuffer(n int) ([]byte, error) {
	if !r.c.DM {
		return r.dev.AllocBuffer(n)
	}
	d, ok := r.dev.(perfDM)
	if !ok {
		return nil, fmt.Errorf("%w: --dm: the device has no device memory", errPerfUsage)
	}
	return d.AllocDM(n)
}

func (r *perfRes) freeBuffer(b []byte) error {
	if d, ok := r.dev.(perfDM); ok && r.c.DM {
		return d.FreeDM(b)
	}
	return r.dev.FreeBuffer(b)
}

// perfRes is struct pingpong_context: the verbs objects of one run plus the data path's
// preallocated work requests and time stamps.
type perfRes struct {
	c    *perfConfig
	dev  roce.Verbs // the embedded device or the daemon (--daemon)
	gidx int
	addr netip.Addr
	pd   roce.ProtectionDomain
	mr   roce.MemoryRegion
	buf  []byte // from dev.AllocBuffer
	scq  roce.CompletionQueue
	rcq  roce.CompletionQueue
	qps  []roce.QueuePair
	// qpInit is how the QPs were created (-R recreates a QP whose connection was refused).
	qpInit roce.VerbsQPInit
	// area is the size of one QP's send or receive area (BUFF_SIZE rounded to the cache line):
	// QP i sends from [i*area, ...) and receives at [(QPs+i)*area, ...).
	area  int
	cycle int // agreed cycle buffer
	mine  []perftest.Dest
	rem   []perftest.Dest

	wr    []qp.SendWR
	sge   []qp.SGE
	rwr   []qp.RecvWR
	rsge  []qp.SGE
	wcs   []cq.WC
	scnt  []int
	ccnt  []int
	rpost []int
	// tposted and tcompleted are perftest's time stamps, as offsets from t0.
	t0         time.Time
	tposted    []time.Duration
	tcompleted []time.Duration
	timer      *time.Timer
	// writesSeen is QP 0's RemoteWrites count when waitByte last looked at the buffer.
	writesSeen uint64
	// sleeps counts the waits that slept on a CQ channel, polls the CQ polls that returned
	// completions (--stats).
	sleeps, polls int
	// poller drives the device in polled mode (perf --lat --busy-poll, perf_poll.go); nil
	// when the device has a receive goroutine.
	poller *perfPoller
	// phases times the steps of each write-latency iteration (polled mode with --stats;
	// perf_poll.go), nil otherwise.
	phases *perfPhases
}

// newPerfRes creates the PD, the buffer and its MR, the CQs and c.QPs RC QPs in INIT, and the
// local key records.
func newPerfRes(c *perfConfig, dev roce.Verbs, addr netip.Addr, gidx int) (*perfRes, error) {
	return newPerfResWith(c, dev, addr, gidx, nil)
}

// perfCreateQP creates QP i of a run from in (PD, CQs and capabilities filled in) and
// returns it in INIT or later; -R creates the QPs through rdma_cm IDs (perf_cm.go).
type perfCreateQP func(i int, in roce.VerbsQPInit) (roce.QueuePair, error)

// newPerfResWith is newPerfRes with the QPs made by create (nil: dev.CreateQP, then INIT).
func newPerfResWith(c *perfConfig, dev roce.Verbs, addr netip.Addr, gidx int, create perfCreateQP) (*perfRes, error) {
	r := &perfRes{c: c, dev: dev, addr: addr, gidx: gidx, cycle: perfCycleBuffer}
	r.area = c.area()
	var err error
	// AllocBuffer: memory the daemon can map too (embedded: plain memory); --dm: device memory
	if r.buf, err = r.allocBuffer(c.bufferBytes()); err != nil {
		return nil, fmt.Errorf("%w: Couldn't allocate the buffer: %w", errPerfVerbs, err)
	}
	if r.pd, err = dev.AllocPD(); err != nil {
		return nil, fmt.Errorf("%w: Couldn't allocate PD: %w", errPerfVerbs, err)
	}
	acc := mr.AccessLocalWrite | mr.AccessRemoteWrite | mr.AccessRemoteRead | mr.AccessRemoteAtomic
	if r.mr, err = dev.RegMR(r.pd, r.buf, perfIOVA, acc); err != nil {
		return nil, fmt.Errorf("%w: Couldn't allocate MR: %w", errPerfVerbs, err)
	}
	if r.scq, err = dev.CreateCQ(c.TxDepth*c.QPs + perfPollBatch); err != nil {
		return nil, fmt.Errorf("%w: Couldn't create CQ: %w", errPerfVerbs, err)
	}
	if r.rcq, err = dev.CreateCQ(c.RxDepth*c.QPs + perfPollBatch); err != nil {
		return nil, fmt.Errorf("%w: Couldn't create CQ: %w", errPerfVerbs, err)
	}
	caps := qp.Cap{MaxSendWR: uint32(c.TxDepth), MaxRecvWR: uint32(c.RxDepth), MaxSendSGE: 1, MaxRecvSGE: 1}
	outReads := uint16(1)
	if c.Verb == "read" || c.Verb == "atomic" {
		outReads = uint16(min(c.OutReads, dev.Attr().MaxQPRDAtom))
	}
	r.qpInit = roce.VerbsQPInit{Type: qp.TypeRC, PD: r.pd, SendCQ: r.scq, RecvCQ: r.rcq, Cap: caps}
	for i := 0; i < c.QPs; i++ {
		if create != nil {
			q, err := create(i, r.qpInit)
			if err != nil {
				return r, fmt.Errorf("%w: Couldn't create QP[%d]: %w", errPerfVerbs, i, err)
			}
			r.qps = append(r.qps, q)
		} else {
			q, err := dev.CreateQP(r.qpInit)
			if err != nil {
				return nil, fmt.Errorf("%w: Couldn't create QP[%d]: %w", errPerfVerbs, i, err)
			}
			r.qps = append(r.qps, q)
			a := qp.Attr{State: qp.StateInit, Port: 1, AccessFlags: mr.AccessRemoteWrite | mr.AccessRemoteRead | mr.AccessRemoteAtomic}
			if err := q.Modify(&a, qp.AttrState|qp.AttrPKeyIndex|qp.AttrPort|qp.AttrAccessFlags); err != nil {
				return nil, fmt.Errorf("%w: Failed to modify QP[%d] to INIT: %w", errPerfVerbs, i, err)
			}
		}
		q := r.qps[i]
		d := perftest.Dest{LID: dev.PortAttr().LID, OutReads: outReads, QPN: q.Num(), PSN: rand.Uint32() & 0xffffff,
			VAddr: r.recvIOVA(i)}
		if c.Verb != "send" {
			d.RKey = r.mr.RKey()
		}
		d.SetAddr(addr)
		r.mine = append(r.mine, d)
	}
	n := c.QPs
	r.wr, r.sge = make([]qp.SendWR, n), make([]qp.SGE, n)
	r.rwr, r.rsge = make([]qp.RecvWR, n), make([]qp.SGE, n)
	r.scnt, r.ccnt, r.rpost = make([]int, n), make([]int, n), make([]int, n)
	r.wcs = make([]cq.WC, perfPollBatch)
	tot := c.Iters * n
	r.tposted, r.tcompleted = make([]time.Duration, tot), make([]time.Duration, tot)
	r.timer = time.NewTimer(time.Hour)
	r.timer.Stop()
	return r, nil
}

// sendOff and recvOff are the offsets in buf of QP i's send and receive areas; the IOVAs
// are those plus perfIOVA.
func (r *perfRes) sendOff(i int) int     { return i * r.area }
func (r *perfRes) recvOff(i int) int     { return (r.c.QPs + i) * r.area }
func (r *perfRes) sendIOVA(i int) uint64 { return perfIOVA + uint64(r.sendOff(i)) }
func (r *perfRes) recvIOVA(i int) uint64 { return perfIOVA + uint64(r.recvOff(i)) }
func (r *perfRes) since() time.Duration  { return time.Since(r.t0) }
func (r *perfRes) readOrAtomic() bool    { return r.c.Verb == "read" || r.c.Verb == "atomic" }
func (r *perfRes) server() bool          { return r.c.Server == "" }
func (r *perfRes) cycles(size int) bool  { return size <= r.cycle/2 }
func (r *perfRes) slots(size int) int    { return max(1, r.cycle/perfInc(size)) }
func (r *perfRes) wcErr(w *cq.WC, recv bool) error {
	return &perfWCError{Recv: recv, WC: *w}
}

// close is destroy_ctx; the device is closed by the caller.
func (r *perfRes) close() error {
	var errs []error
	for i, q := range r.qps {
		if q == nil { // -R: a refused connection's QP, destroyed already
			continue
		}
		if err := q.Destroy(); err != nil {
			errs = append(errs, fmt.Errorf("%w: Couldn't destroy QP[%d]: %w", errPerfVerbs, i, err))
		}
	}
	for _, c := range []roce.CompletionQueue{r.scq, r.rcq} {
		if c != nil {
			if err := r.dev.DestroyCQ(c); err != nil {
				errs = append(errs, fmt.Errorf("%w: Couldn't destroy CQ: %w", errPerfVerbs, err))
			}
		}
	}
	bufFree := true
	if r.mr != nil {
		if err := r.mr.Dereg(); err != nil {
			errs = append(errs, fmt.Errorf("%w: Couldn't deregister MR: %w", errPerfVerbs, err))
			bufFree = false // still registered: leave the memory mapped
		}
	}
	if r.buf != nil && bufFree {
		if err := r.freeBuffer(r.buf); err != nil {
			errs = append(errs, fmt.Errorf("%w: Couldn't free the buffer: %w", errPerfVerbs, err))
		}
		r.buf = nil
	}
	if r.pd != nil {
		if err := r.pd.Dealloc(); err != nil {
			errs = append(errs, fmt.Errorf("%w: Couldn't deallocate PD: %w", errPerfVerbs, err))
		}
	}
	return errors.Join(errs...)
}

// connect is ctx_connect: RTR and RTS toward the peer's records (IBTA 10.3.1, 9.7.5.2.8).
// tcpPeer is used when the peer sent a zero GID.
func (r *perfRes) connect(remote []perftest.Dest, mtu qp.MTU, tcpPeer netip.Addr) error {
	if len(remote) < len(r.qps) {
		return fmt.Errorf("%w: %d records for %d QPs", errPerfPeer, len(remote), len(r.qps))
	}
	r.rem = remote[:len(r.qps)]
	for i, q := range r.qps {
		d := r.rem[i]
		if d.QPN == 0 || d.QPN == 1 || d.QPN > 0xffffff {
			return fmt.Errorf("%w: record %d has QPN %#x", errPerfPeer, i, d.QPN)
		}
		dgid := d.Addr().Unmap()
		if d.GID == ([16]byte{}) {
			dgid = tcpPeer.Unmap()
		}
		if !dgid.IsValid() || dgid.IsUnspecified() || dgid.Is4() != r.addr.Is4() {
			return fmt.Errorf("%w: GID %v cannot be reached from %v", errPerfPeer, dgid, r.addr)
		}
		destRD, rd := uint8(1), uint8(1)
		if r.readOrAtomic() {
			destRD = uint8(min(int(r.mine[i].OutReads), 255))
			rd = uint8(max(1, min(int(d.OutReads), r.dev.Attr().MaxQPRDAtom, 255)))
		}
		rtr := qp.Attr{State: qp.StateRTR, PathMTU: mtu, DestQPN: d.QPN, RQPSN: d.PSN, MaxDestRDAtomic: destRD,
			MinRNRTimer: perfMinRNRTimer, AH: qp.AHAttr{DGID: dgid, SGIDIndex: uint8(r.gidx), HopLimit: 0xff, Port: 1}}
		if err := q.Modify(&rtr, qp.AttrState|qp.AttrAV|qp.AttrPathMTU|qp.AttrDestQPN|qp.AttrRQPSN|
			qp.AttrMaxDestRDAtomic|qp.AttrMinRNRTimer); err != nil {
			return fmt.Errorf("%w: Failed to modify QP %d to RTR: %w", errPerfVerbs, i, err)
		}
		rts := qp.Attr{State: qp.StateRTS, SQPSN: r.mine[i].PSN, Timeout: perfQPTimeout, RetryCnt: perfRetryCount,
			RNRRetry: 7, MaxRDAtomic: rd}
		if err := q.Modify(&rts, qp.AttrState|qp.AttrSQPSN|qp.AttrTimeout|qp.AttrRetryCnt|qp.AttrRNRRetry|
			qp.AttrMaxQPRDAtomic); err != nil {
			return fmt.Errorf("%w: Failed to modify QP %d to RTS: %w", errPerfVerbs, i, err)
		}
	}
	return nil
}

// setSendWQEs is ctx_set_send_wqes for one message size: one WR per QP from the start of its
// send area to the start of the peer's buffer.
func (r *perfRes) setSendWQEs(size int) {
	for i := range r.qps {
		r.sge[i] = qp.SGE{Addr: r.sendIOVA(i), Length: uint32(size), LKey: r.mr.LKey()}
		w := qp.SendWR{WRID: uint64(i), SGL: r.sge[i : i+1], Flags: qp.SendSignaled}
		switch r.c.Verb {
		case "write":
			w.Opcode = qp.WRRDMAWrite
		case "read":
			w.Opcode = qp.WRRDMARead
		case "send":
			w.Opcode = qp.WRSend
		case "atomic":
			w.Opcode = qp.WRAtomicFetchAndAdd
			w.CompareAdd = perfAtomicAddVal
			if r.c.Atomic == "CMP_AND_SWAP" {
				w.Opcode, w.CompareAdd, w.Swap = qp.WRAtomicCmpAndSwp, 0, perfAtomicSwapVal
			}
		}
		if r.c.Verb != "send" {
			w.RemoteAddr, w.RKey = r.rem[i].VAddr, r.rem[i].RKey
		}
		r.wr[i] = w
		r.scnt[i], r.ccnt[i] = 0, 0
	}
}

// postRecvs is ctx_set_recv_wqes: rx_depth receives of size bytes per QP.
func (r *perfRes) postRecvs(size int) error {
	for i := range r.qps {
		r.rpost[i] = 0
		r.rsge[i] = qp.SGE{Length: uint32(size), LKey: r.mr.LKey()}
		r.rwr[i] = qp.RecvWR{WRID: uint64(i), SGL: r.rsge[i : i+1]}
		for k := 0; k < r.c.RxDepth; k++ {
			if err := r.postRecv(i, size); err != nil {
				return err
			}
		}
	}
	return nil
}

// postRecv posts QP i's next receive, cycling through its receive area.
func (r *perfRes) postRecv(i, size int) error {
	slot := 0
	if r.cycles(size) {
		slot = r.rpost[i] % r.slots(size)
	}
	r.rsge[i].Addr = r.recvIOVA(i) + uint64(slot*perfInc(size))
	if _, err := r.qps[i].PostRecv(r.rwr[i : i+1]); err != nil {
		return fmt.Errorf("%w: Couldn't post recv: qp %d: %w", errPerfVerbs, i, err)
	}
	r.rpost[i]++
	return nil
}

// wait returns at least one completion of c: it polls, yields spin times, then sleeps on
// the CQ's channel, for at most --run-timeout.
func (r *perfRes) wait(c roce.CompletionQueue, spin int) (int, error) {
	if r.poller != nil {
		return r.waitPolled(c)
	}
	if n := c.Poll(r.wcs); n > 0 {
		return n, nil
	}
	if r.c.BusyPoll {
		for i := 0; i < spin; i++ {
			runtime.Gosched()
			if n := c.Poll(r.wcs); n > 0 {
				return n, nil
			}
		}
	}
	deadline := time.Now().Add(r.c.RunTimeout)
	for {
		if err := c.ReqNotify(false); err != nil {
			return 0, fmt.Errorf("%w: Couldn't request CQ notification: %w", errPerfVerbs, err)
		}
		if n := c.Poll(r.wcs); n > 0 {
			return n, nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return 0, fmt.Errorf("%w: no completion within %v", errPerfTimeout, r.c.RunTimeout)
		}
		r.timer.Reset(left)
		r.sleeps++
		select {
		case <-c.Channel():
		case <-r.timer.C:
		}
		r.timer.Stop()
		if n := c.Poll(r.wcs); n > 0 {
			return n, nil
		}
	}
}

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

// latWrite is run_iter_lat_write (QP 0): the server writes first.
func (r *perfRes) latWrite(size int) error {
	c := r.c
	r.setSendWQEs(size)
	r.wr[0].Flags = qp.SendSignaled
	postOff := r.sendOff(0) + size - 1
	pollOff := r.recvOff(0) + size - 1
	q := r.qps[0]
	scnt, ccnt, rcnt := 0, 0, 0
	r.t0 = time.Now()
	for scnt < c.Iters || ccnt < c.Iters || rcnt < c.Iters {
		if rcnt < c.Iters && !(scnt < 1 && r.server()) {
			rcnt++
			if err := r.waitByte(q, pollOff, byte(rcnt)); err != nil {
				return err
			}
		}
		if scnt < c.Iters {
			r.tposted[scnt] = r.since()
			scnt++
			r.buf[postOff] = byte(scnt)
			if _, err := q.PostSend(r.wr[:1]); err != nil {
				return fmt.Errorf("%w: Couldn't post send: scnt=%d: %w", errPerfVerbs, scnt, err)
			}
			if r.phases != nil {
				r.phases.posted[scnt-1] = r.since()
			}
		}
		if ccnt < c.Iters {
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
	if !ok { // through the daemon: no count of the QP's WRITEs (perf_verbs.go)
		return r.pollByte(q, off, v)
	}
	if r.poller != nil {
		return r.waitBytePolled(rw, off, v)
	}
	notify := rw.RemoteWriteNotify()
	deadline := time.Now().Add(r.c.RunTimeout)
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

// latSend is run_iter_lat_send (QP 0): the client sends first.
func (r *perfRes) latSend(size int) error {
	c := r.c
	r.setSendWQEs(size)
	q := r.qps[0]
	scnt, rcnt := 0, 0
	r.t0 = time.Now()
	for scnt < c.Iters || rcnt < c.Iters {
		if rcnt < c.Iters && !(scnt < 1 && !r.server()) {
			n, err := r.waitOne(r.rcq, true)
			if err != nil {
				return err
			}
			rcnt += n
			if rcnt+c.RxDepth <= c.Iters {
				if err := r.postRecv(0, size); err != nil {
					return err
				}
			}
		}
		if scnt < c.Iters {
			r.tposted[scnt] = r.since()
			scnt++
			poll := scnt%c.CQMod == 0 || scnt == c.Iters
			r.wr[0].Flags = 0
			if poll {
				r.wr[0].Flags = qp.SendSignaled
			}
			if _, err := q.PostSend(r.wr[:1]); err != nil {
				return fmt.Errorf("%w: Couldn't post send: scnt=%d: %w", errPerfVerbs, scnt, err)
			}
			if poll {
				if _, err := r.waitOne(r.scq, false); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// waitOne waits for one completion (ibv_poll_cq(cq, 1, &wc) in a loop) and checks it.
func (r *perfRes) waitOne(c roce.CompletionQueue, recv bool) (int, error) {
	wcs := r.wcs
	r.wcs = r.wcs[:1]
	n, err := r.wait(c, perfSpinLat)
	r.wcs = wcs
	if err != nil {
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
	for scnt := 0; scnt < c.Iters; scnt++ {
		r.tposted[scnt] = r.since()
		if _, err := q.PostSend(r.wr[:1]); err != nil {
			return fmt.Errorf("%w: Couldn't post send: scnt=%d: %w", errPerfVerbs, scnt, err)
		}
		if _, err := r.waitOne(r.scq, false); err != nil {
			return err
		}
	}
	return nil
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

// perfSizes returns the message sizes of the run: 2, 4, ... 2^23 with -a, else -s.
func perfSizes(c *perfConfig) []int {
	if !c.All {
		return []int{c.Size}
	}
	var s []int
	for i := 1; i < 24; i++ {
		s = append(s, 1<<i)
	}
	return s
}

// perfRun runs one perftest side.
func perfRun(c *perfConfig, env *perfEnv) (err error) {
	ctx := context.Background()
	out := env.Stdout
	var (
		ld   *cli.VerbsDev
		r    *perfRes
		host netip.Addr
	)
	defer func() {
		if r != nil {
			err = errors.Join(err, r.close())
			if r.poller != nil {
				r.poller.close()
			}
		}
		if ld != nil {
			if c.Stats {
				if r != nil {
					fmt.Fprintf(env.Stderr, "stats: perf CQ polls with completions %d, sleeps on the CQ %d\n", r.polls, r.sleeps)
					r.printPhases(env.Stderr)
				}
				perfPrintStats(env.Stderr, ld)
			}
			err = errors.Join(err, ld.Close())
		}
	}()
	open := func(peer netip.Addr) error {
		var e error
		if ld, e = cli.OpenVerbs(c.Daemon, &c.Dev, cli.DevOptions{Port: c.RocePort, Portable: c.Portable, Peer: peer,
			BusyPoll: c.linkBusyPoll(), Polled: c.polled(), XDP: c.XDP, XDPNoPairs: c.XDPNoPairs, DM: c.dmBytes()}); e != nil {
			return e
		}
		if c.MTU != 0 && c.MTU > ld.MTU {
			return fmt.Errorf("%w: -m %d: requested MTU is larger than the port's active MTU %d", errPerfUsage, c.MTU.Bytes(), ld.MTU.Bytes())
		}
		r, e = newPerfRes(c, ld.V, ld.Addr, ld.GIDIndex)
		if r != nil && ld.Dev != nil && ld.Dev.Polled() {
			r.poller = newPerfPoller(ld.Dev)
			if c.Stats && c.Verb == "write" {
				r.phases = newPerfPhases(c.Iters)
			}
		}
		return e
	}
	if c.Verb == "read" || c.Verb == "atomic" {
		fmt.Fprint(out, perftest.ResultLine) // ctx_set_max_inline's separator
	}
	oo := perftest.Options{Options: oob.Options{Timeout: c.Timeout}, FinishTimeout: c.RunTimeout}
	var conn *perftest.Conn
	var tcpPeer netip.Addr
	if c.Server != "" {
		var e error
		if host, e = cli.ResolveHost(ctx, c.Server, c.Timeout); e != nil {
			return e
		}
		if e := open(host); e != nil {
			return e
		}
		tc, e := cli.Dial(ctx, netip.AddrPortFrom(host, uint16(c.Port)), c.Timeout)
		if e != nil {
			return fmt.Errorf("Couldn't connect to %v:%d: %w", host, c.Port, e)
		}
		tcpPeer = host
		conn = perftest.NewConn(tc, perftest.Client, oo)
	} else {
		ln := env.Listener
		if ln == nil {
			var e error
			if ln, e = net.Listen("tcp4", ":"+strconv.Itoa(c.Port)); e != nil {
				return fmt.Errorf("Couldn't listen to port %d: %w", c.Port, e)
			}
		}
		defer ln.Close()
		if c.Dev.IsSet() {
			if e := open(netip.Addr{}); e != nil {
				return e
			}
		}
		fmt.Fprint(out, perftest.WaitingBanner)
		actx, cancel := context.WithTimeout(ctx, c.Timeout)
		tc, e := oob.Accept(actx, ln)
		timedOut := actx.Err() != nil || errors.Is(e, os.ErrDeadlineExceeded)
		cancel()
		ln.Close()
		if e != nil {
			if timedOut {
				e = fmt.Errorf("%w: no client connected to port %d within %v", errPerfTimeout, c.Port, c.Timeout)
			}
			return fmt.Errorf("accept() failed: %w", e)
		}
		tcpPeer = cli.AddrOf(tc.RemoteAddr())
		if r == nil { // no -d: speak from the address the client reached
			if e := open(cli.AddrOf(tc.LocalAddr())); e != nil {
				tc.Close()
				return e
			}
		}
		conn = perftest.NewConn(tc, perftest.Server, oo)
	}
	defer conn.Close()
	mtu := c.MTU
	if mtu == 0 {
		mtu = ld.MTU
	}
	role := perftest.Client
	if c.Server == "" {
		role = perftest.Server
	}
	relax := "ON"
	if c.Test == perftest.WriteLat {
		relax = "OFF" // as ib_write_lat prints on rxe
	}
	banner := perftest.Banner{Test: c.Test, Role: role, Atomic: c.Atomic, Device: ld.V.Name(), QPs: c.QPs,
		Transport: "IB", Connection: "RC", LinkType: "Ethernet", PCIeRelaxOrder: relax, TXDepth: c.TxDepth,
		RXDepth: c.RxDepth, CQModeration: c.CQMod, MTU: perftest.MTU(mtu), GIDIndex: ld.GIDIndex,
		InlineSize: c.Inline, OutReads: int(r.mine[0].OutReads)}
	fmt.Fprint(out, banner.String())
	sizes := perfSizes(c)
	setup := &perftest.Setup{Test: c.Test, MTU: perftest.MTU(mtu), Local: r.mine,
		Connect: func(rem []perftest.Dest, m perftest.MTU) error { return r.connect(rem, qp.MTU(m), tcpPeer) }}
	if c.Verb == "send" && (c.Lat || role == perftest.Server) {
		setup.BeforeSync = func() error { return r.postRecvs(sizes[0]) }
	}
	sess, err := conn.Setup(ctx, setup)
	if err != nil {
		return fmt.Errorf("Failed to exchange data between server and clients: %w", err)
	}
	if int(sess.SysData.CycleBuffer) > r.area || sess.SysData.CacheLine > perfCacheLine {
		return fmt.Errorf("%w: peer's cycle buffer %d / cache line %d exceed ours", errPerfPeer, sess.SysData.CycleBuffer, sess.SysData.CacheLine)
	}
	r.cycle = int(sess.SysData.CycleBuffer)
	for _, d := range r.mine {
		fmt.Fprint(out, perftest.AddressLine(c.Test, perftest.Local, d, true))
	}
	for _, d := range r.rem {
		fmt.Fprint(out, perftest.AddressLine(c.Test, perftest.Remote, d, true))
	}
	fmt.Fprint(out, perftest.ResultLine)

	return perfMeasure(ctx, r, conn, role, out, sizes)
}

// perfExchanger is the out-of-band exchange during and after the measurement: the TCP
// exchange (*perftest.Conn) or, with -R, the rdma_cm one (perf_cm.go).
type perfExchanger interface {
	// HandShake is ctx_hand_shake: one key record round.
	HandShake(ctx context.Context, mine *perftest.Dest) (perftest.Dest, error)
	// Finish runs the exchanges after the measurement (see perftest.Conn.Finish).
	Finish(ctx context.Context, t perftest.Test, local *perftest.Dest, mine perftest.BWReport) (perftest.BWReport, error)
	// Close ends the exchange.
	Close() error
}

// perfMeasure runs the measurement of every size and the closing exchanges, printing
// perftest's table.
func perfMeasure(ctx context.Context, r *perfRes, conn perfExchanger, role perftest.Role, out io.Writer, sizes []int) error {
	c := r.c
	var err error
	switch {
	case c.Test.BW() && c.Verb != "send":
		fmt.Fprint(out, perftest.BWHeader(c.Gbits))
		if role == perftest.Server { // write_bw.c: the server only waits for the client's report
			rep, err := conn.Finish(ctx, c.Test, &r.mine[0], perftest.BWReport{})
			if err != nil {
				return fmt.Errorf("Failed to exchange data between server and clients: %w", err)
			}
			fmt.Fprint(out, perftest.FormatBW(rep, nil, c.Gbits))
			fmt.Fprint(out, perftest.ResultLine)
			return nil
		}
		var rep perftest.BWReport
		for _, s := range sizes {
			if err := r.bwClient(s); err != nil {
				return fmt.Errorf("Failed to complete run_iter_bw function successfully: %w", err)
			}
			rep = r.bwReport(s)
			fmt.Fprint(out, perftest.FormatBW(rep, nil, c.Gbits))
		}
		if _, err := conn.Finish(ctx, c.Test, &r.mine[0], rep); err != nil {
			return fmt.Errorf("Failed to close connection between server and client: %w", err)
		}
		fmt.Fprint(out, perftest.ResultLine)
	case c.Test == perftest.SendBW:
		fmt.Fprint(out, perftest.BWHeader(c.Gbits))
		for k, s := range sizes {
			if k > 0 { // send_bw.c RUN_ALL: receives for this size, then a sync
				if role == perftest.Server {
					if err := r.postRecvs(s); err != nil {
						return err
					}
				}
				if _, err := conn.HandShake(ctx, &r.mine[0]); err != nil {
					return fmt.Errorf("Failed to exchange data between server and clients: %w", err)
				}
			}
			var rep perftest.BWReport
			if role == perftest.Server {
				if rep, err = r.bwServerSend(s); err != nil {
					return err
				}
			} else {
				if err := r.bwClient(s); err != nil {
					return err
				}
				rep = r.bwReport(s)
			}
			fmt.Fprint(out, perftest.FormatBW(rep, nil, c.Gbits))
			if c.All {
				if _, err := conn.HandShake(ctx, &r.mine[0]); err != nil {
					return fmt.Errorf("Failed to exchange data between server and clients: %w", err)
				}
			}
		}
		fmt.Fprint(out, perftest.ResultLine)
		if _, err := conn.Finish(ctx, c.Test, &r.mine[0], perftest.BWReport{}); err != nil {
			return fmt.Errorf("Failed to close connection between server and client: %w", err)
		}
	case (c.Test == perftest.ReadLat || c.Test == perftest.AtomicLat) && role == perftest.Server:
		// read_lat.c: the server closes at once and prints only the separator.
		if _, err := conn.Finish(ctx, c.Test, &r.mine[0], perftest.BWReport{}); err != nil {
			return fmt.Errorf("Failed to close connection between server and client: %w", err)
		}
	default: // latency
		fmt.Fprint(out, perftest.HeaderLat)
		for k, s := range sizes {
			var err error
			switch c.Test {
			case perftest.WriteLat:
				err = r.measure(r.latWrite, s)
			case perftest.SendLat:
				if k > 0 {
					if err := r.postRecvs(s); err != nil {
						return err
					}
					if _, err := conn.HandShake(ctx, &r.mine[0]); err != nil {
						return fmt.Errorf("Failed to exchange data between server and clients: %w", err)
					}
				}
				err = r.measure(r.latSend, s)
			default:
				err = r.measure(r.latReadAtomic, s)
			}
			if err != nil {
				return fmt.Errorf("Test exited with Error: %w", err)
			}
			rep, err := r.latReport(s)
			if err != nil {
				return err
			}
			fmt.Fprint(out, perftest.FormatLat(rep))
		}
		if c.Test != perftest.WriteLat {
			if _, err := conn.Finish(ctx, c.Test, &r.mine[0], perftest.BWReport{}); err != nil {
				return fmt.Errorf("Failed to close connection between server and client: %w", err)
			}
		} else {
			conn.Close()
			// ib_write_lat exits without a closing exchange; the peer may still be waiting for
			// the ACK of its last WRITE, which our responder sent from its receive path
			// already. Give a lost ACK one retransmission round before the device goes.
			time.Sleep(50 * time.Millisecond)
		}
	}
	if !c.Test.BW() {
		fmt.Fprint(out, perftest.ResultLine)
	}
	return nil
}

// perfPrintStats writes the device's non-zero counters and its link's counters (--stats).
// Through the daemon the counters are the daemon device's (every client's traffic) and the
// link's are not available.
func perfPrintStats(w io.Writer, vd *cli.VerbsDev) {
	m := vd.V.Stats().Map()
	keys := make([]string, 0, len(m))
	for k, v := range m {
		if v != 0 {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "stats: %s %d\n", k, m[k])
	}
	if vd.Dev == nil {
		fmt.Fprintf(w, "stats: through the daemon: the counters above are its device's, all clients together; no link counters\n")
		return
	}
	if s, ok := vd.Dev.LinkStats(); ok {
		fmt.Fprintf(w, "stats: link sent %d (%d sendmmsg, %d GSO messages), received %d (%d recv calls, %d GRO reads), drops %d, truncated %d, fallbacks %d, entropy sockets %d (%d ports fell back to the main socket)\n",
			s.Sent, s.SendBatches, s.GSOSends, s.Received, s.RecvBatches, s.GROReceives, s.Drops, s.Truncated, s.Fallbacks,
			s.EntropySockets, s.EntropyFallbacks)
		if s.XDPSent+s.XDPReceived+s.XDPFallbacks > 0 {
			off := ""
			if s.XDPPairsOff > 0 {
				off = " (refused by the kernel: off)"
			}
			if s.XDPWrites > 0 {
				off += fmt.Sprintf(", WRITEs executed by the XDP program %d", s.XDPWrites)
			}
			fmt.Fprintf(w, "stats: link AF_XDP path sent %d, received %d, sends through the UDP socket %d, pairs as one GSO frame %d%s\n",
				s.XDPSent, s.XDPReceived, s.XDPFallbacks, s.XDPPairs, off)
		}
	}
}

// area is one QP's half of the buffer (perftest's INC(size) of the largest message, at least
// the cycle buffer); bufferBytes the whole buffer (a send and a receive area per QP).
func (c *perfConfig) area() int        { return perfInc(max(c.Size, perfCycleBuffer)) }
func (c *perfConfig) bufferBytes() int { return 2 * c.QPs * c.area() }

// dmBytes is the device memory a run needs (--dm: the buffer), 0 without.
func (c *perfConfig) dmBytes() int {
	if !c.DM {
		return 0
	}
	return c.bufferBytes()
}
