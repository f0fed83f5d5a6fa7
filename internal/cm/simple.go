package cm

// RTU, DREQ and DREP: communication IDs plus private data.

const (
	msgLocalCommID  = 0
	msgRemoteCommID = 4
	rtuPrivate      = 8
	dreqRemoteQPN   = 8 // 24 bits, then a reserved byte
	dreqResv        = 11
	dreqPrivate     = 12
	drepPrivate     = 8
)

// RTU is a view of the Ready To Use data area (IBTA 12.6.9, Table 111):
//
//	0 LocalCommID(32)
//	4 RemoteCommID(32)
//	8 PrivateData (224 bytes)
type RTU []byte

// RTUFields holds every field of an RTU.
type RTUFields struct {
	LocalCommID  uint32
	RemoteCommID uint32
	PrivateData  [RTUPrivateDataSize]byte
}

// LocalCommID returns the sender's communication ID.
func (r RTU) LocalCommID() uint32 { return be.Uint32(r[msgLocalCommID:]) }

// RemoteCommID returns the receiver's communication ID.
func (r RTU) RemoteCommID() uint32 { return be.Uint32(r[msgRemoteCommID:]) }

// PrivateData returns the 224-byte private data area.
func (r RTU) PrivateData() []byte { return r[rtuPrivate : rtuPrivate+RTUPrivateDataSize] }

// Encode writes every field of f into the data area.
func (r RTU) Encode(f *RTUFields) {
	_ = r[DataSize-1]
	be.PutUint32(r[msgLocalCommID:], f.LocalCommID)
	be.PutUint32(r[msgRemoteCommID:], f.RemoteCommID)
	copy(r[rtuPrivate:], f.PrivateData[:])
}

// Fields returns every field of the data area.
func (r RTU) Fields() RTUFields {
	_ = r[DataSize-1]
	f := RTUFields{LocalCommID: r.LocalCommID(), RemoteCommID: r.RemoteCommID()}
	copy(f.PrivateData[:], r.PrivateData())
	return f
}

// DREQ is a view of the Request for Communication Release data area (IBTA
// 12.6.10, Table 112):
//
//	 0 LocalCommID(32)
//	 4 RemoteCommID(32)
//	 8 RemoteQPN/EECN(24) Reserved(8)
//	12 PrivateData (220 bytes)
type DREQ []byte

// DREQFields holds every field of a DREQ.
type DREQFields struct {
	LocalCommID  uint32
	RemoteCommID uint32
	RemoteQPN    uint32 // 24 bits: the receiver's QPN (or EECN)
	Resv         uint8
	PrivateData  [DREQPrivateDataSize]byte
}

// LocalCommID returns the sender's communication ID.
func (r DREQ) LocalCommID() uint32 { return be.Uint32(r[msgLocalCommID:]) }

// RemoteCommID returns the receiver's communication ID.
func (r DREQ) RemoteCommID() uint32 { return be.Uint32(r[msgRemoteCommID:]) }

// RemoteQPN returns the receiver's 24-bit QPN/EECN.
func (r DREQ) RemoteQPN() uint32 { return get24(r[dreqRemoteQPN:]) }

// PrivateData returns the 220-byte private data area.
func (r DREQ) PrivateData() []byte { return r[dreqPrivate : dreqPrivate+DREQPrivateDataSize] }

// Encode writes every field of f into the data area.
func (r DREQ) Encode(f *DREQFields) {
	_ = r[DataSize-1]
	be.PutUint32(r[msgLocalCommID:], f.LocalCommID)
	be.PutUint32(r[msgRemoteCommID:], f.RemoteCommID)
	put24(r[dreqRemoteQPN:], f.RemoteQPN)
	r[dreqResv] = f.Resv
	copy(r[dreqPrivate:], f.PrivateData[:])
}

// Fields returns every field of the data area.
func (r DREQ) Fields() DREQFields {
	_ = r[DataSize-1]
	f := DREQFields{LocalCommID: r.LocalCommID(), RemoteCommID: r.RemoteCommID(),
		RemoteQPN: r.RemoteQPN(), Resv: r[dreqResv]}
	copy(f.PrivateData[:], r.PrivateData())
	return f
}

// DREP is a view of the Reply to Request for Communication Release data area
// (IBTA 12.6.11, Table 113):
//
//	0 LocalCommID(32)
//	4 RemoteCommID(32)
//	8 PrivateData (224 bytes)
type DREP []byte

// DREPFields holds every field of a DREP.
type DREPFields struct {
	LocalCommID  uint32
	RemoteCommID uint32
	PrivateData  [DREPPrivateDataSize]byte
}

// LocalCommID returns the sender's communication ID.
func (r DREP) LocalCommID() uint32 { return be.Uint32(r[msgLocalCommID:]) }

// RemoteCommID returns the receiver's communication ID.
func (r DREP) RemoteCommID() uint32 { return be.Uint32(r[msgRemoteCommID:]) }

// PrivateData returns the 224-byte private data area.
func (r DREP) PrivateData() []byte { return r[drepPrivate : drepPrivate+DREPPrivateDataSize] }

// Encode writes every field of f into the data area.
func (r DREP) Encode(f *DREPFields) {
	_ = r[DataSize-1]
	be.PutUint32(r[msgLocalCommID:], f.LocalCommID)
	be.PutUint32(r[msgRemoteCommID:], f.RemoteCommID)
	copy(r[drepPrivate:], f.PrivateData[:])
}

// Fields returns every field of the data area.
func (r DREP) Fields() DREPFields {
	_ = r[DataSize-1]
	f := DREPFields{LocalCommID: r.LocalCommID(), RemoteCommID: r.RemoteCommID()}
	copy(f.PrivateData[:], r.PrivateData())
	return f
}
