package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// pairSock is the experiment behind -pairsock: a UDP socket connected to the peer (the kernel
// keeps the route: no lookup per send) that sends the pair as one UDP GSO message. With DF a
// connected socket numbers IPv4 IDs from a random start (the ICRC covers the ID), so the ID is
// learnt first from looped-back software transmit timestamps of sends to ourselves.
type pairSock struct {
	fd      int
	id      uint16 // the ID the next send's first segment gets
	perSend uint16 // how far one GSO send moves it (1 or the segment count)
	oob     []byte
	local   netip.AddrPort
}

const (
	sofTxSoftware = 1 << 1
	sofSoftware   = 1 << 4
)

func newPairSock(local netip.Addr, lport int, peer netip.Addr, port int) (*pairSock, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	p := &pairSock{fd: fd}
	fail := func(what string, err error) (*pairSock, error) {
		unix.Close(fd)
		return nil, fmt.Errorf("pair socket %s: %w", what, err)
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO); err != nil {
		return fail("DF", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: local.As4(), Port: lport}); err != nil {
		return fail("bind", err)
	}
	sa, _ := unix.Getsockname(fd)
	p.local = netip.AddrPortFrom(local, uint16(sa.(*unix.SockaddrInet4).Port))
	if err := unix.Connect(fd, &unix.SockaddrInet4{Addr: peer.As4(), Port: port}); err != nil {
		return fail("connect", err)
	}
	// learn: plain send, GSO send of 2, plain send, all to ourselves (a port nobody reads)
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPING, sofTxSoftware|sofSoftware); err != nil {
		return fail("SO_TIMESTAMPING", err)
	}
	self := &unix.SockaddrInet4{Addr: local.As4(), Port: int(p.local.Port())}
	var ids [3]uint16
	for i := range ids {
		buf := make([]byte, 8)
		var oob []byte
		if i == 1 {
			buf = make([]byte, 12)
			oob = gsoCmsg(8)
		}
		if err := unix.Sendmsg(fd, buf, oob, self, 0); err != nil {
			return fail("learning send", err)
		}
		id, err := loopedID(fd)
		if err != nil {
			return fail("learning read", err)
		}
		ids[i] = id
	}
	if ids[1] != ids[0]+1 || (ids[2] != ids[1]+1 && ids[2] != ids[1]+2) {
		return fail("learning", fmt.Errorf("IDs %v do not count", ids))
	}
	p.perSend = ids[2] - ids[1]
	p.id = ids[2] + 1
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPING, 0); err != nil {
		return fail("SO_TIMESTAMPING off", err)
	}
	p.oob = gsoCmsg(0)
	return p, nil
}

func gsoCmsg(seg int) []byte {
	oob := make([]byte, unix.CmsgSpace(2))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
	h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	*(*uint16)(unsafe.Pointer(&oob[unix.CmsgLen(0)])) = uint16(seg)
	return oob
}

// loopedID reads the socket's error queue: the looped-back packet of its last send, from the
// link-layer header on (lo: 14 bytes), and returns its IPv4 ID.
func loopedID(fd int) (uint16, error) {
	buf := make([]byte, 256)
	oob := make([]byte, 512)
	for range 1000 {
		n, _, _, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_ERRQUEUE|unix.MSG_DONTWAIT)
		if err == unix.EAGAIN {
			continue
		}
		if err != nil {
			return 0, err
		}
		if n < 14+20 || buf[14]>>4 != 4 {
			return 0, fmt.Errorf("looped packet of %d bytes % x", n, buf[:min(n, 40)])
		}
		return binary.BigEndian.Uint16(buf[18:20]), nil
	}
	return 0, errors.New("no looped packet")
}

func (p *pairSock) send(buf []byte, seg int) error {
	*(*uint16)(unsafe.Pointer(&p.oob[unix.CmsgLen(0)])) = uint16(seg)
	err := unix.Sendmsg(p.fd, buf, p.oob, nil, 0)
	if err == nil {
		p.id += p.perSend
	}
	return err
}
