package roce

import (
	"errors"
	"io"
	mrand "math/rand"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/mem"
)

// udPacket builds a UD SEND ONLY to dqpn with Q_Key qkey and its ICRC
// computed for the given IPv4 ID (kernel rxe sends non-zero, counting IDs).
func udPacket(src, dst netip.AddrPort, dqpn, qkey uint32, payload []byte, ipid uint16) []byte {
	b := make([]byte, bth.BTHSize+bth.DETHSize+len(payload)+bth.ICRCSize)
	bth.BTH(b).Encode(&bth.BTHFields{Opcode: bth.OpUDSendOnly, PKey: 0xFFFF, DestQP: dqpn, PSN: 5})
	bth.DETH(b[bth.BTHSize:]).Encode(&bth.DETHFields{QKey: qkey, SrcQP: 0x77})
	copy(b[bth.BTHSize+bth.DETHSize:], payload)
	ep := bth.Endpoints{Src: src.Addr(), Dst: dst.Addr(), SrcPort: src.Port(), DstPort: dst.Port(), IPID: ipid}
	bth.SetICRC(b, bth.ICRC(&ep, b))
	return b
}

// TestReceiveChecks: a packet whose ICRC covers a non-zero IPv4 ID is
// accepted through the solver and counted; a corrupted one, one for an
// unknown QPN, for QPN 0, or with a wrong Q_Key is dropped and counted.
func TestReceiveChecks(t *testing.T) {
	nw := mem.NewNetwork(mem.Options{})
	lb, err := nw.Attach(addrB)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := nw.Attach(netip.MustParseAddr("127.0.0.3"), netip.MustParseAddr("127.0.0.4"))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	db, err := Open(Options{Link: lb})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	e := newEnd(t, db, qp.TypeUD, 1<<20)
	udUp(t, e, 0x42)
	for i := 0; i < 4; i++ {
		postRecv(t, e, qp.RecvWR{WRID: uint64(i), SGL: []qp.SGE{e.sge(i*4096, 4096)}})
	}
	src := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.3"), 0xC123)
	dst := netip.AddrPortFrom(addrB, bth.UDPPort)
	send := func(b []byte, to netip.AddrPort) {
		t.Helper()
		if err := raw.Send([]link.Datagram{{Buf: b, Src: src, Dst: to}}); err != nil {
			t.Fatal(err)
		}
	}
	good := udPacket(src, dst, e.qp.Num(), 0x42, []byte("kernel rxe"), 0xdf78)
	send(good, dst)
	checkWC(t, waitWC(t, e.rcq, 1)[0], cq.WC{WRID: 0, Opcode: cq.OpRecv, ByteLen: 50, Flags: cq.FlagGRH, SrcQP: 0x77})
	if s := db.Stats(); s.RcvdICRCSolved != 1 || s.RcvdPkts != 1 {
		t.Fatalf("solver not counted: %+v", s)
	}
	bad := append([]byte(nil), good...)
	bad[len(bad)-6] ^= 1
	send(bad, dst)                                                  // corrupted
	send(udPacket(src, dst, 0x5555, 0x42, []byte("x"), 0), dst)     // unknown QPN
	send(udPacket(src, dst, 0, 0x42, []byte("x"), 0), dst)          // QPN 0
	send(udPacket(src, dst, e.qp.Num(), 0x43, []byte("x"), 0), dst) // wrong Q_Key
	send(udPacket(src, dst, e.qp.Num(), 0x42, []byte("last, ID 0"), 0), dst)
	checkWC(t, waitWC(t, e.rcq, 1)[0], cq.WC{WRID: 1, Opcode: cq.OpRecv, ByteLen: 50, Flags: cq.FlagGRH, SrcQP: 0x77})
	if s := db.Stats(); s.RcvdDropped != 4 || s.RcvdICRCSolved != 1 || s.RcvdPkts != 3 {
		t.Fatalf("counters %+v", s)
	}
}

// TestIPv6 runs every RC operation and a UD exchange between two
// devices with IPv6 GIDs (full ICRC check, IPv6 GRH).
func TestIPv6(t *testing.T) {
	nw := mem.NewNetwork(mem.Options{QueueDepth: 4096})
	a6, b6 := netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
	la, err1 := nw.Attach(a6)
	lb, err2 := nw.Attach(b6)
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	da, err1 := Open(Options{Link: la})
	db, err2 := Open(Options{Link: lb})
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	defer da.Close()
	defer db.Close()
	a, b := newEnd(t, da, qp.TypeRC, 4<<20), newEnd(t, db, qp.TypeRC, 4<<20)
	connect(t, a, b, qp.MTU1024, 7, 8)
	ops(t, a, b, 10_000)
	ua, ub := newEnd(t, da, qp.TypeUD, 1<<20), newEnd(t, db, qp.TypeUD, 1<<20)
	udUp(t, ua, 9)
	udUp(t, ub, 9)
	ah, err := da.CreateAH(ua.pd, qp.AHAttr{DGID: b6, SGIDIndex: 1})
	if err != nil {
		t.Fatal(err)
	}
	postRecv(t, ub, qp.RecvWR{WRID: 1, SGL: []qp.SGE{ub.sge(0, 200)}})
	post(t, ua, qp.SendWR{WRID: 2, Opcode: qp.WRSend, SGL: []qp.SGE{ua.sge(0, 100)}, AH: ah, RemoteQPN: ub.qp.Num(), RemoteQKey: 9})
	checkWC(t, waitWC(t, ub.rcq, 1)[0], cq.WC{WRID: 1, Opcode: cq.OpRecv, ByteLen: 140, Flags: cq.FlagGRH, SrcQP: ua.qp.Num()})
	if ub.buf[0]>>4 != 6 || netip.AddrFrom16([16]byte(ub.buf[8:24])) != a6 || netip.AddrFrom16([16]byte(ub.buf[24:40])) != b6 {
		t.Fatalf("IPv6 GRH % x", ub.buf[:40])
	}
	if s := db.Stats(); s.RcvdICRCSolved != 0 || s.RcvdDropped != 0 {
		t.Fatalf("counters %+v", s)
	}
}

// zeros is a QPNRand that makes QP numbers count up from FirstQPN (rxe's order).
type zeros struct{}

func (zeros) Read(b []byte) (int, error) { clear(b); return len(b), nil }

// TestObjectsAndClose: QPNs from 0x11 with a QPNRand of zeros, errors after Close, limits.
func TestObjectsAndClose(t *testing.T) {
	nw := mem.NewNetwork(mem.Options{})
	l, err := nw.Attach(addrA)
	if err != nil {
		t.Fatal(err)
	}
	clk := qp.NewManualClock(time.Unix(0, 0))
	d, err := Open(Options{Link: l, Clock: clk, QPNRand: zeros{}})
	if err != nil {
		t.Fatal(err)
	}
	e1 := newEnd(t, d, qp.TypeRC, 4096)
	e2 := newEnd(t, d, qp.TypeUC, 4096)
	if e1.qp.Num() != FirstQPN || e2.qp.Num() != FirstQPN+1 {
		t.Fatalf("QPNs %#x %#x", e1.qp.Num(), e2.qp.Num())
	}
	if _, err := d.CreateQP(QPInit{Type: qp.TypeRC, PD: e1.pd, SendCQ: e1.scq, RecvCQ: e1.rcq,
		Cap: qp.Cap{MaxSendSGE: 1000}}); !errors.Is(err, ErrLimit) {
		t.Fatalf("oversized cap: %v", err)
	}
	if _, err := d.CreateAH(e1.pd, qp.AHAttr{DGID: addrB, SGIDIndex: 3}); !errors.Is(err, ErrBadGIDIndex) {
		t.Fatalf("bad GID index: %v", err)
	}
	// rxe's layout: 0 = link-local (cannot carry RoCEv2 to an IPv4 peer), 1 = ::ffff:127.0.0.1
	if g := d.GIDs(); len(g) != 2 || !g[0].IsLinkLocalUnicast() || g[1] != addrA || d.GIDIndex(addrA) != 1 {
		t.Fatalf("GID table %v", g)
	}
	if _, err := d.CreateAH(e1.pd, qp.AHAttr{DGID: addrB, SGIDIndex: 0}); err == nil {
		t.Fatal("AH from the link-local GID to an IPv4 peer accepted")
	}
	if err := e2.qp.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := e2.qp.Destroy(); err == nil {
		t.Fatal("double destroy accepted")
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.AllocPD(); !errors.Is(err, ErrClosed) {
		t.Fatalf("AllocPD after Close: %v", err)
	}
	if clk.Pending() != 0 {
		t.Fatalf("%d timers armed after Close", clk.Pending())
	}
}

// TestQPNRandom: QP numbers are drawn at random from the 24-bit space (a sender off the path
// must guess one to inject into a QP): unique among live QPs, never below FirstQPN nor the
// multicast 0xFFFFFF, not one after another, each found by the receive path's table; with a
// small table (MaxQP 16) slots are shared by QPN & mask, so creating and destroying many QPs
// still gives every live QP its own number and slot. The same QPNRand gives the same numbers.
// Before, numbers counted up from 0x11.
func TestQPNRandom(t *testing.T) {
	open := func(r io.Reader, maxQP int) *Device {
		nw := mem.NewNetwork(mem.Options{})
		l, err := nw.Attach(addrA)
		if err != nil {
			t.Fatal(err)
		}
		attr := qp.DefaultDeviceAttr()
		if maxQP > 0 {
			attr.MaxQP = maxQP
		}
		d, err := Open(Options{Link: l, Clock: qp.NewManualClock(time.Unix(0, 0)), QPNRand: r, Attr: &attr})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	d := open(nil, 0)
	e := newEnd(t, d, qp.TypeRC, 4096)
	seen := map[uint32]bool{e.qp.Num(): true}
	consecutive := 0
	prev := e.qp.Num()
	for i := 0; i < 200; i++ {
		q, err := d.CreateQP(QPInit{Type: qp.TypeUC, PD: e.pd, SendCQ: e.scq, RecvCQ: e.rcq, Cap: qp.Cap{MaxSendWR: 1, MaxRecvWR: 1}})
		if err != nil {
			t.Fatal(err)
		}
		n := q.Num()
		if n < FirstQPN || n >= bth.PSNMask || seen[n] || d.lookup(n) != q {
			t.Fatalf("QPN %#x: below %#x, multicast, repeated or not found (lookup %v)", n, FirstQPN, d.lookup(n) != q)
		}
		if n == prev+1 {
			consecutive++
		}
		seen[n], prev = true, n
	}
	if consecutive > 2 {
		t.Fatalf("%d of 200 QP numbers followed the previous one: not random", consecutive)
	}

	// a small table: 32 slots for MaxQP 16; churn keeps numbers and slots unique
	small := open(nil, 16)
	es := newEnd(t, small, qp.TypeRC, 4096)
	live := map[uint32]*QP{es.qp.Num(): es.qp}
	for i := 0; i < 300; i++ {
		if len(live) == 16 {
			for n, q := range live {
				if q == es.qp {
					continue
				}
				if err := q.Destroy(); err != nil {
					t.Fatal(err)
				}
				delete(live, n)
				break
			}
		}
		q, err := small.CreateQP(QPInit{Type: qp.TypeUC, PD: es.pd, SendCQ: es.scq, RecvCQ: es.rcq, Cap: qp.Cap{MaxSendWR: 1, MaxRecvWR: 1}})
		if err != nil {
			t.Fatalf("QP %d with %d live: %v", i, len(live), err)
		}
		if live[q.Num()] != nil {
			t.Fatalf("QPN %#x handed out twice", q.Num())
		}
		live[q.Num()] = q
		slots := map[uint32]bool{}
		for n, q := range live {
			if slots[n&small.qpMask] || small.lookup(n) != q {
				t.Fatalf("QPN %#x: slot shared or not found", n)
			}
			slots[n&small.qpMask] = true
		}
	}

	// deterministic with the same source
	nums := func() []uint32 {
		d := open(mrand.New(mrand.NewSource(7)), 0)
		e := newEnd(t, d, qp.TypeRC, 4096)
		out := []uint32{e.qp.Num()}
		for i := 0; i < 5; i++ {
			q, err := d.CreateQP(QPInit{Type: qp.TypeUC, PD: e.pd, SendCQ: e.scq, RecvCQ: e.rcq, Cap: qp.Cap{MaxSendWR: 1, MaxRecvWR: 1}})
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, q.Num())
		}
		return out
	}
	if a, b := nums(), nums(); !slices.Equal(a, b) {
		t.Fatalf("the same QPNRand gave %x and %x", a, b)
	}
}
