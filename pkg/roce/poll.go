package roce

import (
	"errors"
	"net"
	"sync"

	"github.com/softroce/softroce/pkg/link"
)

// Polled mode (Options.Polled, UDPOptions.Polled): run to completion on the application's
// goroutine, the model of perftest and of kernel rxe's softirq (docs/api.md "Polled mode").
//
// The device starts no receive goroutine. Device.Poll makes one non-blocking read of each link
// (link.PollReceiver: one recvmmsg on a UDP socket), and checks and dispatches what it read on
// the caller's goroutine exactly as a receive worker does (handle: parse, GID, ICRC, QPN, then
// qp.QP.ReceiveDeferred). What the batch produced — the responder's ACKs, READ responses, the
// requests a received ACK let through — stays queued in each QP's burst instead of leaving at
// the end of the batch: the next PostSend on that QP sends it together with the new request
// (an ACK of the peer's WRITE and our next WRITE in one sendmmsg), and the next Poll sends
// whatever is still queued before it reads (qp.QP.FlushReceived). IBTA 9.7.5.1 lets a
// responder delay its ACK (and coalesce ACKs); here the delay is at most one turn of the
// application's poll loop, microseconds against the peer's millisecond ACK timeout. Destroy
// and Close send what is queued.
//
// One goroutine polls at a time (Poll serialises callers). An application that stops calling
// Poll stops receiving: nothing is read, and deferred packets wait for its next post or Poll
// (or the QP's timer). The transport timers still run on the clock's goroutines.
//
// The loop itself reads the clock once per non-empty read (the ACK timer's "now"); the flush of
// what the previous Poll left queued reads it only when a QP's timer needs the flush's time
// (the timers are re-armed from the flush's time, not the read's). It allocates nothing and
// never parks or yields: when the links are empty and nothing is queued Poll returns 0 without
// reading the clock.

// ErrNotPolled: Poll was called on a device opened without Options.Polled.
var ErrNotPolled = errors.New("roce: device not in polled mode")

// pollState is the polled mode's receive scratch (one per device, used under mu).
type pollState struct {
	// mu serialises Polls (and closePoll): the device's one link's receive lock when that link
	// is a link.LockedPollReceiver (one lock per Poll instead of the device's and the link's),
	// else own.
	mu     *sync.Mutex
	own    sync.Mutex
	locked link.LockedPollReceiver // the one link, read with TryRecvLocked under mu; or nil
	rx     rxState
	links  []link.PollReceiver // d.links as PollReceivers
	batch  []link.Datagram
	bufs   [][]byte
	// used is how many batch entries the last read filled (a link may have pointed them at its
	// own memory): only those are pointed back at bufs before the next read, so an empty Poll
	// touches no entry.
	used int
}

// initPoll checks that every link can be polled and allocates the receive batch.
func (d *Device) initPoll() error {
	p := &pollState{}
	bs := 1
	for _, l := range d.links {
		pr, ok := l.(link.PollReceiver)
		if !ok {
			return errors.Join(ErrInvalidArg, errors.New("roce: polled mode needs links that implement link.PollReceiver"))
		}
		p.links = append(p.links, pr)
		bs = max(bs, l.BatchSize())
	}
	p.mu = &p.own
	if len(d.links) == 1 {
		if lp, ok := d.links[0].(link.LockedPollReceiver); ok {
			p.mu, p.locked = lp.RecvMutex(), lp
		}
	}
	p.batch = make([]link.Datagram, bs)
	p.bufs = make([][]byte, bs)
	for i := range p.bufs {
		p.bufs[i] = make([]byte, link.MaxDatagram)
		p.batch[i].Buf = p.bufs[i]
	}
	d.pl = p
	return nil
}

// Polled reports whether the device was opened in polled mode (Options.Polled).
func (d *Device) Polled() bool { return d.pl != nil }

// Poll is the polled mode's receive step (Options.Polled), called in a loop by the
// application's goroutine: it sends what the previous Poll's packets left queued on their QPs
// (deferred ACKs and responses), makes one non-blocking read of each link, and checks and
// hands every datagram read to its QP on the calling goroutine. Completions are then in the
// CQs, RDMA WRITEs in memory (qp.QP.RemoteWrites), and the ACKs and responses they produced
// queued on their QPs until the QP's next PostSend or the next Poll. It returns the number of
// datagrams read (0: the links were empty; Poll never waits). Concurrent calls are serialised.
// Errors: ErrNotPolled, ErrClosed (after Close), or a link's read error.
func (d *Device) Poll() (int, error) {
	p := d.pl
	if p == nil {
		return 0, ErrNotPolled
	}
	// no defer on the empty spin of the application's wait loop (BenchmarkPollEmpty): nothing
	// between Lock and the Unlocks below panics on remote input; the steps that run
	// application code (handle: CQ hooks, RecvRefill, CM handlers; the flush) release the lock
	// if that code panics (pollGuard)
	p.mu.Lock()
	if d.closed.Load() {
		p.mu.Unlock()
		return 0, ErrClosed
	}
	if p.rx.npending > 0 {
		d.flushGuarded(p) // the previous Poll's deferred packets
	}
	for _, s := range d.scheds {
		if s.count.Load() > 0 {
			d.schedGuarded(p, s) // one turn for each QP with READ responses to send (sched.go)
		}
	}
	total := 0
	for _, l := range p.links {
		batch := p.batch
		for k := 0; k < p.used; k++ {
			batch[k].Buf = p.bufs[k]
		}
		p.used = 0
		var n int
		var err error
		if p.locked != nil {
			n, err = p.locked.TryRecvLocked(batch) // p.mu is the link's receive lock
		} else {
			n, err = l.TryRecv(batch)
		}
		p.used = n
		if err != nil {
			p.mu.Unlock()
			if d.closed.Load() || errors.Is(err, net.ErrClosed) {
				return total, ErrClosed
			}
			d.cnt.LinkDowned.Add(1)
			return total, err
		}
		if n == 0 {
			continue
		}
		p.rx.now = d.clock.Now() // one clock read per non-empty read
		d.handleGuarded(p, batch[:n])
		total += n
	}
	p.mu.Unlock()
	return total, nil
}

// pollGuard releases p.mu when a panic unwinds out of a Poll step that runs application code
// (done still false): a panic the application recovers from must not leave the link's receive
// lock held, which would hang every later Poll, Recv and Close.
func (p *pollState) pollGuard(done *bool) {
	if !*done {
		p.mu.Unlock()
	}
}

// handleGuarded hands the datagrams of one read to handle (p.mu held; released on a panic).
func (d *Device) handleGuarded(p *pollState, batch []link.Datagram) {
	done := false
	defer p.pollGuard(&done)
	for k := range batch {
		d.handle(&p.rx, &batch[k])
	}
	done = true
}

// flushGuarded is flushPolled for Poll (p.mu held; released on a panic).
func (d *Device) flushGuarded(p *pollState) {
	done := false
	defer p.pollGuard(&done)
	d.flushPolled()
	done = true
}

// schedGuarded is respSched.round for Poll (p.mu held; released on a panic: a held request a
// turn executes may call the application's refill hook).
func (d *Device) schedGuarded(p *pollState, s *respSched) {
	done := false
	defer p.pollGuard(&done)
	s.round()
	done = true
}

// closePoll sends what the last Poll left queued (Close, before the links close; the device
// is marked closed already, so no Poll starts after this).
func (d *Device) closePoll() {
	p := d.pl
	if p == nil {
		return
	}
	p.mu.Lock()
	d.flushPolled()
	p.mu.Unlock()
}

// flushPolled sends what the last Poll left queued on its QPs (p.mu held). Each QP's ACK timer
// (IBTA 9.7.6.1.3) is re-armed from the time of the flush, not of the read that queued the
// packets: qp.QP.FlushDeferred reads the clock after sending, and only if the timer needs it
// (in a ping-pong the application's PostSend has sent the deferred ACK and started the timer
// already, so this reads no clock).
func (d *Device) flushPolled() {
	rx := &d.pl.rx
	for i := 0; i < rx.npending; i++ {
		rx.pending[i].FlushDeferred()
		rx.pending[i] = nil
	}
	rx.npending = 0
}
