package roce_test

import (
	"fmt"
	"log"
	"net/netip"

	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/roce"
)

// end is one side of the examples: a device's PD, CQ, a registered buffer and an RC QP.
type end struct {
	pd  *roce.PD
	cq  *roce.CQ
	m   *roce.MR
	q   *roce.QP
	buf []byte
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}

// newEnd allocates the objects of one side: 64 KiB registered at iova 0x1000 for local
// and remote writes, one CQ for both queues.
func newEnd(d *roce.Device) *end {
	e := &end{buf: make([]byte, 64<<10)}
	var err error
	e.pd, err = d.AllocPD()
	check(err)
	e.cq, err = d.CreateCQ(64)
	check(err)
	e.m, err = d.RegMR(e.pd, e.buf, 0x1000, roce.AccessLocalWrite|roce.AccessRemoteWrite)
	check(err)
	e.q, err = d.CreateQP(roce.QPInit{Type: roce.TypeRC, PD: e.pd, SendCQ: e.cq, RecvCQ: e.cq,
		Cap: roce.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
	check(err)
	return e
}

// connect moves e's QP through INIT, RTR and RTS towards the peer's QP (what perftest
// and rdma_cm do after exchanging QP numbers and PSNs).
func connect(e *end, peer netip.Addr, peerQPN, rqPSN, sqPSN uint32) {
	check(e.q.Modify(&roce.QPAttr{State: roce.StateInit, Port: 1, AccessFlags: roce.AccessRemoteWrite},
		roce.AttrState|roce.AttrPKeyIndex|roce.AttrPort|roce.AttrAccessFlags))
	check(e.q.Modify(&roce.QPAttr{State: roce.StateRTR, AH: roce.AHAttr{DGID: peer, SGIDIndex: 1},
		PathMTU: roce.MTU1024, DestQPN: peerQPN, RQPSN: rqPSN, MaxDestRDAtomic: 1, MinRNRTimer: 12},
		roce.AttrState|roce.AttrAV|roce.AttrPathMTU|roce.AttrDestQPN|roce.AttrRQPSN|roce.AttrMaxDestRDAtomic|roce.AttrMinRNRTimer))
	check(e.q.Modify(&roce.QPAttr{State: roce.StateRTS, SQPSN: sqPSN, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRDAtomic: 1},
		roce.AttrState|roce.AttrSQPSN|roce.AttrTimeout|roce.AttrRetryCnt|roce.AttrRNRRetry|roce.AttrMaxQPRDAtomic))
}

// waitOne returns the next completion of c, sleeping on the CQ's event between polls
// (ibv_req_notify_cq, ibv_get_cq_event).
func waitOne(c *roce.CQ) roce.WC {
	wc := make([]roce.WC, 1)
	for c.Poll(wc) == 0 {
		check(c.ReqNotify(false))
		if c.Poll(wc) > 0 {
			break
		}
		check(c.Wait())
	}
	return wc[0]
}

// One RC RDMA WRITE between two devices in one process, over the in-memory link
// (roce.OpenUDP gives the same devices on UDP sockets): the program of docs/api.md.
func Example_rcWrite() {
	nw := mem.NewNetwork(mem.Options{})
	ipA, ipB := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("198.18.0.2")
	la, err := nw.Attach(ipA)
	check(err)
	lb, err := nw.Attach(ipB)
	check(err)
	da, err := roce.Open(roce.Options{Link: la})
	check(err)
	defer da.Close()
	db, err := roce.Open(roce.Options{Link: lb})
	check(err)
	defer db.Close()

	a, b := newEnd(da), newEnd(db)
	connect(a, ipB, b.q.Num(), 200, 100)
	connect(b, ipA, a.q.Num(), 100, 200)

	msg := "hello, RDMA"
	copy(a.buf, msg)
	_, err = a.q.PostSend([]roce.SendWR{{WRID: 1, Opcode: roce.WRRDMAWrite, Flags: roce.SendSignaled,
		SGL:        []roce.SGE{{Addr: 0x1000, Length: uint32(len(msg)), LKey: a.m.LKey()}},
		RemoteAddr: 0x1000, RKey: b.m.RKey()}})
	check(err)
	wc := waitOne(a.cq)
	fmt.Println(wc.WRID, wc.Status, wc.Opcode)
	fmt.Println(string(b.buf[:len(msg)]))
	// Output:
	// 1 success RDMA_WRITE
	// hello, RDMA
}

// A SEND received into a posted receive buffer, the receiver written against the Verbs
// interface: the same code runs on an embedded device (Device.Verbs) and on the softroce
// daemon (pkg/client.Dial).
func ExampleVerbs() {
	nw := mem.NewNetwork(mem.Options{})
	ipA, ipB := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("198.18.0.2")
	la, err := nw.Attach(ipA)
	check(err)
	lb, err := nw.Attach(ipB)
	check(err)
	da, err := roce.Open(roce.Options{Link: la})
	check(err)
	defer da.Close()
	db, err := roce.Open(roce.Options{Link: lb})
	check(err)
	defer db.Close()
	a := newEnd(da)

	// the receiver: every object through roce.Verbs
	var v roce.Verbs = db.Verbs()
	pd, err := v.AllocPD()
	check(err)
	c, err := v.CreateCQ(16)
	check(err)
	buf, err := v.AllocBuffer(4096)
	check(err)
	m, err := v.RegMR(pd, buf, 0x10000, roce.AccessLocalWrite)
	check(err)
	q, err := v.CreateQP(roce.VerbsQPInit{Type: roce.TypeRC, PD: pd, SendCQ: c, RecvCQ: c,
		Cap: roce.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	check(err)
	check(q.Modify(&roce.QPAttr{State: roce.StateInit, Port: 1}, roce.AttrState|roce.AttrPKeyIndex|roce.AttrPort|roce.AttrAccessFlags))
	check(q.Modify(&roce.QPAttr{State: roce.StateRTR, AH: roce.AHAttr{DGID: ipA, SGIDIndex: 1},
		PathMTU: roce.MTU1024, DestQPN: a.q.Num(), RQPSN: 100, MinRNRTimer: 12},
		roce.AttrState|roce.AttrAV|roce.AttrPathMTU|roce.AttrDestQPN|roce.AttrRQPSN|roce.AttrMaxDestRDAtomic|roce.AttrMinRNRTimer))
	check(q.Modify(&roce.QPAttr{State: roce.StateRTS, SQPSN: 200, Timeout: 14, RetryCnt: 7, RNRRetry: 7},
		roce.AttrState|roce.AttrSQPSN|roce.AttrTimeout|roce.AttrRetryCnt|roce.AttrRNRRetry|roce.AttrMaxQPRDAtomic))
	_, err = q.PostRecv([]roce.RecvWR{{WRID: 7, SGL: []roce.SGE{{Addr: 0x10000, Length: 4096, LKey: m.LKey()}}}})
	check(err)

	// the sender: the embedded device's own objects
	connect(a, ipB, q.Num(), 200, 100)
	msg := "a SEND"
	copy(a.buf, msg)
	_, err = a.q.PostSend([]roce.SendWR{{WRID: 1, Opcode: roce.WRSend, Flags: roce.SendSignaled,
		SGL: []roce.SGE{{Addr: 0x1000, Length: uint32(len(msg)), LKey: a.m.LKey()}}}})
	check(err)

	wc := make([]roce.WC, 1)
	for c.Poll(wc) == 0 {
		check(c.ReqNotify(false))
		if c.Poll(wc) > 0 {
			break
		}
		check(c.Wait())
	}
	fmt.Println(wc[0].WRID, wc[0].Status, wc[0].Opcode, wc[0].ByteLen)
	fmt.Println(string(buf[:wc[0].ByteLen]))
	fmt.Println(v.Name(), v.PortAttr().State == roce.PortActive)
	// Output:
	// 7 success RECV 6
	// a SEND
	// softroce0 true
}
