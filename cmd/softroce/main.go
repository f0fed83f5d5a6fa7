// Command softroce is the CLI and daemon of softroce, a userspace RoCEv2
// (InfiniBand transport over UDP 4791) stack.
//
// Each subcommand is a package under internal/tools; this file only dispatches to them.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"

	"github.com/softroce/softroce/internal/tools/cli"
	"github.com/softroce/softroce/internal/tools/cmatose"
	"github.com/softroce/softroce/internal/tools/conform"
	"github.com/softroce/softroce/internal/tools/daemon"
	"github.com/softroce/softroce/internal/tools/demo"
	"github.com/softroce/softroce/internal/tools/devinfo"
	"github.com/softroce/softroce/internal/tools/perf"
	"github.com/softroce/softroce/internal/tools/pingpong"
	"github.com/softroce/softroce/internal/tools/rping"
	"github.com/softroce/softroce/internal/tools/stats"
)

// command is a subcommand not yet moved to its own package (see register).
type command struct {
	name    string
	summary string
	// run executes the subcommand with the arguments after its name and
	// returns the process exit status.
	run func(args []string, stdout, stderr io.Writer) int
}

var commands = map[string]cli.Command{}

func init() {
	for _, c := range []cli.Command{cmatose.UcmatoseCommand, cmatose.UdaddyCommand, conform.Command, daemon.Command, demo.Command, devinfo.Command,
		perf.Command, pingpong.Command, rping.Command, stats.Command} {
		add(c)
	}
}

// add adds a subcommand.
func add(c cli.Command) {
	if _, dup := commands[c.Name]; dup {
		panic("softroce: duplicate command " + c.Name)
	}
	commands[c.Name] = c
}

// register adds a subcommand of package main; it is called from init functions.
func register(c *command) {
	add(cli.Command{Name: c.name, Summary: c.summary,
		Main: func(_ context.Context, args []string, stdout, stderr io.Writer) int {
			return c.run(args, stdout, stderr)
		}})
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: softroce COMMAND [options] [args]   (softroce COMMAND -h: the command's options)")
	fmt.Fprintln(w, "\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].Summary)
	}
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "softroce: unknown command %q\n", args[0])
		usage(stderr)
		return 2
	}
	return c.Main(context.Background(), args[1:], stdout, stderr)
}
