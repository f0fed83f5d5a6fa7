package main

// softroce rping: librdmacm's rping (rdma-core librdmacm/examples/rping.c, as rdmacm-utils
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

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"time"

	"github.com/softroce/softroce/internal/cm"
	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/internal/tools/cli"
	"github.com/softroce/softroce/pkg/rdmacm"
	"github.com/softroce/softroce/pkg/roce"
)

func init() {
	register(&command{
		name:    "rping",
		summary: "librdmacm rping, wire-compatible (rdma_cm on port 7174, READ/WRITE ping loop)",
		run:     runRping,
	})
}

const (
	rpingBufSize = 64 * 1024        // RPING_BUFSIZE
	rpingMinSize = 11 + 15          // sizeof("2147483647") + sizeof("rdma-ping-%d: ")
	rpingSQDepth = 16               // RPING_SQ_DEPTH
	rpingInfoLen = 16               // struct rping_rdma_info
	rpingEINVAL  = 22               // errno EINVAL, rping's usage status
	rpingFail    = 255              // rping returns -1
	rpingRecvVA  = 0x7f00_0000_0000 // where the buffers are registered (rping: their addresses)
	rpingSendVA  = 0x7f00_0000_1000 //
	rpingRDMAVA  = 0x7f00_0001_0000 //
	rpingStartVA = 0x7f00_0002_0000 //
)

// rpingConfig is a parsed rping command line.
type rpingConfig struct {
	Server, Client bool
	Addr           netip.Addr  // -a
	Source         netip.Addr  // -I
	Port           uint16      // -p
	Count          int         // -C (0 = forever)
	Size           int         // -S
	Verbose        bool        // -v
	Validate       bool        // -V
	Debug          bool        // -d
	Persistent     bool        // -P (accepted; one connection at a time)
	Dev            cli.DevFlag // --dev
	Timeout        time.Duration
	RocePort       uint16
	Portable       bool   // --portable: plain sockets (roce.UDPOptions.Portable)
	Daemon         string // --daemon SOCKET: through the softroce daemon
}

var errRpingUsage = errors.New("usage")

// rpingOnListen, if set (tests), is called once the server listens.
var rpingOnListen func()

func rpingUsage(w io.Writer) {
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
	fmt.Fprintln(w, "softroce: --dev ADDR|IFNAME (server device), --timeout DUR (default 30s), --roce-port N, --portable,")
	fmt.Fprintln(w, "\t--daemon SOCKET (run through the softroce daemon: its device, its rdma_cm)")
}

// parseRping parses rping's getopt string "a:I:Pp:C:S:t:scvVdq" (grouped flags, attached or
// separate values) plus softroce's long options.
func parseRping(args []string, stderr io.Writer) (*rpingConfig, error) {
	c := &rpingConfig{Port: 7174, Size: 64, Timeout: 30 * time.Second}
	bad := func(format string, a ...any) (*rpingConfig, error) {
		fmt.Fprintf(stderr, format, a...)
		return nil, errRpingUsage
	}
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if len(arg) > 2 && arg[:2] == "--" {
			name, val, has := cutEq(arg[2:])
			if name == "portable" && !has {
				c.Portable = true
				continue
			}
			if !has {
				if i+1 >= len(args) {
					return bad("option --%s needs a value\n", name)
				}
				i++
				val = args[i]
			}
			switch name {
			case "dev":
				if err := c.Dev.Set(val); err != nil {
					return bad("%v\n", err)
				}
			case "daemon":
				if val == "" {
					return bad("--daemon needs a socket path\n")
				}
				c.Daemon = val
			case "timeout":
				d, err := time.ParseDuration(val)
				if err != nil || d < 0 {
					return bad("bad --timeout %q\n", val)
				}
				c.Timeout = d
			case "roce-port":
				p, err := strconv.ParseUint(val, 10, 16)
				if err != nil || p == 0 {
					return bad("bad --roce-port %q\n", val)
				}
				c.RocePort = uint16(p)
			default:
				return bad("unknown option --%s\n", name)
			}
			continue
		}
		if len(arg) < 2 || arg[0] != '-' {
			return bad("unexpected argument %q\n", arg)
		}
		for j := 1; j < len(arg); j++ {
			op := arg[j]
			var val string
			if bytes.IndexByte([]byte("aIpCSt"), op) >= 0 {
				if j+1 < len(arg) {
					val = arg[j+1:]
				} else if i+1 < len(args) {
					i++
					val = args[i]
				} else {
					return bad("option -%c needs a value\n", op)
				}
				j = len(arg)
			}
			switch op {
			case 'a', 'I':
				a, err := netip.ParseAddr(val)
				if err != nil {
					fmt.Fprintf(stderr, "getaddrinfo failed (Name or service not known) - invalid hostname or IP address\n")
					return nil, errRpingUsage
				}
				if op == 'a' {
					c.Addr = a.Unmap()
				} else {
					c.Source = a.Unmap()
				}
			case 'P':
				c.Persistent = true
			case 'p':
				p, _ := strconv.Atoi(val)
				c.Port = uint16(p)
			case 'C':
				n, _ := strconv.Atoi(val)
				if n < 0 {
					return bad("Invalid count %d\n", n)
				}
				c.Count = n
			case 'S':
				n, _ := strconv.Atoi(val)
				if n < rpingMinSize || n > rpingBufSize-1 {
					return bad("Invalid size %d (valid range is %d to %d)\n", n, rpingMinSize, rpingBufSize)
				}
				c.Size = n
			case 't':
				// type of service: accepted, not used on RoCE here
			case 's':
				c.Server, c.Client = true, false
			case 'c':
				c.Server, c.Client = false, true
			case 'v':
				c.Verbose = true
			case 'V':
				c.Validate = true
			case 'd':
				c.Debug = true
			case 'q':
				// self-created QP: the same wire behaviour
			default:
				return bad("unknown option -%c\n", op)
			}
		}
	}
	if !c.Server && !c.Client {
		return nil, errRpingUsage
	}
	if c.Client && !c.Addr.IsValid() {
		return bad("client needs -a addr\n")
	}
	return c, nil
}

func cutEq(s string) (string, string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == '=' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

func runRping(args []string, stdout, stderr io.Writer) int {
	c, err := parseRping(args, stderr)
	if err != nil {
		rpingUsage(stdout)
		return rpingEINVAL
	}
	r := &rpinger{c: c, out: stdout, errw: stderr}
	if err := r.run(); err != nil {
		if !errors.Is(err, errRpingQuiet) {
			fmt.Fprintf(stderr, "rping: %v\n", err)
		}
		return rpingFail
	}
	return 0
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

func (r *rpinger) client(local netip.Addr) error {
	c := r.c
	if err := r.id.ResolveAddr(local, netip.AddrPortFrom(c.Addr, c.Port), 2000*time.Millisecond); err != nil {
		return err
	}
	for _, want := range []rdmacm.EventType{rdmacm.EventAddrResolved, rdmacm.EventRouteResolved} {
		e, err := r.event()
		if err != nil {
			return err
		}
		if e.Type != want {
			r.cmError(e)
			fmt.Fprintf(r.errw, "waiting for addr/route resolution state %d\n", 11)
			return errRpingQuiet
		}
		if want == rdmacm.EventAddrResolved {
			if err := r.id.ResolveRoute(2000 * time.Millisecond); err != nil {
				return err
			}
		}
	}
	r.debugf("rdma_resolve_addr - rdma_resolve_route successful\n")
	if err := r.setup(r.id); err != nil {
		return err
	}
	r.conn = r.id
	if err := r.id.Connect(rdmacm.ConnParam{ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7}); err != nil {
		return fmt.Errorf("rdma_connect: %w", err)
	}
	e, err := r.event()
	if err != nil {
		return err
	}
	if e.Type != rdmacm.EventEstablished {
		r.cmError(e)
		fmt.Fprintf(r.errw, "wait for CONNECTED state %d\n", 11)
		fmt.Fprintf(r.errw, "connect error %d\n", -1)
		return errRpingQuiet
	}
	r.debugf("rdma_connect successful\n")
	err = r.clientLoop()
	if !r.disconnected {
		_ = r.id.Disconnect()
		r.waitDisconnected()
	}
	return err
}

// waitDisconnected waits (bounded) for DISCONNECTED after our DREQ, printing rping's line.
func (r *rpinger) waitDisconnected() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		e, err := r.ch.Get(ctx)
		if err != nil {
			return
		}
		if e.Type == rdmacm.EventDisconnected {
			fmt.Fprintf(r.errw, "%s DISCONNECT EVENT...\n", map[bool]string{true: "server", false: "client"}[r.c.Server])
			r.disconnected = true
			return
		}
	}
}

func (r *rpinger) clientLoop() error {
	c := r.c
	start := byte(65)
	for ping := 0; c.Count == 0 || ping < c.Count; ping++ {
		n := copy(r.startBuf, fmt.Sprintf("rdma-ping-%d: ", ping))
		ch := start
		for i := n; i < c.Size; i++ {
			r.startBuf[i] = ch
			ch++
			if ch > 122 {
				ch = 65
			}
		}
		start++
		if start > 122 {
			start = 65
		}
		r.startBuf[c.Size-1] = 0
		if err := r.sendInfo(rpingStartVA, r.startMR); err != nil {
			return err
		}
		// wait for the server's go-ahead after its READ
		wc, err := r.completion()
		if err != nil || wc == nil {
			return r.clientStop(err, 7)
		}
		if err := r.postRecv(); err != nil {
			return err
		}
		if err := r.sendInfo(rpingRDMAVA, r.rdmaMR); err != nil {
			return err
		}
		// wait for the go-ahead after its WRITE
		wc, err = r.completion()
		if err != nil || wc == nil {
			return r.clientStop(err, 9)
		}
		if err := r.postRecv(); err != nil {
			return err
		}
		if c.Validate && !bytes.Equal(r.startBuf, r.rdmaBuf) {
			fmt.Fprintf(r.errw, "data mismatch!\n")
			return errRpingQuiet
		}
		if c.Verbose {
			fmt.Fprintf(r.out, "ping data: %s\n", cstr(r.rdmaBuf))
		}
	}
	return nil
}

func (r *rpinger) clientStop(err error, want int) error {
	if err != nil {
		return err
	}
	// DISCONNECTED: rping returns 0 when its state is DISCONNECTED
	fmt.Fprintf(r.errw, "wait for %s state %d\n", map[int]string{7: "RDMA_WRITE_ADV", 9: "RDMA_WRITE_COMPLETE"}[want], 10)
	return nil
}

func cstr(b []byte) []byte {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return b[:i]
	}
	return b
}

func (r *rpinger) server(local netip.Addr) error {
	c := r.c
	bind := netip.AddrPortFrom(c.Addr, c.Port)
	if !c.Addr.IsValid() {
		bind = netip.AddrPortFrom(local, c.Port)
	}
	if err := r.id.BindAddr(bind); err != nil {
		fmt.Fprintf(r.errw, "rdma_bind_addr: %v\n", err)
		return errRpingQuiet
	}
	r.debugf("rdma_bind_addr successful\n")
	if err := r.id.Listen(3); err != nil {
		fmt.Fprintf(r.errw, "rdma_listen: %v\n", err)
		return errRpingQuiet
	}
	r.debugf("rdma_listen\n") // after listening, so a harness can wait for it
	if rpingOnListen != nil {
		rpingOnListen()
	}
	for {
		err := r.serveOne()
		if !c.Persistent || err != nil {
			return err
		}
		r.reset()
	}
}

func (r *rpinger) reset() {
	r.release()
	*r = rpinger{c: r.c, out: r.out, errw: r.errw, v: r.v, ch: r.ch, id: r.id}
}

func (r *rpinger) serveOne() error {
	var e rdmacm.Event
	for {
		var err error
		if r.c.Persistent {
			e, err = r.ch.Get(context.Background())
		} else {
			e, err = r.event()
		}
		if err != nil {
			return err
		}
		if e.Type == rdmacm.EventConnectRequest {
			break
		}
		if e.Type == rdmacm.EventTimewaitExit || e.Type == rdmacm.EventDisconnected {
			continue
		}
		fmt.Fprintf(r.errw, "wait for CONNECT_REQUEST state %d\n", 1)
		return errRpingQuiet
	}
	child := e.ID
	r.conn = child
	r.debugf("child cma %p\n", child)
	defer child.Destroy()
	if err := r.setup(child); err != nil {
		fmt.Fprintf(r.errw, "setup_qp failed: %v\n", err)
		return errRpingQuiet
	}
	r.debugf("accepting client connection request\n")
	if err := child.Accept(nil); err != nil {
		fmt.Fprintf(r.errw, "rdma_accept: %v\n", err)
		return errRpingQuiet
	}
	err := r.serverLoop()
	if err != nil {
		fmt.Fprintf(r.errw, "rping server failed: %d\n", -1)
	}
	if !r.disconnected {
		_ = child.Disconnect()
		r.waitDisconnected()
	}
	return err
}

func (r *rpinger) serverLoop() error {
	for {
		// Wait for the client's start buffer (skipping our own ESTABLISHED).
		wc, err := r.completion()
		if err != nil {
			return err
		}
		if wc == nil {
			fmt.Fprintf(r.errw, "wait for RDMA_READ_ADV state %d\n", 10)
			return nil
		}
		raddr := binary.BigEndian.Uint64(r.recvBuf[0:])
		rkey := binary.BigEndian.Uint32(r.recvBuf[8:])
		rlen := binary.BigEndian.Uint32(r.recvBuf[12:])
		r.debugf("Received rkey %x addr %x len %d from peer\n", rkey, raddr, rlen)
		if err := r.postRecv(); err != nil {
			return err
		}
		if int(rlen) > len(r.rdmaBuf) {
			rlen = uint32(len(r.rdmaBuf))
		}
		if err := r.post(qp.SendWR{Opcode: qp.WRRDMARead, RemoteAddr: raddr, RKey: rkey,
			SGL: []qp.SGE{{Addr: rpingRDMAVA, Length: rlen, LKey: r.rdmaMR.LKey()}}}); err != nil {
			return err
		}
		r.debugf("server posted rdma read req \n")
		if wc, err = r.completion(); err != nil || wc == nil || wc.Opcode != cq.OpRDMARead {
			return r.serverStop(err, wc, "RDMA_READ_COMPLETE")
		}
		r.debugf("server received read complete\n")
		if r.c.Verbose {
			fmt.Fprintf(r.out, "server ping data: %s\n", cstr(r.rdmaBuf))
		}
		if err := r.sendGo(); err != nil {
			return err
		}
		r.debugf("server posted go ahead\n")
		// Wait for the client's sink buffer.
		if wc, err = r.completion(); err != nil || wc == nil || wc.Opcode != cq.OpRecv {
			return r.serverStop(err, wc, "RDMA_WRITE_ADV")
		}
		raddr = binary.BigEndian.Uint64(r.recvBuf[0:])
		rkey = binary.BigEndian.Uint32(r.recvBuf[8:])
		if err := r.postRecv(); err != nil {
			return err
		}
		n := len(cstr(r.rdmaBuf)) + 1
		if n > len(r.rdmaBuf) {
			n = len(r.rdmaBuf)
		}
		r.debugf("rdma write from lkey %x laddr %x len %d\n", r.rdmaMR.LKey(), uint64(rpingRDMAVA), n)
		if err := r.post(qp.SendWR{Opcode: qp.WRRDMAWrite, RemoteAddr: raddr, RKey: rkey,
			SGL: []qp.SGE{{Addr: rpingRDMAVA, Length: uint32(n), LKey: r.rdmaMR.LKey()}}}); err != nil {
			return err
		}
		if wc, err = r.completion(); err != nil || wc == nil || wc.Opcode != cq.OpRDMAWrite {
			return r.serverStop(err, wc, "RDMA_WRITE_COMPLETE")
		}
		r.debugf("server rdma write complete \n")
		if err := r.sendGo(); err != nil {
			return err
		}
		r.debugf("server posted go ahead\n")
	}
}

func (r *rpinger) serverStop(err error, wc *cq.WC, want string) error {
	if err != nil {
		return err
	}
	if wc == nil {
		fmt.Fprintf(r.errw, "wait for %s state %d\n", want, 10)
		return nil
	}
	fmt.Fprintf(r.errw, "wait for %s state %d\n", want, 11)
	return errRpingQuiet
}
