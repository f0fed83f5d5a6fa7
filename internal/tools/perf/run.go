package perf

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sort"
	"strconv"

	"github.com/softroce/softroce/internal/oob"
	"github.com/softroce/softroce/internal/oob/perftest"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/internal/tools/cli"
)

// The perftest-compatible run of softroce perf: resources (perftest_resources.c ctx_init,
// create_mr, ctx_modify_qp_to_*), the out-of-band exchange (internal/oob/perftest) and the
// message flows of perftest 6.06:
//
//   - BW client (run_iter_bw): up to tx_depth WRs in flight per QP, every cq_mod-th WR (and
//     the last) signaled, each signaled completion counting cq_mod messages; local and remote
//     addresses advance by the message size rounded up to the cache line within the cycle
//     buffer (increase_loc_addr / increase_rem_addr) when the size fits twice in it.
//   - write/read/atomic BW server: nothing during the run (the target of one-sided
//     operations, IBTA 9.4.3-9.4.5); it prints the client's report (xchg_bw_reports).
//   - send BW server (run_iter_bw_server): rx_depth receives posted before the last sync,
//     one reposted per completion until iters were posted; its bandwidth runs from the first
//     receive completion to the last, without a peak.
//   - write latency (run_iter_lat_write): ping-pong of RDMA WRITEs; the SERVER writes
//     first; each side waits until the last byte of its receive area holds the iteration
//     number (mod 256) that the peer's WRITE carries, then writes its own.
//   - send latency (run_iter_lat_send): ping-pong of SENDs; the CLIENT sends first.
//   - read/atomic latency (run_iter_lat): the client issues one READ or atomic at a time; the
//     server only answers.
//
// Latency samples are the times between consecutive posts (tposted[i+1]-tposted[i]); write and
// send latency report half of them (print_report_lat).

const (
	// perfIOVA is where the buffer is registered (perftest uses the buffer's virtual address;
	// any page-aligned value will do for the peer).
	perfIOVA = 0x7f5a00000000
	// perfCycleBuffer is our cycle buffer (the page size, check_sys_data) and perfCacheLine
	// our cache line (DEF_CACHE_LINE_SIZE).
	perfCycleBuffer = 4096
	perfCacheLine   = 64
	// perfMinRNRTimer and perfQPTimeout are perftest's MIN_RNR_TIMER and DEF_QP_TIME; retry
	// counts are DEF_RETRY_COUNT (7) and rnr_retry 7 (IBTA 9.7.5.2.8: infinite).
	perfMinRNRTimer = 12
	perfQPTimeout   = 14
	perfRetryCount  = 7
	perfPollBatch   = 16 // CTX_POLL_BATCH
	// perfQKey is perftest's Q_Key of UD QPs (DEF_QKEY) and perfGRH the room a UD receive
	// leaves for the GRH (UD_ADDITION).
	perfQKey = 0x11111111
	perfGRH  = 40
	// perfSpinBW and perfSpinLat are how many yields a --busy-poll waiter polls before it
	// sleeps on the CQ channel. perftest always spins; on a shared 2-core machine a spinning
	// waiter starves the device goroutines of both processes (8-byte SEND latency: 247 us
	// typical spinning, 43 us sleeping), so by default a waiter sleeps at once.
	perfSpinBW  = 16
	perfSpinLat = 4000
)

// perfSizes returns the message sizes of the run: 2, 4, ... 2^23 with -a, else -s.
//
// A UD message is one packet (IBTA 9.8.5): with -c UD the sizes stop at mtu (check_mtu: a
// larger -s becomes the MTU; send_bw.c's -a runs 2 .. the MTU).
func perfSizes(c *perfConfig, mtu qp.MTU) []int {
	top := perfMaxSize
	if c.Conn == qp.TypeUD && mtu.Valid() {
		top = mtu.Bytes()
	}
	if !c.All {
		return []int{min(c.Size, top)}
	}
	var s []int
	for i := 1; i < 24 && 1<<i <= top; i++ {
		s = append(s, 1<<i)
	}
	return s
}

// perfRun runs one perftest side.
func perfRun(ctx context.Context, c *perfConfig, out io.Writer) (err error) {
	var (
		ld   *cli.VerbsDev
		r    *perfRes
		host netip.Addr
	)
	defer func() {
		if r != nil {
			err = errors.Join(err, r.close())
			if r.poller != nil {
				r.poller.close()
			}
		}
		if ld != nil {
			if c.Stats {
				if r != nil {
					fmt.Fprintf(c.Log, "stats: perf CQ polls with completions %d, sleeps on the CQ %d\n", r.polls, r.sleeps)
					r.printPhases(c.Log)
				}
				perfPrintStats(c.Log, ld)
			}
			err = errors.Join(err, ld.Close())
		}
	}()
	open := func(peer netip.Addr) error {
		var e error
		if ld, e = cli.OpenVerbs(c.Daemon, &c.Dev, cli.DevOptions{Port: c.RocePort, Portable: c.Portable, Peer: peer, GIDIndex: c.GIDIndex, ByGIDIndex: c.GIDIndex >= 0,
			BusyPoll: c.linkBusyPoll(), Polled: c.polled(), XDP: c.XDP, XDPNoPairs: c.XDPNoPairs, DM: c.dmBytes(),
			CC: c.CC.Params()}); e != nil {
			return e
		}
		if c.MTU != 0 && c.MTU > ld.MTU {
			return fmt.Errorf("%w: -m %d: requested MTU is larger than the port's active MTU %d", errPerfUsage, c.MTU.Bytes(), ld.MTU.Bytes())
		}
		r, e = newPerfRes(c, ld.V, ld.Addr, ld.GIDIndex)
		if r != nil && ld.Dev != nil && ld.Dev.Polled() {
			r.poller = newPerfPoller(ld.Dev)
			if c.Stats && c.Verb == "write" {
				r.phases = newPerfPhases(c.Iters)
			}
		}
		return e
	}
	if c.Verb == "read" || c.Verb == "atomic" {
		fmt.Fprint(out, perftest.ResultLine) // ctx_set_max_inline's separator
	}
	oo := perftest.Options{Options: oob.Options{Timeout: c.Timeout}, FinishTimeout: c.RunTimeout}
	var conn *perftest.Conn
	var tcpPeer netip.Addr
	if c.Server != "" {
		var e error
		if host, e = cli.ResolveHost(ctx, c.Server, c.Timeout); e != nil {
			return e
		}
		if e := open(host); e != nil {
			return e
		}
		tc, e := cli.Dial(ctx, netip.AddrPortFrom(host, uint16(c.Port)), c.Timeout)
		if e != nil {
			return fmt.Errorf("Couldn't connect to %v:%d: %w", host, c.Port, e)
		}
		tcpPeer = host
		conn = perftest.NewConn(tc, perftest.Client, oo)
	} else {
		ln := c.Listener
		if ln == nil {
			var e error
			if ln, e = net.Listen("tcp4", ":"+strconv.Itoa(c.Port)); e != nil {
				return fmt.Errorf("Couldn't listen to port %d: %w", c.Port, e)
			}
		}
		defer ln.Close()
		if c.Dev.IsSet() {
			if e := open(netip.Addr{}); e != nil {
				return e
			}
		}
		fmt.Fprint(out, perftest.WaitingBanner)
		actx, cancel := context.WithTimeout(ctx, c.Timeout)
		tc, e := oob.Accept(actx, ln)
		timedOut := actx.Err() != nil || errors.Is(e, os.ErrDeadlineExceeded)
		cancel()
		ln.Close()
		if e != nil {
			if timedOut {
				e = fmt.Errorf("%w: no client connected to port %d within %v", errPerfTimeout, c.Port, c.Timeout)
			}
			return fmt.Errorf("accept() failed: %w", e)
		}
		tcpPeer = cli.AddrOf(tc.RemoteAddr())
		if r == nil { // no -d: speak from the address the client reached
			if e := open(cli.AddrOf(tc.LocalAddr())); e != nil {
				tc.Close()
				return e
			}
		}
		conn = perftest.NewConn(tc, perftest.Server, oo)
	}
	defer conn.Close()
	mtu := c.MTU
	if mtu == 0 {
		mtu = ld.MTU
	}
	role := perftest.Client
	if c.Server == "" {
		role = perftest.Server
	}
	relax := "ON"
	if c.Test == perftest.WriteLat {
		relax = "OFF" // as ib_write_lat prints on rxe
	}
	banner := perftest.Banner{Test: c.Test, Role: role, Duplex: c.Duplex, Atomic: c.Atomic, Device: ld.V.Name(), QPs: c.QPs,
		Transport: "IB", Connection: c.conn().String(), LinkType: "Ethernet", PCIeRelaxOrder: relax, TXDepth: c.TxDepth,
		RXDepth: c.RxDepth, CQModeration: c.CQMod, MTU: perftest.MTU(mtu), GIDIndex: ld.GIDIndex,
		InlineSize: c.Inline, OutReads: int(r.mine[0].OutReads)}
	fmt.Fprint(out, banner.String())
	sizes := perfSizes(c, mtu)
	setup := &perftest.Setup{Test: c.Test, MTU: perftest.MTU(mtu), Local: r.mine,
		Connect: func(rem []perftest.Dest, m perftest.MTU) error {
			sizes = perfSizes(c, qp.MTU(m)) // the agreed MTU bounds a UD message
			return r.connect(rem, qp.MTU(m), tcpPeer)
		}}
	if c.Verb == "send" && (c.Lat || role == perftest.Server || c.Duplex) {
		setup.BeforeSync = func() error { return r.postRecvs(sizes[0]) }
	}
	sess, err := conn.Setup(ctx, setup)
	if err != nil {
		return fmt.Errorf("Failed to exchange data between server and clients: %w", err)
	}
	if int(sess.SysData.CycleBuffer) > r.area || sess.SysData.CacheLine > perfCacheLine {
		return fmt.Errorf("%w: peer's cycle buffer %d / cache line %d exceed ours", errPerfPeer, sess.SysData.CycleBuffer, sess.SysData.CacheLine)
	}
	r.cycle = int(sess.SysData.CycleBuffer)
	for _, d := range r.mine {
		fmt.Fprint(out, perftest.AddressLine(c.Test, perftest.Local, d, true))
	}
	for _, d := range r.rem {
		fmt.Fprint(out, perftest.AddressLine(c.Test, perftest.Remote, d, true))
	}
	fmt.Fprint(out, perftest.ResultLine)

	return perfMeasure(ctx, r, conn, role, out, sizes)
}

// perfPrintStats writes the device's non-zero counters and its link's counters (--stats).
// Through the daemon the counters are the daemon device's (every client's traffic) and the
// link's are not available.
func perfPrintStats(w io.Writer, vd *cli.VerbsDev) {
	m := vd.V.Stats().Map()
	keys := make([]string, 0, len(m))
	for k, v := range m {
		if v != 0 {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "stats: %s %d\n", k, m[k])
	}
	if vd.Dev == nil {
		fmt.Fprintf(w, "stats: through the daemon: the counters above are its device's, all clients together; no link counters\n")
		return
	}
	if s, ok := vd.Dev.LinkStats(); ok {
		fmt.Fprintf(w, "stats: link sent %d (%d sendmmsg, %d GSO messages), received %d (%d recv calls, %d GRO reads), drops %d, truncated %d, fallbacks %d, entropy sockets %d (%d ports fell back to the main socket)\n",
			s.Sent, s.SendBatches, s.UDP.GSOSends, s.Received, s.RecvBatches, s.UDP.GROReceives, s.Drops, s.Truncated, s.UDP.Fallbacks,
			s.UDP.EntropySockets, s.UDP.EntropyFallbacks)
		if x := s.XDP; x.Sent+x.Received+x.Fallbacks > 0 {
			off := ""
			if x.PairsOff > 0 {
				off = " (refused by the kernel: off)"
			}
			if x.Writes > 0 {
				off += fmt.Sprintf(", WRITEs executed by the XDP program %d", x.Writes)
			}
			fmt.Fprintf(w, "stats: link AF_XDP path sent %d, received %d, sends through the UDP socket %d, pairs as one GSO frame %d%s\n",
				x.Sent, x.Received, x.Fallbacks, x.Pairs, off)
		}
	}
}

// conn is -c's QP type (RC when the Config was not parsed from a command line).
func (c *perfConfig) conn() qp.Type {
	if c.Conn == 0 {
		return qp.TypeRC
	}
	return c.Conn
}

// area is one QP's half of the buffer (perftest's INC(size) of the largest message, at least
// the cycle buffer); bufferBytes the whole buffer (a send and a receive area per QP).
func (c *perfConfig) area() int {
	a := perfInc(max(c.Size, perfCycleBuffer))
	if c.Conn == qp.TypeUD {
		a += perfCacheLine // IF_UD_ADD: the GRH's room in a receive
	}
	return a
}
func (c *perfConfig) bufferBytes() int { return 2 * c.QPs * c.area() }

// dmBytes is the device memory a run needs (--dm: the buffer), 0 without.
func (c *perfConfig) dmBytes() int {
	if !c.DM {
		return 0
	}
	return c.bufferBytes()
}
