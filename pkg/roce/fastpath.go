package roce

import "github.com/softroce/softroce/pkg/roce/link"

// FastPathOptions select the data-path accelerations of a UDP device (docs/performance.md,
// "fast path"). The zero value enables them all.
//
//   - GSO: the engine groups each burst into link.RunRule runs and computes the ICRC of the k-th
//     packet of a run with IPv4 ID k (IBTA A17.3.3; the kernel numbers the segments of one GSO
//     send 0, 1, 2, ...); the link sends each run as one UDP_SEGMENT message and rewrites the
//     ICRC for ID 0 if it ever has to send a run plainly (link.RunSender).
//   - GRO: UDP_GRO on the sockets: a train of same-size datagrams is one read, split by the
//     segment size; the receive goroutine checks each packet's ICRC (solving the IPv4 ID) and
//     places its payload right after the read.
type FastPathOptions struct {
	// Disable turns every acceleration off: no GSO (not even for IPv6), no GRO.
	Disable bool
	// NoGSO keeps GSO off (link.GSOOff); NoGRO keeps GRO off.
	NoGSO, NoGRO bool
}

// apply sets the link options the fast path needs. An explicit Link.GSO other than GSOAuto is
// kept unless GSO is disabled.
func (f FastPathOptions) apply(o *link.UDPOptions) {
	if f.Disable || f.NoGSO {
		o.GSO = link.GSOOff
	}
	if !f.Disable && !f.NoGRO {
		o.GRO = true
	}
}
