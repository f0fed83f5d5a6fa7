package udp

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"golang.org/x/sys/unix"
)

// Addresses of the entropy tests: loopback addresses nothing else in the tree binds, so the
// entropy ports on them are free unless a program holds them on the wildcard address.
var (
	entA = netip.MustParseAddr("127.0.0.51")
	entB = netip.MustParseAddr("127.0.0.52")
)

// entropyPair is two links on entA and entB (main sockets on kernel-chosen ports).
func entropyPair(t *testing.T, o Options) (a, b *Link) {
	t.Helper()
	oa, ob := o, o
	oa.AnyPort, ob.AnyPort = true, true
	oa.Addrs, ob.Addrs = []netip.Addr{entA}, []netip.Addr{entB}
	return listenTB(t, oa), listenTB(t, ob)
}

// TestEntropySourcePortsIPv6: the same over ::1 (IPV6_V6ONLY and IPV6_PMTUDISC_DO on the
// send-only socket, GSO by default for IPv6): the receiver sees the entropy port and a valid ICRC.
func TestEntropySourcePortsIPv6(t *testing.T) {
	lo6 := netip.MustParseAddr("::1")
	a, err := Listen(Options{Addrs: []netip.Addr{lo6}, AnyPort: true, GRO: true})
	if err != nil {
		t.Skip("no IPv6 loopback:", err)
	}
	t.Cleanup(func() { a.Close() })
	b := listenTB(t, Options{Addrs: []netip.Addr{lo6}, AnyPort: true, GRO: true, Entropy: EntropyOptions{Off: true}})
	e := bth.SourcePort(0x81, 0x82)
	needPooled(t, a, lo6, e)
	src := netip.AddrPortFrom(lo6, a.SourcePort(lo6, e))
	var out []link.Datagram
	var ports []uint16
	for i := 0; i < 6; i++ {
		out = append(out, roceDatagram(src, b.LocalAddrPorts()[0], 0x82, i, 1024))
		ports = append(ports, e)
	}
	if err := a.Send(out); err != nil {
		t.Fatal(err)
	}
	checkArrived(t, recvN(t, b, len(out), 8), out, ports)
	if st := statsOf(a); st.GSOSends == 0 {
		t.Fatalf("stats %+v: the IPv6 entropy socket should have sent GSO messages", st)
	}
}

// needPooled asks for entropy's socket on a and skips the test if another program holds the
// port (the fallback has its own test, which provokes it).
func needPooled(t *testing.T, l *Link, at netip.Addr, entropy uint16) {
	t.Helper()
	if port, pooled := l.EntropySocket(at, entropy); !pooled {
		// Skip only if another program really holds the port: a free one must have been bound.
		c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(at, entropy)))
		if err == nil {
			c.Close()
			t.Fatalf("entropy port %d on %v is free but SourcePort falls back to %d", entropy, at, port)
		}
		t.Skipf("entropy port %d on %v is taken by another program (falls back to %d)", entropy, at, port)
	}
}

// roceDatagram builds a BTH+payload+ICRC datagram from src to dst whose ICRC covers those
// endpoints (IBTA A17.3.3, IPv4 ID 0).
func roceDatagram(src, dst netip.AddrPort, dqpn uint32, psn, size int) link.Datagram {
	pkt := make([]byte, bth.BTHSize+size+bth.ICRCSize)
	bth.BTH(pkt).Encode(&bth.BTHFields{Opcode: bth.OpRCSendOnly, PKey: 0xFFFF, DestQP: dqpn, PSN: bth.PSN(psn)})
	for k := bth.BTHSize; k < len(pkt)-bth.ICRCSize; k++ {
		pkt[k] = byte(k + psn)
	}
	ep := bth.Endpoints{Src: src.Addr(), Dst: dst.Addr(), SrcPort: src.Port(), DstPort: dst.Port()}
	bth.SetICRC(pkt, bth.ICRC(&ep, pkt))
	return link.Datagram{Buf: pkt, Src: src, Dst: dst}
}

// checkArrived verifies that got carries want's payloads, each flow's (source port's) in the
// order sent (flows may pass each other: the GRO ring hands a sparse flow's datagram out
// first, groring_linux.go), that each arrived with the UDP source port wantPort[i] (the real
// header, as the receiving socket reports it) and that its ICRC verifies over the endpoints it
// arrived with.
func checkArrived(t *testing.T, got, want []link.Datagram, wantPort []uint16) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d datagrams, want %d", len(got), len(want))
	}
	next := map[uint16]int{} // per port: how many of its datagrams arrived
	for i, g := range got {
		port := g.Src.Port()
		k, n := -1, next[port]
		for j := range want {
			if wantPort[j] == port {
				if n == 0 {
					k = j
					break
				}
				n--
			}
		}
		if k < 0 {
			t.Fatalf("datagram %d arrived from %v: no more were sent from port %d", i, g.Src, port)
		}
		next[port]++
		if string(g.Buf) != string(want[k].Buf) {
			t.Fatalf("datagram %d (port %d): payload differs (order within its flow, or content)", i, port)
		}
		if g.Src.Addr() != want[k].Src.Addr() {
			t.Fatalf("datagram %d arrived from %v, want %v", i, g.Src, want[k].Src.Addr())
		}
		ep := bth.Endpoints{Src: g.Src.Addr(), Dst: g.Dst.Addr(), SrcPort: g.Src.Port(), DstPort: g.Dst.Port()}
		if c := bth.ICRC(&ep, g.Buf); c != bth.GetICRC(g.Buf) {
			t.Fatalf("datagram %d from %v: ICRC %#08x does not verify over the received headers (computed %#08x)",
				i, g.Src, bth.GetICRC(g.Buf), c)
		}
	}
}

// TestEntropySourcePorts: the datagrams of two QP pairs leave with bth.SourcePort(lqpn, rqpn) as
// their UDP source port (IBTA A17.3.2), through Send and through SendRuns (GSO runs, and plain
// runs whose ICRCs the link rewrites with the sending socket's port), and their ICRC verifies
// over the headers they arrive with.
func TestEntropySourcePorts(t *testing.T) {
	for _, c := range []struct {
		name string
		runs bool
		gso  GSOMode
	}{{"send", false, GSOOn}, {"runs", true, GSOOn}, {"runs-plain", true, GSOOff}} {
		runs := c.runs
		t.Run(c.name, func(t *testing.T) {
			a, b := entropyPair(t, Options{GSO: c.gso, GRO: true})
			dst := b.LocalAddrPorts()[0]
			e1, e2 := bth.SourcePort(0x11, 0x12), bth.SourcePort(0x21, 0x22)
			if e1 == e2 {
				t.Fatal("test QPN pairs fold to one port")
			}
			needPooled(t, a, entA, e1)
			needPooled(t, a, entA, e2)
			var out []link.Datagram
			var ports []uint16
			var rl []uint8
			for _, e := range []uint16{e1, e2, e1} {
				sport := a.SourcePort(entA, e)
				if sport != e {
					t.Fatalf("SourcePort(%v, %d) = %d: a pooled port must be its own", entA, e, sport)
				}
				for k := 0; k < 3; k++ {
					out = append(out, roceDatagram(netip.AddrPortFrom(entA, sport), dst, 0x12, len(out), 512))
					ports = append(ports, e)
				}
				rl = append(rl, 3)
			}
			var err error
			if runs {
				err = a.SendRuns(out, rl)
			} else {
				err = a.Send(out)
			}
			if err != nil {
				t.Fatal(err)
			}
			checkArrived(t, recvN(t, b, len(out), 16), out, ports)
			if st := statsOf(a); st.EntropySockets != 2 || st.EntropyFallbacks != 0 || st.Sent != uint64(len(out)) {
				t.Fatalf("stats %+v: want 2 entropy sockets, no fallback, %d sent", st, len(out))
			}
		})
	}
}

// TestEntropyTClass: a pooled socket sends each datagram's traffic class (IP_TOS cmsg).
func TestEntropyTClass(t *testing.T) {
	a, _ := entropyPair(t, Options{})
	e := bth.SourcePort(0x31, 0x32)
	needPooled(t, a, entA, e)
	rx := tosReceiver(t, entB)
	dst := rx.LocalAddr().(*net.UDPAddr).AddrPort()
	src := netip.AddrPortFrom(entA, a.SourcePort(entA, e))
	batch := []link.Datagram{{Buf: []byte{0, 1}, Src: src, Dst: dst, TClass: 0x48}, {Buf: []byte{1, 1}, Src: src, Dst: dst}}
	if err := a.Send(batch); err != nil {
		t.Fatal(err)
	}
	for i, want := range []int{0x48, 0} {
		seq, class := readTOS(t, rx)
		if int(seq) != i || class != want {
			t.Fatalf("datagram %d class %#x, want %d %#x", seq, class, i, want)
		}
	}
}

// TestEntropyTakenPortFallsBack: a port another program holds falls back to the main socket, is
// counted once, stays fallen back after the program lets go (SourcePort is stable), and the
// datagram's ICRC, computed with the port SourcePort returned, verifies.
func TestEntropyTakenPortFallsBack(t *testing.T) {
	a, b := entropyPair(t, Options{})
	e := bth.SourcePort(0x41, 0x42)
	blocker, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(entA, e)))
	if err != nil {
		t.Skip("cannot take the port ourselves:", err)
	}
	main := a.LocalAddrPorts()[0].Port()
	if got := a.SourcePort(entA, e); got != main {
		blocker.Close()
		t.Fatalf("SourcePort of a taken port = %d, want the main socket's %d", got, main)
	}
	blocker.Close()
	if got := a.SourcePort(entA, e); got != main {
		t.Fatalf("SourcePort changed to %d after the port was freed: the decision must be permanent", got)
	}
	if port, pooled := a.EntropySocket(entA, e); pooled || port != main {
		t.Fatalf("EntropySocket = %d, %v", port, pooled)
	}
	if st := statsOf(a); st.EntropyFallbacks != 1 || st.EntropySockets != 0 {
		t.Fatalf("stats %+v: want one fallback, no socket", st)
	}
	d := roceDatagram(netip.AddrPortFrom(entA, a.SourcePort(entA, e)), b.LocalAddrPorts()[0], 0x42, 0, 100)
	// The engine's Src carries the port SourcePort gave; a Src carrying the entropy port itself
	// must leave from the same (main) socket, never from a socket opened later.
	d2 := roceDatagram(netip.AddrPortFrom(entA, e), b.LocalAddrPorts()[0], 0x42, 1, 100)
	if err := a.Send([]link.Datagram{d, d2}); err != nil {
		t.Fatal(err)
	}
	got := recvN(t, b, 2, 4)
	checkArrived(t, got[:1], []link.Datagram{d}, []uint16{main})
	if got[1].Src.Port() != main {
		t.Fatalf("a Src with a fallen-back port left from %v", got[1].Src)
	}
}

// TestEntropyPoolCap: beyond MaxSockets every new port falls back; ports already open keep
// their sockets; Off opens none.
func TestEntropyPoolCap(t *testing.T) {
	a, _ := entropyPair(t, Options{Entropy: EntropyOptions{MaxSockets: 2}})
	main := a.LocalAddrPorts()[0].Port()
	ports := []uint16{0xC101, 0xC102, 0xC103, 0xC104}
	needPooled(t, a, entA, ports[0])
	needPooled(t, a, entA, ports[1])
	for _, p := range ports[2:] {
		if got := a.SourcePort(entA, p); got != main {
			t.Fatalf("port %#x beyond the cap: SourcePort %d, want %d", p, got, main)
		}
	}
	for _, p := range ports[:2] {
		if got := a.SourcePort(entA, p); got != p {
			t.Fatalf("port %#x within the cap: SourcePort %d", p, got)
		}
	}
	if st := statsOf(a); st.EntropySockets != 2 || st.EntropyFallbacks != 2 {
		t.Fatalf("stats %+v: want 2 sockets, 2 fallbacks", st)
	}
	if got := a.SourcePort(entA, 0x1234); got != main {
		t.Fatalf("a port outside 0xC000..0xFFFF: SourcePort %d, want %d", got, main)
	}

	off, _ := entropyPair(t, Options{Entropy: EntropyOptions{Off: true}})
	offMain := off.LocalAddrPorts()[0].Port()
	if got := off.SourcePort(entA, 0xC105); got != offMain {
		t.Fatalf("Entropy.Off: SourcePort %d, want the main socket's %d", got, offMain)
	}
	if st := statsOf(off); st.EntropySockets != 0 || st.EntropyFallbacks != 0 {
		t.Fatalf("Entropy.Off stats %+v", st)
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip(err)
	}
	return len(ents)
}

// TestEntropyCloseReleasesSockets: Close closes every entropy socket (file descriptors before
// and after), and the shards of ListenShards share one pool that the last Close releases.
func TestEntropyCloseReleasesSockets(t *testing.T) {
	warm := listenTB(t, Options{Addrs: []netip.Addr{entB}, AnyPort: true}) // runtime poller fds
	warm.SourcePort(entB, 0xC200)
	before := openFDs(t)
	l, err := Listen(Options{Addrs: []netip.Addr{entA}, AnyPort: true})
	if err != nil {
		t.Fatal(err)
	}
	opened := 0
	for p := uint16(0xC201); p < 0xC206; p++ {
		if _, pooled := l.EntropySocket(entA, p); pooled {
			opened++
		}
	}
	if opened == 0 {
		l.Close()
		t.Skip("every test port is taken")
	}
	if got := openFDs(t); got != before+1+opened {
		l.Close()
		t.Fatalf("%d fds open, want %d (+1 main socket, +%d entropy sockets)", got, before+1+opened, opened)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if got := openFDs(t); got != before {
		t.Fatalf("%d fds after Close, want %d", got, before)
	}

	shards, err := ListenShards(Options{Addrs: []netip.Addr{entA}, AnyPort: true}, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, s := range shards {
			s.Close()
		}
	}()
	p0, pooled0 := shards[0].EntropySocket(entA, 0xC201)
	p1, pooled1 := shards[1].EntropySocket(entA, 0xC201)
	if p0 != p1 || pooled0 != pooled1 {
		t.Fatalf("shards disagree on port 0xC201: %d/%v and %d/%v", p0, pooled0, p1, pooled1)
	}
	if !pooled0 {
		t.Skip("port 0xC201 taken")
	}
	st := statsOf(shards[0])
	st1 := statsOf(shards[1])
	if st.EntropySockets != 1 || st1.EntropySockets != 0 || st.EntropyFallbacks+st1.EntropyFallbacks != 0 {
		t.Fatalf("shard stats %+v / %+v: one shared socket, reported once", st, st1)
	}
	mid := openFDs(t)
	shards[0].Close()
	if got := openFDs(t); got != mid-1 {
		t.Fatalf("closing shard 0: %d fds, want %d (its main socket only: shard 1 still uses the pool)", got, mid-1)
	}
	if p, pooled := shards[1].EntropySocket(entA, 0xC201); !pooled || p != 0xC201 {
		t.Fatalf("shard 1 after shard 0 closed: %d %v", p, pooled)
	}
	shards[1].Close()
	if got := openFDs(t); got != mid-3 {
		t.Fatalf("closing both shards: %d fds, want %d", got, mid-3)
	}
}

// TestEntropyNoReceiveQueue: datagrams sent to a pooled socket's port are dropped before they are
// queued (the drop-all filter): nothing to read, an empty queue, and SO_RCVBUF at the minimum.
func TestEntropyNoReceiveQueue(t *testing.T) {
	a, _ := entropyPair(t, Options{})
	e := bth.SourcePort(0x51, 0x52)
	needPooled(t, a, entA, e)
	c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(entA, e)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := 0; i < 64; i++ {
		if _, err := c.Write(make([]byte, 1000)); err != nil {
			t.Fatal(err)
		}
	}
	// Loopback delivers synchronously inside the sender's write: by now every datagram was
	// either queued on the entropy socket or dropped.
	es := a.socks[0].pool.table[e-entropyBase].Load()
	var queued, rcvbuf int
	var rerr, ierr error
	if err := es.rc.Control(func(fd uintptr) {
		queued, ierr = unix.IoctlGetInt(int(fd), unix.SIOCINQ)
		rcvbuf, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF)
		_, _, rerr = unix.Recvfrom(int(fd), make([]byte, 2000), unix.MSG_DONTWAIT)
	}); err != nil {
		t.Fatal(err)
	}
	if ierr != nil {
		t.Fatal(ierr)
	}
	if queued != 0 || !errors.Is(rerr, unix.EAGAIN) {
		t.Fatalf("entropy socket queue: %d bytes, recv %v: a send-only socket must drop what it receives", queued, rerr)
	}
	if rcvbuf > 8192 {
		t.Fatalf("SO_RCVBUF %d: want the kernel's minimum", rcvbuf)
	}
}

// TestEntropyZeroAlloc: steady-state sends through entropy sockets (Send and SendRuns) allocate
// nothing per batch.
func TestEntropyZeroAlloc(t *testing.T) {
	a, b := entropyPair(t, Options{GSO: GSOOn})
	dst := b.LocalAddrPorts()[0]
	e1, e2 := bth.SourcePort(0x61, 0x62), bth.SourcePort(0x71, 0x72)
	needPooled(t, a, entA, e1)
	needPooled(t, a, entA, e2)
	var out []link.Datagram
	for i := 0; i < 16; i++ {
		e := e1
		if i >= 8 {
			e = e2
		}
		out = append(out, roceDatagram(netip.AddrPortFrom(entA, a.SourcePort(entA, e)), dst, 0x62, i, 1000))
	}
	runs := []uint8{8, 8}
	in := recvBufs(16)
	round := func() {
		if err := a.Send(out); err != nil {
			t.Fatal(err)
		}
		if err := a.SendRuns(out, runs); err != nil {
			t.Fatal(err)
		}
		for got := 0; got < 2*len(out); {
			k, err := b.Recv(in)
			if err != nil {
				t.Fatal(err)
			}
			got += k
		}
		_ = a.SourcePort(entA, e1)
	}
	round()
	if allocs := testing.AllocsPerRun(50, round); allocs != 0 {
		t.Fatalf("%v allocations per round, want 0", allocs)
	}
}
