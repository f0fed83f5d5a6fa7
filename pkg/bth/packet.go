package bth

import (
	"errors"
	"strconv"
)

// Sentinel errors of Parse; every Parse error wraps exactly one of them.
var (
	// ErrTruncated: the packet is shorter than its headers and ICRC.
	ErrTruncated = errors.New("bth: truncated packet")
	// ErrBadTVer: the BTH transport header version is not 0 (IBTA 9.2.5, C9-2).
	ErrBadTVer = errors.New("bth: unsupported transport header version")
	// ErrUnknownOpcode: the opcode is reserved (IBTA 9.2.1 table 36).
	ErrUnknownOpcode = errors.New("bth: unknown opcode")
	// ErrBadPad: the pad count does not fit the packet, or the opcode carries
	// no payload but PadCnt is not 0 (IBTA 9.2.4).
	ErrBadPad = errors.New("bth: bad pad count")
	// ErrBadLength: the payload length is not allowed for the opcode: bytes
	// after the headers of an opcode without payload.
	ErrBadLength = errors.New("bth: bad payload length for opcode")
)

// ParseError is the error Parse returns: the sentinel (Err) and where the
// packet failed. It is allocated only when parsing fails.
type ParseError struct {
	Err    error  // one of ErrTruncated, ErrBadTVer, ErrUnknownOpcode, ErrBadPad, ErrBadLength
	Opcode Opcode // the opcode (0 if the packet is shorter than one byte)
	Len    int    // the length of the packet
	Need   int    // bytes needed (ErrTruncated, ErrBadPad), else 0
}

// Error implements error.
func (e *ParseError) Error() string {
	s := e.Err.Error() + ": opcode 0x" + hex2(uint8(e.Opcode)) + " len " + strconv.Itoa(e.Len)
	if e.Need > 0 {
		s += " need " + strconv.Itoa(e.Need)
	}
	return s
}

// Unwrap returns the sentinel error.
func (e *ParseError) Unwrap() error { return e.Err }

// Packet is a parsed RoCEv2 packet (the UDP payload): views into the
// buffer given to Parse, no copies. Absent headers are nil.
type Packet struct {
	BTH       BTH
	RDETH     RDETH // RD only
	DETH      DETH
	XRCETH    XRCETH // XRC requests only
	FETH      FETH
	RETH      RETH
	AtomicETH AtomicETH
	AETH      AETH
	AtomicAck AtomicAckETH
	ImmDt     ImmDt
	IETH      IETH
	// SACK is softroce's selective acknowledgement extension after the AETH of an RC
	// Acknowledge exactly SACKSize bytes longer than IBTA's (sack.go); nil otherwise.
	SACK    SACK
	Payload []byte // without pad
	Pad     int    // pad bytes between payload and ICRC (BTH PadCnt)
	ICRC    []byte // the trailing 4 bytes
	Info    *OpInfo
}

// Parse parses a RoCEv2 packet: b is the UDP payload, BTH through ICRC
// (IBTA 9.2, 9.3). It checks TVer == 0, that the opcode is defined, that the
// packet holds the opcode's headers, PadCnt pad bytes and the ICRC, and that
// opcodes without payload have none (and PadCnt 0; an RC Acknowledge may carry softroce's
// SACK extension, Packet.SACK). A payload of another
// length than OpInfo.FixedPayload parses: that is a length error the
// responder answers (an ATOMIC WRITE of 4 bytes is NAKed, IBTA 9.7.4.1.4,
// oA19-28), not a malformed packet to drop. It does not check the
// ICRC (see VerifyICRC) nor any transport state. The returned views alias
// b. Malformed input gives a *ParseError wrapping a sentinel error; Parse
// never panics and allocates nothing on success.
func Parse(b []byte) (Packet, error) {
	var p Packet
	err := ParseInto(&p, b)
	return p, err
}

// ParseInto is Parse writing into *p, for data paths that reuse one Packet
// (it avoids copying the Packet value). On error *p is zeroed.
func ParseInto(p *Packet, b []byte) error {
	*p = Packet{}
	if len(b) < BTHSize+ICRCSize {
		var op Opcode
		if len(b) > 0 {
			op = Opcode(b[0])
		}
		return &ParseError{Err: ErrTruncated, Opcode: op, Len: len(b), Need: BTHSize + ICRCSize}
	}
	op := Opcode(b[bthOpcode])
	if b[bthFlags]&tverMask != 0 {
		return &ParseError{Err: ErrBadTVer, Opcode: op, Len: len(b)}
	}
	info := &opTable[op]
	if !info.Valid {
		return &ParseError{Err: ErrUnknownOpcode, Opcode: op, Len: len(b)}
	}
	if len(b) < info.HdrLen+ICRCSize {
		return &ParseError{Err: ErrTruncated, Opcode: op, Len: len(b), Need: info.HdrLen + ICRCSize}
	}
	pad := int(b[bthFlags]&padMask) >> padShift
	end := len(b) - ICRCSize
	if !info.Payload {
		if pad != 0 {
			return &ParseError{Err: ErrBadPad, Opcode: op, Len: len(b)}
		}
		if end != info.HdrLen {
			if op != OpRCAck || end != info.HdrLen+SACKSize {
				return &ParseError{Err: ErrBadLength, Opcode: op, Len: len(b)}
			}
			// softroce's SACK extension (sack.go): not IBTA, recognised by its length
			p.SACK = SACK(b[info.HdrLen:end:end])
		}
	} else {
		if end-info.HdrLen < pad {
			return &ParseError{Err: ErrBadPad, Opcode: op, Len: len(b), Need: info.HdrLen + pad + ICRCSize}
		}
		p.Payload = b[info.HdrLen : end-pad : end-pad]
	}
	p.BTH = b[:BTHSize:BTHSize]
	if h := info.Hdrs; h != 0 {
		off := BTHSize
		if h&HdrRDETH != 0 {
			p.RDETH = RDETH(b[off : off+RDETHSize : off+RDETHSize])
			off += RDETHSize
		}
		if h&HdrDETH != 0 {
			p.DETH = DETH(b[off : off+DETHSize : off+DETHSize])
			off += DETHSize
		}
		if h&HdrXRCETH != 0 {
			p.XRCETH = XRCETH(b[off : off+XRCETHSize : off+XRCETHSize])
			off += XRCETHSize
		}
		if h&HdrFETH != 0 {
			p.FETH = FETH(b[off : off+FETHSize : off+FETHSize])
			off += FETHSize
		}
		if h&HdrRETH != 0 {
			p.RETH = RETH(b[off : off+RETHSize : off+RETHSize])
			off += RETHSize
		}
		if h&HdrAtomicETH != 0 {
			p.AtomicETH = AtomicETH(b[off : off+AtomicETHSize : off+AtomicETHSize])
			off += AtomicETHSize
		}
		if h&HdrAETH != 0 {
			p.AETH = AETH(b[off : off+AETHSize : off+AETHSize])
			off += AETHSize
		}
		if h&HdrAtomicAckETH != 0 {
			p.AtomicAck = AtomicAckETH(b[off : off+AtomicAckETHSize : off+AtomicAckETHSize])
			off += AtomicAckETHSize
		}
		if h&HdrImmDt != 0 {
			p.ImmDt = ImmDt(b[off : off+ImmDtSize : off+ImmDtSize])
			off += ImmDtSize
		}
		if h&HdrIETH != 0 {
			p.IETH = IETH(b[off : off+IETHSize : off+IETHSize])
		}
	}
	p.Pad = pad
	p.ICRC = b[end:len(b):len(b)]
	p.Info = info
	return nil
}
