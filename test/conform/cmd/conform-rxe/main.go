// Command conform-rxe runs the conformance bench (pkg/conform) against kernel rxe in the lab VM
// (test/rxelab): it takes the lab lock, attaches to a running VM or boots one (and stops it
// afterwards), builds the C agent (test/conform/agent) and starts it in the guest on rxe0, and
// reports as `softroce conform` does (internal/tools/conform RunBench). It lives in the source
// tree because it needs the lab's scripts and the agent's source; the softroce binary itself
// runs only agents it is given (--dut HOST:PORT --rxe).
//
//	sudo go run ./test/conform/cmd/conform-rxe [--run PATTERN] [--json] [-v] [--reply D] [--quiet D]
//
// Exit status as `softroce conform`: 0, 1 if a scenario failed, 2 on usage or setup errors.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"time"

	"github.com/spf13/pflag"

	"github.com/softroce/softroce/internal/tools/cli"
	"github.com/softroce/softroce/internal/tools/conform"
	conformlab "github.com/softroce/softroce/test/conform"
	"github.com/softroce/softroce/test/rxelab"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	var c conform.Config
	var match string
	fs := cli.NewFlagSet("conform-rxe")
	fs.StringVar(&match, "run", "", "run only scenarios whose name matches this regular `expression`")
	fs.BoolVar(&c.JSON, "json", false, "one JSON object per scenario per line")
	fs.BoolVarP(&c.Verbose, "verbose", "v", false, "print each failing scenario's packet trace")
	fs.DurationVar(&c.Reply, "reply", 0, "how long to wait for an expected packet (default 3s)")
	fs.DurationVar(&c.Quiet, "quiet", 0, "how long a silence must last (default 400ms)")
	err := cli.Parse(fs, args)
	if err == nil && fs.NArg() != 0 {
		err = fmt.Errorf("%w: unexpected argument %q", cli.ErrUsage, fs.Arg(0))
	}
	if err == nil && match != "" {
		if c.Match, err = regexp.Compile(match); err != nil {
			err = fmt.Errorf("%w: --run: %w", cli.ErrUsage, err)
		}
	}
	if err != nil {
		w, st := stderr, 2
		if errors.Is(err, pflag.ErrHelp) {
			w, st = stdout, 0
		} else {
			fmt.Fprintf(stderr, "conform-rxe: %v\n", err)
		}
		fmt.Fprintln(w, "usage: go run ./test/conform/cmd/conform-rxe [options]   (root; the lab: docs/conformance.md)\n\nOptions:")
		cli.PrintFlags(w, fs)
		return st
	}
	c.Log = stderr
	err = runRxe(c, stdout, stderr)
	if err != nil && !errors.Is(err, conform.ErrFailed) {
		fmt.Fprintf(stderr, "conform-rxe: %v\n", err)
	}
	return conform.Status(err)
}

// runRxe holds the lab for the run: lock, VM, agent, bench.
func runRxe(c conform.Config, stdout, stderr io.Writer) (err error) {
	ctx := context.Background()
	unlock, err := conformlab.LockLab(30*time.Minute, func() { fmt.Fprintln(stderr, "conform-rxe: waiting for another lab user (scripts/interop)") })
	if err != nil {
		return err
	}
	defer unlock()
	lab, err := rxelab.Start(ctx, rxelab.Options{Attach: true, MaxLife: 30 * time.Minute, Log: stderr})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, lab.Stop()) }()
	r, err := conformlab.OpenRxe(ctx, lab)
	if err != nil {
		return err
	}
	defer func() {
		out, cerr := r.Close()
		if cerr != nil {
			fmt.Fprintf(stderr, "agent output:\n%s\n", out)
			err = errors.Join(err, cerr)
		}
	}()
	return conform.RunBench(r.Bench, c, stdout)
}
