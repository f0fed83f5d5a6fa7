package conform

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/softroce/softroce/internal/rocetest"
)

// Bench is the testbench side: a raw RoCEv2 socket (rocetest.Peer) facing the DUT, and the
// DUT's control interface. Packets are crafted with rocetest.Spec (any field settable,
// wrong ones included) and replies matched with rocetest.Expect (nil fields = wildcard),
// in the style of gVisor's packetimpact.
type Bench struct {
	DUT  DUT
	Peer *rocetest.Peer
	// Reply bounds how long Expect waits for a packet (0 = 2 s).
	Reply time.Duration
	// Quiet is how long ExpectNothing listens (0 = 300 ms).
	Quiet time.Duration
	// Rxe marks the DUT as kernel rxe: scenarios with an RxeDeviation expect rxe's
	// documented behaviour instead of the spec's.
	Rxe bool
	// Softroce marks the DUT as softroce: scenarios with a SoftroceDeviation expect
	// softroce's documented behaviour.
	Softroce bool
	// DevCaps, if set, is the DUT's device_cap_flags_ex (ibv_query_device_ex), for
	// Scenario.Needs; unset, the DUT's DeviceCaps (DeviceCapper) if it has one, else the
	// capabilities are unknown and such scenarios run (and skip if the DUT refuses what
	// they set up).
	DevCaps *uint64
}

// DeviceCapper is a DUT that reports its device_cap_flags_ex.
type DeviceCapper interface {
	// DeviceCaps returns the flags, false if they are unknown.
	DeviceCaps() (uint64, bool)
}

func (b *Bench) deviceCaps() (uint64, bool) {
	if b.DevCaps != nil {
		return *b.DevCaps, true
	}
	if d, ok := b.DUT.(DeviceCapper); ok {
		return d.DeviceCaps()
	}
	return 0, false
}

func (b *Bench) reply() time.Duration {
	if b.Reply > 0 {
		return b.Reply
	}
	return 2 * time.Second
}

func (b *Bench) quiet() time.Duration {
	if b.Quiet > 0 {
		return b.Quiet
	}
	return 300 * time.Millisecond
}

// Send builds s and sends it to the DUT; it returns the bytes sent.
func (b *Bench) Send(s *rocetest.Spec) ([]byte, error) {
	return b.Peer.Send(b.DUT.Addr(), s)
}

// ErrNoPacket: nothing matching arrived in time.
var ErrNoPacket = errors.New("conform: no packet")

// ErrUnexpected: a packet arrived when none (or another) was expected.
var ErrUnexpected = errors.New("conform: unexpected packet")

// Recv returns the next RoCE packet addressed to benchQPN (others are stale traffic of
// earlier scenarios and are skipped, as are datagrams that do not parse) before deadline.
func (b *Bench) Recv(benchQPN uint32, deadline time.Time, skipped func(string)) (*rocetest.Received, error) {
	for {
		r, err := b.Peer.Recv(deadline)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, ErrNoPacket
		}
		if errors.Is(err, rocetest.ErrBadPacket) {
			skipped(fmt.Sprintf("unparseable datagram from %v: %v", r.From, err))
			continue
		}
		if err != nil {
			return nil, err
		}
		if got := r.Pkt.BTH.DestQP(); got != benchQPN {
			skipped(fmt.Sprintf("stale packet for QPN %#x: %s", got, rocetest.Describe(&r.Pkt)))
			continue
		}
		return r, nil
	}
}

// Expect waits (Reply) for the next packet to benchQPN and matches it against e.
func (b *Bench) Expect(benchQPN uint32, e *rocetest.Expect, skipped func(string)) (*rocetest.Received, error) {
	return b.ExpectWithin(benchQPN, e, b.reply(), skipped)
}

// ExpectWithin is Expect with an explicit timeout.
func (b *Bench) ExpectWithin(benchQPN uint32, e *rocetest.Expect, timeout time.Duration, skipped func(string)) (*rocetest.Received, error) {
	r, err := b.Recv(benchQPN, time.Now().Add(timeout), skipped)
	if err != nil {
		return nil, err
	}
	if !r.IDSolved {
		return r, fmt.Errorf("%w: %s: ICRC matches no IPv4 ID", ErrUnexpected, rocetest.Describe(&r.Pkt))
	}
	if err := e.Match(&r.Pkt); err != nil {
		return r, fmt.Errorf("%s: %w", rocetest.Describe(&r.Pkt), err)
	}
	return r, nil
}

// ExpectNothing listens for Quiet and fails if a packet for benchQPN arrives.
func (b *Bench) ExpectNothing(benchQPN uint32, skipped func(string)) error {
	return b.ExpectNothingFor(benchQPN, b.quiet(), skipped)
}

// ExpectNothingFor is ExpectNothing with an explicit listening time.
func (b *Bench) ExpectNothingFor(benchQPN uint32, d time.Duration, skipped func(string)) error {
	r, err := b.Recv(benchQPN, time.Now().Add(d), skipped)
	if errors.Is(err, ErrNoPacket) {
		return nil
	}
	if err != nil {
		return err
	}
	return fmt.Errorf("%w: %s", ErrUnexpected, rocetest.Describe(&r.Pkt))
}

// Drain discards whatever is queued on the bench socket.
func (b *Bench) Drain() {
	for {
		if _, err := b.Peer.Recv(time.Now().Add(time.Millisecond)); errors.Is(err, os.ErrDeadlineExceeded) || (err != nil && !errors.Is(err, rocetest.ErrBadPacket)) {
			return
		}
	}
}
