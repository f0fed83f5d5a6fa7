package roce

import (
	"math/rand"
	"net"
	"net/netip"
	"sync"
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/link/udp"
)

// Addresses of the entropy tests: every softroce test numbers its QPs alike, so on 127.0.0.1 the
// entropy ports are often held by another test process running at the same time.
var (
	entAddrA = netip.MustParseAddr("127.0.0.61")
	entAddrB = netip.MustParseAddr("127.0.0.62")
	entAddrC = netip.MustParseAddr("127.0.0.63")
)

// srcRecorder records, per destination QP, the UDP source ports of the datagrams a link received
// (as the kernel reported them: the real header).
type srcRecorder struct {
	link.Link
	stats *udp.Link // the UDP link under the wrappers (LinkStats)
	mu    sync.Mutex
	ports map[uint32]map[uint16]int
}

func (l *srcRecorder) Stats() link.Stats { return l.stats.Stats() }

func (l *srcRecorder) UDPStats() udp.Stats { return l.stats.UDPStats() }

func (l *srcRecorder) Recv(b []link.Datagram) (int, error) {
	n, err := l.Link.Recv(b)
	l.mu.Lock()
	for _, d := range b[:n] {
		if p, perr := bth.Parse(d.Buf); perr == nil {
			m := l.ports[p.BTH.DestQP()]
			if m == nil {
				m = map[uint16]int{}
				l.ports[p.BTH.DestQP()] = m
			}
			m[d.Src.Port()]++
		}
	}
	l.mu.Unlock()
	return n, err
}

func (l *srcRecorder) seen(qpn uint32) map[uint16]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[uint16]int{}
	for k, v := range l.ports[qpn] {
		out[k] = v
	}
	return out
}

// TestUDPEntropySourcePorts: over real UDP sockets (127.0.0.61 <-> 127.0.0.62), the requests and
// the ACKs of two RC QP pairs arrive with bth.SourcePort(lqpn, rqpn) as their UDP source port
// (IBTA A17.3.2, as kernel rxe), one port per pair, and complete (the receiver checks every ICRC
// over the ports it arrived with, A17.3.3). The device's link counters show the entropy sockets.
func TestUDPEntropySourcePorts(t *testing.T) {
	la, lb, port := listenPair(t, false, entAddrA, entAddrB, listenUDP)
	ra := &srcRecorder{Link: hbLink{la}, stats: la, ports: map[uint32]map[uint16]int{}}
	rb := &srcRecorder{Link: hbLink{lb}, stats: lb, ports: map[uint32]map[uint16]int{}}
	da, err := Open(Options{Link: ra, Port: port, Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	db, err := Open(Options{Link: rb, Port: port, Name: "b"})
	if err != nil {
		da.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		da.Close()
		db.Close()
	})
	type qpPair struct{ a, b *end }
	var pairs []qpPair
	for i := 0; i < 2; i++ {
		a, b := newEnd(t, da, qp.TypeRC, 1<<16), newEnd(t, db, qp.TypeRC, 1<<16)
		connect(t, a, b, qp.MTU1024, 100, 200)
		pairs = append(pairs, qpPair{a, b})
	}
	want := func(p qpPair) uint16 { return bth.SourcePort(p.a.qp.Num(), p.b.qp.Num()) }
	if want(pairs[0]) == want(pairs[1]) {
		t.Skip("the two QPN pairs fold to one port")
	}
	for i, p := range pairs {
		for _, at := range []struct {
			l    link.Link
			addr netip.Addr
		}{{ra, entAddrA}, {rb, entAddrB}} {
			if got := at.l.SourcePort(at.addr, want(p)); got != want(p) {
				// Skip only if another program really holds the port: if it is free, the link
				// should have bound it.
				c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(at.addr, want(p))))
				if err == nil {
					c.Close()
					t.Fatalf("pair %d: SourcePort(%v, %d) = %d although the port is free", i, at.addr, want(p), got)
				}
				t.Skipf("pair %d: entropy port %d on %v is taken by another program (SourcePort %d)", i, want(p), at.addr, got)
			}
		}
	}
	for i, p := range pairs {
		p.a.fill(0, 5000, byte(i))
		post(t, p.a, qp.SendWR{WRID: 1, Opcode: qp.WRRDMAWrite, SGL: []qp.SGE{p.a.sge(0, 5000)}, Flags: qp.SendSignaled,
			RemoteAddr: p.b.va(0), RKey: p.b.mr.RKey()})
	}
	for i, p := range pairs {
		checkWC(t, waitWC(t, p.a.scq, 1)[0], cq.WC{WRID: 1, Opcode: cq.OpRDMAWrite, ByteLen: 5000})
		same(t, "WRITE", p.b.buf[:5000], p.a.buf[:5000])
		req, ack := rb.seen(p.b.qp.Num()), ra.seen(p.a.qp.Num())
		w := want(p)
		if len(req) != 1 || req[w] < 5 {
			t.Fatalf("pair %d: requests arrived from ports %v, want all 5 from %d", i, req, w)
		}
		if len(ack) != 1 || ack[w] == 0 {
			t.Fatalf("pair %d: ACKs arrived from ports %v, want %d", i, ack, w)
		}
	}
	for name, d := range map[string]*Device{"a": da, "b": db} {
		st, ok := d.LinkStats()
		if !ok || st.UDP.EntropySockets != 2 || st.UDP.EntropyFallbacks != 0 {
			t.Fatalf("device %s link stats %+v: want 2 entropy sockets, no fallback", name, st)
		}
		// the device counters (softroce stats, the daemon's OpStats, metrics) carry them too
		if m := d.Stats().Map(); m["link_entropy_sockets"] != 2 || m["link_entropy_fallbacks"] != 0 {
			t.Fatalf("device %s Stats().Map(): link_entropy_sockets %d, link_entropy_fallbacks %d", name,
				m["link_entropy_sockets"], m["link_entropy_fallbacks"])
		}
	}
}

// TestOpenUDPEntropyOption: roce.UDPOptions.Link.Entropy reaches the link (Off: the main port),
// and with receive shards (FastPath.Workers) every shard gives a QP's entropy port.
func TestOpenUDPEntropyOption(t *testing.T) {
	const e = 0xC5A5
	for _, c := range []struct {
		name    string
		off     bool
		workers int
	}{{"off", true, 1}, {"on", false, 1}, {"shards", false, 2}} {
		t.Run(c.name, func(t *testing.T) {
			var d *Device
			var port uint16
			var err error
			for try := 0; try < 20; try++ {
				port = uint16(20000 + rand.Intn(20000))
				d, err = OpenUDP(UDPOptions{Addrs: []netip.Addr{entAddrC}, Port: port, Name: "e",
					Link: udp.Options{Entropy: udp.EntropyOptions{Off: c.off}}, FastPath: FastPathOptions{Workers: c.workers}})
				if err == nil {
					break
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			want := uint16(e)
			if c.off {
				want = port
			}
			for i, l := range d.links {
				got := l.SourcePort(entAddrC, e)
				if got != want && !c.off {
					if u, ok := l.(interface {
						EntropySocket(netip.Addr, uint16) (uint16, bool)
					}); ok {
						if _, pooled := u.EntropySocket(entAddrC, e); !pooled {
							if cn, lerr := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(entAddrC, e))); lerr != nil {
								t.Skipf("port %d taken by another program", e)
							} else {
								cn.Close()
							}
						}
					}
				}
				if got != want {
					t.Fatalf("link %d of %d: SourcePort %d, want %d", i, len(d.links), got, want)
				}
			}
			if st, _ := d.LinkStats(); (st.UDP.EntropySockets == 1) == c.off {
				t.Fatalf("link stats %+v (entropy off %v)", st, c.off)
			}
		})
	}
}

// TestFlowLabelSourcePort: an RC QP whose address vector carries a flow label (rdma_cm gives a
// connection bth.CMFlowLabel of its ports, on both ends) sends from the port that label folds
// to, requests and ACKs alike, as kernel rxe does (rdma_get_udp_sport); without one, from the
// QPN pair's (TestUDPEntropySourcePorts).
func TestFlowLabelSourcePort(t *testing.T) {
	nw := mem.NewNetwork(mem.Options{})
	la, err := nw.Attach(addrA)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := nw.Attach(addrB)
	if err != nil {
		t.Fatal(err)
	}
	ra, rb := &memPorts{Link: la}, &memPorts{Link: lb}
	da, err := Open(Options{Link: ra, Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer da.Close()
	db, err := Open(Options{Link: rb, Name: "b"})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	a, b := newEnd(t, da, qp.TypeRC, 1<<16), newEnd(t, db, qp.TypeRC, 1<<16)
	fl := bth.CMFlowLabel(0xb4ca, 7174) // the lab's rping REQ (internal/cm capture test)
	for _, e := range []struct{ e, peer *end }{{a, b}, {b, a}} {
		for _, s := range []struct {
			a qp.Attr
			m qp.AttrMask
		}{
			{qp.Attr{State: qp.StateInit, Port: 1, AccessFlags: mr.AccessRemoteWrite}, qp.AttrState | qp.AttrPKeyIndex | qp.AttrPort | qp.AttrAccessFlags},
			{qp.Attr{State: qp.StateRTR, AH: qp.AHAttr{DGID: e.peer.addr, SGIDIndex: uint8(e.e.dev.GIDIndex(e.e.addr)), FlowLabel: fl, Port: 1},
				PathMTU: qp.MTU1024, DestQPN: e.peer.qp.Num(), RQPSN: 7, MaxDestRDAtomic: 1, MinRNRTimer: 1},
				qp.AttrState | qp.AttrAV | qp.AttrPathMTU | qp.AttrDestQPN | qp.AttrRQPSN | qp.AttrMaxDestRDAtomic | qp.AttrMinRNRTimer},
			{qp.Attr{State: qp.StateRTS, SQPSN: 7, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRDAtomic: 1},
				qp.AttrState | qp.AttrSQPSN | qp.AttrTimeout | qp.AttrRetryCnt | qp.AttrRNRRetry | qp.AttrMaxQPRDAtomic},
		} {
			if err := e.e.qp.Modify(&s.a, s.m); err != nil {
				t.Fatal(err)
			}
		}
	}
	post(t, a, qp.SendWR{WRID: 1, Opcode: qp.WRRDMAWrite, SGL: []qp.SGE{a.sge(0, 3000)}, Flags: qp.SendSignaled,
		RemoteAddr: b.va(0), RKey: b.mr.RKey()})
	checkWC(t, waitWC(t, a.scq, 1)[0], cq.WC{WRID: 1, Opcode: cq.OpRDMAWrite, ByteLen: 3000})
	w := bth.FlowLabelToSourcePort(fl)
	if w == bth.SourcePort(a.qp.Num(), b.qp.Num()) {
		t.Fatal("the flow label folds to the QPN pair's port: the test cannot tell them apart")
	}
	if req, ack := rb.seen(b.qp.Num()), ra.seen(a.qp.Num()); len(req) != 1 || req[w] != 3 || len(ack) != 1 || ack[w] == 0 {
		t.Fatalf("requests from ports %v, ACKs from %v; want all from %d (flow label %#x)", req, ack, w, fl)
	}
}

// memPorts records, per destination QP, the UDP source ports of the datagrams an in-memory link
// received (srcRecorder's for a UDP link).
type memPorts struct {
	link.Link
	mu    sync.Mutex
	ports map[uint32]map[uint16]int
}

func (l *memPorts) Recv(b []link.Datagram) (int, error) {
	n, err := l.Link.Recv(b)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ports == nil {
		l.ports = map[uint32]map[uint16]int{}
	}
	for _, d := range b[:n] {
		if p, perr := bth.Parse(d.Buf); perr == nil {
			if l.ports[p.BTH.DestQP()] == nil {
				l.ports[p.BTH.DestQP()] = map[uint16]int{}
			}
			l.ports[p.BTH.DestQP()][d.Src.Port()]++
		}
	}
	return n, err
}

func (l *memPorts) seen(qpn uint32) map[uint16]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[uint16]int{}
	for k, v := range l.ports[qpn] {
		out[k] = v
	}
	return out
}
