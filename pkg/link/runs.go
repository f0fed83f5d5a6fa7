package link

import (
	"net/netip"

	"github.com/softroce/softroce/pkg/bth"
)

// RunSender is implemented by links that send engine-marked GSO runs: the agreement that lets
// the transport engine use UDP GSO over IPv4 although the ICRC (IBTA A17.3.3) covers the IPv4
// Identification field, which the kernel numbers 0, 1, 2, ... across the segments of one GSO
// send from an unconnected DF socket (docs/link.md).
//
// The engine groups its batch into runs itself (see RunRule) and computes the ICRC of the k-th
// datagram of a run with IPv4 ID k (bth.Endpoints.IPID = k). SendRuns sends every run of two or
// more datagrams as exactly one UDP_SEGMENT message, so segment k is datagram k. Whenever a
// datagram at index k > 0 of a run leaves in a plain message instead (GSO turned off after the
// kernel refused it, or a refused message resent one datagram at a time) the link first rewrites
// its ICRC for ID 0, the ID a plain send carries: the ICRC on the wire is always right.
type RunSender interface {
	// RunGSO reports whether SendRuns from local currently sends runs as GSO messages. When it
	// is false the engine should compute every ICRC with ID 0 (runs of one).
	RunGSO(local netip.Addr) bool
	// SendRuns transmits batch in order; runs[i] is the number of datagrams in run i, and the
	// runs cover batch exactly. Each run must satisfy RunRule (same Src and Dst, the same
	// length except a shorter last one, at most MaxRunSegments datagrams and MaxRunBytes bytes)
	// or the whole batch is refused with ErrInvalidRun before anything is sent. The link may
	// rewrite the ICRC in batch[i].Buf (fallback); it keeps no reference after returning.
	SendRuns(batch []Datagram, runs []uint8) error
}

// PairSender is implemented by links that may send a run of exactly two datagrams — a
// request and a response no longer than it, one flow, the response's ICRC computed for IPv4
// ID 1 — as one GSO message even where RunGSO is false: the AF_XDP path's GSO pairs
// (link/afxdp). The engine's pairing of a deferred ACK with the next request asks it.
type PairSender interface {
	// PairGSO reports whether SendRuns from local currently sends such a pair as one message.
	PairGSO(local netip.Addr) bool
}

// Limits of one GSO run: the datagrams of one UDP_SEGMENT message (the kernel's
// UDP_MAX_SEGMENTS is 64 on older kernels, 128 on newer ones) and its payload bytes (the
// largest IPv4 UDP payload, 65535 - 20 - 8).
const (
	MaxRunSegments = 64
	MaxRunBytes    = 65507
)

// RunRule is the grouping rule of SendRuns, kept incrementally: the engine asks Join for each
// datagram it builds, before computing its ICRC, and gets the datagram's index in its run.
// The zero value is an empty batch.
type RunRule struct {
	n     int // datagrams in the current run (0 = none open)
	size  int // the run's segment size (the first datagram's length)
	bytes int
	short bool // the last datagram was shorter than size: the run is closed
	src   netip.AddrPort
	dst   netip.AddrPort
}

// Join places a datagram of length n from src to dst after the ones already placed and returns
// its index in its run: 0 starts a new run.
func (r *RunRule) Join(n int, src, dst netip.AddrPort) int {
	if r.n > 0 && !r.short && n > 0 && n <= r.size && r.n < MaxRunSegments &&
		r.bytes+n <= MaxRunBytes && src == r.src && dst == r.dst {
		r.n++
		r.bytes += n
		r.short = n < r.size
		return r.n - 1
	}
	r.n, r.size, r.bytes, r.short, r.src, r.dst = 1, n, n, n == 0, src, dst
	return 0
}

// Reset empties the rule (after the batch was sent).
func (r *RunRule) Reset() { *r = RunRule{} }

// ValidRuns reports whether runs satisfy RunRule over batch and cover it exactly: the check
// a RunSender makes before it sends anything.
func ValidRuns(batch []Datagram, runs []uint8) bool {
	i := 0
	for _, c := range runs {
		if c == 0 || i+int(c) > len(batch) {
			return false
		}
		var r RunRule
		for k := 0; k < int(c); k++ {
			d := &batch[i+k]
			if r.Join(len(d.Buf), d.Src, d.Dst) != k {
				return false
			}
		}
		i += int(c)
	}
	return i == len(batch)
}

// RewriteICRC rewrites the ICRC of a RoCEv2 datagram for IPv4 ID 0 (IBTA A17.3.3), the ID a
// plain send from a DF socket carries: what a RunSender does to datagram k > 0 of a run that
// leaves as a plain message after all. sport is the source port the datagram leaves with.
func RewriteICRC(d *Datagram, sport uint16) {
	if len(d.Buf) < bth.BTHSize+bth.ICRCSize {
		return
	}
	ep := bth.Endpoints{Src: d.Src.Addr().Unmap(), Dst: d.Dst.Addr().Unmap(), SrcPort: sport, DstPort: d.Dst.Port()}
	bth.SetICRC(d.Buf, bth.ICRC(&ep, d.Buf))
}
