package bth

// BTHSize is the size of the Base Transport Header.
const BTHSize = 12

const (
	bthOpcode = 0 // OpCode
	bthFlags  = 1 // SE | M | PadCnt | TVer
	bthPKey   = 2 // P_Key (16)
	bthFECN   = 4 // FECN | BECN | Resv6 (RoCEv2: masked in the ICRC)
	bthDestQP = 5 // DestQP (24)
	bthAck    = 8 // A | Resv7
	bthPSN    = 9 // PSN (24)
	qpnMask   = 0xFFFFFF
	flagSE    = 0x80
	flagMig   = 0x40
	padShift  = 4
	padMask   = 0x30
	tverMask  = 0x0F
	flagFECN  = 0x80
	flagBECN  = 0x40
	resv6Mask = 0x3F
	flagAck   = 0x80
	resv7Mask = 0x7F
)

// BTH is a view of the Base Transport Header (IBTA Vol 1 9.2).
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|    OpCode     |S|M|Pad|  TVer |            P_Key              |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|F|B|   Resv6   |                    DestQP                     |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|A|    Resv7    |                      PSN                      |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//
// S = solicited event, M = MigReq, Pad = PadCnt, F/B = FECN/BECN (in
// RoCEv2 the whole byte 4 is masked in the ICRC), A = AckReq. The view must
// be at least BTHSize bytes.
type BTH []byte

// BTHFields holds every field of a BTH, reserved bits included.
type BTHFields struct {
	Opcode Opcode // OpCode (IBTA 9.2.1)
	SE     bool   // Solicited Event (9.2.2)
	MigReq bool   // Migration state (9.2.3)
	PadCnt uint8  // pad bytes before the ICRC, 0..3 (9.2.4)
	TVer   uint8  // transport header version, 0..15; must be 0 (9.2.5)
	PKey   uint16 // partition key (9.2.6)
	FECN   bool   // forward ECN (RoCEv2 A17.9.1)
	BECN   bool   // backward ECN (RoCEv2 A17.9.1)
	Resv6  uint8  // byte 4 low 6 bits
	DestQP uint32 // destination QP, 24 bits (9.2.7)
	AckReq bool   // acknowledge request (9.2.8)
	Resv7  uint8  // byte 8 low 7 bits
	PSN    PSN    // packet sequence number, 24 bits (9.2.9)
}

// Opcode returns the OpCode.
func (b BTH) Opcode() Opcode { return Opcode(b[bthOpcode]) }

// SE reports the Solicited Event bit.
func (b BTH) SE() bool { return b[bthFlags]&flagSE != 0 }

// MigReq reports the MigReq bit.
func (b BTH) MigReq() bool { return b[bthFlags]&flagMig != 0 }

// PadCnt returns the pad count (0..3).
func (b BTH) PadCnt() uint8 { return (b[bthFlags] & padMask) >> padShift }

// TVer returns the transport header version.
func (b BTH) TVer() uint8 { return b[bthFlags] & tverMask }

// PKey returns the partition key.
func (b BTH) PKey() uint16 { return be.Uint16(b[bthPKey:]) }

// FECN reports the forward explicit congestion notification bit.
func (b BTH) FECN() bool { return b[bthFECN]&flagFECN != 0 }

// BECN reports the backward explicit congestion notification bit.
func (b BTH) BECN() bool { return b[bthFECN]&flagBECN != 0 }

// Resv6 returns the 6 reserved bits of byte 4.
func (b BTH) Resv6() uint8 { return b[bthFECN] & resv6Mask }

// DestQP returns the 24-bit destination QP number.
func (b BTH) DestQP() uint32 { return get24(b[bthDestQP:]) }

// AckReq reports the AckReq bit.
func (b BTH) AckReq() bool { return b[bthAck]&flagAck != 0 }

// Resv7 returns the 7 reserved bits of byte 8.
func (b BTH) Resv7() uint8 { return b[bthAck] & resv7Mask }

// PSN returns the 24-bit packet sequence number.
func (b BTH) PSN() PSN { return PSN(get24(b[bthPSN:])) }

// SetOpcode sets the OpCode.
func (b BTH) SetOpcode(op Opcode) { b[bthOpcode] = byte(op) }

func setBit(p *byte, mask byte, v bool) {
	if v {
		*p |= mask
	} else {
		*p &^= mask
	}
}

// SetSE sets the Solicited Event bit.
func (b BTH) SetSE(v bool) { setBit(&b[bthFlags], flagSE, v) }

// SetMigReq sets the MigReq bit.
func (b BTH) SetMigReq(v bool) { setBit(&b[bthFlags], flagMig, v) }

// SetPadCnt sets the pad count (low 2 bits of n).
func (b BTH) SetPadCnt(n uint8) { b[bthFlags] = b[bthFlags]&^padMask | (n<<padShift)&padMask }

// SetTVer sets the transport header version (low 4 bits of v).
func (b BTH) SetTVer(v uint8) { b[bthFlags] = b[bthFlags]&^tverMask | v&tverMask }

// SetPKey sets the partition key.
func (b BTH) SetPKey(k uint16) { be.PutUint16(b[bthPKey:], k) }

// SetFECN sets the FECN bit.
func (b BTH) SetFECN(v bool) { setBit(&b[bthFECN], flagFECN, v) }

// SetBECN sets the BECN bit.
func (b BTH) SetBECN(v bool) { setBit(&b[bthFECN], flagBECN, v) }

// SetDestQP sets the destination QP (low 24 bits of qpn).
func (b BTH) SetDestQP(qpn uint32) { put24(b[bthDestQP:], qpn) }

// SetAckReq sets the AckReq bit.
func (b BTH) SetAckReq(v bool) { setBit(&b[bthAck], flagAck, v) }

// SetPSN sets the PSN (low 24 bits).
func (b BTH) SetPSN(p PSN) { put24(b[bthPSN:], uint32(p)) }

// Encode writes every bit of f into the header.
func (b BTH) Encode(f *BTHFields) {
	_ = b[BTHSize-1]
	b[bthOpcode] = byte(f.Opcode)
	b[bthFlags] = b2u(f.SE)<<7 | b2u(f.MigReq)<<6 | (f.PadCnt&3)<<padShift | f.TVer&tverMask
	be.PutUint16(b[bthPKey:], f.PKey)
	b[bthFECN] = b2u(f.FECN)<<7 | b2u(f.BECN)<<6 | f.Resv6&resv6Mask
	put24(b[bthDestQP:], f.DestQP)
	b[bthAck] = b2u(f.AckReq)<<7 | f.Resv7&resv7Mask
	put24(b[bthPSN:], uint32(f.PSN))
}

// Fields returns every field of the header.
func (b BTH) Fields() BTHFields {
	_ = b[BTHSize-1]
	return BTHFields{
		Opcode: b.Opcode(), SE: b.SE(), MigReq: b.MigReq(), PadCnt: b.PadCnt(), TVer: b.TVer(),
		PKey: b.PKey(), FECN: b.FECN(), BECN: b.BECN(), Resv6: b.Resv6(), DestQP: b.DestQP(),
		AckReq: b.AckReq(), Resv7: b.Resv7(), PSN: b.PSN(),
	}
}
