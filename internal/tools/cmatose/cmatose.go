// Package cmatose is `softroce ucmatose` and `softroce udaddy`: librdmacm's ucmatose (rdma-core librdmacm/examples/cmatose.c), wire-
// compatible with it: RC connections through rdma_cm (pkg/rdmacm, RDMA_PS_TCP, port 7471),
// then message_count SENDs of message_size bytes each way, then disconnection:
//
//   - server: listen (backlog 0); on each CONNECT_REQUEST create a PD, a send and a receive
//     CQ of message_count entries, an RC QP (sq_sig_all) with message_count WRs, post
//     message_count receives, rdma_accept(NULL); once every connection is ESTABLISHED, post
//     the SENDs, poll the send CQ, poll the receive CQ, rdma_disconnect, wait for
//     DISCONNECTED;
//   - client: resolve addr and route for each connection, create the same resources, post
//     the receives, rdma_connect (responder resources 1, initiator depth 1, retry 5); once
//     ESTABLISHED, poll the receives, post the replies, wait for the server's DISCONNECTED.
//
// Output lines, exit status (the last error: an event status such as a REJ reason, or 0)
// and options (-s -b -c -C -S -p; -t -f -P -m accepted) are those of ucmatose. Softroce
// differences: --dev names the server's device when -b is not given, --timeout bounds every
// wait, --roce-port / --portable as for rping.
package cmatose

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"time"

	"github.com/spf13/pflag"

	"github.com/softroce/softroce/internal/cm"
	"github.com/softroce/softroce/internal/tools/cli"
)

// UcmatoseCommand is `softroce ucmatose`.
var UcmatoseCommand = cli.Command{
	Name:    "ucmatose",
	Summary: "librdmacm ucmatose, wire-compatible (rdma_cm RC connections, SENDs both ways)",
	Main: func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
		return Main(ctx, false, args, stdout, stderr)
	},
}

// UdaddyCommand is `softroce udaddy`.
var UdaddyCommand = cli.Command{
	Name:    "udaddy",
	Summary: "librdmacm udaddy, wire-compatible (rdma_cm UD via SIDR, SEND with immediate both ways)",
	Main: func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
		return Main(ctx, true, args, stdout, stderr)
	},
}

// Config is a parsed ucmatose or udaddy command line.
type Config struct {
	UD       bool
	Dst, Src netip.Addr // -s, -b
	Port     uint16     // -p (ucmatose) / fixed 7174 (udaddy)
	Conns    int        // -c
	Count    int        // -C
	Size     int        // -S
	Dev      cli.DevFlag
	Timeout  time.Duration
	RocePort uint16
	Portable bool
	Daemon   string // --daemon SOCKET: through the softroce daemon

	// Log receives the tools' error messages (nil: discarded).
	Log io.Writer
	// OnListen, if set, is called once a server listens (tests).
	OnListen func()
}

// cmtConfig is the name the run's code uses for Config.
type cmtConfig = Config

func (c *cmtConfig) tool() string {
	if c.UD {
		return "udaddy"
	}
	return "cmatose"
}

// errQuiet: the error was already reported in the tools' words.
var errQuiet = errors.New("reported")

// flags are the command line's values before ParseArgs checks them.
type flags struct {
	Config
	dst, src, port, format, space string
	tos, ackTimeout, roceRaw      int
	migrate                       bool
}

// newFlagSet defines the getopt options of ucmatose ("s:b:f:P:c:C:S:t:p:a:m") or udaddy
// ("s:b:c:C:S:t:p:P:f:"): short options only, numbers read with atoi/strtoul as there; and
// softroce's long ones.
func newFlagSet(f *flags, ud bool) *pflag.FlagSet {
	fs := cli.NewFlagSet("cmatose")
	fs.StringVarP(&f.dst, cli.Short("s"), "s", "", "server_address")
	fs.StringVarP(&f.src, cli.Short("b"), "b", "", "bind_address")
	fs.StringVarP(&f.format, cli.Short("f"), "f", "", "address_format: name, ip, ipv6, or gid")
	fs.StringVarP(&f.space, cli.Short("P"), "P", "", "port_space")
	cli.CIntVarP(fs, &f.Conns, cli.Short("c"), "c", 1, 10, "connections")
	cli.CIntVarP(fs, &f.Count, cli.Short("C"), "C", 10, 10, "message_count")
	cli.CIntVarP(fs, &f.Size, cli.Short("S"), "S", 100, 10, "message_size")
	cli.CIntVarP(fs, &f.tos, cli.Short("t"), "t", 0, 0, "type_of_service")
	fs.StringVarP(&f.port, cli.Short("p"), "p", "", "port_number (udaddy: port_space)")
	if !ud {
		cli.CIntVarP(fs, &f.ackTimeout, cli.Short("a"), "a", 0, 0, "ack_timeout")
		fs.BoolVarP(&f.migrate, cli.Short("m"), "m", false, "migrate")
	}
	fs.Var(&f.Dev, "dev", "the server's device `ADDR|IFNAME` when -b does not name one")
	fs.DurationVar(&f.Timeout, "timeout", 30*time.Second, "bound of every wait (the tools wait forever)")
	cli.CIntVarP(fs, &f.roceRaw, "roce-port", "", 4791, 10, "RoCE UDP `port`")
	fs.BoolVar(&f.Portable, "portable", false, "plain UDP sockets instead of sendmmsg/recvmmsg")
	fs.StringVar(&f.Daemon, "daemon", "", "run through the softroce daemon on this unix `socket`: its device, its rdma_cm")
	return fs
}

// ParseArgs parses a ucmatose (ud false) or udaddy command line as its getopt reads it.
func ParseArgs(ud bool, args []string) (Config, error) {
	f := flags{Config: Config{UD: ud}}
	fs := newFlagSet(&f, ud)
	if err := cli.Parse(fs, args); err != nil {
		return Config{}, err
	}
	c := f.Config // operands are ignored, as by the tools (getopt moves them to the end)
	for _, a := range []struct {
		s   string
		dst *netip.Addr
	}{{f.dst, &c.Dst}, {f.src, &c.Src}} {
		if a.s == "" {
			continue
		}
		ip, err := cli.ParseIP(a.s)
		if err != nil {
			return c, fmt.Errorf("%w: getaddrinfo error: %q is not an IP address", cli.ErrUsage, a.s)
		}
		*a.dst = ip
	}
	c.Port = 7471
	switch {
	case ud && f.port != "": // udaddy: -p is the port space (backwards compatibility)
		if cm.PortSpace(cli.Strtol(f.port, 0)) != cm.PSUDP {
			return c, fmt.Errorf("%w: port space %s: only UDP (%#x) is supported", cli.ErrUsage, f.port, int(cm.PSUDP))
		}
	case f.port != "":
		p, err := strconv.ParseUint(f.port, 10, 16)
		if err != nil {
			return c, fmt.Errorf("%w: -p %q: a port number", cli.ErrUsage, f.port)
		}
		c.Port = uint16(p)
	}
	if ud {
		c.Port = 7174
	}
	if f.roceRaw <= 0 || f.roceRaw > 65535 {
		return c, fmt.Errorf("%w: bad --roce-port %d", cli.ErrUsage, f.roceRaw)
	}
	c.RocePort = uint16(f.roceRaw)
	if c.Timeout < 0 {
		return c, fmt.Errorf("%w: bad --timeout %v", cli.ErrUsage, c.Timeout)
	}
	if c.Conns < 1 {
		c.Conns = 1
	}
	if c.Size <= 0 {
		c.Count = 0 // create_message: no size, no messages
	}
	if c.Count < 0 {
		c.Count = 0
	}
	return c, nil
}

// Usage writes the tool's usage (as the tools print it, to stdout) and softroce's options.
func Usage(w io.Writer, ud bool) {
	name, ps := "ucmatose", "tcp or ib"
	if ud {
		name, ps = "udaddy", "udp or ipoib"
	}
	fmt.Fprintf(w, "usage: %s\n\t[-s server_address]\n\t[-b bind_address]\n\t[-f address_format]\n\t    name, ip, ipv6, or gid\n\t[-P port_space]\n\t    %s\n\t[-c connections]\n\t[-C message_count]\n\t[-S message_size]\n\t[-t type_of_service]\n", name, ps)
	if ud {
		fmt.Fprintf(w, "\t[-p port_space - %#x for UDP (default), %#x for IPOIB]\n", int(cm.PSUDP), int(cm.PSIPoIB))
	} else {
		fmt.Fprintf(w, "\t[-p port_number]\n\t[-m(igrate)]\n\t[-a ack_timeout]\n")
	}
	fmt.Fprintln(w, "softroce:")
	fs := newFlagSet(&flags{}, ud)
	fs.VisitAll(func(f *pflag.Flag) { f.Hidden = f.Shorthand != "" })
	cli.PrintFlags(w, fs)
}

// Main is the command (ucmatose, or udaddy with ud): exit status the tool's (the last error:
// an event status such as a REJ reason, or 0), 1 for a bad command line (with the usage on
// stdout).
func Main(ctx context.Context, ud bool, args []string, stdout, stderr io.Writer) int {
	return main(ctx, ud, args, stdout, stderr, nil)
}

// main is Main; seams, if set, adjusts the parsed Config (tests).
func main(ctx context.Context, ud bool, args []string, stdout, stderr io.Writer, seams func(*Config)) int {
	c, err := ParseArgs(ud, args)
	if err != nil {
		if !errors.Is(err, pflag.ErrHelp) {
			fmt.Fprintln(stderr, err)
		}
		Usage(stdout, ud)
		return 1
	}
	c.Log = stderr
	if seams != nil {
		seams(&c)
	}
	var st *StatusError
	if err := Run(ctx, c, stdout); errors.As(err, &st) {
		return st.Status & 0xFF
	}
	return 0
}

// StatusError is a run that ended with a non-zero status: the last error, an rdma_cm event's
// status such as a REJ reason, or -1, as the tools return it (and print it: "return status").
type StatusError struct{ Status int }

func (e *StatusError) Error() string { return fmt.Sprintf("return status %d", e.Status) }

// Run runs the tool as c says, printing its lines to out; a non-zero status is a *StatusError.
func Run(_ context.Context, c Config, out io.Writer) error {
	if c.Log == nil {
		c.Log = io.Discard
	}
	t := &cmTest{c: &c, out: out, errw: c.Log}
	ret := t.run()
	fmt.Fprintf(out, "test complete\n")
	t.destroy()
	fmt.Fprintf(out, "return status %d\n", ret)
	if ret != 0 {
		return &StatusError{Status: ret}
	}
	return nil
}
