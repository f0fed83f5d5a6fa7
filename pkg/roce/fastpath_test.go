package roce

import (
	"math/rand"
	"net/netip"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/link/udp"
)

// connectPairs creates n RC QPs on each of a and b (caps as perftest's ib_write_bw: 128 send
// and 512 receive WRs, one SGE) and connects them pairwise to RTS. It returns the QPs.
func connectPairs(tb testing.TB, a, b *Device, n int) (qa, qb []*QP) {
	tb.Helper()
	acc := mr.AccessLocalWrite | mr.AccessRemoteWrite | mr.AccessRemoteRead
	mk := func(d *Device) (*mr.PD, *cq.CQ) {
		pd, err := d.AllocPD()
		if err != nil {
			tb.Fatal(err)
		}
		c, err := d.CreateCQ(4096)
		if err != nil {
			tb.Fatal(err)
		}
		return pd, c
	}
	pa, ca := mk(a)
	pb, cb := mk(b)
	qa, qb = make([]*QP, n), make([]*QP, n)
	caps := qp.Cap{MaxSendWR: 128, MaxRecvWR: 512, MaxSendSGE: 1, MaxRecvSGE: 1}
	for i := 0; i < n; i++ {
		var err error
		if qa[i], err = a.CreateQP(QPInit{Type: qp.TypeRC, PD: pa, SendCQ: ca, RecvCQ: ca, Cap: caps}); err != nil {
			tb.Fatal(err)
		}
		if qb[i], err = b.CreateQP(QPInit{Type: qp.TypeRC, PD: pb, SendCQ: cb, RecvCQ: cb, Cap: caps}); err != nil {
			tb.Fatal(err)
		}
	}
	up := func(q *QP, d *Device, peer *QP, peerAddr netip.Addr) {
		steps := []struct {
			a qp.Attr
			m qp.AttrMask
		}{
			{qp.Attr{State: qp.StateInit, Port: 1, AccessFlags: acc}, qp.AttrState | qp.AttrPKeyIndex | qp.AttrPort | qp.AttrAccessFlags},
			{qp.Attr{State: qp.StateRTR, AH: qp.AHAttr{DGID: peerAddr, SGIDIndex: 1, Port: 1, HopLimit: 64}, PathMTU: qp.MTU4096,
				DestQPN: peer.Num(), RQPSN: 1, MaxDestRDAtomic: 16, MinRNRTimer: 12},
				qp.AttrState | qp.AttrAV | qp.AttrPathMTU | qp.AttrDestQPN | qp.AttrRQPSN | qp.AttrMaxDestRDAtomic | qp.AttrMinRNRTimer},
			{qp.Attr{State: qp.StateRTS, SQPSN: 1, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRDAtomic: 16},
				qp.AttrState | qp.AttrSQPSN | qp.AttrTimeout | qp.AttrRetryCnt | qp.AttrRNRRetry | qp.AttrMaxQPRDAtomic},
		}
		for _, s := range steps {
			if err := q.Modify(&s.a, s.m); err != nil {
				tb.Fatal(err)
			}
		}
	}
	for i := 0; i < n; i++ {
		up(qa[i], a, qb[i], b.Addrs()[0])
		up(qb[i], b, qa[i], a.Addrs()[0])
	}
	return qa, qb
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestIdleQPMemory: 10,000 connected RC QPs per device (20,000 in the process) fit, and an idle
// connected QP costs at most 4 KiB of heap: send and receive rings, responder resources and send
// buffers are allocated when first used.
func TestIdleQPMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("creates 20,000 QPs")
	}
	n := 10000
	nw := mem.NewNetwork(mem.Options{})
	la, err := nw.Attach(netip.MustParseAddr("198.18.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	lb, err := nw.Attach(netip.MustParseAddr("198.18.0.2"))
	if err != nil {
		t.Fatal(err)
	}
	a, err := Open(Options{Link: la})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Open(Options{Link: lb})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	before := heapInUse()
	qa, qb := connectPairs(t, a, b, n)
	after := heapInUse()
	per := float64(after-before) / float64(2*n)
	t.Logf("%d connected RC QPs: %.0f bytes of heap per idle QP", 2*n, per)
	for _, q := range append(qa, qb...) {
		if q.State() != qp.StateRTS {
			t.Fatalf("QP %#x in %v", q.Num(), q.State())
		}
	}
	if per > 4096 {
		t.Fatalf("%.0f bytes per idle connected QP, want <= 4096", per)
	}
	runtime.KeepAlive(qa)
	runtime.KeepAlive(qb)
}

// hbRunLink is hbLink for a link.RunSender (hbLink would hide SendRuns).
type hbRunLink struct{ *udp.Link }

func (l hbRunLink) Send(b []link.Datagram) error {
	wire.Add(1)
	return l.Link.Send(b)
}

func (l hbRunLink) SendRuns(b []link.Datagram, runs []uint8) error {
	wire.Add(1)
	return l.Link.SendRuns(b, runs)
}

func (l hbRunLink) Recv(b []link.Datagram) (int, error) {
	n, err := l.Link.Recv(b)
	wire.Load()
	return n, err
}

// views counts RecvView calls (the device's receive loop must prefer them).
var views atomic.Int64

func (l hbRunLink) RecvView(b []link.Datagram) (int, error) {
	views.Add(1)
	n, err := l.Link.RecvView(b)
	wire.Load()
	return n, err
}

// fastPair opens two UDP devices on 127.0.0.1 / 127.0.0.2 (a free port both can bind) with
// the link options OpenUDP derives from f.
func fastPair(t *testing.T, f FastPathOptions) (a, b *Device, la, lb *udp.Link) {
	t.Helper()
	var o udp.Options
	f.apply(&o)
	la, lb, port := listenPair(t, false, addrA, addrB, func(a netip.Addr, p uint16) (*udp.Link, error) {
		oo := o
		oo.Addrs, oo.Port = []netip.Addr{a}, p
		return udp.Listen(oo)
	})
	var err error
	if a, err = Open(Options{Link: hbRunLink{la}, Port: port, Name: "a"}); err != nil {
		t.Fatal(err)
	}
	if b, err = Open(Options{Link: hbRunLink{lb}, Port: port, Name: "b"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.Close()
		b.Close()
	})
	return a, b, la, lb
}

// TestFastPathUDP: with the fast path (the OpenUDP default) a 1 MiB WRITE and a 1 MiB READ over
// loopback leave as GSO runs (packet k of a run with an ICRC for IPv4 ID k), arrive through GRO,
// are accepted by the receiving device's ICRC check (IDs solved) and land intact; with
// FastPath.Disable nothing uses GSO or GRO and every ICRC is for ID 0.
func TestFastPathUDP(t *testing.T) {
	for _, f := range []FastPathOptions{{}, {Disable: true}} {
		da, db, la, lb := fastPair(t, f)
		if la.RunGSO(addrA) == f.Disable || la.GROEnabled(addrA) == f.Disable {
			t.Fatalf("%+v: RunGSO %v GRO %v", f, la.RunGSO(addrA), la.GROEnabled(addrA))
		}
		const size = 1 << 20
		a, b := newEnd(t, da, qp.TypeRC, 2*size), newEnd(t, db, qp.TypeRC, 2*size)
		connect(t, a, b, qp.MTU4096, 100, 200)
		a.fill(0, size, 3)
		b.fill(size, size, 9)
		post(t, a, qp.SendWR{WRID: 1, Opcode: qp.WRRDMAWrite, SGL: []qp.SGE{a.sge(0, size)}, Flags: qp.SendSignaled,
			RemoteAddr: b.va(0), RKey: b.mr.RKey()},
			qp.SendWR{WRID: 2, Opcode: qp.WRRDMARead, SGL: []qp.SGE{a.sge(size, size)}, Flags: qp.SendSignaled,
				RemoteAddr: b.va(size), RKey: b.mr.RKey()})
		for _, wc := range waitWC(t, a.scq, 2) {
			if wc.Status != cq.StatusSuccess {
				t.Fatalf("%+v: completion %+v", f, wc)
			}
		}
		same(t, "written", b.buf[:size], a.buf[:size])
		same(t, "read", a.buf[size:], b.buf[size:])
		sa, sb := la.UDPStats(), lb.UDPStats()
		st := db.Stats()
		t.Logf("%+v: a %+v; b %+v; b solved %d ICRCs", f, sa, sb, st.RcvdICRCSolved)
		if st.RcvdDropped != 0 || da.Stats().RcvdDropped != 0 {
			// Every counter of both devices, so a failure shows what came with the drops
			// (resends, duplicates, solved ICRCs).
			t.Fatalf("%+v: drops a %d b %d\na %+v\nb %+v", f, da.Stats().RcvdDropped, st.RcvdDropped, da.Stats(), st)
		}
		if f.Disable {
			if sa.GSOSends+sb.GSOSends+sa.GROReceives+sb.GROReceives != 0 || st.RcvdICRCSolved+da.Stats().RcvdICRCSolved != 0 {
				t.Fatalf("disabled fast path used GSO/GRO or non-zero IDs")
			}
			continue
		}
		// the WRITE's data (b receives) and the READ responses (a receives)
		if sa.GSOSends == 0 || sb.GSOSends == 0 || sb.GROReceives == 0 || sa.GROReceives == 0 {
			t.Fatalf("fast path: GSO sends a %d b %d, GRO receives a %d b %d", sa.GSOSends, sb.GSOSends, sa.GROReceives, sb.GROReceives)
		}
		if st.RcvdICRCSolved == 0 || da.Stats().RcvdICRCSolved == 0 {
			t.Fatal("no packet carried a non-zero IPv4 ID ICRC")
		}
		if views.Load() == 0 {
			t.Fatal("the receive loop never used RecvView")
		}
	}
}

// TestFastPathWorkers: with two receive workers per device (SO_REUSEPORT shards steered by
// DestQP, pinned threads) four QP pairs move data concurrently; each device's packets are
// received by both workers, and every transfer lands intact.
func TestFastPathWorkers(t *testing.T) {
	const workers = 2
	var o udp.Options
	FastPathOptions{}.apply(&o)
	open := func(addr netip.Addr, port uint16) ([]*udp.Link, error) {
		oo := o
		oo.Addrs, oo.Port = []netip.Addr{addr}, port
		return udp.ListenShards(oo, workers)
	}
	var la, lb []*udp.Link
	port := freePortPair(t, false, func(p uint16) error {
		var err error
		if la, err = open(addrA, p); err != nil {
			return err
		}
		if lb, err = open(addrB, p); err != nil {
			for _, l := range la {
				l.Close()
			}
		}
		return err
	})
	dev := func(ls []*udp.Link, name string) *Device {
		var shards []link.Link
		for _, l := range ls[1:] {
			shards = append(shards, hbRunLink{l})
		}
		// QPNs counting up (zeros), so the four QPs split over the two workers by QPN mod 2.
		d, err := Open(Options{Link: hbRunLink{ls[0]}, Shards: shards, Pin: true, Port: port, Name: name, QPNRand: zeros{}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	da, db := dev(la, "a"), dev(lb, "b")
	const size = 256 << 10
	var as, bs []*end
	for i := 0; i < 4; i++ {
		a, b := newEnd(t, da, qp.TypeRC, size), newEnd(t, db, qp.TypeRC, size)
		connect(t, a, b, qp.MTU4096, uint32(i), uint32(100+i))
		a.fill(0, size, byte(i))
		as, bs = append(as, a), append(bs, b)
	}
	for i, a := range as {
		post(t, a, qp.SendWR{WRID: uint64(i), Opcode: qp.WRRDMAWrite, SGL: []qp.SGE{a.sge(0, size)}, Flags: qp.SendSignaled,
			RemoteAddr: bs[i].va(0), RKey: bs[i].mr.RKey()})
	}
	for i, a := range as {
		for _, wc := range waitWC(t, a.scq, 1) {
			if wc.Status != cq.StatusSuccess {
				t.Fatalf("QP %d: %+v", i, wc)
			}
		}
		same(t, "written", bs[i].buf, a.buf)
	}
	for i, l := range lb {
		if l.Stats().Received == 0 {
			t.Fatalf("b's worker %d received nothing (stats %+v)", i, l.Stats())
		}
	}
	for i, l := range la {
		if l.Stats().Received == 0 || l.Stats().Sent == 0 {
			t.Fatalf("a's worker %d: %+v (sends by QPN mod 2, ACKs steered to it)", i, l.Stats())
		}
	}
	if db.Stats().RcvdDropped != 0 {
		t.Fatalf("b dropped %d", db.Stats().RcvdDropped)
	}
}

// BenchmarkUDPWrite streams signaled 64 KiB RDMA WRITEs between two devices on UDP loopback, 8
// in flight, with the fast path (GSO runs, GRO) and without; -benchmem shows the allocations per
// 64 KiB message (16 packets at MTU 4096, 64 at MTU 1024).
func BenchmarkUDPWrite(b *testing.B) {
	for _, mode := range []struct {
		name string
		f    FastPathOptions
	}{{"fast", FastPathOptions{}}, {"plain", FastPathOptions{Disable: true}}, {"fast-2workers", FastPathOptions{Workers: 2}}} {
		for _, mtu := range []qp.MTU{qp.MTU1024, qp.MTU4096} {
			b.Run(mode.name+"/mtu"+mtu.String(), func(b *testing.B) {
				var da, db *Device
				freePortPair(b, false, func(port uint16) error {
					var err error
					if da, err = OpenUDP(UDPOptions{Addrs: []netip.Addr{addrA}, Port: port, FastPath: mode.f}); err != nil {
						return err
					}
					if db, err = OpenUDP(UDPOptions{Addrs: []netip.Addr{addrB}, Port: port, FastPath: mode.f}); err != nil {
						da.Close()
					}
					return err
				})
				defer da.Close()
				defer db.Close()
				benchWrite(b, da, db, mtu)
			})
		}
	}
}

// TestRunIDTable: for packets whose ICRC was computed with IPv4 ID k (a GSO run's segment k),
// runID recognises k < 64 from the CRC difference alone, agrees with bth.SolveIPv4ID, refuses
// other IDs and corrupted packets, and allocates nothing once its tables are built.
func TestRunIDTable(t *testing.T) {
	ep := bth.Endpoints{Src: addrA, Dst: addrB, SrcPort: 4791, DstPort: 4791}
	rx := new(rxState)
	r := rand.New(rand.NewSource(1))
	for _, n := range []int{bth.BTHSize + 4 + bth.ICRCSize, 1040, 4112, 4128, 700} {
		pkt := make([]byte, n)
		r.Read(pkt)
		for _, id := range []uint16{0, 1, 2, 7, 14, 15, 31, 62, 63, 64, 0xdf78} {
			e := ep
			e.IPID = id
			bth.SetICRC(pkt, bth.ICRC(&e, pkt))
			e.IPID = 0
			diff := bth.ICRC(&e, pkt) ^ bth.GetICRC(pkt)
			got := diff != 0 && rx.runID(&ep, n, diff)
			if want := id > 0 && id < 64; got != want {
				t.Fatalf("n %d ID %d: runID %v, want %v", n, id, got, want)
			}
			if sid, ok := bth.SolveIPv4ID(&ep, pkt); !ok || sid != id {
				t.Fatalf("n %d ID %d: SolveIPv4ID %d %v", n, id, sid, ok)
			}
			pkt[n/2] ^= 0x10 // corrupted: no run ID explains it
			diff = bth.ICRC(&e, pkt) ^ bth.GetICRC(pkt)
			if rx.runID(&ep, n, diff) {
				t.Fatalf("n %d ID %d: a corrupted packet passed", n, id)
			}
			pkt[n/2] ^= 0x10
		}
	}
	pkt := make([]byte, 4112)
	e := ep
	e.IPID = 9
	bth.SetICRC(pkt, bth.ICRC(&e, pkt))
	e.IPID = 0
	diff := bth.ICRC(&e, pkt) ^ bth.GetICRC(pkt)
	if a := testing.AllocsPerRun(100, func() {
		if !rx.runID(&ep, len(pkt), diff) {
			t.Fatal("ID 9 not found")
		}
	}); a != 0 {
		t.Fatalf("%v allocations per lookup", a)
	}
}

// countClock counts the Now calls of the clock it wraps.
type countClock struct {
	qp.Clock
	n atomic.Int64
}

func (c *countClock) Now() time.Time {
	c.n.Add(1)
	return c.Clock.Now()
}

// TestReceiveClockPerBatch: the receive loop reads the clock once per received batch, not once
// per packet (it was 7% of the receiver's CPU at 4 KiB packets).
func TestReceiveClockPerBatch(t *testing.T) {
	nw := mem.NewNetwork(mem.Options{QueueDepth: 4096, Full: mem.BlockWhenFull})
	la, err1 := nw.Attach(addrA)
	lb, err2 := nw.Attach(addrB)
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	da, err := Open(Options{Link: la})
	if err != nil {
		t.Fatal(err)
	}
	defer da.Close()
	clk := &countClock{Clock: qp.RealClock{}}
	db, err := Open(Options{Link: lb, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	a, b := newEnd(t, da, qp.TypeRC, 1<<20), newEnd(t, db, qp.TypeRC, 1<<20)
	connect(t, a, b, qp.MTU256, 1, 2)
	a.fill(0, 256<<10, 5)
	before := clk.n.Load()
	post(t, a, qp.SendWR{WRID: 1, Opcode: qp.WRRDMAWrite, SGL: []qp.SGE{a.sge(0, 256<<10)}, Flags: qp.SendSignaled,
		RemoteAddr: b.va(0), RKey: b.mr.RKey()})
	waitWC(t, a.scq, 1)
	same(t, "written", b.buf[:256<<10], a.buf[:256<<10])
	got := db.Stats().RcvdPkts
	calls := clk.n.Load() - before
	t.Logf("%d packets received, %d clock reads", got, calls)
	if got < 1024 || calls*4 > int64(got) {
		t.Fatalf("%d clock reads for %d packets: want about one per batch", calls, got)
	}
}
