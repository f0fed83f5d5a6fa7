//go:build linux

// Package netnstest gives tests network namespaces of their own (root only): a locked OS
// thread inside a fresh namespace that runs the test's functions there (sockets, links and
// XDP programs opened in it stay in that namespace), and two such namespaces joined by a veth
// pair. Tests use 198.18.0.0/15 addresses inside them and never reach any other network.
package netnstest

import (
	"fmt"
	"os"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Thread is a locked OS thread in a fresh network namespace.
type Thread struct {
	fns chan func()
	// NsFD is a descriptor of the namespace (netlink.LinkSetNsFd).
	NsFD int
}

// NewThread starts a Thread; it skips the test unless it runs as root. The thread and the
// namespace go away at the test's cleanup.
func NewThread(tb testing.TB) *Thread {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root (network namespace)")
	}
	n := &Thread{fns: make(chan func())}
	ready := make(chan error)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ready <- fmt.Errorf("unshare: %w", err)
			return
		}
		fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		n.NsFD = fd
		ready <- err
		if err != nil {
			return
		}
		for f := range n.fns {
			f()
		}
	}()
	if err := <-ready; err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { close(n.fns); unix.Close(n.NsFD) })
	return n
}

// Do runs f on the thread, in its namespace, and returns f's error.
func (n *Thread) Do(f func() error) error {
	done := make(chan error)
	n.fns <- func() { done <- f() }
	return <-done
}

// Veth makes two namespaces joined by a veth pair of the given MTU: interface nameA with
// address cidrA in x, nameB with cidrB in y, both up (and each namespace's lo).
func Veth(tb testing.TB, nameA, cidrA, nameB, cidrB string, mtu int) (x, y *Thread) {
	tb.Helper()
	x = NewThread(tb)
	y = NewThread(tb)
	if err := x.Do(func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: nameA, MTU: mtu}, PeerName: nameB}); err != nil {
			return fmt.Errorf("veth: %w", err)
		}
		b, err := netlink.LinkByName(nameB)
		if err == nil {
			err = netlink.LinkSetNsFd(b, y.NsFD)
		}
		if err != nil {
			return err
		}
		return up(nameA, cidrA, mtu)
	}); err != nil {
		tb.Fatal(err)
	}
	if err := y.Do(func() error { return up(nameB, cidrB, mtu) }); err != nil {
		tb.Fatal(err)
	}
	return x, y
}

// up brings lo and the interface up, with the address and MTU.
func up(name, cidr string, mtu int) error {
	lo, err := netlink.LinkByName("lo")
	if err == nil {
		err = netlink.LinkSetUp(lo)
	}
	if err != nil {
		return err
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(l, a); err != nil {
		return err
	}
	if err := netlink.LinkSetMTU(l, mtu); err != nil {
		return err
	}
	return netlink.LinkSetUp(l)
}

// KernelAtLeast reports whether the running kernel's release is major.minor or later (from
// uname; a release it cannot read fails the test).
func KernelAtLeast(tb testing.TB, major, minor int) bool {
	tb.Helper()
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		tb.Fatal(err)
	}
	var ma, mi int
	if _, err := fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &ma, &mi); err != nil {
		tb.Fatalf("kernel release %q: %v", unix.ByteSliceToString(u.Release[:]), err)
	}
	return ma > major || ma == major && mi >= minor
}
