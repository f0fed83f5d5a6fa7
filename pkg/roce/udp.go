package roce

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/softroce/softroce/internal/event"
	"github.com/softroce/softroce/internal/gid"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/afxdp"
	"github.com/softroce/softroce/pkg/link/udp"
)

// UDPOptions configure OpenUDP.
type UDPOptions struct {
	// Addrs are the local addresses to listen on (the GID table, in
	// order). If empty, Interface's addresses are used.
	Addrs []netip.Addr
	// Interface names a network interface whose GID table (gid.FromInterface:
	// its addresses and MTU) the device uses (when Addrs is empty).
	Interface string
	// Port is the UDP port for listening and for every destination
	// (0 = 4791).
	Port uint16
	// Link carries extra link options (GSO/GRO, buffers); its Addrs and
	// Port are overwritten.
	Link udp.Options
	// XDP, when set, opens the AF_XDP path (afxdp.Open) instead of plain
	// UDP sockets: one IPv4 address; its UDP field is overwritten with Link.
	XDP *afxdp.Options
	// Portable uses plain net.UDPConn sockets (one datagram per system
	// call) instead of udp.Listen's batched sockets.
	Portable bool
	// FastPath selects GSO runs and GRO (fastpath.go); the zero value
	// enables both.
	FastPath FastPathOptions
	// Polled opens the device in polled mode (Options.Polled, poll.go):
	// no receive goroutine; the application calls Device.Poll.
	Polled bool
	// Clock, MTU, Attr, Events, Name, CC, LineRate and RxeFlushICRC as in Options; a
	// LineRate of 0 with an Interface is the interface's speed
	// (/sys/class/net/NAME/speed) when it reports one.
	Clock        qp.Clock
	MTU          qp.MTU
	Attr         *qp.DeviceAttr
	Events       event.Sink
	Name         string
	CC           *CCParams
	LineRate     float64
	RxeFlushICRC bool
}

// OpenUDP opens UDP sockets (udp.Listen, or afxdp.Open) for the given addresses or
// interface and a Device on them. Close closes the sockets.
func OpenUDP(o UDPOptions) (*Device, error) {
	addrs := o.Addrs
	var table *gid.Table
	if len(addrs) == 0 {
		if o.Interface == "" {
			return nil, fmt.Errorf("%w: no addresses and no interface", ErrInvalidArg)
		}
		var err error
		if table, err = gid.FromInterface(o.Interface); err != nil {
			return nil, err
		}
		if addrs = table.Addrs(); len(addrs) == 0 {
			return nil, fmt.Errorf("%w: interface %s has no usable address", ErrInvalidArg, o.Interface)
		}
	}
	var l link.Link
	var shards []link.Link
	var err error
	if o.Portable {
		port := o.Port
		if port == 0 {
			port = link.UDPPort
		}
		l, err = listenStdUDP(addrs, port)
	} else {
		lo := o.Link
		o.FastPath.apply(&lo)
		lo.Addrs = addrs
		lo.Port = o.Port
		if o.XDP != nil {
			if o.FastPath.Workers > 1 {
				return nil, fmt.Errorf("%w: the AF_XDP path has one receive queue, not %d workers", ErrInvalidArg, o.FastPath.Workers)
			}
			xo := *o.XDP
			xo.UDP = lo
			l, err = afxdp.Open(xo)
		} else if o.FastPath.Workers > 1 {
			var ls []*udp.Link
			if ls, err = udp.ListenShards(lo, o.FastPath.Workers); err == nil {
				l = ls[0]
				for _, s := range ls[1:] {
					shards = append(shards, s)
				}
			}
		} else {
			l, err = udp.Listen(lo)
		}
	}
	if err != nil {
		return nil, err
	}
	line := o.LineRate
	if line == 0 && o.Interface != "" {
		line = InterfaceSpeed(o.Interface)
	}
	var mac net.HardwareAddr
	if table == nil {
		mac = gid.InterfaceMAC(addrs[0])
	}
	d, err := Open(Options{Link: l, Shards: shards, Pin: o.FastPath.Pin, Clock: o.Clock, Port: o.Port, MTU: o.MTU,
		Attr: o.Attr, Events: o.Events, Name: o.Name, GIDs: table, Polled: o.Polled, CC: o.CC, LineRate: line, RxeFlushICRC: o.RxeFlushICRC,
		mac: mac})
	if err != nil {
		l.Close()
		for _, s := range shards {
			s.Close()
		}
		return nil, err
	}
	return d, nil
}

// InterfaceSpeed returns an interface's speed in bit/s as the kernel reports it
// (/sys/class/net/NAME/speed, Mbit/s), 0 when unknown (loopback, a link that is down).
func InterfaceSpeed(name string) float64 {
	if name == "" || strings.ContainsAny(name, "/.") {
		return 0
	}
	b, err := os.ReadFile("/sys/class/net/" + name + "/speed")
	if err != nil {
		return 0
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || v <= 0 {
		return 0
	}
	return float64(v) * 1e6
}

// InterfaceAddrs lists an interface's IPv4 and non-link-local IPv6
// addresses (link-local IPv6 needs a zone, which RoCEv2 GIDs cannot carry).
func InterfaceAddrs(name string) ([]netip.Addr, error) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return nil, err
	}
	as, err := ifi.Addrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range as {
		pfx, err := netip.ParsePrefix(a.String())
		if err != nil {
			continue
		}
		ip := pfx.Addr().Unmap()
		if ip.Is6() && ip.IsLinkLocalUnicast() {
			continue
		}
		out = append(out, ip)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: interface %s has no usable address", ErrInvalidArg, name)
	}
	return out, nil
}

// LinkStats are the counters of a device's links, each path's in its own
// struct: every link's (link.Stats), the UDP sockets' (zero without) and
// the AF_XDP path's (zero without).
type LinkStats struct {
	link.Stats
	UDP udp.Stats
	XDP afxdp.Stats
}

// LinkStats returns the counters of the device's link (and of its receive
// shards, summed), and false if the link does not count (link.StatsLink).
func (d *Device) LinkStats() (LinkStats, bool) {
	var s LinkStats
	ok := false
	for _, l := range d.links {
		if sl, is := l.(link.StatsLink); is {
			ok = true
			s.Stats.Add(sl.Stats())
		}
		if ul, is := l.(udp.StatsLink); is {
			s.UDP.Add(ul.UDPStats()) // shards share one entropy pool, reported by shard 0
		}
		if xl, is := l.(afxdp.StatsLink); is {
			s.XDP.Add(xl.XDPStats())
		}
	}
	return s, ok
}
