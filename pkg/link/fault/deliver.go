package fault

// A direction's second half: what process decided is delivered here — emitted at once,
// held until a deadline (delays, reordering), or queued for the receiver — and the batches
// to the inner link, the timer that releases held datagrams, the receive pump and close.
// dir.go has the first half: the per-datagram draws and decisions.

import (
	"net"
	"net/netip"

	"github.com/softroce/softroce/pkg/link"
)

// emit appends a datagram to the outgoing list; pb (if not nil) is returned to the pool once the
// datagram has been handed on.
func (d *dir) emit(buf []byte, pb *pbuf, src, dst netip.AddrPort, tclass uint8) {
	d.out = append(d.out, link.Datagram{Buf: buf, Src: src, Dst: dst, TClass: tclass})
	d.outPB = append(d.outPB, pb)
}

// hold inserts h keeping d.held sorted by deadline, after entries with the same deadline.
func (d *dir) hold(h held) {
	i := len(d.held)
	for i > 0 && d.held[i-1].deadline.After(h.deadline) {
		i--
	}
	d.held = append(d.held, held{})
	copy(d.held[i+1:], d.held[i:])
	d.held[i] = h
	d.rearm()
}

// tick counts one datagram going out (a fresh one, or a delayed one the clock releases) past the
// held ones, and releases the reordered ones whose count reaches zero (in held order), right
// after it.
func (d *dir) tick() {
	released := false
	j := 0
	for i := range d.held {
		h := d.held[i]
		if h.count > 0 {
			h.count--
			if h.count == 0 {
				d.release(&h)
				released = true
				continue
			}
		}
		d.held[j] = h
		j++
	}
	if released {
		clear(d.held[j:])
		d.held = d.held[:j]
		d.rearm()
	}
}

func (d *dir) release(h *held) {
	d.stats.Released++
	d.event(Release, h.seq, h.rule, h.pb.b, 0, 0, 0)
	d.emit(h.pb.b, h.pb, h.src, h.dst, h.tclass)
}

// rearm points the direction's one timer at the earliest deadline.
func (d *dir) rearm() {
	if d.closed {
		return
	}
	if len(d.held) == 0 {
		if d.armed {
			d.timer.Stop()
			d.armed = false
		}
		return
	}
	first := d.held[0].deadline
	if d.armed && first.Equal(d.armedAt) {
		return
	}
	wait := max(first.Sub(d.clock.Now()), 0)
	if d.timer == nil {
		d.timer = d.clock.AfterFunc(wait, d.onTimer)
	} else {
		d.timer.Reset(wait)
	}
	d.armed, d.armedAt = true, first
}

// fire is the timer callback: it releases every held datagram whose deadline has come.
func (d *dir) fire() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return
	}
	d.armed = false
	now := d.clock.Now()
	for len(d.held) > 0 && !d.held[0].deadline.After(now) {
		h := d.held[0]
		m := copy(d.held, d.held[1:])
		d.held[m] = held{}
		d.held = d.held[:m]
		d.release(&h)
		if h.count == 0 {
			// a delayed datagram going out passes the reordered ones, like a fresh one
			d.tick()
		}
	}
	d.rearm()
	if d.which == DirSend {
		_ = d.flushSend() // counted in stats; a timer has nobody to report to
	} else {
		d.flushRecv()
	}
}

// flushSend hands d.out to the inner link and recycles the pooled buffers.
func (d *dir) flushSend() error {
	if len(d.out) == 0 {
		return nil
	}
	err := d.l.inner.Send(d.out)
	if err == nil {
		d.stats.Delivered += uint64(len(d.out))
	} else {
		d.stats.Errors++
	}
	for i := range d.out {
		if d.outPB[i] != nil {
			d.put(d.outPB[i])
		}
		d.out[i] = link.Datagram{}
		d.outPB[i] = nil
	}
	d.out = d.out[:0]
	d.outPB = d.outPB[:0]
	return err
}

// flushRecv moves d.out into the ready queue (copying datagrams still in the pump's buffers).
func (d *dir) flushRecv() {
	if len(d.out) == 0 {
		return
	}
	for i := range d.out {
		pb := d.outPB[i]
		if pb == nil {
			pb = d.get(d.out[i].Buf)
		}
		d.push(readyEnt{pb: pb, src: d.out[i].Src, dst: d.out[i].Dst, tclass: d.out[i].TClass})
		d.out[i] = link.Datagram{}
		d.outPB[i] = nil
	}
	d.stats.Delivered += uint64(len(d.out))
	d.out = d.out[:0]
	d.outPB = d.outPB[:0]
	d.notEmpty.Broadcast()
}

func (d *dir) push(e readyEnt) {
	if d.rcount == len(d.ready) {
		grown := make([]readyEnt, 2*len(d.ready)+1)
		for i := 0; i < d.rcount; i++ {
			grown[i] = d.ready[(d.rhead+i)%len(d.ready)]
		}
		d.ready, d.rhead = grown, 0
	}
	d.ready[(d.rhead+d.rcount)%len(d.ready)] = e
	d.rcount++
}

func (d *dir) sendBatch(batch []link.Datagram) error {
	if !d.active {
		err := d.l.inner.Send(batch)
		if err == nil {
			d.ptSeen.Add(uint64(len(batch)))
			d.ptDelivered.Add(uint64(len(batch)))
		}
		return err
	}
	if err := d.l.validate(batch); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return net.ErrClosed
	}
	d.haveNow = false
	for i := range batch {
		d.process(&batch[i])
	}
	return d.flushSend()
}

func (d *dir) recvBatch(batch []link.Datagram) (int, error) {
	if !d.active {
		n, err := d.l.inner.Recv(batch)
		if n > 0 {
			d.ptSeen.Add(uint64(n))
			d.ptDelivered.Add(uint64(n))
		}
		return n, err
	}
	if len(batch) == 0 {
		return 0, nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, net.ErrClosed
	}
	for d.rcount == 0 && !d.closed && d.pumpErr == nil {
		d.notEmpty.Wait()
	}
	if d.closed {
		return 0, net.ErrClosed
	}
	if d.rcount == 0 {
		return 0, d.pumpErr
	}
	n := 0
	for n < len(batch) && d.rcount > 0 {
		e := &d.ready[d.rhead]
		b := batch[n].Buf[:cap(batch[n].Buf)]
		c := copy(b, e.pb.b)
		batch[n].Buf = b[:c]
		batch[n].Src = e.src
		batch[n].Dst = e.dst
		batch[n].TClass = e.tclass
		d.put(e.pb)
		*e = readyEnt{}
		d.rhead = (d.rhead + 1) % len(d.ready)
		d.rcount--
		n++
	}
	d.notFull.Broadcast()
	return n, nil
}

// pump reads the inner link, applies the receive faults and queues the survivors for Recv.
func (d *dir) pump() {
	defer d.l.pumps.Done()
	n := min(max(d.l.inner.BatchSize(), 1), 64)
	rb := make([]link.Datagram, n)
	for i := range rb {
		rb[i].Buf = make([]byte, link.MaxDatagram)
	}
	for {
		for i := range rb {
			rb[i].Buf = rb[i].Buf[:cap(rb[i].Buf)]
		}
		k, err := d.l.inner.Recv(rb)
		d.mu.Lock()
		if d.closed {
			d.mu.Unlock()
			return
		}
		if err != nil {
			d.pumpErr = err
			d.notEmpty.Broadcast()
			d.mu.Unlock()
			return
		}
		d.haveNow = false
		for i := 0; i < k; i++ {
			d.process(&rb[i])
		}
		d.flushRecv()
		for d.rcount >= d.qmax && !d.closed {
			d.notFull.Wait()
		}
		d.mu.Unlock()
	}
}

// close stops the timer and frees everything held or queued.
func (d *dir) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return
	}
	d.closed = true
	if d.timer != nil {
		d.timer.Stop()
	}
	d.armed = false
	for i := range d.held {
		h := &d.held[i]
		d.stats.Discarded++
		d.event(Discard, h.seq, h.rule, h.pb.b, 0, 0, 0)
		d.put(h.pb)
	}
	clear(d.held)
	d.held = d.held[:0]
	for d.rcount > 0 {
		e := &d.ready[d.rhead]
		d.stats.Discarded++
		d.put(e.pb)
		*e = readyEnt{}
		d.rhead = (d.rhead + 1) % len(d.ready)
		d.rcount--
	}
	d.free = nil
	d.notEmpty.Broadcast()
	d.notFull.Broadcast()
}

func (d *dir) statsSnapshot() DirStats {
	d.mu.Lock()
	s := d.stats
	s.Held = uint64(len(d.held))
	d.mu.Unlock()
	s.Seen += d.ptSeen.Load()
	s.Delivered += d.ptDelivered.Load()
	return s
}

func (d *dir) heldLen() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.held)
}

func (d *dir) queuedLen() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.rcount
}
