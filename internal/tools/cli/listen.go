package cli

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/roce"
)

// ListenOptions maps --listen values (addresses or interface names) to device options, as
// `softroce daemon` and `softroce devinfo` take them. One interface alone takes its GID table
// and MTU from the interface (gid.FromInterface); otherwise the addresses are listed; none
// means every address of every interface that is up.
func ListenOptions(listen []string) (roce.UDPOptions, error) {
	var o roce.UDPOptions
	if len(listen) == 1 {
		if _, err := netip.ParseAddr(listen[0]); err != nil {
			o.Interface = listen[0]
			return o, nil
		}
	}
	if len(listen) == 0 {
		ifs, err := net.Interfaces()
		if err != nil {
			return o, err
		}
		for _, ifi := range ifs {
			if ifi.Flags&net.FlagUp == 0 {
				continue
			}
			as, err := roce.InterfaceAddrs(ifi.Name)
			if err == nil {
				o.Addrs = append(o.Addrs, as...)
			}
		}
		if len(o.Addrs) == 0 {
			return o, errors.New("no usable local address")
		}
		return o, nil
	}
	for _, s := range listen {
		if _, err := netip.ParseAddr(s); err == nil {
			a, err := ParseAddr(s)
			if err != nil {
				return o, err
			}
			o.Addrs = append(o.Addrs, a)
			continue
		}
		as, err := roce.InterfaceAddrs(s)
		if err != nil {
			return o, fmt.Errorf("%q: %w", s, err)
		}
		o.Addrs = append(o.Addrs, as...)
	}
	return o, nil
}

// ListenMTU is the port's active MTU for a device on addrs, as rxe derives it from the netdev
// (ActiveMTU): the smallest over the interfaces holding them, so no path MTU the CM or a tool
// picks from the port exceeds what any of them carries (a 4096 MTU on a 1500-byte Ethernet
// makes every multi-packet message leave as datagrams the kernel refuses). 0 (the device's
// default) when no address's interface MTU is known. ifMTU returns an address's interface MTU
// (0 if unknown; InterfaceMTU).
func ListenMTU(addrs []netip.Addr, ifMTU func(netip.Addr) int) qp.MTU {
	var m qp.MTU
	for _, a := range addrs {
		if n := ifMTU(a); n > 0 {
			if am := ActiveMTU(n); m == 0 || am < m {
				m = am
			}
		}
	}
	return m
}
