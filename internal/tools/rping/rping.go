// Package rping is `softroce rping`: librdmacm's rping (rdma-core librdmacm/examples/rping.c, as rdmacm-utils
// ships it), wire-compatible with it: rdma_cm connection setup on port 7174 (RDMA_PS_TCP, the
// CM protocol through QP1, pkg/rdmacm), then the same ping loop:
//
//   - client: fill start_buf with "rdma-ping-%d: " and the rotating A..z pattern (NUL at
//     size-1); SEND struct rping_rdma_info {be64 buf, be32 rkey, be32 size} for start_buf;
//     wait for the server's go-ahead (a RECV); SEND the info of rdma_buf; wait for the second
//     go-ahead; -V compares the buffers; -v prints "ping data: %s".
//   - server: on the first info, RDMA READ remote_len bytes into rdma_buf; -v prints
//     "server ping data: %s"; SEND the go-ahead; on the second info, RDMA WRITE
//     strlen(rdma_buf)+1 bytes to it; SEND the go-ahead; repeat until DISCONNECTED, when it
//     prints "wait for RDMA_READ_ADV state 10" and exits 0, as rping does.
//   - QP: max_send_wr 16, max_recv_wr 2, one SGE, one CQ of 32; conn param responder
//     resources 1, initiator depth 1, retry 7, RNR retry 7 (client); the server accepts with
//     rdma_accept(NULL).
//
// Exit status: 0, or rping's errno-style values (EINVAL 22 for usage) and 255 for -1.
// Softroce differences: the device is UDP sockets on one local address: the client's is the
// one routed to -a (or -I), the server's is -a (or --dev ADDR|IFNAME); every wait is bounded
// by --timeout (rping waits forever); --roce-port changes the RoCE UDP port (tests).
package rping

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/spf13/pflag"

	"github.com/softroce/softroce/internal/cm"
	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/internal/tools/cli"
	"github.com/softroce/softroce/pkg/rdmacm"
	"github.com/softroce/softroce/pkg/roce"
)

// Command is `softroce rping`.
var Command = cli.Command{
	Name:    "rping",
	Summary: "librdmacm rping, wire-compatible (rdma_cm on port 7174, READ/WRITE ping loop)",
	Main:    Main,
}

const (
	rpingBufSize = 64 * 1024        // RPING_BUFSIZE
	rpingMinSize = 8 + 15           // RPING_MIN_BUFSIZE: sizeof(stringify(INT_MAX)), i.e. of "INT_MAX", + sizeof("rdma-ping-%d: ")
	rpingSQDepth = 16               // RPING_SQ_DEPTH
	rpingInfoLen = 16               // struct rping_rdma_info
	rpingEINVAL  = 22               // errno EINVAL, rping's usage status
	rpingFail    = 255              // rping returns -1
	rpingRecvVA  = 0x7f00_0000_0000 // where the buffers are registered (rping: their addresses)
	rpingSendVA  = 0x7f00_0000_1000 //
	rpingRDMAVA  = 0x7f00_0001_0000 //
	rpingStartVA = 0x7f00_0002_0000 //
)

// Config is a parsed rping command line.
type Config struct {
	Server, Client bool
	Addr           netip.Addr // -a
	Source         netip.Addr // -I
	Port           uint16     // -p
	Count          int        // -C (0 = forever)
	Size           int        // -S
	Verbose        bool       // -v
	Validate       bool       // -V
	Debug          bool       // -d
	Persistent     bool       // -P (accepted; one connection at a time)
	Dev            cli.DevFlag
	Timeout        time.Duration
	RocePort       uint16
	Portable       bool   // --portable: plain sockets (roce.UDPOptions.Portable)
	Daemon         string // --daemon SOCKET: through the softroce daemon
	// SelectiveRepeat is --selective-repeat (softroce's own): ask for RC selective repeat,
	// which rdma_cm negotiates (rdmacm.OptionSelectiveRepeat): the connection has it when the
	// peer is softroce given it too, otherwise rping notes on stderr that it runs go-back-N.
	SelectiveRepeat bool

	// Log receives rping's error messages (nil: discarded).
	Log io.Writer
	// OnListen, if set, is called once the server listens (tests).
	OnListen func()
}

// rpingConfig is the name the run's code uses for Config.
type rpingConfig = Config

var errRpingUsage = cli.ErrUsage

// Usage writes rping's usage (to stdout, as rping does) and softroce's options.
func Usage(w io.Writer) {
	fmt.Fprintln(w, "rping -s [-vVd] [-S size] [-C count] [-a addr] [-p port]")
	fmt.Fprintln(w, "rping -c [-vVd] [-S size] [-C count] [-I addr] -a addr [-p port]")
	fmt.Fprintln(w, "\t-c\t\tclient side")
	fmt.Fprintln(w, "\t-I\t\tSource address to bind to for client.")
	fmt.Fprintln(w, "\t-s\t\tserver side.  To bind to any address with IPv6 use -a ::0")
	fmt.Fprintln(w, "\t-v\t\tdisplay ping data to stdout")
	fmt.Fprintln(w, "\t-V\t\tvalidate ping data")
	fmt.Fprintln(w, "\t-d\t\tdebug printfs")
	fmt.Fprintln(w, "\t-S size \tping data size")
	fmt.Fprintln(w, "\t-C count\tping count times")
	fmt.Fprintln(w, "\t-a addr\t\taddress")
	fmt.Fprintln(w, "\t-p port\t\tport")
	fmt.Fprintln(w, "\t-P\t\tpersistent server mode allowing multiple connections")
	fmt.Fprintln(w, "\t-q\t\tuse self-created, self-modified QP")
	fmt.Fprintln(w, "softroce:")
	fs := newFlagSet(&flags{})
	fs.VisitAll(func(f *pflag.Flag) { f.Hidden = f.Shorthand != "" })
	cli.PrintFlags(w, fs)
}

// flags are the command line's values before ParseArgs checks them.
type flags struct {
	Config
	addr, source               string
	port, count, size, roceRaw int
	selfQP                     bool
}

// newFlagSet defines rping's getopt options "a:I:Pp:C:S:t:scvVdq" (-t is in rdma-core v44's
// string but not in its switch: refused, as there) and softroce's long ones.
func newFlagSet(f *flags) *pflag.FlagSet {
	fs := cli.NewFlagSet("rping")
	fs.StringVarP(&f.addr, cli.Short("a"), "a", "", "address")
	fs.StringVarP(&f.source, cli.Short("I"), "I", "", "Source address to bind to for client.")
	fs.BoolVarP(&f.Persistent, cli.Short("P"), "P", false, "persistent server mode allowing multiple connections")
	cli.CIntVarP(fs, &f.port, cli.Short("p"), "p", 7174, 10, "port")
	cli.CIntVarP(fs, &f.count, cli.Short("C"), "C", 0, 10, "ping count times")
	cli.CIntVarP(fs, &f.size, cli.Short("S"), "S", 64, 10, "ping data size")
	fs.BoolVarP(&f.Server, cli.Short("s"), "s", false, "server side")
	fs.BoolVarP(&f.Client, cli.Short("c"), "c", false, "client side")
	fs.BoolVarP(&f.Verbose, cli.Short("v"), "v", false, "display ping data to stdout")
	fs.BoolVarP(&f.Validate, cli.Short("V"), "V", false, "validate ping data")
	fs.BoolVarP(&f.Debug, cli.Short("d"), "d", false, "debug printfs")
	fs.BoolVarP(&f.selfQP, cli.Short("q"), "q", false, "use self-created, self-modified QP (the same wire behaviour)")
	fs.Var(&f.Dev, "dev", "the server's device `ADDR|IFNAME` when -a does not name one")
	fs.DurationVar(&f.Timeout, "timeout", 30*time.Second, "bound of every wait (rping waits forever)")
	cli.CIntVarP(fs, &f.roceRaw, "roce-port", "", 4791, 10, "RoCE UDP `port`")
	fs.BoolVar(&f.Portable, "portable", false, "plain UDP sockets instead of sendmmsg/recvmmsg")
	fs.StringVar(&f.Daemon, "daemon", "", "run through the softroce daemon on this unix `socket`: its device, its rdma_cm")
	fs.BoolVar(&f.SelectiveRepeat, "selective-repeat", false, "ask for RC selective repeat instead of go-back-N (docs/reliability.md): rdma_cm negotiates it, the connection has it only if the peer is softroce given it too (not with --daemon)")
	return fs
}

// ParseArgs parses rping's command line as its getopt reads it (grouped flags, attached or
// separate values, options in any order) plus softroce's long options. Its errors are rping's
// usage errors (exit EINVAL).
func ParseArgs(args []string) (Config, error) {
	var f flags
	fs := newFlagSet(&f)
	if err := cli.Parse(fs, args); err != nil {
		return Config{}, err
	}
	c := f.Config // operands are ignored, as by rping (getopt moves them to the end)
	for _, a := range []struct {
		s   string
		dst *netip.Addr
	}{{f.addr, &c.Addr}, {f.source, &c.Source}} {
		if a.s == "" {
			continue
		}
		ip, err := cli.ParseIP(a.s)
		if err != nil {
			return c, fmt.Errorf("%w: getaddrinfo failed (Name or service not known) - invalid hostname or IP address", errRpingUsage)
		}
		*a.dst = ip
	}
	if fs.Changed(cli.Short("s")) && fs.Changed(cli.Short("c")) {
		// getopt: the last of -s and -c wins
		c.Server = lastOf(args, 's', 'c') == 's'
		c.Client = !c.Server
	}
	switch {
	case f.count < 0:
		return c, fmt.Errorf("%w: Invalid count %d", errRpingUsage, f.count)
	case f.size < rpingMinSize || f.size > rpingBufSize-1:
		return c, fmt.Errorf("%w: Invalid size %d (valid range is %d to %d)", errRpingUsage, f.size, rpingMinSize, rpingBufSize)
	case f.roceRaw <= 0 || f.roceRaw > 65535:
		return c, fmt.Errorf("%w: bad --roce-port %d", errRpingUsage, f.roceRaw)
	case c.Timeout < 0:
		return c, fmt.Errorf("%w: bad --timeout %v", errRpingUsage, c.Timeout)
	case !c.Server && !c.Client:
		return c, fmt.Errorf("%w: -s or -c", errRpingUsage)
	case c.Client && !c.Addr.IsValid():
		return c, fmt.Errorf("%w: client needs -a addr", errRpingUsage)
	case c.SelectiveRepeat && c.Daemon != "":
		return c, fmt.Errorf("%w: --selective-repeat with --daemon (the daemon's QPs do not offer it)", errRpingUsage)
	}
	c.Port, c.Count, c.Size, c.RocePort = uint16(f.port), f.count, f.size, uint16(f.roceRaw)
	return c, nil
}

// lastOf returns which of the short options a and b comes last in args (0 if neither).
func lastOf(args []string, a, b byte) byte {
	var last byte
	for _, arg := range args {
		if arg == "--" {
			break
		}
		if len(arg) < 2 || arg[0] != '-' || arg[1] == '-' {
			continue
		}
		for i := 1; i < len(arg); i++ {
			switch arg[i] {
			case a, b:
				last = arg[i]
			case 'a', 'I', 'p', 'C', 'S':
				i = len(arg) // the rest is the value
			}
		}
	}
	return last
}

// Main is the command: exit status 0, rping's EINVAL (22) for a bad command line (with the
// usage on stdout), 255 when the run fails.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return main(ctx, args, stdout, stderr, nil)
}

// main is Main; seams, if set, adjusts the parsed Config (tests).
func main(ctx context.Context, args []string, stdout, stderr io.Writer, seams func(*Config)) int {
	c, err := ParseArgs(args)
	if err != nil {
		if !errors.Is(err, pflag.ErrHelp) {
			fmt.Fprintf(stderr, "rping: %v\n", err)
		}
		Usage(stdout)
		return rpingEINVAL
	}
	c.Log = stderr
	if seams != nil {
		seams(&c)
	}
	if err := Run(ctx, c, stdout); err != nil {
		if !errors.Is(err, errRpingQuiet) {
			fmt.Fprintf(stderr, "rping: %v\n", err)
		}
		return rpingFail
	}
	return 0
}

// Run runs rping's client or server as c says, printing rping's lines to out.
func Run(_ context.Context, c Config, out io.Writer) error {
	if c.Log == nil {
		c.Log = io.Discard
	}
	r := &rpinger{c: &c, out: out, errw: c.Log}
	return r.run()
}

// errRpingQuiet: the error was already reported in rping's words.
var errRpingQuiet = errors.New("reported")

type rpinger struct {
	c         *rpingConfig
	out, errw io.Writer
	v         roce.Verbs // the embedded device or the daemon
	ch        *rdmacm.EventChannel
	id        *rdmacm.ID // client: the connection; server: the listener
	conn      *rdmacm.ID // the connected ID
	pd        roce.ProtectionDomain
	cq        roce.CompletionQueue
	q         roce.QueuePair

	recvBuf, sendBuf, rdmaBuf, startBuf []byte
	recvMR, sendMR, rdmaMR, startMR     roce.MemoryRegion

	wc           [4]cq.WC
	wcN, wcI     int
	disconnected bool
}

// noteSelectiveRepeat tells, with --selective-repeat, that the connection did not get it.
func (r *rpinger) noteSelectiveRepeat(id *rdmacm.ID) {
	if r.c.SelectiveRepeat && !id.SelectiveRepeat() {
		fmt.Fprintf(r.errw, "selective repeat not negotiated (the peer is not softroce, or was not asked): go-back-N\n")
	}
}

func (r *rpinger) debugf(format string, a ...any) {
	if r.c.Debug {
		fmt.Fprintf(r.out, format, a...)
	}
}

func (r *rpinger) run() error {
	c := r.c
	if c.Daemon != "" {
		return r.runDaemon()
	}
	var local netip.Addr
	switch {
	case c.Client && c.Source.IsValid():
		local = c.Source
	case c.Client:
		a, err := cli.ResolveLocalAddr(&c.Dev, c.Addr)
		if err != nil {
			return err
		}
		local = a
	case c.Dev.IsSet():
		a, err := cli.ResolveLocalAddr(&c.Dev, c.Addr)
		if err != nil {
			return err
		}
		local = a
	case c.Addr.IsValid() && !c.Addr.IsUnspecified():
		local = c.Addr
	default:
		return fmt.Errorf("%w: the server needs -a ADDR or --dev ADDR|IFNAME (a softroce device is one address)", cli.ErrDev)
	}
	mtu := cli.ActiveMTU(cli.InterfaceMTU(local))
	d, err := roce.OpenUDP(roce.UDPOptions{Addrs: []netip.Addr{local}, Port: c.RocePort, Portable: c.Portable, MTU: mtu, Name: "softroce0"})
	if err != nil {
		return fmt.Errorf("%w on %v: %w", cli.ErrDev, local, err)
	}
	defer d.Close()
	return r.runOn(d.Verbs(), local)
}

// runDaemon runs through the softroce daemon (--daemon): its device, its rdma_cm.
func (r *rpinger) runDaemon() error {
	c := r.c
	dev := c.Dev
	if !dev.IsSet() {
		switch {
		case c.Client && c.Source.IsValid():
			dev.Addr = c.Source
		case c.Server && c.Addr.IsValid() && !c.Addr.IsUnspecified():
			dev.Addr = c.Addr
		}
	}
	peer := c.Addr
	if c.Server {
		peer = netip.Addr{}
	}
	vd, err := cli.OpenVerbs(c.Daemon, &dev, cli.DevOptions{Peer: peer})
	if err != nil {
		return err
	}
	defer vd.Close()
	return r.runOn(vd.V, vd.Addr)
}

// runOn runs the client or server on v from the local address.
func (r *rpinger) runOn(v roce.Verbs, local netip.Addr) error {
	c := r.c
	r.v = v
	r.ch = rdmacm.NewEventChannel()
	defer r.ch.Close()
	var err error
	if r.id, err = rdmacm.CreateID(r.ch, rdmacm.IDOptions{Verbs: v, PortSpace: cm.PSTCP}); err != nil {
		return err
	}
	defer r.id.Destroy()
	defer r.release()
	r.debugf("created cm_id %p\n", r.id)
	if c.SelectiveRepeat {
		// on the listener: every request it takes asks too
		if err := r.id.SetOption(rdmacm.OptionSelectiveRepeat, 1); err != nil {
			return err
		}
	}
	if c.Server {
		return r.server(local)
	}
	return r.client(local)
}

// release destroys the connection's verbs objects and frees its buffers (the daemon would
// on disconnect; a persistent server releases them per connection).
func (r *rpinger) release() {
	if r.q != nil {
		r.q.Destroy()
		r.q = nil
	}
	for _, m := range []*roce.MemoryRegion{&r.recvMR, &r.sendMR, &r.rdmaMR, &r.startMR} {
		if *m != nil {
			(*m).Dereg()
			*m = nil
		}
	}
	if r.cq != nil {
		r.v.DestroyCQ(r.cq)
		r.cq = nil
	}
	if r.pd != nil {
		r.pd.Dealloc()
		r.pd = nil
	}
	for _, b := range []*[]byte{&r.recvBuf, &r.sendBuf, &r.rdmaBuf, &r.startBuf} {
		if *b != nil {
			r.v.FreeBuffer(*b)
			*b = nil
		}
	}
}

// event waits for the next CM event.
func (r *rpinger) event() (rdmacm.Event, error) {
	ctx, cancel := r.ctx()
	defer cancel()
	e, err := r.ch.Get(ctx)
	if err != nil {
		return e, fmt.Errorf("waiting for a CM event: %w", err)
	}
	r.debugf("cma_event type %s cma_id %p (%s)\n", e.Type, e.ID, map[bool]string{true: "parent", false: "child"}[e.ID == r.id])
	return e, nil
}

func (r *rpinger) ctx() (context.Context, context.CancelFunc) {
	if r.c.Timeout == 0 {
		return context.WithCancel(context.Background())
	}
	return context.WithTimeout(context.Background(), r.c.Timeout)
}

// cmError prints rping's line for an error event and fails.
func (r *rpinger) cmError(e rdmacm.Event) error {
	status := -1
	var rj *rdmacm.RejectError
	if errors.As(e.Status, &rj) {
		status = int(rj.Reason)
	} else if e.Type == rdmacm.EventUnreachable {
		status = -110 // -ETIMEDOUT
	}
	fmt.Fprintf(r.errw, "cma event %s, error %d\n", e.Type, status)
	return errRpingQuiet
}

func (r *rpinger) setup(id *rdmacm.ID) error {
	var err error
	if r.pd, err = r.v.AllocPD(); err != nil {
		return err
	}
	if r.cq, err = r.v.CreateCQ(rpingSQDepth * 2); err != nil {
		return err
	}
	if r.q, err = id.CreateQPVerbs(r.pd, roce.VerbsQPInit{Type: qp.TypeRC, SendCQ: r.cq, RecvCQ: r.cq,
		Cap: qp.Cap{MaxSendWR: rpingSQDepth, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		return err
	}
	// buffers from AllocBuffer: the daemon maps them (memfds); embedded, plain memory
	reg := func(b *[]byte, n int, va uint64, acc mr.Access) (roce.MemoryRegion, error) {
		var err error
		if *b, err = r.v.AllocBuffer(n); err != nil {
			return nil, err
		}
		return r.v.RegMR(r.pd, *b, va, acc)
	}
	if r.recvMR, err = reg(&r.recvBuf, rpingInfoLen, rpingRecvVA, mr.AccessLocalWrite); err != nil {
		return err
	}
	if r.sendMR, err = reg(&r.sendBuf, rpingInfoLen, rpingSendVA, 0); err != nil {
		return err
	}
	rw := mr.AccessLocalWrite | mr.AccessRemoteRead | mr.AccessRemoteWrite
	if r.rdmaMR, err = reg(&r.rdmaBuf, r.c.Size, rpingRDMAVA, rw); err != nil {
		return err
	}
	if r.c.Client {
		if r.startMR, err = reg(&r.startBuf, r.c.Size, rpingStartVA, rw); err != nil {
			return err
		}
	}
	r.debugf("allocated & registered buffers...\n")
	return r.postRecv()
}

func (r *rpinger) postRecv() error {
	_, err := r.q.PostRecv([]qp.RecvWR{{SGL: []qp.SGE{{Addr: rpingRecvVA, Length: rpingInfoLen, LKey: r.recvMR.LKey()}}}})
	return err
}

func (r *rpinger) post(wr qp.SendWR) error {
	wr.Flags |= qp.SendSignaled
	if _, err := r.q.PostSend([]qp.SendWR{wr}); err != nil {
		fmt.Fprintf(r.errw, "post send error %d\n", -1)
		return errRpingQuiet
	}
	return nil
}

func (r *rpinger) sendInfo(va uint64, m roce.MemoryRegion) error {
	binary.BigEndian.PutUint64(r.sendBuf[0:], va)
	binary.BigEndian.PutUint32(r.sendBuf[8:], m.RKey())
	binary.BigEndian.PutUint32(r.sendBuf[12:], uint32(r.c.Size))
	r.debugf("RDMA addr %x rkey %x len %d\n", va, m.RKey(), r.c.Size)
	return r.sendGo()
}

// sendGo SENDs the 16-byte send buffer (the server's go-ahead is its never-written buffer).
func (r *rpinger) sendGo() error {
	return r.post(qp.SendWR{Opcode: qp.WRSend, SGL: []qp.SGE{{Addr: rpingSendVA, Length: rpingInfoLen, LKey: r.sendMR.LKey()}}})
}

// completion waits for the next completion that is not a SEND's (rping_cq_event_handler:
// SEND completions only log), watching the CM channel for DISCONNECTED meanwhile.
// It returns nil, nil when the connection was disconnected.
func (r *rpinger) completion() (*cq.WC, error) {
	var deadline time.Time
	if r.c.Timeout > 0 {
		deadline = time.Now().Add(r.c.Timeout)
	}
	for {
		if r.wcI < r.wcN {
			wc := &r.wc[r.wcI]
			r.wcI++
			if wc.Status != cq.StatusSuccess {
				if wc.Status == cq.StatusWRFlushErr {
					continue
				}
				fmt.Fprintf(r.errw, "cq completion failed status %d\n", int(wc.Status))
				return nil, errRpingQuiet
			}
			switch wc.Opcode {
			case cq.OpSend:
				r.debugf("send completion\n")
				continue
			case cq.OpRecv:
				r.debugf("recv completion\n")
				if wc.ByteLen != rpingInfoLen {
					fmt.Fprintf(r.errw, "Received bogus data, size %d\n", wc.ByteLen)
					return nil, errRpingQuiet
				}
			}
			return wc, nil
		}
		r.wcI, r.wcN = 0, r.cq.Poll(r.wc[:])
		if r.wcN > 0 {
			continue
		}
		if e, ok := r.ch.TryGet(); ok {
			switch e.Type {
			case rdmacm.EventDisconnected:
				fmt.Fprintf(r.errw, "%s DISCONNECT EVENT...\n", map[bool]string{true: "server", false: "client"}[r.c.Server])
				r.disconnected = true
				return nil, nil
			case rdmacm.EventEstablished, rdmacm.EventTimewaitExit:
				r.debugf("cma_event type %s\n", e.Type)
				continue
			default:
				return nil, r.cmError(e)
			}
		}
		if err := r.cq.ReqNotify(false); err != nil {
			return nil, err
		}
		if r.wcN = r.cq.Poll(r.wc[:]); r.wcN > 0 {
			continue
		}
		wait := 50 * time.Millisecond // the CM channel has no Go channel to select on
		if !deadline.IsZero() && time.Until(deadline) < wait {
			wait = time.Until(deadline)
			if wait <= 0 {
				return nil, fmt.Errorf("no completion within %v", r.c.Timeout)
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-r.cq.Channel():
		case <-t.C:
		}
		t.Stop()
	}
}
