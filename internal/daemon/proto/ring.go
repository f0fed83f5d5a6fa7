package proto

import (
	"encoding/binary"
	"sync/atomic"
	"unsafe"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
)

// Completion ring: a single-producer (daemon) single-consumer (client)
// ring of work completions in a shared memfd (docs/daemon-protocol.md,
// "Completion ring"; wire.CQ*). Layout (host byte order):
//
//	0    tail   uint64  entries produced (daemon writes)
//	64   head   uint64  entries consumed (client writes)
//	128  armed  uint32  client: ReqNotify's arm, bits 0-1: 1 = the next completion, 2 = the next
//	                    solicited one; bit 2 (ArmSleeping): the client waits on the notify eventfd
//	132  wait   uint32  daemon: 1 = ring was full, signal the space eventfd after consuming
//	256  entries, RingEntrySize bytes each, capacity a power of two
//
// The counters are free-running; index = counter & (capacity-1). The
// daemon never trusts the head it reads: if tail-head exceeds the capacity
// it treats the ring as full, so a client corrupting the header only hurts
// its own completions.
//
// Notification (ReqNotify, IBTA 11.4.2.2): the daemon publishes a
// completion, then takes a matching arm (Fire: compare-and-swap of the arm
// word to 0) and writes the notify eventfd only if the arm carried
// ArmSleeping. A client that arms without ArmSleeping is awake and
// watching the arm word: the arm turning 0 is its event, no system call on
// either side. Before it blocks it sets ArmSleeping with a compare-and-swap
// on the same word (Sleep), which fails if the daemon took the arm
// meanwhile: setting "sleeping" and re-checking are one atomic step, so
// the daemon either sees the flag (and signals) or took the arm first (and
// the client does not block). Client side: arm, then read the tail (Poll);
// daemon side: publish the tail, then read the arm — all sequentially
// consistent, so a completion racing ReqNotify is polled or signalled.
const (
	ringTail      = wire.CQTail
	ringHead      = wire.CQHead
	ringArmed     = wire.CQArmed
	ringWait      = wire.CQWait
	RingHeader    = wire.CQEntries
	RingEntrySize = wire.CQEntrySize
)

// Armed values: the arm kind (bits 0-1) and the ArmSleeping flag.
const (
	ArmNone      = wire.ArmNone
	ArmNext      = wire.ArmNext
	ArmSolicited = wire.ArmSolicited
	// ArmSleeping: the client's waiter is blocked on the notify eventfd; a
	// matching completion must write it.
	ArmSleeping = wire.ArmSleeping

	armKind = wire.ArmKind
)

// RingBytes is the memfd size of a ring of capacity entries.
func RingBytes(capacity int) int { return RoundPage(RingHeader + capacity*RingEntrySize) }

// RingCapacity is the ring capacity for a CQ of cqe entries: the next
// power of two >= cqe.
func RingCapacity(cqe int) int {
	n := 1
	for n < cqe {
		n <<= 1
	}
	return n
}

// Ring is a view of a completion ring in mapped memory.
type Ring struct {
	mem  []byte
	mask uint64
}

// NewRing views mem (RingBytes(capacity) bytes) as a ring; capacity must be a power of two.
func NewRing(mem []byte, capacity int) (*Ring, bool) {
	if capacity <= 0 || capacity&(capacity-1) != 0 || len(mem) < RingHeader+capacity*RingEntrySize {
		return nil, false
	}
	return &Ring{mem: mem, mask: uint64(capacity - 1)}, true
}

func (r *Ring) u64(off int) *uint64 { return (*uint64)(unsafe.Pointer(&r.mem[off])) }
func (r *Ring) u32(off int) *uint32 { return (*uint32)(unsafe.Pointer(&r.mem[off])) }

// Capacity is the number of entries.
func (r *Ring) Capacity() int { return int(r.mask + 1) }

// Tail loads the producer counter.
func (r *Ring) Tail() uint64 { return atomic.LoadUint64(r.u64(ringTail)) }

// Head loads the consumer counter.
func (r *Ring) Head() uint64 { return atomic.LoadUint64(r.u64(ringHead)) }

// Space returns how many entries the producer may write after tail (its own
// copy): 0 if the ring is full or the consumer's head is corrupt.
func (r *Ring) Space(tail uint64) int {
	used := tail - r.Head()
	if used > r.mask+1 {
		return 0
	}
	return int(r.mask + 1 - used)
}

// Put writes wc at position pos (not yet published).
func (r *Ring) Put(pos uint64, wc *cq.WC) {
	EncodeWC(r.mem[RingHeader+int(pos&r.mask)*RingEntrySize:], wc)
}

// Publish makes entries up to tail visible to the consumer.
func (r *Ring) Publish(tail uint64) { atomic.StoreUint64(r.u64(ringTail), tail) }

// Get reads the entry at position pos.
func (r *Ring) Get(pos uint64, wc *cq.WC) {
	DecodeWC(r.mem[RingHeader+int(pos&r.mask)*RingEntrySize:], wc)
}

// Consume publishes the consumer counter.
func (r *Ring) Consume(head uint64) { atomic.StoreUint64(r.u64(ringHead), head) }

// Clean takes the completions of QP qpn out of the entries the consumer has not consumed, from
// head to tail (the consumer's own counter and its load of the producer's): the others are
// moved towards tail, in order, and Clean returns the head past the ones freed, for the
// consumer to publish (Consume). The producer writes only at and beyond tail, so the entries
// moved are the consumer's alone. A QP moved to RESET has its CQs cleaned so (IBTA 10.3.1: a QP
// in Reset has no work requests; rdma-core's mlx4 and mlx5 providers do the same).
func (r *Ring) Clean(head, tail uint64, qpn uint32) uint64 {
	if tail-head > r.mask+1 {
		return head // a count the consumer cannot believe: nothing moved
	}
	var wc cq.WC
	freed := uint64(0)
	for i := tail; i != head; {
		i--
		r.Get(i, &wc)
		if wc.QPNum == qpn {
			freed++
		} else if freed > 0 {
			copy(r.entry(i+freed), r.entry(i))
		}
	}
	return head + freed
}

// Arm sets the notification request kind (ArmNext or ArmSolicited;
// ArmNext upgrades ArmSolicited, IBTA 11.4.2.2), sleeping or awake
// (client). An awake arm must be followed by Sleep (or by watching Taken).
func (r *Ring) Arm(kind uint32, sleeping bool) {
	p := r.u32(ringArmed)
	for {
		w := atomic.LoadUint32(p)
		k := kind
		if w&armKind == ArmNext {
			k = ArmNext
		}
		nw := k
		if sleeping || w&armKind != 0 && w&ArmSleeping != 0 {
			nw |= ArmSleeping // an earlier arm's waiter still blocks
		}
		if atomic.CompareAndSwapUint32(p, w, nw) {
			return
		}
	}
}

// Sleep marks an armed client as blocked (client): the daemon will write
// the notify eventfd for the completion that takes the arm. It reports
// false, changing nothing, if the arm was already taken (the completion is
// in the ring: the caller does not block and raises the event itself).
func (r *Ring) Sleep() bool {
	p := r.u32(ringArmed)
	for {
		w := atomic.LoadUint32(p)
		if w&armKind == ArmNone {
			return false
		}
		if atomic.CompareAndSwapUint32(p, w, w|ArmSleeping) {
			return true
		}
	}
}

// Taken reports whether no arm is pending (client: after Arm, the daemon
// took it for a completion).
func (r *Ring) Taken() bool { return atomic.LoadUint32(r.u32(ringArmed))&armKind == ArmNone }

// fireTries bounds Fire's compare-and-swap retries against a client that
// keeps rewriting the arm word.
const fireTries = 8

// Fire takes the arm if it matches a just-published completion (daemon,
// after Publish): ArmNext always, ArmSolicited if solicited (the caller
// passes true for an unsuccessful completion too, IBTA 11.4.2.2). It
// reports whether the client sleeps, i.e. whether to write the notify
// eventfd. A client rewriting the word so that every compare-and-swap
// fails gets the arm taken by force and a signal.
func (r *Ring) Fire(solicited bool) bool {
	p := r.u32(ringArmed)
	for i := 0; i < fireTries; i++ {
		w := atomic.LoadUint32(p)
		if k := w & armKind; k != ArmNext && (k != ArmSolicited || !solicited) {
			return false
		}
		if atomic.CompareAndSwapUint32(p, w, ArmNone) {
			return w&ArmSleeping != 0
		}
	}
	return atomic.SwapUint32(p, ArmNone)&armKind != ArmNone
}

// MoveFrom fills r, a new ring, with old's state, tail being the producer's own count (the
// daemon's, on ibv_resize_cq): the unconsumed entries, old's head to tail, copied as they are
// to the same positions of r (counters are free-running, so entry i sits at i & (capacity-1)
// in each), both counters and the arm word (a pending arm and the client's sleeping flag carry
// over). The wait flag stays 0: the producer sets it again if r fills. The caller keeps the
// producer and the consumer off both rings. It reports false, changing nothing, if old's head
// is one the producer cannot believe (Space: more than old's capacity behind tail) or r has
// fewer entries than tail-head.
func (r *Ring) MoveFrom(old *Ring, tail uint64) bool {
	head := old.Head()
	used := tail - head
	if used > old.mask+1 || used > r.mask+1 {
		return false
	}
	for i := head; i != tail; i++ {
		copy(r.entry(i), old.entry(i))
	}
	r.Consume(head)
	r.Publish(tail)
	atomic.StoreUint32(r.u32(ringArmed), atomic.LoadUint32(old.u32(ringArmed)))
	return true
}

// Used is how many entries the consumer has not consumed (tail is the producer's count); a
// head it cannot believe reads as more than the capacity, as in Space.
func (r *Ring) Used(tail uint64) uint64 { return tail - r.Head() }

func (r *Ring) entry(pos uint64) []byte {
	off := RingHeader + int(pos&r.mask)*RingEntrySize
	return r.mem[off : off+RingEntrySize]
}

// Armed loads the notification request kind (ArmNone, ArmNext or ArmSolicited).
func (r *Ring) Armed() uint32 { return atomic.LoadUint32(r.u32(ringArmed)) & armKind }

// Sleeping reports whether the arm word carries ArmSleeping.
func (r *Ring) Sleeping() bool { return atomic.LoadUint32(r.u32(ringArmed))&ArmSleeping != 0 }

// SetWaiting records that the producer waits for space (1) or not (0).
// An exchange, not a store: the producer then re-reads the head (a store followed by a load,
// which must not pass it, even under the race detector: fenceStore in postring.go).
func (r *Ring) SetWaiting(v uint32) { atomic.SwapUint32(r.u32(ringWait), v) }

// TakeWaiting clears the producer-waiting flag and reports whether it was set.
func (r *Ring) TakeWaiting() bool { return atomic.SwapUint32(r.u32(ringWait), 0) != 0 }

// ne is the host byte order every shared layout uses (docs/daemon-protocol.md).
var ne = binary.NativeEndian

// Offsets of the completion entry's fields (wire.WC: struct ibv_wc's first 46 bytes).
var (
	wcStatus    = unsafe.Offsetof(wire.WC{}.Status)
	wcOpcode    = unsafe.Offsetof(wire.WC{}.Opcode)
	wcVendorErr = unsafe.Offsetof(wire.WC{}.VendorErr)
	wcByteLen   = unsafe.Offsetof(wire.WC{}.ByteLen)
	wcImm       = unsafe.Offsetof(wire.WC{}.ImmData)
	wcQPNum     = unsafe.Offsetof(wire.WC{}.QPNum)
	wcSrcQP     = unsafe.Offsetof(wire.WC{}.SrcQP)
	wcFlags     = unsafe.Offsetof(wire.WC{}.WCFlags)
	wcPKeyIndex = unsafe.Offsetof(wire.WC{}.PKeyIndex)
	wcSLID      = unsafe.Offsetof(wire.WC{}.SLID)
	wcSL        = unsafe.Offsetof(wire.WC{}.SL)
	wcDLIDBits  = unsafe.Offsetof(wire.WC{}.DLIDPathBits)
)

// EncodeWC writes wc into b (RingEntrySize bytes) as a wire.WC: ibv_wc's
// layout and values, the immediate in network byte order (IBV_WC_WITH_IMM),
// the invalidated rkey in the same word (IBV_WC_WITH_INV).
func EncodeWC(b []byte, wc *cq.WC) {
	_ = b[RingEntrySize-1]
	ne.PutUint64(b[0:], wc.WRID)
	ne.PutUint32(b[wcStatus:], uint32(wc.Status))
	ne.PutUint32(b[wcOpcode:], uint32(wc.Opcode))
	ne.PutUint32(b[wcVendorErr:], wc.VendorErr)
	ne.PutUint32(b[wcByteLen:], wc.ByteLen)
	switch {
	case wc.Flags&cq.FlagWithImm != 0:
		binary.BigEndian.PutUint32(b[wcImm:], wc.ImmData)
	case wc.Flags&cq.FlagWithInv != 0:
		ne.PutUint32(b[wcImm:], wc.InvalidatedRKey)
	default:
		ne.PutUint32(b[wcImm:], 0)
	}
	ne.PutUint32(b[wcQPNum:], wc.QPNum)
	ne.PutUint32(b[wcSrcQP:], wc.SrcQP)
	ne.PutUint32(b[wcFlags:], uint32(wc.Flags))
	ne.PutUint16(b[wcPKeyIndex:], wc.PKeyIndex)
	ne.PutUint16(b[wcSLID:], wc.SLID)
	b[wcSL] = wc.SL
	b[wcDLIDBits] = wc.DLIDPathBits
}

// DecodeWC reads a completion written by EncodeWC (values out of the engine's
// ranges are kept as they are: the ring is the client's own).
func DecodeWC(b []byte, wc *cq.WC) {
	_ = b[RingEntrySize-1]
	*wc = cq.WC{
		WRID:         ne.Uint64(b[0:]),
		Status:       cq.Status(ne.Uint32(b[wcStatus:])),
		Opcode:       cq.Opcode(ne.Uint32(b[wcOpcode:])),
		VendorErr:    ne.Uint32(b[wcVendorErr:]),
		ByteLen:      ne.Uint32(b[wcByteLen:]),
		QPNum:        ne.Uint32(b[wcQPNum:]),
		SrcQP:        ne.Uint32(b[wcSrcQP:]),
		Flags:        cq.Flags(ne.Uint32(b[wcFlags:])),
		PKeyIndex:    ne.Uint16(b[wcPKeyIndex:]),
		SLID:         ne.Uint16(b[wcSLID:]),
		SL:           b[wcSL],
		DLIDPathBits: b[wcDLIDBits],
	}
	switch {
	case wc.Flags&cq.FlagWithImm != 0:
		wc.ImmData = binary.BigEndian.Uint32(b[wcImm:])
	case wc.Flags&cq.FlagWithInv != 0:
		wc.InvalidatedRKey = ne.Uint32(b[wcImm:])
	}
}
