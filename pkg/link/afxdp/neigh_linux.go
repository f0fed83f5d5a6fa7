package afxdp

import (
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// xdpMaxPeers caps the learned table (a frame's source address is remote input).
const xdpMaxPeers = 4096

// learn records mac as ip's (the source of a frame from ip, or the neighbour table's answer),
// for an address the link sends to (one looked up before: remote frames cannot fill the table
// with addresses of their choosing), while the table has room. A peer's later frames update
// its MAC (a moved peer), as ARP would; like ARP, a spoofed frame can mislead it until the
// peer's next frame.
func (x *xdpSock) learn(ip [4]byte, mac []byte) {
	if p := x.last.Load(); p != nil && p.ip == ip && string(p.mac[:]) == string(mac) {
		return
	}
	x.nmu.Lock()
	p, known := x.peers[ip]
	_, asked := x.asked[ip]
	switch {
	case known && string(p.mac[:]) == string(mac):
	case known || asked && len(x.peers) < xdpMaxPeers:
		p = &xdpPeer{ip: ip}
		copy(p.mac[:], mac)
		x.peers[ip] = p
	default:
		p = nil
	}
	x.nmu.Unlock()
	if p != nil {
		x.last.Store(p) // the same entry for as long as the MAC holds: no allocation per packet
	}
}

// lookup returns the MAC address learned for ip; not learned yet, it asks the kernel's
// neighbour table (the UDP socket's sends, or any other traffic, may have resolved it).
func (x *xdpSock) lookup(ip [4]byte) ([6]byte, bool) {
	if p := x.last.Load(); p != nil && p.ip == ip {
		return p.mac, true
	}
	x.nmu.Lock()
	p, ok := x.peers[ip]
	x.nmu.Unlock()
	if !ok {
		return x.neighbour(ip)
	}
	x.last.Store(p)
	return p.mac, true
}

// xdpNeighEvery bounds how often one address is looked up in the kernel's neighbour table.
const xdpNeighEvery = 100 * time.Millisecond

// neighbour looks ip up in the kernel's neighbour table of the link's interface (a usable
// entry: reachable, stale, delayed, probing or permanent) and learns it.
func (x *xdpSock) neighbour(ip [4]byte) ([6]byte, bool) {
	now := time.Now()
	x.nmu.Lock()
	if t, ok := x.asked[ip]; ok && now.Sub(t) < xdpNeighEvery {
		x.nmu.Unlock()
		return [6]byte{}, false
	}
	if len(x.asked) < xdpMaxPeers {
		x.asked[ip] = now
	}
	x.nmu.Unlock()
	ns, err := x.nl.NeighList(x.lk.Attrs().Index, unix.AF_INET)
	if err != nil {
		return [6]byte{}, false
	}
	const usable = netlink.NUD_REACHABLE | netlink.NUD_STALE | netlink.NUD_DELAY | netlink.NUD_PROBE | netlink.NUD_PERMANENT
	for _, n := range ns {
		if a, ok := netip.AddrFromSlice(n.IP.To4()); ok && a.As4() == ip && len(n.HardwareAddr) == 6 && n.State&usable != 0 {
			x.learn(ip, n.HardwareAddr)
			if p := x.last.Load(); p != nil && p.ip == ip {
				return p.mac, true
			}
			return [6]byte{}, false // the table is full
		}
	}
	return [6]byte{}, false
}
