package proto

import (
	"sync/atomic"
	"testing"

	"github.com/softroce/softroce/internal/daemon/proto/wire"
)

// TestDoorbellTwoMappings: the doorbell rule (a Write that asks for no doorbell and a Sleep
// that finds nothing pending exclude each other) holds with the producer and the consumer on
// two mappings of one memfd, as the client and the daemon are, with both racing in every
// round. Each side stores one word and loads the other (Dekker): under the race detector a Go
// atomic store is a release store only, and with two mappings x86 then lets the load pass it
// unless the store is an exchange (fenceStore in postring.go). With plain stores this test saw
// a few violations in 50,000 rounds under -race (4 in one run), none with exchanges.
func TestDoorbellTwoMappings(t *testing.T) {
	fd, mem, err := NewMemfd("test-post", PostRingBytes)
	if err != nil {
		t.Fatal(err)
	}
	defer Unmap(mem)
	if err := Populate(mem); err != nil {
		t.Fatal(err)
	}
	mapping, view, err := MapShared(fd, 0, PostRingBytes)
	CloseFD(fd)
	if err != nil {
		t.Fatal(err)
	}
	defer Unmap(mapping)
	p, ok1 := NewPostRing(mem, true)
	c, ok2 := NewPostRing(view, false)
	if !ok1 || !ok2 {
		t.Fatal("NewPostRing")
	}
	rounds := uint32(wakeRounds() * 10)
	msg := []byte{byte(wire.OpPostSendAsync), 1, 2, 3}
	var start, done atomic.Uint32
	var asked atomic.Bool
	go func() { // the producer: one Write per round
		var psink uint32
		defer func() { _ = psink }()
		for i := uint32(1); i <= rounds; i++ {
			for start.Load() != i {
			}
			for k := uint32(0); k < (i*13)%1024; k++ {
				psink += k
			}
			ok, ring := p.Write(msg)
			if !ok {
				panic("ring full")
			}
			asked.Store(ring)
			done.Store(i)
		}
	}()
	var buf []byte
	var sink uint32
	violations := 0
	for i := uint32(1); i <= rounds; i++ {
		c.SetAwake(1) // draining
		start.Store(i)
		for k := uint32(0); k < i%1024; k++ { // vary which side goes first
			sink += k
		}
		mayRest := c.Sleep()
		for done.Load() != i {
		}
		if mayRest && !asked.Load() {
			violations++ // the record is published, nobody rings, the consumer sleeps
		}
		if m, err := c.Next(&buf); err != nil || m == nil {
			t.Fatalf("round %d: record %q, %v", i, m, err)
		}
	}
	if violations > 0 {
		t.Fatalf("%d of %d rounds lost the doorbell", violations, rounds)
	}
	_ = sink
}
