package roce

import (
	"net"
	"net/netip"
	"testing"

	"github.com/softroce/softroce/internal/gid"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/link/mem"
)

// TestNodeGUID: a device's node GUID and sys_image_guid are never 0 (rdma-core's suite asserts
// it): the EUI-64 of its interface's MAC as rxe derives them, loopback's all-zero MAC for a
// table without one, and an Attr that names its own GUIDs keeps them.
func TestNodeGUID(t *testing.T) {
	open := func(o Options) qp.DeviceAttr {
		l, err := mem.NewNetwork(mem.Options{}).Attach(addrA)
		if err != nil {
			t.Fatal(err)
		}
		o.Link = l
		d, err := Open(o)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		return d.Attr()
	}
	check := func(what string, a qp.DeviceAttr, node, sys uint64) {
		t.Helper()
		if a.NodeGUID != node || a.SysImageGUID != sys {
			t.Errorf("%s: node GUID %#x, sys_image_guid %#x, want %#x, %#x", what, a.NodeGUID, a.SysImageGUID, node, sys)
		}
	}
	check("no MAC", open(Options{}), 0x020000fffe000000, 0x020000fffe000000)
	mac, _ := net.ParseMAC("52:54:00:12:34:56")
	check("MAC", open(Options{GIDs: gid.FromAddrs(gid.Options{MAC: mac, Addrs: []netip.Addr{addrA}})}),
		0x505400fffe123456, 0x505400fffe123456)
	attr := qp.DefaultDeviceAttr()
	attr.NodeGUID, attr.SysImageGUID = 0x1122334455667788, 0x99
	check("Attr", open(Options{Attr: &attr}), 0x1122334455667788, 0x99)
	attr.SysImageGUID = 0
	check("Attr without sys_image_guid", open(Options{Attr: &attr}), 0x1122334455667788, 0x1122334455667788)
}
