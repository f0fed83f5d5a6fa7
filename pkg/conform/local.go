package conform

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"

	"github.com/softroce/softroce/internal/rocetest"
)

// Loopback addresses of the in-process softroce bench (127.0.0.0/8 only).
var (
	LoopbackDUT   = netip.MustParseAddr("127.0.79.1")
	LoopbackBench = netip.MustParseAddr("127.0.79.2")
)

// LoopbackOptions configure NewLoopback.
type LoopbackOptions struct {
	// DUTAddr and BenchAddr default to LoopbackDUT and LoopbackBench.
	DUTAddr, BenchAddr netip.Addr
	// Port is the UDP port of both sides (0 = 4791, else a free random port).
	Port uint16
}

// NewLoopback opens the softroce DUT and the bench socket on two loopback addresses
// sharing one UDP port (4791 if free, else a random one both can bind). Close the bench
// with CloseLoopback.
func NewLoopback(o LoopbackOptions) (*Bench, error) {
	if !o.DUTAddr.IsValid() {
		o.DUTAddr = LoopbackDUT
	}
	if !o.BenchAddr.IsValid() {
		o.BenchAddr = LoopbackBench
	}
	var errs []error
	for try := range 20 {
		port := o.Port
		if port == 0 {
			port = 4791
			if try > 0 {
				port = uint16(20000 + rand.IntN(40000))
			}
		}
		peer, err := rocetest.ListenPeer(rocetest.PeerOptions{Local: netip.AddrPortFrom(o.BenchAddr, port)})
		if err != nil {
			errs = append(errs, err)
			if o.Port != 0 {
				break
			}
			continue
		}
		dut, err := NewSoftroce(SoftroceOptions{Addr: o.DUTAddr, Port: port})
		if err != nil {
			peer.Close()
			errs = append(errs, err)
			if o.Port != 0 {
				break
			}
			continue
		}
		return &Bench{DUT: dut, Peer: peer, Softroce: true}, nil
	}
	return nil, fmt.Errorf("conform: loopback bench: %w", errors.Join(errs...))
}

// Close closes the bench socket and the DUT.
func (b *Bench) Close() error {
	return errors.Join(b.Peer.Close(), b.DUT.Close())
}
