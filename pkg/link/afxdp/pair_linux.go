package afxdp

// GSO pairs on the AF_XDP path (docs/link.md "AF_XDP path: GSO pairs"). A polled device's
// typical send is a pair: the WRITE the application just posted and the deferred ACK of the
// peer's last WRITE. Through the transmit ring that is two frames, and the kernel delivers
// each at full cost (an skb, the veth, the peer's XDP program, its ring). On a veth the pair
// can instead leave as ONE frame: an AF_PACKET socket with a virtio-net header
// (PACKET_VNET_HDR) asking for UDP GSO (VIRTIO_NET_HDR_GSO_UDP_L4, Linux 6.2 and later). The
// kernel moves one skb; an AF_XDP receiver gets it whole and the device splits it (SegmentSize), a UDP socket receiver (kernel rxe, softroce without AF_XDP) gets the segments
// the kernel cuts from it. Unlike a UDP socket's GSO message there is no route lookup, and the
// IPv4 ID is ours: the frame carries ID 0, and the kernel numbers segment k with ID k — the
// link.RunSender agreement (gsorun.go), under which the engine computed segment 1's ICRC (IBTA
// A17.3.3). Host (6.18) probe: a pair's send 1.0-1.1 us against 1.7-1.8 us for two ring frames,
// the same as one frame (bench/probe -pkttx).
//
// Only on a veth: a NIC may segment in hardware (USO), where the IDs of the segments are the
// NIC's choice and the ICRC of segment 1 could be wrong on the wire. The first refusal of the
// kernel (EINVAL from a kernel before 6.2: the lab guest's 6.1) turns pairs off for good; the
// pair then leaves as two ring frames, its second ICRC rewritten for ID 0, as does a pair whose
// send fails otherwise (ENOBUFS, a downed interface) or that would overtake frames a kick left
// in the ring.

import (
	"encoding/binary"
	"sync/atomic"
	"unsafe"

	"github.com/softroce/softroce/pkg/link"
	"golang.org/x/sys/unix"
)

// vnetHdrLen is the size of struct virtio_net_hdr (no num_buffers), ahead of the frame.
const vnetHdrLen = 10

// xdpPairMax bounds a pair's frame (headers and both datagrams): the receiver's AF_XDP ring
// must take the superframe whole (MaxFrame), and a latency-bound pair is small.
const xdpPairMax = MaxFrame

// openPairs opens the AF_PACKET socket of GSO pairs on the link's interface (a veth): send
// only (protocol 0 registers no receive hook). false leaves pairs off.
func (x *xdpSock) openPairs() bool {
	if x.lk.Type() != "veth" {
		return false
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return false
	}
	// not PACKET_QDISC_BYPASS: its direct transmit drops a frame the kernel must cut itself
	// (a device without UDP segmentation; ENOBUFS), and a veth has no qdisc anyway
	if unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1) != nil {
		unix.Close(fd)
		return false
	}
	x.pfd = fd
	var proto [2]byte
	binary.BigEndian.PutUint16(proto[:], unix.ETH_P_IP) // sll_protocol: network order
	x.pto = unix.RawSockaddrLinklayer{Family: unix.AF_PACKET, Protocol: binary.NativeEndian.Uint16(proto[:]),
		Ifindex: int32(x.lk.Attrs().Index), Halen: 6}
	x.pbuf = make([]byte, vnetHdrLen+xdpPairMax)
	x.pairsOn.Store(true)
	return true
}

// pairSendErr, when set (tests), replaces the sendto of a pair: its error is the kernel's.
var pairSendErr func() unix.Errno

// sendPair sends batch (a request and a response no longer than it, one flow: the engine's
// run of two, its ICRCs computed for IPv4 IDs 0 and 1) as one GSO frame; false: it cannot go
// this way, batch is untouched and goes as frames (after its second ICRC is rewritten for ID 0).
// txmu held, nothing queued.
func (x *xdpSock) sendPair(batch []link.Datagram) bool {
	if len(batch) != 2 || !x.pairsOn.Load() || atomic.LoadUint32(x.tx.cons) != x.txProd {
		// frames a kick left in the ring go first: the ring path's next kick sends them
		return false
	}
	a, b := &batch[0], &batch[1]
	dst := a.Dst.Addr().Unmap()
	la, lb := len(a.Buf), len(b.Buf)
	n := ethIPv4UDP + la + lb
	if a.Src != b.Src || a.Dst != b.Dst || a.TClass != b.TClass || lb == 0 || lb > la || n > xdpPairMax ||
		ethIPv4UDP-14+la > x.mtu || !dst.Is4() || a.Src.Addr().Unmap() != x.addr {
		return false
	}
	d4 := dst.As4()
	mac, ok := x.lookup(d4)
	if !ok {
		return false
	}
	v := x.pbuf[:vnetHdrLen]
	v[0] = unix.VIRTIO_NET_HDR_F_NEEDS_CSUM
	v[1] = unix.VIRTIO_NET_HDR_GSO_UDP_L4
	// the header's 16-bit fields in the host's order (AF_PACKET: a legacy virtio header)
	binary.NativeEndian.PutUint16(v[2:], ethIPv4UDP) // hdr_len
	binary.NativeEndian.PutUint16(v[4:], uint16(la)) // gso_size: the request's length
	binary.NativeEndian.PutUint16(v[6:], 34)         // csum_start: the UDP header
	binary.NativeEndian.PutUint16(v[8:], 6)          // csum_offset: its checksum field
	f := x.pbuf[vnetHdrLen : vnetHdrLen+n]
	x.headers(f, mac, d4, a.TClass, a.Src.Port(), a.Dst.Port()) // ID 0: segment k gets ID k
	ip, u, ul := f[14:34], f[34:42], n-34
	// CHECKSUM_PARTIAL: the field holds the pseudo-header sum, not complemented; the kernel
	// finishes each segment's
	s := uint32(binary.BigEndian.Uint16(ip[12:])) + uint32(binary.BigEndian.Uint16(ip[14:])) +
		uint32(binary.BigEndian.Uint16(ip[16:])) + uint32(binary.BigEndian.Uint16(ip[18:])) +
		unix.IPPROTO_UDP + uint32(ul)
	s = s&0xffff + s>>16
	s = s&0xffff + s>>16
	u[6], u[7] = byte(s>>8), byte(s)
	copy(f[42:], a.Buf)
	copy(f[42+la:], b.Buf)
	var e unix.Errno
	if pairSendErr != nil {
		e = pairSendErr()
	} else {
		_, _, e = unix.RawSyscall6(unix.SYS_SENDTO, uintptr(x.pfd), uintptr(unsafe.Pointer(&x.pbuf[0])),
			uintptr(vnetHdrLen+len(f)), unix.MSG_DONTWAIT, uintptr(unsafe.Pointer(&x.pto)), unsafe.Sizeof(x.pto))
	}
	switch e {
	case 0:
	case unix.EINVAL, unix.EOPNOTSUPP: // refused: a kernel without UDP GSO in virtio-net headers
		x.pairsOn.Store(false)
		x.pairsOff.Add(1)
		return false
	default: // short of buffers, the interface down for a moment...: these two go as frames
		return false
	}
	x.pairs.Add(1)
	x.sent.Add(2)
	x.sendBatches.Add(1)
	return true
}
