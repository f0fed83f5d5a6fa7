package main

import (
	"fmt"
	"hash/crc32"
	"sync"
	"sync/atomic"
	"time"
)

// opsCost prints what single operations cost where probe runs (probe ops N): in the lab's
// TCG guest their ratios differ from the host's (locked instructions, clock reads and calls go
// through the emulator's helpers), which decides what is worth cutting from a half trip.
func opsCost(n int) {
	var mu sync.Mutex
	var a atomic.Int64
	var p atomic.Pointer[int]
	var x int
	m := map[uint32]int{1: 1, 2: 2, 3: 3}
	buf := make([]byte, 64)
	var sink uint64
	type op struct {
		name string
		f    func()
	}
	ops := []op{
		{"empty loop", func() {}},
		{"mutex lock+unlock", func() { mu.Lock(); x++; mu.Unlock() }},
		{"atomic add", func() { a.Add(1) }},
		{"atomic store (xchg)", func() { a.Store(int64(x)) }},
		{"atomic CAS", func() { a.CompareAndSwap(a.Load(), 5) }},
		{"atomic pointer store", func() { p.Store(&x) }},
		{"time.Now", func() { sink += uint64(time.Now().UnixNano()) }},
		{"map[uint32] lookup", func() { sink += uint64(m[uint32(x&3)]) }},
		{"crc32 40 bytes", func() { sink += uint64(crc32.Update(0, crc32.IEEETable, buf[:40])) }},
		{"crc32 64 bytes", func() { sink += uint64(crc32.Update(0, crc32.IEEETable, buf[:64])) }},
		{"copy 304 bytes (clear)", func() { clear(big[:304]) }},
		{"call (noinline)", func() { sink += noinl(x) }},
	}
	for _, o := range ops {
		t0 := time.Now()
		for range n {
			o.f()
		}
		d := time.Since(t0)
		fmt.Printf("%-24s %8.1f ns\n", o.name, float64(d.Nanoseconds())/float64(n))
	}
	_ = sink
}

var big [512]byte

//go:noinline
func noinl(v int) uint64 { return uint64(v * 3) }
