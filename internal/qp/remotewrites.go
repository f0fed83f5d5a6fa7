package qp

import "sync/atomic"

// writeCount counts the RDMA WRITE messages a responder executed and wakes a
// RemoteWriteNotify waiter.
type writeCount struct {
	n  atomic.Uint64
	ch atomic.Pointer[chan struct{}]
	// shared: the write responders this QP had since RESET (writes.go); their WRITEs count
	shared atomic.Pointer[[]WriteState]
}

// done counts one executed WRITE message (called after its last byte is placed).
func (w *writeCount) done() {
	w.n.Add(1)
	if p := w.ch.Load(); p != nil {
		select {
		case *p <- struct{}{}:
		default: // an event is pending already: events coalesce
		}
	}
}

// RemoteWrites returns how many RDMA WRITE messages (with or without immediate) this QP
// has executed as a responder since it left RESET: a message counts once its last packet's
// payload is in memory (IBTA 9.4.3 / 9.7.4: placement completes in PSN order, the last
// packet last). RDMA WRITE without immediate produces no completion at the target, so
// applications that poll memory for a peer's WRITE (perftest's ib_write_lat polls the last
// byte of its buffer) load this counter first: the atomic load orders their read after the
// placement of every counted message, without a data race on the buffer.
//
// WRITEs a write responder outside the engine executed (Config.Writes, writes.go) count too;
// they do not wake RemoteWriteNotify (nothing in the process runs for them).
func (q *QP) RemoteWrites() uint64 { return q.resp.writes.n.Load() + q.resp.writes.sharedWrites() }

// RemoteWriteNotify returns a channel that receives after RemoteWrites moves (one buffered
// event; events coalesce, like cq.CQ.Channel), so a memory poller can sleep until a WRITE
// lands instead of spinning. Check RemoteWrites after taking the channel and before each
// wait: a WRITE in between leaves its event pending. A transition to RESET forgets the
// channel (call RemoteWriteNotify again after it).
func (q *QP) RemoteWriteNotify() <-chan struct{} {
	q.mu.Lock()
	defer q.mu.Unlock()
	if p := q.resp.writes.ch.Load(); p != nil {
		return *p
	}
	c := make(chan struct{}, 1)
	q.resp.writes.ch.Store(&c)
	return c
}
