package conform

import "github.com/softroce/softroce/internal/rocetest"

// The testbench's raw RoCEv2 peer and its packet descriptions, under public names: a
// program that builds its own Bench (Bench.Peer) or writes packet-level cases (Case.Send,
// Case.Expect) uses these.

// Peer is a raw RoCEv2 endpoint: a UDP socket on port 4791 that sends packets built from
// a Spec, with any field settable and wrong ones included, and receives whatever arrives.
type Peer = rocetest.Peer

// PeerOptions configure ListenPeer.
type PeerOptions = rocetest.PeerOptions

// ListenPeer opens a Peer on o.Local (port 0: 4791).
func ListenPeer(o PeerOptions) (*Peer, error) { return rocetest.ListenPeer(o) }

// Spec describes one RoCEv2 packet to send (BTH, extension headers, payload, pad, ICRC).
type Spec = rocetest.Spec

// Expect describes a packet to wait for; nil fields match anything.
type Expect = rocetest.Expect

// Received is one datagram a Peer read, parsed.
type Received = rocetest.Received

// Ptr returns a pointer to a copy of v, for the optional fields of Spec and Expect.
func Ptr[T any](v T) *T { return &v }
