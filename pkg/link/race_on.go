//go:build race

package link

import "sync/atomic"

// raceWire tells the race detector what the kernel guarantees: a datagram's
// send happens before its receive. The detector cannot see through sockets,
// so two devices on loopback in one process (the demo, the tools' tests) would
// otherwise report the receiver's read of memory the sender's program wrote
// before posting. Only race-instrumented builds pay for it.
var raceWire atomic.Uint64

func raceSent()     { raceWire.Add(1) }
func raceReceived() { raceWire.Load() }
