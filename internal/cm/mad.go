package cm

import (
	"errors"
	"fmt"
)

// Sizes of a CM MAD (IBTA 13.4.2: every GMP is 256 bytes).
const (
	MADSize       = 256 // a whole management datagram
	MADHeaderSize = 24  // the common MAD header (IBTA 13.4.3)
	DataSize      = MADSize - MADHeaderSize
)

// Constants of the common MAD header for the CM class (IBTA 13.4.3, 12.6.1).
const (
	BaseVersion  = 0x01 // MAD base version
	MgmtClassCM  = 0x07 // management class: Communication Management
	ClassVersion = 0x02 // CM class version
)

// CM well-known QP and Q_Key (IBTA 12.6.1 / 13.5.2: GSI QP1, Q_Key 0x80010000).
const (
	GSIQPN  = 1
	GSIQKey = 0x80010000
)

// Method is the MAD method byte (IBTA 13.4.5); bit 7 is the
// response bit. The CM sends every message with MethodSend.
type Method uint8

// MAD methods.
const (
	MethodGet         Method = 0x01
	MethodSet         Method = 0x02
	MethodSend        Method = 0x03
	MethodTrap        Method = 0x05
	MethodReport      Method = 0x06
	MethodTrapRepress Method = 0x07
	MethodGetResp     Method = 0x81
	MethodReportResp  Method = 0x86
)

// AttrID is a CM attribute ID: the message type (IBTA 12.6.1).
type AttrID uint16

// CM attribute IDs.
const (
	AttrClassPortInfo AttrID = 0x0001
	AttrREQ           AttrID = 0x0010
	AttrMRA           AttrID = 0x0011
	AttrREJ           AttrID = 0x0012
	AttrREP           AttrID = 0x0013
	AttrRTU           AttrID = 0x0014
	AttrDREQ          AttrID = 0x0015
	AttrDREP          AttrID = 0x0016
	AttrSIDRReq       AttrID = 0x0017
	AttrSIDRRep       AttrID = 0x0018
	AttrLAP           AttrID = 0x0019
	AttrAPR           AttrID = 0x001A
)

var attrNames = map[AttrID]string{
	AttrClassPortInfo: "ClassPortInfo", AttrREQ: "REQ", AttrMRA: "MRA", AttrREJ: "REJ",
	AttrREP: "REP", AttrRTU: "RTU", AttrDREQ: "DREQ", AttrDREP: "DREP",
	AttrSIDRReq: "SIDR_REQ", AttrSIDRRep: "SIDR_REP", AttrLAP: "LAP", AttrAPR: "APR",
}

// String returns the IBTA message name, e.g. "REQ"; unknown IDs print as hex.
func (a AttrID) String() string {
	if s, ok := attrNames[a]; ok {
		return s
	}
	return fmt.Sprintf("AttrID(0x%04x)", uint16(a))
}

const (
	madBaseVersion  = 0
	madMgmtClass    = 1
	madClassVersion = 2
	madMethod       = 3
	madStatus       = 4
	madClassSpec    = 6
	madTID          = 8
	madAttrID       = 16
	madResv         = 18
	madAttrMod      = 20
)

// MAD is a view of the common MAD header (IBTA 13.4.3):
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+---------------+---------------+---------------+-+-------------+
//	|  BaseVersion  |   MgmtClass   | ClassVersion  |R|   Method    |
//	+---------------+---------------+---------------+-+-------------+
//	|            Status             |         ClassSpecific         |
//	+-------------------------------+-------------------------------+
//	|                     TransactionID (64 bits)                   |
//	+-------------------------------+-------------------------------+
//	|          AttributeID          |            Reserved           |
//	+-------------------------------+-------------------------------+
//	|                       AttributeModifier                       |
//	+---------------------------------------------------------------+
//
// The view may be the whole 256-byte MAD; Data returns the CM data area.
type MAD []byte

// MADFields holds every field of the common MAD header.
type MADFields struct {
	BaseVersion   uint8
	MgmtClass     uint8
	ClassVersion  uint8
	Method        Method // including the response bit
	Status        uint16
	ClassSpecific uint16
	TID           uint64
	AttrID        AttrID
	Resv          uint16
	AttrModifier  uint32
}

// BaseVersion returns the MAD base version (1).
func (m MAD) BaseVersion() uint8 { return m[madBaseVersion] }

// MgmtClass returns the management class (0x07 for the CM).
func (m MAD) MgmtClass() uint8 { return m[madMgmtClass] }

// ClassVersion returns the class version (2 for the CM).
func (m MAD) ClassVersion() uint8 { return m[madClassVersion] }

// Method returns the method byte (response bit included).
func (m MAD) Method() Method { return Method(m[madMethod]) }

// Status returns the status field.
func (m MAD) Status() uint16 { return be.Uint16(m[madStatus:]) }

// ClassSpecific returns the class-specific field.
func (m MAD) ClassSpecific() uint16 { return be.Uint16(m[madClassSpec:]) }

// TID returns the transaction ID.
func (m MAD) TID() uint64 { return be.Uint64(m[madTID:]) }

// AttrID returns the attribute ID (the CM message type).
func (m MAD) AttrID() AttrID { return AttrID(be.Uint16(m[madAttrID:])) }

// AttrModifier returns the attribute modifier.
func (m MAD) AttrModifier() uint32 { return be.Uint32(m[madAttrMod:]) }

// Data returns the CM data area (bytes 24..256) of a whole MAD.
func (m MAD) Data() []byte { return m[MADHeaderSize:MADSize] }

// SetMethod sets the method byte.
func (m MAD) SetMethod(v Method) { m[madMethod] = byte(v) }

// SetTID sets the transaction ID.
func (m MAD) SetTID(v uint64) { be.PutUint64(m[madTID:], v) }

// SetAttrID sets the attribute ID.
func (m MAD) SetAttrID(v AttrID) { be.PutUint16(m[madAttrID:], uint16(v)) }

// SetStatus sets the status field.
func (m MAD) SetStatus(v uint16) { be.PutUint16(m[madStatus:], v) }

// Encode writes every field of f into the header.
func (m MAD) Encode(f *MADFields) {
	_ = m[MADHeaderSize-1]
	m[madBaseVersion] = f.BaseVersion
	m[madMgmtClass] = f.MgmtClass
	m[madClassVersion] = f.ClassVersion
	m[madMethod] = byte(f.Method)
	be.PutUint16(m[madStatus:], f.Status)
	be.PutUint16(m[madClassSpec:], f.ClassSpecific)
	be.PutUint64(m[madTID:], f.TID)
	be.PutUint16(m[madAttrID:], uint16(f.AttrID))
	be.PutUint16(m[madResv:], f.Resv)
	be.PutUint32(m[madAttrMod:], f.AttrModifier)
}

// Fields returns every field of the header.
func (m MAD) Fields() MADFields {
	_ = m[MADHeaderSize-1]
	return MADFields{
		BaseVersion: m.BaseVersion(), MgmtClass: m.MgmtClass(), ClassVersion: m.ClassVersion(),
		Method: m.Method(), Status: m.Status(), ClassSpecific: m.ClassSpecific(), TID: m.TID(),
		AttrID: m.AttrID(), Resv: be.Uint16(m[madResv:]), AttrModifier: m.AttrModifier(),
	}
}

// CMHeader returns the header fields of a CM message of type attr sent with
// method Send, as the Linux CM formats them (cm_format_mad_hdr).
func CMHeader(attr AttrID, tid uint64) MADFields {
	return MADFields{BaseVersion: BaseVersion, MgmtClass: MgmtClassCM, ClassVersion: ClassVersion,
		Method: MethodSend, TID: tid, AttrID: attr}
}

// Errors returned by Parse. Each wraps into a *ParseError.
var (
	ErrLength       = errors.New("cm: MAD is not 256 bytes")
	ErrBaseVersion  = errors.New("cm: unsupported MAD base version")
	ErrNotCM        = errors.New("cm: management class is not CM")
	ErrClassVersion = errors.New("cm: unsupported CM class version")
	ErrMethod       = errors.New("cm: unexpected MAD method")
	ErrUnknownAttr  = errors.New("cm: unknown CM attribute")
	ErrField        = errors.New("cm: invalid field value")
)

// ParseError describes why a MAD was refused.
type ParseError struct {
	Err    error  // one of the Err* sentinels
	Attr   AttrID // attribute ID, when the header was readable
	Len    int    // length of the input
	Detail string // optional detail
}

// Error describes the refusal.
func (e *ParseError) Error() string {
	s := fmt.Sprintf("%v (attr %v, %d bytes)", e.Err, e.Attr, e.Len)
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Unwrap returns the sentinel error.
func (e *ParseError) Unwrap() error { return e.Err }

// Message is a parsed CM MAD: the header view and the typed view of its data
// area (exactly one of the message views is non-nil, chosen by AttrID).
type Message struct {
	MAD     MAD // the whole 256-byte MAD
	Attr    AttrID
	REQ     REQ
	MRA     MRA
	REJ     REJ
	REP     REP
	RTU     RTU
	DREQ    DREQ
	DREP    DREP
	SIDRReq SIDRReq
	SIDRRep SIDRRep
}

// Parse checks a CM MAD (the payload of a UD SEND to QP1) and returns views
// into b (no copy). It accepts base version 1, class 0x07, class version 2,
// method Send, and the nine connection and SIDR messages; anything else
// returns a *ParseError wrapping a sentinel. It never panics.
func Parse(b []byte) (Message, error) {
	var msg Message
	if len(b) != MADSize {
		return msg, &ParseError{Err: ErrLength, Len: len(b)}
	}
	m := MAD(b)
	msg.MAD = m
	msg.Attr = m.AttrID()
	switch {
	case m.BaseVersion() != BaseVersion:
		return msg, &ParseError{Err: ErrBaseVersion, Attr: msg.Attr, Len: len(b)}
	case m.MgmtClass() != MgmtClassCM:
		return msg, &ParseError{Err: ErrNotCM, Attr: msg.Attr, Len: len(b)}
	case m.ClassVersion() != ClassVersion:
		return msg, &ParseError{Err: ErrClassVersion, Attr: msg.Attr, Len: len(b)}
	case m.Method() != MethodSend:
		return msg, &ParseError{Err: ErrMethod, Attr: msg.Attr, Len: len(b)}
	}
	d := m.Data()
	switch msg.Attr {
	case AttrREQ:
		msg.REQ = REQ(d)
	case AttrMRA:
		msg.MRA = MRA(d)
	case AttrREJ:
		msg.REJ = REJ(d)
		if n := msg.REJ.ARILength(); n > REJARISize {
			return msg, &ParseError{Err: ErrField, Attr: msg.Attr, Len: len(b), Detail: "REJ ARI length > 72"}
		}
	case AttrREP:
		msg.REP = REP(d)
	case AttrRTU:
		msg.RTU = RTU(d)
	case AttrDREQ:
		msg.DREQ = DREQ(d)
	case AttrDREP:
		msg.DREP = DREP(d)
	case AttrSIDRReq:
		msg.SIDRReq = SIDRReq(d)
	case AttrSIDRRep:
		msg.SIDRRep = SIDRRep(d)
		if n := msg.SIDRRep.AddInfoLength(); n > SIDRRepAddInfoSize {
			return msg, &ParseError{Err: ErrField, Attr: msg.Attr, Len: len(b), Detail: "SIDR_REP additional information length > 72"}
		}
	default:
		return msg, &ParseError{Err: ErrUnknownAttr, Attr: msg.Attr, Len: len(b)}
	}
	return msg, nil
}
