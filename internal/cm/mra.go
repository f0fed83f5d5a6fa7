package cm

// MsgType names the message an MRA acknowledges or a REJ rejects (IBTA
// 12.6.6 "Message MRAed", 12.6.7 "Message REJected"), 2 bits.
type MsgType uint8

// Values of MRA.MessageMRAed and REJ.MessageRejected.
const (
	MsgREQ   MsgType = 0
	MsgREP   MsgType = 1
	MsgOther MsgType = 2 // LAP for an MRA; "no message / other" for a REJ
)

const (
	mraByte8   = 8 // message MRAed 2 | reserved 6
	mraByte9   = 9 // service timeout 5 | reserved 3
	mraPrivate = 10
)

// MRA is a view of the Message Receipt Acknowledgement data area (IBTA
// 12.6.6, Table 107):
//
//	 0 LocalCommID(32)
//	 4 RemoteCommID(32)
//	 8 MessageMRAed(2) Reserved(6) ServiceTimeout(5) Reserved(3)
//	10 PrivateData (222 bytes)
type MRA []byte

// MRAFields holds every field of an MRA.
type MRAFields struct {
	LocalCommID    uint32
	RemoteCommID   uint32
	MessageMRAed   MsgType // 2 bits
	Resv6          uint8
	ServiceTimeout uint8 // 5 bits: 4.096 us * 2^n
	Resv3          uint8
	PrivateData    [MRAPrivateDataSize]byte
}

// LocalCommID returns the sender's communication ID.
func (r MRA) LocalCommID() uint32 { return be.Uint32(r[msgLocalCommID:]) }

// RemoteCommID returns the receiver's communication ID (0 if unknown).
func (r MRA) RemoteCommID() uint32 { return be.Uint32(r[msgRemoteCommID:]) }

// MessageMRAed returns which message is acknowledged.
func (r MRA) MessageMRAed() MsgType { return MsgType(bits(r[mraByte8], 6, 2)) }

// ServiceTimeout returns the 5-bit service timeout code.
func (r MRA) ServiceTimeout() uint8 { return bits(r[mraByte9], 3, 5) }

// PrivateData returns the 222-byte private data area.
func (r MRA) PrivateData() []byte { return r[mraPrivate : mraPrivate+MRAPrivateDataSize] }

// Encode writes every field of f into the data area.
func (r MRA) Encode(f *MRAFields) {
	_ = r[DataSize-1]
	be.PutUint32(r[msgLocalCommID:], f.LocalCommID)
	be.PutUint32(r[msgRemoteCommID:], f.RemoteCommID)
	r[mraByte8] = uint8(f.MessageMRAed&3)<<6 | f.Resv6&0x3F
	r[mraByte9] = f.ServiceTimeout<<3 | f.Resv3&7
	copy(r[mraPrivate:], f.PrivateData[:])
}

// Fields returns every field of the data area.
func (r MRA) Fields() MRAFields {
	_ = r[DataSize-1]
	f := MRAFields{LocalCommID: r.LocalCommID(), RemoteCommID: r.RemoteCommID(),
		MessageMRAed: r.MessageMRAed(), Resv6: bits(r[mraByte8], 0, 6),
		ServiceTimeout: r.ServiceTimeout(), Resv3: bits(r[mraByte9], 0, 3)}
	copy(f.PrivateData[:], r.PrivateData())
	return f
}
