package udp

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The control buffer of one sent message holds up to two cmsgs: UDP_SEGMENT (GSO) and the
// traffic class (IP_TOS for an IPv4 destination, IPV6_TCLASS for IPv6; Linux accepts both as
// ancillary data on sendmsg, ip_cmsg_send / ip6_datagram_send_ctl).
var (
	segSpace     = unix.CmsgSpace(2)
	tclassSpace  = unix.CmsgSpace(4)
	sendCtlSpace = segSpace + tclassSpace
)

// putControl points h at message m's part of ctl (sendCtlSpace bytes per message) holding a
// UDP_SEGMENT cmsg of seg when seg > 0 and a traffic-class cmsg when tclass != 0 (IBTA A17.4.5:
// the GRH TClass is carried in the IP header). Without either, h has no control data.
func putControl(h *unix.Msghdr, ctl []byte, m int, seg int, tclass uint8, dst6 bool) {
	h.Control, h.Controllen = nil, 0
	c := ctl[m*sendCtlSpace : (m+1)*sendCtlSpace]
	n := 0
	if seg > 0 {
		ch := (*unix.Cmsghdr)(unsafe.Pointer(&c[0]))
		ch.Level, ch.Type = unix.SOL_UDP, unix.UDP_SEGMENT
		ch.SetLen(unix.CmsgLen(2))
		*(*uint16)(unsafe.Pointer(&c[unix.CmsgLen(0)])) = uint16(seg)
		n = segSpace
	}
	if tclass != 0 {
		ch := (*unix.Cmsghdr)(unsafe.Pointer(&c[n]))
		if dst6 {
			ch.Level, ch.Type = unix.IPPROTO_IPV6, unix.IPV6_TCLASS
		} else {
			ch.Level, ch.Type = unix.IPPROTO_IP, unix.IP_TOS
		}
		ch.SetLen(unix.CmsgLen(4))
		*(*int32)(unsafe.Pointer(&c[n+unix.CmsgLen(0)])) = int32(tclass)
		n += tclassSpace
	}
	if n > 0 {
		h.Control = &c[0]
		h.SetControllen(n)
	}
}
