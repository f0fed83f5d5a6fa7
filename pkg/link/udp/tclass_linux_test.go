package udp

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/softroce/softroce/pkg/link"
	"golang.org/x/sys/unix"
)

// tosReceiver is a plain UDP socket that reports each datagram's IPv4 TOS or IPv6 Traffic
// Class (IP_RECVTOS / IPV6_RECVTCLASS).
func tosReceiver(t *testing.T, at netip.Addr) *net.UDPConn {
	t.Helper()
	network := "udp4"
	if at.Is6() {
		network = "udp6"
	}
	c, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(netip.AddrPortFrom(at, 0)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		if at.Is6() {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVTCLASS, 1)
		} else {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVTOS, 1)
		}
	}); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	return c
}

// readTOS reads one datagram and returns its first payload byte and its traffic class.
func readTOS(t *testing.T, c *net.UDPConn) (byte, int) {
	t.Helper()
	buf, oob := make([]byte, 2048), make([]byte, 128)
	c.SetReadDeadline(time.Now().Add(5 * time.Second)) // bound on a lost datagram, not a sleep
	n, oobn, _, _, err := c.ReadMsgUDPAddrPort(buf, oob)
	if err != nil || n == 0 {
		t.Fatalf("read: %d bytes, %v", n, err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if (m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_TOS && len(m.Data) >= 1) ||
			(m.Header.Level == unix.IPPROTO_IPV6 && m.Header.Type == unix.IPV6_TCLASS && len(m.Data) >= 4) {
			if m.Header.Level == unix.IPPROTO_IPV6 {
				return buf[0], int(int32(binary.NativeEndian.Uint32(m.Data)))
			}
			return buf[0], int(m.Data[0])
		}
	}
	t.Fatalf("no traffic class control message (%d bytes)", oobn)
	return 0, 0
}

// TestSendTClass: link.Datagram.TClass reaches the wire as the IPv4 TOS / IPv6 Traffic Class byte
// (IBTA A17.4.5) on every send path - plain sendmmsg, GSO groups (which must not merge
// datagrams of different classes) and SendRuns - and 0 leaves the socket's default (0).
func TestSendTClass(t *testing.T) {
	classes := []uint8{0x48, 0x48, 0x48, 0, 0, 0xB8, 0xB8, 0x48}
	for _, c := range []struct {
		name string
		addr netip.Addr
		gso  GSOMode
		runs bool
	}{
		{"ipv4", netip.MustParseAddr("127.0.0.1"), GSOOff, false},
		{"ipv4-gso", netip.MustParseAddr("127.0.0.1"), GSOOn, false},
		{"ipv4-runs", netip.MustParseAddr("127.0.0.1"), GSOOn, true},
		{"ipv6-gso", netip.MustParseAddr("::1"), GSOOn, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			l, err := Listen(Options{Addrs: []netip.Addr{c.addr}, AnyPort: true, GSO: c.gso})
			if err != nil {
				t.Skip("no socket on", c.addr, err)
			}
			defer l.Close()
			rx := tosReceiver(t, c.addr)
			dst := rx.LocalAddr().(*net.UDPAddr).AddrPort()
			src := netip.AddrPortFrom(c.addr, l.SourcePort(c.addr, 0xC000))
			batch := make([]link.Datagram, len(classes))
			for i, tc := range classes {
				b := make([]byte, 600) // equal sizes: GSO would group them all
				b[0] = byte(i)
				batch[i] = link.Datagram{Buf: b, Src: src, Dst: dst, TClass: tc}
			}
			if c.runs {
				// runs as the engine forms them: one per class change
				err = l.SendRuns(batch, []uint8{3, 2, 2, 1})
			} else {
				err = l.Send(batch)
			}
			if err != nil {
				t.Fatal(err)
			}
			var got, want []string
			for i, tc := range classes {
				seq, class := readTOS(t, rx)
				got = append(got, fmt.Sprintf("%d:%#x", seq, class))
				want = append(want, fmt.Sprintf("%d:%#x", i, tc))
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("datagram:class on the wire %v, want %v", got, want)
			}
		})
	}
}
