package bth

import "time"

// AETHSize is the size of the ACK Extended Transport Header.
const AETHSize = 4

// AETH is a view of the ACK Extended Transport Header (IBTA Vol 1 9.3.5),
// carried by Acknowledge, ATOMIC Acknowledge and RDMA READ Response
// First/Last/Only.
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|   Syndrome    |             Message Sequence Number           |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//
// Syndrome (IBTA 9.7.5.2, table 44): bit 7 reserved, bits 6..5 the type
// (00 ACK, 01 RNR NAK, 10 reserved, 11 NAK), bits 4..0 the value (credit
// code, RNR timer code or NAK code).
type AETH []byte

// AETHFields holds the fields of an AETH.
type AETHFields struct {
	Syndrome uint8  // the whole syndrome byte
	MSN      uint32 // message sequence number, 24 bits
}

// Syndrome returns the syndrome byte.
func (a AETH) Syndrome() uint8 { return a[0] }

// MSN returns the 24-bit message sequence number.
func (a AETH) MSN() uint32 { return get24(a[1:]) }

// SetSyndrome sets the syndrome byte.
func (a AETH) SetSyndrome(s uint8) { a[0] = s }

// SetMSN sets the message sequence number (low 24 bits).
func (a AETH) SetMSN(msn uint32) { put24(a[1:], msn) }

// Encode writes f into the header.
func (a AETH) Encode(f *AETHFields) {
	_ = a[AETHSize-1]
	a[0] = f.Syndrome
	put24(a[1:], f.MSN)
}

// Fields returns the fields of the header.
func (a AETH) Fields() AETHFields {
	_ = a[AETHSize-1]
	return AETHFields{Syndrome: a[0], MSN: get24(a[1:])}
}

// AckType is the type encoded in syndrome bits 6..5 (IBTA 9.7.5.2 table 44).
type AckType uint8

// The AETH syndrome types; the values are the two syndrome bits.
const (
	AckTypeACK      AckType = 0 // positive acknowledgement
	AckTypeRNR      AckType = 1 // receiver not ready NAK
	AckTypeReserved AckType = 2 // reserved
	AckTypeNAK      AckType = 3 // negative acknowledgement
)

// String returns "ACK", "RNR", "Reserved" or "NAK".
func (t AckType) String() string {
	switch t {
	case AckTypeACK:
		return "ACK"
	case AckTypeRNR:
		return "RNR"
	case AckTypeNAK:
		return "NAK"
	}
	return "Reserved"
}

// NAK codes, the low 5 bits of a NAK syndrome (IBTA 9.7.5.2.4 table 45).
const (
	NAKPSNSeqErr        = 0 // PSN sequence error
	NAKInvalidRequest   = 1 // invalid request
	NAKRemoteAccessErr  = 2 // remote access error
	NAKRemoteOpErr      = 3 // remote operational error
	NAKInvalidRDRequest = 4 // invalid RD request
)

// CreditNone is the ACK credit code meaning "no credit information"
// (IBTA 9.7.7.2.5, what rxe sends: syndrome 0x1F).
const CreditNone = 31

const (
	synTypeShift = 5
	synValueMask = 0x1F
)

// SyndromeACK returns the ACK syndrome with the given credit code (low 5 bits).
func SyndromeACK(creditCode uint8) uint8 { return creditCode & synValueMask }

// SyndromeRNR returns the RNR NAK syndrome with the given timer code (low 5 bits).
func SyndromeRNR(timerCode uint8) uint8 {
	return uint8(AckTypeRNR)<<synTypeShift | timerCode&synValueMask
}

// SyndromeNAK returns the NAK syndrome with the given NAK code (low 5 bits).
func SyndromeNAK(code uint8) uint8 { return uint8(AckTypeNAK)<<synTypeShift | code&synValueMask }

// SyndromeType returns the type in syndrome bits 6..5 (bit 7 is ignored).
func SyndromeType(s uint8) AckType { return AckType(s>>synTypeShift) & 3 }

// SyndromeValue returns the low 5 bits of the syndrome.
func SyndromeValue(s uint8) uint8 { return s & synValueMask }

// creditTable is the end-to-end credit table, IBTA 9.7.7.2.5 table 47.
var creditTable = [31]int32{
	0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768,
	1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
}

// CreditCount returns the number of receive credits a credit code (low 5 bits
// of code) stands for, IBTA 9.7.7.2.5 table 47; -1 for code 31 (no credit
// information, "invalid" in the table).
func CreditCount(code uint8) int {
	code &= synValueMask
	if code == CreditNone {
		return -1
	}
	return int(creditTable[code])
}

// rnrTable is the RNR NAK timer table, IBTA 9.7.5.2.8 table 46, in units of
// 10 µs: code 0 is the longest (655.36 ms), codes 1..31 increase.
var rnrTable = [32]uint32{
	65536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768,
	1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
}

// RNRTimer returns the minimum RNR NAK timer a code (low 5 bits) stands for,
// IBTA 9.7.5.2.8 table 46: code 0 = 655.36 ms, 1 = 0.01 ms .. 31 = 491.52 ms.
func RNRTimer(code uint8) time.Duration {
	return time.Duration(rnrTable[code&synValueMask]) * 10 * time.Microsecond
}

// RNRTimerCode returns the code of the shortest RNR timer whose duration is
// >= d. Durations above 491.52 ms give code 0 (655.36 ms, the longest);
// d <= 10 µs gives code 1.
func RNRTimerCode(d time.Duration) uint8 {
	for c := uint8(1); c < 32; c++ {
		if RNRTimer(c) >= d {
			return c
		}
	}
	return 0
}
