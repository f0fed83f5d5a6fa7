package bth

// FETHSize is the size of the FLUSH Extended Transport Header.
const FETHSize = 4

const (
	fethPlacementMask    = 0x0F
	fethSelectivityMask  = 0x30
	fethSelectivityShift = 4
)

// FLUSH placement types (FETH bits 3..0), IBTA Vol 1 release 1.5 memory
// placement extensions (as rxe's IB_FLUSH_GLOBAL / IB_FLUSH_PERSISTENT).
const (
	FlushGlobal     = 1 << 0 // global visibility
	FlushPersistent = 1 << 1 // persistence
)

// FLUSH selectivity levels (FETH bits 5..4).
const (
	FlushRange = 0 // the range given by the RETH
	FlushMR    = 1 // the whole memory region (RETH VA and length ignored)
)

// FETH is a view of the FLUSH Extended Transport Header (IBTA Vol 1 release
// 1.5, memory placement extensions), carried by RC FLUSH before the
// RETH. The whole word is kept raw (Raw/SetRaw) so reserved bits round-trip;
// Placement and Selectivity decode the defined bits.
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                 Reserved                      |Rsv|Sel|Placem.|
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
type FETH []byte

// Raw returns the whole 32-bit word.
func (f FETH) Raw() uint32 { return be.Uint32(f) }

// SetRaw sets the whole 32-bit word.
func (f FETH) SetRaw(v uint32) { be.PutUint32(f, v) }

// Placement returns the placement type bits (3..0).
func (f FETH) Placement() uint8 { return f[3] & fethPlacementMask }

// Selectivity returns the selectivity level (bits 5..4).
func (f FETH) Selectivity() uint8 { return (f[3] & fethSelectivityMask) >> fethSelectivityShift }

// SetPlacement sets the placement type bits, keeping the others.
func (f FETH) SetPlacement(p uint8) { f[3] = f[3]&^fethPlacementMask | p&fethPlacementMask }

// SetSelectivity sets the selectivity level, keeping the other bits.
func (f FETH) SetSelectivity(s uint8) {
	f[3] = f[3]&^fethSelectivityMask | (s<<fethSelectivityShift)&fethSelectivityMask
}

// FETHFields is the decoded FETH (IBTA Vol 1 release 1.5 FLUSH). Resv keeps the reserved
// bits 31..6 so that Fields then Encode reproduces the word exactly.
type FETHFields struct {
	Placement   uint8  // placement type, bits 3..0 (FlushGlobal, FlushPersistent)
	Selectivity uint8  // selectivity level, bits 5..4 (FlushRange, FlushMR)
	Resv        uint32 // reserved bits 31..6, right-aligned (26 bits)
}

// Encode writes every field of f into the header.
func (f FETH) Encode(v *FETHFields) {
	f.SetRaw(v.Resv<<6 | uint32(v.Selectivity&3)<<fethSelectivityShift | uint32(v.Placement&fethPlacementMask))
}

// Fields returns every field of the header.
func (f FETH) Fields() FETHFields {
	return FETHFields{Placement: f.Placement(), Selectivity: f.Selectivity(), Resv: f.Raw() >> 6}
}
