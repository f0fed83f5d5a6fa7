package cm

import "fmt"

// RejectReason is a REJ reason code (IBTA 12.6.7.2, Table 109).
type RejectReason uint16

// REJ reason codes (IBTA Table 109; names as in include/rdma/ib_cm.h).
const (
	RejNoQP                      RejectReason = 1
	RejNoEEC                     RejectReason = 2
	RejNoResources               RejectReason = 3
	RejTimeout                   RejectReason = 4 // ARI: the rejecting CA's GUID
	RejUnsupported               RejectReason = 5
	RejInvalidCommID             RejectReason = 6
	RejInvalidCommInstance       RejectReason = 7
	RejInvalidServiceID          RejectReason = 8
	RejInvalidTransportType      RejectReason = 9
	RejStaleConn                 RejectReason = 10
	RejRDCNotExist               RejectReason = 11
	RejInvalidGID                RejectReason = 12
	RejInvalidLID                RejectReason = 13
	RejInvalidSL                 RejectReason = 14
	RejInvalidTrafficClass       RejectReason = 15
	RejInvalidHopLimit           RejectReason = 16
	RejInvalidPacketRate         RejectReason = 17
	RejInvalidAltGID             RejectReason = 18
	RejInvalidAltLID             RejectReason = 19
	RejInvalidAltSL              RejectReason = 20
	RejInvalidAltTrafficClass    RejectReason = 21
	RejInvalidAltHopLimit        RejectReason = 22
	RejInvalidAltPacketRate      RejectReason = 23
	RejPortCMRedirect            RejectReason = 24
	RejPortRedirect              RejectReason = 25
	RejInvalidMTU                RejectReason = 26
	RejInsufficientRespResources RejectReason = 27
	RejConsumerDefined           RejectReason = 28
	RejInvalidRNRRetry           RejectReason = 29
	RejDuplicateLocalCommID      RejectReason = 30
	RejInvalidClassVersion       RejectReason = 31
	RejInvalidFlowLabel          RejectReason = 32
	RejInvalidAltFlowLabel       RejectReason = 33
	RejVendorOptionNotSupported  RejectReason = 35
)

var rejNames = [...]string{
	RejNoQP: "no QP", RejNoEEC: "no EEC", RejNoResources: "no resources", RejTimeout: "timeout",
	RejUnsupported: "unsupported", RejInvalidCommID: "invalid comm ID",
	RejInvalidCommInstance: "invalid comm instance", RejInvalidServiceID: "invalid service ID",
	RejInvalidTransportType: "invalid transport type", RejStaleConn: "stale conn",
	RejRDCNotExist: "RDC not exist", RejInvalidGID: "invalid GID", RejInvalidLID: "invalid LID",
	RejInvalidSL: "invalid SL", RejInvalidTrafficClass: "invalid traffic class",
	RejInvalidHopLimit: "invalid hop limit", RejInvalidPacketRate: "invalid packet rate",
	RejInvalidAltGID: "invalid alt GID", RejInvalidAltLID: "invalid alt LID", RejInvalidAltSL: "invalid alt SL",
	RejInvalidAltTrafficClass: "invalid alt traffic class", RejInvalidAltHopLimit: "invalid alt hop limit",
	RejInvalidAltPacketRate: "invalid alt packet rate", RejPortCMRedirect: "port CM redirect",
	RejPortRedirect: "port redirect", RejInvalidMTU: "invalid MTU",
	RejInsufficientRespResources: "insufficient resp resources", RejConsumerDefined: "consumer defined",
	RejInvalidRNRRetry: "invalid RNR retry", RejDuplicateLocalCommID: "duplicate local comm ID",
	RejInvalidClassVersion: "invalid class version", RejInvalidFlowLabel: "invalid flow label",
	RejInvalidAltFlowLabel: "invalid alt flow label", RejVendorOptionNotSupported: "vendor option not supported",
}

// String returns the reason text the Linux CM prints (ibcm_reject_msg).
func (r RejectReason) String() string {
	if int(r) < len(rejNames) && rejNames[r] != "" {
		return rejNames[r]
	}
	return fmt.Sprintf("unrecognized reason %d", uint16(r))
}

const (
	rejByte8   = 8 // message rejected 2 | reserved 6
	rejByte9   = 9 // rejected info length 7 | reserved 1
	rejReason  = 10
	rejARI     = 12
	rejPrivate = 84
)

// REJ is a view of the Reject data area (IBTA 12.6.7, Table 108):
//
//	 0 LocalCommID(32)
//	 4 RemoteCommID(32)
//	 8 MessageRejected(2) Reserved(6) RejectedInfoLength(7) Reserved(1) Reason(16)
//	12 AdditionalRejectInformation (72 bytes)
//	84 PrivateData (148 bytes)
type REJ []byte

// REJFields holds every field of a REJ.
type REJFields struct {
	LocalCommID     uint32
	RemoteCommID    uint32
	MessageRejected MsgType // 2 bits
	Resv6           uint8
	ARILength       uint8 // 7 bits, bytes of ARI used
	Resv1           uint8
	Reason          RejectReason
	ARI             [REJARISize]byte
	PrivateData     [REJPrivateDataSize]byte
}

// LocalCommID returns the sender's communication ID (0 when rejecting a REQ).
func (r REJ) LocalCommID() uint32 { return be.Uint32(r[msgLocalCommID:]) }

// RemoteCommID returns the receiver's communication ID.
func (r REJ) RemoteCommID() uint32 { return be.Uint32(r[msgRemoteCommID:]) }

// MessageRejected returns which message is rejected.
func (r REJ) MessageRejected() MsgType { return MsgType(bits(r[rejByte8], 6, 2)) }

// ARILength returns the 7-bit length of the additional reject information.
func (r REJ) ARILength() uint8 { return bits(r[rejByte9], 1, 7) }

// Reason returns the reject reason.
func (r REJ) Reason() RejectReason { return RejectReason(be.Uint16(r[rejReason:])) }

// ARI returns the used part of the additional reject information (at most
// 72 bytes, even if the length field claims more).
func (r REJ) ARI() []byte {
	n := int(r.ARILength())
	if n > REJARISize {
		n = REJARISize
	}
	return r[rejARI : rejARI+n]
}

// PrivateData returns the 148-byte private data area.
func (r REJ) PrivateData() []byte { return r[rejPrivate : rejPrivate+REJPrivateDataSize] }

// Encode writes every field of f into the data area.
func (r REJ) Encode(f *REJFields) {
	_ = r[DataSize-1]
	be.PutUint32(r[msgLocalCommID:], f.LocalCommID)
	be.PutUint32(r[msgRemoteCommID:], f.RemoteCommID)
	r[rejByte8] = uint8(f.MessageRejected&3)<<6 | f.Resv6&0x3F
	r[rejByte9] = f.ARILength<<1 | f.Resv1&1
	be.PutUint16(r[rejReason:], uint16(f.Reason))
	copy(r[rejARI:], f.ARI[:])
	copy(r[rejPrivate:], f.PrivateData[:])
}

// Fields returns every field of the data area.
func (r REJ) Fields() REJFields {
	_ = r[DataSize-1]
	f := REJFields{LocalCommID: r.LocalCommID(), RemoteCommID: r.RemoteCommID(),
		MessageRejected: r.MessageRejected(), Resv6: bits(r[rejByte8], 0, 6),
		ARILength: r.ARILength(), Resv1: bits(r[rejByte9], 0, 1), Reason: r.Reason()}
	copy(f.ARI[:], r[rejARI:rejARI+REJARISize])
	copy(f.PrivateData[:], r.PrivateData())
	return f
}
