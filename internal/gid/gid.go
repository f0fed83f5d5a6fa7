// Package gid builds a port's GID table and MTU the way Linux rxe/ib_core do for a RoCEv2 device
// (IBTA A17.2: a RoCEv2 GID is the IPv6 address, or the IPv4-mapped IPv6 address ::ffff:a.b.c.d,
// of the port's network interface; IBTA A17.8 / rxe: the active MTU derives from the netdev MTU).
//
// Table order (like rxe, with one entry per address since we only speak RoCEv2):
//
//	index 0:  fe80::/64 link-local GID from the interface MAC (modified EUI-64, RFC 4291 2.5.1,
//	          as addrconf/ib_core derive the default GID)
//	then:     ::ffff:a.b.c.d for each IPv4 address, in the interface's order
//	then:     each non-link-local IPv6 address (global, ULA, and ::1 on loopback)
//
// See docs/link.md.
package gid

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
)

// Type is the GID type (ibv_gid_type / ib_gid_type).
type Type uint8

const (
	// TypeRoCEv2 is a RoCE v2 GID (packets over UDP/IP). Every entry we build has this type.
	TypeRoCEv2 Type = iota + 1
)

// String names the type as rdma-core's show_gids does.
func (t Type) String() string {
	if t == TypeRoCEv2 {
		return "RoCE v2"
	}
	return fmt.Sprintf("Type(%d)", uint8(t))
}

// Entry is one GID table entry.
type Entry struct {
	// GID is the 16-byte GID (IPv4 addresses in IPv4-mapped form).
	GID [16]byte
	// Addr is the IP address the GID stands for (4-byte for IPv4), the address RoCEv2 packets
	// from this GID are sent from. A link-local IPv6 address the table knows the interface of
	// carries it as its zone (fe80::1%eth0): it can be bound.
	Addr netip.Addr
	// Type is the GID type.
	Type Type
}

// Table is an immutable GID table plus the port MTU. Safe for concurrent readers; a change of
// addresses produces a new Table (see Watch).
type Table struct {
	entries []Entry
	// NetdevMTU is the interface MTU the table was built from (0 if unknown).
	NetdevMTU int
	// Name and IfIndex identify the interface ("" and 0 for a table built from a plain list).
	Name    string
	IfIndex int
	// MAC is the interface hardware address (nil for interfaces without one).
	MAC net.HardwareAddr
}

// Options describe a table built from a plain list of addresses (in-memory devices, loopback).
type Options struct {
	// MAC derives the index-0 link-local GID; nil or empty means the all-zero MAC (see
	// LinkLocalFromMAC), so the table still has the fe80:: entry rxe always has at index 0.
	MAC net.HardwareAddr
	// Addrs are the interface addresses in order; IPv4 (or IPv4-mapped) and IPv6 may be mixed:
	// the table lists the IPv4 ones first, then the IPv6 ones, each in the given order, as
	// ib_core's roce_gid_mgmt adds a netdev's addresses. An IPv6 link-local address counts only
	// with its zone (the interface, which binding it needs): the one that is the index-0 GID
	// makes that entry bindable, another follows the other IPv6 entries. Link-local addresses
	// without a zone and duplicates are skipped.
	Addrs []netip.Addr
	// MTU is the netdev MTU (bytes); 0 means 1500.
	MTU int
}

// ErrNotFound is returned when no GID matches.
var ErrNotFound = errors.New("gid: not found")

// LinkLocalFromMAC returns fe80::/64 with the modified EUI-64 interface identifier of a 48-bit
// MAC (RFC 4291 appendix A: insert ff:fe in the middle, flip the universal/local bit), as Linux
// addrconf_ifid_eui48 and so the rxe default GID. A nil or non-48-bit MAC counts as all zeros,
// giving fe80::200:ff:fe00:0 (what the same formula yields for loopback's 00:00:00:00:00:00).
func LinkLocalFromMAC(mac net.HardwareAddr) netip.Addr {
	var m [6]byte
	if len(mac) == 6 {
		copy(m[:], mac)
	}
	var a [16]byte
	a[0], a[1] = 0xfe, 0x80
	a[8] = m[0] ^ 0x02
	a[9], a[10] = m[1], m[2]
	a[11], a[12] = 0xff, 0xfe
	a[13], a[14], a[15] = m[3], m[4], m[5]
	return netip.AddrFrom16(a)
}

// GUIDFromMAC returns the EUI-64 of a 48-bit MAC (RFC 4291 appendix A, Linux
// addrconf_addr_eui48: ff:fe inserted in the middle, the universal/local bit flipped) as the
// number whose big-endian bytes are that EUI-64. Kernel rxe takes its node GUID and
// sys_image_guid from it (rxe_register_device, rxe_init_device_param; IBTA 4.1.1: a GUID is an
// EUI-64), and it is the interface identifier of the index-0 GID (LinkLocalFromMAC). A nil or
// non-48-bit MAC counts as all zeros, loopback's, giving 0x020000fffe000000: never 0, the
// same on every start.
func GUIDFromMAC(mac net.HardwareAddr) uint64 {
	ll := LinkLocalFromMAC(mac).As16()
	return binary.BigEndian.Uint64(ll[8:])
}

// GUID is the node GUID of a device on the table's interface (GUIDFromMAC of its MAC).
func (t *Table) GUID() uint64 { return GUIDFromMAC(t.MAC) }

// InterfaceMAC returns the hardware address of the interface holding a (nil when no interface
// holds it or it has none; loopback's all-zero MAC reads as none, which GUIDFromMAC and
// LinkLocalFromMAC treat alike).
func InterfaceMAC(a netip.Addr) net.HardwareAddr {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil
	}
	a = a.Unmap().WithZone("")
	for _, ifi := range ifs {
		as, err := ifi.Addrs()
		if err != nil {
			continue
		}
		for _, ia := range as {
			if p, err := netip.ParsePrefix(ia.String()); err == nil && p.Addr().Unmap() == a {
				return ifi.HardwareAddr
			}
		}
	}
	return nil
}

// FromAddrs builds a table from a plain list of addresses.
func FromAddrs(o Options) *Table {
	if o.MTU == 0 {
		o.MTU = 1500
	}
	t := &Table{NetdevMTU: o.MTU, MAC: o.MAC}
	ll := LinkLocalFromMAC(o.MAC)
	t.add(ll)
	for _, a := range o.Addrs {
		if a = a.Unmap(); a.Is4() {
			t.add(a)
		}
	}
	for _, a := range o.Addrs {
		if a = a.Unmap(); a.Is6() && !a.IsLinkLocalUnicast() {
			t.add(a)
		}
	}
	for _, a := range o.Addrs {
		if a = a.Unmap(); !a.Is6() || !a.IsLinkLocalUnicast() || a.Zone() == "" {
			continue
		}
		if a.WithZone("") == ll {
			t.entries[0].Addr = a
		} else {
			t.addZoned(a)
		}
	}
	return t
}

// add appends a's GID unless it is already present or invalid.
func (t *Table) add(a netip.Addr) { t.addZoned(a.WithZone("")) }

// addZoned is add keeping a's zone in the entry's address.
func (t *Table) addZoned(a netip.Addr) {
	if !a.IsValid() {
		return
	}
	if _, err := t.Index(a); err == nil {
		return
	}
	t.entries = append(t.entries, Entry{GID: a.As16(), Addr: a, Type: TypeRoCEv2})
}

// Len is the number of entries.
func (t *Table) Len() int { return len(t.entries) }

// Entry returns entry i (ibv_query_gid); ErrNotFound if out of range.
func (t *Table) Entry(i int) (Entry, error) {
	if i < 0 || i >= len(t.entries) {
		return Entry{}, fmt.Errorf("gid index %d of %d: %w", i, len(t.entries), ErrNotFound)
	}
	return t.entries[i], nil
}

// Entries returns a copy of all entries.
func (t *Table) Entries() []Entry { return append([]Entry(nil), t.entries...) }

// Index returns the index of the GID for ip (IPv4, IPv4-mapped or IPv6; zones ignored).
// It does not allocate: receive paths call it per packet (rxe checks the destination IP is in
// the GID table, rxe_recv.c).
func (t *Table) Index(ip netip.Addr) (int, error) {
	g := ip.As16()
	for i := range t.entries {
		if t.entries[i].GID == g {
			return i, nil
		}
	}
	return -1, ErrNotFound
}

// IndexGID returns the index of a raw 16-byte GID.
func (t *Table) IndexGID(g [16]byte) (int, error) { return t.Index(netip.AddrFrom16(g)) }

// Addrs returns the IP addresses of the entries (for udp.Listen / mem.Network.Attach),
// skipping link-local ones without a zone (the index-0 GID of a table that does not know the
// interface has that address): they cannot be bound.
func (t *Table) Addrs() []netip.Addr {
	var out []netip.Addr
	for _, e := range t.entries {
		if e.Addr.IsLinkLocalUnicast() && e.Addr.Zone() == "" {
			continue
		}
		out = append(out, e.Addr)
	}
	return out
}

// ActiveMTU returns the port's active IB MTU in bytes for the table's netdev MTU.
func (t *Table) ActiveMTU() int { return ActiveMTU(t.NetdevMTU) }

// IB MTUs (IBTA 7.7.1 / ibv_mtu), in bytes.
const (
	MTU256  = 256
	MTU512  = 512
	MTU1024 = 1024
	MTU2048 = 2048
	MTU4096 = 4096
)

// HeaderAllowance is what rxe subtracts from the netdev MTU before choosing the IB MTU
// (RXE_MAX_HDR_LENGTH, rxe_param.h eth_mtu_int_to_enum): room for IP, UDP, BTH, extension
// headers and ICRC.
const HeaderAllowance = 80

// ActiveMTU is the largest IB MTU <= netdevMTU - 80, capped at 4096; like rxe_set_mtu, a netdev
// too small for 256 still reports 256. 1500 -> 1024, 9000 -> 4096, 65536 (lo) -> 4096.
func ActiveMTU(netdevMTU int) int {
	m := netdevMTU - HeaderAllowance
	switch {
	case m >= MTU4096:
		return MTU4096
	case m >= MTU2048:
		return MTU2048
	case m >= MTU1024:
		return MTU1024
	case m >= MTU512:
		return MTU512
	default:
		return MTU256
	}
}

// MTUEnum converts an IB MTU in bytes to the ibv_mtu enum (1 = 256 .. 5 = 4096); 0 if invalid.
func MTUEnum(bytes int) uint8 {
	switch bytes {
	case MTU256:
		return 1
	case MTU512:
		return 2
	case MTU1024:
		return 3
	case MTU2048:
		return 4
	case MTU4096:
		return 5
	}
	return 0
}

// MTUBytes converts an ibv_mtu enum (1..5) to bytes; 0 if invalid.
func MTUBytes(enum uint8) int {
	if enum < 1 || enum > 5 {
		return 0
	}
	return 128 << enum
}
