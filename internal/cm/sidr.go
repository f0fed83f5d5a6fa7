package cm

// SIDR offsets (IBTA 12.11.1 Table 119, 12.11.2 Table 120).
const (
	sidrReqRequestID = 0
	sidrReqPKey      = 4
	sidrReqResv      = 6
	sidrReqServiceID = 8
	sidrReqPrivate   = 16

	sidrRepRequestID = 0
	sidrRepStatus    = 4
	sidrRepAddInfLen = 5
	sidrRepVendorH   = 6 // 16 bits (ECE vendor ID high), reserved before IBTA 1.4
	sidrRepQPN       = 8 // 24 bits, then vendor ID low byte
	sidrRepVendorL   = 11
	sidrRepServiceID = 12
	sidrRepQKey      = 20
	sidrRepAddInfo   = 24
	sidrRepPrivate   = 96
)

// SIDRStatus is the SIDR_REP status (IBTA 12.11.2, Table 120).
type SIDRStatus uint8

// SIDR_REP status values.
const (
	SIDRSuccess            SIDRStatus = 0
	SIDRUnsupported        SIDRStatus = 1 // service ID not supported
	SIDRReject             SIDRStatus = 2 // rejected by the service
	SIDRNoQP               SIDRStatus = 3
	SIDRRedirect           SIDRStatus = 4 // see ClassPortInfo in the additional information
	SIDRUnsupportedVersion SIDRStatus = 5
)

// SIDRReq is a view of the Service ID Resolution Request data area (IBTA
// 12.11.1, Table 119):
//
//	 0 RequestID(32)
//	 4 PKey(16) Reserved(16)
//	 8 ServiceID(64)
//	16 PrivateData (216 bytes)
type SIDRReq []byte

// SIDRReqFields holds every field of a SIDR_REQ.
type SIDRReqFields struct {
	RequestID   uint32
	PKey        uint16
	Resv        uint16
	ServiceID   uint64
	PrivateData [SIDRReqPrivateDataSize]byte
}

// RequestID returns the request ID.
func (r SIDRReq) RequestID() uint32 { return be.Uint32(r[sidrReqRequestID:]) }

// PKey returns the partition key.
func (r SIDRReq) PKey() uint16 { return be.Uint16(r[sidrReqPKey:]) }

// ServiceID returns the service ID.
func (r SIDRReq) ServiceID() uint64 { return be.Uint64(r[sidrReqServiceID:]) }

// PrivateData returns the 216-byte private data area.
func (r SIDRReq) PrivateData() []byte {
	return r[sidrReqPrivate : sidrReqPrivate+SIDRReqPrivateDataSize]
}

// Encode writes every field of f into the data area.
func (r SIDRReq) Encode(f *SIDRReqFields) {
	_ = r[DataSize-1]
	be.PutUint32(r[sidrReqRequestID:], f.RequestID)
	be.PutUint16(r[sidrReqPKey:], f.PKey)
	be.PutUint16(r[sidrReqResv:], f.Resv)
	be.PutUint64(r[sidrReqServiceID:], f.ServiceID)
	copy(r[sidrReqPrivate:], f.PrivateData[:])
}

// Fields returns every field of the data area.
func (r SIDRReq) Fields() SIDRReqFields {
	_ = r[DataSize-1]
	f := SIDRReqFields{RequestID: r.RequestID(), PKey: r.PKey(), Resv: be.Uint16(r[sidrReqResv:]),
		ServiceID: r.ServiceID()}
	copy(f.PrivateData[:], r.PrivateData())
	return f
}

// SIDRRep is a view of the Service ID Resolution Response data area (IBTA
// 12.11.2, Table 120):
//
//	 0 RequestID(32)
//	 4 Status(8) AdditionalInformationLength(8) VendorID[23:8](16)
//	 8 QPN(24) VendorID[7:0](8)
//	12 ServiceID(64)
//	20 QKey(32)
//	24 AdditionalInformation / ClassPortInfo (72 bytes)
//	96 PrivateData (136 bytes)
type SIDRRep []byte

// SIDRRepFields holds every field of a SIDR_REP.
type SIDRRepFields struct {
	RequestID     uint32
	Status        SIDRStatus
	AddInfoLength uint8
	VendorID      uint32 // 24 bits (ECE)
	QPN           uint32 // 24 bits
	ServiceID     uint64
	QKey          uint32
	AddInfo       [SIDRRepAddInfoSize]byte
	PrivateData   [SIDRRepPrivateDataSize]byte
}

// RequestID returns the request ID of the SIDR_REQ answered.
func (r SIDRRep) RequestID() uint32 { return be.Uint32(r[sidrRepRequestID:]) }

// Status returns the status.
func (r SIDRRep) Status() SIDRStatus { return SIDRStatus(r[sidrRepStatus]) }

// AddInfoLength returns the additional information length.
func (r SIDRRep) AddInfoLength() uint8 { return r[sidrRepAddInfLen] }

// VendorID returns the 24-bit ECE vendor ID.
func (r SIDRRep) VendorID() uint32 {
	return uint32(be.Uint16(r[sidrRepVendorH:]))<<8 | uint32(r[sidrRepVendorL])
}

// QPN returns the 24-bit QPN of the service.
func (r SIDRRep) QPN() uint32 { return get24(r[sidrRepQPN:]) }

// ServiceID returns the service ID.
func (r SIDRRep) ServiceID() uint64 { return be.Uint64(r[sidrRepServiceID:]) }

// QKey returns the Q_Key of the service.
func (r SIDRRep) QKey() uint32 { return be.Uint32(r[sidrRepQKey:]) }

// PrivateData returns the 136-byte private data area.
func (r SIDRRep) PrivateData() []byte {
	return r[sidrRepPrivate : sidrRepPrivate+SIDRRepPrivateDataSize]
}

// Encode writes every field of f into the data area.
func (r SIDRRep) Encode(f *SIDRRepFields) {
	_ = r[DataSize-1]
	be.PutUint32(r[sidrRepRequestID:], f.RequestID)
	r[sidrRepStatus] = uint8(f.Status)
	r[sidrRepAddInfLen] = f.AddInfoLength
	be.PutUint16(r[sidrRepVendorH:], uint16(f.VendorID>>8))
	put24(r[sidrRepQPN:], f.QPN)
	r[sidrRepVendorL] = byte(f.VendorID)
	be.PutUint64(r[sidrRepServiceID:], f.ServiceID)
	be.PutUint32(r[sidrRepQKey:], f.QKey)
	copy(r[sidrRepAddInfo:], f.AddInfo[:])
	copy(r[sidrRepPrivate:], f.PrivateData[:])
}

// Fields returns every field of the data area.
func (r SIDRRep) Fields() SIDRRepFields {
	_ = r[DataSize-1]
	f := SIDRRepFields{RequestID: r.RequestID(), Status: r.Status(), AddInfoLength: r.AddInfoLength(),
		VendorID: r.VendorID(), QPN: r.QPN(), ServiceID: r.ServiceID(), QKey: r.QKey()}
	copy(f.AddInfo[:], r[sidrRepAddInfo:sidrRepAddInfo+SIDRRepAddInfoSize])
	copy(f.PrivateData[:], r.PrivateData())
	return f
}
