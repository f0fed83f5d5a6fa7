package main

// softroce pingpong: rdma-core's ibv_rc_pingpong, ibv_uc_pingpong, ibv_ud_pingpong and
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
// -timeout (the tools wait forever), so a missing peer is an error, not a hang. Without -e
// the loop polls, then sleeps on the CQ after 200 us without a completion (the device shares
// the CPUs). srq gives each receive and each QP its own buffer slot instead of one shared
// buffer (a data race in Go; the bytes on the wire are the same). docs/interop.md has more.
//
// --daemon SOCKET runs the tool through the softroce daemon: the same code on roce.Verbs (the
// daemon's device and address; memory from AllocBuffer). A receive posted through the daemon is
// on the queue when PostRecv returns (docs/daemon.md), so the exchange may follow at once.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/oob"
	"github.com/softroce/softroce/internal/oob/pingpong"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/internal/tools/cli"
	"github.com/softroce/softroce/pkg/roce"
)

func init() {
	register(&command{
		name:    "pingpong",
		summary: "ibv_{rc,uc,ud,srq}_pingpong, wire-compatible (TCP 18515 exchange, SEND ping-pong)",
		run:     runPingpong,
	})
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
	ppMaxQP = pingpong.SRQRecords
	// ppMaxSize bounds -s (the buffer is allocated up front).
	ppMaxSize = 1 << 30
	// ppIOVA is where the buffer is registered (the tools use its virtual address).
	ppIOVA = 0x10000
)

// Errors of the pingpong command (wrapped with details).
var (
	// errPPUsage: bad command line.
	errPPUsage = errors.New("usage")
	// errPPUnsupported: an option softroce refuses (ODP, timestamps, device memory).
	errPPUnsupported = errors.New("not supported by softroce")
	// errPPTimeout: a step did not finish within -timeout.
	errPPTimeout = errors.New("timed out")
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

// ppConfig is a parsed pingpong command line.
type ppConfig struct {
	Tool pingpong.Tool
	// Server is the host to connect to (client mode); empty means server mode.
	Server   string
	Port     int // -p: TCP port of the exchange
	Size     int // -s
	MTU      qp.MTU
	RxDepth  int  // -r
	Iters    int  // -n
	SL       int  // -l
	GIDIndex int  // -g (accepted; -1 = not given)
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
}

// ppEnv is where a run writes, plus test seams.
type ppEnv struct {
	Stdout, Stderr io.Writer
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
// (the getopt strings of the v44 sources).
type ppFlagSpec struct {
	short, long string
	tools       string // letters: r=rc u=uc d=ud s=srq
}

var ppToolLetter = map[pingpong.Tool]byte{pingpong.ToolRC: 'r', pingpong.ToolUC: 'u', pingpong.ToolUD: 'd', pingpong.ToolSRQ: 's'}

// ppToolName is the subcommand word of a tool.
func ppToolName(t pingpong.Tool) string {
	return [...]string{"rc", "uc", "ud", "srq"}[t&3]
}

func ppKnows(spec string, t pingpong.Tool) bool {
	for i := 0; i < len(spec); i++ {
		if spec[i] == ppToolLetter[t] {
			return true
		}
	}
	return false
}

// parsePingpong parses "[rc|uc|ud|srq] [flags] [SERVER]" (flags and SERVER in any order, as
// getopt permutes them).
func parsePingpong(args []string, stderr io.Writer) (*ppConfig, error) {
	c := &ppConfig{Tool: pingpong.ToolRC, Port: oob.DefaultPort, Size: 4096, MTU: qp.MTU1024, RxDepth: 500,
		Iters: 1000, GIDIndex: -1, NumQP: 16, Timeout: 30 * time.Second, RocePort: 4791}
	if len(args) > 0 {
		switch args[0] {
		case "rc":
			args = args[1:]
		case "uc":
			c.Tool, args = pingpong.ToolUC, args[1:]
		case "ud":
			c.Tool, args = pingpong.ToolUD, args[1:]
			c.Size = 1024 // ud_pingpong.c main(): size = 1024 (its usage text says 2048)
		case "srq":
			c.Tool, args = pingpong.ToolSRQ, args[1:]
		}
	}
	fs := flag.NewFlagSet("pingpong", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		port, size, mtu, rx, iters, sl, gidx, numQP, ibPort int
		events, chk, odp, iodp, prefetch, ts, dm, newSend   bool
		rocePort                                            uint
	)
	port, size, mtu, rx, iters, gidx, numQP, ibPort = c.Port, c.Size, 1024, c.RxDepth, c.Iters, -1, c.NumQP, 1
	rocePort = 4791
	set := map[string]bool{}
	specs := []struct {
		ppFlagSpec
		bind func(name string)
	}{
		{ppFlagSpec{"p", "port", "ruds"}, func(n string) { fs.IntVar(&port, n, port, "listen on/connect to TCP `port`") }},
		{ppFlagSpec{"d", "ib-dev", "ruds"}, func(n string) { fs.Var(&c.Dev, n, "local `ADDR|IFNAME` (softroce: the RoCE address)") }},
		{ppFlagSpec{"i", "ib-port", "ruds"}, func(n string) { fs.IntVar(&ibPort, n, 1, "device `port` (softroce devices have port 1 only)") }},
		{ppFlagSpec{"s", "size", "ruds"}, func(n string) { fs.IntVar(&size, n, size, "`size` of message to exchange") }},
		{ppFlagSpec{"m", "mtu", "rus"}, func(n string) { fs.IntVar(&mtu, n, 1024, "path MTU `bytes`") }},
		{ppFlagSpec{"r", "rx-depth", "ruds"}, func(n string) { fs.IntVar(&rx, n, rx, "number of receives to post at a time") }},
		{ppFlagSpec{"n", "iters", "ruds"}, func(n string) { fs.IntVar(&iters, n, iters, "number of exchanges") }},
		{ppFlagSpec{"l", "sl", "ruds"}, func(n string) { fs.IntVar(&sl, n, 0, "service level value") }},
		{ppFlagSpec{"e", "events", "ruds"}, func(n string) { fs.BoolVar(&events, n, false, "sleep on CQ events (default poll)") }},
		{ppFlagSpec{"g", "gid-idx", "ruds"}, func(n string) {
			fs.IntVar(&gidx, n, -1, "local port gid `index` (accepted; the GID is the -d address)")
		}},
		{ppFlagSpec{"c", "chk", "ruds"}, func(n string) { fs.BoolVar(&chk, n, false, "validate received buffer") }},
		{ppFlagSpec{"q", "num-qp", "s"}, func(n string) { fs.IntVar(&numQP, n, numQP, "number of QPs to use (srq)") }},
		{ppFlagSpec{"o", "odp", "rs"}, func(n string) { fs.BoolVar(&odp, n, false, "on demand paging (refused)") }},
		{ppFlagSpec{"O", "iodp", "r"}, func(n string) { fs.BoolVar(&iodp, n, false, "implicit on demand paging (refused)") }},
		{ppFlagSpec{"P", "prefetch", "r"}, func(n string) { fs.BoolVar(&prefetch, n, false, "prefetch an ODP MR (refused)") }},
		{ppFlagSpec{"t", "ts", "r"}, func(n string) { fs.BoolVar(&ts, n, false, "completion timestamps (refused)") }},
		{ppFlagSpec{"j", "dm", "r"}, func(n string) { fs.BoolVar(&dm, n, false, "device memory (refused)") }},
		{ppFlagSpec{"N", "new_send", "r"}, func(n string) { fs.BoolVar(&newSend, n, false, "new post send API (same wire behaviour)") }},
	}
	byName := map[string]ppFlagSpec{}
	for _, s := range specs {
		s.bind(s.short)
		s.bind(s.long)
		byName[s.short], byName[s.long] = s.ppFlagSpec, s.ppFlagSpec
	}
	fs.DurationVar(&c.Timeout, "timeout", c.Timeout, "softroce: bound of every step (accept, connect, each exchange step, each wait for a completion)")
	fs.UintVar(&rocePort, "roce-port", rocePort, "softroce: RoCE UDP port")
	fs.BoolVar(&c.Portable, "portable", false, "softroce: plain UDP sockets instead of sendmmsg/recvmmsg")
	fs.StringVar(&c.Daemon, "daemon", "", "softroce: run through the softroce daemon on this unix socket (-d picks one of its addresses)")
	fs.Usage = func() { // the tools' usage(): one line per option this tool knows
		w := fs.Output()
		fmt.Fprintf(w, "Usage (%s):\n  softroce pingpong %s [options]          start a server and wait for connection\n", c.Tool, ppToolName(c.Tool))
		fmt.Fprintf(w, "  softroce pingpong %s [options] <host>   connect to server at <host>\n\nOptions:\n", ppToolName(c.Tool))
		for _, sp := range specs {
			if !ppKnows(sp.tools, c.Tool) {
				continue
			}
			f := fs.Lookup(sp.short)
			def := ""
			if f.DefValue != "false" && f.DefValue != "" && f.DefValue != "-1" && f.DefValue != "0" {
				def = " (default " + f.DefValue + ")"
			}
			fmt.Fprintf(w, "  -%s, --%-10s %s%s\n", sp.short, sp.long, strings.ReplaceAll(f.Usage, "`", ""), def)
		}
		for _, n := range []string{"timeout", "roce-port", "portable"} {
			f := fs.Lookup(n)
			fmt.Fprintf(w, "  --%-14s %s (default %s)\n", n, f.Usage, f.DefValue)
		}
		fmt.Fprintf(w, "  --%-14s %s\n", "daemon SOCKET", fs.Lookup("daemon").Usage)
	}

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
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for name := range set {
		if s, ok := byName[name]; ok && !ppKnows(s.tools, c.Tool) {
			return nil, fmt.Errorf("%w: %s has no option -%s (--%s)", errPPUsage, c.Tool, s.short, s.long)
		}
	}
	switch {
	case odp || iodp || prefetch:
		return nil, fmt.Errorf("-o/-O/-P (on-demand paging) is %w: softroce memory is always resident", errPPUnsupported)
	case ts:
		return nil, fmt.Errorf("-t (completion timestamps) is %w", errPPUnsupported)
	case dm:
		return nil, fmt.Errorf("-j (device memory) is %w", errPPUnsupported)
	case len(positional) > 1:
		return nil, fmt.Errorf("%w: more than one SERVER argument: %q", errPPUsage, positional)
	case port < 0 || port > 65535:
		return nil, fmt.Errorf("%w: -p %d: not a TCP port", errPPUsage, port)
	case ibPort != 1:
		return nil, fmt.Errorf("%w: -i %d: softroce devices have one port, 1", errPPUsage, ibPort)
	case size < 1 || size > ppMaxSize:
		return nil, fmt.Errorf("%w: -s %d: size must be 1..%d", errPPUsage, size, ppMaxSize)
	case rx < 1 || rx > 1<<20 || iters < 1:
		return nil, fmt.Errorf("%w: -r must be 1..%d and -n at least 1", errPPUsage, 1<<20)
	case sl < 0 || sl > 15:
		return nil, fmt.Errorf("%w: -l %d: service levels are 0..15", errPPUsage, sl)
	case rocePort == 0 || rocePort > 65535:
		return nil, fmt.Errorf("%w: -roce-port %d", errPPUsage, rocePort)
	case c.Timeout <= 0:
		return nil, fmt.Errorf("%w: -timeout must be positive", errPPUsage)
	case c.Daemon != "" && (set["roce-port"] || set["portable"]):
		return nil, fmt.Errorf("%w: --roce-port and --portable with --daemon: the daemon owns the RoCE socket", errPPUsage)
	}
	if m := qp.MTUFromBytes(mtu); m.Valid() && m.Bytes() == mtu { // pp_mtu_to_enum
		c.MTU = m
	} else {
		return nil, fmt.Errorf("%w: -m %d: path MTU must be 256, 512, 1024, 2048 or 4096", errPPUsage, mtu)
	}
	if c.Tool == pingpong.ToolSRQ {
		if numQP > rx { // srq_pingpong.c main()
			return nil, fmt.Errorf("rx_depth %d is too small for %d QPs -- must have at least one receive per QP", rx, numQP)
		}
		if numQP < 1 || numQP >= ppMaxQP {
			return nil, fmt.Errorf("num_qp %d must be 1..%d", numQP, ppMaxQP-1)
		}
	} else {
		numQP = 1
	}
	if len(positional) == 1 {
		c.Server = positional[0]
	}
	c.Port, c.Size, c.RxDepth, c.Iters, c.SL, c.GIDIndex, c.Validate, c.Events, c.NumQP = port, size, rx, iters, sl, gidx, chk, events, numQP
	c.RocePort = uint16(rocePort)
	return c, nil
}

// runPingpong is the command: exit 0 only when every exchange completed, as the tools.
func runPingpong(args []string, stdout, stderr io.Writer) int {
	return pingpongMain(args, &ppEnv{Stdout: stdout, Stderr: stderr})
}

// pingpongMain parses args and runs; the exit status is 0 on success, 1 on any error (the
// tools return 1 for bad options too), 0 for -h.
func pingpongMain(args []string, env *ppEnv) int {
	c, err := parsePingpong(args, env.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(env.Stderr, "pingpong: %v\n", err)
		if errors.Is(err, errPPUsage) {
			fmt.Fprintln(env.Stderr, "usage: softroce pingpong [rc|uc|ud|srq] [flags] [SERVER]   (server when no SERVER; -h for flags)")
		}
		return 1
	}
	if err := pingpongRun(context.Background(), c, env); err != nil {
		fmt.Fprintf(env.Stderr, "pingpong: %v\n", err)
		return 1
	}
	return 0
}

// ppCtx is struct pingpong_context: the verbs objects of one run.
type ppCtx struct {
	c    *ppConfig
	env  *ppEnv
	ld   *cli.VerbsDev // the embedded device or the daemon (--daemon)
	pd   roce.ProtectionDomain
	mr   roce.MemoryRegion
	cq   roce.CompletionQueue
	srq  roce.SharedReceiveQueue
	qps  []roce.QueuePair
	ah   *qp.AH
	buf  []byte // from ld.V.AllocBuffer
	mine []pingpong.Dest
	peer []pingpong.Dest

	// srq: the buffer is numQP send buffers then rxDepth receive slots (see newPPCtx);
	// last holds the most recent message received, which the next SEND echoes.
	last     []byte
	haveLast bool
	posted   int // receives posted so far (srq: slot = posted % rxDepth)

	pending []int
	recvWR  [1]qp.RecvWR
	recvSGE [1]qp.SGE
	sendWR  [1]qp.SendWR
	sendSGE [1]qp.SGE
}

// newPPCtx is pp_init_ctx plus the initial receives and the local addresses.
func newPPCtx(c *ppConfig, env *ppEnv, ld *cli.VerbsDev) (*ppCtx, error) {
	p := &ppCtx{c: c, env: env, ld: ld}
	d := ld.V
	n := c.Size
	fill := byte(0x7b) // rc/uc/ud: memset(ctx->buf, 0x7b, size); srq: memset(ctx->buf, 0, size)
	switch c.Tool {
	case pingpong.ToolUD:
		if mtu := ld.MTU.Bytes(); c.Size > mtu { // a UD message is one packet (IBTA 9.8.5)
			return nil, fmt.Errorf("Requested size larger than port MTU (%d)", mtu)
		}
		n += ppGRHSize
	case pingpong.ToolSRQ:
		fill = 0
	}
	if c.Tool == pingpong.ToolSRQ {
		// srq_pingpong receives into, and sends from, one buffer shared by every QP: the
		// receives of different QPs land in it while a SEND of another QP reads it (the
		// same bytes each time, so nothing shows on the wire). In Go that is a data race,
		// so each receive WR here gets its own slot and each QP its own send buffer; the
		// message last received is copied to a QP's send buffer when it posts its SEND.
		// The bytes on the wire are those of the C tool.
		if total := (c.NumQP + c.RxDepth) * c.Size; total > ppMaxSize {
			return nil, fmt.Errorf("%w: srq needs (num_qp + rx_depth) * size = %d bytes, more than %d", errPPUsage, total, ppMaxSize)
		}
		n = (c.NumQP + c.RxDepth) * c.Size
		p.last = make([]byte, c.Size)
	}
	var err error
	if p.buf, err = d.AllocBuffer(n); err != nil { // memory the daemon can map too
		return nil, fmt.Errorf("%w: Couldn't allocate work buf: %w", errPPVerbs, err)
	}
	for i := range p.buf {
		p.buf[i] = fill
	}
	if p.pd, err = d.AllocPD(); err != nil {
		return nil, fmt.Errorf("%w: Couldn't allocate PD: %w", errPPVerbs, err)
	}
	if p.mr, err = d.RegMR(p.pd, p.buf, ppIOVA, mr.AccessLocalWrite); err != nil {
		return nil, fmt.Errorf("%w: Couldn't register MR: %w", errPPVerbs, err)
	}
	cqe := c.RxDepth + 1
	if c.Tool == pingpong.ToolSRQ {
		cqe = c.RxDepth + c.NumQP
	}
	if p.cq, err = d.CreateCQ(cqe); err != nil {
		return nil, fmt.Errorf("%w: Couldn't create CQ: %w", errPPVerbs, err)
	}
	typ := qp.TypeRC
	caps := qp.Cap{MaxSendWR: 1, MaxRecvWR: uint32(c.RxDepth), MaxSendSGE: 1, MaxRecvSGE: 1}
	switch c.Tool {
	case pingpong.ToolUC:
		typ = qp.TypeUC
	case pingpong.ToolUD:
		typ = qp.TypeUD
	case pingpong.ToolSRQ:
		if p.srq, err = d.CreateSRQ(qp.SRQOptions{MaxWR: c.RxDepth, MaxSGE: 1}); err != nil {
			return nil, fmt.Errorf("%w: Couldn't create SRQ: %w", errPPVerbs, err)
		}
		caps.MaxRecvWR, caps.MaxRecvSGE = 0, 0
	}
	for i := 0; i < c.NumQP; i++ {
		q, err := d.CreateQP(roce.VerbsQPInit{Type: typ, PD: p.pd, SendCQ: p.cq, RecvCQ: p.cq, SRQ: p.srq, Cap: caps})
		if err != nil {
			return nil, fmt.Errorf("%w: Couldn't create QP[%d]: %w", errPPVerbs, i, err)
		}
		p.qps = append(p.qps, q)
		a := qp.Attr{State: qp.StateInit, PKeyIndex: 0, Port: 1}
		mask := qp.AttrState | qp.AttrPKeyIndex | qp.AttrPort
		if typ == qp.TypeUD {
			a.QKey, mask = ppUDQKey, mask|qp.AttrQKey
		} else {
			mask |= qp.AttrAccessFlags
		}
		if err := q.Modify(&a, mask); err != nil {
			return nil, fmt.Errorf("%w: Failed to modify QP[%d] to INIT: %w", errPPVerbs, i, err)
		}
	}
	rlen := n
	if p.srq != nil {
		rlen = c.Size
	}
	p.recvSGE[0] = qp.SGE{Addr: ppIOVA, Length: uint32(rlen), LKey: p.mr.LKey()}
	p.recvWR[0] = qp.RecvWR{WRID: ppRecvWRID, SGL: p.recvSGE[:]}
	off := uint64(0)
	if c.Tool == pingpong.ToolUD {
		off = ppGRHSize // ud_pingpong sends from buf + 40
	}
	p.sendSGE[0] = qp.SGE{Addr: ppIOVA + off, Length: uint32(c.Size), LKey: p.mr.LKey()}
	p.sendWR[0] = qp.SendWR{WRID: ppSendWRID, Opcode: qp.WRSend, SGL: p.sendSGE[:], Flags: qp.SendSignaled}
	if posted := p.postRecv(c.RxDepth); posted < c.RxDepth {
		return nil, fmt.Errorf("%w: Couldn't post receive (%d)", errPPVerbs, posted)
	}
	if c.Events {
		if err := p.cq.ReqNotify(false); err != nil {
			return nil, fmt.Errorf("%w: Couldn't request CQ notification: %w", errPPVerbs, err)
		}
	}
	for _, q := range p.qps {
		dst := pingpong.Dest{LID: d.PortAttr().LID, QPN: q.Num(), PSN: rand.Uint32() & 0xffffff}
		dst.GID = ld.GID()
		p.mine = append(p.mine, dst)
	}
	return p, nil
}

// close is pp_close_ctx: destroy everything; the device is closed by the caller.
func (p *ppCtx) close() error {
	var errs []error
	for i, q := range p.qps {
		if err := q.Destroy(); err != nil {
			errs = append(errs, fmt.Errorf("%w: Couldn't destroy QP[%d]: %w", errPPVerbs, i, err))
		}
	}
	if p.srq != nil {
		if err := p.ld.V.DestroySRQ(p.srq); err != nil {
			errs = append(errs, fmt.Errorf("%w: Couldn't destroy SRQ: %w", errPPVerbs, err))
		}
	}
	if p.cq != nil {
		if err := p.ld.V.DestroyCQ(p.cq); err != nil {
			errs = append(errs, fmt.Errorf("%w: Couldn't destroy CQ: %w", errPPVerbs, err))
		}
	}
	bufFree := true
	if p.mr != nil {
		if err := p.mr.Dereg(); err != nil {
			errs = append(errs, fmt.Errorf("%w: Couldn't deregister MR: %w", errPPVerbs, err))
			bufFree = false // still registered: leave the memory mapped
		}
	}
	if p.buf != nil && bufFree {
		if err := p.ld.V.FreeBuffer(p.buf); err != nil {
			errs = append(errs, fmt.Errorf("%w: Couldn't free work buf: %w", errPPVerbs, err))
		}
		p.buf = nil
	}
	if p.pd != nil {
		if err := p.pd.Dealloc(); err != nil {
			errs = append(errs, fmt.Errorf("%w: Couldn't deallocate PD: %w", errPPVerbs, err))
		}
	}
	return errors.Join(errs...)
}

// postRecv is pp_post_recv: post up to n receives of the whole buffer; returns how many.
func (p *ppCtx) postRecv(n int) int {
	for i := 0; i < n; i++ {
		var err error
		if p.srq != nil {
			slot := p.posted % p.c.RxDepth
			p.recvWR[0].WRID = ppRecvWRID | uint64(slot)<<8
			p.recvSGE[0].Addr = ppIOVA + uint64((p.c.NumQP+slot)*p.c.Size)
			_, err = p.srq.Post(p.recvWR[:])
		} else {
			_, err = p.qps[0].PostRecv(p.recvWR[:])
		}
		if err != nil {
			return i
		}
		p.posted++
	}
	return n
}

// postSend is pp_post_send on QP i.
func (p *ppCtx) postSend(i int) error {
	if p.ah != nil {
		p.sendWR[0].AH, p.sendWR[0].RemoteQPN, p.sendWR[0].RemoteQKey = p.ah, p.peer[0].QPN, ppUDQKey
	}
	if p.srq != nil {
		if p.haveLast { // QP i's previous SEND completed: its buffer is free
			copy(p.sendBufOf(i), p.last)
		}
		p.sendSGE[0].Addr = ppIOVA + uint64(i*p.c.Size)
	}
	_, err := p.qps[i].PostSend(p.sendWR[:])
	return err
}

// connect is pp_connect_ctx: move the QPs to RTR and RTS toward the peer's records.
// tcpPeer is the exchange's remote address, used when the peer sent a zero GID.
func (p *ppCtx) connect(remote []pingpong.Dest, tcpPeer netip.Addr) error {
	c := p.c
	if len(remote) < c.NumQP {
		return fmt.Errorf("%w: %d records for %d QPs", errPPPeer, len(remote), c.NumQP)
	}
	p.peer = remote[:c.NumQP]
	for i, r := range p.peer {
		if r.QPN == 0 || r.QPN == 1 || r.QPN > 0xffffff {
			return fmt.Errorf("%w: record %d has QPN %#x (the peer uses fewer QPs than -q %d?)", errPPPeer, i, r.QPN, c.NumQP)
		}
	}
	// srq_pingpong uses the first record's GID for every QP (dest->gid).
	dgid := p.peer[0].Addr().Unmap()
	if p.peer[0].GID == ([16]byte{}) {
		dgid = tcpPeer.Unmap() // softroce: the tools would go without a GRH, impossible on RoCE
	}
	if !dgid.IsValid() || dgid.IsUnspecified() || dgid.Is4() != p.ld.Addr.Is4() {
		return fmt.Errorf("%w: GID %v cannot be reached from %v", errPPPeer, dgid, p.ld.Addr)
	}
	ah := qp.AHAttr{DGID: dgid, SGIDIndex: uint8(p.ld.GIDIndex), HopLimit: 1, SL: uint8(c.SL), Port: 1}
	if c.Tool == pingpong.ToolUD {
		q := p.qps[0]
		if err := q.Modify(&qp.Attr{State: qp.StateRTR}, qp.AttrState); err != nil {
			return fmt.Errorf("%w: Failed to modify QP to RTR: %w", errPPVerbs, err)
		}
		if err := q.Modify(&qp.Attr{State: qp.StateRTS, SQPSN: p.mine[0].PSN}, qp.AttrState|qp.AttrSQPSN); err != nil {
			return fmt.Errorf("%w: Failed to modify QP to RTS: %w", errPPVerbs, err)
		}
		var err error
		if p.ah, err = p.ld.V.CreateAH(p.pd, ah); err != nil {
			return fmt.Errorf("%w: Failed to create AH: %w", errPPVerbs, err)
		}
		return nil
	}
	for i, q := range p.qps {
		rtr := qp.Attr{State: qp.StateRTR, PathMTU: c.MTU, DestQPN: p.peer[i].QPN, RQPSN: p.peer[i].PSN, AH: ah}
		mask := qp.AttrState | qp.AttrAV | qp.AttrPathMTU | qp.AttrDestQPN | qp.AttrRQPSN
		rts := qp.Attr{State: qp.StateRTS, SQPSN: p.mine[i].PSN}
		rtsMask := qp.AttrState | qp.AttrSQPSN
		if c.Tool != pingpong.ToolUC {
			rtr.MaxDestRDAtomic, rtr.MinRNRTimer = 1, 12
			mask |= qp.AttrMaxDestRDAtomic | qp.AttrMinRNRTimer
			rts.Timeout, rts.RetryCnt, rts.RNRRetry, rts.MaxRDAtomic = 14, 7, 7, 1
			rtsMask |= qp.AttrTimeout | qp.AttrRetryCnt | qp.AttrRNRRetry | qp.AttrMaxQPRDAtomic
		}
		if err := q.Modify(&rtr, mask); err != nil {
			return fmt.Errorf("%w: Failed to modify QP[%d] to RTR: %w", errPPVerbs, i, err)
		}
		if err := q.Modify(&rts, rtsMask); err != nil {
			return fmt.Errorf("%w: Failed to modify QP[%d] to RTS: %w", errPPVerbs, i, err)
		}
	}
	return nil
}

// ppLoop holds the counters of the ping-pong loop.
type ppLoop struct {
	p                 *ppCtx
	routs, rcnt, scnt int
	refillAt          int
	wcs               []cq.WC
	qpIndex           map[uint32]int
	spins             int
	spinSince         time.Time
	deadline          time.Time
	timer             *time.Timer
}

// run is the tools' main loop, from the first SEND to the last completion.
func (p *ppCtx) run(client bool) (time.Duration, error) {
	c := p.c
	l := p.newLoop()
	if c.Events {
		l.timer = time.NewTimer(c.Timeout)
		defer l.timer.Stop()
	}
	start := time.Now()
	l.deadline = start.Add(c.Timeout)
	if err := l.start(client); err != nil {
		return 0, err
	}
	for l.rcnt < c.Iters || l.scnt < c.Iters {
		ne, err := l.wait()
		if err != nil {
			return 0, err
		}
		for i := 0; i < ne; i++ {
			if err := l.handle(&l.wcs[i]); err != nil {
				return 0, err
			}
		}
	}
	return time.Since(start), nil
}

// newLoop prepares the loop state: every QP waits for a RECV.
func (p *ppCtx) newLoop() *ppLoop {
	c := p.c
	l := &ppLoop{p: p, routs: c.RxDepth, refillAt: 1, wcs: make([]cq.WC, 2), qpIndex: map[uint32]int{}}
	if c.Tool == pingpong.ToolSRQ {
		l.refillAt, l.wcs = c.NumQP, make([]cq.WC, c.NumQP+c.RxDepth)
	}
	for i, q := range p.qps {
		l.qpIndex[q.Num()] = i
	}
	p.pending = make([]int, c.NumQP)
	for i := range p.pending {
		p.pending[i] = ppRecvWRID
	}
	return l
}

// start is what the client does before the loop: fill its buffer (-c) and post the first
// SEND on every QP.
func (l *ppLoop) start(client bool) error {
	p, c := l.p, l.p.c
	if !client {
		return nil
	}
	for i := range p.qps {
		if c.Validate { // for (i = 0; i < size; i += page_size) buf[i] = i / page_size % sizeof(char)
			ppFillPages(p.sendBufOf(i))
		}
		if p.env.Fill != nil {
			p.env.Fill(p.sendBufOf(i))
		}
	}
	for i := range p.qps {
		if err := p.postSend(i); err != nil {
			return fmt.Errorf("%w: Couldn't post send: %w", errPPVerbs, err)
		}
		p.pending[i] |= ppSendWRID
	}
	return nil
}

// wait returns the next completions: busy polling, or (-e) blocking on the CQ's completion
// channel and re-arming it (ibv_get_cq_event, ibv_req_notify_cq), bounded by -timeout since
// the last completion.
func (l *ppLoop) wait() (int, error) {
	p := l.p
	for {
		if ne := p.cq.Poll(l.wcs); ne > 0 {
			l.deadline, l.spinSince = time.Now().Add(p.c.Timeout), time.Time{}
			return ne, nil
		}
		if p.c.Events {
			l.timer.Reset(time.Until(l.deadline))
			select {
			case <-p.cq.Channel():
			case <-l.timer.C:
				return 0, l.timeoutErr()
			}
			if err := p.cq.ReqNotify(false); err != nil {
				return 0, fmt.Errorf("%w: Couldn't request CQ notification: %w", errPPVerbs, err)
			}
			continue // completions queued before the re-arm are polled now
		}
		if err := ppCQErr(p.cq); err != nil {
			return 0, fmt.Errorf("%w: poll CQ failed: %w", errPPVerbs, err)
		}
		l.spins++
		if l.spins&0xff != 0 {
			runtime.Gosched() // busy poll, but let the device's goroutines run
			continue
		}
		now := time.Now()
		if now.After(l.deadline) {
			return 0, l.timeoutErr()
		}
		if l.spinSince.IsZero() {
			l.spinSince = now
			continue
		}
		if now.Sub(l.spinSince) < ppSpinLimit {
			continue
		}
		// Polled for ppSpinLimit without a completion: unlike an HCA, softroce's device runs
		// on the same CPUs as this loop, so sleep on the CQ until the next completion.
		if err := p.cq.ReqNotify(false); err != nil {
			return 0, fmt.Errorf("%w: Couldn't request CQ notification: %w", errPPVerbs, err)
		}
		if ne := p.cq.Poll(l.wcs); ne > 0 { // arrived before the arm
			l.deadline, l.spinSince = time.Now().Add(p.c.Timeout), time.Time{}
			return ne, nil
		}
		t := time.NewTimer(time.Until(l.deadline))
		select {
		case <-p.cq.Channel():
		case <-t.C:
		}
		t.Stop()
		l.spinSince = time.Time{}
	}
}

// ppSpinLimit is how long the polling loop (no -e) spins before it sleeps on the CQ.
const ppSpinLimit = 200 * time.Microsecond

func (l *ppLoop) timeoutErr() error {
	return fmt.Errorf("%w: no completion for %v (%d of %d SENDs and %d of %d RECVs completed): is the peer still there?",
		errPPTimeout, l.p.c.Timeout, l.scnt, l.p.c.Iters, l.rcnt, l.p.c.Iters)
}

// handle is parse_single_wc.
func (l *ppLoop) handle(wc *cq.WC) error {
	p, c := l.p, l.p.c
	if wc.Status != cq.StatusSuccess {
		return &ppWCError{WC: *wc}
	}
	qi := 0
	if c.Tool == pingpong.ToolSRQ { // find_qp
		i, ok := l.qpIndex[wc.QPNum]
		if !ok {
			return fmt.Errorf("%w: Couldn't find QPN %06x", errPPVerbs, wc.QPNum)
		}
		qi = i
	}
	kind := wc.WRID
	if p.srq != nil {
		kind &= 0xff
	}
	switch kind {
	case ppSendWRID:
		l.scnt++
	case ppRecvWRID:
		data := p.buf
		if p.srq != nil {
			slot := int(wc.WRID >> 8)
			if slot >= c.RxDepth {
				return fmt.Errorf("%w: Completion for unknown wr_id %d", errPPVerbs, int(wc.WRID))
			}
			data = p.buf[(c.NumQP+slot)*c.Size:][:c.Size]
			copy(p.last, data) // before the slot is posted again below
			p.haveLast = true
		}
		if p.env.OnRecv != nil {
			p.env.OnRecv(wc, data[:min(int(wc.ByteLen), len(data))])
		}
		if l.routs--; l.routs <= l.refillAt {
			l.routs += p.postRecv(c.RxDepth - l.routs)
			if l.routs < c.RxDepth {
				return fmt.Errorf("%w: Couldn't post receive (%d)", errPPVerbs, l.routs)
			}
		}
		l.rcnt++
	default:
		return fmt.Errorf("%w: Completion for unknown wr_id %d", errPPVerbs, int(wc.WRID))
	}
	p.pending[qi] &^= int(kind)
	if l.scnt < c.Iters && p.pending[qi] == 0 {
		if err := p.postSend(qi); err != nil {
			return fmt.Errorf("%w: Couldn't post send: %w", errPPVerbs, err)
		}
		p.pending[qi] = ppRecvWRID | ppSendWRID
	}
	return nil
}

// sendBufOf is the part of the buffer QP i's SENDs carry (ud: after the GRH room; srq: the
// QP's own send buffer).
func (p *ppCtx) sendBufOf(i int) []byte {
	switch p.c.Tool {
	case pingpong.ToolUD:
		return p.buf[ppGRHSize:]
	case pingpong.ToolSRQ:
		return p.buf[i*p.c.Size:][:p.c.Size]
	}
	return p.buf
}

// finalBuf is the buffer the client checks with -c: ctx->buf, the last message received
// (srq: its copy).
func (p *ppCtx) finalBuf() []byte {
	if p.srq != nil {
		if !p.haveLast {
			return p.sendBufOf(0)
		}
		return p.last
	}
	return p.sendBufOf(0)
}

// ppPageSize is sysconf(_SC_PAGESIZE), the stride of the -c pattern.
var ppPageSize = os.Getpagesize()

// ppFillPages writes the -c pattern of rdma-core v44: buf[i] = i / page_size % sizeof(char)
// at every page start, i.e. a zero byte (sizeof(char) is 1).
func ppFillPages(b []byte) {
	for i := 0; i < len(b); i += ppPageSize {
		//lint:ignore SA4028 rdma-core's expression, kept to show the pattern it writes
		b[i] = byte(i / ppPageSize % 1)
	}
}

// ppCheckPages is the client's -c check after the loop: one "invalid data in page %d" line
// (on stdout) per page whose first byte is not the pattern. Like the tools, it does not change
// the exit status. It returns the number of bad pages.
func ppCheckPages(w io.Writer, b []byte) int {
	bad := 0
	for i := 0; i < len(b); i += ppPageSize {
		//lint:ignore SA4028 rdma-core's expression, as in ppFillPages
		if b[i] != byte(i/ppPageSize%1) {
			fmt.Fprintf(w, "invalid data in page %d\n", i/ppPageSize)
			bad++
		}
	}
	return bad
}

// pingpongRun runs one pingpong as client (c.Server set) or server.
func pingpongRun(ctx context.Context, c *ppConfig, env *ppEnv) (err error) {
	oo := pingpong.Options{Options: oob.Options{Timeout: c.Timeout}, Records: c.Tool.Records()}
	var (
		ld *cli.VerbsDev
		p  *ppCtx
	)
	defer func() {
		if p != nil {
			err = errors.Join(err, p.close())
		}
		if ld != nil {
			err = errors.Join(err, ld.Close())
		}
	}()
	open := func(peer netip.Addr) error {
		var e error
		if ld, e = cli.OpenVerbs(c.Daemon, &c.Dev, cli.DevOptions{Port: c.RocePort, Portable: c.Portable, Peer: peer}); e != nil {
			return e
		}
		if p, e = newPPCtx(c, env, ld); e != nil {
			return e
		}
		for _, d := range p.mine {
			fmt.Fprint(env.Stdout, pingpong.LocalLine(c.Tool, d))
		}
		return nil
	}
	var remote []pingpong.Dest
	if c.Server != "" {
		host, err := cli.ResolveHost(ctx, c.Server, c.Timeout)
		if err != nil {
			return err
		}
		if err := open(host); err != nil {
			return err
		}
		conn, err := cli.Dial(ctx, netip.AddrPortFrom(host, uint16(c.Port)), c.Timeout)
		if err != nil {
			return err
		}
		remote, err = pingpong.Client(ctx, conn, p.mine, oo)
		conn.Close()
		if err != nil {
			return fmt.Errorf("Couldn't read/write remote address: %w", err)
		}
		for _, d := range remote[:c.NumQP] {
			fmt.Fprint(env.Stdout, pingpong.RemoteLine(d))
		}
		if err := p.connect(remote, host); err != nil {
			return err
		}
	} else {
		// Listen first, so that once the local address is printed a client can connect
		// (the tools print it just before listening).
		ln := env.Listener
		if ln == nil {
			if ln, err = net.Listen("tcp", ":"+strconv.Itoa(c.Port)); err != nil {
				return fmt.Errorf("Couldn't listen to port %d: %w", c.Port, err)
			}
		}
		defer ln.Close()
		if c.Dev.IsSet() {
			if err := open(netip.Addr{}); err != nil {
				return err
			}
		}
		actx, cancel := context.WithTimeout(ctx, c.Timeout)
		conn, err := oob.Accept(actx, ln)
		timedOut := ctx.Err() == nil && (actx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded))
		cancel()
		ln.Close()
		if err != nil {
			if timedOut {
				err = fmt.Errorf("%w: no client connected to port %d within %v", errPPTimeout, c.Port, c.Timeout)
			}
			return fmt.Errorf("accept() failed: %w", err)
		}
		tcpPeer := cli.AddrOf(conn.RemoteAddr())
		remote, err = pingpong.Server(ctx, conn, oo, func(r []pingpong.Dest) ([]pingpong.Dest, error) {
			if p == nil { // no -d: the device speaks from the address the client reached
				if err := open(cli.AddrOf(conn.LocalAddr())); err != nil {
					return nil, err
				}
			}
			if err := p.connect(r, tcpPeer); err != nil {
				return nil, fmt.Errorf("Couldn't connect to remote QP: %w", err)
			}
			return p.mine, nil
		})
		conn.Close()
		if err != nil {
			return fmt.Errorf("Couldn't send/recv local address: %w", err)
		}
		for _, d := range remote[:c.NumQP] {
			fmt.Fprint(env.Stdout, pingpong.RemoteLine(d))
		}
	}
	el, err := p.run(c.Server != "")
	if err != nil {
		return err
	}
	fmt.Fprint(env.Stdout, pingpong.ResultLines(c.Size, c.Iters, el))
	if c.Server != "" && c.Validate {
		ppCheckPages(env.Stdout, p.finalBuf())
	}
	return nil
}

// ppCQErr is the CQ's overrun error (ibv_poll_cq failing): the embedded CQ's Err; through the
// daemon an overrun arrives as an asynchronous event instead (nil here).
func ppCQErr(c roce.CompletionQueue) error {
	if e, ok := c.(interface{ Err() error }); ok {
		return e.Err()
	}
	return nil
}
