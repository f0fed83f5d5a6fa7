package bth

// IETHSize is the size of the Invalidate Extended Transport Header.
const IETHSize = 4

// IETH is a view of the Invalidate Extended Transport Header (IBTA Vol 1
// 9.3.8): the R_Key the responder invalidates, carried by SEND Last/Only
// with Invalidate.
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                             R_Key                             |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
type IETH []byte

// RKey returns the R_Key to invalidate.
func (i IETH) RKey() uint32 { return be.Uint32(i) }

// SetRKey sets the R_Key to invalidate.
func (i IETH) SetRKey(k uint32) { be.PutUint32(i, k) }

// IETHFields is the decoded IETH (IBTA 9.3.8).
type IETHFields struct {
	RKey uint32 // the R_Key to invalidate
}

// Encode writes every field of f into the header.
func (i IETH) Encode(f *IETHFields) { i.SetRKey(f.RKey) }

// Fields returns every field of the header.
func (i IETH) Fields() IETHFields { return IETHFields{RKey: i.RKey()} }
