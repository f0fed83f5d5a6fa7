package rocetest

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/softroce/softroce/pkg/bth"
)

// Expect describes a received packet; nil fields match anything.
type Expect struct {
	Opcode *bth.Opcode
	DestQP *uint32
	PSN    *bth.PSN
	AckReq *bool
	// AckType and MSN check the AETH (IBTA 9.3.5); the packet must have one.
	AckType *bth.AckType
	MSN     *uint32
	// Syndrome checks the whole AETH syndrome byte.
	Syndrome *uint8
	// PayloadLen checks the payload length without pad.
	PayloadLen *int
	// Payload checks the payload bytes (without pad).
	Payload []byte
}

// Ptr returns a pointer to v, for Expect fields.
func Ptr[T any](v T) *T { return &v }

// Match returns nil if p matches e, else an error listing every mismatch.
func (e *Expect) Match(p *bth.Packet) error {
	var bad []string
	f := p.BTH.Fields()
	if e.Opcode != nil && f.Opcode != *e.Opcode {
		bad = append(bad, fmt.Sprintf("opcode %v, want %v", f.Opcode, *e.Opcode))
	}
	if e.DestQP != nil && f.DestQP != *e.DestQP {
		bad = append(bad, fmt.Sprintf("destqp %#06x, want %#06x", f.DestQP, *e.DestQP))
	}
	if e.PSN != nil && f.PSN != *e.PSN {
		bad = append(bad, fmt.Sprintf("psn %#06x, want %#06x", uint32(f.PSN), uint32(*e.PSN)))
	}
	if e.AckReq != nil && f.AckReq != *e.AckReq {
		bad = append(bad, fmt.Sprintf("ackreq %v, want %v", f.AckReq, *e.AckReq))
	}
	if e.AckType != nil || e.MSN != nil || e.Syndrome != nil {
		if p.AETH == nil {
			bad = append(bad, "no AETH")
		} else {
			a := p.AETH.Fields()
			if e.AckType != nil && bth.SyndromeType(a.Syndrome) != *e.AckType {
				bad = append(bad, fmt.Sprintf("ack type %v (syndrome %#02x), want %v", bth.SyndromeType(a.Syndrome), a.Syndrome, *e.AckType))
			}
			if e.Syndrome != nil && a.Syndrome != *e.Syndrome {
				bad = append(bad, fmt.Sprintf("syndrome %#02x, want %#02x", a.Syndrome, *e.Syndrome))
			}
			if e.MSN != nil && a.MSN != *e.MSN {
				bad = append(bad, fmt.Sprintf("msn %d, want %d", a.MSN, *e.MSN))
			}
		}
	}
	if e.PayloadLen != nil && len(p.Payload) != *e.PayloadLen {
		bad = append(bad, fmt.Sprintf("payload %d bytes, want %d", len(p.Payload), *e.PayloadLen))
	}
	if e.Payload != nil && !bytes.Equal(p.Payload, e.Payload) {
		bad = append(bad, fmt.Sprintf("payload differs (%d bytes, want %d)", len(p.Payload), len(e.Payload)))
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("rocetest: packet mismatch: %s", strings.Join(bad, "; "))
}

// Describe is a one-line summary of a packet for logs.
func Describe(p *bth.Packet) string {
	f := p.BTH.Fields()
	s := fmt.Sprintf("%v destqp=%#06x psn=%#06x ackreq=%v pad=%d payload=%d", f.Opcode, f.DestQP, uint32(f.PSN), f.AckReq, f.PadCnt, len(p.Payload))
	if p.AETH != nil {
		a := p.AETH.Fields()
		s += fmt.Sprintf(" aeth(syndrome=%#02x msn=%d)", a.Syndrome, a.MSN)
	}
	return s
}
