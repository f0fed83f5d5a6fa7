// Package perftest is the out-of-band exchange of perftest 6.06 (ib_write_bw,
// ib_read_bw, ib_send_bw, ib_atomic_bw and the _lat tools, as Debian 12
// ships them in package perftest 4.5+0.17), without rdma_cm: one TCP
// connection to port 18515 carrying, in order,
//
//	version      16 bytes  "6.06" NUL-padded               exchange_versions
//	cycle buffer  4 bytes  big-endian int, max wins        check_sys_data
//	cache line    4 bytes  big-endian int, max wins        check_sys_data
//	MTU           2 bytes  ibv_mtu enum as "%d" + NUL, min  check_mtu
//	key records 108 bytes  "%04x:%04x:%06x:%06x:%08x:%016llx:" + 16 x "%02x:"
//	                       + "%08x:" + NUL, several rounds  ctx_hand_shake
//	BW reports    8 bytes  each: size, iters, peak, avg, msg rate (big-endian)
//	done          5 bytes  "done\0" from each side          ctx_close_connection
//
// Every exchange is symmetric and the client writes first: ctx_xchg_data and
// ctx_hand_shake make the client write then read and the server read then
// write, so the two never both wait to read. Which rounds a tool runs depends
// on the test (see Test and Conn.Setup). docs/oob.md has the details and the
// source lines. None of this is in the InfiniBand specification.
package perftest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"time"

	"github.com/softroce/softroce/internal/oob"
)

// Version is the perftest version this package speaks (configure.ac AC_INIT).
const Version = "6.06"

// MinVersion is the oldest peer version perftest 6.06 accepts
// (check_version_compatibility: atof(rem_version) < 5.70 is refused). Every
// version-dependent size in the exchange (MTU 2 bytes from 5.31, system data
// from 5.32, 8-byte iterations from 5.33) is settled at 5.70.
const MinVersion = "5.70"

// VersionSize is the size of the version message (MAX_VERSION).
const VersionSize = 16

// Done is the last message each side writes before closing.
var Done = [5]byte{'d', 'o', 'n', 'e', 0}

// Role is which side of the exchange a Conn plays.
type Role uint8

// Roles. The client is the tool started with the server's name.
const (
	Client Role = iota
	Server
)

// String returns "client" or "server".
func (r Role) String() string {
	if r == Server {
		return "server"
	}
	return "client"
}

// Options configure a Conn.
type Options struct {
	oob.Options // per-step timeout and clock
	// Version is the version string sent; "" means Version.
	Version string
	// NoGID selects the 59-byte key record without GID, which perftest uses
	// when no GID index is in use (InfiniBand without -x). Both sides must
	// agree. RoCE always uses the GID form.
	NoGID bool
	// PerPortReport adds the four per-port values to the BW report exchange
	// (--report-per-port).
	PerPortReport bool
	// FinishTimeout bounds the first round of Finish, in which the side that
	// finished measuring first waits for the other (the server of a
	// one-sided test waits for the client's whole run). 0 means no bound
	// but the context's, as perftest waits forever.
	FinishTimeout time.Duration
}

// Conn is one side of a perftest exchange. It is not safe for concurrent use.
type Conn struct {
	s             *oob.Stream
	role          Role
	o             Options
	remoteVersion string
}

// NewConn wraps an established TCP connection.
func NewConn(c net.Conn, r Role, o Options) *Conn {
	return &Conn{s: oob.NewStream(c, o.Options), role: r, o: o}
}

// Dial connects to a perftest server at addr ("host:port") as the client.
func Dial(ctx context.Context, addr string, o Options) (*Conn, error) {
	c, err := oob.Dial(ctx, addr, o.Options)
	if err != nil {
		return nil, err
	}
	return NewConn(c, Client, o), nil
}

// Accept waits for a perftest client on ln (as long as ctx allows) and
// returns the server side.
func Accept(ctx context.Context, ln net.Listener, o Options) (*Conn, error) {
	c, err := oob.Accept(ctx, ln)
	if err != nil {
		return nil, err
	}
	return NewConn(c, Server, o), nil
}

// Role returns the side this Conn plays.
func (c *Conn) Role() Role { return c.role }

// RemoteVersion returns the peer's version string after ExchangeVersion.
func (c *Conn) RemoteVersion() string { return c.remoteVersion }

// Close closes the connection.
func (c *Conn) Close() error { return c.s.Close() }

// Exchange is ctx_xchg_data: the client writes mine then reads len(theirs)
// bytes, the server reads then writes. mine and theirs must have the same
// length.
func (c *Conn) Exchange(ctx context.Context, step string, mine, theirs []byte) error {
	if c.role == Client {
		if err := c.s.Write(ctx, "send "+step, mine); err != nil {
			return err
		}
		return c.s.ReadFull(ctx, "read "+step, theirs)
	}
	if err := c.s.ReadFull(ctx, "read "+step, theirs); err != nil {
		return err
	}
	return c.s.Write(ctx, "send "+step, mine)
}

// VersionError reports a peer whose version perftest 6.06 would refuse.
type VersionError struct {
	Remote string // the peer's version string
	Local  string // ours
}

// Error implements error.
func (e *VersionError) Error() string {
	return fmt.Sprintf("perftest: peer perftest version %q, expected %s (compatible: >= %s)", e.Remote, e.Local, MinVersion)
}

// ErrVersion is matched by *VersionError (errors.Is).
var ErrVersion = errors.New("perftest: incompatible peer version")

// Is makes errors.Is(err, ErrVersion) true.
func (e *VersionError) Is(target error) bool { return target == ErrVersion }

// ExchangeVersion exchanges the 16-byte version strings (exchange_versions)
// and refuses a peer older than MinVersion (check_version_compatibility).
func (c *Conn) ExchangeVersion(ctx context.Context) (string, error) {
	local := c.o.Version
	if local == "" {
		local = Version
	}
	var mine, theirs [VersionSize]byte
	copy(mine[:VersionSize-1], local) // strncpy into char[16]; the last byte stays NUL
	if err := c.Exchange(ctx, "version", mine[:], theirs[:]); err != nil {
		return "", err
	}
	rem := cstr(theirs[:])
	c.remoteVersion = rem
	if atof(rem) < atof(MinVersion) {
		return rem, &VersionError{Remote: rem, Local: local}
	}
	return rem, nil
}

// atof parses the longest leading decimal number of s, as C's atof does for
// version strings ("6.06", "5.70"); 0 if none.
func atof(s string) float64 {
	end := 0
	dot := false
	for end < len(s) && (s[end] >= '0' && s[end] <= '9' || s[end] == '.' && !dot) {
		if s[end] == '.' {
			dot = true
		}
		end++
	}
	v, err := strconv.ParseFloat(s[:end], 64)
	if err != nil {
		return 0
	}
	return v
}

// SysData is what check_sys_data exchanges; each side keeps the larger value.
type SysData struct {
	CycleBuffer int32 // buffer alignment, the page size (sysconf(_SC_PAGESIZE)): 4096
	CacheLine   int32 // cache line size: 64 (DEF_CACHE_LINE_SIZE)
}

// DefaultSysData is what perftest sends on x86-64 Linux.
var DefaultSysData = SysData{CycleBuffer: 4096, CacheLine: 64}

// ExchangeSysData exchanges the cycle buffer then the cache line size (4-byte
// big-endian each, hton_int) and returns the agreed values (the maximum of
// each, as check_sys_data keeps) and the peer's.
func (c *Conn) ExchangeSysData(ctx context.Context, mine SysData) (agreed, remote SysData, err error) {
	var m, t [4]byte
	binary.BigEndian.PutUint32(m[:], uint32(mine.CycleBuffer))
	if err = c.Exchange(ctx, "cycle buffer", m[:], t[:]); err != nil {
		return
	}
	remote.CycleBuffer = int32(binary.BigEndian.Uint32(t[:]))
	binary.BigEndian.PutUint32(m[:], uint32(mine.CacheLine))
	if err = c.Exchange(ctx, "cache line size", m[:], t[:]); err != nil {
		return
	}
	remote.CacheLine = int32(binary.BigEndian.Uint32(t[:]))
	agreed = SysData{CycleBuffer: max(mine.CycleBuffer, remote.CycleBuffer), CacheLine: max(mine.CacheLine, remote.CacheLine)}
	return agreed, remote, nil
}

// MTU is an ibv_mtu value: 1 = 256 ... 5 = 4096 bytes.
type MTU uint8

// The MTUs.
const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Valid reports whether m is one of the five MTUs.
func (m MTU) Valid() bool { return m >= MTU256 && m <= MTU4096 }

// Bytes returns the MTU in bytes (0 if invalid).
func (m MTU) Bytes() int {
	if !m.Valid() {
		return 0
	}
	return 128 << m
}

// MTUFromBytes returns the MTU of n bytes (0 if n is not 256..4096 power of two).
func MTUFromBytes(n int) MTU {
	for m := MTU256; m <= MTU4096; m++ {
		if m.Bytes() == n {
			return m
		}
	}
	return 0
}

// ErrMTU reports an invalid local MTU passed to ExchangeMTU.
var ErrMTU = errors.New("perftest: invalid MTU")

// ExchangeMTU exchanges the active MTU as check_mtu does: sprintf("%d") of
// the ibv_mtu value, 2 bytes sent ("3\0" for 1024). The agreed MTU is the
// peer's if it is valid and smaller than ours, else ours; remote is the
// peer's value as parsed (strtol), possibly invalid.
func (c *Conn) ExchangeMTU(ctx context.Context, mine MTU) (agreed MTU, remote int, err error) {
	if !mine.Valid() {
		return 0, 0, fmt.Errorf("%w: %d", ErrMTU, mine)
	}
	m := [2]byte{'0' + byte(mine), 0}
	var t [2]byte
	if err = c.Exchange(ctx, "MTU", m[:], t[:]); err != nil {
		return 0, 0, err
	}
	remote = strtol10(t[:])
	agreed = mine
	if rm := MTU(remote); remote >= 1 && remote <= 5 && rm < mine {
		agreed = rm
	}
	return agreed, remote, nil
}

// strtol10 parses leading decimal digits (optional sign) up to a NUL.
func strtol10(b []byte) int {
	neg := false
	i := 0
	if i < len(b) && (b[i] == '-' || b[i] == '+') {
		neg = b[i] == '-'
		i++
	}
	v := 0
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		v = v*10 + int(b[i]-'0')
		if v > 1<<20 {
			break
		}
	}
	if neg {
		v = -v
	}
	return v
}

// HandShake is ctx_hand_shake: exchange one key record. The client writes
// first.
func (c *Conn) HandShake(ctx context.Context, mine *Dest) (Dest, error) {
	var m, t []byte
	if c.o.NoGID {
		m = mine.AppendEncodeNoGID(make([]byte, 0, RecordSizeNoGID))
		t = make([]byte, RecordSizeNoGID)
	} else {
		m = mine.AppendEncode(make([]byte, 0, RecordSize))
		t = make([]byte, RecordSize)
	}
	if err := c.Exchange(ctx, "key record", m, t); err != nil {
		return Dest{}, err
	}
	var d Dest
	var err error
	if c.o.NoGID {
		d, err = ParseRecordNoGID(t)
	} else {
		d, err = ParseRecord(t)
	}
	if err != nil {
		return Dest{}, &oob.StepError{Step: "parse key record", Err: err}
	}
	return d, nil
}

// BWReport is struct bw_report_data as xchg_bw_reports sends it.
type BWReport struct {
	Size    uint64  // message size, bytes
	Iters   uint64  // iterations (times QPs)
	BWPeak  float64 // MB/sec (or Gb/sec with --report_gbits)
	BWAvg   float64
	MsgRate float64 // Mpps
	// Per-port values, exchanged only with Options.PerPortReport.
	BWAvgP1, MsgRateP1, BWAvgP2, MsgRateP2 float64
}

// ExchangeBWReport is xchg_bw_reports: five (or nine, per port) separate
// 8-byte exchanges, each big-endian (hton_long / hton_double: the double's
// bits byte-swapped on little-endian hosts). In a one-way test the server
// never measures: what it sends is whatever its stack held (the captures show
// pointer-like garbage) and it prints the client's report.
func (c *Conn) ExchangeBWReport(ctx context.Context, mine BWReport) (BWReport, error) {
	var r BWReport
	var m, t [8]byte
	xu := func(step string, v uint64, out *uint64) error {
		binary.BigEndian.PutUint64(m[:], v)
		if err := c.Exchange(ctx, step, m[:], t[:]); err != nil {
			return err
		}
		*out = binary.BigEndian.Uint64(t[:])
		return nil
	}
	xf := func(step string, v float64, out *float64) error {
		var u uint64
		if err := xu(step, math.Float64bits(v), &u); err != nil {
			return err
		}
		*out = math.Float64frombits(u)
		return nil
	}
	if err := xu("report size", mine.Size, &r.Size); err != nil {
		return r, err
	}
	if err := xu("report iterations", mine.Iters, &r.Iters); err != nil {
		return r, err
	}
	if err := xf("report BW peak", mine.BWPeak, &r.BWPeak); err != nil {
		return r, err
	}
	if err := xf("report BW average", mine.BWAvg, &r.BWAvg); err != nil {
		return r, err
	}
	if err := xf("report message rate", mine.MsgRate, &r.MsgRate); err != nil {
		return r, err
	}
	if c.o.PerPortReport {
		for _, x := range []struct {
			step string
			v    float64
			out  *float64
		}{
			{"report port 1 BW", mine.BWAvgP1, &r.BWAvgP1},
			{"report port 1 message rate", mine.MsgRateP1, &r.MsgRateP1},
			{"report port 2 BW", mine.BWAvgP2, &r.BWAvgP2},
			{"report port 2 message rate", mine.MsgRateP2, &r.MsgRateP2},
		} {
			if err := xf(x.step, x.v, x.out); err != nil {
				return r, err
			}
		}
	}
	return r, nil
}

// CloseExchange is ctx_close_connection: one more key record round (the
// "client is finished" signal), then "done\0" written, then the connection
// closed. Like perftest it does not wait for the peer's "done".
func (c *Conn) CloseExchange(ctx context.Context, mine *Dest) (Dest, error) {
	rem, err := c.HandShake(ctx, mine)
	if err != nil {
		return Dest{}, err
	}
	if err := c.s.Write(ctx, "send done", Done[:]); err != nil {
		return rem, err
	}
	return rem, c.s.Close()
}
