// Package pingpong is `softroce pingpong`: rdma-core's ibv_rc_pingpong, ibv_uc_pingpong, ibv_ud_pingpong and
// ibv_srq_pingpong (libibverbs/examples, v44 as Debian 12 ships it), wire-compatible with
// them: the same TCP 18515 exchange (internal/oob/pingpong), the same QP attributes, the same
// SEND ping-pong driven by completions, and the same output lines.
//
// The flow of the C tools, reproduced here step by step:
//
//   - pp_init_ctx: buffer filled with 0x7b (srq: 0), one MR (LOCAL_WRITE), one CQ of
//     rx_depth+1 entries (srq: rx_depth+num_qp), QPs with max_send_wr 1 and max_recv_wr
//     rx_depth (srq: an SRQ of rx_depth), INIT with pkey 0, port 1, access 0 (ud: Q_Key
//     0x11111111); ud checks size <= the port MTU and uses a size+40 buffer (GRH).
//   - rx_depth receives posted, the local address printed, the exchange: the server connects
//     its QPs (RTR, RTS) before answering, the client after it.
//   - RC (IBTA 9.7): RTR path_mtu, dest QPN, rq_psn, max_dest_rd_atomic 1, min_rnr_timer 12;
//     RTS timeout 14, retry_cnt 7, rnr_retry 7, sq_psn, max_rd_atomic 1. UC (IBTA 9.8): RTR
//     path_mtu, dest QPN, rq_psn; RTS sq_psn. UD (IBTA 9.8.5): RTR, RTS sq_psn, then an AH.
//   - the client posts the first SEND (srq: one per QP). Each QP keeps a "pending" mask of
//     SEND and RECV; when both completed and fewer than iters SENDs completed, it posts the
//     next SEND. Receives are refilled to rx_depth when at most 1 (srq: num_qp) remain.
//   - the loop ends once iters SENDs and iters RECVs completed (srq: counted over all QPs),
//     and the result lines are printed; with -c the client checks its buffer.
//
// Softroce differences: -d names a local address or interface (the device is UDP sockets on
// that address), the local GID is always that address (the tools send a zero GID without
// -g), a peer's zero GID falls back to its TCP address, and every step is bounded by
// --timeout (the tools wait forever), so a missing peer is an error, not a hang. Without -e
// the loop polls, then sleeps on the CQ after 200 us without a completion (the device shares
// the CPUs). srq gives each receive and each QP its own buffer slot instead of one shared
// buffer (a data race in Go; the bytes on the wire are the same). docs/interop.md has more.
//
// --daemon SOCKET runs the tool through the softroce daemon: the same code on roce.Verbs (the
// daemon's device and address; memory from AllocBuffer). A receive posted through the daemon is
// on the queue when PostRecv returns (docs/daemon.md), so the exchange may follow at once.
package pingpong

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/oob"
	oobpp "github.com/softroce/softroce/internal/oob/pingpong"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/internal/tools/cli"
)

// Command is `softroce pingpong`.
var Command = cli.Command{
	Name:    "pingpong",
	Summary: "ibv_{rc,uc,ud,srq}_pingpong, wire-compatible (TCP 18515 exchange, SEND ping-pong)",
	Main:    Main,
}

// Work request IDs (rc_pingpong.c PINGPONG_RECV_WRID / PINGPONG_SEND_WRID); they double as
// the bits of a QP's pending mask.
const (
	ppRecvWRID = 1
	ppSendWRID = 2
)

const (
	// ppGRHSize is the room ud_pingpong leaves for the GRH at the head of every receive
	// buffer (IBTA 11.4.1.2: a UD receive starts with the 40-byte GRH).
	ppGRHSize = 40
	// ppUDQKey is ud_pingpong's Q_Key (IBTA 10.2.5).
	ppUDQKey = 0x11111111
	// ppMaxQP is srq_pingpong's MAX_QP.
	ppMaxQP = oobpp.SRQRecords
	// ppMaxSize bounds -s (the buffer is allocated up front).
	ppMaxSize = 1 << 30
	// ppIOVA is where the buffer is registered (the tools use its virtual address).
	ppIOVA = 0x10000
)

// Errors of the pingpong command (wrapped with details).
var (
	// errPPUsage: bad command line.
	errPPUsage = cli.ErrUsage
	// ErrUnsupported: an option softroce refuses (ODP, timestamps, device memory).
	ErrUnsupported = errors.New("not supported by softroce")
	// errPPTimeout: a step did not finish within --timeout.
	errPPTimeout = cli.ErrTimeout
	// errPPPeer: the peer's records cannot be used.
	errPPPeer = errors.New("bad remote address")
	// errPPVerbs: a verbs call failed (the tools' "Couldn't ..." and "Failed to ..." errors).
	errPPVerbs = errors.New("verbs")
)

// ppWCError is a completion with an error status ("Failed status %s (%d) for wr_id %d").
type ppWCError struct{ WC cq.WC }

func (e *ppWCError) Error() string {
	return fmt.Sprintf("Failed status %s (%d) for wr_id %d", e.WC.Status, int(e.WC.Status), int(e.WC.WRID))
}

// Config is a parsed pingpong command line.
type Config struct {
	Tool oobpp.Tool
	// Server is the host to connect to (client mode); empty means server mode.
	Server   string
	Port     int // -p: TCP port of the exchange
	Size     int // -s
	MTU      qp.MTU
	RxDepth  int  // -r
	Iters    int  // -n
	SL       int  // -l
	GIDIndex int  // -g: with -d IFNAME the GID of that index in the interface's table (cli.DevOptions); -1 = not given
	Events   bool // -e
	Validate bool // -c
	NumQP    int  // -q (srq)
	Dev      cli.DevFlag
	// softroce additions
	Timeout  time.Duration // bound of every step
	RocePort uint16        // UDP port of RoCE (4791)
	Portable bool          // plain sockets
	// Daemon is --daemon SOCKET: run through the softroce daemon (its device and address).
	Daemon string
	// SelectiveRepeat is --selective-repeat (rc, srq): the QPs use selective repeat instead
	// of go-back-N (qp.Attr.SelectiveRepeat); the peer must be softroce given the same flag
	// (the exchange's fixed format has no room to negotiate it).
	SelectiveRepeat bool
	// Linger is --linger: after the last iteration, keep the QPs (and the device) answering
	// for this long before tearing down. The tools' exchange has no closing handshake: when
	// the ACK of the peer's last SEND is lost, the peer's retransmission then still finds the
	// QP and is acknowledged again (IBTA 9.7.5.1.2), instead of ending in RETRY_EXC_ERR, or in
	// a hang for a peer that retries forever (kernel rxe with retry_cnt 7).
	Linger time.Duration

	// Test seams.
	// Listener, if set, is used by the server instead of listening on -p.
	Listener net.Listener
	// Fill, if set, is called on the send buffer before the first SEND (client only),
	// after the tool's own fill.
	Fill func(buf []byte)
	// OnRecv, if set, is called with each successful receive completion and the bytes it
	// wrote (the GRH included for UD), before the loop reacts to it.
	OnRecv func(wc *cq.WC, data []byte)
}

// ppFlagSpec describes one option: its short and long names and the tools that know it
// (the getopt strings of the v44 sources: rc "p:d:i:s:m:r:n:l:eg:oOPtcjN", uc
// "p:d:i:s:m:r:n:l:eg:c", ud "p:d:i:s:r:n:l:eg:c", srq "p:d:i:s:m:q:r:n:l:eog:c").
type ppFlagSpec struct {
	short, long string
	tools       string // letters: r=rc u=uc d=ud s=srq
}

var ppToolLetter = map[oobpp.Tool]byte{oobpp.ToolRC: 'r', oobpp.ToolUC: 'u', oobpp.ToolUD: 'd', oobpp.ToolSRQ: 's'}

// ppToolName is the subcommand word of a tool.
func ppToolName(t oobpp.Tool) string {
	return [...]string{"rc", "uc", "ud", "srq"}[t&3]
}

func ppKnows(spec string, t oobpp.Tool) bool {
	return strings.IndexByte(spec, ppToolLetter[t]) >= 0
}

// flags are the command line's values before parseArgs checks them.
type flags struct {
	Config
	port, size, mtu, rx, iters, sl, gidx, numQP, ibPort int
	events, chk, odp, iodp, prefetch, ts, dm, newSend   bool
	rocePort                                            uint
}

// ppSpecs are the tools' options, in their usage order.
var ppSpecs = []ppFlagSpec{
	{"p", "port", "ruds"}, {"d", "ib-dev", "ruds"}, {"i", "ib-port", "ruds"}, {"s", "size", "ruds"},
	{"m", "mtu", "rus"}, {"q", "num-qp", "s"}, {"r", "rx-depth", "ruds"}, {"n", "iters", "ruds"},
	{"l", "sl", "ruds"}, {"e", "events", "ruds"}, {"g", "gid-idx", "ruds"}, {"o", "odp", "rs"},
	{"O", "iodp", "r"}, {"P", "prefetch", "r"}, {"t", "ts", "r"}, {"c", "chk", "ruds"}, {"j", "dm", "r"},
	{"N", "new_send", "r"},
}

// newFlagSet defines every tool's options (parseArgs refuses those the chosen tool lacks) with
// the defaults of t.
func newFlagSet(f *flags, t oobpp.Tool) *pflag.FlagSet {
	fs := cli.NewFlagSet("pingpong")
	size := 4096
	if t == oobpp.ToolUD {
		size = 1024 // ud_pingpong.c main(): size = 1024 (its usage text says 2048)
	}
	cli.CIntVarP(fs, &f.port, "port", "p", oob.DefaultPort, 0, "listen on/connect to port `port`")
	fs.VarP(&f.Dev, "ib-dev", "d", "use IB device `dev` (softroce: the local ADDR|IFNAME whose address is the RoCE GID)")
	cli.CIntVarP(fs, &f.ibPort, "ib-port", "i", 1, 0, "use `port` of IB device (softroce devices have port 1 only)")
	cli.CIntVarP(fs, &f.size, "size", "s", size, 0, "`size` of message to exchange")
	cli.CIntVarP(fs, &f.mtu, "mtu", "m", 1024, 0, "path MTU (default 1024)")
	cli.CIntVarP(fs, &f.numQP, "num-qp", "q", 16, 0, "number of QPs to use (default 16)")
	cli.CIntVarP(fs, &f.rx, "rx-depth", "r", 500, 0, "number of receives to post at a time (default 500)")
	cli.CIntVarP(fs, &f.iters, "iters", "n", 1000, 0, "number of exchanges (default 1000)")
	cli.CIntVarP(fs, &f.sl, "sl", "l", 0, 0, "service level value")
	fs.BoolVarP(&f.events, "events", "e", false, "sleep on CQ events (default poll)")
	cli.CIntVarP(fs, &f.gidx, "gid-idx", "g", -1, 0, "local port gid index (with -d IFNAME: the interface's GID of that index, as kernel rxe lists them; with -d ADDR: the address's own)")
	fs.BoolVarP(&f.odp, "odp", "o", false, "use on demand paging (refused: softroce memory is always resident)")
	fs.BoolVarP(&f.iodp, "iodp", "O", false, "use implicit on demand paging (refused)")
	fs.BoolVarP(&f.prefetch, "prefetch", "P", false, "prefetch an ODP MR (refused)")
	fs.BoolVarP(&f.ts, "ts", "t", false, "get CQE with timestamp (refused)")
	fs.BoolVarP(&f.chk, "chk", "c", false, "validate received buffer")
	fs.BoolVarP(&f.dm, "dm", "j", false, "use device memory (refused)")
	fs.BoolVarP(&f.newSend, "new_send", "N", false, "use new post send WR API (the same wire behaviour)")
	fs.DurationVar(&f.Timeout, "timeout", 30*time.Second, "softroce: bound of every step (accept, connect, each exchange step, each wait for a completion)")
	fs.UintVar(&f.rocePort, "roce-port", 4791, "softroce: RoCE UDP port")
	fs.BoolVar(&f.Portable, "portable", false, "softroce: plain UDP sockets instead of sendmmsg/recvmmsg")
	fs.StringVar(&f.Daemon, "daemon", "", "softroce: run through the softroce daemon on this unix `socket` (-d picks one of its addresses)")
	fs.DurationVar(&f.Linger, "linger", 0, "softroce: after the last iteration keep the QPs answering a peer's retransmissions this long (its last SEND's ACK lost), then exit")
	fs.BoolVar(&f.SelectiveRepeat, "selective-repeat", false, "softroce (rc, srq): selective repeat instead of go-back-N (docs/reliability.md); give it on both sides: the peer must be softroce with the same flag, as the tools' exchange cannot negotiate it (not with --daemon)")
	return fs
}

// toolOf splits the optional tool word (rc, uc, ud, srq; default rc) off args.
func toolOf(args []string) (oobpp.Tool, []string) {
	if len(args) > 0 {
		switch args[0] {
		case "rc":
			return oobpp.ToolRC, args[1:]
		case "uc":
			return oobpp.ToolUC, args[1:]
		case "ud":
			return oobpp.ToolUD, args[1:]
		case "srq":
			return oobpp.ToolSRQ, args[1:]
		}
	}
	return oobpp.ToolRC, args
}

// Usage writes the usage of the tool args name (as the tools' usage(): the options it knows).
func Usage(w io.Writer, args []string) {
	t, _ := toolOf(args)
	fmt.Fprintf(w, "Usage (%s):\n  softroce pingpong %s [options]          start a server and wait for connection\n", t, ppToolName(t))
	fmt.Fprintf(w, "  softroce pingpong %s [options] <host>   connect to server at <host>\n\nOptions:\n", ppToolName(t))
	fs := newFlagSet(&flags{}, t)
	for _, sp := range ppSpecs {
		fs.Lookup(sp.long).Hidden = !ppKnows(sp.tools, t)
	}
	cli.PrintFlags(w, fs)
}

// ParseArgs parses "[rc|uc|ud|srq] [options] [SERVER]" as the tools' getopt_long does
// (options and SERVER in any order).
func ParseArgs(args []string) (Config, error) {
	var f flags
	var t oobpp.Tool
	t, args = toolOf(args)
	fs := newFlagSet(&f, t)
	if err := cli.Parse(fs, args); err != nil {
		return Config{}, err
	}
	c := f.Config
	c.Tool = t
	for _, s := range ppSpecs {
		if fs.Changed(s.long) && !ppKnows(s.tools, t) {
			return c, fmt.Errorf("%w: %s has no option -%s (--%s)", errPPUsage, t, s.short, s.long)
		}
	}
	positional := fs.Args()
	port, size, mtu, rx, iters, sl, ibPort, numQP := f.port, f.size, f.mtu, f.rx, f.iters, f.sl, f.ibPort, f.numQP
	switch {
	case f.odp || f.iodp || f.prefetch:
		return c, fmt.Errorf("-o/-O/-P (on-demand paging) is %w: softroce memory is always resident", ErrUnsupported)
	case f.ts:
		return c, fmt.Errorf("-t (completion timestamps) is %w", ErrUnsupported)
	case f.dm:
		return c, fmt.Errorf("-j (device memory) is %w", ErrUnsupported)
	case len(positional) > 1:
		return c, fmt.Errorf("%w: more than one SERVER argument: %q", errPPUsage, positional)
	case port < 0 || port > 65535:
		return c, fmt.Errorf("%w: -p %d: not a TCP port", errPPUsage, port)
	case ibPort != 1:
		return c, fmt.Errorf("%w: -i %d: softroce devices have one port, 1", errPPUsage, ibPort)
	case size < 1 || size > ppMaxSize:
		return c, fmt.Errorf("%w: -s %d: size must be 1..%d", errPPUsage, size, ppMaxSize)
	case rx < 1 || rx > 1<<20 || iters < 1:
		return c, fmt.Errorf("%w: -r must be 1..%d and -n at least 1", errPPUsage, 1<<20)
	case sl < 0 || sl > 15:
		return c, fmt.Errorf("%w: -l %d: service levels are 0..15", errPPUsage, sl)
	case f.rocePort == 0 || f.rocePort > 65535:
		return c, fmt.Errorf("%w: --roce-port %d", errPPUsage, f.rocePort)
	case c.Timeout <= 0:
		return c, fmt.Errorf("%w: --timeout must be positive", errPPUsage)
	case c.Linger < 0:
		return c, fmt.Errorf("%w: --linger must not be negative", errPPUsage)
	case c.SelectiveRepeat && (t == oobpp.ToolUC || t == oobpp.ToolUD || c.Daemon != ""):
		return c, fmt.Errorf("--selective-repeat with uc, ud or --daemon is %w: RC QPs of an embedded device only", ErrUnsupported)
	case c.Daemon != "" && (fs.Changed("roce-port") || fs.Changed("portable")):
		return c, fmt.Errorf("%w: --roce-port and --portable with --daemon: the daemon owns the RoCE socket", errPPUsage)
	}
	if m := qp.MTUFromBytes(mtu); m.Valid() && m.Bytes() == mtu { // pp_mtu_to_enum
		c.MTU = m
	} else {
		return c, fmt.Errorf("%w: -m %d: path MTU must be 256, 512, 1024, 2048 or 4096", errPPUsage, mtu)
	}
	if t == oobpp.ToolSRQ {
		if numQP > rx { // srq_pingpong.c main()
			return c, fmt.Errorf("rx_depth %d is too small for %d QPs -- must have at least one receive per QP", rx, numQP)
		}
		if numQP < 1 || numQP >= ppMaxQP {
			return c, fmt.Errorf("num_qp %d must be 1..%d", numQP, ppMaxQP-1)
		}
	} else {
		numQP = 1
	}
	if len(positional) == 1 {
		c.Server = positional[0]
	}
	c.Port, c.Size, c.RxDepth, c.Iters, c.SL, c.GIDIndex, c.Validate, c.Events, c.NumQP = port, size, rx, iters, sl, f.gidx, f.chk, f.events, numQP
	c.RocePort = uint16(f.rocePort)
	return c, nil
}

// Main is the command: exit status 0 only when every exchange completed, 1 on any error (the
// tools return 1 for bad options too), 0 for -h.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return main(ctx, args, stdout, stderr, nil)
}

// main is Main; seams, if set, adjusts the parsed Config (tests: the Config's test seams).
func main(ctx context.Context, args []string, stdout, stderr io.Writer, seams func(*Config)) int {
	c, err := ParseArgs(args)
	if errors.Is(err, pflag.ErrHelp) {
		Usage(stdout, args)
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "pingpong: %v\n", err)
		if errors.Is(err, errPPUsage) {
			fmt.Fprintln(stderr, "usage: softroce pingpong [rc|uc|ud|srq] [options] [SERVER]   (server when no SERVER; -h for options)")
		}
		return 1
	}
	if seams != nil {
		seams(&c)
	}
	if err := Run(ctx, c, stdout); err != nil {
		fmt.Fprintf(stderr, "pingpong: %v\n", err)
		return 1
	}
	return 0
}
