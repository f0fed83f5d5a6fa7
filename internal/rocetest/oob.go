package rocetest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"

	"github.com/softroce/softroce/pkg/bth"
)

// PingpongPort is the TCP port of the rdma-core ibv_*_pingpong out-of-band exchange.
const PingpongPort = 18515

// PingpongDestSize is the size of one pingpong address record on the wire:
// "LLLL:QQQQQQ:PPPPPP:GGGG...(32 hex)" plus a NUL.
const PingpongDestSize = 52

// ErrOOB reports a malformed out-of-band record.
var ErrOOB = errors.New("rocetest: bad pingpong record")

// PingpongDest is one side's address in the ibv_rc_pingpong exchange
// (libibverbs/examples: "%04x:%06x:%06x:%s", the GID as 32 hex digits of its raw bytes).
type PingpongDest struct {
	LID uint16
	QPN uint32
	PSN bth.PSN
	GID netip.Addr // 16-byte; IPv4 RoCEv2 GIDs are ::ffff:a.b.c.d
}

// Marshal returns the 52-byte record (with the trailing NUL).
func (d *PingpongDest) Marshal() []byte {
	g := d.GID.As16()
	var hex strings.Builder
	for i := 0; i < 16; i += 4 {
		fmt.Fprintf(&hex, "%02x%02x%02x%02x", g[i], g[i+1], g[i+2], g[i+3])
	}
	s := fmt.Sprintf("%04x:%06x:%06x:%s", d.LID, d.QPN&0xFFFFFF, uint32(d.PSN)&bth.PSNMask, hex.String())
	return append([]byte(s), 0)
}

// ParsePingpongDest parses one record (NUL and trailing bytes after it ignored).
func ParsePingpongDest(b []byte) (PingpongDest, error) {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	parts := strings.Split(string(b), ":")
	if len(parts) != 4 || len(parts[3]) != 32 {
		return PingpongDest{}, fmt.Errorf("%w: %q", ErrOOB, b)
	}
	var d PingpongDest
	lid, err1 := strconv.ParseUint(parts[0], 16, 16)
	qpn, err2 := strconv.ParseUint(parts[1], 16, 24)
	psn, err3 := strconv.ParseUint(parts[2], 16, 24)
	var g [16]byte
	var err4 error
	for i := range 16 {
		var v uint64
		v, err4 = strconv.ParseUint(parts[3][2*i:2*i+2], 16, 8)
		if err4 != nil {
			break
		}
		g[i] = byte(v)
	}
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return PingpongDest{}, fmt.Errorf("%w: %q: %v", ErrOOB, b, err)
	}
	d.LID, d.QPN, d.PSN, d.GID = uint16(lid), uint32(qpn), bth.PSN(psn), netip.AddrFrom16(g)
	return d, nil
}

// PingpongClientExchange runs the client side of the exchange on a connected stream:
// send our record, read the server's, send "done".
func PingpongClientExchange(rw io.ReadWriter, mine PingpongDest) (PingpongDest, error) {
	if _, err := rw.Write(mine.Marshal()); err != nil {
		return PingpongDest{}, fmt.Errorf("rocetest: oob write: %w", err)
	}
	buf := make([]byte, PingpongDestSize)
	if _, err := io.ReadFull(rw, buf); err != nil {
		return PingpongDest{}, fmt.Errorf("rocetest: oob read: %w", err)
	}
	theirs, err := ParsePingpongDest(buf)
	if err != nil {
		return PingpongDest{}, err
	}
	if _, err := rw.Write([]byte("done\x00")); err != nil {
		return PingpongDest{}, fmt.Errorf("rocetest: oob write done: %w", err)
	}
	return theirs, nil
}

// PingpongServerExchange runs the server side: read the client's record, send ours, read
// the client's "done" (call it after our QP is ready to receive).
func PingpongServerExchange(rw io.ReadWriter, mine PingpongDest, ready func(theirs PingpongDest) error) (PingpongDest, error) {
	buf := make([]byte, PingpongDestSize)
	if _, err := io.ReadFull(rw, buf); err != nil {
		return PingpongDest{}, fmt.Errorf("rocetest: oob read: %w", err)
	}
	theirs, err := ParsePingpongDest(buf)
	if err != nil {
		return PingpongDest{}, err
	}
	if ready != nil {
		if err := ready(theirs); err != nil {
			return theirs, err
		}
	}
	if _, err := rw.Write(mine.Marshal()); err != nil {
		return theirs, fmt.Errorf("rocetest: oob write: %w", err)
	}
	done := make([]byte, len("done\x00"))
	if _, err := io.ReadFull(rw, done); err != nil {
		return theirs, fmt.Errorf("rocetest: oob read done: %w", err)
	}
	return theirs, nil
}
