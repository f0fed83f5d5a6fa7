package conform

import (
	"fmt"
	"net/netip"

	"github.com/softroce/softroce/internal/rocetest"
	"github.com/softroce/softroce/pkg/roce"
)

// VerbsBenchOptions configure NewVerbsBench.
type VerbsBenchOptions struct {
	// Verbs is the device the DUT runs on (SoftroceOptions.Verbs): e.g. a client of the
	// softroce daemon (pkg/client.Dial).
	Verbs roce.Verbs
	// DUTAddr is the DUT's address, one of the device's; BenchAddr is where the bench socket
	// binds (another local address).
	DUTAddr, BenchAddr netip.Addr
	// Port is the device's RoCE UDP port, which the bench binds too (0 = 4791).
	Port uint16
}

// NewVerbsBench makes a bench whose softroce DUT runs on an existing device given as a
// roce.Verbs (the daemon's, through its client), with the bench socket on o.BenchAddr and the
// device's port. Bench.Close closes the bench socket and releases the DUT's objects; the
// device stays open.
func NewVerbsBench(o VerbsBenchOptions) (*Bench, error) {
	if o.Verbs == nil || !o.DUTAddr.IsValid() || !o.BenchAddr.IsValid() || o.DUTAddr == o.BenchAddr {
		return nil, fmt.Errorf("%w: a Verbs bench needs the device and two distinct addresses", ErrDUT)
	}
	port := o.Port
	if port == 0 {
		port = 4791
	}
	dut, err := NewSoftroce(SoftroceOptions{Addr: o.DUTAddr, Port: port, Verbs: o.Verbs})
	if err != nil {
		return nil, fmt.Errorf("conform: bench on %s: %w", o.Verbs.Name(), err)
	}
	b, err := NewBenchFor(dut, o.BenchAddr)
	if err != nil {
		dut.Close()
		return nil, err
	}
	return b, nil
}

// NewBenchFor makes a bench for an existing softroce DUT: the bench socket binds benchAddr on
// the DUT's RoCE port (the device sends to that port). Bench.Close closes the socket and the
// DUT.
func NewBenchFor(dut *Softroce, benchAddr netip.Addr) (*Bench, error) {
	if !benchAddr.IsValid() || benchAddr == dut.Addr().Addr() {
		return nil, fmt.Errorf("%w: the bench needs an address other than the DUT's %v", ErrDUT, dut.Addr().Addr())
	}
	peer, err := rocetest.ListenPeer(rocetest.PeerOptions{Local: netip.AddrPortFrom(benchAddr, dut.Addr().Port())})
	if err != nil {
		return nil, fmt.Errorf("conform: bench socket: %w", err)
	}
	return &Bench{DUT: dut, Peer: peer, Softroce: true}, nil
}
