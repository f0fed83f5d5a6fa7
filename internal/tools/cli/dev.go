package cli

// The -d ADDR|IFNAME device flag shared by the tool-compatible subcommands (pingpong, perf),
// and --daemon SOCKET (OpenVerbs): run through the softroce daemon instead of an embedded
// device.
//
// The rdma-core and perftest tools name an RDMA device with -d (ibv_get_device_name). A
// softroce device is a set of UDP sockets on local IP addresses, so our -d names the local
// address instead: an IP address, or a network interface whose first address (of the peer's
// family, IPv4 first) is used. The chosen address is the device's only GID (index 0), the
// RoCEv2 GID ::ffff:a.b.c.d (IBTA A17.8) the tools print and exchange.

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/client"
	"github.com/softroce/softroce/pkg/link/afxdp"
	"github.com/softroce/softroce/pkg/link/udp"
	"github.com/softroce/softroce/pkg/roce"
)

// ErrDev is wrapped by every error about the -d flag and the local address it names.
var ErrDev = errors.New("device")

// DevFlag is the value of a -d ADDR|IFNAME flag (a pflag.Value). The zero value means "not
// given": OpenLocal then picks the address the kernel would route to the peer from.
type DevFlag struct {
	// Addr is the local address, when -d named one.
	Addr netip.Addr
	// Interface is the interface name, when -d named one.
	Interface string
}

// String implements pflag.Value.
func (f *DevFlag) String() string {
	switch {
	case f == nil:
		return ""
	case f.Addr.IsValid():
		return f.Addr.String()
	}
	return f.Interface
}

// Type implements pflag.Value.
func (f *DevFlag) Type() string { return "ADDR|IFNAME" }

// Set implements pflag.Value: an IP address (ParseAddr: IPv4, IPv6, IPv4-mapped IPv6 as a GID
// is written) or an interface name.
func (f *DevFlag) Set(s string) error {
	*f = DevFlag{}
	if _, err := netip.ParseAddr(s); err == nil {
		a, err := ParseAddr(s)
		if err != nil {
			return fmt.Errorf("%w %q: %w", ErrDev, s, err)
		}
		f.Addr = a
		return nil
	}
	if s == "" || strings.ContainsAny(s, " /:") || len(s) > 15 { // IFNAMSIZ-1
		return fmt.Errorf("%w %q: neither an IP address nor an interface name", ErrDev, s)
	}
	f.Interface = s
	return nil
}

// IsSet reports whether -d was given.
func (f *DevFlag) IsSet() bool { return f.Addr.IsValid() || f.Interface != "" }

// DevOptions configure OpenLocal.
type DevOptions struct {
	// Port is the RoCE UDP port to listen on and send to (0 = 4791).
	Port uint16
	// Portable uses plain sockets instead of the batched link (roce.UDPOptions.Portable).
	Portable bool
	// MTU is the port's active MTU; 0 derives it from the interface MTU as rxe does.
	MTU qp.MTU
	// Name is the device name (default "softroce0").
	Name string
	// Peer, if valid, is the remote address: without -d the local address is the one the
	// kernel routes to Peer from; with an interface, an address of Peer's family is preferred.
	Peer netip.Addr
	// BusyPoll is udp.Options.BusyPoll (perf --busy-poll): how long the receive loop polls
	// an empty socket before it sleeps.
	BusyPoll time.Duration
	// Polled opens the device in polled mode (roce.UDPOptions.Polled: no receive goroutine;
	// the tool calls Device.Poll; perf --lat --busy-poll, internal/tools/perf/poll.go).
	Polled bool
	// XDP adds the link's AF_XDP path (afxdp.Options); the active MTU is then at most 2048,
	// so that every packet fits the path (afxdp.MaxFrame).
	XDP bool
	// XDPNoPairs keeps that path's [request, response] pairs as two frames (afxdp.Options.NoPairs).
	XDPNoPairs bool
	// DM, when > 0, gives that path a write responder with DM bytes of device memory
	// (afxdp.Options.WriteMemory; roce.Device.AllocDM).
	DM int
	// GIDIndex is the tool's GID index (perftest's -x, ibv_*_pingpong's -g), used when
	// ByGIDIndex is set (the option was given). With -d IFNAME it picks the GID as kernel rxe's table of that interface lists it (index
	// 0 the link-local GID, then the IPv4 addresses, then the IPv6 ones; gid.FromInterface),
	// and the device opens on the whole interface so that the index is the same; through the
	// daemon, without -d ADDR, it picks the daemon device's GID of that index. With -d ADDR it
	// is accepted and the address's own index is used.
	GIDIndex   int
	ByGIDIndex bool
	// CC is the device's congestion control (--cc; nil: roce.DefaultCC()). Its line rate is
	// the speed of the address's interface when the kernel reports one.
	CC *roce.CCParams
}

// LocalDev is an opened device and the local address it speaks from.
type LocalDev struct {
	Dev *roce.Device
	// Addr is the local address (GID index GIDIndex).
	Addr     netip.Addr
	GIDIndex int
	// MTU is the port's active MTU.
	MTU qp.MTU
}

// GID returns the local address as a RoCEv2 GID (IPv4-mapped for IPv4, IBTA A17.8).
func (l *LocalDev) GID() [16]byte { return l.Addr.As16() }

// OpenLocal resolves f (or, unset, the route to o.Peer) to one local address and opens a
// softroce device on it.
func OpenLocal(f *DevFlag, o DevOptions) (*LocalDev, error) {
	if f != nil && f.Interface != "" && o.ByGIDIndex && !o.XDP {
		return openInterfaceGID(f.Interface, o)
	}
	addr, err := ResolveLocalAddr(f, o.Peer)
	if err != nil {
		return nil, err
	}
	mtu := o.MTU
	if mtu == 0 {
		mtu = ActiveMTU(InterfaceMTU(addr))
	}
	if o.XDP && mtu > qp.MTU2048 {
		mtu = qp.MTU2048
	}
	name := o.Name
	if name == "" {
		name = "softroce0"
	}
	var xo *afxdp.Options
	if o.XDP {
		xo = &afxdp.Options{NoPairs: o.XDPNoPairs, WriteMemory: o.DM}
	}
	d, err := roce.OpenUDP(roce.UDPOptions{Addrs: []netip.Addr{addr}, Port: o.Port, Portable: o.Portable, MTU: mtu, Name: name,
		Link: udp.Options{BusyPoll: o.BusyPoll}, XDP: xo, Polled: o.Polled, CC: o.CC, LineRate: InterfaceSpeed(addr)})
	if err != nil {
		return nil, fmt.Errorf("%w on %v: %w", ErrDev, addr, err)
	}
	idx := d.GIDIndex(addr)
	if idx < 0 {
		d.Close()
		return nil, fmt.Errorf("%w on %v: the address is not in the device's GID table", ErrDev, addr)
	}
	return &LocalDev{Dev: d, Addr: addr, GIDIndex: idx, MTU: mtu}, nil
}

// openInterfaceGID opens a device on interface name (its GID table and MTU, as rxe's) and
// speaks from GID o.GIDIndex.
func openInterfaceGID(name string, o DevOptions) (*LocalDev, error) {
	dn := o.Name
	if dn == "" {
		dn = "softroce0"
	}
	d, err := roce.OpenUDP(roce.UDPOptions{Interface: name, Port: o.Port, Portable: o.Portable, MTU: o.MTU, Name: dn,
		Link: udp.Options{BusyPoll: o.BusyPoll}, Polled: o.Polled})
	if err != nil {
		return nil, fmt.Errorf("%w %q: %w", ErrDev, name, err)
	}
	e, err := d.GIDTable().Entry(o.GIDIndex)
	if err == nil && e.Addr.IsLinkLocalUnicast() && e.Addr.Zone() == "" {
		err = errors.New("the interface does not have this link-local address")
	}
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("%w %q: GID index %d: %w", ErrDev, name, o.GIDIndex, err)
	}
	return &LocalDev{Dev: d, Addr: e.Addr, GIDIndex: o.GIDIndex, MTU: qp.MTUFromBytes(d.PortAttr().ActiveMTU.Bytes())}, nil
}

// ResolveLocalAddr picks the local address for f (see DevFlag).
func ResolveLocalAddr(f *DevFlag, peer netip.Addr) (netip.Addr, error) {
	peer = peer.Unmap()
	switch {
	case f != nil && f.Addr.IsValid():
		return f.Addr, nil
	case f != nil && f.Interface != "":
		addrs, err := roce.InterfaceAddrs(f.Interface)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("%w %q: %w", ErrDev, f.Interface, err)
		}
		var first netip.Addr
		for _, a := range addrs {
			a = a.Unmap()
			if peer.IsValid() && a.Is4() == peer.Is4() {
				return a, nil
			}
			if !first.IsValid() || (a.Is4() && !first.Is4()) {
				first = a
			}
		}
		if !first.IsValid() || (peer.IsValid() && first.Is4() != peer.Is4()) {
			return netip.Addr{}, fmt.Errorf("%w %q: no usable address", ErrDev, f.Interface)
		}
		return first, nil
	case peer.IsValid():
		// connect(2) on a UDP socket only looks up the route: no packet is sent.
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(peer, 4791)))
		if err != nil {
			return netip.Addr{}, fmt.Errorf("%w: no route to %v: %w", ErrDev, peer, err)
		}
		defer c.Close()
		return c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap(), nil
	}
	return netip.Addr{}, fmt.Errorf("%w: no -d ADDR|IFNAME and no peer to route to", ErrDev)
}

// InterfaceMTU returns the MTU of the interface holding addr, or 0 if none is found.
func InterfaceMTU(addr netip.Addr) int {
	ifs, err := net.Interfaces()
	if err != nil {
		return 0
	}
	for _, ifc := range ifs {
		as, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range as {
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap() == addr.WithZone("") &&
					(addr.Zone() == "" || !ip.IsLinkLocalUnicast() || addr.Zone() == ifc.Name) {
					return ifc.MTU
				}
			}
		}
	}
	return 0
}

// ActiveMTU is rxe's port MTU for a netdev MTU (rxe_net.c rxe_set_mtu / eth_mtu_int_to_enum:
// the MTU less RXE_MAX_HDR_LENGTH 80 bytes of headers, rounded down to an IB MTU, IBTA 9.4;
// 1500 -> 1024, loopback's 65536 -> 4096). An unknown MTU (0) gives 4096.
func ActiveMTU(netdevMTU int) qp.MTU {
	if netdevMTU <= 0 {
		return qp.MTU4096
	}
	m := netdevMTU - 80
	for _, c := range []qp.MTU{qp.MTU4096, qp.MTU2048, qp.MTU1024, qp.MTU512} {
		if m >= c.Bytes() {
			return c
		}
	}
	return qp.MTU256
}

// VerbsDev is the device a tool runs on: an embedded device (Dev set) or the softroce daemon
// (--daemon SOCKET: Dev nil, V a client connection), both as roce.Verbs.
type VerbsDev struct {
	V roce.Verbs
	// Dev is the embedded device (nil through the daemon).
	Dev *roce.Device
	// Addr is the local address (GID index GIDIndex).
	Addr     netip.Addr
	GIDIndex int
	// MTU is the port's active MTU.
	MTU qp.MTU
}

// Close releases the device (the daemon connection: the daemon destroys this client's objects).
func (v *VerbsDev) Close() error { return v.V.Close() }

// GID returns the local address as a RoCEv2 GID (IPv4-mapped for IPv4, IBTA A17.8).
func (v *VerbsDev) GID() [16]byte { return v.Addr.As16() }

// Verbs returns the embedded device l as a VerbsDev.
func (l *LocalDev) Verbs() *VerbsDev {
	return &VerbsDev{V: l.Dev.Verbs(), Dev: l.Dev, Addr: l.Addr, GIDIndex: l.GIDIndex, MTU: l.MTU}
}

// OpenVerbs opens the tool's device: through the daemon listening on sock when sock is
// not empty (the local address is then one of the daemon device's: -d's if it names one of
// them, else the one of Peer's family, IPv4 first), else an embedded device as
// OpenLocal does.
func OpenVerbs(sock string, f *DevFlag, o DevOptions) (*VerbsDev, error) {
	if sock == "" {
		l, err := OpenLocal(f, o)
		if err != nil {
			return nil, err
		}
		return l.Verbs(), nil
	}
	c, err := client.Dial(sock)
	if err != nil {
		return nil, fmt.Errorf("%w: daemon %s: %w", ErrDev, sock, err)
	}
	addr, err := DaemonLocalAddr(c, f, o.Peer)
	if o.ByGIDIndex && (f == nil || !f.Addr.IsValid()) {
		// the daemon device's GID of that index (its table is rxe's when it listens on one
		// interface)
		err = nil
		if gs := c.GIDs(); o.GIDIndex < len(gs) && gs[o.GIDIndex].IsValid() && !gs[o.GIDIndex].IsUnspecified() {
			addr = gs[o.GIDIndex].Unmap()
		} else {
			err = fmt.Errorf("%w: the daemon's device %s has no GID index %d", ErrDev, c.Name(), o.GIDIndex)
		}
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	mtu := qp.MTUFromBytes(c.PortAttr().ActiveMTU.Bytes())
	if !mtu.Valid() {
		mtu = qp.MTU1024
	}
	return &VerbsDev{V: c, Addr: addr, GIDIndex: c.GIDIndex(addr), MTU: mtu}, nil
}

// DaemonLocalAddr picks the daemon device's address for f and peer.
func DaemonLocalAddr(v roce.Verbs, f *DevFlag, peer netip.Addr) (netip.Addr, error) {
	peer = peer.Unmap()
	if f != nil && f.Addr.IsValid() {
		// index 0 is the link-local GID: only when -d names it (the daemon binds it when it
		// listens on the interface, gid.FromInterface)
		if i := v.GIDIndex(f.Addr); i < 0 || i == 0 && !f.Addr.IsLinkLocalUnicast() {
			return netip.Addr{}, fmt.Errorf("%w %v: not an address of the daemon's device %s", ErrDev, f.Addr, v.Name())
		}
		return f.Addr, nil
	}
	var best netip.Addr
	for i, g := range v.GIDs() {
		g = g.Unmap()
		if i == 0 || !g.IsValid() || g.IsUnspecified() || g.IsLinkLocalUnicast() {
			continue
		}
		if peer.IsValid() && g == peer {
			return g, nil // a local peer: loopback through the device
		}
		if peer.IsValid() && g.Is4() != peer.Is4() {
			continue
		}
		if !best.IsValid() || (g.Is4() && !best.Is4()) {
			best = g
		}
	}
	if !best.IsValid() {
		return netip.Addr{}, fmt.Errorf("%w: the daemon's device %s has no address for %v", ErrDev, v.Name(), peer)
	}
	return best, nil
}
