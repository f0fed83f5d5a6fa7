package mem

import (
	"errors"
	"net"
	"net/netip"
	"testing"

	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/internal/linktest"
	"go.uber.org/goleak"
)

var (
	memA = netip.MustParseAddr("198.18.0.1")
	memB = netip.MustParseAddr("198.18.0.2")
)

func mustAttach(t testing.TB, n *Network, a ...netip.Addr) link.Link {
	t.Helper()
	l, err := n.Attach(a...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func recvBufs(n int) []link.Datagram { return linktest.RecvBufs(n) }

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestSuite runs the shared suite over the in-memory network (blocking when full: lossless).
func TestSuite(t *testing.T) {
	linktest.Run(t, linktest.Variant{Name: "mem", New: func(tb testing.TB) *linktest.Pair {
		n := NewNetwork(Options{QueueDepth: 4096, Full: BlockWhenFull})
		a, b := mustAttach(tb, n, memA), mustAttach(tb, n, memB)
		return &linktest.Pair{A: a, B: b, AAddr: netip.AddrPortFrom(memA, link.UDPPort),
			BAddr: netip.AddrPortFrom(memB, link.UDPPort), MaxPayload: link.MaxDatagram}
	}})
}

func TestMemAttachErrors(t *testing.T) {
	n := NewNetwork(Options{})
	mustAttach(t, n, memA)
	if _, err := n.Attach(memA); !errors.Is(err, link.ErrAddrInUse) {
		t.Fatalf("second attach of %v: %v, want link.ErrAddrInUse", memA, err)
	}
	if _, err := n.Attach(netip.AddrFrom16(memA.As16())); !errors.Is(err, link.ErrAddrInUse) {
		t.Fatalf("attach of IPv4-mapped %v: %v, want link.ErrAddrInUse", memA, err)
	}
	if _, err := n.Attach(memB, memB); !errors.Is(err, link.ErrAddrInUse) {
		t.Fatalf("duplicate in one attach: %v", err)
	}
	if _, err := n.Attach(netip.Addr{}); !errors.Is(err, link.ErrInvalidAddr) {
		t.Fatalf("zero addr: %v", err)
	}
	// memB must still be free after the failed attaches.
	mustAttach(t, n, memB)
}

func TestMemDropWhenFull(t *testing.T) {
	n := NewNetwork(Options{QueueDepth: 4})
	a := mustAttach(t, n, memA)
	b := mustAttach(t, n, memB)
	out := make([]link.Datagram, 10)
	for i := range out {
		out[i] = link.Datagram{Buf: []byte{byte(i)}, Src: netip.AddrPortFrom(memA, 49152),
			Dst: netip.AddrPortFrom(memB, link.UDPPort)}
	}
	if err := a.Send(out); err != nil {
		t.Fatal(err)
	}
	st := b.(link.StatsLink).Stats()
	if st.Drops != 6 {
		t.Fatalf("drops = %d, want 6", st.Drops)
	}
	in := recvBufs(10)
	got, err := b.Recv(in)
	if err != nil || got != 4 {
		t.Fatalf("recv = %d, %v; want 4", got, err)
	}
	for i := 0; i < got; i++ {
		if in[i].Buf[0] != byte(i) {
			t.Fatalf("datagram %d = %d: the first four must be kept", i, in[i].Buf[0])
		}
	}
	if s := a.(link.StatsLink).Stats(); s.Sent != 4 {
		t.Fatalf("sender counted %d sent, want 4", s.Sent)
	}
}

func TestMemUnknownDestination(t *testing.T) {
	n := NewNetwork(Options{})
	a := mustAttach(t, n, memA)
	d := []link.Datagram{{Buf: []byte{1}, Src: netip.AddrPortFrom(memA, 1), Dst: netip.AddrPortFrom(memB, link.UDPPort)}}
	if err := a.Send(d); err != nil {
		t.Fatal(err)
	}
	if n.DroppedUnknown() != 1 {
		t.Fatalf("unknown drops = %d", n.DroppedUnknown())
	}
}

func TestMemSendValidation(t *testing.T) {
	n := NewNetwork(Options{})
	a := mustAttach(t, n, memA)
	mustAttach(t, n, memB)
	dst := netip.AddrPortFrom(memB, link.UDPPort)
	cases := []struct {
		d    link.Datagram
		want error
	}{
		{link.Datagram{Src: netip.AddrPortFrom(memA, 0), Dst: dst}, link.ErrInvalidAddr},
		{link.Datagram{Src: netip.AddrPortFrom(memB, 5), Dst: dst}, link.ErrNoLocalAddr},
		{link.Datagram{Src: netip.AddrPortFrom(memA, 5)}, link.ErrInvalidAddr},
		{link.Datagram{Src: netip.AddrPortFrom(memA, 5), Dst: dst, Buf: make([]byte, link.MaxDatagram+1)}, link.ErrTooLarge},
	}
	for i, c := range cases {
		if err := a.Send([]link.Datagram{c.d}); !errors.Is(err, c.want) {
			t.Errorf("case %d: %v, want %v", i, err, c.want)
		}
	}
}

func TestMemBlockWhenFull(t *testing.T) {
	n := NewNetwork(Options{QueueDepth: 2, Full: BlockWhenFull})
	a := mustAttach(t, n, memA)
	b := mustAttach(t, n, memB)
	const total = 50
	done := make(chan error, 1)
	go func() {
		for i := 0; i < total; i++ {
			d := []link.Datagram{{Buf: []byte{byte(i)}, Src: netip.AddrPortFrom(memA, 1), Dst: netip.AddrPortFrom(memB, link.UDPPort)}}
			if err := a.Send(d); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	in := recvBufs(3)
	next := 0
	for next < total {
		k, err := b.Recv(in)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < k; i++ {
			if in[i].Buf[0] != byte(next) {
				t.Fatalf("got %d, want %d", in[i].Buf[0], next)
			}
			next++
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s := b.(link.StatsLink).Stats(); s.Drops != 0 {
		t.Fatalf("blocking network dropped %d", s.Drops)
	}
}

func TestMemCloseUnblocksBlockedSender(t *testing.T) {
	n := NewNetwork(Options{QueueDepth: 1, Full: BlockWhenFull})
	a := mustAttach(t, n, memA)
	b, err := n.Attach(memB)
	if err != nil {
		t.Fatal(err)
	}
	d := []link.Datagram{{Buf: []byte{1}, Src: netip.AddrPortFrom(memA, 1), Dst: netip.AddrPortFrom(memB, link.UDPPort)}}
	if err := a.Send(d); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Send(d) }() // blocks: b's queue is full
	b.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := b.Recv(recvBufs(1)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("recv after close: %v", err)
	}
	back := []link.Datagram{{Buf: []byte{1}, Src: netip.AddrPortFrom(memB, 1), Dst: netip.AddrPortFrom(memA, link.UDPPort)}}
	if err := b.Send(back); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("send after close: %v", err)
	}
}

func TestMemTruncation(t *testing.T) {
	n := NewNetwork(Options{})
	a := mustAttach(t, n, memA)
	b := mustAttach(t, n, memB)
	d := []link.Datagram{{Buf: []byte{1, 2, 3, 4}, Src: netip.AddrPortFrom(memA, 7), Dst: netip.AddrPortFrom(memB, link.UDPPort)}}
	a.Send(d)
	in := []link.Datagram{{Buf: make([]byte, 0, 2)}}
	k, err := b.Recv(in)
	if err != nil || k != 1 || len(in[0].Buf) != 2 || in[0].Buf[1] != 2 {
		t.Fatalf("recv %d %v %v", k, err, in[0].Buf)
	}
	if s := b.(link.StatsLink).Stats(); s.Truncated != 1 {
		t.Fatalf("truncated = %d", s.Truncated)
	}
	if got := a.SourcePort(memA, 0xC123); got != 0xC123 {
		t.Fatalf("SourcePort = %#x, want the entropy port", got)
	}
}

func TestMemZeroAlloc(t *testing.T) {
	n := NewNetwork(Options{QueueDepth: 64})
	a := mustAttach(t, n, memA)
	b := mustAttach(t, n, memB)
	out := make([]link.Datagram, 16)
	for i := range out {
		out[i] = link.Datagram{Buf: make([]byte, 1100), Src: netip.AddrPortFrom(memA, 49152), Dst: netip.AddrPortFrom(memB, link.UDPPort)}
	}
	in := recvBufs(16)
	round := func() {
		if err := a.Send(out); err != nil {
			t.Fatal(err)
		}
		for got := 0; got < len(out); {
			k, err := b.Recv(in)
			if err != nil {
				t.Fatal(err)
			}
			got += k
		}
	}
	for i := 0; i < 8; i++ { // fill every slot once
		round()
	}
	if allocs := testing.AllocsPerRun(100, round); allocs != 0 {
		t.Fatalf("%v allocations per batch of 16, want 0", allocs)
	}
}

func BenchmarkMemSendRecv(b *testing.B) {
	for _, size := range []int{1024, 4096} {
		b.Run(linktest.SizeName(size), func(b *testing.B) {
			n := NewNetwork(Options{QueueDepth: 256})
			x := mustAttach(b, n, memA)
			y := mustAttach(b, n, memB)
			const batch = 32
			out := make([]link.Datagram, batch)
			for i := range out {
				out[i] = link.Datagram{Buf: make([]byte, size), Src: netip.AddrPortFrom(memA, 49152), Dst: netip.AddrPortFrom(memB, link.UDPPort)}
			}
			in := recvBufs(batch)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i += batch {
				x.Send(out)
				for got := 0; got < batch; {
					k, _ := y.Recv(in)
					got += k
				}
			}
		})
	}
}

// TestTryRecv: linktest.TryRecv over the in-memory network.
func TestTryRecv(t *testing.T) {
	n := NewNetwork(Options{})
	tx, rx := mustAttach(t, n, memA), mustAttach(t, n, memB)
	linktest.TryRecv(t, tx, rx, netip.AddrPortFrom(memB, link.UDPPort))
}
