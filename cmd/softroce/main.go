// Command softroce is the CLI and daemon of softroce, a userspace RoCEv2
// (InfiniBand transport over UDP 4791) stack.
//
// Each subcommand lives in its own file and registers itself in init with
// register, so subcommands can be added without touching this file.
package main

import (
	"fmt"
	"io"
	"os"
	"sort"
)

// command is one subcommand of the CLI.
type command struct {
	name    string
	summary string
	// run executes the subcommand with the arguments after its name and
	// returns the process exit status.
	run func(args []string, stdout, stderr io.Writer) int
}

var commands = map[string]*command{}

// register adds a subcommand; it is called from init functions.
func register(c *command) {
	if _, dup := commands[c.name]; dup {
		panic("softroce: duplicate command " + c.name)
	}
	commands[c.name] = c
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: softroce COMMAND [flags] [args]")
	fmt.Fprintln(w, "\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
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
	return c.run(args[1:], stdout, stderr)
}
