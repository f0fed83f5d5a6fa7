package roce

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/netnstest"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestZeroUDPChecksum6: kernel rxe (and RDMA NICs) send RoCEv2 over IPv6 with UDP checksum 0
// (the ICRC protects the packet, IBTA Vol 1 Annex A17.3.3); Linux drops such datagrams before
// an IPv6 UDP socket unless it set UDP_NO_CHECK6_RX (docs/link.md). Two namespaces on a veth
// pair, 2001:db8:6::1 and ::2: a raw IPv6 socket in the first sends three UD SEND Only
// packets with the same valid ICRC (the UDP checksum is masked out of it) to a device in the
// second — UDP checksum 0, then a wrong non-zero checksum, then the right one. The device must
// complete the first and the third, in order, and never the second, which the kernel drops and
// counts in Udp6InCsumErrors. Every receive path: the fast path (GRO, views), plain recvmmsg,
// and the portable sockets.
func TestZeroUDPChecksum6(t *testing.T) {
	x, y := netnstest.Veth(t, "cs0", "198.18.6.1/24", "cs1", "198.18.6.2/24", 1500)
	a6, b6 := netip.MustParseAddr("2001:db8:6::1"), netip.MustParseAddr("2001:db8:6::2")
	addr6 := func(ifname string, a netip.Addr) func() error {
		return func() error {
			l, err := netlink.LinkByName(ifname)
			if err != nil {
				return err
			}
			// no duplicate address detection: the address is usable at once
			return netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD})
		}
	}
	if err := x.Do(addr6("cs0", a6)); err != nil {
		t.Fatal(err)
	}
	if err := y.Do(addr6("cs1", b6)); err != nil {
		t.Fatal(err)
	}
	var raw int
	if err := x.Do(func() (err error) {
		raw, err = unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(raw) })

	for _, v := range []struct {
		name string
		o    UDPOptions
	}{
		{"fast-path", UDPOptions{}},
		{"plain", UDPOptions{FastPath: FastPathOptions{Disable: true}}},
		{"portable", UDPOptions{Portable: true}},
	} {
		t.Run(v.name, func(t *testing.T) {
			o := v.o
			o.Addrs = []netip.Addr{b6}
			var d *Device
			if err := y.Do(func() (err error) { d, err = OpenUDP(o); return err }); err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			e := newEnd(t, d, qp.TypeUD, 1<<20)
			udUp(t, e, 0x42)
			for i := range 3 {
				postRecv(t, e, qp.RecvWR{WRID: uint64(i), SGL: []qp.SGE{e.sge(i*4096, 4096)}})
			}
			var before uint64
			if err := y.Do(func() (err error) { before, err = udp6CsumErrors(); return err }); err != nil {
				t.Fatal(err)
			}
			src := netip.AddrPortFrom(a6, 0xC123)
			dst := netip.AddrPortFrom(b6, bth.UDPPort)
			for _, p := range []struct {
				payload string
				sum     func(udp []byte) uint16
			}{
				{"zero checksum", func([]byte) uint16 { return 0 }},
				{"wrong checksum", func(u []byte) uint16 { return udp6Checksum(a6, b6, u) ^ 0x0101 }},
				{"right checksum", func(u []byte) uint16 { return udp6Checksum(a6, b6, u) }},
			} {
				roce := udPacket(src, dst, e.qp.Num(), 0x42, []byte(p.payload), 0)
				u := make([]byte, 8+len(roce))
				binary.BigEndian.PutUint16(u[0:], src.Port())
				binary.BigEndian.PutUint16(u[2:], dst.Port())
				binary.BigEndian.PutUint16(u[4:], uint16(len(u)))
				copy(u[8:], roce)
				binary.BigEndian.PutUint16(u[6:], p.sum(u))
				if err := unix.Sendto(raw, u, 0, &unix.SockaddrInet6{Addr: b6.As16()}); err != nil {
					t.Fatalf("%s: %v", p.payload, err)
				}
			}
			wcs := waitWC(t, e.rcq, 2)
			for i, want := range []string{"zero checksum", "right checksum"} {
				checkWC(t, wcs[i], cq.WC{WRID: uint64(i), Opcode: cq.OpRecv, ByteLen: uint32(40 + len(want)), Flags: cq.FlagGRH, SrcQP: 0x77})
				if got := string(e.buf[i*4096+40 : i*4096+40+len(want)]); got != want {
					t.Fatalf("completion %d carries %q, want %q", i, got, want)
				}
			}
			var after uint64
			if err := y.Do(func() (err error) { after, err = udp6CsumErrors(); return err }); err != nil {
				t.Fatal(err)
			}
			if after-before != 1 {
				t.Fatalf("Udp6InCsumErrors went from %d to %d, want one drop (the wrong checksum)", before, after)
			}
			if s := d.Stats(); s.RcvdPkts != 2 || s.RcvdDropped != 0 {
				t.Fatalf("device counters: received %d, dropped %d; want 2 and 0", s.RcvdPkts, s.RcvdDropped)
			}
		})
	}
}

// udp6Checksum is the UDP checksum of datagram u (its checksum field 0) from src to dst over
// IPv6 (RFC 8200 8.1: the pseudo-header of addresses, length and next header 17; a sum of 0 is
// sent as 0xFFFF).
func udp6Checksum(src, dst netip.Addr, u []byte) uint16 {
	var sum uint32
	add := func(b []byte) {
		for i := 0; i+1 < len(b); i += 2 {
			sum += uint32(b[i])<<8 | uint32(b[i+1])
		}
		if len(b)%2 == 1 {
			sum += uint32(b[len(b)-1]) << 8
		}
	}
	s, d := src.As16(), dst.As16()
	add(s[:])
	add(d[:])
	var ph [8]byte
	binary.BigEndian.PutUint32(ph[:4], uint32(len(u)))
	ph[7] = unix.IPPROTO_UDP
	add(ph[:])
	add(u)
	for sum>>16 != 0 {
		sum = sum&0xFFFF + sum>>16
	}
	if c := ^uint16(sum); c != 0 {
		return c
	}
	return 0xFFFF
}

// udp6CsumErrors reads Udp6InCsumErrors of the calling thread's network namespace.
func udp6CsumErrors() (uint64, error) {
	f, err := os.Open("/proc/thread-self/net/snmp6")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), " "); ok && k == "Udp6InCsumErrors" {
			var n uint64
			_, err := fmt.Sscan(strings.TrimSpace(v), &n)
			return n, err
		}
	}
	return 0, fmt.Errorf("snmp6: no Udp6InCsumErrors")
}
