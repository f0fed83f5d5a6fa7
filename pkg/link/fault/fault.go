// Package fault is a fault-injecting decorator for link.Link: it drops, duplicates, reorders,
// corrupts and delays RoCEv2 datagrams, at random with given probabilities or by scripted rules
// that match the parsed BTH (IBTA 9.2: opcode, PSN, destination QP, the Nth match), separately
// on Send and on Recv. It exists to test the transport's reliability mechanisms (IBTA 9.7:
// PSN sequence checks, NAK/retry, duplicate detection; A17.3.3: ICRC) against a hostile
// network, reproducibly.
//
// Determinism: every random decision about a datagram is drawn from a PCG (math/rand/v2)
// seeded from Options.Seed1/Seed2, the direction and the datagram's index in that direction.
// The same seed and the same sequence of datagrams therefore give the same faults, however the
// datagrams are split into batches and however the clock's timers interleave; changing one
// probability does not move the other faults (each fault kind has its own draw).
//
// Pipeline (one mutex per direction, held while a datagram is processed):
//
//	Send: validate batch -> per datagram: rules | random draws -> drop / corrupt (pooled copy)
//	      -> hold (reorder, delay: pooled copy, released by the clock or by later datagrams)
//	      or pass (the caller's buffer, no copy) -> duplicate -> inner.Send(out batch)
//	Recv: a pump goroutine (started by Wrap) calls inner.Recv, applies the same
//	      faults and queues the survivors (pooled buffers); Recv copies from that queue.
//	      Timers queue released datagrams and wake Recv.
//
// A direction with no fault configured passes straight through (no copy, no pump). No
// allocation happens per datagram once the buffer pool has warmed up. See docs/reliability.md.
package fault

import (
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
)

// Direction says which way a datagram was going when a fault hit it.
type Direction uint8

const (
	// DirSend: datagrams given to Link.Send.
	DirSend Direction = iota
	// DirRecv: datagrams returned by the inner link's Recv.
	DirRecv
)

// String returns "send" or "recv".
func (d Direction) String() string {
	if d == DirSend {
		return "send"
	}
	return "recv"
}

// CorruptRegion chooses the bits Corrupt may flip.
type CorruptRegion uint8

const (
	// CorruptCovered (default) flips any bit the receiver's ICRC check sees: every byte of the
	// UDP payload except BTH byte 4 (FECN, BECN, reserved), which the ICRC masks (IBTA
	// A17.3.3), including the ICRC field itself. bth.VerifyICRC always fails afterwards
	// (a CRC catches every single-bit error).
	CorruptCovered CorruptRegion = iota
	// CorruptOutsideICRC flips a covered bit before the ICRC field (headers, payload, pad), so
	// the packet is damaged while its stored ICRC is intact.
	CorruptOutsideICRC
	// CorruptAnywhere flips any bit of the UDP payload, BTH byte 4 included: a flip there is
	// invisible to the ICRC.
	CorruptAnywhere
)

// DefaultReorderDelay is the longest a reordered datagram is held when neither
// DirOptions.ReorderDelay nor Rule.Delay says otherwise.
const DefaultReorderDelay = time.Millisecond

// DefaultRecvQueue is Options.RecvQueue's default.
const DefaultRecvQueue = 1024

// DirOptions configure the faults of one direction. The zero value injects nothing.
// Probabilities are per datagram, in [0, 1], each drawn independently; a dropped datagram
// gets no other fault.
type DirOptions struct {
	// Drop is the probability a datagram is discarded.
	Drop float64
	// Duplicate is the probability a datagram is delivered twice.
	Duplicate float64
	// DuplicateDelay bounds the copy's delay: 0 delivers it right after the original; > 0 holds
	// it for a uniform random time in (0, DuplicateDelay].
	DuplicateDelay time.Duration
	// Reorder is the probability a datagram is held back and released right after
	// 1..ReorderDepth (uniform) later datagrams have gone out past it (fresh ones, or delayed
	// ones the clock releases; not other reordered ones), or after ReorderDelay, whichever
	// comes first.
	Reorder float64
	// ReorderDepth is the K above; 0 means 1.
	ReorderDepth int
	// ReorderDelay bounds how long a reordered datagram is held; 0 means DefaultReorderDelay.
	ReorderDelay time.Duration
	// Mark is the probability an ECN-capable datagram (TClass ECT(0) or ECT(1)) is marked
	// Congestion Experienced, as a switch's AQM marks instead of dropping (RFC 3168 section 5,
	// IBTA A17.9.1): its TClass becomes CE; a not-ECT datagram is left alone.
	Mark float64
	// Corrupt is the probability one bit of the datagram (in CorruptRegion) is flipped. The
	// caller's buffer is never modified: the corrupted datagram is a copy.
	Corrupt float64
	// CorruptRegion chooses the bits Corrupt (and Corrupt rules) may flip.
	CorruptRegion CorruptRegion
	// Delay and Jitter delay every datagram by Delay plus a uniform random time in
	// [0, Jitter] (a link latency; with Jitter > 0 datagrams may overtake each other).
	Delay, Jitter time.Duration
	// Rules are scripted faults, checked in order before the random ones. Each rule counts its
	// own matches; the first rule that fires on a datagram decides its fault, and no random
	// fault is drawn for it (Delay/Jitter still apply, except to Reorder and Delay rules).
	Rules []Rule
}

// active reports whether the direction can do anything at all.
func (o *DirOptions) active() bool {
	return o.random() || len(o.Rules) > 0
}

// random reports whether any random fault or latency is configured.
func (o *DirOptions) random() bool {
	return o.Drop > 0 || o.Duplicate > 0 || o.Reorder > 0 || o.Corrupt > 0 || o.Mark > 0 || o.Delay > 0 || o.Jitter > 0
}

// Validate checks the options.
func (o *DirOptions) Validate() error {
	for _, p := range [...]struct {
		name string
		v    float64
	}{{"drop", o.Drop}, {"dup", o.Duplicate}, {"reorder", o.Reorder}, {"corrupt", o.Corrupt}, {"mark", o.Mark}} {
		if !(p.v >= 0 && p.v <= 1) {
			return fmt.Errorf("%w: %s probability %v not in [0,1]", ErrRule, p.name, p.v)
		}
	}
	if o.DuplicateDelay < 0 || o.ReorderDelay < 0 || o.Delay < 0 || o.Jitter < 0 {
		return fmt.Errorf("%w: negative duration", ErrRule)
	}
	if o.ReorderDepth < 0 {
		return fmt.Errorf("%w: reorder depth %d", ErrRule, o.ReorderDepth)
	}
	if o.CorruptRegion > CorruptAnywhere {
		return fmt.Errorf("%w: corrupt region %d", ErrRule, o.CorruptRegion)
	}
	for i := range o.Rules {
		if err := o.Rules[i].Validate(); err != nil {
			return fmt.Errorf("rule %d: %w", i, err)
		}
	}
	return nil
}

// Options configure Wrap.
type Options struct {
	// Seed1 and Seed2 seed the PCG (rand.NewPCG(Seed1, Seed2) style) every random decision
	// derives from.
	Seed1, Seed2 uint64
	// Send and Recv are the faults of each direction.
	Send, Recv DirOptions
	// Clock times delays and reorder holds; nil means RealClock(). Use AdaptClock for a
	// internal/qp clock.
	Clock Clock
	// OnEvent, if set, is called for every fault and every release, synchronously, with the
	// direction's lock held: it must not call the Link and should not block. The two
	// directions may call it concurrently. A hold's event (Delay, Reorder, delayed Duplicate)
	// comes after its timer is armed, so a test may wait for the event, then advance a fake
	// clock.
	OnEvent func(Event)
	// RecvQueue bounds the datagrams the receive pump queues ahead of Recv: when it is full
	// the pump stops reading and the inner link's own queue fills. Datagrams released by the
	// clock may exceed it. 0 means DefaultRecvQueue.
	RecvQueue int
}

// Validate checks both directions. Wrap does not fail: it clamps what Validate refuses
// (probabilities into [0,1], negative durations and counts to 0) and drops invalid rules.
func (o *Options) Validate() error {
	if err := o.Send.Validate(); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	if err := o.Recv.Validate(); err != nil {
		return fmt.Errorf("recv: %w", err)
	}
	return nil
}

// Event describes one thing the injector did to one datagram.
type Event struct {
	// Dir is the direction.
	Dir Direction
	// Kind is Drop, Duplicate, Reorder, Corrupt, Delay, Mark, Release or Discard.
	Kind Action
	// Seq is the datagram's index in its direction (0 = the first datagram seen); a duplicate
	// or a released datagram carries its original's Seq.
	Seq uint64
	// Rule is the index in DirOptions.Rules of the rule that fired, or -1 for a random fault.
	Rule int
	// Len is the datagram's length in bytes.
	Len int
	// Parsed says Op, PSN and QPN were read from a BTH that bth.ParseInto accepted.
	Parsed bool
	// Op, PSN and QPN (destination QP) are the datagram's BTH fields when Parsed.
	Op  bth.Opcode
	PSN bth.PSN
	QPN uint32
	// Bit (Corrupt) is the flipped bit: byte Bit/8, mask 0x80>>(Bit%8).
	Bit int
	// Delay (Delay, Reorder, delayed Duplicate) is how long the datagram is held at most.
	Delay time.Duration
	// Hold (Reorder) is how many later datagrams release it.
	Hold int
}

// DirStats count what happened in one direction.
type DirStats struct {
	Seen       uint64 // datagrams given to the injector
	Delivered  uint64 // datagrams handed on (originals, duplicates and released ones)
	Dropped    uint64 // Drop faults
	Duplicated uint64 // Duplicate faults
	Reordered  uint64 // Reorder faults
	Corrupted  uint64 // Corrupt faults
	Marked     uint64 // ECN-capable datagrams marked CE (Mark)
	Delayed    uint64 // datagrams held by Delay rules or Delay/Jitter latency
	Released   uint64 // held datagrams let go (by the clock or by later datagrams)
	Discarded  uint64 // held or queued datagrams freed by Close
	RuleFired  uint64 // datagrams a rule fired on
	Errors     uint64 // inner Send calls that failed (send direction)
	Held       uint64 // datagrams held right now
}

// Stats are the injector's counters, cumulative since Wrap (Held: current).
type Stats struct {
	Send, Recv DirStats
}

// Link is a link.Link with faults. Safe for concurrent use (like the links it wraps).
type Link struct {
	inner  link.Link
	locals []netip.Addr
	send   *dir
	recv   *dir
	opts   Options

	closeOnce sync.Once
	closeErr  error
	pumps     sync.WaitGroup
}

var _ link.Link = (*Link)(nil)

// Wrap returns inner with the faults of opts. Closing the returned Link closes inner.
func Wrap(inner link.Link, opts Options) *Link {
	if opts.Clock == nil {
		opts.Clock = RealClock()
	}
	if opts.RecvQueue <= 0 {
		opts.RecvQueue = DefaultRecvQueue
	}
	l := &Link{inner: inner, opts: opts}
	for _, a := range inner.LocalAddrs() {
		l.locals = append(l.locals, a.Unmap())
	}
	l.send = newDir(l, DirSend, opts.Send)
	l.recv = newDir(l, DirRecv, opts.Recv)
	if l.recv.active {
		l.pumps.Add(1)
		go l.recv.pump()
	}
	return l
}

// Inner returns the wrapped link (for its own Stats, for instance).
func (l *Link) Inner() link.Link { return l.inner }

// Stats returns the counters.
func (l *Link) Stats() Stats {
	return Stats{Send: l.send.statsSnapshot(), Recv: l.recv.statsSnapshot()}
}

// Held returns how many datagrams direction d holds now (delayed, reordered, delayed copies).
func (l *Link) Held(d Direction) int {
	if d == DirSend {
		return l.send.heldLen()
	}
	return l.recv.heldLen()
}

// Queued returns how many received datagrams wait for Recv in the pump's queue.
func (l *Link) Queued() int { return l.recv.queuedLen() }

func (l *Link) isLocal(a netip.Addr) bool {
	a = a.Unmap()
	for _, x := range l.locals {
		if x == a {
			return true
		}
	}
	return false
}

// validate applies the link.Link Send rules to the whole batch before anything happens, so an
// invalid batch neither consumes random draws nor leaves held copies behind.
func (l *Link) validate(batch []link.Datagram) error {
	for i := range batch {
		d := &batch[i]
		if !d.Src.IsValid() || d.Src.Port() == 0 || !d.Dst.IsValid() {
			return fmt.Errorf("fault: send %v -> %v: %w", d.Src, d.Dst, link.ErrInvalidAddr)
		}
		if !l.isLocal(d.Src.Addr()) {
			return fmt.Errorf("fault: send from %v: %w", d.Src.Addr(), link.ErrNoLocalAddr)
		}
		if len(d.Buf) > link.MaxDatagram {
			return fmt.Errorf("fault: send %d bytes: %w", len(d.Buf), link.ErrTooLarge)
		}
	}
	return nil
}

// Send applies the send faults to the batch and passes the survivors to the inner link, in
// order. It does not modify or retain the caller's buffers (corrupted and held datagrams are
// copies). Returns net.ErrClosed after Close. Held datagrams are sent later from the clock's
// timer callback (on a lossless in-memory network that blocks when full, that callback waits
// for the receiver like any sender).
func (l *Link) Send(batch []link.Datagram) error {
	return l.send.sendBatch(batch)
}

// Recv returns received datagrams after the receive faults. With no receive fault configured
// it is the inner link's Recv. Returns net.ErrClosed after Close. If the inner Recv fails
// otherwise, the datagrams already queued are returned first, then that error, from then on.
func (l *Link) Recv(batch []link.Datagram) (int, error) {
	return l.recv.recvBatch(batch)
}

// BatchSize returns the inner link's.
func (l *Link) BatchSize() int { return l.inner.BatchSize() }

// LocalAddrs returns the inner link's.
func (l *Link) LocalAddrs() []netip.Addr { return l.inner.LocalAddrs() }

// SourcePort returns the inner link's: the injector does not rewrite headers.
func (l *Link) SourcePort(local netip.Addr, entropy uint16) uint16 {
	return l.inner.SourcePort(local, entropy)
}

// Close stops the timers, frees every held and queued datagram (counted in Discarded, logged
// as Discard events), closes the inner link and waits for the receive pump to exit. Closing
// twice is harmless.
func (l *Link) Close() error {
	l.closeOnce.Do(func() {
		l.send.close()
		l.recv.close()
		l.closeErr = l.inner.Close()
		l.pumps.Wait()
	})
	return l.closeErr
}
