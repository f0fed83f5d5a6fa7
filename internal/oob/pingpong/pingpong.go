// Package pingpong is the out-of-band exchange of rdma-core's
// libibverbs/examples ibv_rc_pingpong, ibv_uc_pingpong, ibv_ud_pingpong and
// ibv_srq_pingpong (rdma-core v44, as Debian 12 ships it): one TCP connection
// to port 18515 on which each side sends its queue pair address as the text
// record "%04x:%06x:%06x:%s" (LID:QPN:PSN:GID) plus its NUL, 52 bytes.
//
// Order (rc_pingpong.c pp_client_exch_dest / pp_server_exch_dest):
//
//	client -> server: its record(s)
//	server:           parses them, connects its QP(s) (RTR/RTS), then
//	server -> client: its record(s)
//	client -> server: "done\0" (5 bytes); both close
//
// rc, uc and ud send one record each way. srq_pingpong always sends MAX_QP =
// 256 records each way (one per possible QP, the unused ones all zero), the
// client all of its records before the server answers with all of its.
//
// The GID travels as 32 hex digits: gid_to_wire_gid prints the GID as four
// host-order 32-bit words passed through htobe32, which on every host yields
// the 16 raw GID bytes in order, so ::ffff:198.19.0.1 is
// "00000000000000000000ffffc6130001". The InfiniBand specification does not
// define any of this; see docs/oob.md.
package pingpong

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/softroce/softroce/internal/oob"
)

// RecordSize is the size of one record on the wire, its NUL included
// (sizeof "0000:000000:000000:00000000000000000000000000000000").
const RecordSize = 52

// SRQRecords is how many records ibv_srq_pingpong sends each way (MAX_QP).
const SRQRecords = 256

// Done is the message the client sends last (write(sockfd, "done", sizeof "done")).
var Done = [5]byte{'d', 'o', 'n', 'e', 0}

// Dest is one queue pair's address (struct pingpong_dest).
type Dest struct {
	LID uint16   // port LID (0 on RoCE)
	QPN uint32   // queue pair number, 24 bits
	PSN uint32   // starting packet sequence number, 24 bits
	GID [16]byte // raw GID (on RoCEv2 the IPv4-mapped or IPv6 address)
}

// Addr returns the GID as an address (IPv4-mapped GIDs stay 16-byte; use Unmap).
func (d Dest) Addr() netip.Addr { return netip.AddrFrom16(d.GID) }

// SetAddr stores a as the GID (IPv4 addresses as ::ffff:a.b.c.d, the RoCEv2 form).
func (d *Dest) SetAddr(a netip.Addr) { d.GID = a.As16() }

const hexdigits = "0123456789abcdef"

func putHex(dst []byte, v uint64) {
	for i := len(dst) - 1; i >= 0; i-- {
		dst[i] = hexdigits[v&0xf]
		v >>= 4
	}
}

// AppendEncode appends the 52-byte record of d (NUL included) to b.
// QPN and PSN are masked to 24 bits as %06x of a 24-bit value prints them.
func (d *Dest) AppendEncode(b []byte) []byte {
	var r [RecordSize]byte
	putHex(r[0:4], uint64(d.LID))
	r[4] = ':'
	putHex(r[5:11], uint64(d.QPN&0xFFFFFF))
	r[11] = ':'
	putHex(r[12:18], uint64(d.PSN&0xFFFFFF))
	r[18] = ':'
	for i, g := range d.GID {
		r[19+2*i] = hexdigits[g>>4]
		r[20+2*i] = hexdigits[g&0xf]
	}
	r[51] = 0
	return append(b, r[:]...)
}

// Encode returns the 52-byte record of d.
func (d *Dest) Encode() []byte { return d.AppendEncode(make([]byte, 0, RecordSize)) }

// ErrRecord is wrapped by Parse errors (and matches oob.ErrMalformed).
var ErrRecord = fmt.Errorf("%w: pingpong record", oob.ErrMalformed)

// Parse decodes one record. Like the tools' sscanf("%x:%x:%x:%s") it accepts
// 1 to 8 hex digits in the numeric fields (values must fit their field: LID
// 16 bits, QPN and PSN 24 bits); the GID must be exactly 32 hex digits. The
// record ends at the first NUL or at the end of b.
func Parse(b []byte) (Dest, error) {
	for i, c := range b {
		if c == 0 {
			b = b[:i]
			break
		}
	}
	var d Dest
	rest := b
	var vals [3]uint64
	for f := range 3 {
		n, v, ok := scanHex(rest)
		if !ok || n >= len(rest) || rest[n] != ':' {
			return Dest{}, fmt.Errorf("%w: field %d of %q", ErrRecord, f+1, b)
		}
		vals[f] = v
		rest = rest[n+1:]
	}
	if vals[0] > 0xFFFF || vals[1] > 0xFFFFFF || vals[2] > 0xFFFFFF {
		return Dest{}, fmt.Errorf("%w: value out of range in %q", ErrRecord, b)
	}
	if len(rest) != 32 {
		return Dest{}, fmt.Errorf("%w: GID of %d hex digits in %q", ErrRecord, len(rest), b)
	}
	for i := range 16 {
		hi, ok1 := unhex(rest[2*i])
		lo, ok2 := unhex(rest[2*i+1])
		if !ok1 || !ok2 {
			return Dest{}, fmt.Errorf("%w: bad GID in %q", ErrRecord, b)
		}
		d.GID[i] = hi<<4 | lo
	}
	d.LID, d.QPN, d.PSN = uint16(vals[0]), uint32(vals[1]), uint32(vals[2])
	return d, nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// scanHex reads 1..8 hex digits.
func scanHex(b []byte) (n int, v uint64, ok bool) {
	for n < len(b) && n < 9 {
		d, isHex := unhex(b[n])
		if !isHex {
			break
		}
		v = v<<4 | uint64(d)
		n++
	}
	return n, v, n > 0 && n <= 8
}

// Options configure Client and Server.
type Options struct {
	oob.Options // per-step timeout and clock
	// Records is how many records each side sends: 0 or 1 for rc/uc/ud,
	// SRQRecords for srq_pingpong. Local lists shorter than Records are
	// padded with zero records, as srq_pingpong does for its unused QPs.
	Records int
}

func (o *Options) records() int {
	if o.Records <= 0 {
		return 1
	}
	return o.Records
}

// ErrTooMany reports more local destinations than Options.Records.
var ErrTooMany = errors.New("pingpong: more local destinations than records")

// ErrBadDone reports that the client's last message was not "done\0".
var ErrBadDone = fmt.Errorf("%w: expected \"done\\x00\"", oob.ErrMalformed)

func encodeAll(local []Dest, n int) ([]byte, error) {
	if len(local) > n {
		return nil, fmt.Errorf("%w: %d > %d", ErrTooMany, len(local), n)
	}
	buf := make([]byte, 0, n*RecordSize)
	var zero Dest
	for i := range n {
		d := &zero
		if i < len(local) {
			d = &local[i]
		}
		buf = d.AppendEncode(buf)
	}
	return buf, nil
}

func readAll(ctx context.Context, s *oob.Stream, n int) ([]Dest, error) {
	buf := make([]byte, n*RecordSize)
	if err := s.ReadFull(ctx, "read remote address", buf); err != nil {
		return nil, err
	}
	out := make([]Dest, n)
	for i := range out {
		d, err := Parse(buf[i*RecordSize : (i+1)*RecordSize])
		if err != nil {
			return nil, &oob.StepError{Step: fmt.Sprintf("parse remote address %d", i), Err: err}
		}
		out[i] = d
	}
	return out, nil
}

// Client runs the client side on an established connection: send the local
// records, read the server's, send "done\0". It does not close c. It returns
// all Options.Records remote records (for srq_pingpong the unused ones are
// zero).
func Client(ctx context.Context, c net.Conn, local []Dest, o Options) ([]Dest, error) {
	n := o.records()
	msg, err := encodeAll(local, n)
	if err != nil {
		return nil, err
	}
	s := oob.NewStream(c, o.Options)
	if err := s.Write(ctx, "send local address", msg); err != nil {
		return nil, err
	}
	remote, err := readAll(ctx, s, n)
	if err != nil {
		return nil, err
	}
	if err := s.Write(ctx, "send done", Done[:]); err != nil {
		return nil, err
	}
	return remote, nil
}

// Dial connects to addr ("host:port"), runs Client and closes the connection.
func Dial(ctx context.Context, addr string, local []Dest, o Options) ([]Dest, error) {
	c, err := oob.Dial(ctx, addr, o.Options)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return Client(ctx, c, local, o)
}

// Server runs the server side on an established connection: read the
// client's records, call local with them (the tools move their QPs to
// RTR/RTS here, before answering), send the records local returns, and wait
// for "done\0". It does not close c.
func Server(ctx context.Context, c net.Conn, o Options, local func(remote []Dest) ([]Dest, error)) ([]Dest, error) {
	n := o.records()
	s := oob.NewStream(c, o.Options)
	remote, err := readAll(ctx, s, n)
	if err != nil {
		return nil, err
	}
	mine, err := local(remote)
	if err != nil {
		return nil, err
	}
	msg, err := encodeAll(mine, n)
	if err != nil {
		return nil, err
	}
	if err := s.Write(ctx, "send local address", msg); err != nil {
		return nil, err
	}
	var done [len(Done)]byte
	if err := s.ReadFull(ctx, "read done", done[:]); err != nil {
		return nil, err
	}
	if done != Done {
		return nil, &oob.StepError{Step: "read done", Err: fmt.Errorf("%w, got %q", ErrBadDone, done[:])}
	}
	return remote, nil
}

// Serve accepts one connection on ln (waiting as long as ctx allows), runs
// Server on it and closes it.
func Serve(ctx context.Context, ln net.Listener, o Options, local func(remote []Dest) ([]Dest, error)) ([]Dest, error) {
	c, err := oob.Accept(ctx, ln)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return Server(ctx, c, o, local)
}
