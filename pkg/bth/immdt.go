package bth

// ImmDtSize is the size of the Immediate Data Extended Transport Header.
const ImmDtSize = 4

// ImmDt is a view of the Immediate Data Extended Transport Header (IBTA Vol 1
// 9.3.7), carried by the "with Immediate" SEND and RDMA WRITE opcodes. The
// value is opaque to the transport; Imm reads it big-endian (as the bytes
// appear on the wire), which is how the completion reports it.
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                        Immediate Data                         |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
type ImmDt []byte

// Imm returns the immediate data, read big-endian.
func (i ImmDt) Imm() uint32 { return be.Uint32(i) }

// SetImm sets the immediate data, written big-endian.
func (i ImmDt) SetImm(v uint32) { be.PutUint32(i, v) }

// ImmDtFields is the decoded ImmDt (IBTA 9.3.7).
type ImmDtFields struct {
	Imm uint32 // immediate data, as read big-endian
}

// Encode writes every field of f into the header.
func (i ImmDt) Encode(f *ImmDtFields) { i.SetImm(f.Imm) }

// Fields returns every field of the header.
func (i ImmDt) Fields() ImmDtFields { return ImmDtFields{Imm: i.Imm()} }
