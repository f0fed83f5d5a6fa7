package cmatose

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/softroce/softroce/internal/cm"
	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/internal/tools/cli"
	"github.com/softroce/softroce/pkg/rdmacm"
	"github.com/softroce/softroce/pkg/roce"
)

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
		return errQuiet
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
					return errQuiet
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
	if t.c.OnListen != nil {
		t.c.OnListen()
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

// firstRecvGRH is the GRH of a UD node's first receive, which has a slot of its own after the
// shared one (initNode).
func (n *cmtNode) firstRecvGRH() []byte {
	return n.mem[n.slot : n.slot+40]
}
