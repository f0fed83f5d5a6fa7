package bth

// RETHSize is the size of the RDMA Extended Transport Header.
const RETHSize = 16

const (
	rethVA     = 0
	rethRKey   = 8
	rethDMALen = 12
)

// RETH is a view of the RDMA Extended Transport Header (IBTA Vol 1 9.3.3),
// carried by RDMA WRITE First/Only, RDMA READ Request, FLUSH and ATOMIC WRITE.
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                     Virtual Address (63..32)                  |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                     Virtual Address (31..0)                   |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                             R_Key                             |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                          DMA Length                           |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
type RETH []byte

// RETHFields holds the fields of a RETH.
type RETHFields struct {
	VA     uint64 // virtual address
	RKey   uint32 // remote key
	DMALen uint32 // DMA length in bytes
}

// VA returns the virtual address.
func (r RETH) VA() uint64 { return be.Uint64(r[rethVA:]) }

// RKey returns the remote key.
func (r RETH) RKey() uint32 { return be.Uint32(r[rethRKey:]) }

// DMALen returns the DMA length.
func (r RETH) DMALen() uint32 { return be.Uint32(r[rethDMALen:]) }

// SetVA sets the virtual address.
func (r RETH) SetVA(v uint64) { be.PutUint64(r[rethVA:], v) }

// SetRKey sets the remote key.
func (r RETH) SetRKey(k uint32) { be.PutUint32(r[rethRKey:], k) }

// SetDMALen sets the DMA length.
func (r RETH) SetDMALen(n uint32) { be.PutUint32(r[rethDMALen:], n) }

// Encode writes f into the header.
func (r RETH) Encode(f *RETHFields) {
	_ = r[RETHSize-1]
	r.SetVA(f.VA)
	r.SetRKey(f.RKey)
	r.SetDMALen(f.DMALen)
}

// Fields returns the fields of the header.
func (r RETH) Fields() RETHFields {
	_ = r[RETHSize-1]
	return RETHFields{VA: r.VA(), RKey: r.RKey(), DMALen: r.DMALen()}
}
