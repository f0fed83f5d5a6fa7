package pingpong

import (
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// Tool names one of the pingpong examples (their output differs in one place).
type Tool uint8

// The examples.
const (
	ToolRC  Tool = iota // ibv_rc_pingpong
	ToolUC              // ibv_uc_pingpong
	ToolUD              // ibv_ud_pingpong
	ToolSRQ             // ibv_srq_pingpong
)

// String returns the binary's name.
func (t Tool) String() string {
	switch t {
	case ToolRC:
		return "ibv_rc_pingpong"
	case ToolUC:
		return "ibv_uc_pingpong"
	case ToolUD:
		return "ibv_ud_pingpong"
	case ToolSRQ:
		return "ibv_srq_pingpong"
	}
	return "Tool(" + strconv.Itoa(int(t)) + ")"
}

// Records returns how many records the tool sends each way.
func (t Tool) Records() int {
	if t == ToolSRQ {
		return SRQRecords
	}
	return 1
}

// LocalLine is the tool's line for its own address, newline included:
//
//	"  local address:  LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s\n"
//
// (ud_pingpong.c prints "PSN 0x%06x: GID" with a colon; srq prints one line
// per used QP). The GID is printed as inet_ntop(AF_INET6) does.
func LocalLine(t Tool, d Dest) string {
	sep := ","
	if t == ToolUD {
		sep = ":"
	}
	return fmt.Sprintf("  local address:  LID 0x%04x, QPN 0x%06x, PSN 0x%06x%s GID %s\n",
		d.LID, d.QPN, d.PSN, sep, NtopGID(d.GID))
}

// RemoteLine is the line for the peer's address, the same for every tool:
//
//	"  remote address: LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s\n"
func RemoteLine(d Dest) string {
	return fmt.Sprintf("  remote address: LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s\n",
		d.LID, d.QPN, d.PSN, NtopGID(d.GID))
}

// ResultLines are the two lines every example prints at the end:
//
//	"%lld bytes in %.2f seconds = %.2f Mbit/sec\n"
//	"%d iters in %.2f seconds = %.2f usec/iter\n"
//
// computed as the C code does: usec is a float (single precision) holding
// the gettimeofday difference in whole microseconds, bytes = size*iters*2,
// and usec/iters is a single-precision division.
func ResultLines(size, iters int, elapsed time.Duration) string {
	usec := float32(elapsed.Microseconds())
	bytes := int64(size) * int64(iters) * 2
	sec := float64(usec) / 1000000.
	var perIter float32
	if iters != 0 {
		perIter = usec / float32(iters)
	} else {
		perIter = float32(math.Inf(int(sign(usec))))
	}
	return fmt.Sprintf("%d bytes in %s seconds = %s Mbit/sec\n%d iters in %s seconds = %s usec/iter\n",
		bytes, CFloat(sec, 2), CFloat(float64(bytes)*8./float64(usec), 2),
		iters, CFloat(sec, 2), CFloat(float64(perIter), 2))
}

func sign(f float32) float32 {
	if f < 0 {
		return -1
	}
	return 1
}

// CFloat formats v like C's printf("%.*f"): as Go's %f, but infinities and
// NaN spelled "inf", "-inf", "nan", "-nan" as glibc prints them.
func CFloat(v float64, prec int) string {
	switch {
	case math.IsInf(v, 1):
		return "inf"
	case math.IsInf(v, -1):
		return "-inf"
	case math.IsNaN(v):
		if math.Signbit(v) {
			return "-nan"
		}
		return "nan"
	}
	return strconv.FormatFloat(v, 'f', prec, 64)
}

// NtopGID formats a GID as glibc's inet_ntop(AF_INET6) does. It differs from
// netip.Addr.String only for the deprecated IPv4-compatible forms, which glibc
// prints with a dotted quad ("::1.2.3.4").
func NtopGID(g [16]byte) string {
	var w [8]uint16
	for i := range w {
		w[i] = uint16(g[2*i])<<8 | uint16(g[2*i+1])
	}
	allZero := func(n int) bool {
		for i := range n {
			if w[i] != 0 {
				return false
			}
		}
		return true
	}
	// glibc inet_ntop6: the longest zero run starts at word 0 and is 6 words
	// long, or 7 words long with a last word other than 1.
	if (allZero(6) && w[6] != 0) || (allZero(7) && w[7] > 1) {
		return "::" + netip.AddrFrom4([4]byte(g[12:16])).String()
	}
	s := netip.AddrFrom16(g).String()
	return strings.ToLower(s)
}
