package udp

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/softroce/softroce/internal/netnstest"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// These tests check what Linux writes in the IPv4 header of our sends, which the ICRC covers
// (IBTA A17.3.3) and a UDP socket cannot see. They need root (AF_PACKET, netns, tun).

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (AF_PACKET / network namespace)")
	}
}

// ipv4UDP is what the sniffers extract from a captured IPv4/UDP packet.
type ipv4UDP struct {
	id               uint16
	df               bool
	src, dst         netip.AddrPort
	payloadLen       int
	pkttype          uint8
	ttl              uint8
	raw              []byte // the whole IP packet
	totalLen, udpLen int
}

func parseIPv4UDP(p []byte) (ipv4UDP, bool) {
	if len(p) < 28 || p[0]>>4 != 4 || p[9] != unix.IPPROTO_UDP {
		return ipv4UDP{}, false
	}
	ihl := int(p[0]&0xF) * 4
	if len(p) < ihl+8 {
		return ipv4UDP{}, false
	}
	u := p[ihl:]
	return ipv4UDP{
		id:       binary.BigEndian.Uint16(p[4:]),
		df:       p[6]&0x40 != 0,
		ttl:      p[8],
		src:      netip.AddrPortFrom(netip.AddrFrom4([4]byte(p[12:16])), binary.BigEndian.Uint16(u)),
		dst:      netip.AddrPortFrom(netip.AddrFrom4([4]byte(p[16:20])), binary.BigEndian.Uint16(u[2:])),
		totalLen: int(binary.BigEndian.Uint16(p[2:])),
		udpLen:   int(binary.BigEndian.Uint16(u[4:])),
	}, true
}

// readMatching reads packets from fd (non-blocking; poll bounded by 2 s so a failure cannot
// hang the test) until want packets from src to dst are seen.
func readMatching(fd int, isPacket bool, src, dst netip.AddrPort, want int) ([]ipv4UDP, error) {
	var got []ipv4UDP
	buf := make([]byte, 70000)
	for len(got) < want {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(pfd, 2000)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return got, err
		}
		if n == 0 {
			return got, fmt.Errorf("timed out with %d of %d packets", len(got), want)
		}
		var pkttype uint8
		var m int
		if isPacket {
			var from unix.Sockaddr
			m, from, err = unix.Recvfrom(fd, buf, unix.MSG_DONTWAIT)
			if ll, ok := from.(*unix.SockaddrLinklayer); ok {
				pkttype = ll.Pkttype
			}
		} else {
			m, err = unix.Read(fd, buf)
		}
		if err == unix.EAGAIN {
			continue
		}
		if err != nil {
			return got, err
		}
		if isPacket && pkttype == unix.PACKET_OUTGOING {
			continue // lo shows every packet twice: keep the received copy
		}
		h, ok := parseIPv4UDP(buf[:m])
		if !ok || h.src != src || h.dst != dst {
			continue
		}
		h.pkttype = pkttype
		h.payloadLen = h.udpLen - 8
		h.raw = append([]byte(nil), buf[:m]...)
		got = append(got, h)
	}
	return got, nil
}

// TestUDPIPv4IDZeroOnLoopback sniffs lo with AF_PACKET: every datagram an unconnected DF socket
// sends must carry IPv4 ID 0 and DF, the header the engine's ICRC assumes.
func TestUDPIPv4IDZeroOnLoopback(t *testing.T) {
	needRoot(t)
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		t.Skip("no lo:", err)
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_IP)))
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	// lo carries every other test's traffic too: a large queue keeps ours from being dropped.
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64<<20)
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: lo.Index}); err != nil {
		t.Fatal(err)
	}
	p := genTestPair(t, varUDP)
	const n = 20
	out := p.MkBatch(n, 1100, 7)
	if err := p.A.Send(out); err != nil {
		t.Fatal(err)
	}
	recvN(t, p.B, n, 32)
	got, err := readMatching(fd, true, out[0].Src, p.BAddr, n)
	if err != nil {
		t.Fatal(err)
	}
	for i, h := range got {
		if h.id != 0 || !h.df {
			t.Fatalf("packet %d: IPv4 ID %#04x DF %v, want ID 0 with DF", i, h.id, h.df)
		}
		if h.payloadLen != 1100 {
			t.Fatalf("packet %d: UDP payload %d", i, h.payloadLen)
		}
	}
}

// TestUDPGSOOnLoopbackIsOnePacket: lo can carry UDP GSO packets whole (NETIF_F_GSO_UDP_L4), so a
// sniffer on lo sees one IPv4 packet with ID 0 holding every segment; a GRO receiver gets it whole
// too (TestUDPGSOAndGRO), a receiver without GRO gets it segmented on input.
func TestUDPGSOOnLoopbackIsOnePacket(t *testing.T) {
	needRoot(t)
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		t.Skip("no lo:", err)
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_IP)))
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	// lo carries every other test's traffic too: a large queue keeps ours from being dropped.
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64<<20)
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: lo.Index}); err != nil {
		t.Fatal(err)
	}
	p := genTestPair(t, varUDPGSO)
	out := p.MkBatch(6, 1000, 3)
	if err := p.A.Send(out); err != nil {
		t.Fatal(err)
	}
	p.Check(t, out, recvN(t, p.B, len(out), 8))
	got, err := readMatching(fd, true, out[0].Src, p.BAddr, 1)
	if err != nil {
		t.Fatal(err)
	}
	if h := got[0]; h.id != 0 || !h.df || h.payloadLen != 6000 {
		t.Fatalf("sniffed ID %d DF %v UDP payload %d, want one 6000-byte packet with ID 0 and DF", h.id, h.df, h.payloadLen)
	}
}

// TestUDPICRCOnTheWire is the end-to-end check of the seam's promise: an ICRC computed with
// Endpoints{IPID: 0, SrcPort: Link.SourcePort(...)} before Send is the ICRC of the packet as it
// appears on the wire, IP header included (bth.ICRCFromIP on the sniffed IPv4 packet).
func TestUDPICRCOnTheWire(t *testing.T) {
	needRoot(t)
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		t.Skip("no lo:", err)
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_IP)))
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	// lo carries every other test's traffic too: a large queue keeps ours from being dropped.
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64<<20)
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: lo.Index}); err != nil {
		t.Fatal(err)
	}
	p := genTestPair(t, varUDP)
	src := netip.AddrPortFrom(p.AAddr.Addr(), p.A.SourcePort(p.AAddr.Addr(), bth.SourcePort(0x11, 0x12)))
	const n = 4
	out := make([]link.Datagram, n)
	for i := range out {
		pkt := make([]byte, bth.BTHSize+256*(i+1)+bth.ICRCSize)
		bth.BTH(pkt).Encode(&bth.BTHFields{Opcode: bth.OpUDSendOnly, PKey: 0xFFFF, DestQP: 0x12, PSN: bth.PSN(i)})
		for k := bth.BTHSize; k < len(pkt)-bth.ICRCSize; k++ {
			pkt[k] = byte(k * (i + 3))
		}
		ep := bth.Endpoints{Src: src.Addr(), Dst: p.BAddr.Addr(), SrcPort: src.Port(), DstPort: p.BAddr.Port(), IPID: 0}
		bth.SetICRC(pkt, bth.ICRC(&ep, pkt))
		out[i] = link.Datagram{Buf: pkt, Src: src, Dst: p.BAddr}
	}
	if err := p.A.Send(out); err != nil {
		t.Fatal(err)
	}
	p.Check(t, out, recvN(t, p.B, n, 8))
	got, err := readMatching(fd, true, src, p.BAddr, n)
	if err != nil {
		t.Fatal(err)
	}
	for i, h := range got {
		c, err := bth.ICRCFromIP(h.raw)
		if err != nil {
			t.Fatal(err)
		}
		if want := bth.GetICRC(out[i].Buf); c != want {
			t.Fatalf("packet %d: ICRC over the wire header %#08x, sender computed %#08x (ID %d)", i, c, want, h.id)
		}
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// inNetns runs f on a locked OS thread in a fresh network namespace (netnstest.Thread).
func inNetns(t *testing.T, f func() error) {
	t.Helper()
	if err := netnstest.NewThread(t).Do(f); err != nil {
		t.Fatal(err)
	}
}

// openTun creates a tun device with no offloads (so the kernel segments GSO sends in software
// before handing them to us), addressed 198.18.0.1/24 so 198.18.0.2 routes into it.
func openTun() (int, netip.Addr, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, netip.Addr{}, err
	}
	ifr, _ := unix.NewIfreq("srtun0")
	ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return -1, netip.Addr{}, fmt.Errorf("TUNSETIFF: %w", err)
	}
	l, err := netlink.LinkByName("srtun0")
	if err == nil {
		err = netlink.LinkSetUp(l)
	}
	if err == nil {
		var a *netlink.Addr
		a, err = netlink.ParseAddr("198.18.0.1/24")
		if err == nil {
			err = netlink.AddrAdd(l, a)
		}
	}
	if err != nil {
		unix.Close(fd)
		return -1, netip.Addr{}, err
	}
	return fd, netip.MustParseAddr("198.18.0.1"), nil
}

// TestUDPGSOSegmentIPv4IDs records what IDs the kernel gives the segments of one GSO send from an
// unconnected DF socket, read back from a tun device in a private netns: the first segment
// carries 0 and the rest count upward. That is why GSOAuto keeps GSO off for IPv4.
func TestUDPGSOSegmentIPv4IDs(t *testing.T) {
	inNetns(t, func() error {
		fd, local, err := openTun()
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		l, err := Listen(Options{Addrs: []netip.Addr{local}, AnyPort: true, GSO: GSOOn})
		if err != nil {
			return err
		}
		defer l.Close()
		src := l.LocalAddrPorts()[0]
		dst := netip.MustParseAddrPort("198.18.0.2:4791")
		const segs, size = 8, 1000
		batch := make([]link.Datagram, segs+2)
		for i := range batch {
			batch[i] = link.Datagram{Buf: make([]byte, size), Src: src, Dst: dst}
		}
		batch[segs].Buf = batch[segs].Buf[:300] // a shorter last segment ends the GSO message
		batch[segs+1].Dst = netip.MustParseAddrPort("198.18.0.2:4792")
		if err := l.Send(batch); err != nil {
			return err
		}
		st := statsOf(l)
		if st.GSOSends != 1 || st.Sent != segs+2 || st.Fallbacks != 0 {
			return fmt.Errorf("stats %+v: want one GSO send of %d datagrams, %d sent, no fallback", st, segs+1, segs+2)
		}
		got, err := readMatching(fd, false, src, dst, segs+1)
		if err != nil {
			return err
		}
		for i, h := range got {
			want := size
			if i == segs {
				want = 300
			}
			if h.payloadLen != want || !h.df {
				return fmt.Errorf("segment %d: payload %d DF %v, want %d with DF", i, h.payloadLen, h.df, want)
			}
			if h.id != uint16(i) {
				return fmt.Errorf("segment %d: IPv4 ID %d, want %d (first ID 0, counting up)", i, h.id, i)
			}
		}
		// The plain send after the GSO message (another peer) is back at ID 0.
		other, err := readMatching(fd, false, src, batch[segs+1].Dst, 1)
		if err != nil {
			return err
		}
		if other[0].id != 0 {
			return fmt.Errorf("plain send after GSO: ID %d, want 0", other[0].id)
		}
		return nil
	})
}

func closeFD(fd int) { unix.Close(fd) }
