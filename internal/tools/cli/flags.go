// Package cli holds what the softroce tools (internal/tools/...) share: the subcommand type
// of the softroce binary, GNU getopt-style command lines (github.com/spf13/pflag), the
// device and daemon selection (-d ADDR|IFNAME, --daemon SOCKET) and address parsing.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"
)

// Command is one subcommand of the softroce binary.
type Command struct {
	// Name is the subcommand's name (softroce NAME ...).
	Name string
	// Summary is its one-line description in softroce's usage.
	Summary string
	// Main parses args (the words after the name), runs the tool and returns the process exit
	// status, writing the tool's output to stdout and diagnostics to stderr.
	Main func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

// NewFlagSet returns a flag set that parses a command line as GNU getopt_long does, which is
// how perftest and the rdma-core tools read theirs: short options with a separate or attached
// value (-s 65536, -s65536), grouped short options (-aF, -vVd), long options with = or a
// separate value (--size=65536, --size 65536), options and operands in any order, -- ending
// the options. Parse adds getopt_long's unambiguous abbreviations of long options. Errors
// are returned, not printed: the tool reports them its own way.
func NewFlagSet(name string) *pflag.FlagSet {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.SortFlags = false
	fs.SetInterspersed(true)
	return fs
}

// Parse parses args with fs (made by NewFlagSet). As getopt_long, a long option may be
// abbreviated to any prefix that names one option only (--iter for --iters); an exact name
// always wins. -h and --help, unless the tool defines them, return pflag.ErrHelp; every other
// error wraps ErrUsage.
func Parse(fs *pflag.FlagSet, args []string) error {
	var names []string
	fs.VisitAll(func(f *pflag.Flag) { names = append(names, f.Name) })
	fs.SetNormalizeFunc(func(_ *pflag.FlagSet, name string) pflag.NormalizedName {
		return pflag.NormalizedName(expandPrefix(names, name))
	})
	err := fs.Parse(args)
	if err != nil && !errors.Is(err, pflag.ErrHelp) {
		err = fmt.Errorf("%w: %w", ErrUsage, err)
	}
	return err
}

// expandPrefix returns the one name of names that name abbreviates, or name itself when it is
// a name, abbreviates none or is ambiguous.
func expandPrefix(names []string, name string) string {
	match := ""
	for _, n := range names {
		if n == name {
			return name
		}
		if strings.HasPrefix(n, name) {
			if match != "" {
				return name
			}
			match = n
		}
	}
	if match == "" {
		return name
	}
	return match
}

// Short is the name to define a short-only option with (the rdma-core examples that use
// plain getopt have no long options): a name starting with "-" cannot be typed as a long
// option (---a is a syntax error to pflag), and PrintFlags shows the option as -a only.
func Short(letter string) string { return "-" + letter }

// PrintFlags writes fs's flags (hidden ones left out) as getopt tools list their options:
//
//	-s, --size=<size>   Size of message to exchange (default 65536)
//
// The value's name is the usage text's first `quoted` word, else the value type; a default
// that is not the zero value is added unless the text says "default" itself.
func PrintFlags(w io.Writer, fs *pflag.FlagSet) {
	type line struct{ left, usage string }
	var lines []line
	width := 0
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		name, usage := pflag.UnquoteUsage(f)
		left := "    "
		switch {
		case f.Name == Short(f.Shorthand):
			left = "-" + f.Shorthand
		case f.Shorthand != "":
			left = "-" + f.Shorthand + ", --" + f.Name
		default:
			left += "--" + f.Name
		}
		if f.Value.Type() != "bool" && name != "" {
			if f.Name == Short(f.Shorthand) {
				left += " <" + name + ">"
			} else {
				left += "=<" + name + ">"
			}
		}
		if d := f.DefValue; d != "" && d != "0" && d != "false" && d != "[]" && d != "0s" &&
			!strings.Contains(usage, "default") {
			usage += fmt.Sprintf(" (default %s)", d)
		}
		width = max(width, len(left))
		lines = append(lines, line{left, usage})
	})
	for _, l := range lines {
		fmt.Fprintf(w, "  %-*s  %s\n", width, l.left, l.usage)
	}
}

// Unsupported adds options a tool recognises but does not implement: given, Given names them, so
// that the tool can refuse them with a clear error where an unknown option would only say
// "unknown flag". They are left out of the help.
type Unsupported struct {
	fs    *pflag.FlagSet
	names []string
}

// NewUnsupported returns an empty set for fs.
func NewUnsupported(fs *pflag.FlagSet) *Unsupported { return &Unsupported{fs: fs} }

// Bool adds an option without a value; short may be empty.
func (u *Unsupported) Bool(short, long, usage string) {
	u.fs.BoolP(long, short, false, usage)
	u.fs.Lookup(long).Hidden = true
	u.names = append(u.names, long)
}

// Value adds an option that takes a value; short may be empty.
func (u *Unsupported) Value(short, long, usage string) {
	u.fs.StringP(long, short, "", usage)
	u.fs.Lookup(long).Hidden = true
	u.names = append(u.names, long)
}

// Given returns the first given option as "-s/--long" (or "--long"), or "".
func (u *Unsupported) Given() string {
	for _, n := range u.names {
		if f := u.fs.Lookup(n); f.Changed {
			if f.Shorthand != "" {
				return "-" + f.Shorthand + "/--" + f.Name
			}
			return "--" + f.Name
		}
	}
	return ""
}
