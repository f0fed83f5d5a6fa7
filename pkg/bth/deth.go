package bth

// DETHSize is the size of the Datagram Extended Transport Header.
const DETHSize = 8

const (
	dethQKey  = 0
	dethResv  = 4
	dethSrcQP = 5
)

// DETH is a view of the Datagram Extended Transport Header (IBTA Vol 1
// 9.3.2), carried by UD and RD requests.
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                             Q_Key                             |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|   Reserved    |                  Source QP                    |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
type DETH []byte

// DETHFields holds every field of a DETH, the reserved byte included.
type DETHFields struct {
	QKey  uint32 // queue key
	Resv  uint8  // reserved byte
	SrcQP uint32 // source QP, 24 bits
}

// QKey returns the queue key.
func (d DETH) QKey() uint32 { return be.Uint32(d[dethQKey:]) }

// Resv returns the reserved byte.
func (d DETH) Resv() uint8 { return d[dethResv] }

// SrcQP returns the 24-bit source QP.
func (d DETH) SrcQP() uint32 { return get24(d[dethSrcQP:]) }

// SetQKey sets the queue key.
func (d DETH) SetQKey(k uint32) { be.PutUint32(d[dethQKey:], k) }

// SetSrcQP sets the source QP (low 24 bits).
func (d DETH) SetSrcQP(qpn uint32) { put24(d[dethSrcQP:], qpn) }

// Encode writes every field of f into the header.
func (d DETH) Encode(f *DETHFields) {
	_ = d[DETHSize-1]
	d.SetQKey(f.QKey)
	d[dethResv] = f.Resv
	d.SetSrcQP(f.SrcQP)
}

// Fields returns every field of the header.
func (d DETH) Fields() DETHFields {
	_ = d[DETHSize-1]
	return DETHFields{QKey: d.QKey(), Resv: d.Resv(), SrcQP: d.SrcQP()}
}
