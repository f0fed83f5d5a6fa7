package qp

import "sync/atomic"

// writeCount counts the RDMA WRITE messages a responder executed.
type writeCount struct{ n atomic.Uint64 }

// RemoteWrites returns how many RDMA WRITE messages (with or without immediate) this QP
// has executed as a responder since it left RESET: a message counts once its last packet's
// payload is in memory (IBTA 9.4.3 / 9.7.4: placement completes in PSN order, the last
// packet last). RDMA WRITE without immediate produces no completion at the target, so
// applications that poll memory for a peer's WRITE (perftest's ib_write_lat polls the last
// byte of its buffer) load this counter first: the atomic load orders their read after the
// placement of every counted message, without a data race on the buffer.
func (q *QP) RemoteWrites() uint64 { return q.resp.writes.n.Load() }
