package perftest

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/softroce/softroce/internal/oob"
)

// Record sizes (perftest_communication.h KEY_MSG_SIZE_GID and KEY_MSG_SIZE),
// terminating NUL included.
const (
	RecordSize      = 108 // "%04x:%04x:%06x:%06x:%08x:%016llx:" + 16 x "%02x:" + "%08x:" + NUL
	RecordSizeNoGID = 59  // "%04x:%04x:%06x:%06x:%08x:%016llx:%08x" + NUL
)

// Dest is one queue pair's key record (struct pingpong_dest, the fields
// ethernet_write_keys sends).
type Dest struct {
	LID      uint16   // port LID (0 on RoCE)
	OutReads uint16   // max outstanding RDMA READ/atomic (the responder resources asked of the peer)
	QPN      uint32   // queue pair number, 24 bits
	PSN      uint32   // starting PSN, 24 bits
	RKey     uint32   // remote key of the test buffer (0 for SEND tests)
	VAddr    uint64   // address of the test buffer
	GID      [16]byte // raw GID
	SRQN     uint32   // XRC/DC SRQ number (0 otherwise)
}

// Addr returns the GID as a 16-byte address.
func (d Dest) Addr() netip.Addr { return netip.AddrFrom16(d.GID) }

// SetAddr stores a as the GID (IPv4 as ::ffff:a.b.c.d).
func (d *Dest) SetAddr(a netip.Addr) { d.GID = a.As16() }

const hexdigits = "0123456789abcdef"

// putHex writes v as len(dst) hex digits. Like printf's minimum width, a value
// wider than the field is not truncated: the caller masks to the field width
// (the C fields are int-sized, so only QPN/PSN/LID could overflow and never do).
func putHex(dst []byte, v uint64) {
	for i := len(dst) - 1; i >= 0; i-- {
		dst[i] = hexdigits[v&0xf]
		v >>= 4
	}
}

// AppendEncode appends the 108-byte record (KEY_PRINT_FMT_GID plus NUL).
// QPN and PSN are masked to 24 bits.
func (d *Dest) AppendEncode(b []byte) []byte {
	var r [RecordSize]byte
	n := d.head(r[:])
	for _, g := range d.GID {
		r[n], r[n+1], r[n+2] = hexdigits[g>>4], hexdigits[g&0xf], ':'
		n += 3
	}
	putHex(r[n:n+8], uint64(d.SRQN))
	r[n+8] = ':'
	r[n+9] = 0
	return append(b, r[:]...)
}

// AppendEncodeNoGID appends the 59-byte record without GID (KEY_PRINT_FMT plus
// NUL), which perftest uses when no GID index is in use (InfiniBand without -x).
func (d *Dest) AppendEncodeNoGID(b []byte) []byte {
	var r [RecordSizeNoGID]byte
	n := d.head(r[:])
	putHex(r[n:n+8], uint64(d.SRQN))
	r[n+8] = 0
	return append(b, r[:]...)
}

// head writes "%04x:%04x:%06x:%06x:%08x:%016llx:" and returns its length (50).
func (d *Dest) head(r []byte) int {
	putHex(r[0:4], uint64(d.LID))
	r[4] = ':'
	putHex(r[5:9], uint64(d.OutReads))
	r[9] = ':'
	putHex(r[10:16], uint64(d.QPN&0xFFFFFF))
	r[16] = ':'
	putHex(r[17:23], uint64(d.PSN&0xFFFFFF))
	r[23] = ':'
	putHex(r[24:32], uint64(d.RKey))
	r[32] = ':'
	putHex(r[33:49], d.VAddr)
	r[49] = ':'
	return 50
}

// ErrRecord is wrapped by ParseRecord errors (and matches oob.ErrMalformed).
var ErrRecord = fmt.Errorf("%w: perftest key record", oob.ErrMalformed)

// ParseRecord decodes a 108-byte record (the GID form). The numeric fields
// may have any number of hex digits that fits their type (perftest parses
// them with strtol/strtoul); the text ends at the first NUL.
func ParseRecord(b []byte) (Dest, error) {
	s := cstr(b)
	parts := strings.Split(s, ":")
	// 6 header fields, 16 GID bytes, SRQN, and the empty string after the last ':'.
	if len(parts) != 24 || parts[23] != "" {
		return Dest{}, fmt.Errorf("%w: %d fields in %q", ErrRecord, len(parts)-1, s)
	}
	var d Dest
	if err := d.parseHead(parts[:6], s); err != nil {
		return Dest{}, err
	}
	for i := range 16 {
		v, ok := parseHex(parts[6+i], 8)
		if !ok {
			return Dest{}, fmt.Errorf("%w: GID byte %d in %q", ErrRecord, i, s)
		}
		d.GID[i] = byte(v)
	}
	v, ok := parseHex(parts[22], 32)
	if !ok {
		return Dest{}, fmt.Errorf("%w: SRQN in %q", ErrRecord, s)
	}
	d.SRQN = uint32(v)
	return d, nil
}

// ParseRecordNoGID decodes a 59-byte record (no GID).
func ParseRecordNoGID(b []byte) (Dest, error) {
	s := cstr(b)
	parts := strings.Split(s, ":")
	if len(parts) != 7 {
		return Dest{}, fmt.Errorf("%w: %d fields in %q", ErrRecord, len(parts), s)
	}
	var d Dest
	if err := d.parseHead(parts[:6], s); err != nil {
		return Dest{}, err
	}
	v, ok := parseHex(parts[6], 32)
	if !ok {
		return Dest{}, fmt.Errorf("%w: SRQN in %q", ErrRecord, s)
	}
	d.SRQN = uint32(v)
	return d, nil
}

func (d *Dest) parseHead(p []string, s string) error {
	bits := [6]int{16, 16, 24, 24, 32, 64}
	var v [6]uint64
	for i := range p {
		x, ok := parseHex(p[i], bits[i])
		if !ok {
			return fmt.Errorf("%w: field %d in %q", ErrRecord, i+1, s)
		}
		v[i] = x
	}
	d.LID, d.OutReads, d.QPN, d.PSN, d.RKey, d.VAddr =
		uint16(v[0]), uint16(v[1]), uint32(v[2]), uint32(v[3]), uint32(v[4]), v[5]
	return nil
}

// parseHex parses 1..16 hex digits whose value fits in bits.
func parseHex(s string, bits int) (uint64, bool) {
	if len(s) == 0 || len(s) > 16 {
		return 0, false
	}
	var v uint64
	for i := 0; i < len(s); i++ {
		c := s[i]
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = c - '0'
		case c >= 'a' && c <= 'f':
			d = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, false
		}
		v = v<<4 | uint64(d)
	}
	if bits < 64 && v>>bits != 0 {
		return 0, false
	}
	return v, true
}

// cstr returns b up to its first NUL, as a string.
func cstr(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
