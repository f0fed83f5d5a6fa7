package perf

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/oob/perftest"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/roce"
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
	// poller drives the device in polled mode (perf --lat --busy-poll, poll.go); nil
	// when the device has a receive goroutine.
	poller *perfPoller
	// ahs are the UD QPs' address handles toward the peer's QPs (-c UD).
	ahs []*qp.AH
	// dur is the -D state machine of the current measurement (nil: iterations); sampled
	// counts the messages completed while it samples.
	dur     *perfDuration
	sampled int
	// phases times the steps of each write-latency iteration (polled mode with --stats;
	// poll.go), nil otherwise.
	phases *perfPhases
}

// newPerfRes creates the PD, the buffer and its MR, the CQs and c.QPs RC QPs in INIT, and the
// local key records.
func newPerfRes(c *perfConfig, dev roce.Verbs, addr netip.Addr, gidx int) (*perfRes, error) {
	return newPerfResWith(c, dev, addr, gidx, nil)
}

// perfCreateQP creates QP i of a run from in (PD, CQs and capabilities filled in) and
// returns it in INIT or later; -R creates the QPs through rdma_cm IDs (cm.go).
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
	r.qpInit = roce.VerbsQPInit{Type: c.conn(), PD: r.pd, SendCQ: r.scq, RecvCQ: r.rcq, Cap: caps}
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
			// ctx_modify_qp_to_init: a UD QP takes perftest's Q_Key (IBTA 10.2.5), the others
			// the remote access the test needs
			a := qp.Attr{State: qp.StateInit, Port: 1, AccessFlags: mr.AccessRemoteWrite | mr.AccessRemoteRead | mr.AccessRemoteAtomic}
			mask := qp.AttrState | qp.AttrPKeyIndex | qp.AttrPort | qp.AttrAccessFlags
			if c.Conn == qp.TypeUD {
				a.AccessFlags, a.QKey = 0, perfQKey
				mask = qp.AttrState | qp.AttrPKeyIndex | qp.AttrPort | qp.AttrQKey
			}
			if err := q.Modify(&a, mask); err != nil {
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
func (r *perfRes) cycles(size int) bool  { return size+r.grh() <= r.cycle/2 }
func (r *perfRes) slots(size int) int    { return max(1, r.cycle/perfInc(size)) }

// grh is the room a UD receive leaves for the GRH (UD_ADDITION, IBTA 11.4.1.2), and udShift
// where in a receive slot it starts, so that the payload begins on the cache line.
func (r *perfRes) grh() int {
	if r.c.Conn == qp.TypeUD {
		return perfGRH
	}
	return 0
}
func (r *perfRes) udShift() int {
	if r.c.Conn == qp.TypeUD {
		return perfCacheLine - perfGRH
	}
	return 0
}

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
		av := qp.AHAttr{DGID: dgid, SGIDIndex: uint8(r.gidx), HopLimit: 0xff, SL: r.c.SL, Port: 1}
		if err := r.connectQP(i, q, d, av, mtu); err != nil {
			return err
		}
	}
	return nil
}

// connectQP is ctx_modify_qp_to_rtr and _rts for QP i by its type: RC with the whole path
// (IBTA 9.7), UC with the path but no responder resources or retries (9.8), UD with states
// and the send PSN only, its destination in an address handle per send (9.8.5, ctx_connect's
// ibv_create_ah).
func (r *perfRes) connectQP(i int, q roce.QueuePair, d perftest.Dest, av qp.AHAttr, mtu qp.MTU) error {
	rtr := qp.Attr{State: qp.StateRTR}
	rts := qp.Attr{State: qp.StateRTS, SQPSN: r.mine[i].PSN}
	rtrMask, rtsMask := qp.AttrState, qp.AttrState|qp.AttrSQPSN
	switch r.c.conn() {
	case qp.TypeRC:
		destRD, rd := uint8(1), uint8(1)
		if r.readOrAtomic() {
			destRD = uint8(min(int(r.mine[i].OutReads), 255))
			rd = uint8(max(1, min(int(d.OutReads), r.dev.Attr().MaxQPRDAtom, 255)))
		}
		rtr.PathMTU, rtr.DestQPN, rtr.RQPSN, rtr.MaxDestRDAtomic, rtr.MinRNRTimer, rtr.AH = mtu, d.QPN, d.PSN, destRD, perfMinRNRTimer, av
		rtrMask |= qp.AttrAV | qp.AttrPathMTU | qp.AttrDestQPN | qp.AttrRQPSN | qp.AttrMaxDestRDAtomic | qp.AttrMinRNRTimer
		if r.c.SelectiveRepeat {
			rtr.SelectiveRepeat = true // softroce's own, both sides given --selective-repeat
			rtrMask |= qp.AttrSelectiveRepeat
		}
		rts.Timeout, rts.RetryCnt, rts.RNRRetry, rts.MaxRDAtomic = r.c.QPTimeout, perfRetryCount, 7, rd
		rtsMask |= qp.AttrTimeout | qp.AttrRetryCnt | qp.AttrRNRRetry | qp.AttrMaxQPRDAtomic
	case qp.TypeUC:
		rtr.PathMTU, rtr.DestQPN, rtr.RQPSN, rtr.AH = mtu, d.QPN, d.PSN, av
		rtrMask |= qp.AttrAV | qp.AttrPathMTU | qp.AttrDestQPN | qp.AttrRQPSN
	}
	if err := q.Modify(&rtr, rtrMask); err != nil {
		return fmt.Errorf("%w: Failed to modify QP %d to RTR: %w", errPerfVerbs, i, err)
	}
	if err := q.Modify(&rts, rtsMask); err != nil {
		return fmt.Errorf("%w: Failed to modify QP %d to RTS: %w", errPerfVerbs, i, err)
	}
	if r.c.Conn == qp.TypeUD {
		ah, err := r.dev.CreateAH(r.pd, av)
		if err != nil {
			return fmt.Errorf("%w: Failed to create AH: %w", errPerfVerbs, err)
		}
		r.ahs = append(r.ahs, ah)
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
		if r.c.Conn == qp.TypeUD {
			w.AH, w.RemoteQPN, w.RemoteQKey = r.ahs[i], r.rem[i].QPN, perfQKey
		}
		r.wr[i] = w
		r.scnt[i], r.ccnt[i] = 0, 0
	}
}

// postRecvs is ctx_set_recv_wqes: rx_depth receives of size bytes per QP.
func (r *perfRes) postRecvs(size int) error {
	for i := range r.qps {
		r.rpost[i] = 0
		r.rsge[i] = qp.SGE{Length: uint32(size + r.grh()), LKey: r.mr.LKey()}
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
	// UD: the 40-byte GRH lands first, the payload on the cache line (ctx_set_recv_wqes)
	r.rsge[i].Addr = r.recvIOVA(i) + uint64(slot*perfInc(size)) + uint64(r.udShift())
	if _, err := r.qps[i].PostRecv(r.rwr[i : i+1]); err != nil {
		return fmt.Errorf("%w: Couldn't post recv: qp %d: %w", errPerfVerbs, i, err)
	}
	r.rpost[i]++
	return nil
}

// wait returns at least one completion of c: it polls, yields spin times, then sleeps on
// the CQ's channel, for at most --run-timeout. In the duration mode it returns 0 completions
// once the measurement ended.
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
	deadline, end := r.deadline()
	for {
		if err := c.ReqNotify(false); err != nil {
			return 0, fmt.Errorf("%w: Couldn't request CQ notification: %w", errPerfVerbs, err)
		}
		if n := c.Poll(r.wcs); n > 0 {
			return n, nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			if end {
				return 0, nil
			}
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

// deadline is how long a wait may last: --run-timeout, or (end) the end of a duration-mode
// measurement when that comes first.
func (r *perfRes) deadline() (t time.Time, end bool) {
	t = time.Now().Add(r.c.RunTimeout)
	if r.dur != nil && r.dur.end().Before(t) {
		return r.dur.end(), true
	}
	return t, false
}
