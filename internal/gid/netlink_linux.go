package gid

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// FromInterface builds the table of the named interface from netlink: its MAC, MTU and
// addresses (IPv4 then IPv6, in the kernel's order).
func FromInterface(name string) (*Table, error) {
	return fromInterface(nil, name)
}

func fromInterface(h *netlink.Handle, name string) (*Table, error) {
	var (
		l   netlink.Link
		err error
	)
	if h != nil {
		l, err = h.LinkByName(name)
	} else {
		l, err = netlink.LinkByName(name)
	}
	if err != nil {
		return nil, fmt.Errorf("gid: interface %q: %w", name, err)
	}
	var as []netlink.Addr
	if h != nil {
		as, err = h.AddrList(l, netlink.FAMILY_ALL)
	} else {
		as, err = netlink.AddrList(l, netlink.FAMILY_ALL)
	}
	if err != nil {
		return nil, fmt.Errorf("gid: addresses of %q: %w", name, err)
	}
	attrs := l.Attrs()
	o := Options{MAC: attrs.HardwareAddr, MTU: attrs.MTU}
	for _, a := range as {
		if a.Flags&unix.IFA_F_TENTATIVE != 0 || a.Flags&unix.IFA_F_DADFAILED != 0 {
			continue // not usable yet (DAD), as ib_core waits for it
		}
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			if ip = ip.Unmap(); ip.Is6() && ip.IsLinkLocalUnicast() {
				ip = ip.WithZone(name) // bindable on this interface
			}
			o.Addrs = append(o.Addrs, ip)
		}
	}
	t := FromAddrs(o)
	t.Name, t.IfIndex = name, attrs.Index
	if o.MTU == 0 {
		t.NetdevMTU = 0
	}
	return t, nil
}

// WatchOptions configure Watch.
type WatchOptions struct {
	// Name is the interface to follow.
	Name string
	// Done stops the watch when closed.
	Done <-chan struct{}
	// OnChange receives a fresh Table after every address change (and once at start).
	OnChange func(*Table)
	// OnError receives netlink errors (the watch keeps going); nil ignores them.
	OnError func(error)
	// Handle, if set, is the netlink handle (e.g. of another network namespace).
	Handle *netlink.Handle
	// Namespace, if set, is the namespace the subscription is opened in (use with a Handle
	// of the same namespace).
	Namespace *netns.NsHandle
}

// Watch follows address changes on an interface (netlink.AddrSubscribe) and calls OnChange with
// the rebuilt table, like ib_core's roce_gid_mgmt reacting to inetaddr/inet6addr events. It
// returns after sending the initial table; the watch runs until Done is closed.
// The returned function waits until the watch goroutine has exited (call it after closing Done).
func Watch(o WatchOptions) (wait func(), err error) {
	t, err := fromInterface(o.Handle, o.Name)
	if err != nil {
		return nil, err
	}
	o.OnChange(t)
	updates := make(chan netlink.AddrUpdate, 64)
	done := make(chan struct{})
	opt := netlink.AddrSubscribeOptions{ErrorCallback: o.OnError}
	opt.Namespace = o.Namespace
	if err := netlink.AddrSubscribeWithOptions(updates, done, opt); err != nil {
		return nil, fmt.Errorf("gid: subscribe: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		defer func() {
			close(done)
			for range updates { // the subscription closes it after done
			}
		}()
		for {
			select {
			case <-o.Done:
				return
			case u, ok := <-updates:
				if !ok {
					return
				}
				if u.LinkIndex != t.IfIndex {
					continue
				}
				nt, err := fromInterface(o.Handle, o.Name)
				if err != nil {
					if o.OnError != nil {
						o.OnError(err)
					}
					continue
				}
				t = nt
				o.OnChange(t)
			}
		}
	}()
	return func() { <-exited }, nil
}
