package rdmacm_test

import (
	"context"
	"fmt"
	"log"
	"net/netip"
	"time"

	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/rdmacm"
	"github.com/softroce/softroce/pkg/roce"
)

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}

// next waits for ch's next event and checks its type, as rping does after each call.
func next(ch *rdmacm.EventChannel, want rdmacm.EventType) rdmacm.Event {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, err := ch.Get(ctx)
	check(err)
	if e.Type != want {
		log.Fatalf("event %v (%v), want %v", e.Type, e.Status, want)
	}
	return e
}

// An rdma_cm connection between two devices in one process, as rping sets one up:
// the server binds and listens, the client resolves the address and the route, creates
// its QP and connects; the server accepts with its own QP, and a SEND goes over the
// connection (the CM's MADs travel on QP1 of each device).
func Example() {
	nw := mem.NewNetwork(mem.Options{})
	ipC, ipS := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("198.18.0.2")
	lc, err := nw.Attach(ipC)
	check(err)
	ls, err := nw.Attach(ipS)
	check(err)
	dc, err := roce.Open(roce.Options{Link: lc})
	check(err)
	defer dc.Close()
	ds, err := roce.Open(roce.Options{Link: ls})
	check(err)
	defer ds.Close()
	qpCap := roce.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}

	// server: rdma_bind_addr, rdma_listen
	sch := rdmacm.NewEventChannel()
	defer sch.Close()
	lid, err := rdmacm.CreateID(sch, rdmacm.IDOptions{Device: ds})
	check(err)
	defer lid.Destroy()
	check(lid.BindAddr(netip.AddrPortFrom(netip.Addr{}, 7174)))
	check(lid.Listen(1))

	// client: rdma_resolve_addr, rdma_resolve_route, rdma_create_qp, rdma_connect
	cch := rdmacm.NewEventChannel()
	defer cch.Close()
	cid, err := rdmacm.CreateID(cch, rdmacm.IDOptions{Device: dc})
	check(err)
	defer cid.Destroy()
	check(cid.ResolveAddr(netip.Addr{}, netip.AddrPortFrom(ipS, 7174), time.Second))
	next(cch, rdmacm.EventAddrResolved)
	check(cid.ResolveRoute(time.Second))
	next(cch, rdmacm.EventRouteResolved)
	cpd, err := dc.AllocPD()
	check(err)
	ccq, err := dc.CreateCQ(8)
	check(err)
	cbuf := []byte("hello over rdma_cm")
	cmr, err := dc.RegMR(cpd, cbuf, 0x1000, roce.AccessLocalWrite)
	check(err)
	cqp, err := cid.CreateQP(cpd, roce.QPInit{SendCQ: ccq, RecvCQ: ccq, Cap: qpCap})
	check(err)
	check(cid.Connect(rdmacm.ConnParam{PrivateData: []byte("hi"), RetryCount: 7, RNRRetryCount: 7}))

	// server: the CONNECT_REQUEST brings a new ID; its QP, a receive, rdma_accept
	req := next(sch, rdmacm.EventConnectRequest)
	defer req.ID.Destroy()
	spd, err := ds.AllocPD()
	check(err)
	scq, err := ds.CreateCQ(8)
	check(err)
	sbuf := make([]byte, 64)
	smr, err := ds.RegMR(spd, sbuf, 0x2000, roce.AccessLocalWrite)
	check(err)
	sqp, err := req.ID.CreateQP(spd, roce.QPInit{SendCQ: scq, RecvCQ: scq, Cap: qpCap})
	check(err)
	_, err = sqp.PostRecv([]roce.RecvWR{{WRID: 1, SGL: []roce.SGE{{Addr: 0x2000, Length: 64, LKey: smr.LKey()}}}})
	check(err)
	check(req.ID.Accept(nil))
	next(cch, rdmacm.EventEstablished)
	next(sch, rdmacm.EventEstablished)
	fmt.Println("connected:", cqp.State(), sqp.State(), string(req.Param.PrivateData[:2]))

	// a SEND from the client lands in the server's receive
	_, err = cqp.PostSend([]roce.SendWR{{WRID: 2, Opcode: roce.WRSend, Flags: roce.SendSignaled,
		SGL: []roce.SGE{{Addr: 0x1000, Length: uint32(len(cbuf)), LKey: cmr.LKey()}}}})
	check(err)
	wc := make([]roce.WC, 1)
	for scq.Poll(wc) == 0 {
		check(scq.ReqNotify(false))
		if scq.Poll(wc) > 0 {
			break
		}
		check(scq.Wait())
	}
	fmt.Println("received:", wc[0].Status, string(sbuf[:wc[0].ByteLen]))

	// rdma_disconnect: both sides see DISCONNECTED; the client's QP is in
	// ERR, the server's when the server disconnects in turn
	check(cid.Disconnect())
	next(sch, rdmacm.EventDisconnected)
	next(cch, rdmacm.EventDisconnected)
	fmt.Println("disconnected:", cqp.State(), sqp.State())
	check(req.ID.Disconnect())
	fmt.Println("server disconnected:", sqp.State())
	// Output:
	// connected: RTS RTS hi
	// received: success hello over rdma_cm
	// disconnected: ERR RTS
	// server disconnected: ERR
}
