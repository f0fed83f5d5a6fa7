package cq

import (
	"errors"
	"sync"
	"testing"

	"github.com/softroce/softroce/internal/event"
)

func mustNew(t *testing.T, o Options) *CQ {
	t.Helper()
	c, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func pending(c *CQ) bool {
	select {
	case <-c.Channel():
		return true
	default:
		return false
	}
}

func TestStatusStrings(t *testing.T) {
	want := map[Status]string{
		StatusSuccess:        "success",
		StatusLocLenErr:      "local length error",
		StatusWRFlushErr:     "Work Request Flushed Error",
		StatusRemAccessErr:   "remote access error",
		StatusRetryExcErr:    "transport retry counter exceeded",
		StatusRNRRetryExcErr: "RNR retry counter exceeded",
		StatusGeneralErr:     "general error",
		Status(200):          "unknown",
	}
	for s, w := range want {
		if s.String() != w {
			t.Errorf("%d: %q, want %q", s, s.String(), w)
		}
	}
	for s := StatusSuccess; s <= StatusGeneralErr; s++ {
		if s.String() == "" || s.String() == "unknown" {
			t.Errorf("status %d has no text", s)
		}
	}
}

func TestNewCapacity(t *testing.T) {
	for _, n := range []int{0, -1, MaxCapacity + 1} {
		if _, err := New(Options{Capacity: n}); !errors.Is(err, ErrCapacity) {
			t.Fatalf("capacity %d: %v", n, err)
		}
	}
}

func TestFIFOAndWrap(t *testing.T) {
	c := mustNew(t, Options{Capacity: 3})
	dst := make([]WC, 2)
	next := uint64(0)
	for round := 0; round < 10; round++ {
		for i := 0; i < 3; i++ {
			wc := WC{WRID: next + uint64(i)}
			if !c.Push(&wc, false) {
				t.Fatal("push into non-full CQ failed")
			}
		}
		got := 0
		for got < 3 {
			n := c.Poll(dst)
			for j := 0; j < n; j++ {
				if dst[j].WRID != next {
					t.Fatalf("got WRID %d, want %d", dst[j].WRID, next)
				}
				next++
			}
			got += n
		}
		if c.Poll(dst) != 0 || c.Len() != 0 {
			t.Fatal("empty CQ returned completions")
		}
	}
}

func TestOverflow(t *testing.T) {
	var events []event.Event
	c := mustNew(t, Options{Capacity: 2, Events: func(e event.Event) { events = append(events, e) }})
	wc := WC{WRID: 1}
	for range 2 {
		if !c.Push(&wc, false) {
			t.Fatal("push failed")
		}
	}
	if c.Push(&wc, false) {
		t.Fatal("push into a full CQ must fail")
	}
	if len(events) != 1 || events[0].Type != event.CQErr || events[0].Object != c {
		t.Fatalf("events %+v, want one CQ_ERR for this CQ", events)
	}
	if !errors.Is(c.Err(), ErrCQError) {
		t.Fatalf("Err %v", c.Err())
	}
	// In error: further pushes fail (even after room is made) and no second event.
	dst := make([]WC, 4)
	if c.Poll(dst) != 2 {
		t.Fatal("queued completions must stay pollable")
	}
	if c.Push(&wc, false) {
		t.Fatal("push into an errored CQ must fail")
	}
	if len(events) != 1 {
		t.Fatal("CQ_ERR must be raised once")
	}
	if err := c.ReqNotify(false); !errors.Is(err, ErrCQError) {
		t.Fatalf("ReqNotify on errored CQ: %v", err)
	}
}

func TestNotifyNext(t *testing.T) {
	c := mustNew(t, Options{Capacity: 8})
	wc := WC{}
	c.Push(&wc, false)
	if pending(c) {
		t.Fatal("event without arming")
	}
	if err := c.ReqNotify(false); err != nil {
		t.Fatal(err)
	}
	if pending(c) {
		t.Fatal("already-queued completion must not fire")
	}
	c.Push(&wc, false)
	if !pending(c) {
		t.Fatal("armed CQ did not fire on the next completion")
	}
	c.Push(&wc, false)
	if pending(c) {
		t.Fatal("one event per arm")
	}
	c.ReqNotify(false)
	c.ReqNotify(false) // arming twice still gives one event
	c.Push(&wc, false)
	c.Push(&wc, false)
	if !pending(c) || pending(c) {
		t.Fatal("want exactly one event")
	}
}

func TestNotifySolicited(t *testing.T) {
	c := mustNew(t, Options{Capacity: 16})
	ok := WC{Status: StatusSuccess}
	if err := c.ReqNotify(true); err != nil {
		t.Fatal(err)
	}
	c.Push(&ok, false)
	if pending(c) {
		t.Fatal("unsolicited success fired a solicited-only arm")
	}
	c.Push(&ok, true)
	if !pending(c) {
		t.Fatal("solicited completion did not fire")
	}
	c.Push(&ok, true)
	if pending(c) {
		t.Fatal("one event per arm")
	}
	// An unsuccessful completion also fires a solicited arm (IBTA 11.4.2.2).
	c.ReqNotify(true)
	bad := WC{Status: StatusRemAccessErr}
	c.Push(&bad, false)
	if !pending(c) {
		t.Fatal("error completion did not fire a solicited arm")
	}
	// NEXT upgrades a SOLICITED arm; SOLICITED does not downgrade NEXT.
	c.ReqNotify(true)
	c.ReqNotify(false)
	c.Push(&ok, false)
	if !pending(c) {
		t.Fatal("upgrade to next")
	}
	c.ReqNotify(false)
	c.ReqNotify(true)
	c.Push(&ok, false)
	if !pending(c) {
		t.Fatal("solicited must not downgrade next")
	}
}

func TestSelectable(t *testing.T) {
	c := mustNew(t, Options{Capacity: 4})
	c.ReqNotify(false)
	done := make(chan struct{})
	go func() {
		wc := WC{WRID: 9}
		c.Push(&wc, false)
		close(done)
	}()
	select {
	case <-c.Channel():
	case <-make(chan struct{}): // never
	}
	<-done
	dst := make([]WC, 1)
	if c.Poll(dst) != 1 || dst[0].WRID != 9 {
		t.Fatal("poll after event")
	}
}

func TestPollNoAlloc(t *testing.T) {
	c := mustNew(t, Options{Capacity: 64})
	dst := make([]WC, 16)
	wc := WC{WRID: 1, ByteLen: 10}
	n := testing.AllocsPerRun(1000, func() {
		for i := 0; i < 16; i++ {
			c.Push(&wc, i == 3)
		}
		c.ReqNotify(true)
		if c.Poll(dst) != 16 {
			panic("poll")
		}
		select {
		case <-c.Channel():
		default:
		}
	})
	if n != 0 {
		t.Fatalf("Push/Poll allocate %v per run", n)
	}
}

// Concurrent producers and one consumer (run under -race): nothing lost, nothing duplicated,
// per-producer order kept, and every armed notification is eventually delivered.
func TestConcurrentProducers(t *testing.T) {
	const producers, per = 4, 2000
	c := mustNew(t, Options{Capacity: producers * per})
	var wg sync.WaitGroup
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			for i := 0; i < per; i++ {
				wc := WC{WRID: uint64(p)<<32 | uint64(i), QPNum: uint32(p)}
				if !c.Push(&wc, i%7 == 0) {
					t.Error("unexpected overflow")
					return
				}
			}
		}(p)
	}
	next := make([]uint64, producers)
	dst := make([]WC, 32)
	got := 0
	for got < producers*per {
		if err := c.ReqNotify(false); err != nil {
			t.Fatal(err)
		}
		n := c.Poll(dst)
		if n == 0 {
			<-c.Channel() // armed before polling: a completion after the poll fires
			continue
		}
		for _, wc := range dst[:n] {
			p := wc.WRID >> 32
			if wc.WRID&0xFFFFFFFF != next[p] || uint64(wc.QPNum) != p {
				t.Fatalf("producer %d: got %d, want %d", p, wc.WRID&0xFFFFFFFF, next[p])
			}
			next[p]++
		}
		got += n
	}
	wg.Wait()
	if c.Poll(dst) != 0 {
		t.Fatal("extra completions")
	}
}

func TestDestroy(t *testing.T) {
	c := mustNew(t, Options{Capacity: 2})
	c.Destroy()
	wc := WC{}
	if c.Push(&wc, false) {
		t.Fatal("push after destroy")
	}
	if !errors.Is(c.ReqNotify(false), ErrClosed) || !errors.Is(c.Err(), ErrClosed) {
		t.Fatal("destroyed CQ must report ErrClosed")
	}
}
