package main

// softroce devinfo: ibv_devinfo for a softroce device, embedded (on given
// addresses or interfaces, nothing bound) or queried from a running daemon.

import (
	"flag"
	"fmt"
	"io"
	"net/netip"

	"github.com/softroce/softroce/internal/gid"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/client"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/roce"
)

func init() {
	register(&command{name: "devinfo", summary: "show device, port, GIDs, MTU and limits (like ibv_devinfo)", run: runDevinfo})
}

func runDevinfo(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("devinfo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var devs listFlag
	fs.Var(&devs, "d", "local address or interface of an embedded device (repeatable; default: every address, as the daemon binds)")
	sock := fs.String("daemon", "", "query the daemon listening on this unix socket instead")
	verbose := fs.Bool("v", false, "also print the device limits (ibv_devinfo -v)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var v roce.Verbs
	var tbl *gid.Table
	if *sock != "" {
		c, err := client.Dial(*sock)
		if err != nil {
			fmt.Fprintln(stderr, "softroce devinfo:", err)
			return 1
		}
		defer c.Close()
		v = c
	} else {
		uo, err := daemonUDPOptions(devs)
		if err != nil {
			fmt.Fprintln(stderr, "softroce devinfo:", err)
			return 1
		}
		if uo.Interface != "" {
			if tbl, err = gid.FromInterface(uo.Interface); err != nil {
				fmt.Fprintln(stderr, "softroce devinfo:", err)
				return 1
			}
		} else {
			tbl = gid.FromAddrs(gid.Options{Addrs: uo.Addrs, MTU: loopbackMTU(uo.Addrs)})
		}
		// An in-memory link on the same addresses: the device's attributes
		// without binding any socket (a daemon may own UDP 4791).
		l, err := link.NewMemNetwork(link.MemOptions{}).Attach(tbl.Addrs()...)
		if err != nil {
			fmt.Fprintln(stderr, "softroce devinfo:", err)
			return 1
		}
		d, err := roce.Open(roce.Options{Link: l, GIDs: tbl})
		if err != nil {
			fmt.Fprintln(stderr, "softroce devinfo:", err)
			return 1
		}
		defer d.Close()
		v = d.Verbs()
	}
	printDevinfo(stdout, v, *verbose)
	return 0
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
