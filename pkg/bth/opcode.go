package bth

import "strconv"

// Opcode is the BTH OpCode (IBTA Vol 1 9.2.1 table 36): bits 7..5 the
// transport (RC 0x00, UC 0x20, RD 0x40, UD 0x60, CNP 0x80, XRC 0xA0,
// manufacturer specific 0xE0), bits 4..0 the operation.
type Opcode uint8

// Transport is the transport service of an opcode; the value is bits 7..5 of
// the opcode.
type Transport uint8

// Transport services (IBTA 9.2.1 table 36, Annex A14 for XRC, Annex A17.9.3
// for the RoCEv2 CNP).
const (
	TransportRC  Transport = 0 // reliable connection
	TransportUC  Transport = 1 // unreliable connection
	TransportRD  Transport = 2 // reliable datagram
	TransportUD  Transport = 3 // unreliable datagram
	TransportCNP Transport = 4 // congestion notification (RoCEv2)
	TransportXRC Transport = 5 // extended reliable connection
)

var transportNames = [8]string{"RC", "UC", "RD", "UD", "CNP", "XRC", "Reserved", "Vendor"}

// String returns "RC", "UC", "RD", "UD", "CNP", "XRC", "Reserved" or "Vendor".
func (t Transport) String() string { return transportNames[t&7] }

// Hdr is a set of extension headers. The bit order is the wire order: the
// headers present in a packet follow the BTH in increasing bit order.
type Hdr uint16

// Extension headers (IBTA 9.3), in wire order.
const (
	HdrRDETH        Hdr = 1 << iota // RDETH, 4 bytes (9.3.1)
	HdrDETH                         // DETH, 8 bytes (9.3.2)
	HdrXRCETH                       // XRCETH, 4 bytes (Annex A14)
	HdrFETH                         // FETH, 4 bytes (FLUSH, 1.5)
	HdrRETH                         // RETH, 16 bytes (9.3.3)
	HdrAtomicETH                    // AtomicETH, 28 bytes (9.3.4)
	HdrAETH                         // AETH, 4 bytes (9.3.5)
	HdrAtomicAckETH                 // AtomicAckETH, 8 bytes (9.3.6)
	HdrImmDt                        // ImmDt, 4 bytes (9.3.7)
	HdrIETH                         // IETH, 4 bytes (9.3.8)
	hdrEnd
)

// hdrSizes[i] is the size of the header with bit i.
var hdrSizes = [...]int{RDETHSize, DETHSize, XRCETHSize, FETHSize, RETHSize, AtomicETHSize,
	AETHSize, AtomicAckETHSize, ImmDtSize, IETHSize}

var hdrNames = [...]string{"RDETH", "DETH", "XRCETH", "FETH", "RETH", "AtomicETH", "AETH",
	"AtomicAckETH", "ImmDt", "IETH"}

// Size returns the total size of the headers in h.
func (h Hdr) Size() int {
	n := 0
	for i := range hdrSizes {
		if h&(1<<i) != 0 {
			n += hdrSizes[i]
		}
	}
	return n
}

// String lists the headers in wire order, e.g. "RETH+ImmDt"; "" for none.
func (h Hdr) String() string {
	s := ""
	for i := range hdrNames {
		if h&(1<<i) != 0 {
			if s != "" {
				s += "+"
			}
			s += hdrNames[i]
		}
	}
	return s
}

// OpKind is the operation an opcode belongs to, independent of transport.
type OpKind uint8

// Operation kinds.
const (
	KindUnknown     OpKind = iota // reserved opcode
	KindSend                      // SEND (all variants)
	KindWrite                     // RDMA WRITE
	KindReadReq                   // RDMA READ request
	KindReadResp                  // RDMA READ response
	KindAck                       // Acknowledge
	KindAtomicAck                 // ATOMIC Acknowledge
	KindCmpSwap                   // CmpSwap
	KindFetchAdd                  // FetchAdd
	KindFlush                     // FLUSH
	KindAtomicWrite               // ATOMIC WRITE
	KindCNP                       // congestion notification
	KindResync                    // RD RESYNC
)

var kindNames = [...]string{"Unknown", "Send", "Write", "ReadReq", "ReadResp", "Ack", "AtomicAck",
	"CmpSwap", "FetchAdd", "Flush", "AtomicWrite", "CNP", "Resync"}

// String returns the kind's name.
func (k OpKind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "OpKind(" + strconv.Itoa(int(k)) + ")"
}

// CNPResvSize is the number of reserved bytes after the BTH of a CNP
// (IBTA Annex A17.9.3); they count in OpInfo.HdrLen.
const CNPResvSize = 16

// OpInfo describes an opcode: its headers, layout and role.
type OpInfo struct {
	Name         string    // Wireshark-style name, e.g. "RC Send First"
	Valid        bool      // opcode is defined (and parseable)
	Transport    Transport // transport service
	Kind         OpKind    // operation
	Hdrs         Hdr       // extension headers after the BTH (wire order = bit order)
	HdrLen       int       // BTH + extension headers (+ the 16 reserved bytes of a CNP), bytes
	Payload      bool      // may carry payload
	FixedPayload int       // if > 0, the payload IBTA requires (ATOMIC WRITE: 8; Parse leaves the check to the responder)
	First        bool      // first packet of a message (or only)
	Middle       bool      // middle packet of a message
	Last         bool      // last packet of a message (or only); Only = First && Last
	Request      bool      // request (true) or response (false); a CNP is neither (false)
}

// Only reports whether the opcode is a whole message in one packet.
func (i *OpInfo) Only() bool { return i.First && i.Last }

// HasImm reports whether the opcode carries immediate data.
func (i *OpInfo) HasImm() bool { return i.Hdrs&HdrImmDt != 0 }

// HasInv reports whether the opcode carries an R_Key to invalidate.
func (i *OpInfo) HasInv() bool { return i.Hdrs&HdrIETH != 0 }

// opDef is one row of opList (opcodes_list.go).
type opDef struct {
	op                  Opcode
	name                string
	tr                  Transport
	kind                OpKind
	hdrs                Hdr
	payload             bool
	fixed               int
	first, middle, last bool
	request             bool
}

// opTable is the opcode table, indexed by opcode. Reserved entries have
// Valid=false and a "Reserved 0xNN" name.
var opTable = buildOpTable()

func buildOpTable() *[256]OpInfo {
	var t [256]OpInfo
	for i := range t {
		t[i] = OpInfo{Name: "Reserved 0x" + hex2(uint8(i)), Transport: Transport(i >> 5)}
	}
	for _, d := range opList {
		n := BTHSize + d.hdrs.Size()
		if d.kind == KindCNP {
			n += CNPResvSize
		}
		t[d.op] = OpInfo{Name: d.name, Valid: true, Transport: d.tr, Kind: d.kind, Hdrs: d.hdrs,
			HdrLen: n, Payload: d.payload, FixedPayload: d.fixed, First: d.first, Middle: d.middle,
			Last: d.last, Request: d.request}
	}
	return &t
}

func hex2(v uint8) string {
	const digits = "0123456789ABCDEF"
	return string([]byte{digits[v>>4], digits[v&15]})
}

// Info returns the table entry of op; never nil (Valid=false if reserved).
func (op Opcode) Info() *OpInfo { return &opTable[op] }

// Valid reports whether op is a defined opcode.
func (op Opcode) Valid() bool { return opTable[op].Valid }

// Transport returns the transport service, bits 7..5 of the opcode.
func (op Opcode) Transport() Transport { return Transport(op >> 5) }

// String returns the name in the style of Wireshark's InfiniBand dissector,
// e.g. "RC Send First"; reserved opcodes give "Reserved 0xNN".
func (op Opcode) String() string { return opTable[op].Name }

// WiresharkName returns the opcode name exactly as Wireshark 4.0's
// InfiniBand dissector prints it in the Info column (trailing space
// trimmed), so decoders can be compared with tshark. It differs from String
// for two dissector quirks (0x27 and 0x43). For opcodes without a known
// Wireshark 4.0 name (CNP, XRC, FLUSH, ATOMIC WRITE, reserved) it returns "".
func (op Opcode) WiresharkName() string {
	switch op {
	case OpUCWriteMiddle:
		return "Unreliable Connection RDMA Write Middle"
	case OpRDSendLastImm:
		return "RD Last Immediate"
	case OpCNP, OpRCFlush, OpRCAtomicWrite, OpRDFlush, OpRDAtomicWrite:
		return ""
	}
	if !op.Valid() || op.Transport() == TransportXRC {
		return ""
	}
	return op.String()
}
