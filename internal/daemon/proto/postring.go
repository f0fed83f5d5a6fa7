package proto

import (
	"errors"
	"sync/atomic"
	"unsafe"

	"github.com/softroce/softroce/internal/daemon/proto/wire"
)

// Post ring: the client's send and receive work requests travel to the
// daemon through a byte ring in a memfd the daemon creates (sealed) and both
// map, one per connection, with an eventfd doorbell (docs/daemon-protocol.md,
// "Post ring"; wire.Post*). Layout (host byte order):
//
//	0    tail   uint64  bytes produced (client writes)
//	64   head   uint64  bytes consumed (daemon writes)
//	128  awake  uint32  daemon: 1 = draining (no doorbell needed), 0 = asleep, 2 = stopped
//	256  data, PostRingBytes - 256 bytes (a power of two), records 8-byte aligned
//
// A record is [len u32][kind u32] then len bytes, padded to 8: kind
// RecordPost carries one asynchronous post message exactly as on the socket
// (wire.Hdr with OpPostSendAsync or OpPostRecvAsync, wire.Post, the WRs; msg.go); kind
// RecordPad fills the rest of the ring before a wrap (a record never wraps).
//
// Doorbell: the client publishes the tail, then reads awake and writes the
// eventfd only if it is 0. The daemon clears awake, then re-reads the tail
// before it sleeps. Both are sequentially consistent atomics, so one side
// always sees the other's store: no post is left unnoticed, and a client
// posting while the daemon drains makes no system call.
//
// The daemon trusts nothing in the ring: a tail running ahead by more than
// the capacity or unaligned, a record length out of bounds, an unknown
// kind, all stop the ring (ErrRingCorrupt; the daemon disconnects that
// client). It copies each record out of shared memory before decoding it,
// so a client rewriting a record meanwhile changes nothing the daemon
// checked. The client never trusts the head beyond its own ring (a head
// ahead of the tail reads as a full ring).
const (
	postTail       = wire.PostTail
	postHead       = wire.PostHead
	postAwake      = wire.PostAwake
	PostRingHeader = wire.PostData
	// PostRingData is the data capacity of a connection's post ring.
	PostRingData = wire.PostRingData
	// PostRingBytes is the memfd size of a post ring.
	PostRingBytes = PostRingHeader + PostRingData
	// MaxPostRecord is the largest post message the ring carries; larger
	// posts go over the socket.
	MaxPostRecord = wire.MaxPostRecord

	recHdr = 8
	// RecordPost is a record holding one post message.
	RecordPost = wire.RecordPost
	// RecordPad is a record filling the ring up to its end.
	RecordPad = wire.RecordPad
)

// ErrRingCorrupt: the client-written part of a post ring is inconsistent.
var ErrRingCorrupt = errors.New("softroce daemon: post ring corrupt")

// PostRing is a view of a post ring in mapped memory. The producer
// (client) and consumer (daemon) each use their own view; neither side's
// methods are safe for concurrent use on that side.
type PostRing struct {
	mem   []byte
	data  []byte
	mask  uint64
	pos   uint64        // producer: tail; consumer: head (each side's own copy)
	seen  atomic.Uint64 // consumer: pos, for Pending from another goroutine
	bells atomic.Uint64 // producer: Writes that asked for the doorbell
}

// NewPostRing views mem (at least PostRingBytes) as a post ring. A
// producer view starts at the published tail, a consumer at the head (both
// 0 in a new ring); an unaligned counter is refused.
func NewPostRing(mem []byte, producer bool) (*PostRing, bool) {
	if len(mem) < PostRingBytes {
		return nil, false
	}
	r := &PostRing{mem: mem, data: mem[PostRingHeader:PostRingBytes:PostRingBytes], mask: PostRingData - 1}
	if producer {
		r.pos = atomic.LoadUint64(r.u64(postTail))
	} else {
		r.pos = atomic.LoadUint64(r.u64(postHead))
	}
	if r.pos%recHdr != 0 {
		return nil, false
	}
	r.seen.Store(r.pos)
	return r, true
}

func (r *PostRing) u64(off int) *uint64 { return (*uint64)(unsafe.Pointer(&r.mem[off])) }
func (r *PostRing) u32(off int) *uint32 { return (*uint32)(unsafe.Pointer(&r.mem[off])) }

func align8(n int) int { return (n + 7) &^ 7 }

// Write appends one post message and publishes it (producer). It reports
// false, writing nothing, if the message is larger than MaxPostRecord or
// the ring lacks room. ring tells whether the caller must ring the
// doorbell (the daemon is asleep).
func (r *PostRing) Write(msg []byte) (ok, ring bool) {
	if len(msg) == 0 || len(msg) > MaxPostRecord {
		return false, false
	}
	need := uint64(recHdr + align8(len(msg)))
	used := r.pos - atomic.LoadUint64(r.u64(postHead))
	if used > PostRingData {
		return false, false // a head beyond the tail: treat as full
	}
	free := PostRingData - used
	off := r.pos & r.mask
	pad := uint64(0)
	if PostRingData-off < need {
		pad = PostRingData - off
	}
	if free < pad+need {
		return false, false
	}
	if pad > 0 {
		ne.PutUint32(r.data[off:], uint32(pad-recHdr))
		ne.PutUint32(r.data[off+4:], RecordPad)
		r.pos += pad
		off = 0
	}
	ne.PutUint32(r.data[off:], uint32(len(msg)))
	ne.PutUint32(r.data[off+4:], RecordPost)
	copy(r.data[off+recHdr:], msg)
	r.pos += need
	atomic.SwapUint64(r.u64(postTail), r.pos) // a full barrier in every build (fenceStore)
	if atomic.LoadUint32(r.u32(postAwake)) != 0 {
		return true, false
	}
	r.bells.Add(1)
	return true, true
}

// Doorbells counts the Writes that asked for the doorbell (producer).
func (r *PostRing) Doorbells() uint64 { return r.bells.Load() }

// Tail returns the producer's published tail (consumer; any goroutine): the
// ring position after the last record published so far, as the client wrote
// it (Next checks it).
func (r *PostRing) Tail() uint64 { return atomic.LoadUint64(r.u64(postTail)) }

// Consumed returns the consumer's position (consumer; any goroutine): every
// record before it has been taken by Next.
func (r *PostRing) Consumed() uint64 { return r.seen.Load() }

// Pending reports whether records wait (consumer). Unlike Next it may be
// called concurrently with Next.
func (r *PostRing) Pending() bool { return atomic.LoadUint64(r.u64(postTail)) != r.seen.Load() }

// Closed reports whether the consumer stopped the ring (producer): a post
// published before this look may or may not have been drained.
func (r *PostRing) Closed() bool { return atomic.LoadUint32(r.u32(postAwake)) == postClosed }

// Close marks the ring stopped (consumer): the client's later posts fail
// instead of vanishing. Drain once more after it: a post published before
// the client saw the mark is then taken.
func (r *PostRing) Close() { atomic.SwapUint32(r.u32(postAwake), postClosed) } // fenceStore

// postClosed is the awake value of a stopped ring.
const postClosed = wire.AwakeStopped

// SetAwake publishes whether the consumer is draining (1) or about to sleep (0).
func (r *PostRing) SetAwake(v uint32) { atomic.SwapUint32(r.u32(postAwake), v) } // fenceStore

// fenceStore: the doorbell rule is a store of one word followed by a load of another on each
// side (Dekker), so both stores are exchanges. A Go atomic store is one in a normal amd64
// build, but not under the race detector: there it is a release store (ThreadSanitizer's
// Go interface) and x86 may let the following load pass it when the two sides use different
// mappings of the ring (client and daemon in one test process): TestPostRecvVisible lost a
// doorbell that way, about once in 30 runs under -race on a loaded host. An exchange is a
// full barrier in every build, at the cost of a store here.

// Sleep is the consumer's last step before it waits for the doorbell: it
// clears awake (producers ring from now on), then looks at the tail once
// more. It reports false, leaving awake clear, if records were published
// meanwhile (drain them first): a producer publishes, then reads awake, so
// either it saw 0 and rings, or this look sees its record.
func (r *PostRing) Sleep() bool {
	r.SetAwake(0)
	return !r.Pending()
}

// Next copies the next post message into buf (grown if needed, reused
// otherwise) and consumes it (consumer). It returns nil, nil when the ring
// is empty, ErrRingCorrupt when the client-written data is inconsistent.
func (r *PostRing) Next(buf *[]byte) ([]byte, error) {
	for {
		tail := atomic.LoadUint64(r.u64(postTail))
		avail := tail - r.pos
		if avail == 0 {
			return nil, nil
		}
		if avail > PostRingData || avail%recHdr != 0 {
			return nil, ErrRingCorrupt
		}
		off := r.pos & r.mask
		n := uint64(ne.Uint32(r.data[off:]))
		kind := ne.Uint32(r.data[off+4:])
		need := recHdr + uint64(align8(int(n)))
		switch {
		case kind == RecordPad && off+need == PostRingData && need <= avail:
			r.pos += need
			atomic.StoreUint64(r.u64(postHead), r.pos)
			r.seen.Store(r.pos)
			continue
		case kind != RecordPost || n == 0 || n > MaxPostRecord || off+need > PostRingData || need > avail:
			return nil, ErrRingCorrupt
		}
		if uint64(cap(*buf)) < n {
			*buf = make([]byte, MaxPostRecord)
		}
		msg := (*buf)[:n]
		copy(msg, r.data[off+recHdr:off+recHdr+n])
		r.pos += need
		atomic.StoreUint64(r.u64(postHead), r.pos)
		r.seen.Store(r.pos)
		return msg, nil
	}
}
