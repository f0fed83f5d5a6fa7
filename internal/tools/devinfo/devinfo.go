// Package devinfo is `softroce devinfo`: ibv_devinfo for a softroce device, embedded (on
// given addresses or interfaces, nothing bound) or queried from a running daemon.
package devinfo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"

	"github.com/spf13/pflag"

	"github.com/softroce/softroce/internal/gid"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/internal/tools/cli"
	"github.com/softroce/softroce/pkg/client"
	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/roce"
)

// Command is `softroce devinfo`.
var Command = cli.Command{
	Name:    "devinfo",
	Summary: "show device, port, GIDs, MTU and limits (like ibv_devinfo)",
	Main:    Main,
}

// Config is a parsed devinfo command line.
type Config struct {
	// Listen are the addresses or interfaces of an embedded device (-d, repeatable; none:
	// every address, as the daemon binds; cli.ListenOptions).
	Listen []string
	// Daemon, if set, is the socket of the daemon to query instead.
	Daemon string
	// Verbose also prints the device limits (ibv_devinfo -v); List prints only the device
	// name (-l).
	Verbose, List bool
}

func newFlagSet(c *Config, port *int) *pflag.FlagSet {
	fs := cli.NewFlagSet("devinfo")
	fs.StringArrayVarP(&c.Listen, "ib-dev", "d", nil, "local `ADDR|IFNAME` of an embedded device (repeatable; default: every address, as the daemon binds)")
	fs.IntVarP(port, "ib-port", "i", 1, "use `port` of the device (softroce devices have port 1 only)")
	fs.BoolVarP(&c.List, "list", "l", false, "print only the device's name")
	fs.BoolVarP(&c.Verbose, "verbose", "v", false, "print all the attributes of the device (its limits)")
	fs.StringVar(&c.Daemon, "daemon", "", "softroce: query the daemon listening on this unix `socket` instead")
	return fs
}

// Usage writes the command's usage and options.
func Usage(w io.Writer) {
	fmt.Fprint(w, "usage: softroce devinfo [options]   print the device attributes\n\nOptions:\n")
	var port int
	cli.PrintFlags(w, newFlagSet(&Config{}, &port))
}

// ParseArgs parses the devinfo command line (ibv_devinfo's options, GNU getopt style).
func ParseArgs(args []string) (Config, error) {
	var c Config
	var port int
	fs := newFlagSet(&c, &port)
	if err := cli.Parse(fs, args); err != nil {
		return c, err
	}
	switch {
	case fs.NArg() != 0:
		return c, fmt.Errorf("%w: unexpected argument %q", cli.ErrUsage, fs.Arg(0))
	case port != 1:
		return c, fmt.Errorf("%w: -i %d: softroce devices have one port, 1", cli.ErrUsage, port)
	case c.Daemon != "" && len(c.Listen) != 0:
		return c, fmt.Errorf("%w: -d names an embedded device's addresses, not with --daemon", cli.ErrUsage)
	}
	return c, nil
}

// Main is the command: exit status 0, 1 on an error, 2 for a bad command line.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := ParseArgs(args)
	if errors.Is(err, pflag.ErrHelp) {
		Usage(stdout)
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "softroce devinfo:", err)
		return 2
	}
	if err := Run(ctx, c, stdout); err != nil {
		fmt.Fprintln(stderr, "softroce devinfo:", err)
		return 1
	}
	return 0
}

// Run prints the device c names: the daemon's, or an embedded device's attributes on
// c.Listen, computed over an in-memory link so that no socket is bound (a daemon may own UDP
// 4791).
func Run(_ context.Context, c Config, out io.Writer) error {
	var v roce.Verbs
	if c.Daemon != "" {
		cl, err := client.Dial(c.Daemon)
		if err != nil {
			return err
		}
		defer cl.Close()
		v = cl
	} else {
		uo, err := cli.ListenOptions(c.Listen)
		if err != nil {
			return err
		}
		var tbl *gid.Table
		if uo.Interface != "" {
			if tbl, err = gid.FromInterface(uo.Interface); err != nil {
				return err
			}
		} else {
			tbl = gid.FromAddrs(gid.Options{Addrs: uo.Addrs, MTU: loopbackMTU(uo.Addrs), MAC: gid.InterfaceMAC(uo.Addrs[0])})
		}
		l, err := mem.NewNetwork(mem.Options{}).Attach(tbl.Addrs()...)
		if err != nil {
			return err
		}
		d, err := roce.Open(roce.Options{Link: l, GIDs: tbl})
		if err != nil {
			return err
		}
		defer d.Close()
		v = d.Verbs()
	}
	if c.List {
		fmt.Fprintf(out, "1 HCA found:\n\t%s\n\n", v.Name())
		return nil
	}
	printDevinfo(out, v, c.Verbose)
	return nil
}

// loopbackMTU is the netdev MTU assumed for a plain address list: the
// loopback's 65536 when every address is loopback, else Ethernet's 1500.
func loopbackMTU(addrs []netip.Addr) int {
	for _, a := range addrs {
		if !a.IsLoopback() {
			return 1500
		}
	}
	return 65536
}

func gidString(a netip.Addr) string {
	b := a.As16()
	s := ""
	for i := 0; i < 16; i += 2 {
		if i > 0 {
			s += ":"
		}
		s += fmt.Sprintf("%02x%02x", b[i], b[i+1])
	}
	return s
}

var portStateNames = map[qp.PortState]string{
	qp.PortNop: "PORT_NOP", qp.PortDown: "PORT_DOWN", qp.PortInit: "PORT_INIT",
	qp.PortArmed: "PORT_ARMED", qp.PortActive: "PORT_ACTIVE", qp.PortActiveDefer: "PORT_ACTIVE_DEFER",
}

func printDevinfo(w io.Writer, v roce.Verbs, verbose bool) {
	a, p := v.Attr(), v.PortAttr()
	guid := func(g uint64) string {
		return fmt.Sprintf("%04x:%04x:%04x:%04x", g>>48, g>>32&0xffff, g>>16&0xffff, g&0xffff)
	}
	fmt.Fprintf(w, "hca_id:\t%s\n", v.Name())
	fmt.Fprintf(w, "\ttransport:\t\t\tInfiniBand (0)\n")
	fmt.Fprintf(w, "\tfw_ver:\t\t\t\t%s\n", a.FWVer)
	fmt.Fprintf(w, "\tnode_guid:\t\t\t%s\n", guid(a.NodeGUID))
	fmt.Fprintf(w, "\tsys_image_guid:\t\t\t%s\n", guid(a.SysImageGUID))
	fmt.Fprintf(w, "\tvendor_id:\t\t\t0x%04x\n", a.VendorID)
	fmt.Fprintf(w, "\tvendor_part_id:\t\t\t%d\n", a.VendorPartID)
	fmt.Fprintf(w, "\thw_ver:\t\t\t\t0x%X\n", a.HWVer)
	fmt.Fprintf(w, "\tphys_port_cnt:\t\t\t%d\n", a.PhysPortCnt)
	if verbose {
		lim := []struct {
			n string
			v any
		}{
			{"max_mr_size", fmt.Sprintf("0x%x", a.MaxMRSize)}, {"page_size_cap", fmt.Sprintf("0x%x", a.PageSizeCap)},
			{"max_qp", a.MaxQP}, {"max_qp_wr", a.MaxQPWR}, {"device_cap_flags", fmt.Sprintf("0x%08x", uint64(a.DeviceCapFlags))},
			{"max_sge", a.MaxSGE}, {"max_sge_rd", a.MaxSGERD}, {"max_cq", a.MaxCQ}, {"max_cqe", a.MaxCQE},
			{"max_mr", a.MaxMR}, {"max_pd", a.MaxPD}, {"max_qp_rd_atom", a.MaxQPRDAtom}, {"max_res_rd_atom", a.MaxResRDAtom},
			{"max_qp_init_rd_atom", a.MaxQPInitRDAtom}, {"atomic_cap", a.AtomicCap}, {"max_mw", a.MaxMW},
			{"max_ah", a.MaxAH}, {"max_srq", a.MaxSRQ}, {"max_srq_wr", a.MaxSRQWR}, {"max_srq_sge", a.MaxSRQSGE},
			{"max_pkeys", a.MaxPKeys}, {"local_ca_ack_delay", a.LocalCAAckDelay}, {"max_inline_data", a.MaxInlineData},
		}
		for _, l := range lim {
			fmt.Fprintf(w, "\t%s:%s%v\n", l.n, tabs(l.n), l.v)
		}
	}
	fmt.Fprintf(w, "\t\tport:\t1\n")
	fmt.Fprintf(w, "\t\t\tstate:\t\t\t%s (%d)\n", portStateNames[p.State], p.State)
	fmt.Fprintf(w, "\t\t\tmax_mtu:\t\t%d (%d)\n", p.MaxMTU.Bytes(), p.MaxMTU)
	fmt.Fprintf(w, "\t\t\tactive_mtu:\t\t%d (%d)\n", p.ActiveMTU.Bytes(), p.ActiveMTU)
	fmt.Fprintf(w, "\t\t\tsm_lid:\t\t\t%d\n", p.SMLID)
	fmt.Fprintf(w, "\t\t\tport_lid:\t\t%d\n", p.LID)
	fmt.Fprintf(w, "\t\t\tport_lmc:\t\t0x%02x\n", p.LMC)
	ll := "Ethernet"
	if p.LinkLayer == qp.LinkLayerInfiniBand {
		ll = "InfiniBand"
	}
	fmt.Fprintf(w, "\t\t\tlink_layer:\t\t%s\n", ll)
	if verbose {
		fmt.Fprintf(w, "\t\t\tmax_msg_sz:\t\t0x%x\n", p.MaxMsgSz)
		fmt.Fprintf(w, "\t\t\tgid_tbl_len:\t\t%d\n", p.GIDTblLen)
		fmt.Fprintf(w, "\t\t\tpkey_tbl_len:\t\t%d\n", p.PKeyTblLen)
	}
	for i, g := range v.GIDs() {
		fmt.Fprintf(w, "\t\t\tGID[%3d]:\t\t%s, RoCE v2\n", i, gidString(g))
	}
}

func tabs(name string) string {
	n := 4 - (len(name)+1)/8
	if n < 1 {
		n = 1
	}
	s := ""
	for i := 0; i < n; i++ {
		s += "\t"
	}
	return s
}
