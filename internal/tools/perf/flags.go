package perf

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/softroce/softroce/internal/oob"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/internal/tools/cli"
)

// The perf command line: perftest's options (perftest_parameters.c parser, the getopt string
// "w:y:p:d:i:m:s:n:t:u:S:x:c:q:I:o:M:r:Q:A:l:D:f:B:T:L:E:J:j:K:k:X:W:aFegzRvhbNVCHUOZP" and
// its long options) read in GNU getopt style (cli.NewFlagSet), plus softroce's own long
// options. Options perftest has and softroce does not implement are refused by name
// (ErrUnsupported) rather than as unknown.

// errVersion is parseArgs' answer to -V (perftest prints its version and exits).
var errVersion = errors.New("version requested")

// sizeValue is -s as perftest reads it (perftest_parameters.c case 's'): a trailing K
// multiplies by 1024, M by 1024*1024, and the rest is read by strtol(optarg, NULL, 0), which
// stops at the first character that is not part of the number ("12abc" is 12); the size
// must then be 1..UINT_MAX/2.
type sizeValue int

func (s *sizeValue) String() string { return strconv.Itoa(int(*s)) }
func (s *sizeValue) Type() string   { return "size" }
func (s *sizeValue) Set(v string) error {
	f := int64(1)
	switch {
	case strings.HasSuffix(v, "K"):
		f, v = 1024, v[:len(v)-1]
	case strings.HasSuffix(v, "M"):
		f, v = 1024*1024, v[:len(v)-1]
	}
	n := cli.Strtol(v, 0) * f
	if n < 1 || n > 1<<31-1 {
		return fmt.Errorf("Message Size should be between 1 and %d", 1<<31-1)
	}
	*s = sizeValue(n)
	return nil
}

// flags are the command line's values before parseArgs checks them.
type flags struct {
	Config
	size                                                     sizeValue
	iters, mtu, tx, rx, cqMod, outReads, inline, ibPort, dur int
	qpTimeout, sl, margin                                    int
	rocePort                                                 uint
	cpuFreq, bidir, version                                  bool
	conn                                                     string
	unsupported                                              *cli.Unsupported
}

// newFlagSet defines perf's options on f.
func newFlagSet(f *flags) *pflag.FlagSet {
	fs := cli.NewFlagSet("perf")
	// perftest's options, its help text
	fs.BoolVarP(&f.All, "all", "a", false, "Run sizes from 2 till 2^23")
	fs.BoolVarP(&f.bidir, "bidirectional", "b", false, "Measure bidirectional bandwidth (default unidirectional)")
	fs.StringVarP(&f.conn, "connection", "c", "RC", "Connection type RC/UC/UD (default RC)")
	fs.VarP(&f.Dev, "ib-dev", "d", "Use IB device <dev> (softroce: the local ADDR|IFNAME whose address is the RoCE GID)")
	fs.IntVarP(&f.dur, "duration", "D", 0, "Run test for a customized period of `seconds`.")
	fs.IntVarP(&f.margin, "margin", "f", -1, "measure results within margins. (default=2sec)")
	fs.BoolVar(&f.ReportBoth, "report-both", false, "Report RX & TX results separately on Bidirectional BW tests")
	fs.BoolVarP(&f.Events, "events", "e", false, "Sleep on CQ events (default poll)")
	fs.BoolVarP(&f.cpuFreq, "CPU-freq", "F", false, "Do not show a warning even if cpufreq_ondemand module is loaded, and cpu-freq is not on max.")
	fs.IntVarP(&f.ibPort, "ib-port", "i", 1, "Use port `port` of IB device (default 1; softroce devices have port 1 only)")
	fs.IntVarP(&f.inline, "inline_size", "I", 0, "Max `size` of message to be sent in inline")
	fs.IntVarP(&f.mtu, "mtu", "m", 0, "MTU size : 256 - 4096 (default port mtu)")
	fs.IntVarP(&f.iters, "iters", "n", 0, "Number of exchanges (at least 5, default 5000 for BW, 1000 for latency)")
	fs.BoolVarP(&f.NoPeak, "noPeak", "N", false, "Cancel peak-bw calculation (default with peak up to iters=20000)")
	fs.IntVarP(&f.outReads, "outs", "o", 0, "`num` of outstanding read/atom (default max of device)")
	fs.IntVarP(&f.Port, "port", "p", oob.DefaultPort, "Listen on/connect to `port` (default 18515)")
	fs.IntVarP(&f.QPs, "qp", "q", 1, "Num of qp's (default 1)")
	fs.IntVarP(&f.cqMod, "cq-mod", "Q", 0, "Generate Cqe only after <--cq-mod> completion")
	fs.IntVarP(&f.rx, "rx-depth", "r", 0, "Rx queue `size` (default 512). If using srq, rx-depth controls max-wr size of the srq")
	fs.BoolVarP(&f.RDMACM, "rdma_cm", "R", false, "Connect QPs with rdma_cm and run test on those QPs (BW tests; server: needs -d, or --daemon)")
	fs.VarP(&f.size, "size", "s", "Size of message to exchange (default 65536 for BW, 2 for latency; K and M suffixes)")
	fs.IntVarP(&f.sl, "sl", "S", 0, "SL (default 0)")
	fs.IntVarP(&f.tx, "tx-depth", "t", 0, "Size of tx queue (default 128 for BW, 1 for latency)")
	fs.IntVarP(&f.qpTimeout, "qp-timeout", "u", perfQPTimeout, "QP timeout, timeout value is 4 usec * 2 ^(timeout), default 14")
	fs.BoolVarP(&f.version, "version", "V", false, "Display version number")
	fs.IntVarP(&f.GIDIndex, "gid-index", "x", -1, "Test uses GID with GID `index` (with -d IFNAME: the interface's GID of that index, as kernel rxe lists them; with -d ADDR: the address's own)")
	fs.StringVarP(&f.Atomic, "atomic_type", "A", "FETCH_AND_ADD", "`type` of atomic operation from {CMP_AND_SWAP,FETCH_AND_ADD}")
	fs.BoolVar(&f.Gbits, "report_gbits", false, "Report Max/Average BW of test in Gbit/sec (instead of MiB/sec)")
	// softroce's own
	fs.BoolVar(&f.Lat, "lat", false, "softroce: run the latency test (ib_*_lat) instead of bandwidth (ib_*_bw)")
	fs.BoolVar(&f.BusyPoll, "busy-poll", false, "softroce: poll completions in a loop (yielding) before sleeping on the CQ, as perftest does")
	fs.DurationVar(&f.Timeout, "timeout", 30*time.Second, "softroce: bound of the connection and of every exchange step")
	fs.DurationVar(&f.RunTimeout, "run-timeout", 10*time.Minute, "softroce: bound of the measurement (each wait for the peer or a completion, and a server's wait for the client's run)")
	fs.UintVar(&f.rocePort, "roce-port", 4791, "softroce: RoCE UDP `port`")
	fs.BoolVar(&f.Portable, "portable", false, "softroce: plain UDP sockets instead of sendmmsg/recvmmsg")
	fs.BoolVar(&f.XDP, "xdp", false, "softroce: the link's AF_XDP path (root, IPv4; active MTU at most 2048; docs/link.md)")
	fs.BoolVar(&f.DM, "dm", false, "softroce, with --xdp: the buffer in device memory (ibv_alloc_dm): the XDP program executes and ACKs small RDMA WRITEs into it, as kernel rxe does in the sender's softirq (docs/api.md)")
	fs.BoolVar(&f.XDPNoPairs, "xdp-no-pairs", false, "softroce, with --xdp: send a WRITE and the ACK it carries as two ring frames, not one GSO frame (docs/link.md)")
	fs.BoolVar(&f.Loopback, "loopback", false, "softroce: both ends in this process (127.0.0.1 <-> 127.0.0.2), no exchange")
	fs.BoolVar(&f.Mem, "mem", false, "softroce: with --loopback, the in-memory link instead of UDP")
	fs.StringVar(&f.CPUProfile, "cpuprofile", "", "softroce: write a pprof CPU profile of the run to `file`")
	fs.IntVar(&f.Procs, "procs", -1, "softroce: `GOMAXPROCS` of the run (default: 1, like perftest's one thread, unless the GOMAXPROCS environment variable is set; 0: Go's default; --loopback keeps Go's default)")
	fs.BoolVar(&f.Stats, "stats", false, "softroce: print the device's and the link's counters to stderr at the end")
	fs.BoolVar(&f.SelectiveRepeat, "selective-repeat", false, "softroce: RC selective repeat instead of go-back-N (docs/reliability.md). With -R the CM negotiates it: the data QPs have it when the peer is softroce given it too, else go-back-N (a note on stderr); without -R give it on both sides: the peer must be softroce with the same flag, as perftest's TCP exchange cannot negotiate it (RC, not with --loopback or --daemon)")
	fs.StringVar(&f.Daemon, "daemon", "", "softroce: run through the softroce daemon listening on unix `socket` (its device; -d picks one of its addresses)")
	fs.Var(&f.CC, "cc", cli.CCUsage)
	// perftest's options softroce refuses by name
	u := cli.NewUnsupported(fs)
	for _, o := range []struct{ short, long string }{
		{"l", "post_list"}, {"L", "hop_limit"}, {"M", "MGID"}, {"T", "tos"}, {"w", "limit_bw"},
		{"y", "limit_msgrate"}, {"W", "report-counters"}, {"X", "vector"}, {"B", "source_mac"}, {"E", "dest_mac"},
		{"J", "dest_ip"}, {"j", "source_ip"}, {"K", "dest_port"}, {"k", "source_port"}, {"Y", "ethertype"},
	} {
		u.Value(o.short, o.long, "")
	}
	for _, o := range []struct{ short, long string }{
		{"C", "report-cycles"}, {"H", "report-histogrm"}, {"U", "report-unsorted"}, {"g", "mcg"}, {"z", "comm_rdma_cm"},
		{"O", "dualport"}, {"Z", "server"}, {"P", "client"}, {"v", "mac_fwd"}, {"G", "use_rss"},
	} {
		u.Bool(o.short, o.long, "")
	}
	for _, n := range []string{"force-link", "remote_mac", "local_mac", "remote_ip", "local_ip", "remote_port", "local_port",
		"pkey_index", "inline_recv", "burst_size", "typical_pkt_size", "rate_limit", "rate_limit_type", "rate_units", "output",
		"out_json_file", "latency_gap", "flow_label", "retry_count", "mmap", "mmap-offset", "dlid", "tclass", "wait_destroy",
		"flows", "flows_burst", "reply_every", "vlan_pcp", "recv_post_list"} {
		u.Value("", n, "")
	}
	for _, n := range []string{"run_infinitely", "use-srq", "reversed", "tcp", "cpu_util", "out_json",
		"dont_xchg_versions", "ipv6", "raw_ipv6", "report-per-port", "odp", "use_hugepages", "use_old_post_send", "promiscuous",
		"raw_mcast", "mr_per_qp", "perform_warm_up", "vlan_en", "disable_pcie_relaxed", "use_ooo"} {
		u.Bool("", n, "")
	}
	f.unsupported = u
	return fs
}

// Usage writes the command's usage and options (those of the test args name).
func Usage(w io.Writer, args []string) {
	fmt.Fprintln(w, "Usage:")
	fmt.Fprintln(w, "  softroce perf send|write|read|atomic [--lat] [options]          start a server and wait for connection")
	fmt.Fprintln(w, "  softroce perf send|write|read|atomic [--lat] [options] <host>   connect to server at <host>")
	fmt.Fprintln(w, "\nOptions:")
	cli.PrintFlags(w, newFlagSet(&flags{}))
}

// ParseArgs parses "send|write|read|atomic [options] [SERVER]" as perftest's getopt_long
// reads its command line (options and SERVER in any order), and applies perftest's defaults
// and forced dependencies.
func ParseArgs(args []string) (Config, error) {
	c, err := parseArgs(args)
	if err != nil {
		return Config{}, err
	}
	return *c, nil
}

func parseArgs(args []string) (*Config, error) {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			return nil, pflag.ErrHelp
		}
		return nil, fmt.Errorf("%w: name the test: send, write, read or atomic", errPerfUsage)
	}
	f := &flags{}
	f.Verb, args = args[0], args[1:]
	switch f.Verb {
	case "send", "write", "read", "atomic":
	default:
		return nil, fmt.Errorf("%w: unknown test %q (send, write, read or atomic)", errPerfUsage, f.Verb)
	}
	fs := newFlagSet(f)
	if err := cli.Parse(fs, args); err != nil {
		return nil, err
	}
	if f.version {
		return nil, errVersion
	}
	c := &f.Config
	positional := fs.Args()
	switch {
	case f.unsupported.Given() != "":
		return nil, fmt.Errorf("%s is %w", f.unsupported.Given(), errPerfUnsupported)
	case len(positional) > 1:
		return nil, fmt.Errorf("%w: more than one SERVER argument: %q", errPerfUsage, positional)
	case fs.Changed("duration") && f.dur <= 0:
		return nil, fmt.Errorf("%w: -D: Duration period must be positive", errPerfUsage)
	case fs.Changed("margin") && f.margin < 0:
		return nil, fmt.Errorf("%w: -f: Margin must be non-negative", errPerfUsage)
	case f.bidir && c.Lat:
		return nil, fmt.Errorf("%w: -b: Bidirectional is only available in BW test", errPerfUsage)
	case c.RDMACM && c.Lat:
		return nil, fmt.Errorf("-R with the latency tests is %w: bandwidth only", errPerfUnsupported)
	case c.RDMACM && c.Loopback:
		return nil, fmt.Errorf("%w: -R and --loopback exclude each other", errPerfUsage)
	case c.RDMACM && len(positional) == 0 && !c.Dev.IsSet() && c.Daemon == "":
		return nil, fmt.Errorf("%w: -R server: name the local address with -d (softroce devices have one address)", errPerfUsage)
	case f.conn == "XRC" || f.conn == "DC" || f.conn == "SRD":
		return nil, fmt.Errorf("-c %s is %w: RC, UC or UD", f.conn, errPerfUnsupported)
	case f.conn != "RC" && f.conn != "UC" && f.conn != "UD":
		return nil, fmt.Errorf("%w: -c %s: Invalid Connection type. Please choose from {RC,UC,UD,XRC,DC,SRD}", errPerfUsage, f.conn)
	case f.conn == "UC" && (c.Verb == "read" || c.Verb == "atomic"):
		return nil, fmt.Errorf("%w: -c UC: UC connection not possible in READ/ATOMIC verbs", errPerfUsage)
	case f.conn == "UD" && c.Verb != "send":
		return nil, fmt.Errorf("%w: -c UD: UD connection only possible in SEND verb", errPerfUsage)
	case c.SelectiveRepeat && (f.conn != "RC" || c.Loopback || c.Daemon != ""):
		return nil, fmt.Errorf("--selective-repeat with -c UC/UD, --loopback or --daemon is %w", errPerfUnsupported)
	case (f.bidir || f.dur != 0 || f.conn != "RC") && (c.RDMACM || c.Loopback):
		return nil, fmt.Errorf("-b, -D and -c UC/UD with -R or --loopback are %w", errPerfUnsupported)
	case c.Port < 0 || c.Port > 65535:
		return nil, fmt.Errorf("%w: -p %d: not a TCP port", errPerfUsage, c.Port)
	case f.ibPort != 1:
		return nil, fmt.Errorf("%w: -i %d: softroce devices have one port, 1", errPerfUsage, f.ibPort)
	case f.sl < 0 || f.sl > 15:
		return nil, fmt.Errorf("%w: -S %d: Only 15 Service levels", errPerfUsage, f.sl)
	case f.qpTimeout < 0 || f.qpTimeout > 31:
		return nil, fmt.Errorf("%w: -u %d: QP timeout is 0..31", errPerfUsage, f.qpTimeout)
	case f.rocePort == 0 || f.rocePort > 65535:
		return nil, fmt.Errorf("%w: --roce-port %d", errPerfUsage, f.rocePort)
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
	case c.Lat && fs.Changed("qp"):
		return nil, fmt.Errorf("%w: Multiple QPs only available on bw tests", errPerfUsage)
	case c.Atomic != "CMP_AND_SWAP" && c.Atomic != "FETCH_AND_ADD":
		return nil, fmt.Errorf("%w: -A %s: CMP_AND_SWAP or FETCH_AND_ADD", errPerfUsage, c.Atomic)
	case fs.Changed("atomic_type") && c.Verb != "atomic":
		return nil, fmt.Errorf("%w: -A: You are not running the atomic_lat/bw test!", errPerfUsage)
	case fs.Changed("outs") && c.Verb != "read" && c.Verb != "atomic":
		return nil, fmt.Errorf("%w: -o: Setting Outstanding reads only available on READ verb", errPerfUsage)
	case fs.Changed("events") && c.Verb == "write":
		return nil, fmt.Errorf("%w: -e: Events feature not available on WRITE verb", errPerfUsage)
	case fs.Changed("inline_size") && (c.Verb == "read" || c.Verb == "atomic"):
		return nil, fmt.Errorf("%w: -I: Inline feature not available on READ/Atomic verbs", errPerfUsage)
	case fs.Changed("rx-depth") && c.Verb != "send" && f.rx > perfDefRxRDMA:
		return nil, fmt.Errorf("%w: -r: On RDMA verbs rx depth can be only 1", errPerfUsage)
	case fs.Changed("noPeak") && c.Lat:
		return nil, fmt.Errorf("%w: -N: NoPeak only valid for BW tests", errPerfUsage)
	}
	// perftest's CHECK_VALUE_IN_RANGE bounds of the values given
	for _, r := range []struct {
		name, what string
		v, lo, hi  int
	}{
		{"iters", "Iteration num", f.iters, perfMinIters, 100000000},
		{"tx-depth", "Tx depth", f.tx, 1, 15000},
		{"rx-depth", " Rx depth", f.rx, 1, 16384},
		{"cq-mod", "CQ moderation", f.cqMod, 1, 1024},
		{"inline_size", "Max inline", f.inline, 0, 912},
		{"gid-index", "Gid index", c.GIDIndex, 0, 64},
		{"outs", "Outstanding Reads", f.outReads, 0, 1 << 30},
	} {
		if fs.Changed(r.name) && (r.v < r.lo || r.v > r.hi) {
			return nil, fmt.Errorf("%w: %s should be between %d and %d", errPerfUsage, r.what, r.lo, r.hi)
		}
	}
	if err := perfCheckDaemon(c, fs); err != nil {
		return nil, err
	}
	if len(positional) == 1 {
		c.Server = positional[0]
	}
	c.RocePort, c.Inline = uint16(f.rocePort), f.inline
	c.QPTimeout, c.SL = uint8(f.qpTimeout), uint8(f.sl)
	c.Test = perfTest(c.Verb, c.Lat)
	c.Duplex = f.bidir
	c.Conn = map[string]qp.Type{"RC": qp.TypeRC, "UC": qp.TypeUC, "UD": qp.TypeUD}[f.conn]
	// the duration mode (force_dependecies): the margin defaults to a quarter of it, which
	// must leave a sample; no peak, no -a, no events
	duration, margin := 5, f.margin // DEF_DURATION when -D is not given
	if f.dur != 0 {
		duration = f.dur
		if margin < 0 {
			margin = duration / 4
		}
		switch {
		case c.All:
			return nil, fmt.Errorf("%w: -D: Duration mode currently doesn't support running on all sizes.", errPerfUsage)
		case c.Events:
			return nil, fmt.Errorf("%w: -D: Duration mode doesn't work with events.", errPerfUsage)
		}
		c.Duration, c.Margin = time.Duration(duration)*time.Second, time.Duration(margin)*time.Second
	}
	if duration <= 2*margin {
		return nil, fmt.Errorf("%w: please check that DURATION > 2*MARGIN", errPerfUsage)
	}

	// perftest's defaults and force_dependecies (perftest_parameters.c).
	bw := !c.Lat
	size := int(f.size)
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
	c.Iters = f.iters
	if c.Iters == 0 {
		c.Iters = perfDefItersLat
		if bw {
			c.Iters = perfDefItersBW
		}
	}
	c.TxDepth = f.tx
	if c.TxDepth == 0 {
		c.TxDepth = perfDefTxLat
		if bw {
			c.TxDepth = perfDefTxBW
		}
	}
	if c.Duration == 0 { // force_dependecies, ITERATIONS
		c.TxDepth = min(c.TxDepth, c.Iters)
	}
	c.RxDepth = f.rx
	if c.RxDepth == 0 {
		c.RxDepth = perfDefRxRDMA
		if c.Verb == "send" {
			c.RxDepth = perfDefRxSend
		}
	}
	if c.Verb == "send" && c.Duration == 0 {
		c.RxDepth = min(c.RxDepth, c.Iters)
		if c.Conn != qp.TypeRC && c.RxDepth == perfDefRxSend {
			// no RNR NAK on UC/UD: every message has its receive posted before
			c.RxDepth = min(c.Iters, perfUCMaxRx)
		}
	}
	if c.Verb == "send" && c.RxDepth%2 == 1 && !c.All {
		c.RxDepth++ // perftest's "WA for a bug when rx_depth is odd in SEND"
	}
	c.CQMod = f.cqMod
	if c.CQMod == 0 {
		c.CQMod = perfDefCQMod
		if c.Size > perfCQModLimit && c.Conn != qp.TypeUD && !c.All && !c.Events {
			c.CQMod = 1
		}
	}
	c.CQMod = min(c.CQMod, c.TxDepth)
	if c.Duration != 0 || (c.Verb == "send" && bw && c.Server == "" && !c.Duplex) {
		c.NoPeak = true
	}
	if bw && c.Iters > perfNoPeakIters {
		c.NoPeak = true
	}
	c.OutReads = f.outReads
	if c.OutReads == 0 || c.OutReads > perfDefOutReads {
		c.OutReads = perfDefOutReads
	}
	if f.mtu != 0 {
		m := qp.MTUFromBytes(f.mtu)
		if !m.Valid() || m.Bytes() != f.mtu {
			return nil, fmt.Errorf("%w: -m %d: MTU must be 256, 512, 1024, 2048 or 4096", errPerfUsage, f.mtu)
		}
		c.MTU = m
	}
	if c.Loopback && c.Server != "" {
		return nil, fmt.Errorf("%w: --loopback takes no SERVER", errPerfUsage)
	}
	return c, nil
}
