// Package cq implements completion queues (IBTA 11.4.2, ibv_create_cq / ibv_poll_cq /
// ibv_req_notify_cq semantics).
//
// Locking: one short mutex guards the ring and the notification state. Push (producers: the
// transport engine, from any goroutine) and Poll (the consumer) each hold it for one copy.
// Events go out on a 1-buffered channel with a non-blocking send, so neither side ever blocks
// on the other. Neither Push nor Poll allocates.
package cq

import (
	"errors"
	"sync"
	"time"

	"github.com/softroce/softroce/internal/clock"
	"github.com/softroce/softroce/internal/event"
)

// Status is a work completion status in ibv_wc_status numbering (IBTA 11.4.2.1 table 134).
type Status uint8

// Completion statuses.
const (
	StatusSuccess        Status = 0
	StatusLocLenErr      Status = 1
	StatusLocQPOpErr     Status = 2
	StatusLocEECOpErr    Status = 3
	StatusLocProtErr     Status = 4
	StatusWRFlushErr     Status = 5
	StatusMWBindErr      Status = 6
	StatusBadRespErr     Status = 7
	StatusLocAccessErr   Status = 8
	StatusRemInvReqErr   Status = 9
	StatusRemAccessErr   Status = 10
	StatusRemOpErr       Status = 11
	StatusRetryExcErr    Status = 12
	StatusRNRRetryExcErr Status = 13
	StatusLocRDDViolErr  Status = 14
	StatusRemInvRDReqErr Status = 15
	StatusRemAbortErr    Status = 16
	StatusInvEECNErr     Status = 17
	StatusInvEECStateErr Status = 18
	StatusFatalErr       Status = 19
	StatusRespTimeoutErr Status = 20
	StatusGeneralErr     Status = 21
)

// statusStr is the ibv_wc_status_str table (libibverbs enum_strs.c).
var statusStr = [...]string{
	StatusSuccess:        "success",
	StatusLocLenErr:      "local length error",
	StatusLocQPOpErr:     "local QP operation error",
	StatusLocEECOpErr:    "local EE context operation error",
	StatusLocProtErr:     "local protection error",
	StatusWRFlushErr:     "Work Request Flushed Error",
	StatusMWBindErr:      "memory management operation error",
	StatusBadRespErr:     "bad response error",
	StatusLocAccessErr:   "local access error",
	StatusRemInvReqErr:   "remote invalid request error",
	StatusRemAccessErr:   "remote access error",
	StatusRemOpErr:       "remote operation error",
	StatusRetryExcErr:    "transport retry counter exceeded",
	StatusRNRRetryExcErr: "RNR retry counter exceeded",
	StatusLocRDDViolErr:  "local RDD violation error",
	StatusRemInvRDReqErr: "remote invalid RD request",
	StatusRemAbortErr:    "aborted error",
	StatusInvEECNErr:     "invalid EE context number",
	StatusInvEECStateErr: "invalid EE context state",
	StatusFatalErr:       "fatal error",
	StatusRespTimeoutErr: "response timeout error",
	StatusGeneralErr:     "general error",
}

// String returns the ibv_wc_status_str text, e.g. "transport retry counter exceeded".
func (s Status) String() string {
	if int(s) < len(statusStr) {
		return statusStr[s]
	}
	return "unknown"
}

// Opcode is a work completion opcode in ibv_wc_opcode numbering.
type Opcode uint8

// Work completion opcodes.
const (
	OpSend            Opcode = 0
	OpRDMAWrite       Opcode = 1
	OpRDMARead        Opcode = 2
	OpCompSwap        Opcode = 3
	OpFetchAdd        Opcode = 4
	OpBindMW          Opcode = 5
	OpLocalInv        Opcode = 6
	OpFlush           Opcode = 8   // IBV_WC_FLUSH (IBTA 1.5 memory placement)
	OpAtomicWrite     Opcode = 9   // IBV_WC_ATOMIC_WRITE
	OpRecv            Opcode = 128 // IBV_WC_RECV: receive completions have bit 7 set
	OpRecvRDMAWithImm Opcode = 129
)

// String returns the ibv_wc_opcode name without the IBV_WC_ prefix.
func (o Opcode) String() string {
	switch o {
	case OpSend:
		return "SEND"
	case OpRDMAWrite:
		return "RDMA_WRITE"
	case OpRDMARead:
		return "RDMA_READ"
	case OpCompSwap:
		return "COMP_SWAP"
	case OpFetchAdd:
		return "FETCH_ADD"
	case OpBindMW:
		return "BIND_MW"
	case OpLocalInv:
		return "LOCAL_INV"
	case OpFlush:
		return "FLUSH"
	case OpAtomicWrite:
		return "ATOMIC_WRITE"
	case OpRecv:
		return "RECV"
	case OpRecvRDMAWithImm:
		return "RECV_RDMA_WITH_IMM"
	}
	return "UNKNOWN"
}

// Flags are ibv_wc_flags.
type Flags uint8

// Work completion flags.
const (
	FlagGRH     Flags = 1 // IBV_WC_GRH: the first 40 bytes of the receive buffer hold a GRH
	FlagWithImm Flags = 2 // IBV_WC_WITH_IMM: ImmData is valid
	FlagWithInv Flags = 8 // IBV_WC_WITH_INV: InvalidatedRKey is valid
)

// WC is a work completion (struct ibv_wc).
type WC struct {
	WRID      uint64
	Status    Status
	Opcode    Opcode
	VendorErr uint32
	ByteLen   uint32
	// ImmData is the immediate value as read big-endian from the wire (ImmDt, IBTA 9.3.7).
	ImmData         uint32
	InvalidatedRKey uint32
	QPNum           uint32
	SrcQP           uint32
	Flags           Flags
	PKeyIndex       uint16
	SLID            uint16
	SL              uint8
	DLIDPathBits    uint8
}

// Errors returned by this package.
var (
	// ErrCapacity: Options.Capacity out of range.
	ErrCapacity = errors.New("cq: capacity out of range")
	// ErrCQError: the CQ overflowed and is in the error state (IBTA 11.4.2.1: CQ overrun).
	ErrCQError = errors.New("cq: in error state (overrun)")
	// ErrClosed: the CQ was destroyed.
	ErrClosed = errors.New("cq: destroyed")
)

// MaxCapacity bounds Options.Capacity (the device's max_cqe may be smaller).
const MaxCapacity = 1 << 22

// Options configures New.
type Options struct {
	// Capacity is the number of CQEs the ring holds (ibv_create_cq cqe), 1..MaxCapacity.
	Capacity int
	// Events receives asynchronous events (CQ_ERR on overrun). Nil drops them.
	Events event.Sink
	// OnPush, if set, is offered each pushed completion before the CQ stores it (see PushHook).
	OnPush PushHook
	// AfterPush, if set with OnPush, runs after each completion the hook took, once the CQ's
	// lock is released (see SetPushHooks).
	AfterPush func()
	// Clock times the moderation period (SetModeration); nil = the real clock.
	Clock Clock
}

// Clock is the source of time for event moderation (internal/clock's Clock, the same type as the
// engine's qp.Clock; tests inject a fake one).
type Clock = clock.Clock

// Timer is a stoppable, resettable one-shot timer made by a Clock (internal/clock's Timer).
type Timer = clock.Timer

// RealClock is the Clock backed by package time (internal/clock's Real).
type RealClock = clock.Real

// Moderation is completion event moderation (ibv_modify_cq with IBV_CQ_ATTR_MODERATE,
// struct ibv_moderate_cq): instead of at the first completion that matches its arm, an armed
// CQ fires its event once Count completions are queued (unpolled) or PeriodUS microseconds
// after the first matching completion that did not fire it, whichever comes first. The zero
// value (and Count 1) is no moderation: the first matching completion fires, as IBTA
// 11.4.2.2 describes. Count > 1 with PeriodUS 0 has no time bound: the event waits for Count
// completions.
//
// What a completion "matches" is unchanged (ReqNotify: any completion when armed for the
// next one; a solicited or unsuccessful one when armed for solicited): a matching completion
// starts the moderation, and from then on every completion counts towards Count.
type Moderation struct {
	// Count is cq_count: the event fires when this many completions are queued.
	Count uint16
	// PeriodUS is cq_period in microseconds: the event fires at the latest this long after
	// the first matching completion that did not fire it.
	PeriodUS uint16
}

// Active reports whether m delays events (Count > 1).
func (m Moderation) Active() bool { return m.Count > 1 }

// Period is PeriodUS as a duration.
func (m Moderation) Period() time.Duration { return time.Duration(m.PeriodUS) * time.Microsecond }

// PushHook lets a consumer take completions as they are produced instead of polling them
// (the softroce daemon writes them straight into a client's shared-memory ring). It is called
// with the CQ's lock held, only while the CQ holds no queued completion (so completions keep
// their order) and is neither in error nor destroyed. Returning true delivers the completion:
// the CQ neither stores it nor fires its notification (the hook owner notifies its consumer;
// solicited is the Solicited Event bit, IBTA 9.2.3 / 11.4.2.2). Returning false (e.g. the
// consumer's ring is full) stores it in the CQ as usual; drain those with PollFunc. The hook
// must not block and must not call back into the CQ.
type PushHook func(wc *WC, solicited bool) bool

type notifyMode uint8

const (
	notifyNone notifyMode = iota
	notifyNext
	notifySolicited
)

// CQ is a fixed-capacity completion queue. Safe for concurrent producers and consumers.
type CQ struct {
	mu     sync.Mutex
	ring   []WC
	head   int // next slot to poll
	n      int // entries queued
	notify notifyMode
	err    bool
	closed bool
	ch     chan struct{}
	done   chan struct{} // closed by Destroy (ends Wait)
	sink   event.Sink
	// Moderation state (SetModeration): trig = a matching completion arrived since the arm
	// and did not fire the event; timer = the lazy period timer (ModTimer; Due = a moderated
	// event is due).
	mod   Moderation
	timer ModTimer
	trig  bool
	hook  PushHook
	after func()
	// afterMu is read-held by each running AfterPush call, so SetPushHooks can wait for them.
	afterMu sync.RWMutex
}

// New creates a CQ.
func New(o Options) (*CQ, error) {
	if o.Capacity < 1 || o.Capacity > MaxCapacity {
		return nil, ErrCapacity
	}
	clk := o.Clock
	if clk == nil {
		clk = RealClock{}
	}
	c := &CQ{ring: make([]WC, o.Capacity), ch: make(chan struct{}, 1), done: make(chan struct{}),
		sink: o.Events, hook: o.OnPush, after: o.AfterPush}
	c.timer.Bind(clk, c.expire)
	return c, nil
}

// SetModeration sets the CQ's event moderation (ibv_modify_cq, IBV_CQ_ATTR_MODERATE); the
// zero Moderation turns it off. It applies from the next completion on. Completions a push
// hook takes are the hook owner's to moderate (the softroce daemon moderates its client's
// ring the same way).
func (c *CQ) SetModeration(m Moderation) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	c.mod = m
	if !m.Active() || m.PeriodUS == 0 {
		c.timer.Stop()
	}
	return nil
}

// Moderation returns the CQ's event moderation.
func (c *CQ) Moderation() Moderation {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mod
}

// expire is the period timer's callback: the moderated event fires if it is due and the CQ
// is still armed with a matching completion unreported; a period not yet over is
// re-scheduled (ModTimer.Expire). A stale call (the event already fired) changes nothing.
func (c *CQ) expire() {
	c.mu.Lock()
	if c.closed || !c.timer.Expire() {
		c.mu.Unlock()
		return
	}
	fire := c.notify != notifyNone && c.trig
	if fire {
		c.notify = notifyNone
		c.trig = false
	}
	c.mu.Unlock()
	if fire {
		c.raise()
	}
}

// raise sends the event (events coalesce like a completion channel).
func (c *CQ) raise() {
	select {
	case c.ch <- struct{}{}:
	default: // an event is already pending
	}
}

// SetOnPush installs (or, with nil, removes) the push hook of Options.OnPush, with no
// AfterPush. When it returns, no call of the previous hook is running.
func (c *CQ) SetOnPush(h PushHook) { c.SetPushHooks(h, nil) }

// SetPushHooks installs (or, with nils, removes) the push hook and its AfterPush: after, if
// not nil, runs after each completion h took, outside the CQ's lock, so the hook owner can
// wake its consumer (a system call) without holding the lock. h records what to do, after
// does it. after must not block and must not call back into the CQ. When SetPushHooks
// returns, no call of the previous h or after is running.
func (c *CQ) SetPushHooks(h PushHook, after func()) {
	c.mu.Lock()
	c.hook, c.after = h, after
	c.mu.Unlock()
	c.afterMu.Lock()
	//lint:ignore SA2001 the empty section waits for the AfterPush calls already running
	c.afterMu.Unlock()
}

// PollFunc offers the queued completions, oldest first, to f until f returns false or none is
// left, and returns how many f took. It runs under the CQ's lock, so no Push interleaves: a
// push hook's consumer uses it to move completions the hook refused, keeping their order.
// f must not block and must not call back into the CQ.
func (c *CQ) PollFunc(f func(wc *WC) bool) int {
	c.mu.Lock()
	k := 0
	for c.n > 0 && f(&c.ring[c.head]) {
		c.head++
		if c.head == len(c.ring) {
			c.head = 0
		}
		c.n--
		k++
	}
	c.mu.Unlock()
	return k
}

// Cap returns the capacity.
func (c *CQ) Cap() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.ring)
}

// Resize changes the capacity to n (ibv_resize_cq; the Resize Completion Queue verb of IBTA
// chapter 11), keeping every queued completion, in order. n out of 1..MaxCapacity, or fewer
// than the completions queued, is ErrCapacity (ibverbs EINVAL); ErrClosed once destroyed. The
// error state of an overrun stays.
func (c *CQ) Resize(n int) error { return c.ResizeFunc(n, nil) }

// ResizeFunc is Resize with swap, which runs under the CQ's lock first, with the number of
// completions the CQ keeps: no push hook call, PollFunc or Push runs meanwhile, so a push hook
// owner swaps its consumer's storage there (the softroce daemon moves a client's ring). An
// error from swap aborts the resize and is returned. swap must not call back into the CQ.
func (c *CQ) ResizeFunc(n int, swap func(kept int) error) error {
	if n < 1 || n > MaxCapacity {
		return ErrCapacity
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	if n < c.n {
		return ErrCapacity
	}
	if swap != nil {
		if err := swap(c.n); err != nil {
			return err
		}
	}
	if n == len(c.ring) {
		return nil
	}
	ring := make([]WC, n)
	for i := 0; i < c.n; i++ {
		ring[i] = c.ring[(c.head+i)%len(c.ring)]
	}
	c.ring, c.head = ring, 0
	return nil
}

// Len returns the number of completions waiting to be polled.
func (c *CQ) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// Err returns ErrCQError after an overrun, ErrClosed after Destroy, else nil.
func (c *CQ) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
		return ErrClosed
	case c.err:
		return ErrCQError
	}
	return nil
}

// Push appends a completion (called by the engine, any goroutine). solicited tells whether the
// completed message carried the Solicited Event bit (IBTA 9.2.3); it matters only for a CQ
// armed with ReqNotify(true). Push returns false if the CQ is full or in error: the CQ then
// enters the error state (IBTA 11.4.2.1 "CQ overrun"; ibverbs IBV_EVENT_CQ_ERR) and, the
// first time, raises an event.CQErr to Options.Events. The completion is not stored.
func (c *CQ) Push(wc *WC, solicited bool) bool {
	c.mu.Lock()
	if c.closed || c.err || c.n == len(c.ring) {
		first := !c.err && !c.closed
		c.err = true
		c.mu.Unlock()
		if first && c.sink != nil {
			c.sink(event.Event{Type: event.CQErr, Object: c})
		}
		return false
	}
	i := c.head + c.n
	if i >= len(c.ring) {
		i -= len(c.ring)
	}
	c.ring[i] = *wc
	// The hook sees the CQ's own copy, so the caller's wc does not escape (no allocation).
	if c.n == 0 && c.hook != nil && c.hook(&c.ring[i], solicited) {
		after := c.after
		if after == nil {
			c.mu.Unlock()
			return true
		}
		c.afterMu.RLock()
		c.mu.Unlock()
		after()
		c.afterMu.RUnlock()
		return true
	}
	c.n++
	fire := false
	switch c.notify {
	case notifyNext:
		c.trig = true
	case notifySolicited:
		// IBTA 11.4.2.2: in solicited mode the next solicited completion, or the next
		// unsuccessful one, generates the event.
		c.trig = c.trig || solicited || wc.Status != StatusSuccess
	}
	if c.trig {
		// Moderation (ibv_modify_cq): Count queued completions, or the period.
		switch {
		case !c.mod.Active() || c.n >= int(c.mod.Count):
			fire = true
			c.notify = notifyNone
			c.trig = false
			c.timer.Stop()
		case c.mod.PeriodUS > 0 && !c.timer.Due():
			c.timer.Start(c.mod.Period())
		}
	}
	c.mu.Unlock()
	if fire {
		c.raise()
	}
	return true
}

// Poll moves up to len(dst) completions, oldest first, into dst and returns how many. It
// never allocates and never blocks.
func (c *CQ) Poll(dst []WC) int {
	c.mu.Lock()
	k := min(len(dst), c.n)
	for j := 0; j < k; j++ {
		dst[j] = c.ring[c.head]
		c.head++
		if c.head == len(c.ring) {
			c.head = 0
		}
	}
	c.n -= k
	c.mu.Unlock()
	return k
}

// ReqNotify arms the CQ (ibv_req_notify_cq): the next completion added after this call
// (solicitedOnly=false), or the next solicited or unsuccessful completion (solicitedOnly=true),
// sends one event on Channel and disarms the CQ; call ReqNotify again for the next event.
// Arming for "next" while armed for "solicited" upgrades the arm (IBTA 11.4.2.2). Completions
// already queued do not fire: poll the CQ after arming to close the race, as with ibverbs.
func (c *CQ) ReqNotify(solicitedOnly bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	if c.err {
		return ErrCQError
	}
	if c.notify == notifyNone {
		c.trig = false // a new arm: completions already queued do not count as its trigger
	}
	if solicitedOnly {
		if c.notify == notifyNone {
			c.notify = notifySolicited
		}
	} else {
		c.notify = notifyNext
	}
	return nil
}

// Channel returns the completion event channel (one buffered event, like an
// ibv_comp_channel with ibv_get_cq_event). Receive from it in a select; events coalesce.
func (c *CQ) Channel() <-chan struct{} { return c.ch }

// Wait blocks the calling goroutine until the CQ's completion event (ibv_get_cq_event on a
// channel of its own): the event ReqNotify armed, consumed from Channel. It returns ErrClosed
// once the CQ is destroyed. Use either Wait or Channel for a CQ, not both at once.
func (c *CQ) Wait() error {
	select {
	case <-c.ch:
		return nil
	case <-c.done:
		return ErrClosed
	}
}

// Destroy marks the CQ destroyed: later Push and ReqNotify fail. The channel is not closed,
// so a select on it simply never fires again.
func (c *CQ) Destroy() {
	c.mu.Lock()
	if !c.closed {
		close(c.done)
	}
	c.closed = true
	c.notify = notifyNone
	c.timer.Close()
	c.mu.Unlock()
}
