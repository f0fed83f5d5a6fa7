package main

// softroce conform: the packet-level conformance bench (pkg/conform, docs/conformance.md).

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"regexp"
	"time"

	"github.com/softroce/softroce/internal/rocetest"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/conform"
	conformlab "github.com/softroce/softroce/test/conform"
	"github.com/softroce/softroce/test/rxelab"
)

func init() {
	register(&command{name: "conform", summary: "run the IBTA conformance scenarios against a DUT (rxe, softroce or an agent)", run: runConform})
}

const conformUsage = `usage: softroce conform --dut rxe|softroce|HOST:PORT [--run PATTERN] [--json] [flags]

  --dut softroce    in-process softroce on loopback (127.0.79.1, bench 127.0.79.2)
  --dut softroce --daemon SOCKET
                    the softroce DUT through the softroce daemon on SOCKET: its objects made
                    through a client connection; --roce ADDR[:PORT] picks the daemon's address
                    (default its first IPv4 one) and RoCE port (default 4791), --bench ADDR the
                    bench socket's address (default 127.0.79.2 for a loopback DUT)
  --dut rxe         kernel rxe in the lab VM (test/rxelab; root): attaches to a running
                    VM or boots one (and stops it afterwards), builds and starts the C
                    agent in the guest (test/conform/agent)
  --serve HOST:PORT run the softroce DUT as an agent (RoCE on --roce, default HOST:4791)
                    for one bench connection, e.g. in another netns or machine; with
                    --daemon SOCKET the DUT is the daemon's device (--roce as above)
  --dut HOST:PORT   a running agent (test/conform/agent/softroce-dut, or --serve) at HOST:PORT; the
                    bench binds --bench:4791 and sends to --roce (default HOST:4791);
                    add --rxe when the agent drives kernel rxe (its deviations apply)

Prints scenario -> pass/fail/skip with the detail of each failure; exit status 1 if any
scenario failed, 2 on usage or setup errors. --json prints one object per scenario per
line: {"name","section","result","detail"}.
`

type conformFlags struct {
	dut, run, roce, bench string
	json, list, verbose   bool
	rxe                   bool
	serve                 string
	reply, quiet          time.Duration
	daemon                string // --daemon SOCKET: the softroce DUT through the daemon
}

func runConform(args []string, stdout, stderr io.Writer) int {
	var f conformFlags
	fs := flag.NewFlagSet("conform", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, conformUsage); fs.PrintDefaults() }
	fs.StringVar(&f.dut, "dut", "", "device under test: rxe, softroce or HOST:PORT of an agent")
	fs.StringVar(&f.run, "run", "", "run only scenarios whose name matches this regular expression")
	fs.BoolVar(&f.json, "json", false, "one JSON object per scenario per line")
	fs.BoolVar(&f.list, "list", false, "list the scenarios (name, IBTA section, summary; with --json also the documented deviations) and exit")
	fs.BoolVar(&f.verbose, "v", false, "print each failing scenario's packet trace")
	fs.StringVar(&f.roce, "roce", "", "DUT RoCE address for --dut HOST:PORT (default HOST:4791)")
	fs.StringVar(&f.bench, "bench", "", "bench socket address for --dut HOST:PORT (default: the local address toward HOST, port 4791)")
	fs.StringVar(&f.serve, "serve", "", "run the softroce DUT as an agent on this TCP HOST:PORT (RoCE on --roce, default HOST:4791) for one bench connection")
	fs.BoolVar(&f.rxe, "rxe", false, "with --dut HOST:PORT: the agent's device is kernel rxe (expect its documented deviations)")
	fs.DurationVar(&f.reply, "reply", 0, "how long to wait for an expected packet (default 2s, rxe 3s)")
	fs.DurationVar(&f.quiet, "quiet", 0, "how long a silence must last (default 300ms, rxe 400ms)")
	fs.StringVar(&f.daemon, "daemon", "", "with --dut softroce or --serve: the softroce DUT through the softroce daemon listening on this unix `socket`")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	scs := conform.Scenarios()
	if f.list {
		for _, s := range scs {
			if f.json {
				_ = json.NewEncoder(stdout).Encode(map[string]string{"name": s.Name, "section": s.Section, "summary": s.Summary,
					"rxe_deviation": s.RxeDeviation, "softroce": s.Softroce, "softroce_deviation": s.SoftroceDeviation})
				continue
			}
			fmt.Fprintf(stdout, "%-36s %-22s %s\n", s.Name, s.Section, s.Summary)
		}
		return 0
	}
	if f.serve != "" && fs.NArg() == 0 && f.dut == "" {
		if err := serveSoftroce(&f, stdout); err != nil {
			fmt.Fprintf(stderr, "softroce conform --serve: %v\n", err)
			return 2
		}
		return 0
	}
	if fs.NArg() != 0 || f.dut == "" {
		fs.Usage()
		return 2
	}
	if f.daemon != "" && f.dut != "softroce" {
		fmt.Fprintf(stderr, "softroce conform: --daemon goes with --dut softroce or --serve, not --dut %s\n", f.dut)
		return 2
	}
	var match *regexp.Regexp
	if f.run != "" {
		var err error
		if match, err = regexp.Compile(f.run); err != nil {
			fmt.Fprintf(stderr, "softroce conform: --run: %v\n", err)
			return 2
		}
	}
	bench, done, err := openDUT(&f, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "softroce conform: %v\n", err)
		return 2
	}
	if f.reply > 0 {
		bench.Reply = f.reply
	}
	if f.quiet > 0 {
		bench.Quiet = f.quiet
	}
	opts := conform.RunOptions{Match: match}
	if f.json {
		opts.Progress = func(r conform.Result) { _ = conform.WriteJSON(stdout, []conform.Result{r}) }
	}
	rs := conform.Run(bench, scs, opts)
	if err := done(); err != nil {
		fmt.Fprintf(stderr, "softroce conform: closing the DUT: %v\n", err)
	}
	failed := false
	for _, r := range rs {
		if r.Result == conform.Fail {
			failed = true
			if f.verbose {
				fmt.Fprintf(stderr, "--- %s trace:\n", r.Name)
				for _, l := range r.Log {
					fmt.Fprintf(stderr, "    %s\n", l)
				}
			}
		}
	}
	if !f.json {
		fmt.Fprintf(stdout, "DUT %s\n", bench.DUT.Name())
		conform.WriteTable(stdout, rs)
	}
	if len(rs) == 0 {
		fmt.Fprintln(stderr, "softroce conform: no scenario matched")
		return 2
	}
	if failed {
		return 1
	}
	return 0
}

// serveSoftroce runs the softroce DUT behind the control protocol for one connection
// (the Go counterpart of test/conform/agent/softroce-dut).
func serveSoftroce(f *conformFlags, stdout io.Writer) error {
	ctl, err := netip.ParseAddrPort(f.serve)
	if err != nil {
		return err
	}
	roce := netip.AddrPortFrom(ctl.Addr(), bth.UDPPort)
	if f.roce != "" && f.daemon == "" {
		if roce, err = netip.ParseAddrPort(f.roce); err != nil {
			return fmt.Errorf("--roce: %v", err)
		}
	}
	var dut *conform.Softroce
	if f.daemon != "" {
		d, done, err := conformDaemonDUT(f)
		if err != nil {
			return err
		}
		defer done()
		dut, roce = d, d.Addr()
	} else {
		if dut, err = conform.NewSoftroce(conform.SoftroceOptions{Addr: roce.Addr(), Port: roce.Port()}); err != nil {
			return err
		}
		defer dut.Close()
	}
	ln, err := net.Listen("tcp", ctl.String())
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "softroce conform: DUT %v, agent listening on %v\n", roce, ln.Addr())
	c, err := ln.Accept()
	ln.Close()
	if err != nil {
		return err
	}
	defer c.Close()
	return conform.Serve(c, dut, "softroce-conform")
}

// openDUT sets up the bench for --dut; done tears it down.
func openDUT(f *conformFlags, stderr io.Writer) (*conform.Bench, func() error, error) {
	switch f.dut {
	case "softroce":
		if f.daemon != "" {
			return openDaemonBench(f)
		}
		b, err := conform.NewLoopback(conform.LoopbackOptions{})
		if err != nil {
			return nil, nil, err
		}
		return b, b.Close, nil
	case "rxe":
		ctx := context.Background()
		unlock, err := conformlab.LockLab(30*time.Minute, func() { fmt.Fprintln(stderr, "softroce conform: waiting for another lab user (scripts/interop)") })
		if err != nil {
			return nil, nil, err
		}
		lab, err := rxelab.Start(ctx, rxelab.Options{Attach: true, MaxLife: 30 * time.Minute, Log: stderr})
		if err != nil {
			unlock()
			return nil, nil, err
		}
		r, err := conformlab.OpenRxe(ctx, lab)
		if err != nil {
			_ = lab.Stop()
			unlock()
			return nil, nil, err
		}
		return r.Bench, func() error {
			out, err := r.Close()
			if err != nil {
				fmt.Fprintf(stderr, "agent output:\n%s\n", out)
			}
			if serr := lab.Stop(); serr != nil && err == nil {
				err = serr
			}
			unlock()
			return err
		}, nil
	}
	agent, err := netip.ParseAddrPort(f.dut)
	if err != nil {
		return nil, nil, fmt.Errorf("--dut %q: not rxe, softroce or HOST:PORT: %v", f.dut, err)
	}
	roce := netip.AddrPortFrom(agent.Addr(), bth.UDPPort)
	if f.roce != "" {
		if roce, err = netip.ParseAddrPort(f.roce); err != nil {
			return nil, nil, fmt.Errorf("--roce: %v", err)
		}
	}
	local := netip.AddrPort{}
	if f.bench != "" {
		if local, err = netip.ParseAddrPort(f.bench); err != nil {
			return nil, nil, fmt.Errorf("--bench: %v", err)
		}
	} else {
		// the local address the kernel would use toward the DUT (no packet is sent)
		c, err := net.Dial("udp4", roce.String())
		if err != nil {
			return nil, nil, err
		}
		local = netip.AddrPortFrom(c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap(), bth.UDPPort)
		c.Close()
	}
	conn, err := net.DialTimeout("tcp", agent.String(), 10*time.Second)
	if err != nil {
		return nil, nil, err
	}
	cl, err := conform.NewClient(conn, conform.ClientOptions{Name: f.dut, RoCE: roce})
	if err != nil {
		return nil, nil, err
	}
	peer, err := rocetest.ListenPeer(rocetest.PeerOptions{Local: local})
	if err != nil {
		cl.Close()
		return nil, nil, err
	}
	b := &conform.Bench{DUT: cl, Peer: peer, Rxe: f.rxe}
	return b, b.Close, nil
}
