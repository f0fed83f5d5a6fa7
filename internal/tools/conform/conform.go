// Package conform is `softroce conform`: the packet-level conformance bench (pkg/conform,
// docs/conformance.md) against the softroce DUT (in process, or through the daemon) or an
// agent over the control protocol, and the softroce DUT served as such an agent (--serve).
//
// Kernel rxe in the lab VM is driven from the source tree, not by this command: the lab's
// driver (test/conform/cmd/conform-rxe) boots or attaches to the VM, starts the C agent in
// the guest and runs the same report through RunBench. The command itself depends on nothing
// outside the installed binary.
package conform

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"regexp"
	"time"

	"github.com/spf13/pflag"

	"github.com/softroce/softroce/internal/rocetest"
	"github.com/softroce/softroce/internal/tools/cli"
	"github.com/softroce/softroce/pkg/bth"
	conformance "github.com/softroce/softroce/pkg/conform"
)

// Command is `softroce conform`.
var Command = cli.Command{
	Name:    "conform",
	Summary: "run the IBTA conformance scenarios against a DUT (softroce, or an agent: kernel rxe's in the lab)",
	Main:    Main,
}

// usageText is the command's usage, before its options.
const usageText = `usage: softroce conform --dut softroce|HOST:PORT [--run PATTERN] [--json] [options]
       softroce conform --serve HOST:PORT [--roce ADDR:PORT] [--daemon SOCKET]
       softroce conform --list [--json]

  --dut softroce    in-process softroce on loopback (127.0.79.1, bench 127.0.79.2)
  --dut softroce --daemon SOCKET
                    the softroce DUT through the softroce daemon on SOCKET: its objects made
                    through a client connection; --roce ADDR[:PORT] picks the daemon's address
                    (default its first IPv4 one) and RoCE port (default 4791), --bench ADDR the
                    bench socket's address (default 127.0.79.2 for a loopback DUT)
  --serve HOST:PORT run the softroce DUT as an agent (RoCE on --roce, default HOST:4791)
                    for one bench connection, e.g. in another netns or machine; with
                    --daemon SOCKET the DUT is the daemon's device (--roce as above)
  --dut HOST:PORT   a running agent (test/conform/agent/softroce-dut, or --serve) at HOST:PORT; the
                    bench binds --bench:4791 and sends to --roce (default HOST:4791);
                    add --rxe when the agent drives kernel rxe (its deviations apply)

Kernel rxe in the lab VM: from a source checkout, go run ./test/conform/cmd/conform-rxe
(root; docs/conformance.md), which takes the options below too.

Prints scenario -> pass/fail/skip with the detail of each failure; exit status 1 if any
scenario failed, 2 on usage or setup errors. --json prints one object per scenario per
line: {"name","section","result","detail"}.

Options:
`

// Config is a parsed conform command line.
type Config struct {
	// DUT is "softroce" or the HOST:PORT of an agent.
	DUT string
	// Match selects the scenarios to run (nil: all).
	Match *regexp.Regexp
	// JSON prints one object per scenario per line; List lists the scenarios and exits;
	// Verbose prints each failing scenario's packet trace (to Log).
	JSON, List, Verbose bool
	// Roce is the DUT's RoCE address (ADDR[:PORT]), Bench the bench socket's.
	Roce, Bench string
	// Rxe: the agent's device is kernel rxe (its documented deviations apply).
	Rxe bool
	// Serve, if set, runs the softroce DUT as an agent on this TCP HOST:PORT.
	Serve string
	// Reply and Quiet override how long an expected packet is waited for and how long a
	// silence must last (0: the bench's defaults).
	Reply, Quiet time.Duration
	// Daemon, with DUT softroce or Serve: the DUT through the softroce daemon on this socket.
	Daemon string
	// Log receives the traces (Verbose) and the closing errors (nil: discarded).
	Log io.Writer
}

// conformFlags is the name the daemon code uses for Config.
type conformFlags = Config

// ErrFailed is returned by Run and RunBench when a scenario failed (the report says which).
var ErrFailed = errors.New("a scenario failed")

// errNoMatch: --run selected no scenario.
var errNoMatch = errors.New("no scenario matched")

type flags struct {
	Config
	run string
}

func newFlagSet(f *flags) *pflag.FlagSet {
	fs := cli.NewFlagSet("conform")
	fs.StringVar(&f.DUT, "dut", "", "device under test: softroce or the `HOST:PORT` of an agent")
	fs.StringVar(&f.run, "run", "", "run only scenarios whose name matches this regular `expression`")
	fs.BoolVar(&f.JSON, "json", false, "one JSON object per scenario per line")
	fs.BoolVar(&f.List, "list", false, "list the scenarios (name, IBTA section, summary; with --json also the documented deviations) and exit")
	fs.BoolVarP(&f.Verbose, "verbose", "v", false, "print each failing scenario's packet trace")
	fs.StringVar(&f.Roce, "roce", "", "DUT RoCE address `ADDR[:PORT]` (default HOST:4791)")
	fs.StringVar(&f.Bench, "bench", "", "bench socket `ADDR[:PORT]` for --dut HOST:PORT (default: the local address toward HOST, port 4791)")
	fs.StringVar(&f.Serve, "serve", "", "run the softroce DUT as an agent on this TCP `HOST:PORT` (RoCE on --roce, default HOST:4791) for one bench connection")
	fs.BoolVar(&f.Rxe, "rxe", false, "with --dut HOST:PORT: the agent's device is kernel rxe (expect its documented deviations)")
	fs.DurationVar(&f.Reply, "reply", 0, "how long to wait for an expected packet (default 2s, rxe 3s)")
	fs.DurationVar(&f.Quiet, "quiet", 0, "how long a silence must last (default 300ms, rxe 400ms)")
	fs.StringVar(&f.Daemon, "daemon", "", "with --dut softroce or --serve: the softroce DUT through the softroce daemon listening on this unix `socket`")
	return fs
}

// Usage writes the command's usage and options.
func Usage(w io.Writer) {
	fmt.Fprint(w, usageText)
	cli.PrintFlags(w, newFlagSet(&flags{}))
}

// ParseArgs parses the conform command line (GNU getopt style, cli.NewFlagSet).
func ParseArgs(args []string) (Config, error) {
	var f flags
	fs := newFlagSet(&f)
	if err := cli.Parse(fs, args); err != nil {
		return Config{}, err
	}
	c := f.Config
	switch {
	case fs.NArg() != 0:
		return c, fmt.Errorf("%w: unexpected argument %q", cli.ErrUsage, fs.Arg(0))
	case c.List:
		return c, nil
	case c.Serve != "" && c.DUT != "":
		return c, fmt.Errorf("%w: --serve and --dut exclude each other", cli.ErrUsage)
	case c.Serve == "" && c.DUT == "":
		return c, fmt.Errorf("%w: name the DUT with --dut, or --serve", cli.ErrUsage)
	case c.DUT == "rxe":
		return c, fmt.Errorf("%w: --dut rxe: kernel rxe in the lab VM is driven from a source checkout: go run ./test/conform/cmd/conform-rxe (docs/conformance.md); or start the agent yourself and use --dut HOST:PORT --rxe", cli.ErrUsage)
	case c.Daemon != "" && c.DUT != "softroce" && c.Serve == "":
		return c, fmt.Errorf("%w: --daemon goes with --dut softroce or --serve, not --dut %s", cli.ErrUsage, c.DUT)
	}
	if f.run != "" {
		m, err := regexp.Compile(f.run)
		if err != nil {
			return c, fmt.Errorf("%w: --run: %w", cli.ErrUsage, err)
		}
		c.Match = m
	}
	return c, nil
}

// Main is the command: exit status 0, 1 if a scenario failed, 2 on usage or setup errors.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := ParseArgs(args)
	if errors.Is(err, pflag.ErrHelp) {
		Usage(stdout)
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "softroce conform: %v\n", err)
		if errors.Is(err, cli.ErrUsage) {
			Usage(stderr)
		}
		return 2
	}
	c.Log = stderr
	err = Run(ctx, c, stdout)
	if err != nil && !errors.Is(err, ErrFailed) {
		fmt.Fprintf(stderr, "softroce conform: %v\n", err)
	}
	return Status(err)
}

// Status is the exit status of an error of Run or RunBench: 0, 1 for ErrFailed, 2 otherwise.
func Status(err error) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, ErrFailed):
		return 1
	}
	return 2
}

// Run lists the scenarios, serves the softroce DUT, or runs the scenarios against the DUT c
// names, writing the report to out.
func Run(ctx context.Context, c Config, out io.Writer) error {
	if c.Log == nil {
		c.Log = io.Discard
	}
	if c.List {
		return list(c, out)
	}
	if c.Serve != "" {
		if err := serveSoftroce(&c, out); err != nil {
			return fmt.Errorf("--serve: %w", err)
		}
		return nil
	}
	bench, done, err := openDUT(&c)
	if err != nil {
		return err
	}
	err = RunBench(bench, c, out)
	if derr := done(); derr != nil {
		fmt.Fprintf(c.Log, "softroce conform: closing the DUT: %v\n", derr)
	}
	return err
}

// list writes the scenarios (--list).
func list(c Config, out io.Writer) error {
	for _, s := range conformance.Scenarios() {
		if c.JSON {
			_ = json.NewEncoder(out).Encode(map[string]string{"name": s.Name, "section": s.Section, "summary": s.Summary,
				"rxe_deviation": s.RxeDeviation, "softroce": s.Softroce, "softroce_deviation": s.SoftroceDeviation})
			continue
		}
		fmt.Fprintf(out, "%-36s %-22s %s\n", s.Name, s.Section, s.Summary)
	}
	return nil
}

// RunBench runs the scenarios c selects on b and writes the report to out as the command does
// (the table, or with c.JSON one object per scenario as each ends; with c.Verbose the trace of
// each failure to c.Log). It returns ErrFailed when a scenario failed. The lab's rxe driver
// runs it on a bench facing the guest's agent.
func RunBench(b *conformance.Bench, c Config, out io.Writer) error {
	if c.Log == nil {
		c.Log = io.Discard
	}
	if c.Reply > 0 {
		b.Reply = c.Reply
	}
	if c.Quiet > 0 {
		b.Quiet = c.Quiet
	}
	opts := conformance.RunOptions{Match: c.Match}
	if c.JSON {
		opts.Progress = func(r conformance.Result) { _ = conformance.WriteJSON(out, []conformance.Result{r}) }
	}
	rs := conformance.Run(b, conformance.Scenarios(), opts)
	failed := false
	for _, r := range rs {
		if r.Result == conformance.Fail {
			failed = true
			if c.Verbose {
				fmt.Fprintf(c.Log, "--- %s trace:\n", r.Name)
				for _, l := range r.Log {
					fmt.Fprintf(c.Log, "    %s\n", l)
				}
			}
		}
	}
	if !c.JSON {
		fmt.Fprintf(out, "DUT %s\n", b.DUT.Name())
		conformance.WriteTable(out, rs)
	}
	switch {
	case len(rs) == 0:
		return errNoMatch
	case failed:
		return ErrFailed
	}
	return nil
}

// serveSoftroce runs the softroce DUT behind the control protocol for one connection
// (the Go counterpart of test/conform/agent/softroce-dut).
func serveSoftroce(c *Config, stdout io.Writer) error {
	ctl, err := netip.ParseAddrPort(c.Serve)
	if err != nil {
		return err
	}
	roce := netip.AddrPortFrom(ctl.Addr(), bth.UDPPort)
	if c.Roce != "" && c.Daemon == "" {
		if roce, err = cli.ParseAddrPort(c.Roce, bth.UDPPort); err != nil {
			return fmt.Errorf("--roce: %w", err)
		}
	}
	var dut *conformance.Softroce
	if c.Daemon != "" {
		d, done, err := conformDaemonDUT(c)
		if err != nil {
			return err
		}
		defer done()
		dut, roce = d, d.Addr()
	} else {
		if dut, err = conformance.NewSoftroce(conformance.SoftroceOptions{Addr: roce.Addr(), Port: roce.Port()}); err != nil {
			return err
		}
		defer dut.Close()
	}
	ln, err := net.Listen("tcp", ctl.String())
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "softroce conform: DUT %v, agent listening on %v\n", roce, ln.Addr())
	conn, err := ln.Accept()
	ln.Close()
	if err != nil {
		return err
	}
	defer conn.Close()
	return conformance.Serve(conn, dut, "softroce-conform")
}

// openDUT sets up the bench for --dut; done tears it down.
func openDUT(c *Config) (*conformance.Bench, func() error, error) {
	if c.DUT == "softroce" {
		if c.Daemon != "" {
			return openDaemonBench(c)
		}
		b, err := conformance.NewLoopback(conformance.LoopbackOptions{})
		if err != nil {
			return nil, nil, err
		}
		return b, b.Close, nil
	}
	agent, err := netip.ParseAddrPort(c.DUT)
	if err != nil {
		return nil, nil, fmt.Errorf("--dut %q: not softroce or HOST:PORT: %v", c.DUT, err)
	}
	roce := netip.AddrPortFrom(agent.Addr(), bth.UDPPort)
	if c.Roce != "" {
		if roce, err = cli.ParseAddrPort(c.Roce, bth.UDPPort); err != nil {
			return nil, nil, fmt.Errorf("--roce: %w", err)
		}
	}
	local := netip.AddrPort{}
	if c.Bench != "" {
		if local, err = cli.ParseAddrPort(c.Bench, bth.UDPPort); err != nil {
			return nil, nil, fmt.Errorf("--bench: %w", err)
		}
	} else {
		// the local address the kernel would use toward the DUT (no packet is sent)
		conn, err := net.Dial("udp4", roce.String())
		if err != nil {
			return nil, nil, err
		}
		local = netip.AddrPortFrom(conn.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap(), bth.UDPPort)
		conn.Close()
	}
	conn, err := net.DialTimeout("tcp", agent.String(), 10*time.Second)
	if err != nil {
		return nil, nil, err
	}
	cl, err := conformance.NewClient(conn, conformance.ClientOptions{Name: c.DUT, RoCE: roce})
	if err != nil {
		return nil, nil, err
	}
	peer, err := rocetest.ListenPeer(rocetest.PeerOptions{Local: local})
	if err != nil {
		cl.Close()
		return nil, nil, err
	}
	b := &conformance.Bench{DUT: cl, Peer: peer, Rxe: c.Rxe}
	return b, b.Close, nil
}
