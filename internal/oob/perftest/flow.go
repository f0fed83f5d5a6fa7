package perftest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
)

// Test is one of the perftest tools. Its OOB rounds differ (write_bw.c,
// write_lat.c, send_bw.c, ... main()).
type Test uint8

// The tests.
const (
	WriteBW Test = iota
	ReadBW
	SendBW
	AtomicBW
	WriteLat
	ReadLat
	SendLat
	AtomicLat
)

// String returns the binary's name, e.g. "ib_write_bw".
func (t Test) String() string {
	switch t {
	case WriteBW:
		return "ib_write_bw"
	case ReadBW:
		return "ib_read_bw"
	case SendBW:
		return "ib_send_bw"
	case AtomicBW:
		return "ib_atomic_bw"
	case WriteLat:
		return "ib_write_lat"
	case ReadLat:
		return "ib_read_lat"
	case SendLat:
		return "ib_send_lat"
	case AtomicLat:
		return "ib_atomic_lat"
	}
	return "Test(" + strconv.Itoa(int(t)) + ")"
}

// BW reports whether t is a bandwidth test.
func (t Test) BW() bool { return t <= AtomicBW }

// Send reports whether t uses SEND (ib_send_bw / ib_send_lat).
func (t Test) Send() bool { return t == SendBW || t == SendLat }

// Setup is what Conn.Setup needs.
type Setup struct {
	Test Test
	// SysData is sent in check_sys_data; the zero value means DefaultSysData.
	SysData SysData
	// MTU is the local active MTU (perftest's set_mtu result).
	MTU MTU
	// Local holds one key record per QP (-q); at least one.
	Local []Dest
	// Connect moves the QPs to RTR and RTS with the peer's records and the
	// agreed MTU (perftest's ctx_connect). Required.
	Connect func(remote []Dest, mtu MTU) error
	// BeforeSync runs right before the last round of Setup. SEND tests post
	// their receive WQEs there (ctx_set_recv_wqes) so that the client cannot
	// send before the server can receive. Optional.
	BeforeSync func() error
}

// Session is the outcome of Setup.
type Session struct {
	RemoteVersion string
	SysData       SysData // agreed (maximum of both)
	MTU           MTU     // agreed (minimum of both)
	RemoteMTU     int     // the peer's value as sent
	Remote        []Dest  // the peer's records, one per QP
}

// ErrSetup reports a Setup without Local records or Connect.
var ErrSetup = errors.New("perftest: Setup needs Local records and Connect")

// ErrRemoteChanged reports a peer whose key record differs between rounds
// (perftest sends the same my_dest every round).
var ErrRemoteChanged = errors.New("perftest: peer's key record changed between rounds")

// Setup runs every exchange from the version string to the synchronisation
// that precedes the measurement, in the order the tool t runs them
// (non-duplex, one message size, no rdma_cm, RC/UC/UD, not XRC/DC/multicast):
//
//	all:              version, cycle buffer, cache line, MTU
//	write/read/atomic BW: N records; Connect; N records; 1 record (after RTR)
//	write/read/atomic lat: 1 record; N records; Connect; N records; 1 record (after RTR)
//	send BW/lat:      N records; Connect; 1 record; N records; BeforeSync; 1 record
//
// where N is len(s.Local) and "1 record" is a round with Local[0].
func (c *Conn) Setup(ctx context.Context, s *Setup) (*Session, error) {
	if len(s.Local) == 0 || s.Connect == nil {
		return nil, ErrSetup
	}
	sess := &Session{}
	var err error
	if sess.RemoteVersion, err = c.ExchangeVersion(ctx); err != nil {
		return nil, err
	}
	sd := s.SysData
	if sd == (SysData{}) {
		sd = DefaultSysData
	}
	if sess.SysData, _, err = c.ExchangeSysData(ctx, sd); err != nil {
		return nil, err
	}
	if sess.MTU, sess.RemoteMTU, err = c.ExchangeMTU(ctx, s.MTU); err != nil {
		return nil, err
	}
	one := func() error {
		_, err := c.HandShake(ctx, &s.Local[0])
		return err
	}
	all := func(check bool) error {
		for i := range s.Local {
			rem, err := c.HandShake(ctx, &s.Local[i])
			if err != nil {
				return err
			}
			if !check {
				sess.Remote = append(sess.Remote, rem)
			} else if rem != sess.Remote[i] {
				return fmt.Errorf("%w: QP %d", ErrRemoteChanged, i)
			}
		}
		return nil
	}
	lat := !s.Test.BW() && !s.Test.Send()
	if lat {
		if err := one(); err != nil {
			return nil, err
		}
	}
	if err := all(false); err != nil {
		return nil, err
	}
	if err := s.Connect(sess.Remote, sess.MTU); err != nil {
		return nil, err
	}
	if s.Test.Send() {
		if err := one(); err != nil {
			return nil, err
		}
	}
	if err := all(true); err != nil {
		return nil, err
	}
	if s.BeforeSync != nil {
		if err := s.BeforeSync(); err != nil {
			return nil, err
		}
	}
	if err := one(); err != nil {
		return nil, err
	}
	return sess, nil
}

// Finish runs the exchanges after the measurement and closes the connection:
//
//	write/read/atomic BW: 1 record; BW reports; 1 record; "done"
//	send BW/lat, read/atomic lat: 1 record; "done"
//	write lat:        nothing (ib_write_lat just exits)
//
// mine is the local BW report (ignored by the other tests); for BW tests the
// peer's report is returned (the server prints the client's). The server
// calls Finish right after Setup: its first round waits for the client to
// end its measurement.
//
// The first round may wait for the peer's whole measurement: it is bounded by
// Options.FinishTimeout (default: only by ctx), the others by Options.Timeout.
func (c *Conn) Finish(ctx context.Context, t Test, local *Dest, mine BWReport) (BWReport, error) {
	var rem BWReport
	if t == WriteLat {
		return rem, c.Close()
	}
	if _, err := c.waiting().HandShake(ctx, local); err != nil {
		return rem, err
	}
	if t.BW() && !t.Send() {
		var err error
		if rem, err = c.ExchangeBWReport(ctx, mine); err != nil {
			return rem, err
		}
		if _, err := c.HandShake(ctx, local); err != nil {
			return rem, err
		}
	}
	if err := c.s.Write(ctx, "send done", Done[:]); err != nil {
		return rem, err
	}
	return rem, c.s.Close()
}

// waiting returns a Conn sharing c's connection whose steps are bounded by
// Options.FinishTimeout.
func (c *Conn) waiting() *Conn {
	w := *c
	d := c.o.FinishTimeout
	if d == 0 {
		d = -1
	}
	w.s = c.s.WithTimeout(d)
	return &w
}
