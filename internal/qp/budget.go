package qp

import (
	"sync"
	"sync/atomic"
)

// In-flight budgets. Each RC requester keeps at most MaxUnackedPSNs request packets
// unacknowledged (IBTA 9.7: the PSN window). A Budget bounds them over a group of QPs as
// well — the daemon gives each user one — so a program with four QPs keeps as much data in
// flight as a program with one, not four times as much, and the bandwidth of a shared
// bottleneck (the link, the peer's receive path) is split between programs rather than QPs:
//
//   - A QP's charge is its requester's outstanding PSNs (req.psn - comp.psn on RC in RTS or
//     SQD, 0 otherwise): what it sent and has not seen acknowledged, READ responses included
//     (a READ takes one PSN per response packet, IBTA 9.7.1). UC and UD QPs have no window and
//     are not charged.
//   - A QP may start a packet while its own charge is below the floor (limit/8, at least 1)
//     or the group's total is below the limit. The floor keeps every QP moving when its
//     siblings hold the budget — one QP of a group retrying towards a dead peer holds its
//     charge until it gives up, and the others go on at the floor's pace meanwhile.
//   - Under a budget a requester asks for an ACK at least every floor packets (ackEvery), so
//     the ACKs it waits for always bring its own charge back below the floor.
//   - A QP stopped by the budget registers as a waiter. When any QP of the group gives back
//     charge (an ACK, a go-back-N rewind, an error, a reset, destroy), the longest waiting is
//     woken through its own timer (a zero-delay expiry: onTimer runs its requester under its
//     own lock; the waker never takes another QP's lock) and tries again: one that finds the
//     budget taken waits again, at the end; one that leaves room wakes the next.
//
// The total may go above the limit by less than one floor per QP: a packet is started when the
// check passed. A READ chunk (up to 128 response PSNs, readChunk) is charged whole when its
// request leaves, so it is checked whole (budgetOKRead): it fits in the room left, or its QP
// has nothing in flight and the group is below the limit — over it by a chunk (more only when
// QPs on different goroutines check at the same instant).
// Accounting is one atomic add per packet sent and per ACK that advances; nothing allocates
// per packet (the waiter list grows to the group's QP count once).

// Budget is an in-flight budget shared by a group of RC QPs (Config.Budget). Create it with
// NewBudget; it is safe for concurrent use.
type Budget struct {
	limit int64
	floor int64
	used  atomic.Int64
	waits atomic.Uint64
	nwait atomic.Int32
	mu    sync.Mutex
	wait  []*QP // waiters (mu)
}

// NewBudget returns a budget of limit request packets (PSNs) in flight over its QPs; limit < 1
// is 1.
func NewBudget(limit int) *Budget {
	l := int64(max(limit, 1))
	return &Budget{limit: l, floor: max(l/8, 1)}
}

// Limit is the budget's limit in PSNs.
func (b *Budget) Limit() int { return int(b.limit) }

// InFlight is the PSNs its QPs have in flight now.
func (b *Budget) InFlight() int { return int(b.used.Load()) }

// Waits counts the times one of its QPs stopped to wait for the budget.
func (b *Budget) Waits() uint64 { return b.waits.Load() }

// ackEvery is how many request packets in a row may go without AckReq: PktsPerAck, or under a
// budget its floor. A QP the budget stops has its charge at the floor or above; the ACK of its
// last AckReq then brings that below the floor, so it always gets to go on (its own window
// needs no such rule: PktsPerAck divides MaxUnackedPSNs).
func (q *QP) ackEvery() int {
	if b := q.cfg.Budget; b != nil && b.floor < PktsPerAck {
		return int(b.floor)
	}
	return PktsPerAck
}

// budgetState is a QP's part in its Budget.
type budgetState struct {
	charged int64       // PSNs charged to the budget (q.mu)
	waiting bool        // registered in the budget's waiters (q.mu)
	t       Timer       // the QP's timer, for wakers (set once at New)
	woken   atomic.Bool // a waker took q off the waiters and asked for a run of its requester (wake, onTimer)
}

// budgetCharge is what q should have charged now (q.mu held).
func (q *QP) budgetCharge() int64 {
	if q.typ != TypeRC || q.dead || (q.state != StateRTS && q.state != StateSQD) {
		return 0
	}
	n := int64(q.req.psn.Sub(q.comp.psn))
	if n < 0 {
		return 0
	}
	return n
}

// budgetSync brings q's charge up to date (q.mu held); a charge that shrank wakes the waiters.
func (q *QP) budgetSync() {
	b := q.cfg.Budget
	if b == nil {
		return
	}
	n := q.budgetCharge()
	d := n - q.bud.charged
	if d == 0 {
		return
	}
	q.bud.charged = n
	b.used.Add(d)
	if d < 0 && b.nwait.Load() > 0 {
		b.wake(q)
	}
}

// budgetOK reports whether q may start its next request packet (q.mu held): its charge is
// below the floor or the group's below the limit. false registers q as a waiter.
func (q *QP) budgetOK() bool {
	b := q.cfg.Budget
	if b == nil {
		return true
	}
	q.budgetSync()
	if q.bud.charged < b.floor || b.used.Load() < b.limit {
		q.budgetGo()
		return true
	}
	return q.budgetWait()
}

// budgetOKRead reports whether q may request a READ chunk of n response PSNs (q.mu held),
// charged whole: if it fits in the group's room, or q has nothing in flight and the group is
// below its limit (one chunk over it at most, and never a starved READ). A QP with packets
// in flight that finds no room waits for its own responses and ACKs, which run its requester
// again, and registers as no one's waiter: a waiter must be able to go on whenever the group
// is below its limit, or wakes would be handed round in vain (budgetPass).
func (q *QP) budgetOKRead(n uint32) bool {
	b := q.cfg.Budget
	if b == nil {
		return true
	}
	q.budgetSync()
	used := b.used.Load()
	if used+int64(n) <= b.limit || q.bud.charged == 0 && used < b.limit {
		q.budgetGo()
		return true
	}
	if q.bud.charged > 0 {
		return false
	}
	return q.budgetWait()
}

// budgetFor is the check for the first packet of w: budgetOKRead for a READ's first chunk,
// budgetOK otherwise.
func (q *QP) budgetFor(w *sendWQE) bool {
	if kindOf(w.wr.Opcode) != kindRead || q.cfg.Budget == nil {
		return q.budgetOK()
	}
	n := uint32(1)
	if w.length > q.mtu {
		n = (w.length + q.mtu - 1) / q.mtu
	}
	return q.budgetOKRead(min(n, readChunk))
}

// budgetGo: q goes on; it is no waiter any more (its own ACKs let it go on before a wake).
func (q *QP) budgetGo() {
	if q.bud.waiting {
		q.budgetLeave()
	}
}

// budgetWait registers q as a waiter (q.mu held) and reports false, or true if the group fell
// below its limit meanwhile.
func (q *QP) budgetWait() bool {
	b := q.cfg.Budget
	if q.bud.woken.Swap(false) {
		q.bud.waiting = false // a wake this check answers: the waker dropped q from its list
	}
	if !q.bud.waiting {
		q.bud.waiting = true
		b.waits.Add(1)
		b.mu.Lock()
		b.wait = append(b.wait, q)
		b.nwait.Store(int32(len(b.wait)))
		b.mu.Unlock()
		// A charge given back between the check and the registration woke nobody: look again.
		if b.used.Load() < b.limit {
			q.budgetLeave()
			return true
		}
	}
	return false
}

// budgetRelease gives back q's whole charge and leaves the waiters (q.mu held): the QP left
// RTS/SQD or was destroyed.
func (q *QP) budgetRelease() {
	b := q.cfg.Budget
	if b == nil {
		return
	}
	if q.bud.waiting {
		q.budgetLeave()
	}
	q.bud.woken.Store(false)
	if q.bud.charged != 0 {
		b.used.Add(-q.bud.charged)
		q.bud.charged = 0
		if b.nwait.Load() > 0 {
			b.wake(q)
		}
	}
}

// budgetLeave takes q off the waiters (q.mu held; q.bud.waiting).
func (q *QP) budgetLeave() {
	b := q.cfg.Budget
	q.bud.waiting = false
	b.mu.Lock()
	for i, w := range b.wait {
		if w == q { // (in order: the first is the longest waiting)
			copy(b.wait[i:], b.wait[i+1:])
			b.wait[len(b.wait)-1] = nil
			b.wait = b.wait[:len(b.wait)-1]
			break
		}
	}
	b.nwait.Store(int32(len(b.wait)))
	b.mu.Unlock()
}

// budgetWoken takes a waker's request (q.mu held): the QP is no longer a waiter and its
// requester is to run. It reports whether there was one.
func (q *QP) budgetWoken() bool {
	if q.cfg.Budget == nil || !q.bud.woken.Swap(false) {
		return false
	}
	q.bud.waiting = false
	return true
}

// budgetPass hands room in the budget that q's last run left unused on to a waiter (q.mu held;
// rearm, after every run of a QP): a QP woken for a charge given back may have taken less than
// that, and the next waiter need not wait for another ACK.
func (q *QP) budgetPass() {
	if b := q.cfg.Budget; b != nil && b.nwait.Load() > 0 && b.used.Load() < b.limit {
		b.wake(q)
	}
}

// wake wakes the longest-waiting waiter other than self (whose lock the caller holds; it runs
// its requester after its own ACK anyway) with a zero-delay expiry of its timer; the waiter
// goes on with what it finds, and passes on what it leaves (budgetPass).
func (b *Budget) wake(self *QP) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, w := range b.wait {
		if w == self {
			continue
		}
		copy(b.wait[i:], b.wait[i+1:])
		b.wait[len(b.wait)-1] = nil
		b.wait = b.wait[:len(b.wait)-1]
		b.nwait.Store(int32(len(b.wait)))
		w.bud.woken.Store(true)
		w.bud.t.Reset(0)
		return
	}
}
