package daemon

import (
	"net"
	"net/netip"

	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
)

// gidEntries is the device's GID table as QUERY_GIDS reports it: each GID
// with the interface holding that address in the daemon's network namespace
// (ibv_gid_entry.ndev_ifindex; rdma-core's tools and pyverbs' tests look the
// netdev up by it). The table is fixed while the daemon runs; the interfaces
// are looked up at each query (a query is rare).
func (s *Server) gidEntries() []wire.GIDEntry {
	gids := s.verb.GIDs()
	type nd struct {
		idx  int
		name string
	}
	byAddr := map[netip.Addr]nd{}
	if ifs, err := net.Interfaces(); err == nil {
		for _, ifc := range ifs {
			addrs, err := ifc.Addrs()
			if err != nil {
				continue
			}
			for _, a := range addrs {
				if p, ok := a.(*net.IPNet); ok {
					if ip, ok := netip.AddrFromSlice(p.IP); ok {
						byAddr[ip.Unmap()] = nd{ifc.Index, ifc.Name}
					}
				}
			}
		}
	}
	out := make([]wire.GIDEntry, len(gids))
	for i, g := range gids {
		e := &out[i]
		e.GID = proto.AddrToGID(g)
		e.GIDIndex, e.PortNum, e.GIDType = uint32(i), 1, wire.GIDTypeRoCEv2
		if n, ok := byAddr[g.Unmap().WithZone("")]; ok {
			e.NdevIfindex = uint32(n.idx)
			wire.CString(e.NdevName[:], n.name)
		}
	}
	return out
}
