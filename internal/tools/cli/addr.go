package cli

// Address parsing, name resolution and the out-of-band TCP dial shared by the tools: the one
// place that turns a command line's host or address into a netip value.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"syscall"
	"time"

	"github.com/softroce/softroce/internal/oob"
)

// Errors wrapped by the helpers of this package (and by the tools, for their own usage and
// timeout errors).
var (
	// ErrUsage: a bad command line.
	ErrUsage = errors.New("usage")
	// ErrTimeout: a bounded wait (connection, name lookup, peer) ran out.
	ErrTimeout = errors.New("timed out")
	// ErrAddr: an address that cannot be a RoCEv2 GID or a peer.
	ErrAddr = errors.New("bad address")
)

// ParseAddr parses a literal IP address usable as a RoCEv2 GID or a peer: IPv4, IPv6, or an
// IPv4-mapped IPv6 address as a GID is written (returned unmapped, IBTA A17.8). A link-local
// IPv6 address may name its interface as a zone (fe80::1%eth0: binding it needs one; the GID
// is the address without it). Unspecified and multicast addresses, and zones on any other
// address, are refused.
func ParseAddr(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%w %q: not an IP address", ErrAddr, s)
	}
	if a.IsUnspecified() || a.IsMulticast() {
		return netip.Addr{}, fmt.Errorf("%w %q: a RoCEv2 GID needs a unicast address", ErrAddr, s)
	}
	if a.Zone() != "" && !(a.Is6() && a.IsLinkLocalUnicast()) {
		return netip.Addr{}, fmt.Errorf("%w %q: only a link-local IPv6 address takes a zone", ErrAddr, s)
	}
	return a.Unmap(), nil
}

// ParseIP parses a literal IP address as the rdma_cm tools take one for -a, -b, -s and -I:
// as ParseAddr, but the unspecified address (a listener's wildcard, rping's "-a ::0") is
// allowed.
func ParseIP(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err == nil && a.IsUnspecified() {
		return a.Unmap(), nil
	}
	return ParseAddr(s)
}

// ParseAddrPort parses ADDR[:PORT] (IPv6 as [ADDR]:PORT, or a bare IPv6 address): the address
// as ParseAddr, the port def when none is written.
func ParseAddrPort(s string, def uint16) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		a, err := ParseAddr(ap.Addr().String())
		if err != nil {
			return netip.AddrPort{}, err
		}
		return netip.AddrPortFrom(a, ap.Port()), nil
	}
	if a, err := ParseAddr(s); err == nil {
		return netip.AddrPortFrom(a, def), nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%w %q: not ADDR[:PORT]", ErrAddr, s)
	}
	a, err := ParseAddr(host)
	if err != nil {
		return netip.AddrPort{}, err
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%w %q: bad port", ErrAddr, s)
	}
	return netip.AddrPortFrom(a, uint16(p)), nil
}

// ResolveHost turns a SERVER argument into an address: a literal (ParseAddr), or the first
// result of a name lookup (IPv4 preferred), bounded by timeout.
func ResolveHost(ctx context.Context, host string, timeout time.Duration) (netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return a.Unmap(), nil
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	as, err := net.DefaultResolver.LookupNetIP(rctx, "ip", host)
	if err != nil || len(as) == 0 {
		return netip.Addr{}, fmt.Errorf("%w: cannot resolve %q: %v", ErrUsage, host, err)
	}
	for _, a := range as {
		if a.Unmap().Is4() {
			return a.Unmap(), nil
		}
	}
	return as[0], nil
}

// AddrOf returns a TCP connection end's address (unmapped), or the zero Addr.
func AddrOf(a net.Addr) netip.Addr {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

// Dial connects to a tool's server over TCP (the out-of-band exchange), retrying while it
// refuses (it may not listen yet), for at most timeout.
func Dial(ctx context.Context, to netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		c, err := oob.Dial(dctx, to.String(), oob.Options{Timeout: timeout})
		if err == nil {
			return c, nil
		}
		if !errors.Is(err, syscall.ECONNREFUSED) || dctx.Err() != nil {
			if dctx.Err() != nil {
				err = fmt.Errorf("%w: %w", ErrTimeout, err)
			}
			return nil, fmt.Errorf("Couldn't connect to %v: %w", to, err)
		}
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-t.C:
		case <-dctx.Done():
			t.Stop()
		}
	}
}
