package perf

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

	"github.com/softroce/softroce/internal/oob/perftest"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/internal/tools/cli"
	"github.com/softroce/softroce/pkg/rdmacm"
	"github.com/softroce/softroce/pkg/roce"
)

// perfCMData is the data QPs' rdma_cm side (create_rdma_cm_connection's cma_master).
type perfCMData struct {
	ev  perfCMEvents
	ids []*rdmacm.ID
	// srMissed: data connections established without selective repeat although
	// --selective-repeat asked for it (the peer is not softroce, or did not ask)
	srMissed int
}

// perfCMDataParam is the rdma_conn_param of a data connection (rdma_cm_route_handler and
// rdma_cm_connection_request_handler): READ/atomic depths only for those tests, retry and
// RNR retry counts both retry_count (7).
func perfCMDataParam(c *perfConfig) rdmacm.ConnParam {
	p := rdmacm.ConnParam{RetryCount: perfRetryCount, RNRRetryCount: perfRetryCount}
	if c.Verb == "read" || c.Verb == "atomic" {
		p.ResponderResources, p.InitiatorDepth = uint8(min(c.OutReads, 255)), uint8(min(c.OutReads, 255))
	}
	return p
}

// serverCreate is the server's perfCreateQP: wait for the next connection request on l,
// create the QP on its ID, accept it, and set perftest's min RNR timer (ibv_modify_qp after
// rdma_accept). Requests are accepted in the order they arrive.
func (d *perfCMData) serverCreate(ctx context.Context, c *perfConfig, l *rdmacm.ID) perfCreateQP {
	return func(i int, in roce.VerbsQPInit) (roce.QueuePair, error) {
		ev, err := d.ev.next(ctx, c.Timeout, func(e rdmacm.Event) bool { return e.Listen == l || e.ID == l })
		if err != nil {
			return nil, err
		}
		if ev.Type != rdmacm.EventConnectRequest {
			return nil, perfCMEventError("waiting for a data connection request", ev)
		}
		d.ids = append(d.ids, ev.ID)
		q, err := ev.ID.CreateQPVerbs(in.PD, in)
		if err != nil {
			ev.ID.Reject(nil)
			return nil, err
		}
		if c.SelectiveRepeat {
			// accepted if the client's request offers it (softroce's extension, docs/cm.md)
			if err := ev.ID.SetOption(rdmacm.OptionSelectiveRepeat, 1); err != nil {
				ev.ID.Reject(nil)
				return q, fmt.Errorf("%w: --selective-repeat: %w", errPerfCM, err)
			}
		}
		p := perfCMDataParam(c)
		if err := ev.ID.Accept(&p); err != nil {
			return q, fmt.Errorf("%w: Failed to accept RDMA CM connection: %w", errPerfCM, err)
		}
		if c.SelectiveRepeat && !ev.ID.SelectiveRepeat() {
			d.srMissed++
		}
		a := qp.Attr{MinRNRTimer: perfMinRNRTimer}
		if err := q.Modify(&a, qp.AttrMinRNRTimer); err != nil {
			return q, fmt.Errorf("%w: setting the min RNR timer of QP %d: %w", errPerfVerbs, i, err)
		}
		return q, nil
	}
}

// perfCMDataQP creates a data QP on the client's resolved ID; with --selective-repeat the ID
// first asks for it, so that the request offers it (softroce's extension: the CM negotiates
// it, docs/cm.md).
func perfCMDataQP(c *perfConfig, in roce.VerbsQPInit) func(*rdmacm.ID) (roce.QueuePair, error) {
	return func(id *rdmacm.ID) (roce.QueuePair, error) {
		if c.SelectiveRepeat {
			if err := id.SetOption(rdmacm.OptionSelectiveRepeat, 1); err != nil {
				return nil, fmt.Errorf("%w: --selective-repeat: %w", errPerfCM, err)
			}
		}
		return id.CreateQPVerbs(in.PD, in)
	}
}

// clientCreate is the client's perfCreateQP: resolve, create the QP on a new ID and send the
// request, without waiting for the answer (clientWait does).
func (d *perfCMData) clientCreate(ctx context.Context, c *perfConfig, dev roce.Verbs, local netip.Addr, server netip.AddrPort) perfCreateQP {
	return func(i int, in roce.VerbsQPInit) (roce.QueuePair, error) {
		id, q, err := perfCMConnect(ctx, &d.ev, c, dev, local, server, perfCMDataQP(c, in), perfCMDataParam(c))
		if id != nil {
			d.ids = append(d.ids, id)
		}
		return q, err
	}
}

// clientWait waits for every data connection's ESTABLISHED; a refused or failed one is made
// again with a new ID and QP, up to perfCMRetries attempts, perfCMRetryDelay apart.
func (d *perfCMData) clientWait(ctx context.Context, r *perfRes, dev roce.Verbs, local netip.Addr, server netip.AddrPort) error {
	c := r.c
	tries := make([]int, len(d.ids))
	done := 0
	for done < len(d.ids) {
		ev, err := d.ev.next(ctx, c.Timeout, func(e rdmacm.Event) bool {
			for _, id := range d.ids {
				if e.ID == id {
					return true
				}
			}
			return false
		})
		if err != nil {
			return err
		}
		i := 0
		for d.ids[i] != ev.ID {
			i++
		}
		switch ev.Type {
		case rdmacm.EventEstablished:
			if c.SelectiveRepeat && !ev.Param.SelectiveRepeat {
				d.srMissed++ // the server's REP did not accept the offer
			}
			done++
			continue
		case rdmacm.EventRejected, rdmacm.EventUnreachable, rdmacm.EventConnectError:
		default:
			continue // e.g. a late event of an earlier step
		}
		tries[i]++
		if tries[i] >= perfCMRetries {
			return fmt.Errorf("Failed to connect RDMA CM client, tried %d times: %w", perfCMRetries, perfCMEventError("data connection", ev))
		}
		d.ids[i].Destroy()
		d.ids[i] = nil
		if err := r.qps[i].Destroy(); err != nil {
			return fmt.Errorf("%w: Couldn't destroy QP[%d]: %w", errPerfVerbs, i, err)
		}
		time.Sleep(perfCMRetryDelay)
		id, q, err := perfCMConnect(ctx, &d.ev, c, dev, local, server, perfCMDataQP(c, r.qpInit), perfCMDataParam(c))
		d.ids[i] = id
		if q != nil {
			r.qps[i] = q
			r.mine[i].QPN = q.Num()
		} else {
			r.qps[i] = nil
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// close disconnects the data connections and destroys their IDs (the QPs go with perfRes).
func (d *perfCMData) close() {
	perfCMDisconnect(&d.ev, d.ids)
	for _, id := range d.ids {
		if id != nil {
			id.Destroy()
		}
	}
	d.ids = nil
	d.ev.ch.Close()
}

// perfCMBanner is the banner with ctx_print_test_info's rdma_cm lines: "rdma_cm QPs : ON",
// "Data ex. method : rdma_cm" and, on the server, the invitation to connect.
func perfCMBanner(b string, role perftest.Role) string {
	tail := " rdma_cm QPs\t : ON\n Data ex. method : rdma_cm"
	if role == perftest.Server {
		tail += "\n" + perftest.ResultLine + " Waiting for client rdma_cm QP to connect\n" +
			" Please run the same command with the IB/RoCE interface IP"
	}
	return strings.Replace(b, " rdma_cm QPs\t : OFF\n Data ex. method : Ethernet", tail, 1)
}

// perfRunCM runs one side of a -R test.
func perfRunCM(ctx context.Context, c *perfConfig, out io.Writer) (err error) {
	role := perftest.Client
	if c.Server == "" {
		role = perftest.Server
	}
	var (
		ld     *cli.VerbsDev
		server netip.AddrPort
		peer   netip.Addr
	)
	if role == perftest.Client {
		host, e := cli.ResolveHost(ctx, c.Server, c.Timeout)
		if e != nil {
			return e
		}
		server, peer = netip.AddrPortFrom(host.Unmap(), uint16(c.Port)), host
	}
	if ld, err = cli.OpenVerbs(c.Daemon, &c.Dev, cli.DevOptions{Port: c.RocePort, Portable: c.Portable, Peer: peer, BusyPoll: c.linkBusyPoll(),
		GIDIndex: c.GIDIndex, ByGIDIndex: c.GIDIndex >= 0, CC: c.CC.Params()}); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, ld.Close()) }()
	if c.MTU != 0 && c.MTU > ld.MTU {
		return fmt.Errorf("%w: -m %d: requested MTU is larger than the port's active MTU %d", errPerfUsage, c.MTU.Bytes(), ld.MTU.Bytes())
	}
	mtu := c.MTU
	if mtu == 0 {
		mtu = ld.MTU
	}
	if c.Verb == "read" || c.Verb == "atomic" {
		fmt.Fprint(out, perftest.ResultLine) // ctx_set_max_inline's separator
	}
	comm, err := newPerfCMComm(c, ld.V, role, ld.GIDIndex)
	defer func() { err = errors.Join(err, comm.close()) }()
	if err != nil {
		return err
	}
	if role == perftest.Server {
		// listening before the banner: whoever starts the client on seeing it finds the
		// listener in place
		l, err := comm.listen(ld.Addr)
		if err != nil {
			return err
		}
		fmt.Fprint(out, perftest.WaitingBanner)
		if err := comm.accept(ctx, l); err != nil {
			return err
		}
	} else if err := comm.dial(ctx, ld.Addr, server); err != nil {
		return err
	}
	sd, agreed, err := comm.preamble(perftest.MTU(mtu))
	if err != nil {
		return fmt.Errorf("Failed to exchange data between server and clients: %w", err)
	}
	// create_rdma_cm_connection: a key round, the data connections, a key round. The server
	// listens before the first round (perftest: after it), so that no request meets a
	// listener being set up; the exchange's listener is gone already.
	data := &perfCMData{ev: perfCMEvents{ch: rdmacm.NewEventChannel()}}
	var create perfCreateQP
	if role == perftest.Server {
		l, err := perfCMListen(&data.ev, ld.V, ld.Addr, c.Port, c.QPs)
		if err != nil {
			data.ev.ch.Close()
			return err
		}
		defer l.Destroy()
		create = data.serverCreate(ctx, c, l)
	} else {
		create = data.clientCreate(ctx, c, ld.V, ld.Addr, server)
	}
	var zero perftest.Dest
	if _, err := comm.handShake(&zero, c.Timeout); err != nil {
		data.ev.ch.Close()
		return fmt.Errorf("Failed to sync between client and server before creating RDMA CM connection: %w", err)
	}
	r, err := newPerfResWith(c, ld.V, ld.Addr, ld.GIDIndex, create)
	defer func() {
		data.close()
		if r != nil {
			err = errors.Join(err, r.close())
		}
	}()
	if err != nil {
		return fmt.Errorf("Failed to create RDMA CM connection: %w", err)
	}
	if role == perftest.Client {
		if err := data.clientWait(ctx, r, ld.V, ld.Addr, server); err != nil {
			return fmt.Errorf("Failed to create RDMA CM connection: %w", err)
		}
	}
	if _, err := comm.handShake(&zero, c.Timeout); err != nil {
		return fmt.Errorf("Failed to sync between client and server after creating RDMA CM connection: %w", err)
	}
	if data.srMissed > 0 {
		fmt.Fprintf(c.Log, "--selective-repeat: the peer did not accept it on %d of %d data connections (not softroce, or not asked there): go-back-N\n",
			data.srMissed, c.QPs)
	}
	if int(sd.CycleBuffer) > r.area || sd.CacheLine > perfCacheLine {
		return fmt.Errorf("%w: peer's cycle buffer %d / cache line %d exceed ours", errPerfPeer, sd.CycleBuffer, sd.CacheLine)
	}
	r.cycle = int(sd.CycleBuffer)
	banner := perftest.Banner{Test: c.Test, Role: role, Device: ld.V.Name(), QPs: c.QPs,
		Transport: "IB", Connection: "RC", LinkType: "Ethernet", PCIeRelaxOrder: "ON", TXDepth: c.TxDepth,
		RXDepth: c.RxDepth, CQModeration: c.CQMod, MTU: agreed, GIDIndex: ld.GIDIndex, InlineSize: c.Inline,
		Atomic: c.Atomic, OutReads: int(r.mine[0].OutReads)}
	fmt.Fprint(out, perfCMBanner(banner.String(), role))
	fmt.Fprint(out, perftest.ResultLine)

	// The key rounds of write_bw.c / send_bw.c with work_rdma_cm (no ctx_connect).
	all := func() error {
		r.rem = r.rem[:0]
		for i := range r.mine {
			d, err := comm.handShake(&r.mine[i], c.Timeout)
			if err != nil {
				return fmt.Errorf("Failed to exchange data between server and clients: %w", err)
			}
			r.rem = append(r.rem, d)
		}
		return nil
	}
	one := func() error {
		if _, err := comm.handShake(&r.mine[0], c.Timeout); err != nil {
			return fmt.Errorf("Failed to exchange data between server and clients: %w", err)
		}
		return nil
	}
	sizes := perfSizes(c, 0)
	if err := all(); err != nil {
		return err
	}
	if c.Verb == "send" {
		if err := one(); err != nil {
			return err
		}
	}
	if err := all(); err != nil {
		return err
	}
	// ctx_print_pingpong_data looks at the exchange's verb, which create_comm_struct sets to
	// SEND with rdma_cm: no RKey/VAddr in the address lines, whatever the test
	for _, d := range r.mine {
		fmt.Fprint(out, perftest.AddressLine(perftest.SendBW, perftest.Local, d, true))
	}
	for _, d := range r.rem {
		fmt.Fprint(out, perftest.AddressLine(perftest.SendBW, perftest.Remote, d, true))
	}
	fmt.Fprint(out, perftest.ResultLine)
	if c.Verb == "send" && role == perftest.Server {
		if err := r.postRecvs(sizes[0]); err != nil {
			return err
		}
	}
	if err := one(); err != nil {
		return err
	}
	// the records' PSNs are random, as perftest's set_up_connection makes them: with rdma_cm
	// the CM chose the real ones
	return perfMeasure(ctx, r, comm, role, out, sizes)
}
