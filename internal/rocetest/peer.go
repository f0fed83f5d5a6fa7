package rocetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/pkg/bth"
)

// Peer is a raw RoCEv2 endpoint on one UDP socket: it sends crafted packets and receives,
// parses and ICRC-checks what arrives. The socket is unconnected and sends with DF
// (IP_PMTUDISC_DO), so Linux writes IPv4 ID 0 on every packet: the ID Send puts into the
// ICRC (IBTA A17.3.3 covers it). Received IPv4 packets carry the sender's ID, which a UDP
// socket cannot see: Recv recovers it with bth.SolveIPv4ID.
type Peer struct {
	// Conn is the socket (bound to Local).
	Conn *net.UDPConn
	// Local is the bound address (port 4791 to receive from kernel rxe).
	Local netip.AddrPort
	buf   []byte
}

// PeerOptions configure ListenPeer.
type PeerOptions struct {
	// Local is the address to bind; port 0 means bth.UDPPort (4791).
	Local netip.AddrPort
	// NoDF leaves path-MTU discovery at the system default (negative tests of the ID
	// prediction); by default the socket uses IP_PMTUDISC_DO.
	NoDF bool
}

// ListenPeer opens the socket. Call it inside the network namespace the peer must live in.
func ListenPeer(o PeerOptions) (*Peer, error) {
	local := o.Local
	if local.Port() == 0 {
		local = netip.AddrPortFrom(local.Addr(), bth.UDPPort)
	}
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			if !o.NoDF {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
			}
		})
		return errors.Join(err, serr)
	}}
	pc, err := lc.ListenPacket(context.Background(), "udp4", local.String())
	if err != nil {
		return nil, fmt.Errorf("rocetest: listen %v: %w", local, err)
	}
	return &Peer{Conn: pc.(*net.UDPConn), Local: local, buf: make([]byte, 65536)}, nil
}

// Close closes the socket.
func (p *Peer) Close() error { return p.Conn.Close() }

// Endpoints returns the ICRC endpoints of a packet we send to dst (IPv4 ID 0).
func (p *Peer) Endpoints(dst netip.AddrPort) bth.Endpoints {
	return bth.Endpoints{Src: p.Local.Addr(), Dst: dst.Addr(), SrcPort: p.Local.Port(), DstPort: dst.Port()}
}

// Send builds s (ICRC for our endpoints, ID 0) and sends it to dst; it returns the bytes sent.
func (p *Peer) Send(dst netip.AddrPort, s *Spec) ([]byte, error) {
	ep := p.Endpoints(dst)
	pkt, err := s.Append(nil, &ep)
	if err != nil {
		return nil, err
	}
	if _, err := p.Conn.WriteToUDPAddrPort(pkt, dst); err != nil {
		return pkt, fmt.Errorf("rocetest: send: %w", err)
	}
	return pkt, nil
}

// Received is one datagram read by Recv.
type Received struct {
	From netip.AddrPort
	Raw  []byte // the UDP payload (a copy)
	Pkt  bth.Packet
	// IPID is the IPv4 ID recovered from the ICRC (IPv4 only); IDSolved reports success,
	// i.e. that the ICRC matches for some ID (16 of the 32 CRC bits still checked).
	IPID     uint16
	IDSolved bool
}

// ErrBadPacket wraps a datagram that does not parse as RoCEv2.
var ErrBadPacket = errors.New("rocetest: malformed RoCE packet")

// Recv reads one datagram before deadline and parses it. A timeout returns an error
// satisfying errors.Is(err, os.ErrDeadlineExceeded).
func (p *Peer) Recv(deadline time.Time) (*Received, error) {
	if err := p.Conn.SetReadDeadline(deadline); err != nil {
		return nil, err
	}
	n, from, err := p.Conn.ReadFromUDPAddrPort(p.buf)
	if err != nil {
		return nil, err
	}
	r := &Received{From: netip.AddrPortFrom(from.Addr().Unmap(), from.Port()), Raw: append([]byte(nil), p.buf[:n]...)}
	r.Pkt, err = bth.Parse(r.Raw)
	if err != nil {
		return r, fmt.Errorf("%w from %v: %w", ErrBadPacket, r.From, err)
	}
	ep := bth.Endpoints{Src: r.From.Addr(), Dst: p.Local.Addr(), SrcPort: r.From.Port(), DstPort: p.Local.Port()}
	r.IPID, r.IDSolved = bth.SolveIPv4ID(&ep, r.Raw)
	return r, nil
}
