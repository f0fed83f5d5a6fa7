package roce

import (
	"fmt"
	"net"
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
	"golang.org/x/sys/unix"
)

// classLink records the traffic class of every datagram sent through it, per opcode.
type classLink struct {
	link.Link
	mu   sync.Mutex
	seen map[string]map[uint8]int
}

func (l *classLink) Send(batch []link.Datagram) error {
	l.mu.Lock()
	for _, d := range batch {
		if p, err := bth.Parse(d.Buf); err == nil {
			op := p.BTH.Opcode().String()
			if l.seen[op] == nil {
				l.seen[op] = map[uint8]int{}
			}
			l.seen[op][d.TClass]++
		}
	}
	l.mu.Unlock()
	return l.Link.Send(batch)
}

func (l *classLink) classes() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return fmt.Sprint(l.seen)
}

// TestTrafficClassFromAH: an RC QP's packets carry its address vector's traffic class
// (AHAttr.TrafficClass -> qp.Path.TClass -> link.Datagram.TClass, the IP TOS byte; IBTA
// A17.4.5, rxe: grh.traffic_class), each side its own: requests from one end, ACKs and READ
// responses from the other. Requests and ACKs are ECN-capable, ECT(0) in the low bits, unless
// the device's ecn parameter is off (docs/congestion.md); READ responses keep the byte.
func TestTrafficClassFromAH(t *testing.T) {
	for _, ecn := range []bool{true, false} {
		t.Run(map[bool]string{true: "ecn", false: "no-ecn"}[ecn], func(t *testing.T) { trafficClassFromAH(t, ecn) })
	}
}

func trafficClassFromAH(t *testing.T, ecn bool) {
	nw := mem.NewNetwork(mem.Options{QueueDepth: 1024})
	la, err := nw.Attach(addrA)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := nw.Attach(addrB)
	if err != nil {
		t.Fatal(err)
	}
	ca, cb := &classLink{Link: la, seen: map[string]map[uint8]int{}}, &classLink{Link: lb, seen: map[string]map[uint8]int{}}
	cfg := DefaultCC()
	cfg.ECN = ecn
	da, err := Open(Options{Link: ca, Name: "a", CC: &cfg})
	if err != nil {
		t.Fatal(err)
	}
	defer da.Close()
	db, err := Open(Options{Link: cb, Name: "b", CC: &cfg})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	a, b := newEnd(t, da, qp.TypeRC, 4<<20), newEnd(t, db, qp.TypeRC, 4<<20)
	all := mr.AccessRemoteWrite | mr.AccessRemoteRead | mr.AccessLocalWrite
	// The counts below are of first transmissions: the ACK timeout (code 20, 4.3 s) is long
	// enough that a stalled goroutine on a loaded machine does not make the requester resend.
	up := func(e, peer *end, tc uint8) {
		for _, s := range []struct {
			a qp.Attr
			m qp.AttrMask
		}{
			{qp.Attr{State: qp.StateInit, Port: 1, AccessFlags: all}, qp.AttrState | qp.AttrPKeyIndex | qp.AttrPort | qp.AttrAccessFlags},
			{qp.Attr{State: qp.StateRTR, AH: qp.AHAttr{DGID: peer.addr, SGIDIndex: 1, Port: 1, TrafficClass: tc, HopLimit: 64},
				PathMTU: qp.MTU1024, DestQPN: peer.qp.Num(), RQPSN: 1, MaxDestRDAtomic: 4, MinRNRTimer: 1},
				qp.AttrState | qp.AttrAV | qp.AttrPathMTU | qp.AttrDestQPN | qp.AttrRQPSN | qp.AttrMaxDestRDAtomic | qp.AttrMinRNRTimer},
			{qp.Attr{State: qp.StateRTS, SQPSN: 1, Timeout: 20, RetryCnt: 7, RNRRetry: 7, MaxRDAtomic: 4},
				qp.AttrState | qp.AttrSQPSN | qp.AttrTimeout | qp.AttrRetryCnt | qp.AttrRNRRetry | qp.AttrMaxQPRDAtomic},
		} {
			if err := e.qp.Modify(&s.a, s.m); err != nil {
				t.Fatal(err)
			}
		}
	}
	up(a, b, 0x48)
	up(b, a, 0x20)
	a.fill(0, 5000, 1)
	post(t, a, qp.SendWR{WRID: 1, Opcode: qp.WRRDMAWrite, SGL: []qp.SGE{a.sge(0, 5000)}, Flags: qp.SendSignaled,
		RemoteAddr: b.va(dst), RKey: b.mr.RKey()},
		qp.SendWR{WRID: 2, Opcode: qp.WRRDMARead, SGL: []qp.SGE{a.sge(8192, 3000)}, Flags: qp.SendSignaled,
			RemoteAddr: b.va(dst), RKey: b.mr.RKey()})
	w := waitWC(t, a.scq, 2)
	checkWC(t, w[0], cq.WC{WRID: 1, Opcode: cq.OpRDMAWrite, ByteLen: 5000})
	checkWC(t, w[1], cq.WC{WRID: 2, Opcode: cq.OpRDMARead, ByteLen: 3000})
	wantA := "map[RC RDMA Read Request:map[72:1] RC RDMA Write First:map[72:1] RC RDMA Write Last:map[72:1] RC RDMA Write Middle:map[72:3]]"
	wantB := "map[RC Acknowledge:map[32:1] RC RDMA Read Response First:map[32:1] RC RDMA Read Response Last:map[32:1] RC RDMA Read Response Middle:map[32:1]]"
	if ecn { // 0x48 | ECT(0) = 74, 0x20 | ECT(0) = 34 (the ACK; READ responses keep 32)
		wantA = "map[RC RDMA Read Request:map[74:1] RC RDMA Write First:map[74:1] RC RDMA Write Last:map[74:1] RC RDMA Write Middle:map[74:3]]"
		wantB = "map[RC Acknowledge:map[34:1] RC RDMA Read Response First:map[32:1] RC RDMA Read Response Last:map[32:1] RC RDMA Read Response Middle:map[32:1]]"
	}
	if got := ca.classes(); got != wantA {
		t.Fatalf("a sent (opcode: class: count) %s, want %s", got, wantA)
	}
	if got := cb.classes(); got != wantB {
		t.Fatalf("b sent (opcode: class: count) %s, want %s", got, wantB)
	}
}

// TestTrafficClassUDRuns: UD sends through one burst to one destination over UDP with GSO runs
// (OpenUDP's default fast path), their AHs' traffic classes alternating: every datagram
// reaches the wire with its own AH's class (a run shares one IP header, so the engine starts a
// new run where the class changes). The receiver is a plain socket reading IP_TOS.
func TestTrafficClassUDRuns(t *testing.T) {
	var rx *net.UDPConn
	var d *Device
	for try := 0; ; try++ {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2)})
		if err != nil {
			t.Fatal(err)
		}
		port := uint16(c.LocalAddr().(*net.UDPAddr).Port)
		if d, err = OpenUDP(UDPOptions{Addrs: []netip.Addr{addrA}, Port: port}); err == nil {
			rx = c
			break
		}
		c.Close()
		if try == 20 {
			t.Fatal(err)
		}
	}
	defer rx.Close()
	defer d.Close()
	rc, err := rx.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVTOS, 1) }); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	e := newEnd(t, d, qp.TypeUD, 1<<20)
	udUp(t, e, 0x11)
	classes := []uint8{0x48, 0x48, 0x48, 0, 0, 0xB8, 0xB8, 0x48}
	ahs := map[uint8]*qp.AH{}
	var wrs []qp.SendWR
	for i, tc := range classes {
		if ahs[tc] == nil {
			if ahs[tc], err = d.CreateAH(e.pd, qp.AHAttr{DGID: addrB, SGIDIndex: 1, Port: 1, TrafficClass: tc}); err != nil {
				t.Fatal(err)
			}
		}
		e.buf[i*1024] = byte(i)
		wrs = append(wrs, qp.SendWR{WRID: uint64(i), Opcode: qp.WRSend, SGL: []qp.SGE{e.sge(i*1024, 1000)}, AH: ahs[tc],
			RemoteQPN: 0x99, RemoteQKey: 0x11})
	}
	post(t, e, wrs...)
	var got, want []string
	buf, oob := make([]byte, 2048), make([]byte, 64)
	for i, tc := range classes {
		rx.SetReadDeadline(time.Now().Add(5 * time.Second)) // bound on a lost datagram, not a sleep
		n, oobn, _, _, err := rx.ReadMsgUDPAddrPort(buf, oob)
		if err != nil {
			t.Fatalf("datagram %d: %v", i, err)
		}
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil || len(msgs) != 1 || msgs[0].Header.Type != unix.IP_TOS || n < bth.BTHSize+bth.DETHSize+1 {
			t.Fatalf("datagram %d: %d bytes, control %v %v", i, n, msgs, err)
		}
		got = append(got, fmt.Sprintf("%d:%#x", buf[bth.BTHSize+bth.DETHSize], msgs[0].Data[0]))
		want = append(want, fmt.Sprintf("%d:%#x", i, tc))
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("message:class on the wire %v, want %v", got, want)
	}
}
