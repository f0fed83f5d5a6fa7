package roce

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/link/udp"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	addrA = netip.MustParseAddr("127.0.0.1")
	addrB = netip.MustParseAddr("127.0.0.2")
)

// dropLink is a link decorator: drop decides per sent datagram.
type dropLink struct {
	link.Link
	mu   sync.Mutex
	drop func(p *bth.Packet) bool
	tmp  []link.Datagram
}

func (l *dropLink) Send(batch []link.Datagram) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.drop == nil {
		return l.Link.Send(batch)
	}
	l.tmp = l.tmp[:0]
	for _, d := range batch {
		p, err := bth.Parse(d.Buf)
		if err == nil && l.drop(&p) {
			continue
		}
		l.tmp = append(l.tmp, d)
	}
	if len(l.tmp) == 0 {
		return nil
	}
	return l.Link.Send(l.tmp)
}

func (l *dropLink) setDrop(f func(p *bth.Packet) bool) {
	l.mu.Lock()
	l.drop = f
	l.mu.Unlock()
}

// hbLink tells the race detector what the kernel guarantees: a datagram's
// send happens before its receive (the detector cannot see through
// sockets; stdUDP does this itself).
type hbLink struct{ link.Link }

func (l hbLink) Send(b []link.Datagram) error {
	wire.Add(1)
	return l.Link.Send(b)
}

func (l hbLink) Recv(b []link.Datagram) (int, error) {
	n, err := l.Link.Recv(b)
	wire.Load()
	return n, err
}

// devPair opens two devices, on the in-memory network or on UDP loopback
// (127.0.0.1 and 127.0.0.2, port 4791 or, if busy, a free one both
// addresses can bind) with udp.Listen ("udp") or the portable sockets
// ("stdudp"). The first device's link is wrapped in a dropLink.
func devPair(t *testing.T, kind string) (*Device, *Device, *dropLink) {
	t.Helper()
	var la, lb link.Link
	var port uint16
	switch kind {
	case "mem":
		nw := mem.NewNetwork(mem.Options{QueueDepth: 8192})
		var err error
		if la, err = nw.Attach(addrA); err != nil {
			t.Fatal(err)
		}
		if lb, err = nw.Attach(addrB); err != nil {
			t.Fatal(err)
		}
	case "udp", "stdudp":
		listen := func(a netip.Addr, port uint16) (link.Link, error) {
			if kind == "stdudp" {
				return listenStdUDP([]netip.Addr{a}, port)
			}
			return listenUDP(a, port)
		}
		la, lb, port = listenPair(t, true, addrA, addrB, listen)
	}
	if kind == "udp" {
		la, lb = hbLink{la}, hbLink{lb}
	}
	dl := &dropLink{Link: la}
	a, err := Open(Options{Link: dl, Port: port, Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open(Options{Link: lb, Port: port, Name: "b"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.Close()
		b.Close()
	})
	return a, b, dl
}

type end struct {
	dev      *Device
	pd       *mr.PD
	scq, rcq *cq.CQ
	qp       *QP
	buf      []byte
	mr       *mr.MR
	addr     netip.Addr
}

func newEnd(t testing.TB, d *Device, typ qp.Type, size int) *end {
	t.Helper()
	e := &end{dev: d, addr: d.Addrs()[0]}
	var err error
	if e.pd, err = d.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if e.scq, err = d.CreateCQ(4096); err != nil {
		t.Fatal(err)
	}
	if e.rcq, err = d.CreateCQ(4096); err != nil {
		t.Fatal(err)
	}
	e.buf = make([]byte, size)
	if e.mr, err = d.RegMR(e.pd, e.buf, 0x7000_0000, mr.AccessLocalWrite|mr.AccessRemoteWrite|mr.AccessRemoteRead|mr.AccessRemoteAtomic); err != nil {
		t.Fatal(err)
	}
	if e.qp, err = d.CreateQP(QPInit{Type: typ, PD: e.pd, SendCQ: e.scq, RecvCQ: e.rcq,
		Cap: qp.Cap{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 8, MaxRecvSGE: 8, MaxInlineData: 64}}); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *end) va(off int) uint64 { return e.mr.IOVA() + uint64(off) }
func (e *end) sge(off, n int) qp.SGE {
	return qp.SGE{Addr: e.va(off), Length: uint32(n), LKey: e.mr.LKey()}
}
func (e *end) fill(off, n int, seed byte) {
	for i := 0; i < n; i++ {
		e.buf[off+i] = byte(i*13) ^ seed ^ byte(i>>9)
	}
}

// sgl splits [off, off+n) into k uneven SGEs.
func (e *end) sgl(off, n, k int) []qp.SGE {
	if n == 0 {
		return nil
	}
	if k > n {
		k = n
	}
	var out []qp.SGE
	for i := 0; i < k; i++ {
		l := n / (k - i)
		if i%2 == 0 && l > 1 && i != k-1 {
			l = l/2 + 1
		}
		if i == k-1 {
			l = n
		}
		out = append(out, e.sge(off, l))
		off += l
		n -= l
	}
	return out
}

func connect(t testing.TB, a, b *end, mtu qp.MTU, psnA, psnB uint32) {
	t.Helper()
	up := func(e, peer *end, rq, sq uint32) {
		all := mr.AccessRemoteWrite | mr.AccessRemoteRead | mr.AccessRemoteAtomic | mr.AccessLocalWrite
		steps := []struct {
			a qp.Attr
			m qp.AttrMask
		}{
			{qp.Attr{State: qp.StateInit, Port: 1, AccessFlags: all}, qp.AttrState | qp.AttrPKeyIndex | qp.AttrPort | qp.AttrAccessFlags},
			{qp.Attr{State: qp.StateRTR, AH: qp.AHAttr{DGID: peer.addr, SGIDIndex: uint8(e.dev.GIDIndex(e.addr)), Port: 1}, PathMTU: mtu,
				DestQPN: peer.qp.Num(), RQPSN: rq, MaxDestRDAtomic: 16, MinRNRTimer: 1},
				qp.AttrState | qp.AttrAV | qp.AttrPathMTU | qp.AttrDestQPN | qp.AttrRQPSN},
			{qp.Attr{State: qp.StateRTS, SQPSN: sq, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRDAtomic: 16},
				qp.AttrState | qp.AttrSQPSN},
		}
		if e.qp.Type() == qp.TypeRC {
			steps[1].m |= qp.AttrMaxDestRDAtomic | qp.AttrMinRNRTimer
			steps[2].m |= qp.AttrTimeout | qp.AttrRetryCnt | qp.AttrRNRRetry | qp.AttrMaxQPRDAtomic
		}
		for _, s := range steps {
			if err := e.qp.Modify(&s.a, s.m); err != nil {
				t.Fatal(err)
			}
		}
	}
	up(a, b, psnB, psnA)
	up(b, a, psnA, psnB)
}

// waitWC waits (bounded) for n completions on c.
func waitWC(t *testing.T, c *cq.CQ, n int) []cq.WC {
	t.Helper()
	out := make([]cq.WC, 0, n)
	buf := make([]cq.WC, 16)
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	for len(out) < n {
		k := c.Poll(buf[:min(len(buf), n-len(out))])
		out = append(out, buf[:k]...)
		if len(out) >= n {
			break
		}
		if err := c.ReqNotify(false); err != nil {
			t.Fatal(err)
		}
		k = c.Poll(buf[:min(len(buf), n-len(out))])
		out = append(out, buf[:k]...)
		if k > 0 {
			continue
		}
		select {
		case <-c.Channel():
		case <-deadline.C:
			t.Fatalf("timeout: %d of %d completions: %+v", len(out), n, out)
		}
	}
	return out
}

func checkWC(t *testing.T, g cq.WC, w cq.WC) {
	t.Helper()
	if g.WRID != w.WRID || g.Status != w.Status || g.Opcode != w.Opcode || g.ByteLen != w.ByteLen ||
		g.ImmData != w.ImmData || g.Flags != w.Flags || (w.SrcQP != 0 && g.SrcQP != w.SrcQP) {
		t.Fatalf("completion %+v, want %+v", g, w)
	}
}

func post(t *testing.T, e *end, wrs ...qp.SendWR) {
	t.Helper()
	if _, err := e.qp.PostSend(wrs); err != nil {
		t.Fatal(err)
	}
}

func postRecv(t *testing.T, e *end, wrs ...qp.RecvWR) {
	t.Helper()
	if _, err := e.qp.PostRecv(wrs); err != nil {
		t.Fatal(err)
	}
}

func same(t *testing.T, what string, a, b []byte) {
	t.Helper()
	if !bytes.Equal(a, b) {
		i := 0
		for i < len(a) && a[i] == b[i] {
			i++
		}
		t.Fatalf("%s: differs at byte %d of %d", what, i, len(a))
	}
}

const dst = 2 << 20

// ops runs SEND, SEND_WITH_IMM, WRITE, WRITE_WITH_IMM, READ, CMP_SWP and
// FETCH_ADD of size bytes from a to b and checks data and completions.
func ops(t *testing.T, a, b *end, size int) {
	t.Helper()
	seed := byte(size * 3)
	for i, op := range []qp.WROpcode{qp.WRSend, qp.WRSendWithImm} {
		a.fill(0, size, seed+byte(i))
		clear(b.buf[dst : dst+size+8])
		postRecv(t, b, qp.RecvWR{WRID: 7, SGL: b.sgl(dst, size+8, 3)})
		post(t, a, qp.SendWR{WRID: 1, Opcode: op, SGL: a.sgl(0, size, 4), Flags: qp.SendSignaled, Imm: 0xDEADBEEF})
		checkWC(t, waitWC(t, a.scq, 1)[0], cq.WC{WRID: 1, Opcode: cq.OpSend, ByteLen: uint32(size)})
		want := cq.WC{WRID: 7, Opcode: cq.OpRecv, ByteLen: uint32(size)}
		if op == qp.WRSendWithImm {
			want.ImmData, want.Flags = 0xDEADBEEF, cq.FlagWithImm
		}
		checkWC(t, waitWC(t, b.rcq, 1)[0], want)
		same(t, op.String(), b.buf[dst:dst+size], a.buf[:size])
	}
	for i, op := range []qp.WROpcode{qp.WRRDMAWrite, qp.WRRDMAWriteWithImm} {
		a.fill(0, size, seed+byte(5+i))
		clear(b.buf[dst : dst+size])
		if op == qp.WRRDMAWriteWithImm {
			postRecv(t, b, qp.RecvWR{WRID: 8})
		}
		post(t, a, qp.SendWR{WRID: 2, Opcode: op, SGL: a.sgl(0, size, 3), Flags: qp.SendSignaled, Imm: 99,
			RemoteAddr: b.va(dst), RKey: b.mr.RKey()})
		checkWC(t, waitWC(t, a.scq, 1)[0], cq.WC{WRID: 2, Opcode: cq.OpRDMAWrite, ByteLen: uint32(size)})
		if op == qp.WRRDMAWriteWithImm {
			checkWC(t, waitWC(t, b.rcq, 1)[0], cq.WC{WRID: 8, Opcode: cq.OpRecvRDMAWithImm, ByteLen: uint32(size), ImmData: 99, Flags: cq.FlagWithImm})
		}
		same(t, op.String(), b.buf[dst:dst+size], a.buf[:size])
	}
	b.fill(dst, size, seed+9)
	clear(a.buf[:size])
	post(t, a, qp.SendWR{WRID: 3, Opcode: qp.WRRDMARead, SGL: a.sgl(0, size, 5), Flags: qp.SendSignaled,
		RemoteAddr: b.va(dst), RKey: b.mr.RKey()})
	checkWC(t, waitWC(t, a.scq, 1)[0], cq.WC{WRID: 3, Opcode: cq.OpRDMARead, ByteLen: uint32(size)})
	same(t, "READ", a.buf[:size], b.buf[dst:dst+size])

	const word = 64
	binary.LittleEndian.PutUint64(b.buf[word:], 40)
	post(t, a,
		qp.SendWR{WRID: 4, Opcode: qp.WRAtomicFetchAndAdd, SGL: []qp.SGE{a.sge(8, 8)}, Flags: qp.SendSignaled,
			RemoteAddr: b.va(word), RKey: b.mr.RKey(), CompareAdd: 2},
		qp.SendWR{WRID: 5, Opcode: qp.WRAtomicCmpAndSwp, SGL: []qp.SGE{a.sge(16, 8)}, Flags: qp.SendSignaled,
			RemoteAddr: b.va(word), RKey: b.mr.RKey(), CompareAdd: 42, Swap: 7})
	w := waitWC(t, a.scq, 2)
	checkWC(t, w[0], cq.WC{WRID: 4, Opcode: cq.OpFetchAdd, ByteLen: 8})
	checkWC(t, w[1], cq.WC{WRID: 5, Opcode: cq.OpCompSwap, ByteLen: 8})
	if x, y, z := binary.LittleEndian.Uint64(a.buf[8:]), binary.LittleEndian.Uint64(a.buf[16:]), binary.LittleEndian.Uint64(b.buf[word:]); x != 40 || y != 42 || z != 7 {
		t.Fatalf("atomics: fetch_add %d cmp_swp %d word %d", x, y, z)
	}
}

// suiteLinks are the links TestSuite runs on: the in-memory network,
// udp.Listen (sendmmsg/recvmmsg) and the portable sockets.
var suiteLinks = []string{"mem", "udp", "stdudp"}

// TestSuite runs the same suite over the in-memory network and UDP
// loopback.
func TestSuite(t *testing.T) {
	for _, kind := range suiteLinks {
		t.Run(kind, func(t *testing.T) {
			da, db, dl := devPair(t, kind)
			t.Run("RC", func(t *testing.T) {
				for _, mtu := range []qp.MTU{qp.MTU256, qp.MTU1024, qp.MTU4096} {
					a, b := newEnd(t, da, qp.TypeRC, 4<<20), newEnd(t, db, qp.TypeRC, 4<<20)
					connect(t, a, b, mtu, 1000, 0xFFFFFF-5)
					m := mtu.Bytes()
					for _, size := range []int{0, 1, m - 1, m, m + 1, 5*m + 3, 1 << 20} {
						t.Run(fmt.Sprintf("mtu%d/size%d", m, size), func(t *testing.T) { ops(t, a, b, size) })
					}
					a.qp.Destroy()
					b.qp.Destroy()
				}
			})
			t.Run("PSNWrap", func(t *testing.T) {
				a, b := newEnd(t, da, qp.TypeRC, 4<<20), newEnd(t, db, qp.TypeRC, 4<<20)
				connect(t, a, b, qp.MTU256, 0xFFFFF8, 0xFFFFFD)
				for i := 0; i < 3; i++ {
					ops(t, a, b, 256*20+1)
				}
			})
			t.Run("SendWithInv", func(t *testing.T) { sendWithInv(t, da, db) })
			t.Run("UD", func(t *testing.T) { udSuite(t, da, db) })
			t.Run("UCLoss", func(t *testing.T) { ucLoss(t, da, db, dl) })
			t.Run("RCLoss", func(t *testing.T) { rcLoss(t, da, db, dl) })
			s := da.Stats()
			if s.SentPkts == 0 || s.RcvdPkts == 0 || s.RDMASends == 0 {
				t.Fatalf("counters not counting: %+v", s)
			}
			if m := s.Map(); m["sent_pkts"] != s.SentPkts {
				t.Fatal("Map")
			}
		})
	}
}

func udUp(t *testing.T, e *end, qkey uint32) {
	t.Helper()
	for _, s := range []struct {
		a qp.Attr
		m qp.AttrMask
	}{
		{qp.Attr{State: qp.StateInit, Port: 1, QKey: qkey}, qp.AttrState | qp.AttrPKeyIndex | qp.AttrPort | qp.AttrQKey},
		{qp.Attr{State: qp.StateRTR}, qp.AttrState},
		{qp.Attr{State: qp.StateRTS, SQPSN: 1}, qp.AttrState | qp.AttrSQPSN},
	} {
		if err := e.qp.Modify(&s.a, s.m); err != nil {
			t.Fatal(err)
		}
	}
}

// udSuite: one UD QP on device a talks to two on device b through two
// AHs; a wrong Q_Key is dropped; the GRH heads the receive buffer.
func udSuite(t *testing.T, da, db *Device) {
	a := newEnd(t, da, qp.TypeUD, 1<<20)
	b1 := newEnd(t, db, qp.TypeUD, 1<<20)
	b2 := newEnd(t, db, qp.TypeUD, 1<<20)
	udUp(t, a, 0x11)
	udUp(t, b1, 0x11)
	udUp(t, b2, 0x22)
	ah, err := da.CreateAH(a.pd, qp.AHAttr{DGID: addrB, SGIDIndex: 1, Port: 1})
	if err != nil {
		t.Fatal(err)
	}
	dropped := da.Stats().RcvdDropped + db.Stats().RcvdDropped
	for _, e := range []*end{b1, b2} {
		postRecv(t, e, qp.RecvWR{WRID: 1, SGL: []qp.SGE{e.sge(0, 4096+40)}}, qp.RecvWR{WRID: 2, SGL: []qp.SGE{e.sge(8192, 4096+40)}})
	}
	a.fill(0, 4096, 1)
	post(t, a,
		qp.SendWR{WRID: 1, Opcode: qp.WRSend, SGL: []qp.SGE{a.sge(0, 1000)}, AH: ah, RemoteQPN: b1.qp.Num(), RemoteQKey: 0x80000000},
		qp.SendWR{WRID: 2, Opcode: qp.WRSend, SGL: []qp.SGE{a.sge(0, 10)}, AH: ah, RemoteQPN: b2.qp.Num(), RemoteQKey: 0x11}, // wrong Q_Key
		qp.SendWR{WRID: 3, Opcode: qp.WRSendWithImm, SGL: []qp.SGE{a.sge(0, 4096)}, Flags: qp.SendSignaled, Imm: 3, AH: ah, RemoteQPN: b2.qp.Num(), RemoteQKey: 0x22})
	checkWC(t, waitWC(t, a.scq, 1)[0], cq.WC{WRID: 3, Opcode: cq.OpSend, ByteLen: 4096})
	checkWC(t, waitWC(t, b1.rcq, 1)[0], cq.WC{WRID: 1, Opcode: cq.OpRecv, ByteLen: 1040, Flags: cq.FlagGRH, SrcQP: a.qp.Num()})
	checkWC(t, waitWC(t, b2.rcq, 1)[0], cq.WC{WRID: 1, Opcode: cq.OpRecv, ByteLen: 4136, Flags: cq.FlagGRH | cq.FlagWithImm, ImmData: 3, SrcQP: a.qp.Num()})
	same(t, "ud", b1.buf[40:1040], a.buf[:1000])
	same(t, "ud imm", b2.buf[40:4136], a.buf[:4096])
	if got := netip.AddrFrom4([4]byte(b1.buf[32:36])); got != addrA {
		t.Fatalf("GRH source %v", got)
	}
	// the wrong-Q_Key datagram was dropped: b2's second WQE is still there
	if b2.rcq.Poll(make([]cq.WC, 4)) != 0 {
		t.Fatal("unexpected completion")
	}
	if d := da.Stats().RcvdDropped + db.Stats().RcvdDropped; d == dropped {
		t.Fatal("wrong Q_Key not counted as dropped")
	}
	// reply
	back, err := db.CreateAH(b1.pd, qp.AHAttr{DGID: addrA, SGIDIndex: 1, Port: 1})
	if err != nil {
		t.Fatal(err)
	}
	postRecv(t, a, qp.RecvWR{WRID: 9, SGL: []qp.SGE{a.sge(65536, 200)}})
	post(t, b1, qp.SendWR{WRID: 4, Opcode: qp.WRSend, SGL: []qp.SGE{b1.sge(40, 100)}, AH: back, RemoteQPN: a.qp.Num(), RemoteQKey: 0x11})
	checkWC(t, waitWC(t, a.rcq, 1)[0], cq.WC{WRID: 9, Opcode: cq.OpRecv, ByteLen: 140, Flags: cq.FlagGRH, SrcQP: b1.qp.Num()})
}

// ucLoss: a UC SEND whose middle packet the link decorator drops is lost;
// the next message arrives in the same receive WQE.
func ucLoss(t *testing.T, da, db *Device, dl *dropLink) {
	a, b := newEnd(t, da, qp.TypeUC, 4<<20), newEnd(t, db, qp.TypeUC, 4<<20)
	connect(t, a, b, qp.MTU1024, 5, 6)
	var n int
	dl.setDrop(func(p *bth.Packet) bool {
		if p.BTH.Opcode() == bth.OpUCSendMiddle {
			n++
			return n == 1
		}
		return false
	})
	defer dl.setDrop(nil)
	a.fill(0, 8192, 4)
	postRecv(t, b, qp.RecvWR{WRID: 1, SGL: []qp.SGE{b.sge(dst, 8192)}}, qp.RecvWR{WRID: 2, SGL: []qp.SGE{b.sge(dst+8192, 8192)}})
	post(t, a, qp.SendWR{WRID: 1, Opcode: qp.WRSend, SGL: []qp.SGE{a.sge(0, 4000)}, Flags: qp.SendSignaled},
		qp.SendWR{WRID: 2, Opcode: qp.WRSend, SGL: []qp.SGE{a.sge(4000, 3000)}, Flags: qp.SendSignaled})
	w := waitWC(t, a.scq, 2)
	checkWC(t, w[0], cq.WC{WRID: 1, Opcode: cq.OpSend, ByteLen: 4000})
	checkWC(t, w[1], cq.WC{WRID: 2, Opcode: cq.OpSend, ByteLen: 3000})
	checkWC(t, waitWC(t, b.rcq, 1)[0], cq.WC{WRID: 1, Opcode: cq.OpRecv, ByteLen: 3000})
	same(t, "uc", b.buf[dst:dst+3000], a.buf[4000:7000])
}

// rcLoss: the link decorator drops one middle packet (recovered by the
// PSN-sequence NAK) and then one last packet (recovered by the ACK
// timeout) of RC WRITEs; the data arrives intact.
func rcLoss(t *testing.T, da, db *Device, dl *dropLink) {
	a, b := newEnd(t, da, qp.TypeRC, 4<<20), newEnd(t, db, qp.TypeRC, 4<<20)
	connect(t, a, b, qp.MTU1024, 50, 60)
	before := da.Stats()
	for i, victim := range []bth.Opcode{bth.OpRCWriteMiddle, bth.OpRCWriteLast} {
		var n int
		dl.setDrop(func(p *bth.Packet) bool {
			if p.BTH.Opcode() == victim {
				n++
				return n == 2
			}
			return false
		})
		a.fill(0, 100_000, byte(i))
		post(t, a, qp.SendWR{WRID: 1, Opcode: qp.WRRDMAWrite, SGL: a.sgl(0, 100_000, 2), Flags: qp.SendSignaled,
			RemoteAddr: b.va(dst), RKey: b.mr.RKey()},
			qp.SendWR{WRID: 2, Opcode: qp.WRRDMAWrite, SGL: a.sgl(0, 100_000, 2), Flags: qp.SendSignaled,
				RemoteAddr: b.va(dst + 200_000), RKey: b.mr.RKey()})
		w := waitWC(t, a.scq, 2)
		checkWC(t, w[0], cq.WC{WRID: 1, Opcode: cq.OpRDMAWrite, ByteLen: 100_000})
		checkWC(t, w[1], cq.WC{WRID: 2, Opcode: cq.OpRDMAWrite, ByteLen: 100_000})
		same(t, "write 1", b.buf[dst:dst+100_000], a.buf[:100_000])
		same(t, "write 2", b.buf[dst+200_000:dst+300_000], a.buf[:100_000])
		dl.setDrop(nil)
	}
	after := da.Stats()
	if after.RcvdSeqErr == before.RcvdSeqErr || after.CompleterRetryErr == before.CompleterRetryErr {
		t.Fatalf("no recovery counted: before %+v after %+v", before, after)
	}
}

// freePortPair finds a UDP port both ends of a test pair can bind: open(port) binds both ends
// (releasing the first if the second fails). It tries 4791 first when from4791 is set, then
// random ports in 20000..59999, 21 tries in all.
func freePortPair(tb testing.TB, from4791 bool, open func(port uint16) error) uint16 {
	tb.Helper()
	var err error
	for try := 0; try <= 20; try++ {
		port := uint16(20000 + rand.Intn(40000))
		if from4791 && try == 0 {
			port = bth.UDPPort
		}
		if err = open(port); err == nil {
			return port
		}
	}
	tb.Fatalf("no free UDP port: %v", err)
	return 0
}

// listenPair opens two links, on a and on b, with one port (freePortPair).
func listenPair[L link.Link](tb testing.TB, from4791 bool, a, b netip.Addr, listen func(netip.Addr, uint16) (L, error)) (la, lb L, port uint16) {
	tb.Helper()
	port = freePortPair(tb, from4791, func(p uint16) error {
		var err error
		if la, err = listen(a, p); err != nil {
			return err
		}
		if lb, err = listen(b, p); err != nil {
			la.Close()
		}
		return err
	})
	return la, lb, port
}

// listenUDP is udp.Listen on one address and port (listenPair's usual listen).
func listenUDP(a netip.Addr, port uint16) (*udp.Link, error) {
	return udp.Listen(udp.Options{Addrs: []netip.Addr{a}, Port: port})
}
