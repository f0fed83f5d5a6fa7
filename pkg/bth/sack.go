package bth

// SACKSize is the size of softroce's selective acknowledgement extension: the trigger PSN
// word and a 128-bit bitmap.
const SACKSize = 4 + SACKBits/8

// SACKBits is the number of PSNs a SACK's bitmap covers: the requester window (a requester
// never has more than 128 PSNs unacknowledged, so PSNs past BTH.PSN + 128 are never held).
const SACKBits = 128

// SACK is a view of softroce's selective acknowledgement extension. It is not part of IBTA:
// a softroce responder whose QP has selective repeat on (both peers opted in) appends it to
// the AETH of an RC Acknowledge (opcode 0x11) that is a NAK with the PSN sequence error code
// (IBTA 9.7.5.2.1). The packet is recognised by its length (BTH + AETH + SACKSize + ICRC);
// anyone who reads only the BTH and the AETH sees the standard NAK: every request before
// BTH.PSN (the responder's expected PSN) was executed, resend from BTH.PSN (IBTA 9.7.5.2.1,
// 9.7.6.1.3).
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|   Reserved    |                  Trigger PSN                  |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                                                               |
//	+              Held bitmap (128 bits, bit 0 first)              +
//	|                                                               |
//	+                                                               +
//	|                                                               |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//
// Trigger PSN: the PSN of the request packet whose arrival made the responder send this
// SACK (a requester that resent a PSN before it sent the trigger, and still sees that PSN
// missing, knows the resend was lost). Bit i of the bitmap (byte i/8, mask 0x80>>(i%8)) says
// the responder holds the request packet with PSN BTH.PSN+1+i, received out of order and not
// yet executed. The reserved byte is sent as 0 and ignored.
type SACK []byte

// SACKFields holds the fields of a SACK.
type SACKFields struct {
	Trigger PSN                // the request PSN that caused the SACK
	Held    [SACKBits / 8]byte // the bitmap, bit 0 = BTH.PSN+1
}

// Trigger returns the trigger PSN.
func (s SACK) Trigger() PSN { return PSN(get24(s[1:])) }

// Held reports whether bit i (PSN BTH.PSN+1+i) is set; false for i outside 0..SACKBits-1.
func (s SACK) Held(i int) bool {
	if i < 0 || i >= SACKBits {
		return false
	}
	return s[4+i/8]&(0x80>>(i%8)) != 0
}

// Encode writes f into the extension (the reserved byte 0).
func (s SACK) Encode(f *SACKFields) {
	_ = s[SACKSize-1]
	s[0] = 0
	put24(s[1:], uint32(f.Trigger))
	copy(s[4:SACKSize], f.Held[:])
}

// Fields returns the fields of the extension.
func (s SACK) Fields() SACKFields {
	_ = s[SACKSize-1]
	f := SACKFields{Trigger: s.Trigger()}
	copy(f.Held[:], s[4:SACKSize])
	return f
}

// SetHeld sets bit i of the bitmap (i in 0..SACKBits-1).
func (f *SACKFields) SetHeld(i int) { f.Held[i/8] |= 0x80 >> (i % 8) }
