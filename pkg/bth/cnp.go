package bth

// CNPSize is the UDP payload of a RoCEv2 Congestion Notification Packet: the BTH, 16 reserved
// bytes and the ICRC (IBTA Annex A17.9.3), 32 bytes.
const CNPSize = BTHSize + CNPResvSize + ICRCSize

// CNPPKey is the P_Key a CNP carries: the default partition, full membership (what ConnectX
// adapters send; softroce's only partition).
const CNPPKey = 0xFFFF

// CNP is a view of a RoCEv2 Congestion Notification Packet (IBTA Annex A17.9.3), the message a
// notification point (the receiver of an ECN CE-marked packet) sends back to the reaction point
// (the QP that sent it):
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|  OpCode 0x81  |0|0|0 0|0 0 0 0|         P_Key 0xFFFF          |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|0|1|     0     |                    DestQP                     |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|0|      0      |                    PSN 0                      |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                                                               |
//	+                   Reserved (16 bytes of 0)                    +
//	|                                                               |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                             ICRC                              |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//
// The BTH is an ordinary one with opcode OpCNP and the BECN bit set (A17.9.2: byte 4's B bit
// marks the notification); DestQP is the QP whose packet was marked. The reserved bytes are sent
// as zero and ignored on receive. Encode writes the bytes ConnectX adapters send, byte for byte
// (cnp_test.go compares them with a published ConnectX-4 Lx capture). The view must be at least
// CNPSize bytes.
type CNP []byte

// CNPFields holds the fields of a CNP a sender chooses; every other bit is fixed (Encode) or
// reserved.
type CNPFields struct {
	DestQP uint32 // the reaction point's QP, 24 bits
	PKey   uint16 // CNPPKey
}

// BTH returns the CNP's base transport header.
func (c CNP) BTH() BTH { return BTH(c[:BTHSize:BTHSize]) }

// DestQP returns the QP the notification is for.
func (c CNP) DestQP() uint32 { return BTH(c).DestQP() }

// Reserved returns the 16 reserved bytes.
func (c CNP) Reserved() []byte { return c[BTHSize : BTHSize+CNPResvSize : BTHSize+CNPResvSize] }

// Encode writes the BTH (opcode 0x81, BECN, f's P_Key and DestQP, everything else 0) and zeroes
// the reserved bytes. The ICRC is left to the caller: SetICRC(c, ICRC(ep, c)) once the
// endpoints are known (IBTA A17.3.3 covers the IP and UDP headers).
func (c CNP) Encode(f *CNPFields) {
	_ = c[BTHSize+CNPResvSize-1]
	BTH(c).Encode(&BTHFields{Opcode: OpCNP, PKey: f.PKey, BECN: true, DestQP: f.DestQP})
	clear(c[BTHSize : BTHSize+CNPResvSize])
}

// Fields returns the CNP's chosen fields.
func (c CNP) Fields() CNPFields {
	b := BTH(c)
	return CNPFields{DestQP: b.DestQP(), PKey: b.PKey()}
}

// PutCNP builds a whole CNP from this host to ep's destination in dst (at least CNPSize
// bytes): Encode, then the ICRC over ep (the IPv4 Identification a sender's socket puts on
// the wire, 0 for softroce's DF sends). It returns dst[:CNPSize].
func PutCNP(dst []byte, ep *Endpoints, f *CNPFields) []byte {
	c := CNP(dst[:CNPSize])
	c.Encode(f)
	SetICRC(c, ICRC(ep, c))
	return c
}
