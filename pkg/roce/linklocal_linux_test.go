package roce

import (
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/softroce/softroce/internal/gid"
	"github.com/softroce/softroce/internal/netnstest"
	"github.com/softroce/softroce/internal/qp"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// TestLinkLocalGID: a device opened on an interface (gid.FromInterface) binds the interface's
// link-local address, its GID index 0 as rxe's (the modified EUI-64 of the MAC), with the
// interface as the zone, and RC traffic runs between two such devices over their index-0 GIDs:
// the destination GID carries no zone, the socket bound to the link-local address sends on its
// interface. Two namespaces on a veth pair, the link-local addresses added without duplicate
// address detection (usable at once); the fast path and the portable sockets.
func TestLinkLocalGID(t *testing.T) {
	x, y := netnstest.Veth(t, "ll0", "198.18.7.1/24", "ll1", "198.18.7.2/24", 1500)
	// the link-local address from the MAC, as addrconf makes it, but added here without
	// duplicate address detection (usable at once) instead of asynchronously when the carrier
	// comes up: address generation off, the link down and up (no address left), then the add
	linkLocal := func(ifname string) func() error {
		return func() error {
			l, err := netlink.LinkByName(ifname)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetIP6AddrGenMode(l, nl.IN6_ADDR_GEN_MODE_NONE); err != nil {
				return err
			}
			if err := netlink.LinkSetDown(l); err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
			ll := gid.LinkLocalFromMAC(l.Attrs().HardwareAddr)
			return netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: ll.AsSlice(), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD})
		}
	}
	if err := x.Do(linkLocal("ll0")); err != nil {
		t.Fatal(err)
	}
	if err := y.Do(linkLocal("ll1")); err != nil {
		t.Fatal(err)
	}
	for _, v := range []struct {
		name     string
		portable bool
	}{{"fast-path", false}, {"portable", true}} {
		t.Run(v.name, func(t *testing.T) {
			open := func(th *netnstest.Thread, ifname string) (*Device, netip.Addr) {
				t.Helper()
				var d *Device
				var ll netip.Addr
				if err := th.Do(func() error {
					l, err := netlink.LinkByName(ifname)
					if err != nil {
						return err
					}
					ll = gid.LinkLocalFromMAC(l.Attrs().HardwareAddr)
					if d, err = OpenUDP(UDPOptions{Interface: ifname, Name: ifname, Portable: v.portable}); err != nil {
						return err
					}
					if e, _ := d.GIDTable().Entry(0); e.Addr != ll.WithZone(ifname) {
						d.Close()
						return fmt.Errorf("GID 0 %v, want %v bound on %s (table %v, bound %v)", e.Addr, ll, ifname, d.GIDs(), d.Addrs())
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { d.Close() })
				return d, ll
			}
			da, lla := open(x, "ll0")
			db, llb := open(y, "ll1")
			a, b := newEnd(t, da, qp.TypeRC, 4<<20), newEnd(t, db, qp.TypeRC, 4<<20)
			a.addr, b.addr = lla, llb
			if da.GIDIndex(lla) != 0 || db.GIDIndex(llb) != 0 {
				t.Fatalf("GID indexes %d %d, want 0", da.GIDIndex(lla), db.GIDIndex(llb))
			}
			connect(t, a, b, qp.MTU1024, 3, 4)
			ops(t, a, b, 5000)
		})
	}
}
