//go:build race

package race

import "sync/atomic"

// wire tells the race detector what the kernel guarantees: a datagram's send happens before
// its receive. The detector cannot see through sockets, so two devices on loopback in one
// process (the demo, the tools' tests) would otherwise report the receiver's read of memory
// the sender's program wrote before posting. Only race-instrumented builds pay for it.
var wire atomic.Uint64

// Sent marks a send (a release of what the sender wrote before it).
func Sent() { wire.Add(1) }

// Received marks a receive (an acquire of what senders wrote before their sends).
func Received() { wire.Load() }
