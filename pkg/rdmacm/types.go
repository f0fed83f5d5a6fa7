package rdmacm

import "github.com/softroce/softroce/internal/cm"

// PortSpace is an rdma_cm port space (enum rdma_port_space): IDOptions.PortSpace,
// ID.PortSpace. softroce connects PSTCP (RC) and PSUDP (UD, resolved by SIDR) IDs.
type PortSpace = cm.PortSpace

// The port spaces (RDMA_PS_*).
const (
	PSIPoIB = cm.PSIPoIB
	PSTCP   = cm.PSTCP
	PSUDP   = cm.PSUDP
	PSIB    = cm.PSIB
)

// RDMAUDPQKey is the Q_Key of PSUDP IDs (RDMA_UDP_QKEY), the default of UDParam.QKey.
const RDMAUDPQKey = cm.RDMAUDPQKey

// RejectReason is the reason code of a REJ (IBTA 12.6.7.2, Table 109): RejectError.Reason.
type RejectReason = cm.RejectReason

// The REJ reasons.
const (
	RejNoQP                      = cm.RejNoQP
	RejNoEEC                     = cm.RejNoEEC
	RejNoResources               = cm.RejNoResources
	RejTimeout                   = cm.RejTimeout
	RejUnsupported               = cm.RejUnsupported
	RejInvalidCommID             = cm.RejInvalidCommID
	RejInvalidCommInstance       = cm.RejInvalidCommInstance
	RejInvalidServiceID          = cm.RejInvalidServiceID
	RejInvalidTransportType      = cm.RejInvalidTransportType
	RejStaleConn                 = cm.RejStaleConn
	RejRDCNotExist               = cm.RejRDCNotExist
	RejInvalidGID                = cm.RejInvalidGID
	RejInvalidLID                = cm.RejInvalidLID
	RejInvalidSL                 = cm.RejInvalidSL
	RejInvalidTrafficClass       = cm.RejInvalidTrafficClass
	RejInvalidHopLimit           = cm.RejInvalidHopLimit
	RejInvalidPacketRate         = cm.RejInvalidPacketRate
	RejInvalidAltGID             = cm.RejInvalidAltGID
	RejInvalidAltLID             = cm.RejInvalidAltLID
	RejInvalidAltSL              = cm.RejInvalidAltSL
	RejInvalidAltTrafficClass    = cm.RejInvalidAltTrafficClass
	RejInvalidAltHopLimit        = cm.RejInvalidAltHopLimit
	RejInvalidAltPacketRate      = cm.RejInvalidAltPacketRate
	RejPortCMRedirect            = cm.RejPortCMRedirect
	RejPortRedirect              = cm.RejPortRedirect
	RejInvalidMTU                = cm.RejInvalidMTU
	RejInsufficientRespResources = cm.RejInsufficientRespResources
	RejConsumerDefined           = cm.RejConsumerDefined
	RejInvalidRNRRetry           = cm.RejInvalidRNRRetry
	RejDuplicateLocalCommID      = cm.RejDuplicateLocalCommID
	RejInvalidClassVersion       = cm.RejInvalidClassVersion
	RejInvalidFlowLabel          = cm.RejInvalidFlowLabel
	RejInvalidAltFlowLabel       = cm.RejInvalidAltFlowLabel
	RejVendorOptionNotSupported  = cm.RejVendorOptionNotSupported
)

// The rdma_cm event types softroce never delivers (it has no device removal, multicast or
// address-change events), named so that every EventType value has a name.
const (
	EventDeviceRemoval  = cm.EventDeviceRemoval
	EventMulticastJoin  = cm.EventMulticastJoin
	EventMulticastError = cm.EventMulticastError
	EventAddrChange     = cm.EventAddrChange
)
