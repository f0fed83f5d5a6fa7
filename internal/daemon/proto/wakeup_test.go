package proto

import (
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
)

// wakeTimeout bounds every wait of the lost-wakeup tests: a lost wakeup is
// permanent, so the test fails at the first wait that exceeds it instead of
// hanging.
const wakeTimeout = 20 * time.Second

func wakeRounds() int {
	switch {
	case testing.Short():
		return 2000
	case raceOn:
		return 5000
	}
	return 20000
}

// edges forwards each write of the eventfd f (after WaitLoop's first call)
// to a one-slot channel; the returned func closes f and waits for the loop.
func edges(t *testing.T, fd int) (<-chan struct{}, func()) {
	f := EventFile(fd, "test-eventfd")
	ch := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		WaitLoop(f, func(woken bool) bool {
			if woken {
				select {
				case ch <- struct{}{}:
				default:
				}
			}
			return false
		})
	}()
	return ch, func() { f.Close(); <-done }
}

// TestNotifyNoLostWakeup: the completion ring's notification rule under
// racing threads. Each round the client arms awake, lets the daemon publish
// one completion (after a random delay), polls, watches the arm a random
// while, then sleeps (Ring.Sleep) and waits for the notify eventfd (through
// WaitLoop, which never reads it). The daemon publishes, then Fire, and
// signals only a sleeping client. Whatever the interleaving, the client
// learns of the completion: by polling it, by seeing the arm taken, by
// Sleep refusing, or by the signal — never by waiting forever. Without the
// compare-and-swap in Sleep (set "sleeping" and re-check in one step), a
// completion taken between the client's last look and its sleep is never
// signalled and the round times out.
func TestNotifyNoLostWakeup(t *testing.T) {
	mem := make([]byte, RingBytes(8))
	daemon, _ := NewRing(mem, 8)
	client, _ := NewRing(mem, 8)
	fd, err := NewEventFD()
	if err != nil {
		t.Fatal(err)
	}
	sig, stop := edges(t, fd)
	defer stop()

	// Rounds are handed over through atomics, not channels, so both sides
	// run at once (a channel handoff would mostly let one finish first).
	var started, fired, signals atomic.Int64
	startKick, firedKick := make(chan struct{}, 1), make(chan struct{}, 1)
	delays := make([]int, wakeRounds())
	rng := rand.New(rand.NewPCG(9, 9))
	for i := range delays {
		delays[i] = rng.IntN(300)
	}
	quit := make(chan time.Time)
	go func() { // the daemon: deliver's publish-then-Fire
		var wc cq.WC
		var tail uint64
		for r := int64(0); r < int64(len(delays)); r++ {
			if !waitFor(func() bool { return started.Load() > r }, startKick, quit) {
				return
			}
			busy(delays[r])
			wc.WRID = tail
			daemon.Put(tail, &wc)
			tail++
			daemon.Publish(tail)
			if daemon.Fire(false) {
				signals.Add(1)
				Signal(fd)
			}
			fired.Store(r + 1)
			kick(firedKick)
		}
	}()
	defer close(quit)

	timer := time.NewTimer(wakeTimeout)
	defer timer.Stop()
	var head uint64
	var polled, taken, refused, slept int
	for r := range delays {
		client.Arm(ArmNext, false)
		started.Store(int64(r + 1))
		kick(startKick)
		switch {
		case client.Tail() != head:
			polled++
		case spinLooks(rng.IntN(30000), client.Taken):
			taken++
		case busy(rng.IntN(400)) || !client.Sleep(): // (a client preempted before it sleeps)
			refused++
		default:
			slept++
			timer.Reset(wakeTimeout)
			select {
			case <-sig:
			case <-timer.C:
				t.Fatalf("round %d: a sleeping client was never signalled (lost wakeup)", r)
			}
		}
		timer.Reset(wakeTimeout)
		if !waitFor(func() bool { return fired.Load() > int64(r) }, firedKick, timer.C) {
			t.Fatalf("round %d: the daemon did not publish", r)
		}
		if tail := client.Tail(); tail != uint64(r+1) {
			t.Fatalf("round %d: tail %d", r, tail)
		}
		head = client.Tail()
		client.Consume(head)
		if s := signals.Load(); s != int64(slept) {
			t.Fatalf("round %d: %d signals for %d sleeping rounds (a signal to an awake client)", r, s, slept)
		}
	}
	select {
	case <-sig:
		t.Fatal("a signal nobody waited for")
	default:
	}
	t.Logf("%d rounds: polled %d, arm seen taken %d, Sleep refused (the race) %d, slept and signalled %d",
		len(delays), polled, taken, refused, slept)
}

// waitFor polls cond a while (both sides running at once), then waits for
// a kick (sent after each change; a one-slot channel, so none is lost) and
// polls again, until cond holds (true) or quit fires (false).
func waitFor(cond func() bool, kicks <-chan struct{}, quit <-chan time.Time) bool {
	for i := 0; !cond(); i++ {
		if i >= 5000 {
			select {
			case <-kicks:
			case <-quit:
				return false
			}
			i = 0
		}
	}
	return true
}

func kick(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// spinLooks calls ready up to n+1 times, busy (both sides of the race
// tests run in parallel on two processors; a yield would serialize them).
func spinLooks(n int, ready func() bool) bool {
	for i := 0; i < n; i++ {
		if ready() {
			return true
		}
	}
	return ready()
}

var sink atomic.Uint64

// busy burns about n short steps; false.
func busy(n int) bool {
	for i := 0; i < n; i++ {
		sink.Add(1)
	}
	return false
}

// TestWakeupInterleavings: the one interleaving each rule exists for,
// step by step. Completion ring: the client arms awake and looks (nothing),
// the daemon publishes and takes the arm (no signal: the client is awake),
// then the client's Sleep must refuse — else it would block with nobody to
// wake it. Post ring: the drainer drains (empty) while awake, the client
// publishes and sees it awake (no doorbell), then the drainer's Sleep must
// refuse — else the record would wait for a doorbell nobody rings.
func TestWakeupInterleavings(t *testing.T) {
	mem := make([]byte, RingBytes(4))
	daemon, _ := NewRing(mem, 4)
	client, _ := NewRing(mem, 4)
	client.Arm(ArmNext, false)
	if client.Taken() || client.Tail() != 0 {
		t.Fatal("fresh ring")
	}
	daemon.Put(0, &cq.WC{WRID: 7})
	daemon.Publish(1)
	if daemon.Fire(false) {
		t.Fatal("the daemon signalled an awake client")
	}
	if client.Sleep() {
		t.Fatal("lost wakeup: Sleep accepted after the daemon took the arm without signalling")
	}

	p, c, _ := newPostPair(t)
	var buf []byte
	c.SetAwake(1)
	if m, err := c.Next(&buf); m != nil || err != nil {
		t.Fatal("fresh post ring not empty")
	}
	if ok, ring := p.Write([]byte{byte(wire.OpPostSendAsync)}); !ok || ring {
		t.Fatalf("write to an awake drainer: ok %v ring %v", ok, ring)
	}
	if c.Sleep() {
		t.Fatal("lost doorbell: Sleep accepted with a record published while awake")
	}
	if m, err := c.Next(&buf); m == nil || err != nil {
		t.Fatalf("the record: %v %v", m, err)
	}
	if !c.Sleep() {
		t.Fatal("Sleep refused on an empty ring")
	}
	if ok, ring := p.Write([]byte{byte(wire.OpPostSendAsync)}); !ok || !ring {
		t.Fatalf("write to a sleeping drainer: ok %v ring %v", ok, ring)
	}
}

// TestDoorbellNoLostWakeup: the post ring's doorbell rule under racing
// threads. The producer writes one record at a time and rings only when
// Write says the consumer sleeps; the consumer drains, then Sleep (clear
// awake, re-check the tail) and waits for the doorbell through WaitLoop.
// Each record is drained: without Sleep's re-check, a record published
// between the consumer's last Next and its clearing awake (the producer
// saw awake set, so it did not ring) waits forever and the test times out.
func TestDoorbellNoLostWakeup(t *testing.T) {
	p, c, _ := newPostPair(t)
	fd, err := NewEventFD()
	if err != nil {
		t.Fatal(err)
	}
	bell := EventFile(fd, "test-bell")
	var consumed atomic.Int64
	progress := make(chan struct{}, 1)
	corrupt := make(chan error, 1)
	done := make(chan struct{})
	var wakeups, refused int
	dgap := 200
	go func() { // the drainer: daemon/postring.go's drainLoop
		defer close(done)
		var buf []byte
		WaitLoop(bell, func(bool) bool {
			wakeups++
			for {
				c.SetAwake(1)
				for {
					m, err := c.Next(&buf)
					if err != nil {
						corrupt <- err
						return true
					}
					if m == nil {
						busy(dgap) // the window a doorbell must not fall into
						break
					}
					consumed.Add(1)
					select {
					case progress <- struct{}{}:
					default:
					}
				}
				if c.Sleep() {
					return false
				}
				refused++
			}
		})
	}()
	timer := time.NewTimer(wakeTimeout)
	defer timer.Stop()
	rounds := wakeRounds()
	var bells int
	msg := []byte{byte(wire.OpPostSendAsync), 1, 2, 3}
	rng := rand.New(rand.NewPCG(3, 4))
	for r := 0; r < rounds; {
		// a burst of 1..3 records with random gaps, so a write lands
		// sometimes while the drainer is between its last look and sleep
		for k := 1 + rng.IntN(3); k > 0 && r < rounds; k-- {
			busy(rng.IntN(400))
			ok, ring := p.Write(msg)
			if !ok {
				t.Fatalf("record %d: ring full", r)
			}
			r++
			if ring {
				bells++
				Signal(fd)
			}
		}
		timer.Reset(wakeTimeout)
		for consumed.Load() < int64(r) {
			select {
			case <-progress:
			case err := <-corrupt:
				t.Fatal(err)
			case <-timer.C:
				t.Fatalf("record %d never drained (lost doorbell); %d drained", r-1, consumed.Load())
			}
		}
	}
	bell.Close()
	<-done
	if p.Doorbells() != uint64(bells) || bells == 0 {
		t.Fatalf("Doorbells %d, rung %d", p.Doorbells(), bells)
	}
	t.Logf("%d records, %d doorbells, %d drainer wakeups, Sleep refused %d", rounds, bells, wakeups, refused)
}

// TestArmRules: the arm word's transitions (IBTA 11.4.2.2: "next" upgrades
// "solicited"; a solicited-only arm fires for a solicited or unsuccessful
// completion only), the sleeping flag, and Fire's signal decision.
func TestArmRules(t *testing.T) {
	mem := make([]byte, RingBytes(4))
	r, _ := NewRing(mem, 4)
	if r.Fire(true) || !r.Taken() {
		t.Fatal("Fire without an arm")
	}
	r.Arm(ArmSolicited, false)
	if r.Fire(false) || r.Armed() != ArmSolicited {
		t.Fatal("an unsolicited completion took a solicited-only arm")
	}
	if r.Fire(true) || !r.Taken() {
		t.Fatal("a solicited completion: awake client must not be signalled, arm must be taken")
	}
	r.Arm(ArmSolicited, true)
	r.Arm(ArmNext, false) // upgrade; the earlier arm's waiter still sleeps
	if r.Armed() != ArmNext || !r.Sleeping() {
		t.Fatalf("upgrade: armed %d sleeping %v", r.Armed(), r.Sleeping())
	}
	r.Arm(ArmSolicited, false) // no downgrade
	if r.Armed() != ArmNext {
		t.Fatal("solicited downgraded next")
	}
	if !r.Fire(false) || !r.Taken() || r.Sleeping() {
		t.Fatal("a sleeping client armed for next must be signalled, the word cleared")
	}
	r.Arm(ArmNext, false)
	if !r.Sleep() || !r.Sleeping() {
		t.Fatal("Sleep on a pending arm")
	}
	if !r.Fire(false) {
		t.Fatal("Fire after Sleep must signal")
	}
	if r.Sleep() {
		t.Fatal("Sleep after the arm was taken must refuse")
	}
	// A client writing garbage (kind 3) into the word: no fire, no panic.
	ne.PutUint32(mem[ringArmed:], 0xFFFFFFFF)
	if r.Fire(true) {
		t.Fatal("kind 3 fired")
	}
}

// TestWaitLoopEarlyWrite: a write made before WaitLoop waits is reported
// by its first call (woken), not lost with the edge the poller saw before
// the wait began (the client's notify goroutine starts at the first
// ReqNotify; a completion may be signalled before it runs); with no write,
// the first call is not woken; later writes each wake it.
func TestWaitLoopEarlyWrite(t *testing.T) {
	for _, early := range []bool{true, false} {
		fd, err := NewEventFD()
		if err != nil {
			t.Fatal(err)
		}
		f := EventFile(fd, "test-early")
		if early {
			Signal(fd)
		}
		calls := make(chan bool, 4)
		done := make(chan struct{})
		go func() {
			defer close(done)
			WaitLoop(f, func(woken bool) bool {
				calls <- woken
				return false
			})
		}()
		timer := time.NewTimer(wakeTimeout)
		select {
		case w := <-calls:
			if w != early {
				t.Fatalf("early write %v: first call woken %v", early, w)
			}
		case <-timer.C:
			t.Fatal("WaitLoop did not call fn")
		}
		Signal(fd)
		select {
		case w := <-calls:
			if !w {
				t.Fatal("a later write: woken false")
			}
		case <-timer.C:
			t.Fatal("a later write was not reported")
		}
		timer.Stop()
		f.Close()
		<-done
	}
}
