package cli

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/softroce/softroce/pkg/roce"
)

// CCFlag is the value of a --cc flag (a pflag.Value): congestion control settings under mlx5's
// names (docs/congestion.md) applied over roce.DefaultCC(): "off", "on",
// "rp_ai_rate=1,rp_time_reset=1000", ...; repeatable, later settings win. Unset, a device keeps
// its default.
type CCFlag struct {
	p   roce.CCParams
	set bool
}

// String implements pflag.Value.
func (f *CCFlag) String() string {
	if f == nil || !f.set {
		return ""
	}
	return f.p.String()
}

// Type implements pflag.Value.
func (f *CCFlag) Type() string { return "NAME=VALUE,..." }

// Set implements pflag.Value.
func (f *CCFlag) Set(s string) error {
	if !f.set {
		f.p, f.set = roce.DefaultCC(), true
	}
	if err := f.p.Parse(s); err != nil {
		return fmt.Errorf("--cc: %w", err)
	}
	return nil
}

// Params returns the settings, nil if the flag was not given.
func (f *CCFlag) Params() *roce.CCParams {
	if f == nil || !f.set {
		return nil
	}
	p := f.p
	return &p
}

// CCUsage is the help text of a --cc flag.
const CCUsage = "softroce: congestion control `settings` under mlx5's names over the defaults (off, on, " +
	"rp_ai_rate=5, rp_time_reset=300, np_min_time_between_cnps=50, ...; docs/congestion.md)"

// InterfaceSpeed returns the speed in bit/s of the interface holding addr (roce.InterfaceSpeed),
// 0 if unknown.
func InterfaceSpeed(addr netip.Addr) float64 {
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
			if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Unmap() == addr.Unmap() {
				return roce.InterfaceSpeed(ifc.Name)
			}
		}
	}
	return 0
}
