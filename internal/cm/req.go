package cm

import "net/netip"

// Private data sizes (IBTA 12.6.5-12.6.11, 12.11; include/rdma/ib_cm.h).
const (
	REQPrivateDataSize     = 92
	MRAPrivateDataSize     = 222
	REJPrivateDataSize     = 148
	REPPrivateDataSize     = 196
	RTUPrivateDataSize     = 224
	DREQPrivateDataSize    = 220
	DREPPrivateDataSize    = 224
	SIDRReqPrivateDataSize = 216
	SIDRRepPrivateDataSize = 136
	REJARISize             = 72
	SIDRRepAddInfoSize     = 72
)

// PathInfoSize is the size of one path description inside a REQ.
const PathInfoSize = 44

// REQ field offsets within the CM data area (IBTA 12.6.5, Table 106).
const (
	reqLocalCommID = 0
	reqResv4       = 4 // byte 4 reserved; bytes 5-7 vendor ID (ECE, IBTA 1.4)
	reqVendorID    = 5
	reqServiceID   = 8
	reqLocalCAGUID = 16
	reqResv24      = 24
	reqLocalQKey   = 28
	reqLocalQPN    = 32 // 24 bits, then responder resources
	reqRespRes     = 35
	reqLocalEECN   = 36 // 24 bits, then initiator depth
	reqInitDepth   = 39
	reqRemoteEECN  = 40 // 24 bits, then byte 43
	reqByte43      = 43 // remote CM response timeout 5 | transport service type 2 | e2e flow control 1
	reqStartPSN    = 44 // 24 bits, then byte 47
	reqByte47      = 47 // local CM response timeout 5 | retry count 3
	reqPKey        = 48
	reqByte50      = 50 // path MTU 4 | RDC exists 1 | RNR retry count 3
	reqByte51      = 51 // max CM retries 4 | SRQ 1 | extended transport type 3
	reqPrimary     = 52
	reqAlternate   = 96
	reqPrivate     = 140
)

// TransportType is the REQ transport service type (IBTA 12.6.5).
type TransportType uint8

// Transport service types.
const (
	TransportRC TransportType = 0
	TransportUC TransportType = 1
	TransportRD TransportType = 2
	// TransportExtended means "see the extended transport type" (XRC = 1).
	TransportExtended TransportType = 3
)

// REQ is a view of the Request for Communication data area (IBTA 12.6.5,
// Table 106), 232 bytes after the MAD header:
//
//	 0 LocalCommID(32)
//	 4 Reserved(8) VendorID(24)
//	 8 ServiceID(64)
//	16 LocalCAGUID(64)
//	24 Reserved(32)
//	28 LocalQKey(32)
//	32 LocalQPN(24) ResponderResources(8)
//	36 LocalEECN(24) InitiatorDepth(8)
//	40 RemoteEECN(24) RemoteCMResponseTimeout(5) TransportServiceType(2) EndToEndFlowControl(1)
//	44 StartingPSN(24) LocalCMResponseTimeout(5) RetryCount(3)
//	48 PKey(16) PathMTU(4) RDCExists(1) RNRRetryCount(3) MaxCMRetries(4) SRQ(1) ExtendedTransportType(3)
//	52 primary path (44 bytes, PathInfo)
//	96 alternate path (44 bytes, PathInfo)
//	140 PrivateData (92 bytes)
//
// Linux convention (cm.c): StartingPSN is the PSN the active side's receive
// queue expects, i.e. the passive side's first send PSN.
type REQ []byte

// REQFields holds every field of a REQ, reserved bits included.
type REQFields struct {
	LocalCommID             uint32
	Resv4                   uint8
	VendorID                uint32 // 24 bits (ECE)
	ServiceID               uint64
	LocalCAGUID             uint64
	Resv24                  uint32
	LocalQKey               uint32
	LocalQPN                uint32 // 24 bits
	ResponderResources      uint8
	LocalEECN               uint32 // 24 bits
	InitiatorDepth          uint8
	RemoteEECN              uint32 // 24 bits
	RemoteCMResponseTimeout uint8  // 5 bits: 4.096 us * 2^n
	TransportServiceType    TransportType
	EndToEndFlowControl     bool
	StartingPSN             uint32 // 24 bits
	LocalCMResponseTimeout  uint8  // 5 bits
	RetryCount              uint8  // 3 bits
	PKey                    uint16
	PathMTU                 uint8 // 4 bits, IBTA MTU enum (1=256 .. 5=4096)
	RDCExists               bool
	RNRRetryCount           uint8 // 3 bits
	MaxCMRetries            uint8 // 4 bits
	SRQ                     bool
	ExtendedTransportType   uint8 // 3 bits
	Primary                 PathFields
	Alternate               PathFields
	PrivateData             [REQPrivateDataSize]byte
}

// LocalCommID returns the sender's communication ID.
func (r REQ) LocalCommID() uint32 { return be.Uint32(r[reqLocalCommID:]) }

// VendorID returns the 24-bit ECE vendor ID.
func (r REQ) VendorID() uint32 { return get24(r[reqVendorID:]) }

// ServiceID returns the service ID.
func (r REQ) ServiceID() uint64 { return be.Uint64(r[reqServiceID:]) }

// LocalCAGUID returns the sender's CA GUID.
func (r REQ) LocalCAGUID() uint64 { return be.Uint64(r[reqLocalCAGUID:]) }

// LocalQKey returns the sender's Q_Key (RD only).
func (r REQ) LocalQKey() uint32 { return be.Uint32(r[reqLocalQKey:]) }

// LocalQPN returns the sender's 24-bit QP number.
func (r REQ) LocalQPN() uint32 { return get24(r[reqLocalQPN:]) }

// ResponderResources returns the RDMA READ/atomic responder resources.
func (r REQ) ResponderResources() uint8 { return r[reqRespRes] }

// LocalEECN returns the sender's EE context (RD only).
func (r REQ) LocalEECN() uint32 { return get24(r[reqLocalEECN:]) }

// InitiatorDepth returns the initiator depth.
func (r REQ) InitiatorDepth() uint8 { return r[reqInitDepth] }

// RemoteEECN returns the remote EE context (RD only).
func (r REQ) RemoteEECN() uint32 { return get24(r[reqRemoteEECN:]) }

// RemoteCMResponseTimeout returns the 5-bit timeout code the passive CM must answer within.
func (r REQ) RemoteCMResponseTimeout() uint8 { return bits(r[reqByte43], 3, 5) }

// TransportServiceType returns the transport service type.
func (r REQ) TransportServiceType() TransportType {
	return TransportType(bits(r[reqByte43], 1, 2))
}

// EndToEndFlowControl reports the end-to-end flow control bit.
func (r REQ) EndToEndFlowControl() bool { return bits(r[reqByte43], 0, 1) != 0 }

// StartingPSN returns the 24-bit starting PSN.
func (r REQ) StartingPSN() uint32 { return get24(r[reqStartPSN:]) }

// LocalCMResponseTimeout returns the 5-bit timeout code of the sender's CM.
func (r REQ) LocalCMResponseTimeout() uint8 { return bits(r[reqByte47], 3, 5) }

// RetryCount returns the 3-bit transport retry count.
func (r REQ) RetryCount() uint8 { return bits(r[reqByte47], 0, 3) }

// PKey returns the partition key.
func (r REQ) PKey() uint16 { return be.Uint16(r[reqPKey:]) }

// PathMTU returns the 4-bit path MTU code (1=256 .. 5=4096).
func (r REQ) PathMTU() uint8 { return bits(r[reqByte50], 4, 4) }

// RDCExists reports the RDC exists bit.
func (r REQ) RDCExists() bool { return bits(r[reqByte50], 3, 1) != 0 }

// RNRRetryCount returns the 3-bit RNR retry count.
func (r REQ) RNRRetryCount() uint8 { return bits(r[reqByte50], 0, 3) }

// MaxCMRetries returns the 4-bit maximum CM retries.
func (r REQ) MaxCMRetries() uint8 { return bits(r[reqByte51], 4, 4) }

// SRQ reports the SRQ bit.
func (r REQ) SRQ() bool { return bits(r[reqByte51], 3, 1) != 0 }

// ExtendedTransportType returns the 3-bit extended transport type.
func (r REQ) ExtendedTransportType() uint8 { return bits(r[reqByte51], 0, 3) }

// Primary returns the primary path view.
func (r REQ) Primary() PathInfo { return PathInfo(r[reqPrimary : reqPrimary+PathInfoSize]) }

// Alternate returns the alternate path view.
func (r REQ) Alternate() PathInfo { return PathInfo(r[reqAlternate : reqAlternate+PathInfoSize]) }

// PrivateData returns the 92-byte private data area.
func (r REQ) PrivateData() []byte { return r[reqPrivate : reqPrivate+REQPrivateDataSize] }

// SetLocalCommID sets the sender's communication ID.
func (r REQ) SetLocalCommID(v uint32) { be.PutUint32(r[reqLocalCommID:], v) }

// SetServiceID sets the service ID.
func (r REQ) SetServiceID(v uint64) { be.PutUint64(r[reqServiceID:], v) }

// SetLocalQPN sets the sender's QP number (low 24 bits).
func (r REQ) SetLocalQPN(v uint32) { put24(r[reqLocalQPN:], v) }

// SetStartingPSN sets the starting PSN (low 24 bits).
func (r REQ) SetStartingPSN(v uint32) { put24(r[reqStartPSN:], v) }

// SetRemoteCMResponseTimeout sets the 5-bit code.
func (r REQ) SetRemoteCMResponseTimeout(v uint8) { setBits(&r[reqByte43], 3, 5, v) }

// SetTransportServiceType sets the transport service type.
func (r REQ) SetTransportServiceType(v TransportType) { setBits(&r[reqByte43], 1, 2, uint8(v)) }

// SetLocalCMResponseTimeout sets the 5-bit code.
func (r REQ) SetLocalCMResponseTimeout(v uint8) { setBits(&r[reqByte47], 3, 5, v) }

// SetRetryCount sets the 3-bit retry count.
func (r REQ) SetRetryCount(v uint8) { setBits(&r[reqByte47], 0, 3, v) }

// SetPathMTU sets the 4-bit path MTU code.
func (r REQ) SetPathMTU(v uint8) { setBits(&r[reqByte50], 4, 4, v) }

// SetRNRRetryCount sets the 3-bit RNR retry count.
func (r REQ) SetRNRRetryCount(v uint8) { setBits(&r[reqByte50], 0, 3, v) }

// SetMaxCMRetries sets the 4-bit maximum CM retries.
func (r REQ) SetMaxCMRetries(v uint8) { setBits(&r[reqByte51], 4, 4, v) }

// SetSRQ sets the SRQ bit.
func (r REQ) SetSRQ(v bool) { setBits(&r[reqByte51], 3, 1, b2u(v)) }

// Encode writes every field of f into the data area.
func (r REQ) Encode(f *REQFields) {
	_ = r[DataSize-1]
	be.PutUint32(r[reqLocalCommID:], f.LocalCommID)
	r[reqResv4] = f.Resv4
	put24(r[reqVendorID:], f.VendorID)
	be.PutUint64(r[reqServiceID:], f.ServiceID)
	be.PutUint64(r[reqLocalCAGUID:], f.LocalCAGUID)
	be.PutUint32(r[reqResv24:], f.Resv24)
	be.PutUint32(r[reqLocalQKey:], f.LocalQKey)
	put24(r[reqLocalQPN:], f.LocalQPN)
	r[reqRespRes] = f.ResponderResources
	put24(r[reqLocalEECN:], f.LocalEECN)
	r[reqInitDepth] = f.InitiatorDepth
	put24(r[reqRemoteEECN:], f.RemoteEECN)
	r[reqByte43] = f.RemoteCMResponseTimeout<<3 | uint8(f.TransportServiceType&3)<<1 | b2u(f.EndToEndFlowControl)
	put24(r[reqStartPSN:], f.StartingPSN)
	r[reqByte47] = f.LocalCMResponseTimeout<<3 | f.RetryCount&7
	be.PutUint16(r[reqPKey:], f.PKey)
	r[reqByte50] = f.PathMTU<<4 | b2u(f.RDCExists)<<3 | f.RNRRetryCount&7
	r[reqByte51] = f.MaxCMRetries<<4 | b2u(f.SRQ)<<3 | f.ExtendedTransportType&7
	r.Primary().Encode(&f.Primary)
	r.Alternate().Encode(&f.Alternate)
	copy(r[reqPrivate:], f.PrivateData[:])
}

// Fields returns every field of the data area.
func (r REQ) Fields() REQFields {
	_ = r[DataSize-1]
	f := REQFields{
		LocalCommID: r.LocalCommID(), Resv4: r[reqResv4], VendorID: r.VendorID(),
		ServiceID: r.ServiceID(), LocalCAGUID: r.LocalCAGUID(), Resv24: be.Uint32(r[reqResv24:]),
		LocalQKey: r.LocalQKey(), LocalQPN: r.LocalQPN(), ResponderResources: r.ResponderResources(),
		LocalEECN: r.LocalEECN(), InitiatorDepth: r.InitiatorDepth(), RemoteEECN: r.RemoteEECN(),
		RemoteCMResponseTimeout: r.RemoteCMResponseTimeout(), TransportServiceType: r.TransportServiceType(),
		EndToEndFlowControl: r.EndToEndFlowControl(), StartingPSN: r.StartingPSN(),
		LocalCMResponseTimeout: r.LocalCMResponseTimeout(), RetryCount: r.RetryCount(), PKey: r.PKey(),
		PathMTU: r.PathMTU(), RDCExists: r.RDCExists(), RNRRetryCount: r.RNRRetryCount(),
		MaxCMRetries: r.MaxCMRetries(), SRQ: r.SRQ(), ExtendedTransportType: r.ExtendedTransportType(),
		Primary: r.Primary().Fields(), Alternate: r.Alternate().Fields(),
	}
	copy(f.PrivateData[:], r.PrivateData())
	return f
}

// Path description offsets (relative to its start inside the REQ).
const (
	pathLocalLID  = 0
	pathRemoteLID = 2
	pathLocalGID  = 4
	pathRemoteGID = 20
	pathFlow      = 36 // flow label 20 | reserved 6 | packet rate 6
	pathTClass    = 40
	pathHopLimit  = 41
	pathByte42    = 42 // SL 4 | subnet local 1 | reserved 3
	pathByte43    = 43 // local ACK timeout 5 | reserved 3 (alternate: SAP supported = bit 2)
)

// PathInfo is a view of one 44-byte path description of a REQ (IBTA 12.6.5,
// Table 106, primary at byte 52, alternate at byte 96):
//
//	 0 LocalPortLID(16) RemotePortLID(16)
//	 4 LocalPortGID(128)
//	20 RemotePortGID(128)
//	36 FlowLabel(20) Reserved(6) PacketRate(6)
//	40 TrafficClass(8) HopLimit(8) SL(4) SubnetLocal(1) Reserved(3) LocalACKTimeout(5) Reserved(3)
type PathInfo []byte

// PathFields holds every field of a path description.
type PathFields struct {
	LocalLID        uint16
	RemoteLID       uint16
	LocalGID        [16]byte
	RemoteGID       [16]byte
	FlowLabel       uint32 // 20 bits
	Resv6           uint8  // reserved bits between flow label and packet rate
	PacketRate      uint8  // 6 bits
	TrafficClass    uint8
	HopLimit        uint8
	SL              uint8 // 4 bits
	SubnetLocal     bool
	Resv3           uint8 // low 3 bits of byte 42
	LocalACKTimeout uint8 // 5 bits: 4.096 us * 2^n
	Resv3b          uint8 // low 3 bits of byte 43 (alternate path: bit 2 = SAP supported)
}

// LocalLID returns the local port LID (0xFFFF, permissive, on RoCE).
func (p PathInfo) LocalLID() uint16 { return be.Uint16(p[pathLocalLID:]) }

// RemoteLID returns the remote port LID.
func (p PathInfo) RemoteLID() uint16 { return be.Uint16(p[pathRemoteLID:]) }

// LocalGID returns the local port GID as an address (IPv4-mapped GIDs unmapped).
func (p PathInfo) LocalGID() netip.Addr { return GIDAddr(p[pathLocalGID : pathLocalGID+16]) }

// RemoteGID returns the remote port GID as an address (IPv4-mapped GIDs unmapped).
func (p PathInfo) RemoteGID() netip.Addr { return GIDAddr(p[pathRemoteGID : pathRemoteGID+16]) }

// FlowLabel returns the 20-bit flow label.
func (p PathInfo) FlowLabel() uint32 { return be.Uint32(p[pathFlow:]) >> 12 }

// PacketRate returns the 6-bit packet rate.
func (p PathInfo) PacketRate() uint8 { return bits(p[pathFlow+3], 0, 6) }

// TrafficClass returns the traffic class.
func (p PathInfo) TrafficClass() uint8 { return p[pathTClass] }

// HopLimit returns the hop limit.
func (p PathInfo) HopLimit() uint8 { return p[pathHopLimit] }

// SL returns the 4-bit service level.
func (p PathInfo) SL() uint8 { return bits(p[pathByte42], 4, 4) }

// SubnetLocal reports the subnet local bit.
func (p PathInfo) SubnetLocal() bool { return bits(p[pathByte42], 3, 1) != 0 }

// LocalACKTimeout returns the 5-bit local ACK timeout code.
func (p PathInfo) LocalACKTimeout() uint8 { return bits(p[pathByte43], 3, 5) }

// Encode writes every field of f into the path description.
func (p PathInfo) Encode(f *PathFields) {
	_ = p[PathInfoSize-1]
	be.PutUint16(p[pathLocalLID:], f.LocalLID)
	be.PutUint16(p[pathRemoteLID:], f.RemoteLID)
	copy(p[pathLocalGID:], f.LocalGID[:])
	copy(p[pathRemoteGID:], f.RemoteGID[:])
	be.PutUint32(p[pathFlow:], (f.FlowLabel&0xFFFFF)<<12|uint32(f.Resv6&0x3F)<<6|uint32(f.PacketRate&0x3F))
	p[pathTClass] = f.TrafficClass
	p[pathHopLimit] = f.HopLimit
	p[pathByte42] = f.SL<<4 | b2u(f.SubnetLocal)<<3 | f.Resv3&7
	p[pathByte43] = f.LocalACKTimeout<<3 | f.Resv3b&7
}

// Fields returns every field of the path description.
func (p PathInfo) Fields() PathFields {
	_ = p[PathInfoSize-1]
	f := PathFields{
		LocalLID: p.LocalLID(), RemoteLID: p.RemoteLID(), FlowLabel: p.FlowLabel(),
		Resv6: uint8(be.Uint32(p[pathFlow:])>>6) & 0x3F, PacketRate: p.PacketRate(),
		TrafficClass: p.TrafficClass(), HopLimit: p.HopLimit(), SL: p.SL(), SubnetLocal: p.SubnetLocal(),
		Resv3: bits(p[pathByte42], 0, 3), LocalACKTimeout: p.LocalACKTimeout(), Resv3b: bits(p[pathByte43], 0, 3),
	}
	copy(f.LocalGID[:], p[pathLocalGID:])
	copy(f.RemoteGID[:], p[pathRemoteGID:])
	return f
}

// GIDAddr converts a 16-byte GID to an address; an IPv4-mapped GID
// (::ffff:a.b.c.d, the RoCEv2 IPv4 GID) becomes the IPv4 address.
func GIDAddr(gid []byte) netip.Addr {
	var a [16]byte
	copy(a[:], gid)
	return netip.AddrFrom16(a).Unmap()
}

// AddrGID converts an address to a 16-byte GID (IPv4 as ::ffff:a.b.c.d);
// the invalid address gives the zero GID.
func AddrGID(a netip.Addr) [16]byte {
	if !a.IsValid() {
		return [16]byte{}
	}
	return a.As16()
}
