package perf

// The measurement and the closing exchanges of each test, as perftest's main() of the tool
// runs them (write_bw.c, send_bw.c, read_bw.c, atomic_bw.c, *_lat.c), printing its table.

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/softroce/softroce/internal/oob/perftest"
)

// perfExchanger is the out-of-band exchange during and after the measurement: the TCP
// exchange (*perftest.Conn) or, with -R, the rdma_cm one (cm.go).
type perfExchanger interface {
	// HandShake is ctx_hand_shake: one key record round.
	HandShake(ctx context.Context, mine *perftest.Dest) (perftest.Dest, error)
	// ExchangeBWReport is xchg_bw_reports.
	ExchangeBWReport(ctx context.Context, mine perftest.BWReport) (perftest.BWReport, error)
	// CloseExchange is ctx_close_connection.
	CloseExchange(ctx context.Context, mine *perftest.Dest) (perftest.Dest, error)
	// Finish runs the exchanges after a one-directional measurement (see perftest.Conn.Finish).
	Finish(ctx context.Context, t perftest.Test, local *perftest.Dest, mine perftest.BWReport) (perftest.BWReport, error)
	// Close ends the exchange.
	Close() error
}

// Errors of the exchange, in perftest's words.
const (
	errXchg  = "Failed to exchange data between server and clients: %w"
	errClose = "Failed to close connection between server and client: %w"
	errSync  = "Failed to sync between server and client between different msg sizes: %w"
)

// perfMeasure runs the measurement of every size and the closing exchanges, printing
// perftest's table.
func perfMeasure(ctx context.Context, r *perfRes, conn perfExchanger, role perftest.Role, out io.Writer, sizes []int) error {
	c := r.c
	switch {
	case c.Test.BW() && c.Duplex:
		return r.measureDuplex(ctx, conn, out, sizes)
	case c.Test.BW() && c.Verb != "send":
		fmt.Fprint(out, perftest.BWHeader(c.Gbits))
		if role == perftest.Server { // write_bw.c: the server only waits for the client's report
			rep, err := conn.Finish(ctx, c.Test, &r.mine[0], perftest.BWReport{})
			if err != nil {
				return fmt.Errorf(errXchg, err)
			}
			fmt.Fprint(out, perftest.FormatBW(rep, nil, c.Gbits))
			fmt.Fprint(out, perftest.ResultLine)
			return nil
		}
		var rep perftest.BWReport
		for _, s := range sizes {
			if err := r.bwClient(s); err != nil {
				return fmt.Errorf("Failed to complete run_iter_bw function successfully: %w", err)
			}
			rep = r.bwReport(s)
			fmt.Fprint(out, perftest.FormatBW(rep, nil, c.Gbits))
		}
		if _, err := conn.Finish(ctx, c.Test, &r.mine[0], rep); err != nil {
			return fmt.Errorf(errClose, err)
		}
		fmt.Fprint(out, perftest.ResultLine)
	case c.Test == perftest.SendBW:
		fmt.Fprint(out, perftest.BWHeader(c.Gbits))
		for k, s := range sizes {
			if k > 0 { // send_bw.c RUN_ALL: receives for this size, then a sync
				if role == perftest.Server {
					if err := r.postRecvs(s); err != nil {
						return err
					}
				}
				if _, err := conn.HandShake(ctx, &r.mine[0]); err != nil {
					return fmt.Errorf(errXchg, err)
				}
			}
			var rep perftest.BWReport
			var err error
			if role == perftest.Server {
				if rep, err = r.bwServerSend(s); err != nil {
					return err
				}
			} else {
				if err := r.bwClient(s); err != nil {
					return err
				}
				rep = r.bwReport(s)
			}
			fmt.Fprint(out, perftest.FormatBW(rep, nil, c.Gbits))
			if c.All {
				if _, err := conn.HandShake(ctx, &r.mine[0]); err != nil {
					return fmt.Errorf(errXchg, err)
				}
			}
		}
		fmt.Fprint(out, perftest.ResultLine)
		if _, err := conn.Finish(ctx, c.Test, &r.mine[0], perftest.BWReport{}); err != nil {
			return fmt.Errorf(errClose, err)
		}
	case (c.Test == perftest.ReadLat || c.Test == perftest.AtomicLat) && role == perftest.Server:
		// read_lat.c: the server closes at once and prints only the separator.
		if _, err := conn.Finish(ctx, c.Test, &r.mine[0], perftest.BWReport{}); err != nil {
			return fmt.Errorf(errClose, err)
		}
	default:
		if err := r.measureLat(ctx, conn, out, sizes); err != nil {
			return err
		}
	}
	if !c.Test.BW() {
		fmt.Fprint(out, perftest.ResultLine)
	}
	return nil
}

// measureLat runs the latency tests (write_lat.c, send_lat.c, and the client of read_lat.c
// and atomic_lat.c).
func (r *perfRes) measureLat(ctx context.Context, conn perfExchanger, out io.Writer, sizes []int) error {
	c := r.c
	if c.Duration != 0 {
		fmt.Fprint(out, perftest.HeaderLatDur)
	} else {
		fmt.Fprint(out, perftest.HeaderLat)
	}
	for k, s := range sizes {
		var err error
		switch c.Test {
		case perftest.WriteLat:
			err = r.measure(r.latWrite, s)
		case perftest.SendLat:
			if k > 0 {
				if err := r.postRecvs(s); err != nil {
					return err
				}
				if _, err := conn.HandShake(ctx, &r.mine[0]); err != nil {
					return fmt.Errorf(errXchg, err)
				}
			}
			err = r.measure(r.latSend, s)
		default:
			err = r.measure(r.latReadAtomic, s)
		}
		if err != nil {
			return fmt.Errorf("Test exited with Error: %w", err)
		}
		line, err := r.latLine(s)
		if err != nil {
			return err
		}
		fmt.Fprint(out, line)
	}
	if c.Test != perftest.WriteLat {
		if _, err := conn.Finish(ctx, c.Test, &r.mine[0], perftest.BWReport{}); err != nil {
			return fmt.Errorf(errClose, err)
		}
		return nil
	}
	conn.Close()
	// ib_write_lat exits without a closing exchange; the peer may still be waiting for the
	// ACK of its last WRITE, which our responder sent from its receive path already. Give a
	// lost ACK one retransmission round before the device goes.
	time.Sleep(50 * time.Millisecond)
	return nil
}

// measureDuplex runs a bidirectional BW test (-b): both sides measure at once, exchange
// their reports and print their sum (write_bw.c, read_bw.c, atomic_bw.c: every side runs
// run_iter_bw, synchronised before each size and, with -a, after it; send_bw.c: run_iter_bi
// with the receives of each size posted before its sync, and in the duration mode no
// exchange: each side prints its own count of both directions). --report-both adds each
// side's own line.
func (r *perfRes) measureDuplex(ctx context.Context, conn perfExchanger, out io.Writer, sizes []int) error {
	c := r.c
	send := c.Verb == "send"
	fmt.Fprint(out, perftest.BWHeader(c.Gbits))
	var mine, theirs perftest.BWReport
	for k, s := range sizes {
		if send && k > 0 {
			if err := r.postRecvs(s); err != nil {
				return err
			}
		}
		if !send || k > 0 { // send_bw.c's first sync is the last round of the setup
			if _, err := conn.HandShake(ctx, &r.mine[0]); err != nil {
				return fmt.Errorf(errSync, err)
			}
		}
		var err error
		if send {
			mine, err = r.bwBi(s)
		} else {
			err = r.bwClient(s)
			mine = r.bwReport(s)
		}
		if err != nil {
			return fmt.Errorf("Failed to complete run_iter_bw function successfully: %w", err)
		}
		if !send && c.All { // perftest 4.6 and later: a sync after each size
			if _, err := conn.HandShake(ctx, &r.mine[0]); err != nil {
				return fmt.Errorf(errSync, err)
			}
		}
		if send && c.Duration != 0 {
			fmt.Fprint(out, perftest.FormatBW(mine, nil, c.Gbits))
		} else {
			if theirs, err = conn.ExchangeBWReport(ctx, mine); err != nil {
				return fmt.Errorf(errXchg, err)
			}
			fmt.Fprint(out, perftest.FormatBW(mine, &theirs, c.Gbits))
		}
		if send && c.All {
			if _, err := conn.HandShake(ctx, &r.mine[0]); err != nil {
				return fmt.Errorf(errXchg, err)
			}
		}
	}
	if c.ReportBoth && !c.All {
		for _, p := range []struct {
			title string
			rep   perftest.BWReport
		}{{"Local", mine}, {"Remote", theirs}} {
			fmt.Fprint(out, perftest.ResultLine)
			fmt.Fprintf(out, "\n %s results: \n", p.title)
			fmt.Fprint(out, perftest.ResultLine)
			fmt.Fprint(out, perftest.BWHeader(c.Gbits))
			fmt.Fprint(out, perftest.FormatBW(p.rep, nil, c.Gbits))
		}
	}
	fmt.Fprint(out, perftest.ResultLine)
	if _, err := conn.CloseExchange(ctx, &r.mine[0]); err != nil {
		return fmt.Errorf(errClose, err)
	}
	return nil
}
