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

	"github.com/softroce/softroce/internal/tools/cli"
	"github.com/softroce/softroce/internal/tools/cmatose"
	"github.com/softroce/softroce/internal/tools/conform"
	"github.com/softroce/softroce/internal/tools/daemon"
	"github.com/softroce/softroce/internal/tools/decode"
	"github.com/softroce/softroce/internal/tools/demo"
	"github.com/softroce/softroce/internal/tools/devinfo"
	"github.com/softroce/softroce/internal/tools/perf"
	"github.com/softroce/softroce/internal/tools/pingpong"
	"github.com/softroce/softroce/internal/tools/rping"
	"github.com/softroce/softroce/internal/tools/stats"
)

// commands are the subcommands, in the order usage lists them.
var commands = []cli.Command{
	conform.Command, daemon.Command, decode.Command, demo.Command, devinfo.Command, perf.Command,
	pingpong.Command, rping.Command, stats.Command, cmatose.UcmatoseCommand, cmatose.UdaddyCommand,
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: softroce COMMAND [options] [args]   (softroce COMMAND -h: the command's options)")
	fmt.Fprintln(w, "\ncommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-10s %s\n", c.Name, c.Summary)
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
	for _, c := range commands {
		if c.Name == args[0] {
			return c.Main(context.Background(), args[1:], stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "softroce: unknown command %q\n", args[0])
	usage(stderr)
	return 2
}
