package perf

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/softroce/softroce/internal/cm"
	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/oob/perftest"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/rdmacm"
	"github.com/softroce/softroce/pkg/roce"
)

// softroce perf -R: perftest's rdma_cm mode (-R, work_rdma_cm), as perftest 6.06 (Debian 12's
// perftest 4.5+0.17) runs it, read from perftest_communication.c and write_bw.c / send_bw.c:
//
//   - the out-of-band exchange runs over its own RC QP connected with rdma_cm (RDMA_PS_TCP,
//     service port -p) instead of TCP (create_comm_struct with use_rdma_cm, establish_connection:
//     rdma_client_connect / rdma_server_connect): every ctx_xchg_data step and every key record
//     is one SEND of exactly its bytes, the client sending first, into the single 56-byte
//     receive the peer keeps posted (post_one_recv_wqe, reposted after each message);
//   - key records are then the binary struct pingpong_dest (56 bytes, big-endian fields,
//     rdma_write_keys with HAVE_ENDIAN), not the 108-byte text of the TCP exchange;
//   - the data QPs are connected through rdma_cm too (create_rdma_cm_connection): one key
//     round (zero records), the server listens again on -p (the exchange's listener is gone)
//     and accepts -q requests, the client connects -q IDs (all requests out before any
//     answer is awaited; a refused attempt is retried up to 10 times 100 ms apart, as
//     rdma_cm_client_connection), then one more key round; the records that follow
//     only carry the buffer address and rkey (ctx_connect is skipped);
//   - no "done" at the end: ctx_close_connection is one key round.
//
// Only the bandwidth tests are supported with -R (write_bw.c, read_bw.c and atomic_bw.c run
// the same rounds; READ and atomic connections announce -o as responder resources and
// initiator depth).

const (
	// perfCMRecordSize is sizeof(struct pingpong_dest) on x86-64 Linux (perftest_resources.h):
	// lid, out_reads, qpn, psn, rkey (4 bytes each), 4 bytes of padding, vaddr (8), gid (16),
	// srqn, gid_index (4 each).
	perfCMRecordSize = 56
	// perfCMRetries and perfCMRetryDelay: rdma_cm_client_connection's max_retries and delay.
	perfCMRetries    = 10
	perfCMRetryDelay = 100 * time.Millisecond
	// perfCMResolveTimeout is the 2000 ms perftest gives rdma_resolve_addr/route.
	perfCMResolveTimeout = 2000 * time.Millisecond
	// perfCMSendOff is where the exchange's SENDs start in its buffer (receives land at 0).
	perfCMSendOff = 64
	// perfCMCloseWait bounds the wait for DISCONNECTED events when tearing down.
	perfCMCloseWait = 2 * time.Second
	// perfCMRepoll is how often a wait for the exchange's one completion looks at the CQ
	// even without an event.
	perfCMRepoll = 100 * time.Millisecond
)

// perfCMRepolled counts completions of the exchange found by a periodic look rather than by
// the CQ's event (diagnostics: a non-zero count means an event was missing).
var perfCMRepolled atomic.Uint64

// errPerfCM: an rdma_cm step of -R failed.
var errPerfCM = errors.New("rdma_cm")

// encodeCMRecord writes d as rdma_write_keys sends it (HAVE_ENDIAN: every field big-endian;
// the padding after rkey is zero here, stack garbage in perftest).
func encodeCMRecord(b []byte, d *perftest.Dest, gidIndex int) {
	_ = b[perfCMRecordSize-1]
	clear(b[:perfCMRecordSize])
	binary.BigEndian.PutUint32(b[0:], uint32(d.LID))
	binary.BigEndian.PutUint32(b[4:], uint32(d.OutReads))
	binary.BigEndian.PutUint32(b[8:], d.QPN)
	binary.BigEndian.PutUint32(b[12:], d.PSN)
	binary.BigEndian.PutUint32(b[16:], d.RKey)
	binary.BigEndian.PutUint64(b[24:], d.VAddr)
	copy(b[32:48], d.GID[:])
	binary.BigEndian.PutUint32(b[48:], d.SRQN)
	binary.BigEndian.PutUint32(b[52:], uint32(int32(gidIndex)))
}

// parseCMRecord reads a record as rdma_read_keys does (srqn and gid_index are not read back
// by perftest either). Values are truncated to the widths perftest prints and uses.
func parseCMRecord(b []byte) (perftest.Dest, error) {
	if len(b) < perfCMRecordSize {
		return perftest.Dest{}, fmt.Errorf("%w: key record of %d bytes, want %d", errPerfPeer, len(b), perfCMRecordSize)
	}
	var d perftest.Dest
	d.LID = uint16(binary.BigEndian.Uint32(b[0:]))
	d.OutReads = uint16(binary.BigEndian.Uint32(b[4:]))
	d.QPN = binary.BigEndian.Uint32(b[8:]) & 0xffffff
	d.PSN = binary.BigEndian.Uint32(b[12:]) & 0xffffff
	d.RKey = binary.BigEndian.Uint32(b[16:])
	d.VAddr = binary.BigEndian.Uint64(b[24:])
	copy(d.GID[:], b[32:48])
	return d, nil
}

// perfCMEvents reads one rdma_cm event channel, setting aside events nobody waits for yet.
type perfCMEvents struct {
	ch    *rdmacm.EventChannel
	stash []rdmacm.Event
}

// next returns the first event (stashed or new) for which match holds, waiting at most d.
func (e *perfCMEvents) next(ctx context.Context, d time.Duration, match func(rdmacm.Event) bool) (rdmacm.Event, error) {
	for i, ev := range e.stash {
		if match(ev) {
			e.stash = append(e.stash[:i], e.stash[i+1:]...)
			return ev, nil
		}
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for {
		ev, err := e.ch.Get(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ev, fmt.Errorf("%w: no rdma_cm event within %v", errPerfTimeout, d)
			}
			return ev, fmt.Errorf("%w: %w", errPerfCM, err)
		}
		if match(ev) {
			return ev, nil
		}
		e.stash = append(e.stash, ev)
	}
}

// forID waits for the next event of id.
func (e *perfCMEvents) forID(ctx context.Context, d time.Duration, id *rdmacm.ID) (rdmacm.Event, error) {
	return e.next(ctx, d, func(ev rdmacm.Event) bool { return ev.ID == id })
}

// perfCMEventError describes an unexpected event.
func perfCMEventError(what string, ev rdmacm.Event) error {
	if ev.Status != nil {
		return fmt.Errorf("%w: %s: event %v: %w", errPerfCM, what, ev.Type, ev.Status)
	}
	return fmt.Errorf("%w: %s: unexpected event %v", errPerfCM, what, ev.Type)
}

// perfCMComm is the -R exchange: perftest_comm with use_rdma_cm, one RC QP (tx and rx depth 1)
// carrying every exchange step as a SEND.
type perfCMComm struct {
	c       *perfConfig
	dev     roce.Verbs // the embedded device or the daemon (--daemon)
	role    perftest.Role
	ev      perfCMEvents
	id      *rdmacm.ID
	pd      roce.ProtectionDomain
	mr      roce.MemoryRegion
	buf     []byte // from dev.AllocBuffer
	scq     roce.CompletionQueue
	rcq     roce.CompletionQueue
	q       roce.QueuePair
	wcs     [1]cq.WC
	timer   *time.Timer
	gidIdx  int
	remVers string
	closed  bool
}

// newPerfCMComm creates the exchange's verbs objects (not yet connected).
func newPerfCMComm(c *perfConfig, dev roce.Verbs, role perftest.Role, gidIdx int) (*perfCMComm, error) {
	m := &perfCMComm{c: c, dev: dev, role: role, ev: perfCMEvents{ch: rdmacm.NewEventChannel()}, gidIdx: gidIdx}
	m.timer = time.NewTimer(time.Hour)
	m.timer.Stop()
	var err error
	if m.buf, err = dev.AllocBuffer(2 * perfCMSendOff); err != nil {
		return m, fmt.Errorf("%w: Couldn't allocate the buffer: %w", errPerfVerbs, err)
	}
	if m.pd, err = dev.AllocPD(); err != nil {
		return m, fmt.Errorf("%w: Couldn't allocate PD: %w", errPerfVerbs, err)
	}
	if m.mr, err = dev.RegMR(m.pd, m.buf, perfIOVA, mr.AccessLocalWrite); err != nil {
		return m, fmt.Errorf("%w: Couldn't allocate MR: %w", errPerfVerbs, err)
	}
	if m.scq, err = dev.CreateCQ(4); err != nil {
		return m, fmt.Errorf("%w: Couldn't create CQ: %w", errPerfVerbs, err)
	}
	if m.rcq, err = dev.CreateCQ(4); err != nil {
		return m, fmt.Errorf("%w: Couldn't create CQ: %w", errPerfVerbs, err)
	}
	return m, nil
}

// createQP gives id the exchange's QP and posts its one receive (post_one_recv_wqe).
func (m *perfCMComm) createQP(id *rdmacm.ID) error {
	q, err := id.CreateQPVerbs(m.pd, roce.VerbsQPInit{Type: qp.TypeRC, SendCQ: m.scq, RecvCQ: m.rcq,
		Cap: qp.Cap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return fmt.Errorf("%w: Couldn't create the rdma_cm QP: %w", errPerfVerbs, err)
	}
	m.q = q
	return m.postRecv()
}

func (m *perfCMComm) postRecv() error {
	sge := [1]qp.SGE{{Addr: perfIOVA, Length: perfCMRecordSize, LKey: m.mr.LKey()}}
	if _, err := m.q.PostRecv([]qp.RecvWR{{SGL: sge[:]}}); err != nil {
		return fmt.Errorf("%w: Function ibv_post_recv failed for RDMA_CM QP: %w", errPerfVerbs, err)
	}
	return nil
}

// connParam is what perftest's rdma_client_connect / rdma_server_connect announce for the
// exchange's QP (its verb is SEND: no RDMA READ resources).
func perfCMCommParam() rdmacm.ConnParam {
	return rdmacm.ConnParam{RetryCount: perfRetryCount, RNRRetryCount: 7}
}

// dial is retry_rdma_connect: resolve, create the QP, connect; a refused or failed attempt is
// retried perfCMRetries times perfCMRetryDelay apart.
func (m *perfCMComm) dial(ctx context.Context, local netip.Addr, server netip.AddrPort) error {
	var last error
	for try := 0; try < perfCMRetries; try++ {
		if try > 0 {
			time.Sleep(perfCMRetryDelay)
		}
		id, q, err := perfCMConnect(ctx, &m.ev, m.c, m.dev, local, server, func(id *rdmacm.ID) (roce.QueuePair, error) {
			if err := m.createQP(id); err != nil {
				return nil, err
			}
			return m.q, nil
		}, perfCMCommParam())
		if err == nil {
			var ev rdmacm.Event
			if ev, err = m.ev.forID(ctx, m.c.Timeout, id); err == nil && ev.Type != rdmacm.EventEstablished {
				err = perfCMEventError("connecting the exchange", ev)
			}
			if err == nil {
				m.id = id
				return nil
			}
		}
		last = err
		if id != nil {
			id.Destroy()
		}
		if q != nil {
			q.Destroy()
		}
		m.q = nil
		if errors.Is(err, errPerfTimeout) || ctx.Err() != nil {
			break
		}
	}
	return fmt.Errorf("Unable to perform rdma_client function: %w", last)
}

// perfCMConnect creates an ID, resolves server from local, creates the QP with mk and sends
// the connection request with p (rdma_client_connect up to rdma_connect).
func perfCMConnect(ctx context.Context, ev *perfCMEvents, c *perfConfig, dev roce.Verbs, local netip.Addr,
	server netip.AddrPort, mk func(*rdmacm.ID) (roce.QueuePair, error), p rdmacm.ConnParam) (*rdmacm.ID, roce.QueuePair, error) {
	id, err := rdmacm.CreateID(ev.ch, rdmacm.IDOptions{Verbs: dev, PortSpace: cm.PSTCP})
	if err != nil {
		return nil, nil, fmt.Errorf("%w: rdma_create_id: %w", errPerfCM, err)
	}
	fail := func(err error) (*rdmacm.ID, roce.QueuePair, error) { return id, nil, err }
	if err := id.ResolveAddr(local, server, perfCMResolveTimeout); err != nil {
		return fail(fmt.Errorf("%w: rdma_resolve_addr failed: %w", errPerfCM, err))
	}
	e, err := ev.forID(ctx, c.Timeout, id)
	if err != nil {
		return fail(err)
	}
	if e.Type != rdmacm.EventAddrResolved {
		return fail(perfCMEventError("rdma_resolve_addr", e))
	}
	if err := id.ResolveRoute(perfCMResolveTimeout); err != nil {
		return fail(fmt.Errorf("%w: rdma_resolve_route failed: %w", errPerfCM, err))
	}
	if e, err = ev.forID(ctx, c.Timeout, id); err != nil {
		return fail(err)
	}
	if e.Type != rdmacm.EventRouteResolved {
		return fail(perfCMEventError("rdma_resolve_route", e))
	}
	q, err := mk(id)
	if err != nil {
		return fail(err)
	}
	if err := id.Connect(p); err != nil {
		return id, q, fmt.Errorf("%w: Function rdma_connect failed: %w", errPerfCM, err)
	}
	return id, q, nil
}

// listen binds and listens on the -p port of local (rdma_bind_addr, rdma_listen).
func perfCMListen(ev *perfCMEvents, dev roce.Verbs, local netip.Addr, port, backlog int) (*rdmacm.ID, error) {
	l, err := rdmacm.CreateID(ev.ch, rdmacm.IDOptions{Verbs: dev, PortSpace: cm.PSTCP})
	if err != nil {
		return nil, fmt.Errorf("%w: rdma_create_id: %w", errPerfCM, err)
	}
	if err := l.BindAddr(netip.AddrPortFrom(local, uint16(port))); err != nil {
		l.Destroy()
		return nil, fmt.Errorf("%w: rdma_bind_addr failed: %w", errPerfCM, err)
	}
	if err := l.Listen(backlog); err != nil {
		l.Destroy()
		return nil, fmt.Errorf("%w: rdma_listen failed: %w", errPerfCM, err)
	}
	return l, nil
}

// listen is rdma_server_connect's rdma_bind_addr and rdma_listen on -p (backlog 1).
func (m *perfCMComm) listen(local netip.Addr) (*rdmacm.ID, error) {
	l, err := perfCMListen(&m.ev, m.dev, local, m.c.Port, 1)
	if err != nil {
		return nil, fmt.Errorf("Unable to perform rdma_server function: %w", err)
	}
	return l, nil
}

// accept is the rest of rdma_server_connect: take one request on l, create the QP, post the
// receive, accept, and drop the listener (the data connections listen on -p again).
func (m *perfCMComm) accept(ctx context.Context, l *rdmacm.ID) error {
	defer l.Destroy()
	ev, err := m.ev.next(ctx, m.c.Timeout, func(ev rdmacm.Event) bool { return ev.Listen == l || ev.ID == l })
	if err != nil {
		if errors.Is(err, errPerfTimeout) {
			err = fmt.Errorf("%w: no client connected to rdma_cm port %d within %v", errPerfTimeout, m.c.Port, m.c.Timeout)
		}
		return fmt.Errorf("Unable to perform rdma_server function: %w", err)
	}
	if ev.Type != rdmacm.EventConnectRequest {
		return fmt.Errorf("Unable to perform rdma_server function: %w", perfCMEventError("waiting for connect request", ev))
	}
	m.id = ev.ID
	if err := m.createQP(m.id); err != nil {
		return err
	}
	p := perfCMCommParam()
	if err := m.id.Accept(&p); err != nil {
		return fmt.Errorf("%w: Function rdma_accept failed: %w", errPerfCM, err)
	}
	return nil
}

// perfCMCQ is what the exchange's wait uses of a CQ (a seam for tests).
type perfCMCQ = roce.CompletionQueue

// wait waits for one completion of c within d. It sleeps on the CQ's channel but looks at
// the CQ at least every perfCMRepoll (perfCMRepolled counts the completions found that way).
func (m *perfCMComm) wait(c perfCMCQ, d time.Duration, step string) error {
	deadline := time.Now().Add(d)
	byTimer := false
	for {
		if n := c.Poll(m.wcs[:]); n > 0 {
			if byTimer {
				perfCMRepolled.Add(1)
			}
			if m.wcs[0].Status != cq.StatusSuccess {
				return fmt.Errorf("%w: %s: Bad wc status %s (%d)", errPerfVerbs, step, m.wcs[0].Status, int(m.wcs[0].Status))
			}
			return nil
		}
		if err := c.ReqNotify(false); err != nil {
			return fmt.Errorf("%w: Couldn't request CQ notification: %w", errPerfVerbs, err)
		}
		if n := c.Poll(m.wcs[:]); n > 0 { // arrived before the arm: the channel may stay quiet
			if m.wcs[0].Status != cq.StatusSuccess {
				return fmt.Errorf("%w: %s: Bad wc status %s (%d)", errPerfVerbs, step, m.wcs[0].Status, int(m.wcs[0].Status))
			}
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			a := m.q.Query()
			return fmt.Errorf("%w: %s: nothing within %v (exchange QP %#x %v, timeout %d retry %d rnr_retry %d min_rnr %d; device %+v)",
				errPerfTimeout, step, d, m.q.Num(), m.q.State(), a.Timeout, a.RetryCnt, a.RNRRetry, a.MinRNRTimer, m.dev.Stats())
		}
		m.timer.Reset(min(left, perfCMRepoll))
		select {
		case <-c.Channel():
			byTimer = false
		case <-m.timer.C:
			byTimer = true
		}
		m.timer.Stop()
	}
}

// write is rdma_write_data: one signaled SEND of b, waited for.
func (m *perfCMComm) write(b []byte, step string) error {
	copy(m.buf[perfCMSendOff:], b)
	sge := [1]qp.SGE{{Addr: perfIOVA + perfCMSendOff, Length: uint32(len(b)), LKey: m.mr.LKey()}}
	if _, err := m.q.PostSend([]qp.SendWR{{Opcode: qp.WRSend, SGL: sge[:], Flags: qp.SendSignaled}}); err != nil {
		return fmt.Errorf("%w: send %s: Function ibv_post_send failed: %w", errPerfVerbs, step, err)
	}
	return m.wait(m.scq, m.c.Timeout, "send "+step)
}

// read is rdma_read_data: the next received message into b (it must be at least len(b)
// bytes), then the receive is posted again.
func (m *perfCMComm) read(b []byte, step string, d time.Duration) error {
	if err := m.wait(m.rcq, d, "read "+step); err != nil {
		return err
	}
	if n := int(m.wcs[0].ByteLen); n < len(b) {
		return fmt.Errorf("%w: read %s: %d bytes, want %d", errPerfPeer, step, n, len(b))
	}
	copy(b, m.buf[:len(b)])
	return m.postRecv()
}

// xchg is ctx_xchg_data_rdma: the client writes then reads, the server reads then writes.
func (m *perfCMComm) xchg(mine, theirs []byte, step string, d time.Duration) error {
	if m.role == perftest.Client {
		if err := m.write(mine, step); err != nil {
			return err
		}
		return m.read(theirs, step, d)
	}
	if err := m.read(theirs, step, d); err != nil {
		return err
	}
	return m.write(mine, step)
}

// handShake is ctx_hand_shake over the exchange QP, reads bounded by d.
func (m *perfCMComm) handShake(mine *perftest.Dest, d time.Duration) (perftest.Dest, error) {
	var b, t [perfCMRecordSize]byte
	encodeCMRecord(b[:], mine, m.gidIdx)
	if err := m.xchg(b[:], t[:], "key record", d); err != nil {
		return perftest.Dest{}, err
	}
	return parseCMRecord(t[:])
}

// HandShake implements perfExchanger.
func (m *perfCMComm) HandShake(_ context.Context, mine *perftest.Dest) (perftest.Dest, error) {
	return m.handShake(mine, m.c.Timeout)
}

// Finish implements perfExchanger: as the TCP exchange's Finish without "done"
// (ctx_close_connection with rdma_cm is one key round); the first round waits for the
// peer's whole run.
func (m *perfCMComm) Finish(_ context.Context, t perftest.Test, local *perftest.Dest, mine perftest.BWReport) (perftest.BWReport, error) {
	var rem perftest.BWReport
	if _, err := m.handShake(local, m.c.RunTimeout); err != nil {
		return rem, err
	}
	if t.BW() && !t.Send() {
		var err error
		if rem, err = m.bwReports(mine); err != nil {
			return rem, err
		}
		if _, err := m.handShake(local, m.c.Timeout); err != nil {
			return rem, err
		}
	}
	return rem, nil
}

// bwReports is xchg_bw_reports: five 8-byte big-endian exchanges (peer version >= 5.33).
func (m *perfCMComm) bwReports(mine perftest.BWReport) (perftest.BWReport, error) {
	var r perftest.BWReport
	vals := []uint64{mine.Size, mine.Iters, math.Float64bits(mine.BWPeak), math.Float64bits(mine.BWAvg), math.Float64bits(mine.MsgRate)}
	outs := make([]uint64, len(vals))
	for i, v := range vals {
		var b, t [8]byte
		binary.BigEndian.PutUint64(b[:], v)
		if err := m.xchg(b[:], t[:], "BW report", m.c.Timeout); err != nil {
			return r, err
		}
		outs[i] = binary.BigEndian.Uint64(t[:])
	}
	r.Size, r.Iters = outs[0], outs[1]
	r.BWPeak, r.BWAvg, r.MsgRate = math.Float64frombits(outs[2]), math.Float64frombits(outs[3]), math.Float64frombits(outs[4])
	return r, nil
}

// Close implements perfExchanger (the QP goes with the connection in close).
func (m *perfCMComm) Close() error { return nil }

// ExchangeBWReport implements perfExchanger: xchg_bw_reports over the exchange QP.
func (m *perfCMComm) ExchangeBWReport(_ context.Context, mine perftest.BWReport) (perftest.BWReport, error) {
	return m.bwReports(mine)
}

// CloseExchange implements perfExchanger: ctx_close_connection with rdma_cm, one key round.
func (m *perfCMComm) CloseExchange(_ context.Context, mine *perftest.Dest) (perftest.Dest, error) {
	return m.handShake(mine, m.c.Timeout)
}

// preamble runs exchange_versions, check_sys_data and check_mtu over the exchange QP and
// returns the agreed cycle buffer, cache line and MTU.
func (m *perfCMComm) preamble(mtu perftest.MTU) (perftest.SysData, perftest.MTU, error) {
	var mv, tv [perftest.VersionSize]byte
	copy(mv[:perftest.VersionSize-1], perftest.Version)
	if err := m.xchg(mv[:], tv[:], "version", m.c.Timeout); err != nil {
		return perftest.SysData{}, 0, err
	}
	m.remVers = strings.TrimRight(string(tv[:]), "\x00")
	if i := strings.IndexByte(m.remVers, 0); i >= 0 {
		m.remVers = m.remVers[:i]
	}
	if v, err := strconv.ParseFloat(m.remVers, 64); err != nil || v < 5.70 {
		return perftest.SysData{}, 0, &perftest.VersionError{Remote: m.remVers, Local: perftest.Version}
	}
	sd := perftest.DefaultSysData
	var agreed perftest.SysData
	for i, v := range []int32{sd.CycleBuffer, sd.CacheLine} {
		var b, t [4]byte
		binary.BigEndian.PutUint32(b[:], uint32(v))
		if err := m.xchg(b[:], t[:], "system data", m.c.Timeout); err != nil {
			return agreed, 0, err
		}
		rv := max(v, int32(binary.BigEndian.Uint32(t[:])))
		if i == 0 {
			agreed.CycleBuffer = rv
		} else {
			agreed.CacheLine = rv
		}
	}
	mb := [2]byte{'0' + byte(mtu), 0}
	var tb [2]byte
	if err := m.xchg(mb[:], tb[:], "MTU", m.c.Timeout); err != nil {
		return agreed, 0, err
	}
	if rm := perftest.MTU(tb[0] - '0'); tb[0] >= '1' && tb[0] <= '5' && tb[1] == 0 && rm < mtu {
		mtu = rm
	}
	return agreed, mtu, nil
}

// close disconnects the exchange (waiting a little for DISCONNECTED) and frees it.
func (m *perfCMComm) close() error {
	if m.closed {
		return nil
	}
	m.closed = true
	if m.id != nil {
		perfCMDisconnect(&m.ev, []*rdmacm.ID{m.id})
		m.id.Destroy()
	}
	var errs []error
	if m.q != nil {
		if err := m.q.Destroy(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, c := range []roce.CompletionQueue{m.scq, m.rcq} {
		if c != nil {
			errs = append(errs, m.dev.DestroyCQ(c))
		}
	}
	bufFree := true
	if m.mr != nil {
		err := m.mr.Dereg()
		errs = append(errs, err)
		bufFree = err == nil
	}
	if m.buf != nil && bufFree {
		errs = append(errs, m.dev.FreeBuffer(m.buf))
		m.buf = nil
	}
	if m.pd != nil {
		errs = append(errs, m.pd.Dealloc())
	}
	m.ev.ch.Close()
	return errors.Join(errs...)
}

// perfCMDisconnect disconnects ids (rdma_disconnect; an ID whose peer disconnected first
// answers nothing more) and waits, at most perfCMCloseWait in all, for their DISCONNECTED.
func perfCMDisconnect(ev *perfCMEvents, ids []*rdmacm.ID) {
	pending := map[*rdmacm.ID]bool{}
	for _, id := range ids {
		if id != nil && id.Disconnect() == nil {
			pending[id] = true
		}
	}
	deadline := time.Now().Add(perfCMCloseWait)
	for len(pending) > 0 {
		left := time.Until(deadline)
		if left <= 0 {
			return
		}
		e, err := ev.next(context.Background(), left, func(e rdmacm.Event) bool {
			return pending[e.ID] && e.Type == rdmacm.EventDisconnected
		})
		if err != nil {
			return
		}
		delete(pending, e.ID)
	}
}
