package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// pktSock is the experiment behind -pkttx: the pair sent as ONE Ethernet frame through an
// AF_PACKET socket with a virtio-net header asking for UDP GSO (VIRTIO_NET_HDR_GSO_UDP_L4).
// The kernel takes one skb through the device (veth passes GSO skbs on whole; a UDP socket
// receiver or a NIC cuts the segments, each segment k with IPv4 ID id+k), so unlike a UDP
// socket's GSO message there is no route lookup and the IPv4 ID is ours to choose (the ICRC
// covers it). PACKET_QDISC_BYPASS skips the qdisc as the AF_XDP transmit path does.
type pktSock struct {
	fd    int
	frame []byte // virtio_net_hdr (10) + Ethernet (14) + IPv4 (20) + UDP (8) + payload
	to    unix.RawSockaddrLinklayer
	src   [4]byte
	dst   [4]byte
	sport uint16
	dport uint16
	id    uint16
}

const vnetHdrLen = 10 // struct virtio_net_hdr (no num_buffers)

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// newPktSock opens the socket on local's interface; the peer's MAC comes from the neighbour
// table (the caller sends through the ring first, which resolves it).
func newPktSock(local netip.Addr, sport uint16, peer netip.Addr, dport uint16) (*pktSock, error) {
	ifi, err := ifaceOf(local)
	if err != nil {
		return nil, err
	}
	ns, err := netlink.NeighList(ifi.Index, unix.AF_INET)
	if err != nil {
		return nil, err
	}
	var mac net.HardwareAddr
	for _, n := range ns {
		if a, ok := netip.AddrFromSlice(n.IP.To4()); ok && a == peer && len(n.HardwareAddr) == 6 {
			mac = n.HardwareAddr
		}
	}
	if mac == nil {
		return nil, fmt.Errorf("no neighbour entry for %v on %s", peer, ifi.Name)
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0) // protocol 0: send only
	if err != nil {
		return nil, err
	}
	for _, o := range [][2]int{{unix.PACKET_VNET_HDR, 1}, {unix.PACKET_QDISC_BYPASS, 1}} {
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, o[0], o[1]); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("setsockopt %d: %w", o[0], err)
		}
	}
	p := &pktSock{fd: fd, src: local.As4(), dst: peer.As4(), sport: sport, dport: dport}
	p.to.Family = unix.AF_PACKET
	p.to.Protocol = htons(unix.ETH_P_IP)
	p.to.Ifindex = int32(ifi.Index)
	p.to.Halen = 6
	for i := range 6 {
		p.to.Addr[i] = mac[i]
	}
	p.frame = make([]byte, vnetHdrLen+42+2048)
	e := p.frame[vnetHdrLen:]
	copy(e[0:6], mac)
	copy(e[6:12], ifi.HardwareAddr)
	e[12], e[13] = 0x08, 0x00
	return p, nil
}

func ifaceOf(a netip.Addr) (*net.Interface, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	for i := range ifs {
		as, _ := ifs[i].Addrs()
		for _, x := range as {
			if n, ok := x.(*net.IPNet); ok {
				if b, ok := netip.AddrFromSlice(n.IP.To4()); ok && b == a {
					return &ifs[i], nil
				}
			}
		}
	}
	return nil, errors.New("no interface holds " + a.String())
}

// send sends payload (segments of seg bytes, the last one shorter) as one GSO frame.
func (p *pktSock) send(payload []byte, seg int) error {
	v := p.frame[:vnetHdrLen]
	v[0] = unix.VIRTIO_NET_HDR_F_NEEDS_CSUM
	v[1] = unix.VIRTIO_NET_HDR_GSO_UDP_L4
	binary.LittleEndian.PutUint16(v[2:], 42)          // hdr_len
	binary.LittleEndian.PutUint16(v[4:], uint16(seg)) // gso_size
	binary.LittleEndian.PutUint16(v[6:], 34)          // csum_start: the UDP header
	binary.LittleEndian.PutUint16(v[8:], 6)           // csum_offset: its checksum
	e := p.frame[vnetHdrLen:]
	ip := e[14:34]
	ulen := 8 + len(payload)
	ip[0], ip[1] = 0x45, 0
	binary.BigEndian.PutUint16(ip[2:], uint16(20+ulen))
	binary.BigEndian.PutUint16(ip[4:], p.id)
	ip[6], ip[7] = 0x40, 0 // DF
	ip[8], ip[9] = 64, unix.IPPROTO_UDP
	ip[10], ip[11] = 0, 0
	copy(ip[12:16], p.src[:])
	copy(ip[16:20], p.dst[:])
	var s uint32
	for i := 0; i < 20; i += 2 {
		s += uint32(ip[i])<<8 | uint32(ip[i+1])
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(s))
	u := e[34:42]
	binary.BigEndian.PutUint16(u[0:], p.sport)
	binary.BigEndian.PutUint16(u[2:], p.dport)
	binary.BigEndian.PutUint16(u[4:], uint16(ulen))
	// CHECKSUM_PARTIAL: the field holds the pseudo-header sum (not complemented)
	s = uint32(p.src[0])<<8 | uint32(p.src[1])
	s += uint32(p.src[2])<<8 | uint32(p.src[3])
	s += uint32(p.dst[0])<<8 | uint32(p.dst[1])
	s += uint32(p.dst[2])<<8 | uint32(p.dst[3])
	s += unix.IPPROTO_UDP + uint32(ulen)
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	binary.BigEndian.PutUint16(u[6:], uint16(s))
	n := copy(e[42:], payload)
	f := p.frame[:vnetHdrLen+42+n]
	_, _, errno := unix.Syscall6(unix.SYS_SENDTO, uintptr(p.fd), uintptr(unsafe.Pointer(&f[0])), uintptr(len(f)), 0,
		uintptr(unsafe.Pointer(&p.to)), unsafe.Sizeof(p.to))
	if errno != 0 {
		return errno
	}
	p.id += 2
	return nil
}
