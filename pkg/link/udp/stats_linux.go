package udp

import (
	"net/netip"
	"syscall"

	"github.com/softroce/softroce/pkg/link"
)

// Stats implements link.StatsLink: the counters every link keeps.
func (l *Link) Stats() link.Stats {
	return link.Stats{Sent: l.sent.Load(), Received: l.received.Load(), SendBatches: l.sendBatches.Load(),
		RecvBatches: l.recvBatches.Load(), Drops: l.drops.Load(), Truncated: l.truncated.Load()}
}

// Stats are the UDP sockets' own counters, beyond link.Stats (StatsLink).
type Stats struct {
	GSOSends    uint64 // messages sent with UDP_SEGMENT (each carries >= 2 datagrams)
	GROReceives uint64 // received messages coalesced by GRO (split into >= 2 datagrams)
	Fallbacks   uint64 // GSO or GRO turned off after the kernel refused it
	// EntropySockets is the number of send-only entropy-port sockets open now (a gauge).
	EntropySockets uint64
	// EntropyFallbacks counts entropy ports that send from the main socket instead, for good:
	// their bind was refused (another program holds the port) or the pool was full.
	EntropyFallbacks uint64
}

// Add adds o's counters to s (a device sums its links').
func (s *Stats) Add(o Stats) {
	s.GSOSends += o.GSOSends
	s.GROReceives += o.GROReceives
	s.Fallbacks += o.Fallbacks
	s.EntropySockets += o.EntropySockets
	s.EntropyFallbacks += o.EntropyFallbacks
}

// StatsLink is implemented by links with UDP sockets: Link, and links over one (link/afxdp).
type StatsLink interface {
	UDPStats() Stats
}

var _ StatsLink = (*Link)(nil)

// UDPStats implements StatsLink.
func (l *Link) UDPStats() Stats {
	st := Stats{GSOSends: l.gsoSends.Load(), GROReceives: l.groReceives.Load(), Fallbacks: l.fallbacks.Load()}
	l.entropyStats(&st)
	return st
}

// RawConn returns the main socket bound to local (nil if none), for a caller that waits on
// it together with descriptors of its own (link/afxdp polls it with its ring). Reading from it
// bypasses the link's counters.
func (l *Link) RawConn(local netip.Addr) syscall.RawConn {
	if s := l.sock(local); s != nil {
		return s.rc
	}
	return nil
}
