// Package perf is `softroce perf`: perftest's ib_{send,write,read,atomic}_{bw,lat} (perftest 6.06 as Debian 12
// ships it in perftest 4.5+0.17), wire-compatible with them: the TCP 18515 exchange of
// internal/oob/perftest, the same QP attributes, the same message flows (perftest_resources.c
// run_iter_bw, run_iter_bw_server, run_iter_lat_write, run_iter_lat_send, run_iter_lat) and
// the same result tables.
//
//	softroce perf send|write|read|atomic [--lat] [flags]           server
//	softroce perf send|write|read|atomic [--lat] [flags] SERVER    client
//
// --loopback keeps the former in-process tool (two devices in this process, no exchange;
// loopback.go). Softroce differences: -d names a local address or interface (see
// internal/tools/cli), every exchange step and every wait for a completion is bounded (--timeout,
// --run-timeout) where perftest waits forever, and a process waits for completions on the CQ's
// channel instead of spinning a core (--busy-poll spins first, as perftest does).
package perf

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"time"

	"github.com/spf13/pflag"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/oob/perftest"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/internal/tools/cli"
)

// Command is `softroce perf`.
var Command = cli.Command{
	Name:    "perf",
	Summary: "perftest-compatible ib_{send,write,read,atomic}_{bw,lat} (TCP 18515 exchange; --loopback: in-process)",
	Main:    Main,
}

// perftest's limits and defaults (perftest_parameters.h).
const (
	perfDefSizeBW     = 65536   // DEF_SIZE_BW
	perfDefSizeLat    = 2       // DEF_SIZE_LAT
	perfSizeAtomic    = 8       // DEF_SIZE_ATOMIC
	perfDefItersBW    = 5000    // DEF_ITERS_WB
	perfDefItersLat   = 1000    // DEF_ITERS
	perfMinIters      = 5       // MIN_ITER
	perfDefTxBW       = 128     // DEF_TX_BW
	perfDefTxLat      = 1       // DEF_TX_LAT
	perfDefRxSend     = 512     // DEF_RX_SEND
	perfDefRxRDMA     = 1       // DEF_RX_RDMA
	perfUCMaxRx       = 16000   // UC_MAX_RX
	perfDefCQMod      = 100     // DEF_CQ_MOD
	perfMaxSize       = 8388608 // MAX_SIZE (also the largest -a size, 2^23)
	perfCQModLimit    = 8192    // MSG_SIZE_CQ_MOD_LIMIT: larger messages signal every WR
	perfNoPeakIters   = 20000   // more iterations than this disable the peak (as perftest)
	perfMaxQPs        = 64      // softroce's bound on -q
	perfDefOutReads   = 128     // rxe's max_qp_rd_atom, what perftest's out_reads becomes on rxe
	perfAtomicAddVal  = 1       // ATOMIC_ADD_VALUE
	perfAtomicSwapVal = 0       // ATOMIC_SWAP_VALUE
)

// Errors of the perf command (wrapped with details).
var (
	// errPerfUsage: bad command line.
	errPerfUsage = cli.ErrUsage
	// ErrUnsupported: a perftest option softroce does not implement.
	ErrUnsupported     = errors.New("not supported by softroce perf")
	errPerfUnsupported = ErrUnsupported
	// errPerfTimeout: a wait (connection, completion, the peer's data) exceeded its bound.
	errPerfTimeout = cli.ErrTimeout
	// errPerfVerbs: a verbs call failed.
	errPerfVerbs = errors.New("verbs")
	// errPerfPeer: the peer's records cannot be used.
	errPerfPeer = errors.New("bad remote address")
)

// perfWCError is a completion with an error status (NOTIFY_COMP_ERROR_SEND/RECV).
type perfWCError struct {
	Recv bool
	WC   cq.WC
}

func (e *perfWCError) Error() string {
	kind := "Send"
	if e.Recv {
		kind = "Receive"
	}
	return fmt.Sprintf("Completion with error at %s side: status %s (%d), wr_id %d", kind, e.WC.Status, int(e.WC.Status), e.WC.WRID)
}

// Config is a parsed perf command line.
type Config struct {
	// Verb is send, write, read or atomic; Lat selects the latency test.
	Verb string
	Lat  bool
	Test perftest.Test
	// Server is the host to connect to; empty means server mode.
	Server string
	Port   int // -p: TCP port of the exchange
	Dev    cli.DevFlag
	Size   int    // -s (the largest size with -a)
	All    bool   // -a: sizes 2, 4, ... 2^23
	Iters  int    // -n
	MTU    qp.MTU // -m (0 = the port's active MTU)
	// GIDIndex is -x: with -d IFNAME the GID of that index in the interface's table (cli.DevOptions). -1 = not given.
	GIDIndex int
	QPs      int    // -q
	Atomic   string // -A: CMP_AND_SWAP or FETCH_AND_ADD
	TxDepth  int    // -t
	RxDepth  int    // -r
	CQMod    int    // -Q
	NoPeak   bool   // -N
	OutReads int    // -o
	Inline   int    // -I (banner only: softroce copies inline data like any other)
	// Conn is -c: RC, UC (write and send tests) or UD (send tests).
	Conn qp.Type
	// Duplex is -b: both sides measure, each with its own requester (BW tests).
	Duplex bool
	// ReportBoth is --report-both: with -b, the local and the remote results on their own too.
	ReportBoth bool
	// Duration is -D: measure for this long instead of -n iterations, counting only between
	// Margin (-f) after the start and Margin before the end; 0 = iterations.
	Duration, Margin time.Duration
	QPTimeout        uint8 // -u: the QPs' local ACK timeout (IBTA 9.7.6.1.3: 4.096 us * 2^QPTimeout)
	SL               uint8 // -S: the service level of the address vector (not on the wire with RoCE)
	Gbits            bool  // --report_gbits
	Events           bool  // -e: sleep on CQ events (softroce's default anyway)
	BusyPoll         bool  // --busy-poll: spin before sleeping (perftest's polling)
	Timeout          time.Duration
	RunTimeout       time.Duration
	RocePort         uint16
	Portable         bool
	XDP              bool // --xdp: the link's AF_XDP path (afxdp.Options)
	XDPNoPairs       bool // --xdp-no-pairs: that path's [request, ACK] pairs as two frames (afxdp.Options.NoPairs)
	DM               bool // --dm: the buffer in device memory, whose WRITEs the XDP program executes (Device.AllocDM)
	// Loopback runs both ends in this process (the former tool); Mem uses the in-memory link.
	Loopback, Mem bool
	// CPUProfile, if set, is where a pprof CPU profile of the run is written.
	CPUProfile string
	// RDMACM is -R: the exchange and the data QPs over rdma_cm (cm.go).
	RDMACM bool
	// Stats prints the device's and its link's counters to stderr at the end (--stats).
	Stats bool
	// SelectiveRepeat is --selective-repeat: the RC QPs use selective repeat instead of
	// go-back-N (qp.Attr.SelectiveRepeat). With -R the CM negotiates it (the data QPs have it
	// when the peer is softroce given the flag too); without, the peer must be softroce given
	// the same flag (the TCP exchange's fixed format has no room to negotiate it).
	SelectiveRepeat bool
	// CC is --cc: the embedded device's congestion control (docs/congestion.md).
	CC cli.CCFlag
	// Daemon is --daemon SOCKET: run through the softroce daemon (its device and address)
	// instead of an embedded device (verbs.go).
	Daemon string
	// Procs is --procs: GOMAXPROCS for a two-process run (perfProcs). Main applies it and
	// CPUProfile: they are the process's.
	Procs int

	// Log receives what perf writes besides its report: --stats (nil: discarded).
	Log io.Writer
	// Listener, if set, is used by the server instead of listening on -p (tests).
	Listener net.Listener
}

// perfConfig is the name the run's code uses for Config.
type perfConfig = Config

// perfTest maps the verb and --lat to the perftest tool.
func perfTest(verb string, lat bool) perftest.Test {
	t := map[string]perftest.Test{"write": perftest.WriteBW, "read": perftest.ReadBW, "send": perftest.SendBW, "atomic": perftest.AtomicBW}[verb]
	if lat {
		t = map[string]perftest.Test{"write": perftest.WriteLat, "read": perftest.ReadLat, "send": perftest.SendLat, "atomic": perftest.AtomicLat}[verb]
	}
	return t
}

// perfProcs is the GOMAXPROCS a two-process run sets (0: leave it): --procs if given, else 1
// unless the environment sets GOMAXPROCS. One P, like perftest's single thread: the receive
// goroutine and the posting loop take turns on one OS thread instead of handing work between
// two Ps, whose spinning and stealing (futex wakes, usleeps, context switches) cost more CPU
// than they save when two perf processes share two cores (docs/performance.md, "Tried and not kept": 64 KiB
// WRITE +20-30%, 64 B +10-150% in interleaved runs).
func perfProcs(flag int, env string) int {
	switch {
	case flag >= 0:
		return flag
	case env != "":
		return 0
	}
	return 1
}

// Main is the command: exit status 0 on success, 1 on any error (as perftest, which returns
// FAILURE for bad options too), 0 for -h and -V.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return main(ctx, args, stdout, stderr, true, nil)
}

// main is Main; setProcs applies --procs (tests running both sides in one process leave
// GOMAXPROCS alone), seams, if set, adjusts the parsed Config (tests).
func main(ctx context.Context, args []string, stdout, stderr io.Writer, setProcs bool, seams func(*Config)) int {
	c, err := parseArgs(args)
	switch {
	case errors.Is(err, pflag.ErrHelp):
		Usage(stdout, args)
		return 0
	case errors.Is(err, errVersion):
		fmt.Fprintf(stdout, "Version: %s\n", perftest.Version)
		return 0
	case err != nil:
		fmt.Fprintf(stderr, "perf: %v\n", err)
		if errors.Is(err, errPerfUsage) {
			fmt.Fprintln(stderr, "usage: softroce perf send|write|read|atomic [--lat] [options] [SERVER]   (server when no SERVER; -h for options)")
		}
		return 1
	}
	c.Log = stderr
	if seams != nil {
		seams(c)
	}
	if c.CPUProfile != "" {
		f, err := os.Create(c.CPUProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintf(stderr, "perf: --cpuprofile: %v\n", err)
			return 1
		}
		defer func() {
			pprof.StopCPUProfile()
			f.Close()
		}()
	}
	if n := perfProcs(c.Procs, os.Getenv("GOMAXPROCS")); n > 0 && setProcs && !c.Loopback {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(n))
	}
	if err := Run(ctx, *c, stdout); err != nil {
		fmt.Fprintf(stderr, "perf: %v\n", err)
		return 1
	}
	return 0
}

// Run runs one side of the test c describes (both sides with c.Loopback), writing perftest's
// report to out.
func Run(ctx context.Context, c Config, out io.Writer) error {
	if c.Log == nil {
		c.Log = io.Discard
	}
	switch {
	case c.Loopback:
		return perfLoopback(&c, out)
	case c.RDMACM:
		return perfRunCM(ctx, &c, out)
	}
	return perfRun(ctx, &c, out)
}
