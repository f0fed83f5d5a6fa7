package qp

import (
	"net/netip"
	"time"

	"github.com/softroce/softroce/internal/cc"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
)

// Congestion control in the QP (docs/congestion.md; the state machines are internal/cc's):
//
//   - ECN: what an RC or UC QP sends leaves ECN-capable, the IP header's ECN field ECT(0) with
//     the address vector's DSCP kept (IBTA A17.9.1, RFC 3168), unless the QP's ecn parameter
//     is off: requests, ACKs (as a ConnectX marks the whole DCQCN priority; a polled QP's
//     [ACK, WRITE] pair stays one GSO message), CNPs (DSCP np_cnp_dscp). READ responses, which
//     the pacer does not hold, keep the address vector's byte, and so do UD and QP1.
//   - Notification point: the device hands a CE-marked packet's QP to NoteCE before the packet
//     itself; an RC/UC QP whose peer sent it answers with a CNP to the peer's QP (IBTA A17.9.3:
//     BTH opcode 0x81, BECN, the reserved bytes, from the QP's source port, DSCP np_cnp_dscp with
//     ECT(0)), at most one per np_min_time_between_cnps (cc.NP).
//   - Reaction point: ReceiveCNP gives a CNP to the QP's DCQCN state (cc.RP), whose rate, with
//     the QP's rate limit (AttrRateLimit, kbit/s: ibv_modify_qp_rate_limit), sets the pacer
//     (cc.Pacer): the lower of the two, or none.
//   - Pacing: the requester asks the pacer before each request packet; held, it stops, and the
//     QP's one timer (timers.go) wakes it when the pacer allows the next packet. The packet
//     before such a pause asks for an ACK (AckReq, IBTA 9.7.5.1 lets the requester set it on
//     any packet), so a paced message's ACKs keep the ACK timer from expiring. Packets count
//     their IP bytes: the UDP payload and the UDP and IP headers.
//
// No per-packet clock read while a QP is unlimited: the pacer and DCQCN's lazy timers read the
// clock once per requester run, and only when limited; the rate measurement a first CNP starts
// from takes its time from received ACKs.

// congestion is a QP's congestion control state (under q.mu).
type congestion struct {
	p     cc.Params
	rp    cc.RP
	np    cc.NP
	pacer cc.Pacer
	limit float64 // the rate limit, bit/s (0: none)
	line  float64 // the device's line rate, bit/s

	held   bool      // the pacer stopped the requester; it may go on at paceAt
	paceAt time.Time // when the pacer allows the next packet
	run    uint32    // requester runs: the clock is read once per run (now, nowRun)
	nowRun uint32
	now    time.Time
}

// DefaultLineRate is the line rate of a device that does not know its own: DCQCN's maximum
// rate (docs/congestion.md).
const DefaultLineRate = 100e9

// CCState is a snapshot of a QP's congestion control (QP.CongestionState).
type CCState struct {
	Limited   bool    // DCQCN holds the QP to Rate
	Rate      float64 // DCQCN's current rate RC, bit/s (0: not limited)
	Target    float64 // DCQCN's target rate RT, bit/s
	Alpha     float64 // DCQCN's α
	RateLimit float64 // the QP's rate limit, bit/s (0: none)
	Pace      float64 // the rate the pacer holds the QP to, bit/s (0: none)
}

// initCC starts the QP's congestion control from its configuration (New).
func (q *QP) initCC() {
	p := cc.Defaults()
	if q.cfg.CC != nil {
		p = *q.cfg.CC
	}
	q.cc.p = p
	q.cc.line = q.cfg.LineRate
	if q.cc.line <= 0 {
		q.cc.line = DefaultLineRate
	}
	q.resetCC()
}

// resetCC returns DCQCN and the pacer to their initial state (New, RESET); the rate limit stays.
func (q *QP) resetCC() {
	q.cc.rp.Init(&q.cc.p, q.cc.line)
	q.cc.np = cc.NP{}
	q.cc.pacer = cc.Pacer{}
	q.cc.held = false
	q.ccRate()
}

// ccRate sets the pacer to the lower of DCQCN's rate and the rate limit.
func (q *QP) ccRate() {
	r := q.cc.rp.Rate()
	if l := q.cc.limit; l > 0 && (r == 0 || l < r) {
		r = l
	}
	q.cc.pacer.SetRate(r)
}

// connected reports whether the QP has a peer QP to notify (RC, UC).
func (q *QP) connected() bool { return q.typ == TypeRC || q.typ == TypeUC }

// ecnCapable reports whether the QP's requests carry ECT(0).
func (q *QP) ecnCapable() bool { return q.cc.p.ECN && q.connected() }

// ccNow returns the time of the current requester run, reading the clock at most once per run.
func (q *QP) ccNow() time.Time {
	if q.cc.nowRun != q.cc.run || q.cc.now.IsZero() {
		q.cc.now = q.cfg.Clock.Now()
		q.cc.nowRun = q.cc.run
	}
	return q.cc.now
}

// paceHold reports whether the pacer holds the next request packet; if so the requester stops
// and the timer wakes it at paceAt.
func (q *QP) paceHold() bool {
	if !q.cc.pacer.Limited() && !q.cc.rp.Limited() {
		q.cc.held = false
		return false
	}
	now := q.ccNow()
	if q.cc.rp.Limited() {
		q.cc.rp.Advance(now) // DCQCN's timer increases, lazily
		q.ccRate()
	}
	at, ok := q.cc.pacer.Next(now)
	if ok {
		q.cc.held = false
		return false
	}
	q.cc.held, q.cc.paceAt = true, at
	return true
}

// paceSent accounts a request packet of n bytes (UDP payload) on path and reports whether the
// pacer will hold the next one: the packet then asks for an ACK.
func (q *QP) paceSent(n int, path *Path) (pauseNext bool) {
	n += ipUDPHeaders(path)
	q.cc.rp.OnSent(n)
	if !q.cc.pacer.Limited() {
		return false
	}
	now := q.ccNow()
	q.cc.pacer.Sent(now, n)
	q.tmr.lastPaced = now
	_, ok := q.cc.pacer.Next(now)
	return !ok
}

// ipUDPHeaders is the IP and UDP header bytes a packet on path carries.
func ipUDPHeaders(path *Path) int {
	if path.Dst.Is4() {
		return 20 + 8
	}
	return 40 + 8
}

// ecnTClass returns the IP TOS / traffic class byte of a packet on path: ECT(0) with the
// path's DSCP on an ECN-capable QP.
func (q *QP) ecnTClass(path *Path) uint8 {
	if q.ecnCapable() {
		return path.TClass&^link.ECNMask | link.ECNECT0
	}
	return path.TClass
}

// NoteCE tells the QP a CE-marked packet (IBTA A17.9.1) from src arrived for it at now, before
// the packet itself is received: the notification point. It reports whether a CNP was queued
// (the caller flushes the QP, as after ReceiveDeferred: FlushReceived). A CNP goes only to the
// peer of a connected QP that is up (RTR, RTS, SQD) and only for a packet from that peer.
func (q *QP) NoteCE(now time.Time, src netip.AddrPort) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead || !q.connected() || src.Addr().Unmap() != q.path.Dst {
		return false
	}
	switch q.state {
	case StateRTR, StateRTS, StateSQD:
	default:
		return false
	}
	if !q.cc.np.Mark(now, &q.cc.p) {
		return false
	}
	q.sendCNP()
	q.cnt.NPCNPSent.Add(1)
	return true
}

// sendCNP queues a CNP to the peer QP (IBTA A17.9.3; the bytes of bth.CNP.Encode).
func (q *QP) sendCNP() {
	buf := q.txBuf()
	clear(buf[bth.BTHSize : bth.BTHSize+bth.CNPResvSize])
	q.finishTC(buf, bth.OpCNP, false, false, q.attr.DestQPN, 0, bth.BTHSize+bth.CNPResvSize, 0, &q.path,
		cc.CNPTClass(&q.cc.p))
	// the BECN bit lives in BTH byte 4, which the ICRC does not cover (A17.3.3): set after it
	bth.BTH(buf).SetBECN(true)
}

// ReceiveCNP gives the QP a CNP (IBTA A17.9.3) from src, received at now: the reaction point.
// A connected QP in RTS or SQD whose peer sent it takes it into DCQCN (rp_cnp_handled; the rate
// cut applies to its next request packets); otherwise, or with DCQCN off, it is counted as
// rp_cnp_ignored.
func (q *QP) ReceiveCNP(now time.Time, src netip.AddrPort) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead || !q.connected() || src.Addr().Unmap() != q.path.Dst || (q.state != StateRTS && q.state != StateSQD) ||
		!q.cc.rp.OnCNP(now) {
		q.cnt.RPCNPIgnored.Add(1)
		return
	}
	q.cnt.RPCNPHandled.Add(1)
	q.ccRate()
}

// CongestionState returns a snapshot of the QP's congestion control.
func (q *QP) CongestionState() CCState {
	q.mu.Lock()
	defer q.mu.Unlock()
	return CCState{
		Limited: q.cc.rp.Limited(), Rate: q.cc.rp.Rate(), Target: q.cc.rp.Target(), Alpha: q.cc.rp.Alpha(),
		RateLimit: q.cc.limit, Pace: q.cc.pacer.Rate(),
	}
}

// CCParams returns the QP's congestion control parameters.
func (q *QP) CCParams() cc.Params {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.cc.p
}
