package main

// softroce ucmatose: librdmacm's ucmatose (rdma-core librdmacm/examples/cmatose.c), wire-
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

import (
	"bytes"
	"context"
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
		name:    "ucmatose",
		summary: "librdmacm ucmatose, wire-compatible (rdma_cm RC connections, SENDs both ways)",
		run:     func(args []string, stdout, stderr io.Writer) int { return runCMTest(args, stdout, stderr, false) },
	})
	register(&command{
		name:    "udaddy",
		summary: "librdmacm udaddy, wire-compatible (rdma_cm UD via SIDR, SEND with immediate both ways)",
		run:     func(args []string, stdout, stderr io.Writer) int { return runCMTest(args, stdout, stderr, true) },
	})
}

// cmtConfig is a parsed ucmatose/udaddy command line.
type cmtConfig struct {
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
}

func (c *cmtConfig) tool() string {
	if c.UD {
		return "udaddy"
	}
	return "cmatose"
}

// parseCMTest parses "s:b:f:P:c:C:S:t:p:m" (ucmatose) / "s:b:c:C:S:t:p:P:f:" (udaddy).
func parseCMTest(args []string, ud bool, stderr io.Writer) (*cmtConfig, error) {
	c := &cmtConfig{UD: ud, Port: 7471, Conns: 1, Count: 10, Size: 100, Timeout: 30 * time.Second}
	withVal := "sbfPcCStp"
	if ud {
		c.Port = 7174
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
					return nil, fmt.Errorf("option --%s needs a value", name)
				}
				i++
				val = args[i]
			}
			switch name {
			case "dev":
				if err := c.Dev.Set(val); err != nil {
					return nil, err
				}
			case "daemon":
				if val == "" {
					return nil, fmt.Errorf("--daemon needs a socket path")
				}
				c.Daemon = val
			case "timeout":
				d, err := time.ParseDuration(val)
				if err != nil || d < 0 {
					return nil, fmt.Errorf("bad --timeout %q", val)
				}
				c.Timeout = d
			case "roce-port":
				p, err := strconv.ParseUint(val, 10, 16)
				if err != nil || p == 0 {
					return nil, fmt.Errorf("bad --roce-port %q", val)
				}
				c.RocePort = uint16(p)
			default:
				return nil, fmt.Errorf("unknown option --%s", name)
			}
			continue
		}
		if len(arg) < 2 || arg[0] != '-' {
			return nil, fmt.Errorf("unexpected argument %q", arg)
		}
		for j := 1; j < len(arg); j++ {
			op := arg[j]
			var val string
			if bytes.IndexByte([]byte(withVal), op) >= 0 {
				if j+1 < len(arg) {
					val = arg[j+1:]
				} else if i+1 < len(args) {
					i++
					val = args[i]
				} else {
					return nil, fmt.Errorf("option -%c needs a value", op)
				}
				j = len(arg)
			}
			switch op {
			case 's', 'b':
				a, err := netip.ParseAddr(val)
				if err != nil {
					return nil, fmt.Errorf("getaddrinfo error: %q is not an IP address", val)
				}
				if op == 's' {
					c.Dst = a.Unmap()
				} else {
					c.Src = a.Unmap()
				}
			case 'c':
				c.Conns, _ = strconv.Atoi(val)
			case 'C':
				c.Count, _ = strconv.Atoi(val)
			case 'S':
				c.Size, _ = strconv.Atoi(val)
			case 'p':
				if ud { // udaddy: -p is the port space (backwards compatibility)
					if v, err := strconv.ParseInt(val, 0, 32); err != nil || cm.PortSpace(v) != cm.PSUDP {
						return nil, fmt.Errorf("port space %s: only UDP (%#x) is supported", val, int(cm.PSUDP))
					}
					continue
				}
				p, err := strconv.Atoi(val)
				if err != nil || p < 0 || p > 65535 {
					return nil, fmt.Errorf("bad port %q", val)
				}
				c.Port = uint16(p)
			case 't', 'f', 'P', 'm':
				// type of service, address format, port space, migrate: accepted
			default:
				return nil, fmt.Errorf("unknown option -%c", op)
			}
		}
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

func cmtUsage(w io.Writer, ud bool) {
	name, ps := "ucmatose", "tcp or ib"
	if ud {
		name, ps = "udaddy", "udp or ipoib"
	}
	fmt.Fprintf(w, "usage: %s\n\t[-s server_address]\n\t[-b bind_address]\n\t[-f address_format]\n\t    name, ip, ipv6, or gid\n\t[-P port_space]\n\t    %s\n\t[-c connections]\n\t[-C message_count]\n\t[-S message_size]\n\t[-t type_of_service]\n", name, ps)
	if ud {
		fmt.Fprintf(w, "\t[-p port_space - %#x for UDP (default), %#x for IPOIB]\n", int(cm.PSUDP), int(cm.PSIPoIB))
	} else {
		fmt.Fprintf(w, "\t[-p port_number]\n\t[-m(igrate)]\n")
	}
	fmt.Fprintf(w, "softroce: --dev ADDR|IFNAME, --timeout DUR (default 30s), --roce-port N, --portable,\n")
	fmt.Fprintf(w, "\t--daemon SOCKET (run through the softroce daemon: its device, its rdma_cm)\n")
}

func runCMTest(args []string, stdout, stderr io.Writer, ud bool) int {
	c, err := parseCMTest(args, ud, stderr)
	if err != nil {
		fmt.Fprintln(stderr, err)
		cmtUsage(stdout, ud)
		return 1
	}
	t := &cmTest{c: c, out: stdout, errw: stderr}
	ret := t.run()
	fmt.Fprintf(stdout, "test complete\n")
	t.destroy()
	fmt.Fprintf(stdout, "return status %d\n", ret)
	return ret & 0xFF
}

// cmtNode is one connection (struct cmatest_node).
type cmtNode struct {
	id        *rdmacm.ID
	pd        roce.ProtectionDomain
	scq, rcq  roce.CompletionQueue // udaddy: one CQ (scq == rcq)
	q         roce.QueuePair
	mem       []byte
	slot      int // UD: a receive slot's size (message + GRH); the first receive's slot follows the shared one
	mr        roce.MemoryRegion
	connected bool
	ah        *qp.AH
	rqpn      uint32
	rqkey     uint32
}

type cmTest struct {
	c         *cmtConfig
	out, errw io.Writer
	v         roce.Verbs // the embedded device or the daemon
	ch        *rdmacm.EventChannel
	listen    *rdmacm.ID
	nodes     []*cmtNode
	connIndex int
	connects  int // connects_left
	disconns  int // disconnects_left
}

const cmtIOVA = 0x20000

// cmStatus is an rdma_cm event's status as the tools print it: the REJ reason for
// REJECTED, -ETIMEDOUT (-110) for UNREACHABLE, -1 otherwise.
func cmStatus(e rdmacm.Event) int {
	var rj *rdmacm.RejectError
	switch {
	case errors.As(e.Status, &rj):
		return int(rj.Reason)
	case e.Type == rdmacm.EventUnreachable:
		return -110
	}
	return -1
}

func (t *cmTest) run() int {
	c := t.c
	var local netip.Addr
	var err error
	switch {
	case c.Daemon != "":
		dev := c.Dev
		if !dev.IsSet() && c.Src.IsValid() {
			dev.Addr = c.Src
		}
		vd, err := cli.OpenVerbs(c.Daemon, &dev, cli.DevOptions{Peer: c.Dst})
		if err != nil {
			fmt.Fprintf(t.errw, "%s: %v\n", c.tool(), err)
			return 1
		}
		t.v, local = vd.V, vd.Addr
	case c.Src.IsValid():
		local = c.Src
	case c.Dst.IsValid() || c.Dev.IsSet():
		if local, err = cli.ResolveLocalAddr(&c.Dev, c.Dst); err != nil {
			fmt.Fprintf(t.errw, "%s: %v\n", c.tool(), err)
			return 1
		}
	default:
		fmt.Fprintf(t.errw, "%s: the server needs -b ADDR or --dev ADDR|IFNAME (a softroce device is one address)\n", c.tool())
		return 1
	}
	if t.v == nil {
		d, err := roce.OpenUDP(roce.UDPOptions{Addrs: []netip.Addr{local}, Port: c.RocePort, Portable: c.Portable,
			MTU: cli.ActiveMTU(cli.InterfaceMTU(local)), Name: "softroce0"})
		if err != nil {
			fmt.Fprintf(t.errw, "%s: %v on %v: %v\n", c.tool(), cli.ErrDev, local, err)
			return 1
		}
		t.v = d.Verbs()
	}
	t.ch = rdmacm.NewEventChannel()
	t.connects = c.Conns
	t.nodes = make([]*cmtNode, c.Conns)
	for i := range t.nodes {
		t.nodes[i] = &cmtNode{}
	}
	if c.Dst.IsValid() {
		return t.client(local)
	}
	return t.server(local)
}

func (t *cmTest) ps() cm.PortSpace {
	if t.c.UD {
		return cm.PSUDP
	}
	return cm.PSTCP
}

// destroy releases everything (destroy_nodes, rdma_destroy_event_channel).
func (t *cmTest) destroy() {
	for _, n := range t.nodes {
		if n.id != nil {
			n.id.Destroy()
		}
	}
	if t.listen != nil {
		t.listen.Destroy()
	}
	if t.ch != nil {
		t.ch.Close()
	}
	if t.v != nil {
		t.v.Close() // embedded: the device; daemon: the daemon destroys our objects
	}
}

func (t *cmTest) initNode(n *cmtNode) error {
	c := t.c
	d := t.v
	if c.UD && c.Count > 0 && c.Size > d.PortAttr().ActiveMTU.Bytes() {
		fmt.Fprintf(t.out, "udaddy: message_size %d is larger than active mtu %d\n", c.Size, d.PortAttr().ActiveMTU.Bytes())
		return errRpingQuiet
	}
	var err error
	if n.pd, err = d.AllocPD(); err != nil {
		fmt.Fprintf(t.out, "%s: unable to allocate PD\n", c.tool())
		return err
	}
	cqe := max(c.Count, 1)
	wr := cqe
	if c.UD {
		cqe = max(2*c.Count, 2)
		n.scq, err = d.CreateCQ(cqe)
		n.rcq = n.scq
	} else {
		if n.scq, err = d.CreateCQ(cqe); err == nil {
			n.rcq, err = d.CreateCQ(cqe)
		}
	}
	if err != nil {
		fmt.Fprintf(t.out, "%s: unable to create CQ\n", c.tool())
		return err
	}
	if n.q, err = n.id.CreateQPVerbs(n.pd, roce.VerbsQPInit{SendCQ: n.scq, RecvCQ: n.rcq, SigAll: !c.UD,
		Cap: qp.Cap{MaxSendWR: uint32(wr), MaxRecvWR: uint32(wr), MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		fmt.Fprintf(t.errw, "%s: unable to create QP: %v\n", c.tool(), err)
		return err
	}
	if c.Count == 0 {
		return nil
	}
	size := c.Size
	bufSize := size
	if c.UD {
		size += 40 // struct ibv_grh
		// one more slot for the first receive alone: its GRH is read for the reply AH
		// (create_reply_ah) while later messages land in the shared slot
		bufSize = 2 * size
		n.slot = size
	}
	if n.mem, err = d.AllocBuffer(bufSize); err != nil { // the daemon maps it (memfd)
		fmt.Fprintf(t.out, "failed to reg MR\n")
		return err
	}
	if n.mr, err = d.RegMR(n.pd, n.mem, cmtIOVA, mr.AccessLocalWrite); err != nil {
		fmt.Fprintf(t.out, "failed to reg MR\n")
		return err
	}
	for i := 0; i < c.Count; i++ {
		addr := uint64(cmtIOVA)
		if c.UD && i == 0 {
			addr += uint64(size) // firstRecvGRH
		}
		if _, err := n.q.PostRecv([]qp.RecvWR{{SGL: []qp.SGE{{Addr: addr, Length: uint32(size), LKey: n.mr.LKey()}}}}); err != nil {
			fmt.Fprintf(t.out, "failed to post receives: %d\n", -1)
			return err
		}
	}
	return nil
}

func (t *cmTest) postSends(n *cmtNode, signaled bool) error {
	if !n.connected || t.c.Count == 0 {
		return nil
	}
	wr := qp.SendWR{Opcode: qp.WRSend, SGL: []qp.SGE{{Addr: cmtIOVA, Length: uint32(t.c.Size), LKey: n.mr.LKey()}}}
	if t.c.UD {
		wr.Opcode, wr.Imm = qp.WRSendWithImm, n.q.Num() // imm_data = htobe32(qp_num)
		wr.AH, wr.RemoteQPN, wr.RemoteQKey = n.ah, n.rqpn, n.rqkey
	}
	if signaled {
		wr.Flags = qp.SendSignaled
	}
	for i := 0; i < t.c.Count; i++ {
		if _, err := n.q.PostSend([]qp.SendWR{wr}); err != nil {
			fmt.Fprintf(t.out, "failed to post sends: %d\n", -1)
			return err
		}
	}
	return nil
}

// pollCQs waits for message_count completions on each connected node's CQ (poll_cqs);
// udaddy's server builds its reply AH from the first one (create_reply_ah).
func (t *cmTest) pollCQs(recv bool) error {
	var wc [8]cq.WC
	for _, n := range t.nodes {
		if !n.connected {
			continue
		}
		c := n.scq
		if recv {
			c = n.rcq
		}
		deadline := time.Now().Add(t.c.Timeout)
		for done := 0; done < t.c.Count; {
			k := c.Poll(wc[:])
			if k == 0 {
				if t.c.Timeout > 0 && time.Now().After(deadline) {
					fmt.Fprintf(t.out, "%s: failed polling CQ: %d\n", t.c.tool(), -110)
					return errRpingQuiet
				}
				_ = c.ReqNotify(false)
				if c.Poll(wc[:1]) > 0 {
					k = 1
				} else {
					tm := time.NewTimer(20 * time.Millisecond)
					select {
					case <-c.Channel():
					case <-tm.C:
					}
					tm.Stop()
					continue
				}
			}
			if t.c.UD && n.ah == nil && wc[0].Opcode == cq.OpRecv && wc[0].Status == cq.StatusSuccess {
				grh := n.firstRecvGRH()                     // the first receive's own slot: nothing writes it again
				src := netip.AddrFrom4([4]byte(grh[32:36])) // the IPv4 header in the GRH's last 20 bytes
				if grh[0]>>4 == 6 {
					src = netip.AddrFrom16([16]byte(grh[8:24])).Unmap()
				}
				idx := t.v.GIDIndex(n.id.LocalAddr().Addr())
				ah, err := t.v.CreateAH(n.pd, qp.AHAttr{DGID: src, SGIDIndex: uint8(max(idx, 1)), HopLimit: 64})
				if err != nil {
					return err
				}
				n.ah, n.rqpn, n.rqkey = ah, wc[0].ImmData, n.q.Query().QKey
			}
			done += k
		}
	}
	return nil
}

// event waits for the next CM event and runs cma_handler; it returns the handler's status.
func (t *cmTest) event() int {
	ctx, cancel := context.WithCancel(context.Background())
	if t.c.Timeout > 0 {
		ctx, cancel = context.WithTimeout(context.Background(), t.c.Timeout)
	}
	defer cancel()
	e, err := t.ch.Get(ctx)
	if err != nil {
		fmt.Fprintf(t.errw, "%s: failure in rdma_get_cm_event: %v\n", t.c.tool(), err)
		return 110
	}
	n, _ := e.ID.Context.(*cmtNode)
	switch e.Type {
	case rdmacm.EventAddrResolved:
		if err := e.ID.ResolveRoute(2000 * time.Millisecond); err != nil {
			fmt.Fprintf(t.errw, "%s: resolve route failed: %v\n", t.c.tool(), err)
			t.connects--
			return -1
		}
	case rdmacm.EventRouteResolved:
		if err := t.initNode(n); err != nil {
			t.connects--
			return -1
		}
		p := rdmacm.ConnParam{}
		if !t.c.UD {
			p = rdmacm.ConnParam{ResponderResources: 1, InitiatorDepth: 1, RetryCount: 5}
		}
		if err := e.ID.Connect(p); err != nil {
			fmt.Fprintf(t.errw, "%s: failure connecting: %v\n", t.c.tool(), err)
			t.connects--
			return -1
		}
	case rdmacm.EventConnectRequest:
		return t.connectRequest(e.ID)
	case rdmacm.EventEstablished:
		if t.c.UD {
			n.ah, n.rqpn, n.rqkey = e.UD.AH, e.UD.QPN, e.UD.QKey
			n.connected = true
			t.connects--
			break
		}
		n.connected = true
		t.connects--
		t.disconns++
	case rdmacm.EventAddrError, rdmacm.EventRouteError, rdmacm.EventConnectError, rdmacm.EventUnreachable, rdmacm.EventRejected:
		st := cmStatus(e)
		fmt.Fprintf(t.out, "%s: event: %s, error: %d\n", t.c.tool(), e.Type, st)
		t.connects--
		return st
	case rdmacm.EventDisconnected:
		if !t.c.UD {
			_ = e.ID.Disconnect()
			t.disconns--
		}
	}
	return 0
}

func (t *cmTest) connectRequest(id *rdmacm.ID) int {
	fail := func(ret int) int {
		fmt.Fprintf(t.out, "%s: failing connection request\n", t.c.tool())
		_ = id.Reject(nil)
		return ret
	}
	if t.connIndex == len(t.nodes) {
		return fail(-12) // -ENOMEM
	}
	n := t.nodes[t.connIndex]
	t.connIndex++
	n.id = id
	id.Context = n
	if err := t.initNode(n); err != nil {
		n.id = nil
		t.connects--
		return fail(-1)
	}
	var p *rdmacm.ConnParam
	if t.c.UD {
		p = &rdmacm.ConnParam{QPNum: n.q.Num()}
	}
	if err := id.Accept(p); err != nil {
		fmt.Fprintf(t.errw, "%s: failure accepting: %v\n", t.c.tool(), err)
		n.id = nil
		t.connects--
		return fail(-1)
	}
	if t.c.UD {
		n.connected = true
		t.connects--
	}
	return 0
}

func (t *cmTest) connectEvents() int {
	ret := 0
	for t.connects > 0 && ret == 0 {
		ret = t.event()
	}
	return ret
}

func (t *cmTest) disconnectEvents() int {
	ret := 0
	for t.disconns > 0 && ret == 0 {
		ret = t.event()
	}
	return ret
}

func (t *cmTest) server(local netip.Addr) int {
	c := t.c
	fmt.Fprintf(t.out, "%s: starting server\n", c.tool())
	var err error
	if t.listen, err = rdmacm.CreateID(t.ch, rdmacm.IDOptions{Verbs: t.v, PortSpace: t.ps()}); err != nil {
		fmt.Fprintf(t.errw, "%s: listen request failed: %v\n", c.tool(), err)
		return 1
	}
	bind := local
	if c.Src.IsValid() {
		bind = c.Src
	}
	if err := t.listen.BindAddr(netip.AddrPortFrom(bind, c.Port)); err != nil {
		fmt.Fprintf(t.errw, "%s: bind address failed: %v\n", c.tool(), err)
		return 1
	}
	if err := t.listen.Listen(0); err != nil {
		fmt.Fprintf(t.errw, "%s: failure trying to listen: %v\n", c.tool(), err)
		return 1
	}
	if cmtOnListen != nil {
		cmtOnListen()
	}
	if c.UD {
		t.connectEvents()
		if c.Count > 0 {
			fmt.Fprintf(t.out, "receiving data transfers\n")
			if t.pollCQs(true) != nil {
				return 1
			}
			fmt.Fprintf(t.out, "sending replies\n")
			for _, n := range t.nodes {
				if t.postSends(n, true) != nil {
					return 1
				}
			}
			if t.pollCQs(true) != nil {
				return 1
			}
			fmt.Fprintf(t.out, "data transfers complete\n")
		}
		return 0
	}
	if ret := t.connectEvents(); ret != 0 {
		return ret
	}
	if c.Count > 0 {
		fmt.Fprintf(t.out, "initiating data transfers\n")
		for _, n := range t.nodes {
			if t.postSends(n, false) != nil {
				return 1
			}
		}
		fmt.Fprintf(t.out, "completing sends\n")
		if t.pollCQs(false) != nil {
			return 1
		}
		fmt.Fprintf(t.out, "receiving data transfers\n")
		if t.pollCQs(true) != nil {
			return 1
		}
		fmt.Fprintf(t.out, "data transfers complete\n")
	}
	fmt.Fprintf(t.out, "cmatose: disconnecting\n")
	for _, n := range t.nodes {
		if !n.connected {
			continue
		}
		n.connected = false
		_ = n.id.Disconnect()
	}
	ret := t.disconnectEvents()
	fmt.Fprintf(t.out, "disconnected\n")
	return ret
}

func (t *cmTest) client(local netip.Addr) int {
	c := t.c
	fmt.Fprintf(t.out, "%s: starting client\n", c.tool())
	fmt.Fprintf(t.out, "%s: connecting\n", c.tool())
	for _, n := range t.nodes {
		var err error
		if n.id, err = rdmacm.CreateID(t.ch, rdmacm.IDOptions{Verbs: t.v, PortSpace: t.ps(), Context: n}); err != nil {
			return 1
		}
		n.id.Context = n
		if err := n.id.ResolveAddr(local, netip.AddrPortFrom(c.Dst, c.Port), 2000*time.Millisecond); err != nil {
			fmt.Fprintf(t.errw, "%s: failure getting addr: %v\n", c.tool(), err)
			return 1
		}
	}
	ret := t.connectEvents()
	if c.UD {
		if ret != 0 {
			return ret
		}
		if c.Count > 0 {
			fmt.Fprintf(t.out, "initiating data transfers\n")
			for _, n := range t.nodes {
				if t.postSends(n, false) != nil {
					return 1
				}
			}
			fmt.Fprintf(t.out, "receiving data transfers\n")
			if t.pollCQs(true) != nil {
				return 1
			}
			fmt.Fprintf(t.out, "data transfers complete\n")
		}
		return 0
	}
	if ret == 0 && c.Count > 0 {
		fmt.Fprintf(t.out, "receiving data transfers\n")
		if t.pollCQs(true) != nil {
			ret = 1
		} else {
			fmt.Fprintf(t.out, "sending replies\n")
			for _, n := range t.nodes {
				if t.postSends(n, false) != nil {
					ret = 1
				}
			}
			if ret == 0 {
				fmt.Fprintf(t.out, "data transfers complete\n")
			}
		}
	}
	if ret2 := t.disconnectEvents(); ret2 != 0 {
		ret = ret2
	}
	return ret
}

// cmtOnListen, if set (tests), is called once a ucmatose/udaddy server listens.
var cmtOnListen func()

// firstRecvGRH is the GRH of a UD node's first receive, which has a slot of its own after the
// shared one (initNode).
func (n *cmtNode) firstRecvGRH() []byte {
	return n.mem[n.slot : n.slot+40]
}
