package proto

import (
	"testing"

	"github.com/softroce/softroce/internal/event"
)

// TestEventRing: events come out in order with every field, a full ring
// refuses, and a corrupt head (ahead of the tail) reads as full.
func TestEventRing(t *testing.T) {
	mem := make([]byte, EventRingBytes)
	p, _ := NewEventRing(mem, true)
	c, _ := NewEventRing(mem, false)
	for round := 0; round < 3; round++ {
		for i := 0; i < EventRingCap; i++ {
			if !p.Put(Event{Type: event.Type(i % 20), Kind: EventOnQP, Port: 1, Handle: Handle(i + 1), QPN: uint32(0x11 + i)}) {
				t.Fatalf("round %d: put %d refused", round, i)
			}
		}
		if p.Put(Event{}) {
			t.Fatal("full ring accepted an event")
		}
		var e Event
		for i := 0; i < EventRingCap; i++ {
			if !c.Get(&e) || e.Type != event.Type(i%20) || e.Kind != EventOnQP || e.Port != 1 || e.Handle != Handle(i+1) || e.QPN != uint32(0x11+i) {
				t.Fatalf("round %d: event %d = %+v", round, i, e)
			}
		}
		if c.Get(&e) {
			t.Fatal("empty ring returned an event")
		}
	}
	ne.PutUint64(mem[evHead:], 1<<40)
	if p.Put(Event{}) {
		t.Fatal("corrupt head: put accepted")
	}
}
