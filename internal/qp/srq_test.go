package qp

import (
	"errors"
	"sync"
	"testing"

	"github.com/softroce/softroce/internal/event"
)

func recvWR(id uint64, nsge int) RecvWR {
	w := RecvWR{WRID: id}
	for i := 0; i < nsge; i++ {
		w.SGL = append(w.SGL, SGE{Addr: id*100 + uint64(i), Length: 8, LKey: uint32(i)})
	}
	return w
}

func TestSRQCreateLimits(t *testing.T) {
	def := DefaultDeviceAttr()
	if _, err := NewSRQ(SRQOptions{MaxWR: def.MaxSRQWR + 1, MaxSGE: 1}); !errors.Is(err, ErrSRQArg) {
		t.Fatalf("default limit: %v", err)
	}
	// The SRQ at the limit is built with a smaller device limit (the default, 1 Mi WRs of
	// 27 SGEs, would allocate ~450 MB).
	dev := def
	dev.MaxSRQWR = 1024
	bad := []SRQOptions{
		{MaxWR: 0, MaxSGE: 1},
		{MaxWR: dev.MaxSRQWR + 1, MaxSGE: 1, Device: &dev},
		{MaxWR: 4, MaxSGE: 0},
		{MaxWR: 4, MaxSGE: dev.MaxSRQSGE + 1},
		{MaxWR: 4, MaxSGE: 1, Limit: 5},
		{MaxWR: 4, MaxSGE: 1, Limit: -1},
	}
	for i, o := range bad {
		if _, err := NewSRQ(o); !errors.Is(err, ErrSRQArg) {
			t.Fatalf("case %d: %v", i, err)
		}
	}
	s, err := NewSRQ(SRQOptions{MaxWR: dev.MaxSRQWR, MaxSGE: dev.MaxSRQSGE, Device: &dev})
	if err != nil {
		t.Fatal(err)
	}
	if q := s.Query(); q.MaxWR != dev.MaxSRQWR || q.MaxSGE != dev.MaxSRQSGE || q.SRQLimit != 0 {
		t.Fatalf("%+v", q)
	}
}

func TestSRQMaxWRAndSGE(t *testing.T) {
	s, err := NewSRQ(SRQOptions{MaxWR: 3, MaxSGE: 2})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := s.Post([]RecvWR{recvWR(1, 3)}); n != 0 || !errors.Is(err, ErrWRTooManySGE) {
		t.Fatalf("too many SGEs: %d %v", n, err)
	}
	n, err := s.Post([]RecvWR{recvWR(1, 2), recvWR(2, 0), recvWR(3, 1), recvWR(4, 1)})
	if n != 3 || !errors.Is(err, ErrSRQFull) {
		t.Fatalf("max_wr: posted %d, %v", n, err)
	}
	var dst RecvWR
	for want := uint64(1); want <= 3; want++ {
		if !s.Take(&dst) || dst.WRID != want {
			t.Fatalf("take: %+v want %d", dst, want)
		}
		w := recvWR(want, len(dst.SGL))
		for i := range dst.SGL {
			if dst.SGL[i] != w.SGL[i] {
				t.Fatal("SGL copied wrongly")
			}
		}
	}
	if s.Take(&dst) {
		t.Fatal("take from empty SRQ")
	}
	// Room again after taking.
	if n, err := s.Post([]RecvWR{recvWR(5, 1)}); n != 1 || err != nil {
		t.Fatal(err)
	}
}

func TestSRQLimitEvent(t *testing.T) {
	var mu sync.Mutex
	var events []event.Event
	sink := func(e event.Event) { mu.Lock(); events = append(events, e); mu.Unlock() }
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(events) }
	s, err := NewSRQ(SRQOptions{MaxWR: 8, MaxSGE: 1, Events: sink})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 6; i++ {
		s.Post([]RecvWR{recvWR(uint64(i), 1)})
	}
	var dst RecvWR
	s.Take(&dst)
	if count() != 0 {
		t.Fatal("event without an armed limit")
	}
	if err := s.Modify(SRQAttr{SRQLimit: 9}, SRQLimit); !errors.Is(err, ErrSRQArg) {
		t.Fatalf("limit above max_wr: %v", err)
	}
	if err := s.Modify(SRQAttr{SRQLimit: 3}, SRQLimit); err != nil {
		t.Fatal(err)
	}
	if s.Query().SRQLimit != 3 {
		t.Fatal("limit not armed")
	}
	s.Take(&dst) // 5 -> 4
	s.Take(&dst) // 4 -> 3: not below 3
	if count() != 0 {
		t.Fatal("event before the count dropped below the limit")
	}
	s.Take(&dst) // 3 -> 2: below the limit
	if count() != 1 || events[0].Type != event.SRQLimitReached || events[0].Object != s {
		t.Fatalf("events %+v", events)
	}
	if s.Query().SRQLimit != 0 {
		t.Fatal("limit must disarm after firing")
	}
	s.Take(&dst)
	if count() != 1 {
		t.Fatal("one event per arm")
	}
	// Re-arm.
	s.Modify(SRQAttr{SRQLimit: 5}, SRQLimit)
	s.Post([]RecvWR{recvWR(10, 1)})
	s.Take(&dst)
	if count() != 2 {
		t.Fatal("re-armed limit did not fire")
	}
}

func TestSRQResize(t *testing.T) {
	s, _ := NewSRQ(SRQOptions{MaxWR: 2, MaxSGE: 1})
	s.Post([]RecvWR{recvWR(1, 1), recvWR(2, 1)})
	var dst RecvWR
	s.Take(&dst)
	s.Post([]RecvWR{recvWR(3, 1)}) // wrapped ring
	if err := s.Modify(SRQAttr{MaxWR: 1}, SRQMaxWR); !errors.Is(err, ErrSRQArg) {
		t.Fatalf("shrink below count: %v", err)
	}
	if err := s.Modify(SRQAttr{MaxWR: 4}, SRQMaxWR); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Post([]RecvWR{recvWR(4, 1), recvWR(5, 1)}); n != 2 || err != nil {
		t.Fatalf("after resize: %d %v", n, err)
	}
	for want := uint64(2); want <= 5; want++ {
		if !s.Take(&dst) || dst.WRID != want {
			t.Fatalf("order after resize: %d want %d", dst.WRID, want)
		}
	}
	s.Destroy()
	if _, err := s.Post([]RecvWR{recvWR(1, 1)}); !errors.Is(err, ErrSRQDestroyed) {
		t.Fatal(err)
	}
	if s.Take(&dst) {
		t.Fatal("take after destroy")
	}
}

func TestSRQTakeNoAlloc(t *testing.T) {
	s, _ := NewSRQ(SRQOptions{MaxWR: 16, MaxSGE: 4})
	wrs := []RecvWR{recvWR(1, 4), recvWR(2, 4)}
	dst := RecvWR{SGL: make([]SGE, 0, 4)}
	n := testing.AllocsPerRun(1000, func() {
		s.Post(wrs)
		s.Take(&dst)
		s.Take(&dst)
	})
	if n != 0 {
		t.Fatalf("Post/Take allocate %v", n)
	}
}

func TestSRQConcurrent(t *testing.T) {
	s, _ := NewSRQ(SRQOptions{MaxWR: 64, MaxSGE: 1})
	const total = 4000
	var wg sync.WaitGroup
	seen := make([]bool, total)
	var mu sync.Mutex
	taken := 0
	for c := 0; c < 3; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var dst RecvWR
			for {
				mu.Lock()
				if taken == total {
					mu.Unlock()
					return
				}
				mu.Unlock()
				if s.Take(&dst) {
					mu.Lock()
					if seen[dst.WRID] {
						t.Error("duplicate")
					}
					seen[dst.WRID] = true
					taken++
					mu.Unlock()
				}
			}
		}()
	}
	for i := 0; i < total; {
		if n, _ := s.Post([]RecvWR{recvWR(uint64(i), 1)}); n == 1 {
			i++
		}
	}
	wg.Wait()
}
