package conform

import (
	"fmt"
	"net/netip"

	"github.com/softroce/softroce/internal/tools/cli"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/client"
	conformance "github.com/softroce/softroce/pkg/conform"
)

// softroce conform --dut softroce --daemon SOCKET (and --serve HOST:PORT --daemon SOCKET): the
// softroce DUT through the softroce daemon. The DUT's PD, MRs (memory from AllocBuffer, which
// the daemon maps), CQs, QPs and AHs are created through a client connection (roce.Verbs,
// conformance.SoftroceOptions.Verbs); the bench's raw socket talks to the daemon's device. Every
// scenario runs through the daemon (pkg/conform TestSoftroceDaemon), the DUT fencing its
// receive posts (conformance.Softroce.PostRecv).

// conformDaemonDUT dials the daemon and makes the DUT on its device: at --roce's address (one
// of the daemon's; default its first IPv4 address, as cli.DaemonLocalAddr picks one) and port (the
// daemon's RoCE port, default 4791). done releases the DUT's objects and the connection.
func conformDaemonDUT(f *conformFlags) (*conformance.Softroce, func() error, error) {
	c, err := client.Dial(f.Daemon)
	if err != nil {
		return nil, nil, fmt.Errorf("--daemon %s: %w", f.Daemon, err)
	}
	roce := netip.AddrPort{}
	if f.Roce != "" {
		if roce, err = cli.ParseAddrPort(f.Roce, bth.UDPPort); err != nil {
			c.Close()
			return nil, nil, fmt.Errorf("--roce %w", err)
		}
		if c.GIDIndex(roce.Addr()) < 1 {
			c.Close()
			return nil, nil, fmt.Errorf("--roce %v: not an address of the daemon's device %s %v", roce.Addr(), c.Name(), c.GIDs())
		}
	} else {
		a, err := cli.DaemonLocalAddr(c, nil, netip.Addr{})
		if err != nil {
			c.Close()
			return nil, nil, err
		}
		roce = netip.AddrPortFrom(a, bth.UDPPort)
	}
	dut, err := conformance.NewSoftroce(conformance.SoftroceOptions{Addr: roce.Addr(), Port: roce.Port(), Verbs: c})
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	return dut, func() error {
		err := dut.Close()
		if cerr := c.Close(); err == nil {
			err = cerr
		}
		return err
	}, nil
}

// openDaemonBench is openDUT for --dut softroce --daemon: the bench binds --bench (default:
// 127.0.79.2, or 127.0.79.3 if that is the DUT, for a loopback DUT; otherwise --bench is
// needed: a local address other than the DUT's) on the DUT's port.
func openDaemonBench(f *conformFlags) (*conformance.Bench, func() error, error) {
	dut, done, err := conformDaemonDUT(f)
	if err != nil {
		return nil, nil, err
	}
	fail := func(err error) (*conformance.Bench, func() error, error) {
		done()
		return nil, nil, err
	}
	roce := dut.Addr()
	var bench netip.Addr
	switch {
	case f.Bench != "":
		ap, err := cli.ParseAddrPort(f.Bench, roce.Port())
		if err != nil {
			return fail(fmt.Errorf("--bench %w", err))
		}
		if ap.Port() != roce.Port() {
			return fail(fmt.Errorf("--bench %v: the bench must use the DUT's RoCE port %d", ap, roce.Port()))
		}
		bench = ap.Addr()
	case roce.Addr().IsLoopback() && roce.Addr().Is4():
		bench = conformance.LoopbackBench
		if bench == roce.Addr() {
			bench = netip.AddrFrom4([4]byte{127, 0, 79, 3})
		}
	default:
		return fail(fmt.Errorf("--bench ADDR: name a local address for the bench socket (the daemon's device is on %v)", roce.Addr()))
	}
	if bench == roce.Addr() {
		return fail(fmt.Errorf("--bench %v: the bench needs an address other than the DUT's", bench))
	}
	b, err := conformance.NewBenchFor(dut, bench)
	if err != nil {
		return fail(err)
	}
	return b, func() error {
		err := b.Peer.Close()
		if derr := done(); err == nil {
			err = derr
		}
		return err
	}, nil
}
