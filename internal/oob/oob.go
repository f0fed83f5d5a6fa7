// Package oob holds what the out-of-band exchanges of the standard RDMA tools
// have in common: the TCP stream they run on, with a bounded deadline on every
// step and context cancellation, and the typed errors those steps return.
//
// The formats themselves live in the subpackages:
//
//   - pingpong: rdma-core's ibv_rc_pingpong, ibv_uc_pingpong, ibv_ud_pingpong and
//     ibv_srq_pingpong (libibverbs/examples), records "LID:QPN:PSN:GID".
//   - perftest: perftest 6.06 (ib_write_bw, ib_read_lat, ...), version string,
//     system data, MTU, 108-byte key records, BW reports and the closing "done".
//
// None of these exchanges belong to the InfiniBand specification: they are the
// tools' own conventions, learned from their sources and from the reference
// captures (testdata/captures/*.pcap). docs/oob.md has the formats byte by byte.
package oob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"
)

// DefaultPort is the TCP port both rdma-core's pingpong examples and perftest
// listen on unless told otherwise (-p).
const DefaultPort = 18515

// DefaultTimeout bounds each step (one write or one read of one message) when
// Options.Timeout is zero.
const DefaultTimeout = 10 * time.Second

var (
	// ErrTimeout reports that a step did not complete within its timeout.
	ErrTimeout = errors.New("oob: step timed out")
	// ErrPeerClosed reports that the peer closed the connection (or reset it)
	// before a complete message arrived.
	ErrPeerClosed = errors.New("oob: peer closed the connection")
	// ErrMalformed reports a message from the peer that does not parse.
	ErrMalformed = errors.New("oob: malformed message")
)

// StepError wraps the error of one step of an exchange with the step's name,
// e.g. "read remote address". Use errors.Is on it with ErrTimeout,
// ErrPeerClosed, ErrMalformed, context.Canceled, ...
type StepError struct {
	Step string // what was being done
	Err  error  // the cause
}

// Error implements error.
func (e *StepError) Error() string { return "oob: " + e.Step + ": " + e.Err.Error() }

// Unwrap returns the cause.
func (e *StepError) Unwrap() error { return e.Err }

// Options bound the steps of an exchange.
type Options struct {
	// Timeout bounds each step; 0 means DefaultTimeout. A negative value
	// disables the per-step bound (the context still applies).
	Timeout time.Duration
	// Now is the clock deadlines are computed from; nil means time.Now.
	// Tests inject a fake clock here.
	Now func() time.Time
}

func (o *Options) now() time.Time {
	if o.Now != nil {
		return o.Now()
	}
	return time.Now()
}

func (o *Options) timeout() time.Duration {
	if o.Timeout == 0 {
		return DefaultTimeout
	}
	return o.Timeout
}

// Stream is a TCP connection carrying an out-of-band exchange. Every Write
// and ReadFull is one step, bounded by Options.Timeout and by the context.
// A Stream is not safe for concurrent use.
type Stream struct {
	c    net.Conn
	opts Options
}

// NewStream wraps an established connection.
func NewStream(c net.Conn, o Options) *Stream { return &Stream{c: c, opts: o} }

// WithTimeout returns a Stream on the same connection whose steps are bounded
// by d instead (negative: only by the context). Use it for a step that waits
// for the peer to finish something long, such as a measurement.
func (s *Stream) WithTimeout(d time.Duration) *Stream {
	o := s.opts
	o.Timeout = d
	return &Stream{c: s.c, opts: o}
}

// Conn returns the underlying connection.
func (s *Stream) Conn() net.Conn { return s.c }

// Close closes the connection.
func (s *Stream) Close() error { return s.c.Close() }

// step arms the deadline for one step and a context watcher; the returned
// function disarms the watcher.
func (s *Stream) step(ctx context.Context) (stop func() bool, err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var dl time.Time
	if t := s.opts.timeout(); t > 0 {
		dl = s.opts.now().Add(t)
	}
	if d, ok := ctx.Deadline(); ok && (dl.IsZero() || d.Before(dl)) {
		dl = d
	}
	if err := s.c.SetDeadline(dl); err != nil {
		return nil, err
	}
	return context.AfterFunc(ctx, func() { _ = s.c.SetDeadline(time.Unix(1, 0)) }), nil
}

// Write sends b in a single write call (the C tools read each message with a
// single read(2), so a message must not be split by us).
func (s *Stream) Write(ctx context.Context, step string, b []byte) error {
	stop, err := s.step(ctx)
	if err != nil {
		return &StepError{Step: step, Err: err}
	}
	_, err = s.c.Write(b)
	stop()
	if err != nil {
		return &StepError{Step: step, Err: s.classify(ctx, err)}
	}
	return nil
}

// ReadFull reads exactly len(b) bytes.
func (s *Stream) ReadFull(ctx context.Context, step string, b []byte) error {
	stop, err := s.step(ctx)
	if err != nil {
		return &StepError{Step: step, Err: err}
	}
	n, err := io.ReadFull(s.c, b)
	stop()
	if err != nil {
		err = s.classify(ctx, err)
		if errors.Is(err, ErrPeerClosed) {
			err = fmt.Errorf("%w after %d of %d bytes", err, n, len(b))
		}
		return &StepError{Step: step, Err: err}
	}
	return nil
}

func (s *Stream) classify(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		// The connection deadline may be the context's own deadline, which
		// can pass an instant before the context notices it.
		if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
			return context.DeadlineExceeded
		}
		return ErrTimeout
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return fmt.Errorf("%w (%v)", ErrPeerClosed, err)
	}
	return err
}

// Dial connects to addr ("host:port") over TCP, bounded by the step timeout
// and the context.
func Dial(ctx context.Context, addr string, o Options) (net.Conn, error) {
	d := net.Dialer{}
	if t := o.timeout(); t > 0 {
		d.Deadline = o.now().Add(t)
	}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			err = cerr
		} else if errors.Is(err, os.ErrDeadlineExceeded) {
			err = ErrTimeout
		}
		return nil, &StepError{Step: "connect to " + addr, Err: err}
	}
	return c, nil
}

// deadliner is what *net.TCPListener and *net.UnixListener offer.
type deadliner interface{ SetDeadline(time.Time) error }

// Accept waits for one connection on ln. It waits as long as the context
// allows (a server waits for its client indefinitely, as the tools do); the
// listener must support SetDeadline for cancellation to interrupt it.
func Accept(ctx context.Context, ln net.Listener) (net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, &StepError{Step: "accept", Err: err}
	}
	if dl, ok := ln.(deadliner); ok {
		d, _ := ctx.Deadline()
		if err := dl.SetDeadline(d); err != nil {
			return nil, &StepError{Step: "accept", Err: err}
		}
		stop := context.AfterFunc(ctx, func() { _ = dl.SetDeadline(time.Unix(1, 0)) })
		defer stop()
	}
	c, err := ln.Accept()
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			err = cerr
		}
		return nil, &StepError{Step: "accept", Err: err}
	}
	return c, nil
}
