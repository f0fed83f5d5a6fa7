package udp

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/internal/linktest"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func TestUDPDefaults(t *testing.T) {
	l := listenTB(t, Options{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}, AnyPort: true})
	if l.BatchSize() != DefaultBatchSize {
		t.Fatalf("BatchSize %d", l.BatchSize())
	}
	ap := l.LocalAddrPorts()[0]
	// Outside the entropy range 0xC000..0xFFFF the main socket sends (entropy ports:
	// entropy_linux_test.go).
	if ap.Port() == 0 || l.SourcePort(ap.Addr(), 0x1234) != ap.Port() {
		t.Fatalf("SourcePort %d, bound %v: the UDP link must report its bound port", l.SourcePort(ap.Addr(), 0x1234), ap)
	}
	if l.SourcePort(netip.MustParseAddr("127.0.0.9"), 1) != 0 {
		t.Fatal("SourcePort of a foreign address must be 0")
	}
	if l.GSOEnabled(ap.Addr()) {
		t.Fatal("GSOAuto must leave GSO off for IPv4 (segment IDs count up, see docs/link.md)")
	}
	l6 := listenTB(t, Options{Addrs: []netip.Addr{netip.MustParseAddr("::1")}, AnyPort: true})
	if !l6.GSOEnabled(netip.MustParseAddr("::1")) {
		t.Fatal("GSOAuto must turn GSO on for IPv6")
	}
	if got := l.LocalAddrs(); len(got) != 1 || got[0] != ap.Addr() {
		t.Fatalf("LocalAddrs %v", got)
	}
}

func TestUDPBufferSizes(t *testing.T) {
	a := netip.MustParseAddr("127.0.0.1")
	readMax := func(name string) int {
		b, err := os.ReadFile("/proc/sys/net/core/" + name)
		if err != nil {
			t.Skip(err)
		}
		v, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	rmax, wmax := readMax("rmem_max"), readMax("wmem_max")
	plain := listenTB(t, Options{Addrs: []netip.Addr{a}, AnyPort: true, NoForce: true})
	r, w, err := plain.BufferSizes(a)
	if err != nil {
		t.Fatal(err)
	}
	if r != 2*min(DefaultRecvBuf, rmax) || w != 2*min(DefaultSendBuf, wmax) {
		t.Fatalf("NoForce: rcvbuf %d sndbuf %d, want 2*min(default, max) = %d, %d", r, w,
			2*min(DefaultRecvBuf, rmax), 2*min(DefaultSendBuf, wmax))
	}
	if os.Geteuid() == 0 {
		forced := listenTB(t, Options{Addrs: []netip.Addr{a}, AnyPort: true})
		r, w, err := forced.BufferSizes(a)
		if err != nil {
			t.Fatal(err)
		}
		if r != 2*DefaultRecvBuf || w != 2*DefaultSendBuf {
			t.Fatalf("FORCE as root: rcvbuf %d sndbuf %d, want %d, %d", r, w, 2*DefaultRecvBuf, 2*DefaultSendBuf)
		}
	}
	if _, _, err := plain.BufferSizes(netip.MustParseAddr("127.0.0.9")); !errors.Is(err, link.ErrNoLocalAddr) {
		t.Fatalf("foreign address: %v", err)
	}
}

func TestUDPListenErrors(t *testing.T) {
	if _, err := Listen(Options{}); !errors.Is(err, link.ErrInvalidAddr) {
		t.Fatalf("no addresses: %v", err)
	}
	a := netip.MustParseAddr("127.0.0.1")
	if _, err := Listen(Options{Addrs: []netip.Addr{a, a}, AnyPort: true}); !errors.Is(err, link.ErrAddrInUse) {
		t.Fatalf("duplicate address: %v", err)
	}
	l := listenTB(t, Options{Addrs: []netip.Addr{a}, AnyPort: true})
	port := l.LocalAddrPorts()[0].Port()
	if _, err := Listen(Options{Addrs: []netip.Addr{a}, Port: port}); err == nil {
		t.Fatal("binding a port in use must fail")
	}
	// An address not on this host cannot be bound.
	if _, err := Listen(Options{Addrs: []netip.Addr{netip.MustParseAddr("198.18.77.77")}, AnyPort: true}); err == nil {
		t.Fatal("binding a foreign address must fail")
	}
}

func TestUDPFamilyMismatch(t *testing.T) {
	l := listenTB(t, Options{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}, AnyPort: true})
	src := l.LocalAddrPorts()[0]
	err := l.Send([]link.Datagram{{Buf: []byte{1}, Src: src, Dst: netip.MustParseAddrPort("[::1]:4791")}})
	if !errors.Is(err, link.ErrInvalidAddr) {
		t.Fatalf("IPv4 socket to IPv6 peer: %v", err)
	}
}

// TestUDPGSOAndGRO: equal-size datagrams to one peer leave as one UDP_SEGMENT message and, on lo,
// reach a UDP_GRO socket still coalesced; Recv splits them back in order.
func TestUDPGSOAndGRO(t *testing.T) {
	p := genTestPair(t, varUDPGSO)
	a, b := p.A.(*Link), p.B.(*Link)
	if !a.GSOEnabled(p.AAddr.Addr()) || !b.GROEnabled(p.BAddr.Addr()) {
		t.Skip("kernel refused GSO/GRO")
	}
	out := p.MkBatch(20, 1000, 5)
	out = append(out, p.MkBatch(1, 400, 6)...) // a shorter last segment joins the message
	if err := a.Send(out); err != nil {
		t.Fatal(err)
	}
	if s := statsOf(a); s.GSOSends != 1 || s.Sent != 21 || s.SendBatches != 1 {
		t.Fatalf("sender stats %+v: want one GSO message of 21 datagrams", s)
	}
	p.Check(t, out, recvN(t, b, len(out), 8)) // 8 at a time: segments stay pending between calls
	if s := statsOf(b); s.GROReceives != 1 || s.Received != 21 {
		t.Fatalf("receiver stats %+v: want one GRO message split into 21", s)
	}
}

// TestUDPGSOOversizeSegment: on a tun device with MTU 1280, a GSO message whose segments exceed
// the MTU is refused (EMSGSIZE under DF). That is the datagrams' fault, not GSO's: the link resends
// them one by one (each refused again and counted as a drop, not returned as an error) and keeps
// GSO on.
func TestUDPGSOOversizeSegment(t *testing.T) {
	inNetns(t, func() error {
		fd, local, err := openTun()
		if err != nil {
			return err
		}
		defer closeFD(fd)
		lk, err := netlink.LinkByName("srtun0")
		if err == nil {
			err = netlink.LinkSetMTU(lk, 1280)
		}
		if err != nil {
			return err
		}
		l, err := Listen(Options{Addrs: []netip.Addr{local}, AnyPort: true, GSO: GSOOn})
		if err != nil {
			return err
		}
		defer l.Close()
		src := l.LocalAddrPorts()[0]
		dst := netip.MustParseAddrPort("198.18.0.2:4791")
		big := []link.Datagram{{Buf: make([]byte, 1400), Src: src, Dst: dst}, {Buf: make([]byte, 1400), Src: src, Dst: dst}}
		if err := l.Send(big); err != nil {
			return fmt.Errorf("send: %w", err)
		}
		st := statsOf(l)
		if st.Fallbacks != 0 || !l.GSOEnabled(local) || st.Drops != 2 || st.Sent != 0 || st.GSOSends != 0 {
			return fmt.Errorf("stats %+v, GSO %v: want GSO kept on, 2 drops", st, l.GSOEnabled(local))
		}
		small := []link.Datagram{{Buf: make([]byte, 500), Src: src, Dst: dst}, {Buf: make([]byte, 500), Src: src, Dst: dst}}
		if err := l.Send(small); err != nil {
			return err
		}
		if _, err := readMatching(fd, false, src, dst, 2); err != nil {
			return err
		}
		if st := statsOf(l); st.Sent != 2 || st.GSOSends != 1 {
			return fmt.Errorf("after the refused message: %+v, want the next pair sent with GSO", st)
		}
		return nil
	})
}

// TestUDPGSOFallback: a GSO message with more segments than the kernel's UDP_MAX_SEGMENTS (64 or
// 128) is refused with EINVAL; the link turns GSO off for good, counts a fallback and resends the
// datagrams plainly: nothing is lost or reordered.
func TestUDPGSOFallback(t *testing.T) {
	p := genTestPair(t, varUDPGSO)
	a := p.A.(*Link)
	a.maxSegs = 300
	if !a.GSOEnabled(p.AAddr.Addr()) {
		t.Skip("kernel refused GSO")
	}
	out := p.MkBatch(200, 16, 8)
	// BatchSize is 64: let the whole batch of 200 go in one message.
	for _, s := range a.socks {
		s.siov = make([]unix.Iovec, 256)
	}
	if err := a.Send(out); err != nil {
		t.Fatal(err)
	}
	st := statsOf(a)
	if st.Fallbacks != 1 || a.GSOEnabled(p.AAddr.Addr()) || st.Sent != 200 || st.Drops != 0 || st.GSOSends != 0 {
		t.Fatalf("stats %+v GSO %v: want one fallback, GSO off, 200 sent plainly", st, a.GSOEnabled(p.AAddr.Addr()))
	}
	p.Check(t, out, recvN(t, p.B, len(out), 64))
}

// TestUDPMultiAddress: one link on two addresses receives on both and reports which.
func TestUDPMultiAddress(t *testing.T) {
	ip := netip.MustParseAddr
	rx := listenTB(t, Options{Addrs: []netip.Addr{ip("127.0.0.7"), ip("127.0.0.8")}, AnyPort: true})
	tx := listenTB(t, Options{Addrs: []netip.Addr{ip("127.0.0.9")}, AnyPort: true})
	src := tx.LocalAddrPorts()[0]
	dsts := rx.LocalAddrPorts()
	for round := 0; round < 3; round++ {
		for i, d := range dsts {
			if err := tx.Send([]link.Datagram{{Buf: []byte{byte(round), byte(i)}, Src: src, Dst: d}}); err != nil {
				t.Fatal(err)
			}
			got := recvN(t, rx, 1, 4)
			if got[0].Dst != d || got[0].Src != src || got[0].Buf[1] != byte(i) {
				t.Fatalf("round %d: got %v -> %v %v, want to %v", round, got[0].Src, got[0].Dst, got[0].Buf, d)
			}
		}
	}
	// Both sockets ready at once: all four datagrams come through.
	for i, d := range dsts {
		tx.Send([]link.Datagram{{Buf: []byte{9, byte(i)}, Src: src, Dst: d}, {Buf: []byte{9, byte(i)}, Src: src, Dst: d}})
	}
	seen := map[netip.AddrPort]int{}
	for _, g := range recvN(t, rx, 4, 1) {
		seen[g.Dst]++
	}
	if seen[dsts[0]] != 2 || seen[dsts[1]] != 2 {
		t.Fatalf("per-address counts %v", seen)
	}
}

func TestUDPZeroAlloc(t *testing.T) {
	for _, v := range []string{varUDP, varUDPGSO, varMulti} {
		t.Run(v, func(t *testing.T) {
			p := genTestPair(t, v)
			out := p.MkBatch(16, 1100, 1)
			in := recvBufs(16)
			round := func() {
				if err := p.A.Send(out); err != nil {
					t.Fatal(err)
				}
				for got := 0; got < len(out); {
					k, err := p.B.Recv(in)
					if err != nil {
						t.Fatal(err)
					}
					got += k
				}
			}
			round()
			if allocs := testing.AllocsPerRun(50, round); allocs != 0 {
				t.Fatalf("%v allocations per batch of 16, want 0", allocs)
			}
		})
	}
}

// BenchmarkUDP sends windows of datagrams from one goroutine and receives them in another over
// loopback; bytes/s counts payload. A watchdog closes the links if datagrams are lost (the
// benchmark then fails instead of hanging).
func BenchmarkUDP(b *testing.B) {
	for _, size := range []int{1024, 4096} {
		for _, v := range []string{varUDP, varUDPGSO} {
			b.Run(linktest.SizeName(size)+"/"+v, func(b *testing.B) {
				p := genTestPair(b, v)
				const window = 512
				batch := p.A.BatchSize()
				out := p.MkBatch(batch, size, 1)
				in := recvBufs(batch)
				wd := time.AfterFunc(time.Minute, func() { p.A.Close(); p.B.Close() })
				defer wd.Stop()
				b.SetBytes(int64(size))
				b.ReportAllocs()
				b.ResetTimer()
				for sent := 0; sent < b.N; sent += window {
					errc := make(chan error, 1)
					go func() {
						for k := 0; k < window; k += batch {
							if err := p.A.Send(out); err != nil {
								errc <- err
								return
							}
						}
						errc <- nil
					}()
					for got := 0; got < window; {
						k, err := p.B.Recv(in)
						if err != nil {
							b.Fatal("lost datagrams?", err)
						}
						got += k
					}
					if err := <-errc; err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				s := p.A.(link.StatsLink).Stats()
				b.ReportMetric(float64(s.Sent)/float64(max(s.SendBatches, 1)), "dgrams/sendmmsg")
				r := p.B.(link.StatsLink).Stats()
				b.ReportMetric(float64(r.Received)/float64(max(r.RecvBatches, 1)), "dgrams/recv")
			})
		}
	}
}

func FuzzParseControl(f *testing.F) {
	good := make([]byte, groCtlSpace)
	h := (*unix.Cmsghdr)(unsafe.Pointer(&good[0]))
	h.Level, h.Type = unix.SOL_UDP, unix.UDP_GRO
	h.SetLen(unix.CmsgLen(4))
	good[unix.CmsgLen(0)] = 0x10 // 16 on little-endian
	h = (*unix.Cmsghdr)(unsafe.Pointer(&good[unix.CmsgSpace(4)]))
	h.Level, h.Type = unix.IPPROTO_IP, unix.IP_TOS
	h.SetLen(unix.CmsgLen(1))
	good[unix.CmsgSpace(4)+unix.CmsgLen(0)] = 0x03
	if seg, tc := parseControl(good); seg != 16 || tc != 3 {
		f.Fatalf("parseControl of well-formed cmsgs = %d, %#x", seg, tc)
	}
	f.Add(good)
	f.Add(good[:unix.CmsgSpace(4)])
	f.Add(good[:unix.SizeofCmsghdr])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, ctl []byte) {
		// Align like the kernel-written buffer (cmsghdr needs 8-byte alignment).
		buf := make([]uint64, (len(ctl)+7)/8)
		b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(buf))), len(buf)*8)[:len(ctl)]
		copy(b, ctl)
		parseControl(b) // must not panic
	})
}
