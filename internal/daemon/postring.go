package daemon

import (
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/pkg/roce"
)

// postRing is a session's post ring (proto.PostRing): the client writes its
// asynchronous posts into shared memory and rings the doorbell eventfd only
// when the drainer sleeps; the drainer goroutine validates and posts each
// record exactly as it would the same message from the socket.
type postRing struct {
	r      *proto.PostRing
	mem    []byte
	bell   *os.File // the daemon's copy of the doorbell eventfd
	bellFD int      // its descriptor, for refill's wakeup (written under session.parkMu)
	buf    []byte   // private copy of the record being decoded
	cost   usage    // charged to the client's user (limits.go)
	broken bool
	done   chan struct{}
}

// evRing is a session's asynchronous event ring (proto.EventRing) and the
// eventfd that tells the client about new events; guarded by session.evMu
// (events arrive from engine goroutines).
type evRing struct {
	r       *proto.EventRing
	fd      int
	dropped uint64
}

// openPostRing creates the ring memfd and the doorbell (OpOpenPostRing);
// the returned fds (memfd, doorbell) go to the client and are closed after
// sending. Called with postMu held.
func (ss *session) openPostRing() (wire.OpenRingsResp, []int, error) {
	var resp wire.OpenRingsResp
	if ss.ring != nil {
		return resp, nil, fmt.Errorf("%w: post ring already open", proto.ErrProtocol)
	}
	size := int64(proto.RoundPage(proto.EventRingOff + proto.EventRingBytes))
	cost := usage{resFDs: 2, resMappings: 1, resMappedBytes: size, resEngineBytes: size}
	if err := ss.charge(cost); err != nil {
		return resp, nil, err
	}
	ok := false
	defer func() {
		if !ok {
			ss.release(cost)
		}
	}()
	memfd, mem, err := proto.NewMemfd("softroce-post", proto.EventRingOff+proto.EventRingBytes)
	if err != nil {
		return resp, nil, err
	}
	r, _ := proto.NewPostRing(mem, false)
	bell, err := proto.NewEventFD()
	if err != nil {
		proto.CloseFD(memfd)
		proto.Unmap(mem)
		return resp, nil, err
	}
	evfd, err := proto.NewEventFD()
	if err != nil {
		proto.CloseFD(memfd)
		proto.CloseFD(bell)
		proto.Unmap(mem)
		return resp, nil, err
	}
	fdsOut, err := dupAll(memfd, bell, evfd)
	proto.CloseFD(memfd)
	if err != nil {
		proto.CloseFD(bell)
		proto.CloseFD(evfd)
		proto.Unmap(mem)
		return resp, nil, err
	}
	er, _ := proto.NewEventRing(mem[proto.EventRingOff:], true)
	ss.evMu.Lock()
	ss.ev = &evRing{r: er, fd: evfd}
	ss.evMu.Unlock()
	ok = true
	pr := &postRing{r: r, mem: mem, bell: proto.EventFile(bell, "softroce-post-bell"), bellFD: bell, done: make(chan struct{}), cost: cost}
	ss.ring = pr
	ss.parkMu.Lock()
	ss.parkRing = pr
	ss.parkMu.Unlock()
	ss.s.mapped.Add(int64(len(mem)))
	go ss.drainLoop(pr)
	return wire.OpenRingsResp{Bytes: uint32(len(mem)), PostData: proto.PostRingData, EventOff: proto.EventRingOff,
		EventCap: proto.EventRingCap, MaxRecord: proto.MaxPostRecord}, fdsOut, nil
}

// Fair service between clients (docs/daemon.md "Fair service"). A client's drainer works in
// turns: one turn posts at most drainTurnRecords records or drainTurnBytes bytes of send
// payload (the engine sends what a post lets it at once, on the drainer's goroutine), then the
// drainer gives up its turn token and the processor. At most Server.turns drainers hold a
// token at a time (GOMAXPROCS-1 by default: the device's receive path always has a processor
// drainers do not take), and a drainer waiting for a token queues behind those already
// waiting (a channel's waiters are served in order). So however fast one client fills its
// ring, every other client with records gets a turn between two of its turns, and packets are
// received meanwhile.
const (
	drainTurnRecords = 32
	drainTurnBytes   = 256 << 10
)

// drainLoop drains the ring whenever the doorbell rings, in turns (above); after each turn
// it runs the refills the engine asked for that the turn made due (unparkDue). While it
// drains, the ring's awake flag tells the client not to ring; before sleeping it clears the
// flag and looks once more (proto.PostRing's doorbell rule). The engine's refill requests
// (refill) ring the same doorbell. A corrupt ring disconnects the client.
func (ss *session) drainLoop(pr *postRing) {
	defer close(pr.done)
	spin := ss.s.postSpin
	// Each doorbell is an edge in the Go poller; the eventfd is not read
	// (proto.WaitLoop: no system call per wakeup). It returns when
	// stopRing closes the doorbell, or here on a corrupt ring.
	proto.WaitLoop(pr.bell, func(bool) bool {
		if ss.s.drainPaused.Load() {
			// test knob: the client's doorbells are ignored, the engine's refills served
			if ss.refillWanted() {
				ss.postMu.Lock()
				err := ss.drainLocked()
				ss.postMu.Unlock()
				ss.unparkDue()
				return err != nil
			}
			return false
		}
		for {
			// postMu first: waiting for it delays this client only, and a token holder
			// never waits for anything but its own turn's work.
			ss.postMu.Lock()
			ss.s.turns <- struct{}{}
			pr.r.SetAwake(1)
			more, err := ss.drain(drainTurnRecords, drainTurnBytes)
			<-ss.s.turns
			ss.postMu.Unlock()
			ss.unparkDue()
			if err != nil {
				return true
			}
			if more {
				ss.s.drainYields.Add(1)
				runtime.Gosched() // the others' turns, the receive path
				continue
			}
			// Stay awake a little: a client re-posting as completions arrive
			// then needs no doorbell, and this goroutine no wakeup.
			if spin > 0 && spinFor(spin, pr.r.Pending) {
				continue
			}
			if pr.r.Sleep() {
				return false // wait for the doorbell
			}
		}
	})
}

// spinFor polls ready, yielding the processor between looks, for at most d.
func spinFor(d time.Duration, ready func() bool) bool {
	t0 := time.Now()
	for time.Since(t0) < d {
		if ready() {
			return true
		}
		runtime.Gosched()
	}
	return ready()
}

// maxRingRecords is the most records a post ring holds at once.
const maxRingRecords = proto.PostRingData / 8

// drainLocked posts the records in the ring, in order (postMu held): every record published
// before the call (a full ring's worth, so a client refilling it meanwhile cannot keep the
// caller here). A socket request drains this way first, so posts keep their order.
func (ss *session) drainLocked() error {
	_, err := ss.drain(maxRingRecords, -1)
	return err
}

// drain posts up to maxRecords records of the ring, stopping early once maxBytes bytes of
// send payload were posted (-1: no byte bound), in order (postMu held); more reports that
// records are left. Each record is one asynchronous post message, checked as on the socket
// (handle of this client, WR encoding, then the engine's own checks: PD of every lkey, sizes,
// queue room). Anything else marks the ring broken and closes the connection (the session's
// cleanup follows).
func (ss *session) drain(maxRecords int, maxBytes int64) (more bool, err error) {
	pr := ss.ring
	if pr == nil {
		return false, nil
	}
	if pr.broken {
		return false, proto.ErrRingCorrupt
	}
	var bytes int64
	for n := 0; ; n++ {
		if n == maxRecords || maxBytes >= 0 && bytes >= maxBytes {
			return pr.r.Pending(), nil
		}
		msg, err := pr.r.Next(&pr.buf)
		if err == nil && msg == nil {
			return false, nil
		}
		if err == nil {
			ss.s.ringPosts.Add(1)
			h, _, _ := proto.ParseHdr(msg)
			switch h.Op {
			case wire.OpPostSendAsync:
				bytes += ss.postSendAsync(msg)
				continue
			case wire.OpPostRecvAsync:
				ss.postRecvAsync(msg)
				continue
			}
			err = fmt.Errorf("%w: op %d in the post ring", proto.ErrRingCorrupt, h.Op)
		}
		pr.broken = true
		ss.s.badPosts.Add(1)
		ss.s.limitedLog("badring", "post ring: disconnecting client", "client", ss.id, "err", err)
		if ss.conn != nil {
			ss.conn.Close()
		}
		return false, err
	}
}

// stopRing stops the drainer (closing the doorbell ends its wait), drains
// what the client published last (so asynchronous posts sent before a
// shutdown reach the engine) and unmaps the ring. postMu must not be held.
func (ss *session) stopRing(drain bool) {
	pr := ss.ring
	if pr == nil {
		return
	}
	ss.parkMu.Lock()
	ss.parkRing = nil // refill answers false from now on, and signals no more (bell closes below)
	ss.parkMu.Unlock()
	ss.evMu.Lock()
	if ss.ev != nil {
		proto.CloseFD(ss.ev.fd)
		ss.ev = nil
	}
	ss.evMu.Unlock()
	pr.bell.Close()
	<-pr.done
	ss.postMu.Lock()
	pr.r.Close() // the client's later posts fail (proto.ErrDisconnected)
	if drain {
		ss.drainLocked()
	}
	ss.ring = nil
	ss.postMu.Unlock()
	ss.unparkDue() // the packets held for this ring run now
	proto.Unmap(pr.mem)
	ss.s.mapped.Add(-int64(len(pr.mem)))
	ss.release(pr.cost)
}

// pushEvent forwards an asynchronous event to the client (any goroutine;
// never blocks). A full event ring drops it.
func (ss *session) pushEvent(e proto.Event) {
	ss.evMu.Lock()
	defer ss.evMu.Unlock()
	if ss.ev == nil {
		return
	}
	if !ss.ev.r.Put(e) {
		ss.ev.dropped++
		ss.s.droppedEvents.Add(1)
		ss.s.limitedLog("dropevent", "event ring full: event dropped", "client", ss.id, "type", e.Type.String(), "dropped", ss.ev.dropped)
		return
	}
	proto.Signal(ss.ev.fd)
}

// recvRefillOff disables the RecvRefill hook (a test knob: SetRecvRefillDisabled in
// export_test.go).
var recvRefillOff atomic.Bool

// refill is the engine's RecvRefill hook (qp.Config) on every QP of the session without an
// SRQ: a packet that consumes a receive WQE, and passed the QP's own checks, found the QP's
// receive queue empty. The client may have published receives in the post ring before its
// peer sent that packet (PostRecv returned, then the program told the peer to send), so the
// engine must not decide "no receive WQE" (RNR NAK on RC, a dropped message on UC and UD)
// before those are posted. It runs on the device's receive goroutine, shared by every client,
// so it never drains the ring and never waits for postMu (the drainer may hold it as long as
// the client keeps its ring full, a socket request for as long as the request takes):
//
//   - if postMu is free and nothing is published but not consumed, no receive is on its way:
//     false, the engine answers the packet now;
//   - otherwise the QP holds the packet (true), the session notes the QP and the ring tail
//     published so far, and rings the drainer's doorbell. Once the ring is consumed up to that
//     tail (drainer passes, socket requests, stopRing), unparkDue calls the QP's Refilled on
//     that client goroutine, which executes the held packets.
//
// A stopped ring answers false.
func (ss *session) refill(q *roce.QP) bool {
	if recvRefillOff.Load() {
		return false
	}
	ss.parkMu.Lock()
	defer ss.parkMu.Unlock()
	pr := ss.parkRing
	if pr == nil {
		return false
	}
	if ss.postMu.TryLock() {
		pending := pr.r.Pending()
		ss.postMu.Unlock()
		if !pending {
			return false
		}
	}
	ss.parkAt = pr.r.Tail()
	ss.parked = append(ss.parked, q)
	ss.s.refills.Add(1)
	proto.Signal(pr.bellFD) // bellFD stays open while parkRing is set (stopRing)
	return true
}

// refillWanted reports whether QPs hold packets for a refill.
func (ss *session) refillWanted() bool {
	ss.parkMu.Lock()
	defer ss.parkMu.Unlock()
	return len(ss.parked) > 0
}

// unparkDue runs the refills the engine asked for once the ring has been consumed up to the
// tail published when they were asked (or the ring stopped): each QP's Refilled executes its
// held packets, on the calling client goroutine. postMu must not be held.
func (ss *session) unparkDue() {
	ss.unparkMu.Lock()
	defer ss.unparkMu.Unlock()
	ss.parkMu.Lock()
	if len(ss.parked) == 0 || (ss.parkRing != nil && int64(ss.parkAt-ss.parkRing.r.Consumed()) > 0) {
		ss.parkMu.Unlock()
		return
	}
	ss.parked, ss.unparking = ss.unparking[:0], ss.parked
	ss.parkMu.Unlock()
	for i, q := range ss.unparking {
		q.Refilled()
		ss.unparking[i] = nil
	}
	ss.unparking = ss.unparking[:0]
}
