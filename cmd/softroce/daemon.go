package main

// softroce daemon: one RoCE endpoint per host shared by local programs
// (internal/daemon; clients use pkg/client). See docs/daemon.md.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
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
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/softroce/softroce/internal/daemon"
	"github.com/softroce/softroce/internal/event"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/client"
	"github.com/softroce/softroce/pkg/roce"
)

func init() {
	register(&command{name: "daemon", summary: "run the shared RoCE endpoint for local programs (unix socket)", run: runDaemon})
}

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

// daemonConfig is the --config file (JSON); flags given on the command line win.
type daemonConfig struct {
	Listen  []string `json:"listen"`
	Socket  string   `json:"socket"`
	Group   string   `json:"group"`
	Metrics string   `json:"metrics"`
	Name    string   `json:"name"`
	Port    uint16   `json:"port"`
	MTU     int      `json:"mtu"`
	Log     string   `json:"log"` // "text" (default) or "json"
}

func runDaemon(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("daemon", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var listen listFlag
	fs.Var(&listen, "listen", "local address or interface to bind UDP 4791 on (repeatable; default: every address of every up interface)")
	socket := fs.String("socket", client.DefaultSocket, "unix socket path for local clients (mode 0660)")
	group := fs.String("group", "", "group owning the socket (name or gid)")
	cfgPath := fs.String("config", "", "JSON config file (keys: listen, socket, group, metrics, name, port, mtu, log)")
	metrics := fs.String("metrics", "", "serve Prometheus text metrics on this loopback ADDR:PORT (opt-in)")
	name := fs.String("name", "softroce0", "device name")
	port := fs.Uint("port", 4791, "RoCE UDP port (tests only; peers must use the same)")
	mtu := fs.Int("mtu", 0, "active MTU in bytes (256..4096; 0 = from the interface MTU)")
	logFmt := fs.String("log", "text", "log format: text or json")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the daemon's run to this file (diagnostics)")
	var quota daemon.Quota
	fs.IntVar(&quota.PDs, "quota-pds", 0, "per-client limit on PDs (0 = none; the device limits still apply)")
	fs.IntVar(&quota.MRs, "quota-mrs", 0, "per-client limit on MRs (0 = none)")
	fs.IntVar(&quota.CQs, "quota-cqs", 0, "per-client limit on CQs (0 = none)")
	fs.IntVar(&quota.SRQs, "quota-srqs", 0, "per-client limit on SRQs (0 = none)")
	fs.IntVar(&quota.QPs, "quota-qps", 0, "per-client limit on QPs (0 = none)")
	fs.Int64Var(&quota.MRBytes, "quota-mr-bytes", 0, "per-client limit on registered bytes (0 = none)")
	postSpin := fs.Duration("post-spin", 0, "keep polling a client's post ring this long after draining it before sleeping on its doorbell (0 = no spinning; costs CPU)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *cfgPath != "" {
		b, err := os.ReadFile(*cfgPath)
		if err != nil {
			fmt.Fprintln(stderr, "softroce daemon:", err)
			return 1
		}
		var c daemonConfig
		dec := json.NewDecoder(strings.NewReader(string(b)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			fmt.Fprintf(stderr, "softroce daemon: %s: %v\n", *cfgPath, err)
			return 1
		}
		if !set["listen"] {
			listen = c.Listen
		}
		pick := func(flagName string, dst *string, v string) {
			if !set[flagName] && v != "" {
				*dst = v
			}
		}
		pick("socket", socket, c.Socket)
		pick("group", group, c.Group)
		pick("metrics", metrics, c.Metrics)
		pick("name", name, c.Name)
		pick("log", logFmt, c.Log)
		if !set["port"] && c.Port != 0 {
			*port = uint(c.Port)
		}
		if !set["mtu"] && c.MTU != 0 {
			*mtu = c.MTU
		}
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(stderr, "softroce daemon:", err)
			return 1
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(stderr, "softroce daemon:", err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}
	var h slog.Handler = slog.NewTextHandler(stderr, nil)
	if *logFmt == "json" {
		h = slog.NewJSONHandler(stderr, nil)
	}
	log := slog.New(h)

	uo, err := daemonUDPOptions(listen)
	if err != nil {
		log.Error("bad --listen", "err", err)
		return 2
	}
	if *port == 0 || *port > 65535 {
		log.Error("bad --port", "port", *port)
		return 2
	}
	uo.Port, uo.Name = uint16(*port), *name
	if *mtu != 0 {
		if uo.MTU = qp.MTUFromBytes(*mtu); !uo.MTU.Valid() || uo.MTU.Bytes() != *mtu {
			log.Error("bad --mtu", "mtu", *mtu)
			return 2
		}
	} else if uo.Interface == "" {
		uo.MTU = listenMTU(uo.Addrs, interfaceMTU) // (an interface gives its own: gid.FromInterface)
	}
	gid := -1
	if *group != "" {
		if gid, err = lookupGroup(*group); err != nil {
			log.Error("bad --group", "err", err)
			return 2
		}
	}
	var srv *daemon.Server
	uo.Events = func(e event.Event) {
		if srv != nil {
			srv.Event(e)
		}
	}
	dev, err := roce.OpenUDP(uo)
	if err != nil {
		log.Error("open device", "err", err)
		return 1
	}
	defer dev.Close()
	srv, err = daemon.New(daemon.Options{Device: dev, Logger: log, PostSpin: *postSpin, Quota: quota})
	if err != nil {
		log.Error("server", "err", err)
		return 1
	}
	if err := os.MkdirAll(filepath.Dir(*socket), 0o755); err != nil {
		log.Error("socket directory", "err", err)
		return 1
	}
	ln, err := daemon.Listen(*socket, 0o660, gid)
	if err != nil {
		log.Error("listen", "socket", *socket, "err", err)
		return 1
	}
	var hs *http.Server
	if *metrics != "" {
		ap, err := netip.ParseAddrPort(*metrics)
		if err != nil || !ap.Addr().IsLoopback() {
			log.Error("--metrics must be a loopback ADDR:PORT", "metrics", *metrics)
			ln.Close()
			return 2
		}
		ml, err := net.Listen("tcp", ap.String())
		if err != nil {
			log.Error("metrics listen", "err", err)
			ln.Close()
			return 1
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", srv.MetricsHandler())
		hs = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go hs.Serve(ml)
		log.Info("metrics", "addr", ml.Addr().String())
	}
	addrs := make([]string, 0)
	for _, a := range dev.Addrs() {
		addrs = append(addrs, a.String())
	}
	log.Info("softroce daemon ready", "device", dev.Name(), "addrs", strings.Join(addrs, ","),
		"port", *port, "mtu", dev.PortAttr().ActiveMTU.Bytes(), "socket", *socket, "pid", os.Getpid())

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sig)
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	status := 0
	select {
	case s := <-sig:
		log.Info("shutting down", "signal", s.String())
	case err := <-serveErr:
		log.Error("serve", "err", err)
		status = 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		log.Warn("shutdown", "err", err)
	}
	if hs != nil {
		hs.Close()
	}
	log.Info("stopped")
	return status
}

// daemonUDPOptions maps --listen values (addresses or interface names) to
// device options. One interface alone takes its GID table and MTU from
// the interface (gid.FromInterface); otherwise the addresses are listed.
func daemonUDPOptions(listen []string) (roce.UDPOptions, error) {
	var o roce.UDPOptions
	if len(listen) == 1 {
		if _, err := netip.ParseAddr(listen[0]); err != nil {
			o.Interface = listen[0]
			return o, nil
		}
	}
	if len(listen) == 0 {
		ifs, err := net.Interfaces()
		if err != nil {
			return o, err
		}
		for _, ifi := range ifs {
			if ifi.Flags&net.FlagUp == 0 {
				continue
			}
			as, err := roce.InterfaceAddrs(ifi.Name)
			if err == nil {
				o.Addrs = append(o.Addrs, as...)
			}
		}
		if len(o.Addrs) == 0 {
			return o, errors.New("no usable local address")
		}
		return o, nil
	}
	for _, s := range listen {
		if a, err := netip.ParseAddr(s); err == nil {
			if a.Zone() != "" || a.IsUnspecified() || a.IsMulticast() {
				return o, fmt.Errorf("%q: need a unicast address without a zone", s)
			}
			o.Addrs = append(o.Addrs, a.Unmap())
			continue
		}
		as, err := roce.InterfaceAddrs(s)
		if err != nil {
			return o, err
		}
		o.Addrs = append(o.Addrs, as...)
	}
	return o, nil
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

// listenMTU is the port's active MTU for a device on addrs, as rxe derives it from the netdev
// (activeMTU): the smallest over the interfaces holding them, so no path MTU the CM or a tool
// picks from the port exceeds what any of them carries (a 4096 MTU on a 1500-byte Ethernet
// makes every multi-packet message leave as datagrams the kernel refuses). 0 (the device's
// default) when no address's interface MTU is known. ifMTU returns an address's interface MTU
// (0 if unknown).
func listenMTU(addrs []netip.Addr, ifMTU func(netip.Addr) int) qp.MTU {
	var m qp.MTU
	for _, a := range addrs {
		if n := ifMTU(a); n > 0 {
			if am := activeMTU(n); m == 0 || am < m {
				m = am
			}
		}
	}
	return m
}
