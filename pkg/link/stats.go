package link

// Stats are the counters every link keeps, cumulative since the link was created. A path's
// own counters (GSO and GRO, entropy sockets, the AF_XDP rings) are its package's, behind a
// capability of that package (udp.StatsLink, afxdp.StatsLink): each path counts its own, and
// a link that wraps another reports the wrapped one's as well.
type Stats struct {
	Sent        uint64 // datagrams handed to the network
	Received    uint64 // datagrams returned by Recv
	SendBatches uint64 // Send calls that sent at least one datagram (UDP: sendmmsg calls)
	RecvBatches uint64 // Recv calls that returned at least one datagram (UDP: recvmmsg calls)
	Drops       uint64 // datagrams dropped: receive queue full (mem), send errors (UDP)
	Truncated   uint64 // datagrams longer than the Recv buffer (cut to the buffer's capacity)
}

// Add adds o's counters to s (a device sums its links').
func (s *Stats) Add(o Stats) {
	s.Sent += o.Sent
	s.Received += o.Received
	s.SendBatches += o.SendBatches
	s.RecvBatches += o.RecvBatches
	s.Drops += o.Drops
	s.Truncated += o.Truncated
}

// StatsLink is implemented by links that count (every path here).
type StatsLink interface {
	Link
	Stats() Stats
}
