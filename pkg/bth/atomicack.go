package bth

// AtomicAckETHSize is the size of the Atomic Acknowledge Extended Transport Header.
const AtomicAckETHSize = 8

// AtomicAckETH is a view of the Atomic Acknowledge Extended Transport Header
// (IBTA Vol 1 9.3.6): the original remote data of an atomic operation,
// carried by ATOMIC Acknowledge after the AETH.
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                 Original Remote Data (64 bits)                |
//	+                                                               +
//	|                                                               |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
type AtomicAckETH []byte

// AtomicAckETHFields holds the fields of an AtomicAckETH.
type AtomicAckETHFields struct {
	OrigData uint64 // the remote value before the atomic operation
}

// OrigData returns the original remote data.
func (a AtomicAckETH) OrigData() uint64 { return be.Uint64(a) }

// SetOrigData sets the original remote data.
func (a AtomicAckETH) SetOrigData(v uint64) { be.PutUint64(a, v) }

// Encode writes f into the header.
func (a AtomicAckETH) Encode(f *AtomicAckETHFields) { a.SetOrigData(f.OrigData) }

// Fields returns the fields of the header.
func (a AtomicAckETH) Fields() AtomicAckETHFields { return AtomicAckETHFields{OrigData: a.OrigData()} }
