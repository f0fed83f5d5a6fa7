package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/fault"
	"github.com/softroce/softroce/pkg/roce"
)

// softroce stats: the transport counters with kernel rxe's names
// (rxe_hw_counters.c, shown by `rdma statistic show link rxe0/1`), from a
// JSON snapshot file or from an in-process demo run over a lossy
// in-memory network. There is no daemon yet; a live mode will read the
// daemon's devices. See docs/reliability.md.

func init() {
	register(&command{
		name:    "stats",
		summary: "transport counters (rxe names): from a JSON snapshot, or --demo over a lossy link",
		run:     runStats,
	})
}

// rxeCounterOrder is rxe's order (enum rxe_counters); softroce's own
// counters follow, sorted.
var rxeCounterOrder = []string{
	"sent_pkts", "rcvd_pkts", "duplicate_request", "out_of_seq_request", "rcvd_rnr_err",
	"send_rnr_err", "rcvd_seq_err", "ack_deferred", "retry_exceeded_err", "retry_rnr_exceeded_err",
	"completer_retry_err", "send_err", "link_downed", "rdma_sends", "rdma_recvs",
}

// StatsSnapshot is the JSON form of one device's counters (what
// `softroce stats --demo --write FILE` writes and `softroce stats FILE`
// reads; a file holds one snapshot or an array of them).
type StatsSnapshot struct {
	Device   string            `json:"device"`
	Port     int               `json:"port"`
	Time     time.Time         `json:"time"`
	Counters map[string]uint64 `json:"counters"`
}

func snapshotOf(d *roce.Device) StatsSnapshot {
	return StatsSnapshot{Device: d.Name(), Port: 1, Time: time.Now().UTC(), Counters: d.Stats().Map()}
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
func printStats(w io.Writer, s StatsSnapshot, pretty bool) {
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
func readSnapshots(b []byte) ([]StatsSnapshot, error) {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '[' {
		var out []StatsSnapshot
		if err := json.Unmarshal(b, &out); err != nil {
			return nil, err
		}
		return out, nil
	}
	var s StatsSnapshot
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, err
	}
	if s.Counters == nil {
		return nil, errors.New("no \"counters\" object")
	}
	return []StatsSnapshot{s}, nil
}

func runStats(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("stats", flag.ContinueOnError)
	fs.SetOutput(stderr)
	demo := fs.Bool("demo", false, "run RC traffic between two in-process devices over a lossy in-memory network, then print their counters")
	rounds := fs.Int("rounds", 100, "demo: rounds of WRITE 64 KiB, READ 64 KiB, SEND 4 KiB and FETCH_ADD, each verified")
	faults := fs.String("faults", "drop=0.1,dup=0.05,reorder=0.05,corrupt=0.01", "demo: send faults of each device (fault.ParseDirOptions syntax)")
	seed := fs.Uint64("seed", 1, "demo: fault injector seed")
	write := fs.String("write", "", "demo: also write the snapshots as JSON to this file")
	pretty := fs.Bool("p", false, "one counter per line")
	asJSON := fs.Bool("json", false, "print the snapshots as JSON")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: softroce stats [-p] [-json] FILE.json")
		fmt.Fprintln(stderr, "       softroce stats --demo [-rounds N] [-faults SPEC] [-seed N] [-write FILE] [-p] [-json]")
		fmt.Fprintln(stderr, "\nPrints transport counters with kernel rxe's names (as `rdma statistic show link rxe0/1`),")
		fmt.Fprintln(stderr, "plus softroce's own (rcvd_dropped, rcvd_gso_split, rcvd_icrc_solved, retransmitted_pkts).")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	var snaps []StatsSnapshot
	switch {
	case *demo && fs.NArg() == 0:
		dir, err := fault.ParseDirOptions(*faults)
		if err != nil {
			fmt.Fprintf(stderr, "stats: -faults: %v\n", err)
			return 2
		}
		if *rounds < 1 {
			fmt.Fprintln(stderr, "stats: -rounds must be >= 1")
			return 2
		}
		snaps, err = statsDemo(stderr, statsDemoOptions{Rounds: *rounds, Faults: dir, Seed: *seed})
		if err != nil {
			fmt.Fprintf(stderr, "stats: demo: %v\n", err)
			return 1
		}
		if *write != "" {
			b, _ := json.MarshalIndent(snaps, "", "  ")
			if err := os.WriteFile(*write, append(b, '\n'), 0o644); err != nil {
				fmt.Fprintf(stderr, "stats: %v\n", err)
				return 1
			}
		}
	case !*demo && fs.NArg() == 1:
		b, err := os.ReadFile(fs.Arg(0))
		if err != nil {
			fmt.Fprintf(stderr, "stats: %v\n", err)
			return 1
		}
		if snaps, err = readSnapshots(b); err != nil {
			fmt.Fprintf(stderr, "stats: %s: %v\n", fs.Arg(0), err)
			return 1
		}
	default:
		fs.Usage()
		return 2
	}
	if *asJSON {
		b, _ := json.MarshalIndent(snaps, "", "  ")
		fmt.Fprintln(stdout, string(b))
		return 0
	}
	for _, s := range snaps {
		printStats(stdout, s, *pretty)
	}
	return 0
}

// statsDemoOptions configure statsDemo.
type statsDemoOptions struct {
	Rounds int
	Faults fault.DirOptions
	Seed   uint64
}

// statsDemo runs verified RC traffic in both directions between two
// devices whose sends go through the fault injector, and returns both
// devices' counters. A summary goes to log.
func statsDemo(log io.Writer, o statsDemoOptions) ([]StatsSnapshot, error) {
	nw := link.NewMemNetwork(link.MemOptions{QueueDepth: 8192})
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
	a, err := newDemoEnd(da, 4*size)
	if err != nil {
		return nil, err
	}
	b, err := newDemoEnd(db, 4*size)
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
	return []StatsSnapshot{snapshotOf(da), snapshotOf(db)}, nil
}

// statsConnect is demoConnect with an ACK timeout for an in-process link
// (code 10, 4.2 ms) so losses are recovered quickly.
func statsConnect(a, b *demoEnd) error {
	acc := mr.AccessLocalWrite | mr.AccessRemoteWrite | mr.AccessRemoteRead | mr.AccessRemoteAtomic
	up := func(e, peer *demoEnd, rq, sq uint32) error {
		for _, s := range []struct {
			a qp.Attr
			m qp.AttrMask
		}{
			{qp.Attr{State: qp.StateInit, Port: 1, AccessFlags: acc}, qp.AttrState | qp.AttrPKeyIndex | qp.AttrPort | qp.AttrAccessFlags},
			{qp.Attr{State: qp.StateRTR, AH: qp.AHAttr{DGID: peer.addr, SGIDIndex: uint8(e.dev.GIDIndex(e.addr)), Port: 1}, PathMTU: qp.MTU1024,
				DestQPN: peer.qp.Num(), RQPSN: rq, MaxDestRDAtomic: 16, MinRNRTimer: 1},
				qp.AttrState | qp.AttrAV | qp.AttrPathMTU | qp.AttrDestQPN | qp.AttrRQPSN | qp.AttrMaxDestRDAtomic | qp.AttrMinRNRTimer},
			{qp.Attr{State: qp.StateRTS, SQPSN: sq, Timeout: 10, RetryCnt: 7, RNRRetry: 7, MaxRDAtomic: 16},
				qp.AttrState | qp.AttrSQPSN | qp.AttrTimeout | qp.AttrRetryCnt | qp.AttrRNRRetry | qp.AttrMaxQPRDAtomic},
		} {
			if err := e.qp.Modify(&s.a, s.m); err != nil {
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
func statsRound(x, y *demoEnd, r, size int) (uint64, error) {
	// x: [0,size) source, [size,2size) READ target; y: [0,size) WRITE
	// target, [size,2size) READ source, [2size,3size) receive buffer,
	// 3size: the FETCH_ADD word.
	fillPattern(x.buf[:size], byte(r))
	fillPattern(y.buf[size:2*size], byte(r+100))
	clear(x.buf[size : 2*size])
	before := binary.LittleEndian.Uint64(y.buf[3*size:])
	wrs := []qp.SendWR{
		{WRID: 1, Opcode: qp.WRRDMAWrite, SGL: []qp.SGE{x.sge(0, size)}, Flags: qp.SendSignaled, RemoteAddr: y.va(0), RKey: y.mr.RKey()},
		{WRID: 2, Opcode: qp.WRRDMARead, SGL: []qp.SGE{x.sge(size, size)}, Flags: qp.SendSignaled, RemoteAddr: y.va(size), RKey: y.mr.RKey()},
		{WRID: 3, Opcode: qp.WRSend, SGL: []qp.SGE{x.sge(0, 4096)}, Flags: qp.SendSignaled},
		{WRID: 4, Opcode: qp.WRAtomicFetchAndAdd, SGL: []qp.SGE{x.sge(2*size, 8)}, Flags: qp.SendSignaled,
			RemoteAddr: y.va(3 * size), RKey: y.mr.RKey(), CompareAdd: uint64(r) + 1},
	}
	if _, err := x.qp.PostSend(wrs); err != nil {
		return 0, err
	}
	if _, err := y.qp.PostRecv([]qp.RecvWR{{WRID: 9, SGL: []qp.SGE{y.sge(2*size, 4096)}}}); err != nil {
		return 0, err
	}
	if _, err := demoWait(x.scq, 4); err != nil {
		return 0, err
	}
	if _, err := demoWait(y.rcq, 1); err != nil {
		return 0, err
	}
	if !bytes.Equal(y.buf[:size], x.buf[:size]) {
		return 0, errors.New("WRITE data differs")
	}
	if !bytes.Equal(x.buf[size:2*size], y.buf[size:2*size]) {
		return 0, errors.New("READ data differs")
	}
	if !bytes.Equal(y.buf[2*size:2*size+4096], x.buf[:4096]) {
		return 0, errors.New("SEND data differs")
	}
	if got := binary.LittleEndian.Uint64(x.buf[2*size:]); got != before {
		return 0, fmt.Errorf("FETCH_ADD returned %d, want %d", got, before)
	}
	if got := binary.LittleEndian.Uint64(y.buf[3*size:]); got != before+uint64(r)+1 {
		return 0, fmt.Errorf("FETCH_ADD word %d, want %d (applied twice?)", got, before+uint64(r)+1)
	}
	return uint64(2*size + 4096 + 8), nil
}
