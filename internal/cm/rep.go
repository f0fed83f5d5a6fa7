package cm

// REP offsets (IBTA 12.6.8, Table 110).
const (
	repLocalCommID  = 0
	repRemoteCommID = 4
	repLocalQKey    = 8
	repLocalQPN     = 12 // 24 bits, then vendor ID high byte
	repVendorH      = 15
	repLocalEECN    = 16 // 24 bits, then vendor ID middle byte
	repVendorM      = 19
	repStartPSN     = 20 // 24 bits, then vendor ID low byte
	repVendorL      = 23
	repRespRes      = 24
	repInitDepth    = 25
	repByte26       = 26 // target ACK delay 5 | failover accepted 2 | e2e flow control 1
	repByte27       = 27 // RNR retry count 3 | SRQ 1 | reserved 4
	repLocalCAGUID  = 28
	repPrivate      = 36
)

// REP is a view of the Reply to Request for Communication data area (IBTA
// 12.6.8, Table 110):
//
//	 0 LocalCommID(32)
//	 4 RemoteCommID(32)
//	 8 LocalQKey(32)
//	12 LocalQPN(24) VendorID[23:16](8)
//	16 LocalEECN(24) VendorID[15:8](8)
//	20 StartingPSN(24) VendorID[7:0](8)
//	24 ResponderResources(8) InitiatorDepth(8) TargetACKDelay(5) FailoverAccepted(2) EndToEndFlowControl(1)
//	   RNRRetryCount(3) SRQ(1) Reserved(4)
//	28 LocalCAGUID(64)
//	36 PrivateData (196 bytes)
//
// Linux convention: StartingPSN is the PSN the passive side's receive queue
// expects (the active side's first send PSN).
type REP []byte

// REPFields holds every field of a REP.
type REPFields struct {
	LocalCommID         uint32
	RemoteCommID        uint32
	LocalQKey           uint32
	LocalQPN            uint32 // 24 bits
	LocalEECN           uint32 // 24 bits
	StartingPSN         uint32 // 24 bits
	VendorID            uint32 // 24 bits, spread over bytes 15, 19, 23 (ECE)
	ResponderResources  uint8
	InitiatorDepth      uint8
	TargetACKDelay      uint8 // 5 bits
	FailoverAccepted    uint8 // 2 bits
	EndToEndFlowControl bool
	RNRRetryCount       uint8 // 3 bits
	SRQ                 bool
	Resv4               uint8 // low 4 bits of byte 27
	LocalCAGUID         uint64
	PrivateData         [REPPrivateDataSize]byte
}

// LocalCommID returns the sender's (passive side's) communication ID.
func (r REP) LocalCommID() uint32 { return be.Uint32(r[repLocalCommID:]) }

// RemoteCommID returns the receiver's (active side's) communication ID.
func (r REP) RemoteCommID() uint32 { return be.Uint32(r[repRemoteCommID:]) }

// LocalQKey returns the sender's Q_Key.
func (r REP) LocalQKey() uint32 { return be.Uint32(r[repLocalQKey:]) }

// LocalQPN returns the sender's 24-bit QP number.
func (r REP) LocalQPN() uint32 { return get24(r[repLocalQPN:]) }

// LocalEECN returns the sender's EE context number.
func (r REP) LocalEECN() uint32 { return get24(r[repLocalEECN:]) }

// StartingPSN returns the 24-bit starting PSN.
func (r REP) StartingPSN() uint32 { return get24(r[repStartPSN:]) }

// VendorID returns the 24-bit ECE vendor ID.
func (r REP) VendorID() uint32 {
	return uint32(r[repVendorH])<<16 | uint32(r[repVendorM])<<8 | uint32(r[repVendorL])
}

// ResponderResources returns the responder resources.
func (r REP) ResponderResources() uint8 { return r[repRespRes] }

// InitiatorDepth returns the initiator depth.
func (r REP) InitiatorDepth() uint8 { return r[repInitDepth] }

// TargetACKDelay returns the 5-bit target ACK delay.
func (r REP) TargetACKDelay() uint8 { return bits(r[repByte26], 3, 5) }

// FailoverAccepted returns the 2-bit failover accepted code.
func (r REP) FailoverAccepted() uint8 { return bits(r[repByte26], 1, 2) }

// EndToEndFlowControl reports the end-to-end flow control bit.
func (r REP) EndToEndFlowControl() bool { return bits(r[repByte26], 0, 1) != 0 }

// RNRRetryCount returns the 3-bit RNR retry count.
func (r REP) RNRRetryCount() uint8 { return bits(r[repByte27], 5, 3) }

// SRQ reports the SRQ bit.
func (r REP) SRQ() bool { return bits(r[repByte27], 4, 1) != 0 }

// LocalCAGUID returns the sender's CA GUID.
func (r REP) LocalCAGUID() uint64 { return be.Uint64(r[repLocalCAGUID:]) }

// PrivateData returns the 196-byte private data area.
func (r REP) PrivateData() []byte { return r[repPrivate : repPrivate+REPPrivateDataSize] }

// Encode writes every field of f into the data area.
func (r REP) Encode(f *REPFields) {
	_ = r[DataSize-1]
	be.PutUint32(r[repLocalCommID:], f.LocalCommID)
	be.PutUint32(r[repRemoteCommID:], f.RemoteCommID)
	be.PutUint32(r[repLocalQKey:], f.LocalQKey)
	put24(r[repLocalQPN:], f.LocalQPN)
	r[repVendorH] = byte(f.VendorID >> 16)
	put24(r[repLocalEECN:], f.LocalEECN)
	r[repVendorM] = byte(f.VendorID >> 8)
	put24(r[repStartPSN:], f.StartingPSN)
	r[repVendorL] = byte(f.VendorID)
	r[repRespRes] = f.ResponderResources
	r[repInitDepth] = f.InitiatorDepth
	r[repByte26] = f.TargetACKDelay<<3 | (f.FailoverAccepted&3)<<1 | b2u(f.EndToEndFlowControl)
	r[repByte27] = f.RNRRetryCount<<5 | b2u(f.SRQ)<<4 | f.Resv4&0xF
	be.PutUint64(r[repLocalCAGUID:], f.LocalCAGUID)
	copy(r[repPrivate:], f.PrivateData[:])
}

// Fields returns every field of the data area.
func (r REP) Fields() REPFields {
	_ = r[DataSize-1]
	f := REPFields{
		LocalCommID: r.LocalCommID(), RemoteCommID: r.RemoteCommID(), LocalQKey: r.LocalQKey(),
		LocalQPN: r.LocalQPN(), LocalEECN: r.LocalEECN(), StartingPSN: r.StartingPSN(), VendorID: r.VendorID(),
		ResponderResources: r.ResponderResources(), InitiatorDepth: r.InitiatorDepth(),
		TargetACKDelay: r.TargetACKDelay(), FailoverAccepted: r.FailoverAccepted(),
		EndToEndFlowControl: r.EndToEndFlowControl(), RNRRetryCount: r.RNRRetryCount(), SRQ: r.SRQ(),
		Resv4: bits(r[repByte27], 0, 4), LocalCAGUID: r.LocalCAGUID(),
	}
	copy(f.PrivateData[:], r.PrivateData())
	return f
}
