package cm

import "time"

// Pending requests. A REQ (or SIDR_REQ) for a listened service creates a connection in
// REQ_RCVD that waits for its consumer's Accept or Reject (IBTA 12.9). Nothing proves the
// request came from where it says: a sender can forge any number of them (RoCEv2 has no
// source authentication), and each costs state. So a pending request does not wait forever:
//
//   - It expires once its sender must have given up: the active side waits
//     RemoteCMResponseTimeout + 2 x PacketLifeTime for the REP, and resends the REQ
//     MaxCMRetries times (IBTA 12.4, 12.6.5); after (MaxCMRetries+1) such waits a REP would
//     find nobody. An MRA the consumer sends asks the active side for ServiceTimeout more
//     (IBTA 12.6.6), and the expiry moves accordingly. Whatever the request asks for, the
//     wait is capped at Options.MaxREQWait: a forged REQ can claim 31 (2.4 hours) and 15
//     retries.
//   - At most Options.MaxPendingREQs requests wait at once; a new one first expires the
//     oldest, so a flood keeps the newest requests, not the first ones.
//
// An expired request is answered with a REJ (reason Timeout, our CA GUID as the ARI, as the
// active side does when it gives up) and its consumer gets UNREACHABLE with ErrTimeout; a
// SIDR request is forgotten (its consumer gets UNREACHABLE).

// Defaults of Options.MaxREQWait and Options.MaxPendingREQs.
const (
	// DefaultMaxREQWait covers rdma_cm's own requests (response timeout 20 = 4.3 s, 15
	// retries: 69 s) with room for the packet lifetime.
	DefaultMaxREQWait     = 75 * time.Second
	DefaultMaxPendingREQs = 4096
)

func (m *Manager) maxREQWait() time.Duration {
	if m.o.MaxREQWait > 0 {
		return m.o.MaxREQWait
	}
	return DefaultMaxREQWait
}

// reqWait is how long the active side of a REQ waits for a response of ours in all: each of
// its 1 + MaxCMRetries attempts waits the response timeout plus a round trip (IBTA 12.4),
// capped at maxREQWait.
func (m *Manager) reqWait(respTimeout, retries, plt uint8) time.Duration {
	per := CMTimeout(respTimeout) + 2*CMTimeout(plt)
	d := per * time.Duration(int(retries&15)+1)
	if max := m.maxREQWait(); d > max || d <= 0 {
		d = max
	}
	return d
}

// pend registers c as a pending passive request and arms its expiry, first expiring the
// oldest pending request if MaxPendingREQs are waiting already (m.mu held).
func (m *Manager) pend(c *Conn, wait time.Duration) {
	max := m.o.MaxPendingREQs
	if max <= 0 {
		max = DefaultMaxPendingREQs
	}
	for m.npend >= max && m.pendHead != nil {
		m.expireREQ(m.pendHead)
	}
	c.pendPrev, c.pendNext = m.pendTail, nil
	if m.pendTail != nil {
		m.pendTail.pendNext = c
	} else {
		m.pendHead = c
	}
	m.pendTail = c
	c.pendIn = true
	m.npend++
	m.arm(c, wait)
}

// unpend removes c from the pending requests, if it is one (m.mu held): it was accepted,
// rejected, destroyed or expired.
func (m *Manager) unpend(c *Conn) {
	if !c.pendIn {
		return
	}
	if c.pendPrev != nil {
		c.pendPrev.pendNext = c.pendNext
	} else {
		m.pendHead = c.pendNext
	}
	if c.pendNext != nil {
		c.pendNext.pendPrev = c.pendPrev
	} else {
		m.pendTail = c.pendPrev
	}
	c.pendPrev, c.pendNext, c.pendIn = nil, nil, false
	m.npend--
}

// expireREQ gives up a pending request (m.mu held): REJ(Timeout) for a REQ, nothing for a
// SIDR_REQ, and UNREACHABLE to its consumer.
func (m *Manager) expireREQ(c *Conn) {
	if !c.ud {
		var ari [8]byte
		be.PutUint64(ari[:], m.o.CAGUID)
		m.sendREJ(c, RejTimeout, ari[:], nil)
		m.qpErr(c)
	}
	m.toIdle(c)
	m.stats.Expired++
	m.event(c, Event{Type: EventUnreachable, Err: ErrTimeout})
}

// PendingREQs returns the number of received requests (REQ, SIDR_REQ) waiting for their
// consumer's answer.
func (m *Manager) PendingREQs() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.npend
}
