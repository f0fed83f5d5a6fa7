package bth

// AtomicETHSize is the size of the Atomic Extended Transport Header.
const AtomicETHSize = 28

const (
	atomicVA      = 0
	atomicRKey    = 8
	atomicSwapAdd = 12
	atomicCompare = 20
)

// AtomicETH is a view of the Atomic Extended Transport Header (IBTA Vol 1
// 9.3.4), carried by CmpSwap and FetchAdd requests.
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                  Virtual Address (64 bits)                    |
//	+                                                               +
//	|                                                               |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                             R_Key                             |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                Swap (CmpSwap) or Add (FetchAdd) Data          |
//	+                          (64 bits)                            +
//	|                                                               |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                  Compare Data (64 bits, CmpSwap)              |
//	+                                                               +
//	|                                                               |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
type AtomicETH []byte

// AtomicETHFields holds the fields of an AtomicETH.
type AtomicETHFields struct {
	VA      uint64 // virtual address (8-byte aligned)
	RKey    uint32 // remote key
	SwapAdd uint64 // swap (CmpSwap) or add (FetchAdd) operand
	Compare uint64 // compare operand (CmpSwap)
}

// VA returns the virtual address.
func (a AtomicETH) VA() uint64 { return be.Uint64(a[atomicVA:]) }

// RKey returns the remote key.
func (a AtomicETH) RKey() uint32 { return be.Uint32(a[atomicRKey:]) }

// SwapAdd returns the swap or add operand.
func (a AtomicETH) SwapAdd() uint64 { return be.Uint64(a[atomicSwapAdd:]) }

// Compare returns the compare operand.
func (a AtomicETH) Compare() uint64 { return be.Uint64(a[atomicCompare:]) }

// SetVA sets the virtual address.
func (a AtomicETH) SetVA(v uint64) { be.PutUint64(a[atomicVA:], v) }

// SetRKey sets the remote key.
func (a AtomicETH) SetRKey(k uint32) { be.PutUint32(a[atomicRKey:], k) }

// SetSwapAdd sets the swap or add operand.
func (a AtomicETH) SetSwapAdd(v uint64) { be.PutUint64(a[atomicSwapAdd:], v) }

// SetCompare sets the compare operand.
func (a AtomicETH) SetCompare(v uint64) { be.PutUint64(a[atomicCompare:], v) }

// Encode writes f into the header.
func (a AtomicETH) Encode(f *AtomicETHFields) {
	_ = a[AtomicETHSize-1]
	a.SetVA(f.VA)
	a.SetRKey(f.RKey)
	a.SetSwapAdd(f.SwapAdd)
	a.SetCompare(f.Compare)
}

// Fields returns the fields of the header.
func (a AtomicETH) Fields() AtomicETHFields {
	_ = a[AtomicETHSize-1]
	return AtomicETHFields{VA: a.VA(), RKey: a.RKey(), SwapAdd: a.SwapAdd(), Compare: a.Compare()}
}
