package proto

import (
	"sync/atomic"
	"unsafe"

	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/internal/event"
)

// Event ring: asynchronous events (ibv_get_async_event) the daemon forwards
// to a client, in the page after the post ring in the same memfd
// (EventRingOff), with its own eventfd (daemon -> client); docs/daemon-protocol.md,
// "Event ring"; wire.AsyncEvent. Layout:
//
//	0    tail  uint64  entries produced (daemon)
//	64   head  uint64  entries consumed (client)
//	128  entries, EventEntrySize bytes each, EventRingCap of them:
//	     type u8, kind u8, port u8, _ u8, handle u32, qpn u32, _ u32
//
// kind names the client object the event is about (EventOn*), by the
// client's handle. A full ring drops the event (counted in the daemon's
// log), as the embedded device's event queue does.
const (
	EventRingOff   = wire.EventRingOff
	EventRingBytes = wire.EventRingBytes
	EventEntrySize = 16
	EventRingCap   = wire.EventRingCap
	evTail         = wire.EventTail
	evHead         = wire.EventHead
	evEntries      = wire.EventEntries
)

// Event object kinds.
const (
	EventOnDevice = wire.EventOnDevice // port and device events: no object
	EventOnQP     = wire.EventOnQP
	EventOnCQ     = wire.EventOnCQ
	EventOnSRQ    = wire.EventOnSRQ
)

// Event is one forwarded asynchronous event.
type Event struct {
	Type   event.Type
	Kind   uint8 // EventOn*
	Port   uint8
	Handle Handle // the client's handle of the object (Kind != EventOnDevice)
	QPN    uint32
}

// EventRing is a view of an event ring (one producer, one consumer).
type EventRing struct {
	mem []byte
	pos uint64 // producer: tail; consumer: head
}

// NewEventRing views mem (at least EventRingBytes, the region at EventRingOff).
func NewEventRing(mem []byte, producer bool) (*EventRing, bool) {
	if len(mem) < EventRingBytes {
		return nil, false
	}
	r := &EventRing{mem: mem[:EventRingBytes:EventRingBytes]}
	if producer {
		r.pos = atomic.LoadUint64(r.u64(evTail))
	} else {
		r.pos = atomic.LoadUint64(r.u64(evHead))
	}
	return r, true
}

func (r *EventRing) u64(off int) *uint64 { return (*uint64)(unsafe.Pointer(&r.mem[off])) }

// Put appends e (producer); false if the ring is full (or its head is corrupt).
func (r *EventRing) Put(e Event) bool {
	if used := r.pos - atomic.LoadUint64(r.u64(evHead)); used >= EventRingCap {
		return false
	}
	b := r.mem[evEntries+int(r.pos%EventRingCap)*EventEntrySize:]
	b[0], b[1], b[2], b[3] = byte(e.Type), e.Kind, e.Port, 0
	ne.PutUint32(b[4:], uint32(e.Handle))
	ne.PutUint32(b[8:], e.QPN)
	r.pos++
	atomic.StoreUint64(r.u64(evTail), r.pos)
	return true
}

// Get takes the next event (consumer); false if none.
func (r *EventRing) Get(e *Event) bool {
	if atomic.LoadUint64(r.u64(evTail)) == r.pos {
		return false
	}
	b := r.mem[evEntries+int(r.pos%EventRingCap)*EventEntrySize:]
	*e = Event{Type: event.Type(b[0]), Kind: b[1], Port: b[2], Handle: Handle(ne.Uint32(b[4:])), QPN: ne.Uint32(b[8:])}
	r.pos++
	atomic.StoreUint64(r.u64(evHead), r.pos)
	return true
}
