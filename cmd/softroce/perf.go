package main

// softroce perf: perftest's ib_{send,write,read,atomic}_{bw,lat} (perftest 6.06 as Debian 12
// ships it in perftest 4.5+0.17), wire-compatible with them: the TCP 18515 exchange of
// internal/oob/perftest, the same QP attributes, the same message flows (perftest_resources.c
// run_iter_bw, run_iter_bw_server, run_iter_lat_write, run_iter_lat_send, run_iter_lat) and
// the same result tables.
//
//	softroce perf send|write|read|atomic [--lat] [flags]           server
//	softroce perf send|write|read|atomic [--lat] [flags] SERVER    client
//
// --loopback keeps the former in-process tool (two devices in this process, no exchange;
// perf_loopback.go). Softroce differences: -d names a local address or interface (see
// internal/tools/cli), every exchange step and every wait for a completion is bounded (--timeout,
// --run-timeout) where perftest waits forever, and a process waits for completions on the CQ's
// channel instead of spinning a core (--busy-poll spins first, as perftest does).

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/oob"
	"github.com/softroce/softroce/internal/oob/perftest"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/internal/tools/cli"
)

func init() {
	register(&command{
		name:    "perf",
		summary: "perftest-compatible ib_{send,write,read,atomic}_{bw,lat} (TCP 18515 exchange; --loopback: in-process)",
		run:     runPerf,
	})
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
	errPerfUsage = errors.New("usage")
	// errPerfUnsupported: a perftest option softroce does not implement.
	errPerfUnsupported = errors.New("not supported by softroce perf")
	// errPerfTimeout: a wait (connection, completion, the peer's data) exceeded its bound.
	errPerfTimeout = errors.New("timed out")
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

// perfConfig is a parsed perf command line.
type perfConfig struct {
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
	// GIDIndex is -x (accepted; the GID is the -d address). -1 = not given.
	GIDIndex   int
	QPs        int    // -q
	Atomic     string // -A: CMP_AND_SWAP or FETCH_AND_ADD
	TxDepth    int    // -t
	RxDepth    int    // -r
	CQMod      int    // -Q
	NoPeak     bool   // -N
	OutReads   int    // -o
	Inline     int    // -I (banner only: softroce copies inline data like any other)
	Gbits      bool   // --report_gbits
	Events     bool   // -e: sleep on CQ events (softroce's default anyway)
	BusyPoll   bool   // --busy-poll: spin before sleeping (perftest's polling)
	Timeout    time.Duration
	RunTimeout time.Duration
	RocePort   uint16
	Portable   bool
	XDP        bool // --xdp: the link's AF_XDP path (link.XDPOptions)
	XDPNoPairs bool // --xdp-no-pairs: that path's [request, ACK] pairs as two frames (XDPOptions.NoPairs)
	DM         bool // --dm: the buffer in device memory, whose WRITEs the XDP program executes (Device.AllocDM)
	// Loopback runs both ends in this process (the former tool); Mem uses the in-memory link.
	Loopback, Mem bool
	// CPUProfile, if set, is where a pprof CPU profile of the run is written.
	CPUProfile string
	// RDMACM is -R: the exchange and the data QPs over rdma_cm (perf_cm.go).
	RDMACM bool
	// Stats prints the device's and its link's counters to stderr at the end (--stats).
	Stats bool
	// Daemon is --daemon SOCKET: run through the softroce daemon (its device and address)
	// instead of an embedded device (perf_verbs.go).
	Daemon string
	// Procs is --procs: GOMAXPROCS for a two-process run (perfProcs).
	Procs int
}

// parsePerf parses "send|write|read|atomic [flags] [SERVER]" (flags and SERVER in any
// order, as getopt permutes them).
func parsePerf(args []string, stderr io.Writer) (*perfConfig, error) {
	c := &perfConfig{Port: oob.DefaultPort, GIDIndex: -1, QPs: 1, Atomic: "FETCH_AND_ADD", Timeout: 30 * time.Second,
		RunTimeout: 10 * time.Minute, RocePort: 4791}
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return nil, fmt.Errorf("%w: name the test: send, write, read or atomic", errPerfUsage)
	}
	c.Verb, args = args[0], args[1:]
	switch c.Verb {
	case "send", "write", "read", "atomic":
	default:
		return nil, fmt.Errorf("%w: unknown test %q (send, write, read or atomic)", errPerfUsage, c.Verb)
	}
	fs := flag.NewFlagSet("perf "+c.Verb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		size, iters, mtu, tx, rx, cqMod, outReads, inline, ibPort, dur int
		rocePort                                                       uint
		cpuFreq, bidir                                                 bool
		conn                                                           string
	)
	both := func(short, long string, bind func(string)) { bind(short); bind(long) }
	both("p", "port", func(n string) { fs.IntVar(&c.Port, n, c.Port, "listen on/connect to TCP `port`") })
	both("d", "ib-dev", func(n string) { fs.Var(&c.Dev, n, "local `ADDR|IFNAME` (softroce: the RoCE address)") })
	both("i", "ib-port", func(n string) { fs.IntVar(&ibPort, n, 1, "device `port` (softroce devices have port 1 only)") })
	both("s", "size", func(n string) {
		fs.IntVar(&size, n, 0, "message `size` (default 65536 for BW, 2 for latency, 8 for atomics)")
	})
	both("n", "iters", func(n string) { fs.IntVar(&iters, n, 0, "`iterations` (>= 5; default 5000 for BW, 1000 for latency)") })
	both("m", "mtu", func(n string) { fs.IntVar(&mtu, n, 0, "path MTU `bytes` (default: the port's active MTU)") })
	both("x", "gid-index", func(n string) { fs.IntVar(&c.GIDIndex, n, -1, "GID `index` (accepted; the GID is the -d address)") })
	both("F", "CPU-freq", func(n string) { fs.BoolVar(&cpuFreq, n, false, "ignore CPU frequency warnings (accepted)") })
	both("q", "qp", func(n string) { fs.IntVar(&c.QPs, n, 1, "number of `QPs` (BW tests)") })
	both("a", "all", func(n string) { fs.BoolVar(&c.All, n, false, "run sizes 2 to 2^23") })
	both("A", "atomic_type", func(n string) {
		fs.StringVar(&c.Atomic, n, c.Atomic, "`type` of atomic: CMP_AND_SWAP or FETCH_AND_ADD")
	})
	both("t", "tx-depth", func(n string) { fs.IntVar(&tx, n, 0, "send queue `depth` (default 128 for BW, 1 for latency)") })
	both("r", "rx-depth", func(n string) { fs.IntVar(&rx, n, 0, "receive queue `depth` (SEND tests; default 512)") })
	both("Q", "cq-mod", func(n string) {
		fs.IntVar(&cqMod, n, 0, "generate a completion every `N` sends (default 100; 1 above 8 KiB)")
	})
	both("N", "noPeak", func(n string) { fs.BoolVar(&c.NoPeak, n, false, "do not compute the peak bandwidth") })
	both("o", "outs", func(n string) {
		fs.IntVar(&outReads, n, 0, "outstanding READ/atomic `requests` (default: the device's 128)")
	})
	both("I", "inline_size", func(n string) { fs.IntVar(&inline, n, 0, "max inline `size` (banner only)") })
	both("e", "events", func(n string) { fs.BoolVar(&c.Events, n, false, "sleep on CQ events instead of polling") })
	both("D", "duration", func(n string) { fs.IntVar(&dur, n, 0, "run for `seconds` (not supported)") })
	both("b", "bidirectional", func(n string) { fs.BoolVar(&bidir, n, false, "bidirectional (not supported)") })
	both("R", "rdma_cm", func(n string) {
		fs.BoolVar(&c.RDMACM, n, false, "connect the QPs and run the exchange over rdma_cm (BW tests; server: needs -d, or --daemon)")
	})
	both("c", "connection", func(n string) { fs.StringVar(&conn, n, "RC", "connection `type` (RC only)") })
	fs.BoolVar(&c.BusyPoll, "busy-poll", false, "softroce: poll completions in a loop (yielding) before sleeping on the CQ, as perftest does")
	fs.BoolVar(&c.Lat, "lat", false, "softroce: run the latency test (ib_*_lat) instead of bandwidth (ib_*_bw)")
	fs.BoolVar(&c.Gbits, "report_gbits", false, "report bandwidth in Gb/sec")
	fs.DurationVar(&c.Timeout, "timeout", c.Timeout, "softroce: bound of the connection and of every exchange step")
	fs.DurationVar(&c.RunTimeout, "run-timeout", c.RunTimeout, "softroce: bound of the measurement (each wait for the peer or a completion, and a server's wait for the client's run)")
	fs.UintVar(&rocePort, "roce-port", 4791, "softroce: RoCE UDP port")
	fs.BoolVar(&c.Portable, "portable", false, "softroce: plain UDP sockets instead of sendmmsg/recvmmsg")
	fs.BoolVar(&c.XDP, "xdp", false, "softroce: the link's AF_XDP path (root, IPv4; active MTU at most 2048; docs/link.md)")
	fs.BoolVar(&c.DM, "dm", false, "softroce, with --xdp: the buffer in device memory (ibv_alloc_dm): the XDP program executes and ACKs small RDMA WRITEs into it, as kernel rxe does in the sender's softirq (docs/api.md)")
	fs.BoolVar(&c.XDPNoPairs, "xdp-no-pairs", false, "softroce, with --xdp: send a WRITE and the ACK it carries as two ring frames, not one GSO frame (docs/link.md)")
	fs.BoolVar(&c.Loopback, "loopback", false, "softroce: both ends in this process (127.0.0.1 <-> 127.0.0.2), no exchange")
	fs.StringVar(&c.CPUProfile, "cpuprofile", "", "softroce: write a pprof CPU profile of the run to `file`")
	fs.IntVar(&c.Procs, "procs", -1, "softroce: `GOMAXPROCS` of the run (default: 1, like perftest's one thread, unless the GOMAXPROCS environment variable is set; 0: Go's default; --loopback keeps Go's default)")
	fs.BoolVar(&c.Stats, "stats", false, "softroce: print the device's and the link's counters to stderr at the end")
	fs.BoolVar(&c.Mem, "mem", false, "softroce: with --loopback, the in-memory link instead of UDP")
	fs.StringVar(&c.Daemon, "daemon", "", "softroce: run through the softroce daemon listening on unix `socket` (its device; -d picks one of its addresses)")

	var positional []string
	for rest := args; ; {
		if err := fs.Parse(rest); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			break
		}
		positional = append(positional, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	switch {
	case len(positional) > 1:
		return nil, fmt.Errorf("%w: more than one SERVER argument: %q", errPerfUsage, positional)
	case dur != 0:
		return nil, fmt.Errorf("-D (duration mode) is %w: use -n", errPerfUnsupported)
	case bidir:
		return nil, fmt.Errorf("-b (bidirectional) is %w", errPerfUnsupported)
	case c.RDMACM && c.Lat:
		return nil, fmt.Errorf("-R with the latency tests is %w: bandwidth only", errPerfUnsupported)
	case c.RDMACM && c.Loopback:
		return nil, fmt.Errorf("%w: -R and --loopback exclude each other", errPerfUsage)
	case c.RDMACM && len(positional) == 0 && !c.Dev.IsSet() && c.Daemon == "":
		return nil, fmt.Errorf("%w: -R server: name the local address with -d (softroce devices have one address)", errPerfUsage)
	case conn != "RC":
		return nil, fmt.Errorf("-c %s is %w: RC only", conn, errPerfUnsupported)
	case c.Port < 0 || c.Port > 65535:
		return nil, fmt.Errorf("%w: -p %d: not a TCP port", errPerfUsage, c.Port)
	case ibPort != 1:
		return nil, fmt.Errorf("%w: -i %d: softroce devices have one port, 1", errPerfUsage, ibPort)
	case rocePort == 0 || rocePort > 65535:
		return nil, fmt.Errorf("%w: --roce-port %d", errPerfUsage, rocePort)
	case c.XDPNoPairs && !c.XDP:
		return nil, fmt.Errorf("%w: --xdp-no-pairs needs --xdp", errPerfUsage)
	case c.DM && (!c.XDP || !c.BusyPoll):
		// the XDP program's WRITEs wake no sleeper (RemoteWriteNotify): the loops must poll
		return nil, fmt.Errorf("%w: --dm needs --xdp and --busy-poll", errPerfUsage)
	case c.XDP && (c.Portable || c.Loopback || c.Daemon != ""):
		return nil, fmt.Errorf("%w: --xdp is an embedded device's batched link: not with --portable, --loopback or --daemon", errPerfUsage)
	case c.Timeout <= 0 || c.RunTimeout <= 0:
		return nil, fmt.Errorf("%w: --timeout and --run-timeout must be positive", errPerfUsage)
	case c.QPs < 1 || c.QPs > perfMaxQPs:
		return nil, fmt.Errorf("%w: -q %d: 1..%d QPs", errPerfUsage, c.QPs, perfMaxQPs)
	case c.Lat && c.QPs != 1:
		return nil, fmt.Errorf("%w: latency tests use one QP", errPerfUsage)
	case c.Atomic != "CMP_AND_SWAP" && c.Atomic != "FETCH_AND_ADD":
		return nil, fmt.Errorf("%w: -A %s: CMP_AND_SWAP or FETCH_AND_ADD", errPerfUsage, c.Atomic)
	case tx < 0 || rx < 0 || cqMod < 0 || outReads < 0 || inline < 0 || size < 0 || iters < 0:
		return nil, fmt.Errorf("%w: negative value", errPerfUsage)
	}
	if err := perfCheckDaemon(c, fs); err != nil {
		return nil, err
	}
	if len(positional) == 1 {
		c.Server = positional[0]
	}
	c.RocePort, c.Inline = uint16(rocePort), inline
	c.Test = perfTest(c.Verb, c.Lat)

	// perftest's defaults and force_dependecies (perftest_parameters.c).
	bw := !c.Lat
	switch {
	case c.Verb == "atomic":
		if size != 0 && size != perfSizeAtomic {
			return nil, fmt.Errorf("%w: -s %d: message size cannot be changed for atomic tests", errPerfUsage, size)
		}
		if c.All {
			return nil, fmt.Errorf("%w: -a: atomic messages are 8 bytes", errPerfUsage)
		}
		c.Size = perfSizeAtomic
	case c.All:
		c.Size = perfMaxSize
	case size != 0:
		c.Size = size
	case bw:
		c.Size = perfDefSizeBW
	default:
		c.Size = perfDefSizeLat
	}
	if c.Size < 1 || c.Size > perfMaxSize {
		return nil, fmt.Errorf("%w: -s %d: size must be 1..%d", errPerfUsage, c.Size, perfMaxSize)
	}
	c.Iters = iters
	if c.Iters == 0 {
		c.Iters = perfDefItersLat
		if bw {
			c.Iters = perfDefItersBW
		}
	}
	if c.Iters < perfMinIters {
		return nil, fmt.Errorf("%w: -n %d: at least %d iterations", errPerfUsage, c.Iters, perfMinIters)
	}
	c.TxDepth = tx
	if c.TxDepth == 0 {
		c.TxDepth = perfDefTxLat
		if bw {
			c.TxDepth = perfDefTxBW
		}
	}
	c.TxDepth = min(c.TxDepth, c.Iters)
	c.RxDepth = rx
	if c.RxDepth == 0 {
		c.RxDepth = perfDefRxRDMA
		if c.Verb == "send" {
			c.RxDepth = perfDefRxSend
		}
	}
	if c.Verb == "send" {
		c.RxDepth = min(c.RxDepth, c.Iters)
	}
	c.CQMod = cqMod
	if c.CQMod == 0 {
		c.CQMod = perfDefCQMod
		if c.Size > perfCQModLimit && !c.All && !c.Events {
			c.CQMod = 1
		}
	}
	c.CQMod = min(c.CQMod, c.TxDepth)
	if bw && c.Iters > perfNoPeakIters {
		c.NoPeak = true
	}
	c.OutReads = outReads
	if c.OutReads == 0 || c.OutReads > perfDefOutReads {
		c.OutReads = perfDefOutReads
	}
	if mtu != 0 {
		m := qp.MTUFromBytes(mtu)
		if !m.Valid() || m.Bytes() != mtu {
			return nil, fmt.Errorf("%w: -m %d: MTU must be 256, 512, 1024, 2048 or 4096", errPerfUsage, mtu)
		}
		c.MTU = m
	}
	if c.Loopback && c.Server != "" {
		return nil, fmt.Errorf("%w: --loopback takes no SERVER", errPerfUsage)
	}
	return c, nil
}

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
// than they save when two perf processes share two cores (docs/performance.md, fast path: 64 KiB
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

// runPerf is the command.
func runPerf(args []string, stdout, stderr io.Writer) int {
	return perfMain(args, &perfEnv{Stdout: stdout, Stderr: stderr, SetProcs: true})
}

// perfMain parses args and runs; the exit status is 0 on success, 1 on any error (as
// perftest, which returns FAILURE for bad options too), 0 for -h.
func perfMain(args []string, env *perfEnv) int {
	c, err := parsePerf(args, env.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(env.Stderr, "perf: %v\n", err)
		if errors.Is(err, errPerfUsage) {
			fmt.Fprintln(env.Stderr, "usage: softroce perf send|write|read|atomic [--lat] [flags] [SERVER]   (server when no SERVER; -h for flags)")
		}
		return 1
	}
	if c.CPUProfile != "" {
		f, err := os.Create(c.CPUProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintf(env.Stderr, "perf: --cpuprofile: %v\n", err)
			return 1
		}
		defer func() {
			pprof.StopCPUProfile()
			f.Close()
		}()
	}
	if c.Loopback {
		return perfLoopback(c, env.Stdout, env.Stderr)
	}
	if n := perfProcs(c.Procs, os.Getenv("GOMAXPROCS")); n > 0 && env.SetProcs {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(n))
	}
	run := perfRun
	if c.RDMACM {
		run = perfRunCM
	}
	if err := run(c, env); err != nil {
		fmt.Fprintf(env.Stderr, "perf: %v\n", err)
		return 1
	}
	return 0
}
