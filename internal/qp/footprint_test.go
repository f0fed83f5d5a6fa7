package qp

import (
	"runtime"
	"testing"
)

// footprintSink keeps what heapGrowth's function allocated live while it measures.
var footprintSink []*QP

var srqSink []srqEntry

// heapGrowth returns how many bytes f's allocations (kept in the sinks) hold on the heap.
func heapGrowth(f func()) int64 {
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	f()
	runtime.GC()
	runtime.ReadMemStats(&b)
	footprintSink, srqSink = nil, nil
	return int64(b.HeapAlloc) - int64(a.HeapAlloc)
}

// TestFootprint: Footprint and SRQFootprint are what the engine really allocates for the
// queues (measured on the heap, within 5% and 64 KiB): a host service charging them to a
// client charges what the client costs.
func TestFootprint(t *testing.T) {
	close := func(t *testing.T, what string, got, want int64) {
		t.Helper()
		d := got - want
		if d < 0 {
			d = -d
		}
		if d > want/20+64<<10 {
			t.Fatalf("%s: the engine allocated %d bytes, the footprint says %d", what, got, want)
		}
		t.Logf("%s: allocated %d, footprint %d", what, got, want)
	}
	c := Cap{MaxSendWR: 4096, MaxRecvWR: 8192, MaxSendSGE: 4, MaxRecvSGE: 3, MaxInlineData: 256}
	queues := func(srq *SRQ) func() {
		return func() {
			q := &QP{cfg: Config{Cap: c, SRQ: srq}}
			q.ensureSQ()
			q.ensureRQ()
			q.cfg.SRQ = nil
			footprintSink = append(footprintSink, q)
		}
	}
	srq := &SRQ{}
	close(t, "QP queues", heapGrowth(queues(nil)), Footprint(c, false))
	close(t, "QP queues with an SRQ", heapGrowth(queues(srq)), Footprint(c, true))
	close(t, "SRQ", heapGrowth(func() { srqSink = newSRQRing(20000, 7) }), SRQFootprint(20000, 7))
}
