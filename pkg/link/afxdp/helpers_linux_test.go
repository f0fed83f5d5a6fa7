package afxdp

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/internal/linktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func recvN(t testing.TB, l link.Link, n, batch int) []link.Datagram {
	t.Helper()
	return linktest.RecvN(t, l, n, batch)
}

func recvBufs(n int) []link.Datagram { return linktest.RecvBufs(n) }

// The sniffers check what Linux writes in the headers of the ring's frames, which the ICRC
// covers (IBTA A17.3.3) and a socket cannot see. They need root (AF_PACKET, netns).

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

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// mkRun builds n RoCE datagrams (UD SEND ONLY, distinct payloads) of size bytes (the last
// lastSize) from src to dst with the ICRC of datagram k computed for IPv4 ID k, as the engine
// does for a GSO run.
func mkRun(src, dst netip.AddrPort, n, size, lastSize int, seed byte) []link.Datagram {
	out := make([]link.Datagram, n)
	for k := range out {
		sz := size
		if k == n-1 {
			sz = lastSize
		}
		pkt := make([]byte, sz)
		bth.BTH(pkt).Encode(&bth.BTHFields{Opcode: bth.OpUDSendOnly, PKey: 0xFFFF, DestQP: 0x12, PSN: bth.PSN(k)})
		for i := bth.BTHSize; i < len(pkt)-bth.ICRCSize; i++ {
			pkt[i] = byte(i*int(seed+1) + k)
		}
		ep := bth.Endpoints{Src: src.Addr(), Dst: dst.Addr(), SrcPort: src.Port(), DstPort: dst.Port(), IPID: uint16(k)}
		bth.SetICRC(pkt, bth.ICRC(&ep, pkt))
		out[k] = link.Datagram{Buf: pkt, Src: src, Dst: dst}
	}
	return out
}

// checkWire verifies every captured packet's ICRC over its real IPv4 header (IBTA A17.3.3) and
// compares its IPv4 ID and payload with what was sent.
func checkWire(got []ipv4UDP, sent []link.Datagram, wantID func(i int) uint16) error {
	if len(got) != len(sent) {
		return fmt.Errorf("captured %d packets, sent %d", len(got), len(sent))
	}
	for i, h := range got {
		c, err := bth.ICRCFromIP(h.raw)
		if err != nil {
			return err
		}
		if c != bth.GetICRC(sent[i].Buf) {
			return fmt.Errorf("packet %d (ID %d): ICRC over the wire header %#08x, packet carries %#08x", i, h.id, c, bth.GetICRC(sent[i].Buf))
		}
		if h.id != wantID(i) || h.payloadLen != len(sent[i].Buf) {
			return fmt.Errorf("packet %d: ID %d, %d bytes; want ID %d, %d bytes", i, h.id, h.payloadLen, wantID(i), len(sent[i].Buf))
		}
	}
	return nil
}

// testStats are a link's counters under the names the tests use.
type testStats struct {
	link.Stats
	XDPSent, XDPReceived, XDPFallbacks, XDPPairs, XDPPairsOff, XDPWrites uint64
}

func statsOf(l *Link) testStats {
	x := l.XDPStats()
	return testStats{Stats: l.Stats(), XDPSent: x.Sent, XDPReceived: x.Received, XDPFallbacks: x.Fallbacks,
		XDPPairs: x.Pairs, XDPPairsOff: x.PairsOff, XDPWrites: x.Writes}
}
