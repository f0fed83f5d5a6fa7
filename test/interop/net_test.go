//go:build interop

package interop

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/softroce/softroce/internal/cm"
	"github.com/softroce/softroce/test/rxelab"
)

// labNet is the network a pairing speaks RoCE over: the lab's IPv4 addresses (GIDs
// ::ffff:198.18.0.x; kernel rxe0's GID index 1) or its IPv6 ones (GIDs 2001:db8:198:18::x;
// index 2). The pass criteria are the same over both.
type labNet struct {
	// Prefix starts the names of the pairings over this network ("" or "ipv6-").
	Prefix string
	// Host is our address (the tap's), Guest kernel rxe's (eth0's).
	Host, Guest netip.Addr
	// GuestGID is the index of Guest's GID on rxe0: the guest tools' -g / -x.
	GuestGID int
	// OurDev is softroce's -d: the host address over IPv4; over IPv6 the tap, with the same
	// GID index as the guest's (-g / -x): softroce's table of the tap lists its GIDs as rxe's
	// of eth0 does (0 link-local, 1 IPv4, 2 IPv6), so the index picks 2001:db8:198:18::1.
	OurDev string
}

var (
	netV4 = labNet{Prefix: "", Host: hostIP, Guest: guestIP, GuestGID: rxelab.GuestGIDIndex, OurDev: rxelab.HostIP}
	netV6 = labNet{Prefix: "ipv6-", Host: netip.MustParseAddr(rxelab.HostIP6), Guest: netip.MustParseAddr(rxelab.GuestIP6),
		GuestGID: rxelab.GuestGIDIndex6, OurDev: rxelab.Tap}
)

// V6 reports whether this is the IPv6 network.
func (n labNet) V6() bool { return n.Host.Is6() }

// pingpongGID is a's GID as the ibv_*_pingpong tools print it (inet_ntop of the raw GID:
// ::ffff:198.18.0.1, 2001:db8:198:18::1).
func pingpongGID(a netip.Addr) string { return netip.AddrFrom16(a.As16()).String() }

// perftestGID is a's GID as perftest prints it: the 16 bytes in decimal, "%02d" each, colon
// separated (00:...:255:255:198:18:00:01).
func perftestGID(a netip.Addr) string {
	g := a.As16()
	s := make([]string, len(g))
	for i, b := range g {
		s[i] = fmt.Sprintf("%02d", b)
	}
	return strings.Join(s, ":")
}

// oobGuest is the guest's address our client gives a guest server's TCP exchange. rdma-core's
// ibv_*_pingpong servers listen on the first address getaddrinfo(AI_PASSIVE, AF_UNSPEC) returns,
// which in the guest is IPv4's wildcard, and perftest's use IPv4 unless told --ipv6: the
// exchange only carries the GIDs, so it goes over IPv4 while the RoCE traffic is IPv6.
func (n labNet) oobGuest() netip.Addr { return guestIP }

// checkCMAHeader: a REQ's or SIDR_REQ's CMA header (rdma_cm's private data head) carries the
// network's IP version and two of its addresses, and a REQ's primary path the two GIDs.
func checkCMAHeader(t *testing.T, m cm.Message, n labNet) {
	t.Helper()
	var pd []byte
	switch m.Attr {
	case cm.AttrREQ:
		pd = m.REQ.PrivateData()
		p := m.REQ.Primary()
		if g := [2]netip.Addr{p.LocalGID().Unmap(), p.RemoteGID().Unmap()}; g != [2]netip.Addr{n.Host, n.Guest} && g != [2]netip.Addr{n.Guest, n.Host} {
			t.Errorf("REQ primary path GIDs %v, want the network's %v and %v", g, n.Host, n.Guest)
		}
	case cm.AttrSIDRReq:
		pd = m.SIDRReq.PrivateData()
	default:
		return
	}
	h, _, err := cm.ParsePrivateData(pd)
	if err != nil {
		t.Errorf("%v: CMA header: %v", m.Attr, err)
		return
	}
	want := uint8(4)
	if n.V6() {
		want = 6
	}
	if h.IPVersion() != want {
		t.Errorf("%v: CMA header IP version %d, want %d", m.Attr, h.IPVersion(), want)
	}
	for _, a := range []netip.Addr{h.Src().Unmap(), h.Dst().Unmap()} {
		if a != n.Host && a != n.Guest {
			t.Errorf("%v: CMA header address %v is neither %v nor %v", m.Attr, a, n.Host, n.Guest)
		}
	}
}
