package qp

import (
	"sync"
	"testing"
)

// TestTxSetLastSlot: the burst put back last is the next one taken, without the free list
// (its lock): a ping-pong's one set per message goes back and forth through the slot.
func TestTxSetLastSlot(t *testing.T) {
	a, b := getTxSet(), getTxSet() // empties the slot (if a test left a set there)
	putTxSet(a)
	putTxSet(b) // the slot holds a: b goes to the free list
	txPool.mu.Lock()
	n := len(txPool.free)
	txPool.mu.Unlock()
	putTxSet(getTxSet()) // a, out of the slot and back in
	txPool.mu.Lock()
	m := len(txPool.free)
	txPool.mu.Unlock()
	if m != n {
		t.Fatalf("a get and put through the slot changed the free list: %d -> %d sets", n, m)
	}
	if got := getTxSet(); got != a {
		t.Fatal("the set put back last was not the next one taken")
	}
	if got := getTxSet(); got != b {
		t.Fatal("the free list's set was not taken after the slot's")
	}
	putTxSet(a)
	putTxSet(b)
}

// TestTxSetConcurrent: bursts taken and returned from several goroutines are never handed
// to two holders at once (run with -race).
func TestTxSetConcurrent(t *testing.T) {
	var mu sync.Mutex
	held := map[*txSet]bool{}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				s := getTxSet()
				mu.Lock()
				dup := held[s]
				held[s] = true
				mu.Unlock()
				if dup {
					t.Error("one burst handed to two holders")
					return
				}
				s.batch = s.batch[:0] // the holder writes its set
				mu.Lock()
				delete(held, s)
				mu.Unlock()
				putTxSet(s)
			}
		}()
	}
	wg.Wait()
}
