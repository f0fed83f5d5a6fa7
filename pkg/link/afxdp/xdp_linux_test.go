package afxdp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/softroce/softroce/internal/netnstest"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/udp"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// pollBatch is a TryRecv batch and the buffers it owns: TryRecv may leave views of the link's
// memory in the batch, so each attempt points it back at its buffers first.
type pollBatch struct {
	in   []link.Datagram
	bufs [][]byte
}

func newPollBatch(n int) *pollBatch {
	p := &pollBatch{in: recvBufs(n)}
	for _, d := range p.in {
		p.bufs = append(p.bufs, d.Buf)
	}
	return p
}

// tryRecvFor polls l.TryRecv into p.in until it returns a datagram or d passes.
func tryRecvFor(l *Link, p *pollBatch, d time.Duration) (int, error) {
	in := p.in
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		for i := range in {
			in[i].Buf = p.bufs[i]
		}
		n, err := l.TryRecv(in)
		if n > 0 || err != nil {
			return n, err
		}
	}
	return 0, errors.New("nothing received")
}

// listenXDPIn opens a link with the AF_XDP path (o) on addr, in th's namespace.
func listenXDPIn(t *testing.T, th *netnstest.Thread, addr netip.Addr, o Options) *Link {
	t.Helper()
	var l *Link
	if err := th.Do(func() (err error) {
		o.UDP.Addrs = []netip.Addr{addr}
		l, err = Open(o)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return l
}

// listenSniffed opens a plain UDP link on addr in th's namespace and a sniffer (an AF_PACKET
// socket, IPv4 frames) on its interface ifname.
func listenSniffed(t *testing.T, th *netnstest.Thread, addr netip.Addr, ifname string) (l *udp.Link, sniff int) {
	t.Helper()
	sniff = -1
	if err := th.Do(func() (err error) {
		if l, err = udp.Listen(udp.Options{Addrs: []netip.Addr{addr}}); err != nil {
			return err
		}
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		if sniff, err = unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_IP))); err != nil {
			return err
		}
		return unix.Bind(sniff, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: ifi.Index})
	}); err != nil {
		t.Fatal(err)
	}
	return l, sniff
}

// TestXDPLink runs the AF_XDP path between two network namespaces on a veth pair. A (AF_XDP)
// learns B's MAC address from B's first datagram, then sends through its transmit ring: B, a
// plain UDP link, receives every datagram, and a sniffer on B's interface sees the frames A
// built — IPv4 ID 0, DF, TTL 64, the traffic class, and an ICRC that verifies over the real
// header (IBTA A17.3.3). Datagrams too large for a UMEM chunk go through the UDP socket both
// ways. Then B is an AF_XDP link too and the two exchange through their rings only. Close
// unblocks a Recv waiting in poll and detaches the program.
func TestXDPLink(t *testing.T) {
	// MTU 9000: room for datagrams larger than a UMEM chunk
	x, y := netnstest.Veth(t, "srxa", "198.18.6.1/24", "srxb", "198.18.6.2/24", 9000)
	aIP, bIP := netip.MustParseAddr("198.18.6.1"), netip.MustParseAddr("198.18.6.2")
	var a *Link
	// a queue the veth does not have: refused cleanly (everything set up so far released)
	if err := x.Do(func() error {
		l, err := Open(Options{UDP: udp.Options{Addrs: []netip.Addr{aIP}}, Queue: 7})
		if err == nil {
			l.Close()
			return errors.New("an AF_XDP socket on queue 7 of a one-queue veth was accepted")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	a = listenXDPIn(t, x, aIP, Options{})
	defer a.Close()
	b, sniff := listenSniffed(t, y, bIP, "srxb")
	defer unix.Close(sniff)
	aAP, bAP := netip.AddrPortFrom(aIP, link.UDPPort), netip.AddrPortFrom(bIP, link.UDPPort)
	pa := newPollBatch(64)
	in := pa.in

	// B -> A until A hears it (the veth's carrier and B's ARP take a moment): A's ring
	hello := mkRun(bAP, aAP, 1, 100, 100, 1)
	var got []link.Datagram
	for try := 0; try < 200 && len(got) == 0; try++ {
		if err := b.Send(hello); err != nil {
			t.Fatal(err)
		}
		n, _ := tryRecvFor(a, pa, 10*time.Millisecond)
		got = in[:n]
	}
	if len(got) == 0 {
		t.Fatalf("A heard nothing from B; A stats %+v", statsOf(a))
	}
	if got[0].Src != bAP || got[0].Dst != aAP || !bytes.Equal(got[0].Buf, hello[0].Buf) {
		t.Fatalf("A received %v -> %v %d bytes, want %v -> %v and the sent bytes", got[0].Src, got[0].Dst, len(got[0].Buf), bAP, aAP)
	}
	if !got[0].HasIPv4ID || got[0].IPv4ID != 0 { // B's DF datagrams (socket or ring) carry ID 0
		t.Fatalf("A's ring datagram: IPv4 ID %v %#x, want known, 0", got[0].HasIPv4ID, got[0].IPv4ID)
	}
	if st := statsOf(a); st.XDPReceived == 0 || st.Received != st.XDPReceived {
		t.Fatalf("A stats %+v: want everything received through the ring", st)
	}
	for { // drain B's retries
		if n, _ := tryRecvFor(a, pa, 50*time.Millisecond); n == 0 {
			break
		}
	}

	// A -> B through the ring: one datagram with a traffic class, then a batch of 40 (more
	// than the kernel takes per sendto)
	one := mkRun(aAP, bAP, 1, 600, 600, 2)
	one[0].TClass = 0x68
	if err := a.Send(one); err != nil {
		t.Fatal(err)
	}
	if r := recvN(t, b, 1, 8); !bytes.Equal(r[0].Buf, one[0].Buf) || r[0].Src != aAP {
		t.Fatalf("B received %d bytes from %v", len(r[0].Buf), r[0].Src)
	}
	w, err := readMatching(sniff, true, aAP, bAP, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkWire(w, one, func(int) uint16 { return 0 }); err != nil {
		t.Fatal(err)
	}
	if h := w[0]; !h.df || h.ttl != 64 || h.raw[1] != 0x68 {
		t.Fatalf("A's frame: DF %v TTL %d TOS %#02x; want DF, 64, 0x68", h.df, h.ttl, h.raw[1])
	}
	var batch []link.Datagram
	for k := range 40 {
		batch = append(batch, mkRun(aAP, bAP, 1, 64+k, 64+k, byte(k))...)
	}
	if err := a.Send(batch); err != nil {
		t.Fatal(err)
	}
	r := recvN(t, b, 40, 64)
	for k := range r {
		if !bytes.Equal(r[k].Buf, batch[k].Buf) {
			t.Fatalf("datagram %d of the batch: %d bytes, want %d (order or content)", k, len(r[k].Buf), len(batch[k].Buf))
		}
	}
	if w, err = readMatching(sniff, true, aAP, bAP, 40); err != nil {
		t.Fatal(err)
	}
	if err := checkWire(w, batch, func(int) uint16 { return 0 }); err != nil {
		t.Fatal(err)
	}
	if st := statsOf(a); st.XDPSent != 41 || st.XDPFallbacks != 0 || st.Sent != 41 {
		t.Fatalf("A stats %+v: want 41 sent through the ring, no fallback", st)
	}

	// too large for a chunk: the UDP socket, both ways (A's program passes B's to A's socket)
	big := mkRun(aAP, bAP, 1, MaxFrame, MaxFrame, 3)
	if err := a.Send(big); err != nil {
		t.Fatal(err)
	}
	if r := recvN(t, b, 1, 8); !bytes.Equal(r[0].Buf, big[0].Buf) {
		t.Fatal("B: the large datagram differs")
	}
	if st := statsOf(a); st.XDPFallbacks != 1 || st.XDPSent != 41 {
		t.Fatalf("A stats %+v: want the large datagram through the socket", st)
	}
	bigB := mkRun(bAP, aAP, 1, MaxFrame, MaxFrame, 4)
	if err := b.Send(bigB); err != nil {
		t.Fatal(err)
	}
	if r := recvN(t, a, 1, 8); !bytes.Equal(r[0].Buf, bigB[0].Buf) || r[0].Src != bAP {
		t.Fatal("A (Recv): the large datagram differs")
	}
	if err := b.Send(bigB); err != nil {
		t.Fatal(err)
	}
	if n, err := tryRecvFor(a, pa, 2*time.Second); n != 1 || err != nil || !bytes.Equal(in[0].Buf, bigB[0].Buf) {
		t.Fatalf("A (TryRecv): %d datagrams, %v", n, err)
	}
	if in[0].HasIPv4ID { // the socket does not show the IP header
		t.Fatal("A (TryRecv): a datagram read from the UDP socket claims to know its IPv4 ID")
	}

	// B with the AF_XDP path too: rings on both sides. The new link has heard nothing from A,
	// but its namespace's neighbour table knows A's MAC address (the plain link's traffic):
	// its first send already goes through the ring.
	b.Close()
	bx := listenXDPIn(t, y, bIP, Options{})
	defer bx.Close()
	pb := newPollBatch(64)
	inB := pb.in
	for k := range 100 {
		q := mkRun(bAP, aAP, 1, 20, 20, byte(k))
		if err := bx.Send(q); err != nil {
			t.Fatal(err)
		}
		if n, err := tryRecvFor(a, pa, 2*time.Second); n != 1 || err != nil || !bytes.Equal(in[0].Buf, q[0].Buf) {
			t.Fatalf("round %d: A got %d datagrams (%v)", k, n, err)
		}
		p := mkRun(aAP, bAP, 1, 40, 40, byte(k))
		if err := a.Send(p); err != nil {
			t.Fatal(err)
		}
		if n, err := tryRecvFor(bx, pb, 2*time.Second); n != 1 || err != nil || !bytes.Equal(inB[0].Buf, p[0].Buf) {
			t.Fatalf("round %d: B got %d datagrams (%v)", k, n, err)
		}
	}
	if st := statsOf(bx); st.XDPSent != 100 || st.XDPReceived != 100 || st.XDPFallbacks != 0 {
		t.Fatalf("B stats %+v: want 100 each way through the rings", st)
	}

	// Close wakes a Recv in poll and takes the program off the interface
	errc := make(chan error, 1)
	go func() {
		_, err := a.Recv(recvBufs(8))
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond) // let it reach poll; the test holds either way
	a.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Recv after Close: %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake Recv")
	}
	if err := x.Do(func() error {
		l, err := netlink.LinkByName("srxa")
		if err != nil {
			return err
		}
		if xd := l.Attrs().Xdp; xd != nil && xd.Attached {
			return fmt.Errorf("after Close srxa still has XDP program %d", xd.ProgId)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestXDPOptionsRefused: the AF_XDP path takes one IPv4 address.
func TestXDPOptionsRefused(t *testing.T) {
	_, err := Open(Options{UDP: udp.Options{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")}, AnyPort: true}})
	if !errors.Is(err, link.ErrInvalidAddr) {
		t.Fatalf("two addresses: %v", err)
	}
	_, err = Open(Options{UDP: udp.Options{Addrs: []netip.Addr{netip.MustParseAddr("::1")}, AnyPort: true}})
	if err == nil {
		t.Fatal("IPv6: accepted")
	}
}

// TestXDPRedirect runs the redirect program (BPF_PROG_TEST_RUN) over frames that pass each of
// its checks but one: every such frame goes to the stack (XDP_PASS), the link's own datagram
// to the XSKMAP — here without a socket, with the program's fallback verdict set to XDP_DROP
// so that a redirect shows. Loaded for multi-buffer frames, so that a frame longer than the
// ring takes can be run.
func TestXDPRedirect(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (BPF programs and maps)")
	}
	const xdpDrop = 1
	addr := [4]byte{198, 18, 6, 1}
	p, err := loadXDP(xdpConsts{addr: addr, port: 4791, noSocket: xdpDrop}, 0, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	frame := func(n int, edit func(f []byte)) []byte {
		f := make([]byte, n)
		x := &xdpSock{addr4: [4]byte{198, 18, 6, 2}}
		x.headers(f, [6]byte{2, 0, 0, 0, 0, 1}, addr, 0, 0xC000, 4791)
		if edit != nil {
			edit(f)
		}
		return f
	}
	for _, c := range []struct {
		name string
		f    []byte
		want uint32
	}{
		{"the link's datagram", frame(100, nil), xdpDrop},
		{"the largest frame", frame(MaxFrame, nil), xdpDrop},
		{"shorter than the headers", frame(100, nil)[:41], xdpPass},
		{"a frame too large for the ring", frame(MaxFrame+1, nil), xdpPass},
		{"not IPv4", frame(100, func(f []byte) { f[12], f[13] = 0x86, 0xdd }), xdpPass},
		{"IPv4 options", frame(100, func(f []byte) { f[14] = 0x46 }), xdpPass},
		{"not UDP", frame(100, func(f []byte) { f[23] = 6 }), xdpPass},
		{"a fragment (MF)", frame(100, func(f []byte) { f[20] |= 0x20 }), xdpPass},
		{"a fragment (offset)", frame(100, func(f []byte) { f[21] = 1 }), xdpPass},
		{"another address", frame(100, func(f []byte) { f[33]++ }), xdpPass},
		{"another port", frame(100, func(f []byte) { f[37]++ }), xdpPass},
		{"DF set", frame(100, func(f []byte) { f[20] |= 0x40 }), xdpDrop}, // DF is not a fragment
	} {
		v, err := p.Prog.Run(&ebpf.RunOptions{Data: c.f, Repeat: 1})
		if err != nil {
			t.Fatalf("%s: BPF_PROG_TEST_RUN: %v", c.name, err)
		}
		if v != c.want {
			t.Errorf("%s: verdict %d, want %d", c.name, v, c.want)
		}
	}
}

// TestXDPParseChecksum: the ring takes a datagram with UDP checksum 0 (kernel rxe's), the right
// checksum, or the pseudo-header's sum a local sender leaves for offload, and drops one with a
// wrong checksum, counting it, as the kernel's UDP receive would have.
func TestXDPParseChecksum(t *testing.T) {
	x := &xdpSock{addr: netip.MustParseAddr("198.18.6.1"), addr4: [4]byte{198, 18, 6, 1}, port: 4791, peers: make(map[[4]byte]*xdpPeer), asked: make(map[[4]byte]time.Time)}
	fr := make([]byte, ethIPv4UDP+41)
	fr[12], fr[13], fr[14], fr[23] = 0x08, 0x00, 0x45, 17
	binary.BigEndian.PutUint16(fr[16:], 28+41)
	copy(fr[26:30], []byte{198, 18, 6, 2})
	copy(fr[30:34], []byte{198, 18, 6, 1})
	binary.BigEndian.PutUint16(fr[34:], 0xc001)
	binary.BigEndian.PutUint16(fr[36:], 4791)
	binary.BigEndian.PutUint16(fr[38:], 8+41)
	for i := ethIPv4UDP; i < len(fr); i++ {
		fr[i] = byte(i * 7)
	}
	udp := fr[34:]
	partial := fold(onesSum(fr[26:34]) + 17 + uint64(len(udp)))
	right := ^fold(onesSum(fr[26:34]) + 17 + uint64(len(udp)) + onesSum(udp))
	for _, c := range []struct {
		sum  uint16
		want bool
	}{{0, true}, {right, true}, {partial, true}, {right ^ 0x0400, false}, {0xFFFF, right == 0xFFFF}} {
		binary.BigEndian.PutUint16(fr[40:], c.sum)
		before := x.csumErrors.Load()
		d := link.Datagram{Buf: make([]byte, 0, 64)}
		if got := x.parse(&d, fr, true); got != c.want || (x.csumErrors.Load() != before) == c.want {
			t.Errorf("UDP checksum %#04x (right %#04x, partial %#04x): accepted %v, want %v; errors %d -> %d",
				c.sum, right, partial, got, c.want, before, x.csumErrors.Load())
		}
	}
}

// FuzzXDPParse: frames from the ring are remote input. parse never reads outside the frame,
// accepts only what is addressed to the link, and hands out the UDP payload the headers give
// with the IPv4 ID and TOS (its ECN field) they carry.
func FuzzXDPParse(f *testing.F) {
	x := &xdpSock{addr: netip.MustParseAddr("198.18.6.1"), addr4: [4]byte{198, 18, 6, 1}, port: 4791, peers: make(map[[4]byte]*xdpPeer), asked: make(map[[4]byte]time.Time)}
	good := func(payload int) []byte {
		fr := make([]byte, ethIPv4UDP+payload)
		fr[12], fr[13], fr[14], fr[23] = 0x08, 0x00, 0x45, 17
		tot := 28 + payload
		fr[16], fr[17] = byte(tot>>8), byte(tot)
		copy(fr[26:30], []byte{198, 18, 6, 2})
		copy(fr[30:34], []byte{198, 18, 6, 1})
		fr[34], fr[35], fr[36], fr[37] = 0xc0, 0x01, 0x12, 0xb7
		fr[38], fr[39] = byte((8+payload)>>8), byte(8+payload)
		return fr
	}
	f.Add(good(40))
	withID := good(40)
	withID[18], withID[19] = 0xdf, 0x78 // kernel rxe's counting IDs
	f.Add(withID)
	ce := good(40)
	ce[15] = 0x48 | link.ECNCE // marked by a switch
	f.Add(ce)
	f.Add(good(0))
	f.Add(append(good(20), 0, 0, 0, 0)) // Ethernet padding after the datagram
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, fr []byte) {
		var d link.Datagram
		d.Buf = make([]byte, 0, 64)
		for _, copyOut := range []bool{false, true} {
			d.Buf = d.Buf[:0]
			if !x.parse(&d, fr, copyOut) {
				continue
			}
			ul := int(fr[38])<<8 | int(fr[39])
			if len(d.Buf) != min(ul-8, cap(d.Buf)) && copyOut || !copyOut && len(d.Buf) != ul-8 {
				t.Fatalf("payload %d bytes, UDP length %d", len(d.Buf), ul)
			}
			if d.Dst != netip.AddrPortFrom(x.addr, 4791) || 34+ul > len(fr) {
				t.Fatalf("accepted %v, UDP length %d in a frame of %d", d.Dst, ul, len(fr))
			}
			if !d.HasIPv4ID || d.IPv4ID != uint16(fr[18])<<8|uint16(fr[19]) {
				t.Fatalf("IPv4 ID %v %#x, frame's %#x", d.HasIPv4ID, d.IPv4ID, fr[18:20])
			}
			if d.TClass != fr[15] || d.CE() != (fr[15]&3 == 3) {
				t.Fatalf("TClass %#x, frame's TOS %#x", d.TClass, fr[15])
			}
		}
	})
}

// TestXDPLearn: a frame teaches the MAC address of an address the link has looked up (it sends
// there) and updates a known one; a frame from any other address teaches nothing (remote input
// cannot fill the table); with two peers in turn no learning or lookup allocates.
func TestXDPLearn(t *testing.T) {
	x := &xdpSock{peers: make(map[[4]byte]*xdpPeer), asked: make(map[[4]byte]time.Time)}
	a, b, stranger := [4]byte{198, 18, 6, 2}, [4]byte{198, 18, 6, 3}, [4]byte{198, 18, 6, 66}
	macA, macA2, macB := []byte{2, 0, 0, 0, 0, 0xa}, []byte{2, 0, 0, 0, 0, 0xaa}, []byte{2, 0, 0, 0, 0, 0xb}
	x.learn(stranger, macA)
	if _, ok := x.peers[stranger]; ok {
		t.Fatal("learned the MAC of an address never looked up")
	}
	now := time.Now()
	x.asked[a], x.asked[b] = now, now // looked up (the neighbour table had nothing)
	x.learn(a, macA)
	x.learn(b, macB)
	if m, ok := x.lookup(a); !ok || string(m[:]) != string(macA) {
		t.Fatalf("a: %x %v", m, ok)
	}
	x.learn(a, macA2) // moved
	if m, ok := x.lookup(a); !ok || string(m[:]) != string(macA2) {
		t.Fatalf("a after its new frame: %x %v", m, ok)
	}
	if n := testing.AllocsPerRun(100, func() {
		x.learn(a, macA2)
		x.lookup(b)
		x.learn(b, macB)
		x.lookup(a)
	}); n != 0 {
		t.Fatalf("%v allocations per learn/lookup with two peers in turn", n)
	}
	if len(x.peers) != 2 {
		t.Fatalf("%d peers, want 2", len(x.peers))
	}
}

// TestXDPNative: with Options.Native the program sits in the driver's hook (veth has one;
// the program is multi-buffer aware, so the 9000-byte MTU is accepted) and datagrams go ring to
// ring both ways as with the generic hook.
func TestXDPNative(t *testing.T) {
	x, y := netnstest.Veth(t, "srna", "198.18.6.1/24", "srnb", "198.18.6.2/24", 9000)
	aIP, bIP := netip.MustParseAddr("198.18.6.1"), netip.MustParseAddr("198.18.6.2")
	// B names its interface (Options.Interface); A's is found by its address
	a, b := listenXDPIn(t, x, aIP, Options{Native: true}), listenXDPIn(t, y, bIP, Options{Native: true, Interface: "srnb"})
	defer a.Close()
	defer b.Close()
	aAP, bAP := netip.AddrPortFrom(aIP, link.UDPPort), netip.AddrPortFrom(bIP, link.UDPPort)
	pa, pb := newPollBatch(8), newPollBatch(8)
	for k := range 20 {
		p := mkRun(aAP, bAP, 1, 40, 40, byte(k))
		if err := a.Send(p); err != nil {
			t.Fatal(err)
		}
		if n, err := tryRecvFor(b, pb, 2*time.Second); n != 1 || err != nil || !bytes.Equal(pb.in[0].Buf, p[0].Buf) {
			t.Fatalf("round %d: B got %d datagrams (%v)", k, n, err)
		}
		q := mkRun(bAP, aAP, 1, 20, 20, byte(k))
		if err := b.Send(q); err != nil {
			t.Fatal(err)
		}
		if n, err := tryRecvFor(a, pa, 2*time.Second); n != 1 || err != nil || !bytes.Equal(pa.in[0].Buf, q[0].Buf) {
			t.Fatalf("round %d: A got %d datagrams (%v)", k, n, err)
		}
	}
	if sa, sb := statsOf(a), statsOf(b); sa.XDPReceived != 20 || sb.XDPReceived != 20 || sb.XDPFallbacks != 0 {
		t.Fatalf("stats A %+v B %+v: want every datagram received through the rings", sa, sb)
	}
}

// TestIPChecksum: ipChecksum against the RFC 1071 sum of ten 16-bit words, for random headers
// and the all-ones and all-zero ones (carries folded more than once).
func TestIPChecksum(t *testing.T) {
	ref := func(h []byte) uint16 {
		var sum uint32
		for i := 0; i < 20; i += 2 {
			if i != 10 {
				sum += uint32(h[i])<<8 | uint32(h[i+1])
			}
		}
		for sum > 0xffff {
			sum = sum&0xffff + sum>>16
		}
		return ^uint16(sum)
	}
	r := rand.New(rand.NewPCG(3, 4))
	h := make([]byte, 20)
	for i := range 20000 {
		for j := range h {
			switch i {
			case 0:
				h[j] = 0xff
			case 1:
				h[j] = 0
			default:
				h[j] = byte(r.Uint32())
			}
		}
		h[10], h[11] = 0, 0
		ipChecksum(h)
		if got, want := uint16(h[10])<<8|uint16(h[11]), ref(h); got != want {
			t.Fatalf("header % x: checksum %#04x, want %#04x", h, got, want)
		}
	}
}

// TestXDPSocketBackoff: TryRecv on a link with the AF_XDP path reads its UDP socket every 256th
// call while the socket has something, and backs off to every 8192nd call while it finds
// nothing; a datagram that reaches the socket (one too large for the ring) is still read
// within that bound, and the read sets the interval back.
func TestXDPSocketBackoff(t *testing.T) {
	x, y := netnstest.Veth(t, "srsa", "198.18.10.1/24", "srsb", "198.18.10.2/24", 9000)
	aIP, bIP := netip.MustParseAddr("198.18.10.1"), netip.MustParseAddr("198.18.10.2")
	a := listenXDPIn(t, x, aIP, Options{})
	defer a.Close()
	var b *udp.Link
	if err := y.Do(func() (err error) { b, err = udp.Listen(udp.Options{Addrs: []netip.Addr{bIP}}); return err }); err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	aAP, bAP := netip.AddrPortFrom(aIP, link.UDPPort), netip.AddrPortFrom(bIP, link.UDPPort)
	p := newPollBatch(8)
	try := func() int {
		for i := range p.in {
			p.in[i].Buf = p.bufs[i]
		}
		n, err := a.TryRecv(p.in)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for range 64 * xdpSocketMax {
		if try() != 0 {
			t.Fatal("A received something before anything was sent")
		}
	}
	if e := a.x.sockEvery; e != xdpSocketMax {
		t.Fatalf("after %d empty polls the socket is read every %d calls, want %d", 64*xdpSocketMax, e, xdpSocketMax)
	}
	big := mkRun(bAP, aAP, 1, MaxFrame, MaxFrame, 9) // too large for a ring frame: A's socket
	if err := b.Send(big); err != nil {
		t.Fatal(err)
	}
	// wait until it is in A's socket (SIOCINQ), then count the polls that read it
	deadline := time.Now().Add(5 * time.Second)
	for queued := 0; queued == 0; {
		if err := a.u.RawConn(aIP).Control(func(fd uintptr) { queued, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the large datagram never reached A's UDP socket")
		}
	}
	for i := 1; ; i++ {
		if n := try(); n > 0 {
			if !bytes.Equal(p.in[0].Buf, big[0].Buf) {
				t.Fatal("A read a different datagram")
			}
			if i > xdpSocketMax {
				t.Fatalf("the socket's datagram took %d polls, want at most %d", i, xdpSocketMax)
			}
			break
		}
		if i > 4*xdpSocketMax {
			t.Fatalf("the socket's datagram not read in %d polls", i)
		}
	}
	if e := a.x.sockEvery; e != xdpSocketEvery {
		t.Fatalf("after a socket read the interval is %d calls, want %d", e, xdpSocketEvery)
	}
}
