// Package daemon is `softroce daemon`: one RoCE endpoint per host shared by local programs
// (internal/daemon; clients use pkg/client). See docs/daemon.md.
package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"os/user"
	"path/filepath"
	"runtime/pprof"
	"runtime/trace"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	daemonsrv "github.com/softroce/softroce/internal/daemon"
	"github.com/softroce/softroce/internal/event"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/internal/tools/cli"
	"github.com/softroce/softroce/pkg/client"
	"github.com/softroce/softroce/pkg/link/udp"
	"github.com/softroce/softroce/pkg/roce"
)

// Command is `softroce daemon`.
var Command = cli.Command{
	Name:    "daemon",
	Summary: "run the shared RoCE endpoint for local programs (unix socket)",
	Main:    Main,
}

// fileConfig is the --config file (JSON); options given on the command line win.
type fileConfig struct {
	Listen  []string `json:"listen"`
	Socket  string   `json:"socket"`
	Group   string   `json:"group"`
	Metrics string   `json:"metrics"`
	Name    string   `json:"name"`
	Port    uint16   `json:"port"`
	MTU     int      `json:"mtu"`
	Workers int      `json:"workers"`
	Log     string   `json:"log"` // "text" (default) or "json"
	// RxeFlushICRC is --rxe-flush-icrc.
	RxeFlushICRC bool `json:"rxe_flush_icrc"`
	// Limits are the per-user limits ({"qps": 64, "mapped_bytes": 1073741824, ...}; a key
	// left out keeps its default, -1 = none; docs/daemon.md).
	Limits daemonsrv.Limits `json:"limits"`
	// CC is the device's congestion control, --cc's settings ("rp_ai_rate=1,...";
	// docs/congestion.md); --cc on the command line is applied after it.
	CC string `json:"cc"`
}

// Config is a parsed daemon command line (the --config file merged in).
type Config struct {
	// Device is the device: its addresses or interface, port, MTU and name.
	Device roce.UDPOptions
	// Socket is the unix socket for local clients (mode 0660), owned by group GID (-1: the
	// daemon's group).
	Socket string
	GID    int
	// Metrics, if valid, is the loopback address of the Prometheus text metrics.
	Metrics netip.AddrPort
	// JSONLog logs as JSON instead of text.
	JSONLog bool
	// CPUProfile, if set, is where a CPU profile of the run is written.
	CPUProfile string
	// Trace, if set, is where a Go execution trace of the run is written.
	Trace string
	// Limits (per user) and PostSpin are internal/daemon's Options.
	Limits   daemonsrv.Limits
	PostSpin time.Duration
	// Signals, if set, stops the daemon when it receives a value (Main: SIGTERM, SIGINT).
	Signals <-chan os.Signal
}

// flags are the command line's values before ParseArgs checks them.
type flags struct {
	Config
	listen                                []string
	socket, group, cfgPath, metrics, name string
	logFmt                                string
	limits                                []string
	port                                  uint
	mtu, workers                          int
	cc                                    []string
	rxeFlushICRC                          bool
}

func newFlagSet(f *flags) *pflag.FlagSet {
	fs := cli.NewFlagSet("daemon")
	fs.StringArrayVarP(&f.listen, "listen", "l", nil, "local `address` or interface to bind UDP 4791 on (repeatable; default: every address of every up interface)")
	fs.StringVarP(&f.socket, "socket", "s", client.DefaultSocket, "unix `socket` path for local clients (mode 0660)")
	fs.StringVarP(&f.group, "group", "g", "", "`group` owning the socket (name or gid)")
	fs.StringVarP(&f.cfgPath, "config", "c", "", "JSON config `file` (keys: listen, socket, group, metrics, name, port, mtu, workers, log, limits, cc, rxe_flush_icrc)")
	fs.StringVar(&f.metrics, "metrics", "", "serve Prometheus text metrics on this loopback `ADDR:PORT` (opt-in)")
	fs.StringVar(&f.name, "name", "softroce0", "device `name`")
	fs.UintVar(&f.port, "port", 4791, "RoCE UDP `port` (tests only; peers must use the same)")
	fs.IntVar(&f.mtu, "mtu", 0, "active MTU in `bytes` (256..4096; 0 = from the interface MTU)")
	fs.IntVar(&f.workers, "workers", 0, fmt.Sprintf("receive `workers`: SO_REUSEPORT sockets, each packet steered to worker destination QP mod N, so N busy QPs use up to N cores (0 or 1: one; at most %d)", udp.MaxShards))
	fs.StringVar(&f.logFmt, "log", "text", "log `format`: text or json")
	fs.StringVar(&f.CPUProfile, "cpuprofile", "", "write a CPU profile of the daemon's run to this `file` (diagnostics)")
	fs.StringVar(&f.Trace, "trace", "", "write a Go execution trace of the daemon's run to this `file` (diagnostics: go tool trace)")
	fs.StringArrayVar(&f.limits, "limit", nil, "per-user limit `NAME=VALUE` (repeatable; names: conns, fds, pds, mrs, cqs, srqs, qps, cm_ids, mapped_bytes, mappings, engine_bytes, inflight; VALUE a count with an optional K/M/G/T suffix, or none)")
	fs.DurationVar(&f.PostSpin, "post-spin", 0, "keep polling a client's post ring this long after draining it before sleeping on its doorbell (0 = no spinning; costs CPU)")
	fs.BoolVar(&f.rxeFlushICRC, "rxe-flush-icrc", false, "send RC FLUSHes with the ICRC kernel rxe (6.2 to at least 6.12) computes and expects instead of IBTA A17.3.3's, which rxe drops (for peers that are rxe; a hardware RNIC checks the spec's)")
	fs.StringArrayVar(&f.cc, "cc", nil, "congestion control `settings` under mlx5's names (repeatable; off, on, rp_ai_rate=5, np_min_time_between_cnps=50, ...; docs/congestion.md)")
	return fs
}

// Usage writes the command's usage and options.
func Usage(w io.Writer) {
	fmt.Fprint(w, "usage: softroce daemon [options]\n\nOptions:\n")
	cli.PrintFlags(w, newFlagSet(&flags{}))
}

// ParseArgs parses the daemon's command line (GNU getopt style, cli.NewFlagSet) and the
// --config file it names. Usage errors wrap cli.ErrUsage.
func ParseArgs(args []string) (Config, error) {
	var f flags
	fs := newFlagSet(&f)
	if err := cli.Parse(fs, args); err != nil {
		return Config{}, err
	}
	if fs.NArg() != 0 {
		return Config{}, fmt.Errorf("%w: unexpected argument %q", cli.ErrUsage, fs.Arg(0))
	}
	if f.cfgPath != "" {
		b, err := os.ReadFile(f.cfgPath)
		if err != nil {
			return Config{}, err
		}
		var c fileConfig
		dec := json.NewDecoder(strings.NewReader(string(b)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			return Config{}, fmt.Errorf("%s: %w", f.cfgPath, err)
		}
		if !fs.Changed("listen") {
			f.listen = c.Listen
		}
		pick := func(flagName string, dst *string, v string) {
			if !fs.Changed(flagName) && v != "" {
				*dst = v
			}
		}
		pick("socket", &f.socket, c.Socket)
		pick("group", &f.group, c.Group)
		pick("metrics", &f.metrics, c.Metrics)
		pick("name", &f.name, c.Name)
		pick("log", &f.logFmt, c.Log)
		if !fs.Changed("port") && c.Port != 0 {
			f.port = uint(c.Port)
		}
		if !fs.Changed("mtu") && c.MTU != 0 {
			f.mtu = c.MTU
		}
		if !fs.Changed("workers") && c.Workers != 0 {
			f.workers = c.Workers
		}
		if !fs.Changed("rxe-flush-icrc") {
			f.rxeFlushICRC = c.RxeFlushICRC
		}
		f.Limits = c.Limits
		if c.CC != "" {
			f.cc = append([]string{c.CC}, f.cc...)
		}
	}
	for _, a := range f.limits { // the command line wins over the file, limit by limit
		k, v, ok := strings.Cut(a, "=")
		if !ok {
			return Config{}, fmt.Errorf("%w: --limit %q: want NAME=VALUE", cli.ErrUsage, a)
		}
		if err := f.Limits.Set(k, v); err != nil {
			return Config{}, fmt.Errorf("%w: --limit: %w", cli.ErrUsage, err)
		}
	}
	c := f.Config
	var ccp *roce.CCParams
	if len(f.cc) > 0 {
		p := roce.DefaultCC()
		for _, v := range f.cc {
			if err := p.Parse(v); err != nil {
				return Config{}, fmt.Errorf("%w: --cc: %w", cli.ErrUsage, err)
			}
		}
		ccp = &p
	}
	c.Socket, c.GID, c.JSONLog = f.socket, -1, f.logFmt == "json"
	if f.logFmt != "text" && f.logFmt != "json" {
		return c, fmt.Errorf("%w: --log %q: text or json", cli.ErrUsage, f.logFmt)
	}
	var err error
	if c.Device, err = cli.ListenOptions(f.listen); err != nil {
		return c, fmt.Errorf("%w: --listen: %w", cli.ErrUsage, err)
	}
	c.Device.CC = ccp
	if f.port == 0 || f.port > 65535 {
		return c, fmt.Errorf("%w: --port %d", cli.ErrUsage, f.port)
	}
	c.Device.Port, c.Device.Name = uint16(f.port), f.name
	if f.workers < 0 || f.workers > udp.MaxShards {
		return c, fmt.Errorf("%w: --workers %d: 0..%d", cli.ErrUsage, f.workers, udp.MaxShards)
	}
	c.Device.FastPath.Workers = f.workers
	c.Device.RxeFlushICRC = f.rxeFlushICRC
	if f.mtu != 0 {
		if c.Device.MTU = qp.MTUFromBytes(f.mtu); !c.Device.MTU.Valid() || c.Device.MTU.Bytes() != f.mtu {
			return c, fmt.Errorf("%w: --mtu %d", cli.ErrUsage, f.mtu)
		}
	} else if c.Device.Interface == "" {
		c.Device.MTU = cli.ListenMTU(c.Device.Addrs, cli.InterfaceMTU) // (an interface gives its own: gid.FromInterface)
	}
	if f.group != "" {
		if c.GID, err = lookupGroup(f.group); err != nil {
			return c, fmt.Errorf("%w: --group: %w", cli.ErrUsage, err)
		}
	}
	if f.metrics != "" {
		ap, err := netip.ParseAddrPort(f.metrics)
		if err != nil || !ap.Addr().IsLoopback() {
			return c, fmt.Errorf("%w: --metrics %q: a loopback ADDR:PORT", cli.ErrUsage, f.metrics)
		}
		c.Metrics = ap
	}
	return c, nil
}

// Main is the command: it serves until SIGTERM or SIGINT. Exit status 0 after a signal, 1
// when the daemon cannot start or serve, 2 for a bad command line.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := ParseArgs(args)
	if errors.Is(err, pflag.ErrHelp) {
		Usage(stdout)
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "softroce daemon:", err)
		if errors.Is(err, cli.ErrUsage) {
			return 2
		}
		return 1 // the --config file
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sig)
	c.Signals = sig
	if err := Run(ctx, c, stderr); err != nil {
		return 1
	}
	return 0
}

// diagnose starts a diagnostic of the run (an execution trace, a CPU profile) writing to path;
// the function it returns stops it and closes the file.
func diagnose(path string, start func(io.Writer) error, stop func()) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := start(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { stop(); f.Close() }, nil
}

// Run opens the device and serves it on c.Socket until ctx is done or c.Signals delivers,
// logging to log. It returns the error that stopped it early (already logged).
func Run(ctx context.Context, c Config, log io.Writer) error {
	for _, d := range []struct {
		path  string
		start func(io.Writer) error
		stop  func()
	}{{c.Trace, trace.Start, trace.Stop}, {c.CPUProfile, pprof.StartCPUProfile, pprof.StopCPUProfile}} {
		if d.path == "" {
			continue
		}
		stop, err := diagnose(d.path, d.start, d.stop)
		if err != nil {
			fmt.Fprintln(log, "softroce daemon:", err)
			return err
		}
		defer stop()
	}
	var h slog.Handler = slog.NewTextHandler(log, nil)
	if c.JSONLog {
		h = slog.NewJSONHandler(log, nil)
	}
	lg := slog.New(h)
	fail := func(msg string, err error, kv ...any) error {
		lg.Error(msg, append(kv, "err", err)...)
		return err
	}

	uo := c.Device
	var srv *daemonsrv.Server
	uo.Events = func(e event.Event) {
		if srv != nil {
			srv.Event(e)
		}
	}
	dev, err := roce.OpenUDP(uo)
	if err != nil {
		return fail("open device", err)
	}
	defer dev.Close()
	srv, err = daemonsrv.New(daemonsrv.Options{Device: dev, Logger: lg, PostSpin: c.PostSpin, Limits: c.Limits})
	if err != nil {
		return fail("server", err)
	}
	if err := os.MkdirAll(filepath.Dir(c.Socket), 0o755); err != nil {
		return fail("socket directory", err)
	}
	ln, err := daemonsrv.Listen(c.Socket, 0o660, c.GID)
	if err != nil {
		return fail("listen", err, "socket", c.Socket)
	}
	var hs *http.Server
	if c.Metrics.IsValid() {
		ml, err := net.Listen("tcp", c.Metrics.String())
		if err != nil {
			ln.Close()
			return fail("metrics listen", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", srv.MetricsHandler())
		hs = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go hs.Serve(ml)
		lg.Info("metrics", "addr", ml.Addr().String())
	}
	addrs := make([]string, 0)
	for _, a := range dev.Addrs() {
		addrs = append(addrs, a.String())
	}
	ready := []any{"device", dev.Name(), "addrs", strings.Join(addrs, ","),
		"port", uo.Port, "mtu", dev.PortAttr().ActiveMTU.Bytes(), "workers", max(uo.FastPath.Workers, 1), "socket", c.Socket, "pid", os.Getpid()}
	if uo.RxeFlushICRC {
		ready = append(ready, "rxe_flush_icrc", true)
	}
	lg.Info("softroce daemon ready", ready...)

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	var stopErr error
	select {
	case s := <-c.Signals:
		lg.Info("shutting down", "signal", s.String())
	case <-ctx.Done():
		lg.Info("shutting down", "reason", ctx.Err().Error())
	case err := <-serveErr:
		stopErr = fail("serve", err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		lg.Warn("shutdown", "err", err)
	}
	if hs != nil {
		hs.Close()
	}
	lg.Info("stopped")
	return stopErr
}

func lookupGroup(g string) (int, error) {
	if n, err := strconv.Atoi(g); err == nil {
		return n, nil
	}
	gr, err := user.LookupGroup(g)
	if err != nil {
		return -1, err
	}
	return strconv.Atoi(gr.Gid)
}
