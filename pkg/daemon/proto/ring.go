package proto

import (
	"encoding/binary"
	"sync/atomic"
	"unsafe"

	"github.com/softroce/softroce/pkg/cq"
)

// Completion ring: a single-producer (daemon) single-consumer (client)
// ring of work completions in a shared memfd. Layout (little endian):
//
//	0    tail   uint64  entries produced (daemon writes)
//	64   head   uint64  entries consumed (client writes)
//	128  armed  uint32  client: 1 = notify on the next completion, 2 = next solicited (ReqNotify)
//	132  wait   uint32  daemon: 1 = ring was full, signal the space eventfd after consuming
//	256  entries, RingEntrySize bytes each, capacity a power of two
//
// The counters are free-running; index = counter & (capacity-1). The
// daemon never trusts the head it reads: if tail-head exceeds the capacity
// it treats the ring as full, so a client corrupting the header only hurts
// its own completions.
const (
	ringTail      = 0
	ringHead      = 64
	ringArmed     = 128
	ringWait      = 132
	RingHeader    = 256
	RingEntrySize = 64
)

// Armed values.
const (
	ArmNone      = 0
	ArmNext      = 1
	ArmSolicited = 2
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

// Arm sets the notification request (ArmNext upgrades ArmSolicited).
func (r *Ring) Arm(v uint32) {
	if v == ArmSolicited {
		atomic.CompareAndSwapUint32(r.u32(ringArmed), ArmNone, ArmSolicited)
		return
	}
	atomic.StoreUint32(r.u32(ringArmed), v)
}

// TakeArm clears and returns the notification request.
func (r *Ring) TakeArm() uint32 { return atomic.SwapUint32(r.u32(ringArmed), ArmNone) }

// Armed loads the notification request.
func (r *Ring) Armed() uint32 { return atomic.LoadUint32(r.u32(ringArmed)) }

// SetWaiting records that the producer waits for space (1) or not (0).
func (r *Ring) SetWaiting(v uint32) { atomic.StoreUint32(r.u32(ringWait), v) }

// TakeWaiting clears the producer-waiting flag and reports whether it was set.
func (r *Ring) TakeWaiting() bool { return atomic.SwapUint32(r.u32(ringWait), 0) != 0 }

// EncodeWC writes wc into b (RingEntrySize bytes).
func EncodeWC(b []byte, wc *cq.WC) {
	_ = b[47]
	le := binary.LittleEndian
	le.PutUint64(b[0:], wc.WRID)
	le.PutUint32(b[8:], wc.VendorErr)
	le.PutUint32(b[12:], wc.ByteLen)
	le.PutUint32(b[16:], wc.ImmData)
	le.PutUint32(b[20:], wc.InvalidatedRKey)
	le.PutUint32(b[24:], wc.QPNum)
	le.PutUint32(b[28:], wc.SrcQP)
	le.PutUint16(b[32:], wc.PKeyIndex)
	le.PutUint16(b[34:], wc.SLID)
	b[36] = byte(wc.Status)
	b[37] = byte(wc.Opcode)
	b[38] = byte(wc.Flags)
	b[39] = wc.SL
	b[40] = wc.DLIDPathBits
}

// DecodeWC reads a completion written by EncodeWC.
func DecodeWC(b []byte, wc *cq.WC) {
	_ = b[47]
	le := binary.LittleEndian
	wc.WRID = le.Uint64(b[0:])
	wc.VendorErr = le.Uint32(b[8:])
	wc.ByteLen = le.Uint32(b[12:])
	wc.ImmData = le.Uint32(b[16:])
	wc.InvalidatedRKey = le.Uint32(b[20:])
	wc.QPNum = le.Uint32(b[24:])
	wc.SrcQP = le.Uint32(b[28:])
	wc.PKeyIndex = le.Uint16(b[32:])
	wc.SLID = le.Uint16(b[34:])
	wc.Status = cq.Status(b[36])
	wc.Opcode = cq.Opcode(b[37])
	wc.Flags = cq.Flags(b[38])
	wc.SL = b[39]
	wc.DLIDPathBits = b[40]
}
