// Package stats is `softroce stats`: the transport counters with kernel rxe's names
// (rxe_hw_counters.c, shown by `rdma statistic show link rxe0/1`), from a JSON snapshot file,
// from a running daemon (--daemon SOCKET, live), or from an in-process demo run over a lossy
// in-memory network (--demo). See docs/reliability.md.
package stats

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/internal/tools/cli"
	"github.com/softroce/softroce/internal/tools/demo"
	"github.com/softroce/softroce/pkg/client"
	"github.com/softroce/softroce/pkg/link/fault"
	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/roce"
)

// Command is `softroce stats`.
var Command = cli.Command{
	Name:    "stats",
	Summary: "transport counters (rxe names): from a JSON snapshot, --daemon SOCKET (live), or --demo over a lossy link",
	Main:    Main,
}

// rxeCounterOrder is rxe's order (enum rxe_counters); softroce's own
// counters follow, sorted.
var rxeCounterOrder = []string{
	"sent_pkts", "rcvd_pkts", "duplicate_request", "out_of_seq_request", "rcvd_rnr_err",
	"send_rnr_err", "rcvd_seq_err", "ack_deferred", "retry_exceeded_err", "retry_rnr_exceeded_err",
	"completer_retry_err", "send_err", "link_downed", "rdma_sends", "rdma_recvs",
}

// Snapshot is the JSON form of one device's counters (what
// `softroce stats --demo --write FILE` writes and `softroce stats FILE`
// reads; a file holds one snapshot or an array of them).
type Snapshot struct {
	Device   string            `json:"device"`
	Port     int               `json:"port"`
	Time     time.Time         `json:"time"`
	Counters map[string]uint64 `json:"counters"`
}

func snapshotOf(d *roce.Device) Snapshot {
	return Snapshot{Device: d.Name(), Port: 1, Time: time.Now().UTC(), Counters: d.Stats().Map()}
}

// counterNames returns the snapshot's counter names: rxe's first, in
// rxe's order, then the others sorted.
func counterNames(m map[string]uint64) []string {
	var out, extra []string
	known := map[string]bool{}
	for _, n := range rxeCounterOrder {
		known[n] = true
		if _, ok := m[n]; ok {
			out = append(out, n)
		}
	}
	for n := range m {
		if !known[n] {
			extra = append(extra, n)
		}
	}
	sort.Strings(extra)
	return append(out, extra...)
}

// printStats writes s as `rdma statistic show` does ("link DEV/PORT" then
// name value pairs) in one line, or one counter per line with pretty.
func printStats(w io.Writer, s Snapshot, pretty bool) {
	names := counterNames(s.Counters)
	if !pretty {
		var b strings.Builder
		fmt.Fprintf(&b, "link %s/%d", s.Device, s.Port)
		for _, n := range names {
			fmt.Fprintf(&b, " %s %d", n, s.Counters[n])
		}
		fmt.Fprintln(w, b.String())
		return
	}
	fmt.Fprintf(w, "link %s/%d\n", s.Device, s.Port)
	for _, n := range names {
		fmt.Fprintf(w, "    %-24s %d\n", n, s.Counters[n])
	}
}

// readSnapshots parses a file holding one snapshot or an array.
func readSnapshots(b []byte) ([]Snapshot, error) {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '[' {
		var out []Snapshot
		if err := json.Unmarshal(b, &out); err != nil {
			return nil, err
		}
		return out, nil
	}
	var s Snapshot
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, err
	}
	if s.Counters == nil {
		return nil, errors.New("no \"counters\" object")
	}
	return []Snapshot{s}, nil
}

// Config is a parsed stats command line: one of File, Demo or Daemon.
type Config struct {
	// File is a JSON snapshot file to print.
	File string
	// Demo runs RC traffic between two in-process devices over a lossy in-memory network.
	Demo bool
	// Rounds, Faults and Seed configure the demo; Write, if set, is where its snapshots go.
	Rounds int
	Faults fault.DirOptions
	Seed   uint64
	Write  string
	// Daemon is the socket of a running daemon whose live counters are printed, Count
	// snapshots (0: until interrupted) Interval apart.
	Daemon   string
	Interval time.Duration
	Count    int
	// Pretty prints one counter per line; JSON prints the snapshots as JSON.
	Pretty, JSON bool
	// Log receives the demo's summary line (nil: discarded).
	Log io.Writer
}

// flags are the command line's values before ParseArgs checks them.
type flags struct {
	Config
	faults string
}

func newFlagSet(f *flags) *pflag.FlagSet {
	fs := cli.NewFlagSet("stats")
	fs.BoolVarP(&f.Pretty, "pretty", "p", false, "one counter per line")
	fs.BoolVarP(&f.JSON, "json", "j", false, "print the snapshots as JSON")
	fs.BoolVar(&f.Demo, "demo", false, "run RC traffic between two in-process devices over a lossy in-memory network, then print their counters")
	fs.IntVar(&f.Rounds, "rounds", 100, "demo: `rounds` of WRITE 64 KiB, READ 64 KiB, SEND 4 KiB and FETCH_ADD, each verified")
	fs.StringVar(&f.faults, "faults", "drop=0.1,dup=0.05,reorder=0.05,corrupt=0.01", "demo: send faults of each device (`spec`: fault.ParseDirOptions syntax)")
	fs.Uint64Var(&f.Seed, "seed", 1, "demo: fault injector `seed`")
	fs.StringVar(&f.Write, "write", "", "demo: also write the snapshots as JSON to this `file`")
	fs.StringVar(&f.Daemon, "daemon", "", "live counters of the daemon listening on this unix `socket`")
	fs.DurationVar(&f.Interval, "interval", time.Second, "daemon: `time` between snapshots")
	fs.IntVar(&f.Count, "count", 1, "daemon: `number` of snapshots (0 = until interrupted)")
	return fs
}

// Usage writes the command's usage and options.
func Usage(w io.Writer) {
	fmt.Fprintln(w, "usage: softroce stats [-p] [--json] FILE.json")
	fmt.Fprintln(w, "       softroce stats --demo [--rounds N] [--faults SPEC] [--seed N] [--write FILE] [-p] [--json]")
	fmt.Fprintln(w, "       softroce stats --daemon SOCKET [--interval DUR] [--count N] [-p] [--json]")
	fmt.Fprintln(w, "\nPrints transport counters with kernel rxe's names (as `rdma statistic show link rxe0/1`),")
	fmt.Fprintln(w, "plus softroce's own (rcvd_dropped, rcvd_gso_split, rcvd_icrc_solved, retransmitted_pkts; selective repeat:")
	fmt.Fprintln(w, "sent_sack, rcvd_sack, selective_retrans_pkts)")
	fmt.Fprintln(w, "and mlx5's congestion control ones (np_ecn_marked_roce_packets, np_cnp_sent, rp_cnp_handled, rp_cnp_ignored).")
	fmt.Fprintln(w, "\nOptions:")
	cli.PrintFlags(w, newFlagSet(&flags{}))
}

// ParseArgs parses the stats command line (GNU getopt style, cli.NewFlagSet).
func ParseArgs(args []string) (Config, error) {
	var f flags
	fs := newFlagSet(&f)
	if err := cli.Parse(fs, args); err != nil {
		return Config{}, err
	}
	c := f.Config
	switch {
	case c.Daemon != "" && !c.Demo && fs.NArg() == 0:
		if c.Interval <= 0 || c.Count < 0 {
			return c, fmt.Errorf("%w: --interval must be > 0 and --count >= 0", cli.ErrUsage)
		}
	case c.Demo && c.Daemon == "" && fs.NArg() == 0:
		dir, err := fault.ParseDirOptions(f.faults)
		if err != nil {
			return c, fmt.Errorf("%w: --faults: %w", cli.ErrUsage, err)
		}
		if c.Rounds < 1 {
			return c, fmt.Errorf("%w: --rounds must be >= 1", cli.ErrUsage)
		}
		c.Faults = dir
	case !c.Demo && c.Daemon == "" && fs.NArg() == 1:
		c.File = fs.Arg(0)
	default:
		return c, fmt.Errorf("%w: name one FILE, or --demo, or --daemon SOCKET", cli.ErrUsage)
	}
	return c, nil
}

// Main is the command: exit status 0, 1 on an error, 2 for a bad command line.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := ParseArgs(args)
	if errors.Is(err, pflag.ErrHelp) {
		Usage(stdout)
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "stats: %v\n", err)
		if errors.Is(err, cli.ErrUsage) {
			Usage(stderr)
		}
		return 2
	}
	c.Log = stderr
	if err := Run(ctx, c, stdout); err != nil {
		fmt.Fprintf(stderr, "stats: %v\n", err)
		return 1
	}
	return 0
}

// Run prints the counters c names.
func Run(ctx context.Context, c Config, out io.Writer) error {
	if c.Daemon != "" {
		return runDaemon(ctx, c, out)
	}
	var snaps []Snapshot
	if c.Demo {
		log := c.Log
		if log == nil {
			log = io.Discard
		}
		var err error
		if snaps, err = runDemo(log, demoOptions{Rounds: c.Rounds, Faults: c.Faults, Seed: c.Seed}); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		if c.Write != "" {
			b, _ := json.MarshalIndent(snaps, "", "  ")
			if err := os.WriteFile(c.Write, append(b, '\n'), 0o644); err != nil {
				return err
			}
		}
	} else {
		b, err := os.ReadFile(c.File)
		if err != nil {
			return err
		}
		if snaps, err = readSnapshots(b); err != nil {
			return fmt.Errorf("%s: %w", c.File, err)
		}
	}
	if c.JSON {
		b, _ := json.MarshalIndent(snaps, "", "  ")
		fmt.Fprintln(out, string(b))
		return nil
	}
	for _, s := range snaps {
		printStats(out, s, c.Pretty)
	}
	return nil
}

// runDaemon prints c.Count snapshots of the daemon's device counters and its own
// (proto.Debug.Counters: refusals over limits, bad posts, dropped events), c.Interval apart.
func runDaemon(ctx context.Context, c Config, out io.Writer) error {
	cl, err := client.Dial(c.Daemon)
	if err != nil {
		return err
	}
	defer cl.Close()
	tick := time.NewTicker(c.Interval)
	defer tick.Stop()
	for i := 0; c.Count == 0 || i < c.Count; i++ {
		if i > 0 {
			select {
			case <-tick.C:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		d, err := cl.Debug() // (and liveness: the daemon is still there)
		if err != nil {
			return err
		}
		s := Snapshot{Device: cl.Name(), Port: 1, Time: time.Now().UTC(), Counters: cl.Stats().Map()}
		for k, v := range d.Counters() { // the daemon's own: refusals over limits, ...
			s.Counters[k] = v
		}
		if c.JSON {
			b, _ := json.Marshal(s)
			fmt.Fprintln(out, string(b))
			continue
		}
		printStats(out, s, c.Pretty)
	}
	return nil
}

// demoOptions configure runDemo.
type demoOptions struct {
	Rounds int
	Faults fault.DirOptions
	Seed   uint64
}

// runDemo runs verified RC traffic in both directions between two
// devices whose sends go through the fault injector, and returns both
// devices' counters. A summary goes to log.
func runDemo(log io.Writer, o demoOptions) ([]Snapshot, error) {
	nw := mem.NewNetwork(mem.Options{QueueDepth: 8192})
	open := func(addr string, name string, seed2 uint64) (*roce.Device, *fault.Link, error) {
		l, err := nw.Attach(netip.MustParseAddr(addr))
		if err != nil {
			return nil, nil, err
		}
		fl := fault.Wrap(l, fault.Options{Seed1: o.Seed, Seed2: seed2, Send: o.Faults})
		d, err := roce.Open(roce.Options{Link: fl, Name: name})
		if err != nil {
			fl.Close()
		}
		return d, fl, err
	}
	da, fa, err := open("198.18.0.1", "softroce0", 1)
	if err != nil {
		return nil, err
	}
	defer da.Close()
	db, fb, err := open("198.18.0.2", "softroce1", 2)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	const size = 64 << 10
	a, err := demo.NewEnd(da, 4*size)
	if err != nil {
		return nil, err
	}
	b, err := demo.NewEnd(db, 4*size)
	if err != nil {
		return nil, err
	}
	if err := statsConnect(a, b); err != nil {
		return nil, err
	}
	start := time.Now()
	var bytes uint64
	for r := 0; r < o.Rounds; r++ {
		x, y := a, b
		if r%2 == 1 {
			x, y = b, a
		}
		n, err := statsRound(x, y, r, size)
		if err != nil {
			return nil, fmt.Errorf("round %d: %w", r, err)
		}
		bytes += n
	}
	fs := func(s fault.Stats) string {
		return fmt.Sprintf("dropped %d duplicated %d reordered %d corrupted %d of %d",
			s.Send.Dropped, s.Send.Duplicated, s.Send.Reordered, s.Send.Corrupted, s.Send.Seen)
	}
	fmt.Fprintf(log, "demo: %d messages, %d bytes verified in %v; faults %s: %s; %s: %s\n",
		4*o.Rounds, bytes, time.Since(start).Round(time.Millisecond), da.Name(), fs(fa.Stats()), db.Name(), fs(fb.Stats()))
	return []Snapshot{snapshotOf(da), snapshotOf(db)}, nil
}

// statsConnect is demo.Connect with an ACK timeout for an in-process link
// (code 10, 4.2 ms) so losses are recovered quickly.
func statsConnect(a, b *demo.End) error {
	acc := mr.AccessLocalWrite | mr.AccessRemoteWrite | mr.AccessRemoteRead | mr.AccessRemoteAtomic
	up := func(e, peer *demo.End, rq, sq uint32) error {
		for _, s := range []struct {
			a qp.Attr
			m qp.AttrMask
		}{
			{qp.Attr{State: qp.StateInit, Port: 1, AccessFlags: acc}, qp.AttrState | qp.AttrPKeyIndex | qp.AttrPort | qp.AttrAccessFlags},
			{qp.Attr{State: qp.StateRTR, AH: qp.AHAttr{DGID: peer.Addr, SGIDIndex: uint8(e.Dev.GIDIndex(e.Addr)), Port: 1}, PathMTU: qp.MTU1024,
				DestQPN: peer.QP.Num(), RQPSN: rq, MaxDestRDAtomic: 16, MinRNRTimer: 1},
				qp.AttrState | qp.AttrAV | qp.AttrPathMTU | qp.AttrDestQPN | qp.AttrRQPSN | qp.AttrMaxDestRDAtomic | qp.AttrMinRNRTimer},
			{qp.Attr{State: qp.StateRTS, SQPSN: sq, Timeout: 10, RetryCnt: 7, RNRRetry: 7, MaxRDAtomic: 16},
				qp.AttrState | qp.AttrSQPSN | qp.AttrTimeout | qp.AttrRetryCnt | qp.AttrRNRRetry | qp.AttrMaxQPRDAtomic},
		} {
			if err := e.QP.Modify(&s.a, s.m); err != nil {
				return err
			}
		}
		return nil
	}
	if err := up(a, b, 0xFFFF00, 0x100); err != nil {
		return err
	}
	return up(b, a, 0x100, 0xFFFF00)
}

// statsRound runs WRITE, READ, SEND (posted before its receive, so an RNR
// NAK may come first) and FETCH_ADD from x to y, checking data and
// results; it returns the bytes moved.
func statsRound(x, y *demo.End, r, size int) (uint64, error) {
	// x: [0,size) source, [size,2size) READ target; y: [0,size) WRITE
	// target, [size,2size) READ source, [2size,3size) receive buffer,
	// 3size: the FETCH_ADD word.
	demo.FillPattern(x.Buf[:size], byte(r))
	demo.FillPattern(y.Buf[size:2*size], byte(r+100))
	clear(x.Buf[size : 2*size])
	before := binary.LittleEndian.Uint64(y.Buf[3*size:])
	wrs := []qp.SendWR{
		{WRID: 1, Opcode: qp.WRRDMAWrite, SGL: []qp.SGE{x.SGE(0, size)}, Flags: qp.SendSignaled, RemoteAddr: y.VA(0), RKey: y.MR.RKey()},
		{WRID: 2, Opcode: qp.WRRDMARead, SGL: []qp.SGE{x.SGE(size, size)}, Flags: qp.SendSignaled, RemoteAddr: y.VA(size), RKey: y.MR.RKey()},
		{WRID: 3, Opcode: qp.WRSend, SGL: []qp.SGE{x.SGE(0, 4096)}, Flags: qp.SendSignaled},
		{WRID: 4, Opcode: qp.WRAtomicFetchAndAdd, SGL: []qp.SGE{x.SGE(2*size, 8)}, Flags: qp.SendSignaled,
			RemoteAddr: y.VA(3 * size), RKey: y.MR.RKey(), CompareAdd: uint64(r) + 1},
	}
	if _, err := x.QP.PostSend(wrs); err != nil {
		return 0, err
	}
	if _, err := y.QP.PostRecv([]qp.RecvWR{{WRID: 9, SGL: []qp.SGE{y.SGE(2*size, 4096)}}}); err != nil {
		return 0, err
	}
	if _, err := demo.Wait(x.SCQ, 4); err != nil {
		return 0, err
	}
	if _, err := demo.Wait(y.RCQ, 1); err != nil {
		return 0, err
	}
	if !bytes.Equal(y.Buf[:size], x.Buf[:size]) {
		return 0, errors.New("WRITE data differs")
	}
	if !bytes.Equal(x.Buf[size:2*size], y.Buf[size:2*size]) {
		return 0, errors.New("READ data differs")
	}
	if !bytes.Equal(y.Buf[2*size:2*size+4096], x.Buf[:4096]) {
		return 0, errors.New("SEND data differs")
	}
	if got := binary.LittleEndian.Uint64(x.Buf[2*size:]); got != before {
		return 0, fmt.Errorf("FETCH_ADD returned %d, want %d", got, before)
	}
	if got := binary.LittleEndian.Uint64(y.Buf[3*size:]); got != before+uint64(r)+1 {
		return 0, fmt.Errorf("FETCH_ADD word %d, want %d (applied twice?)", got, before+uint64(r)+1)
	}
	return uint64(2*size + 4096 + 8), nil
}
