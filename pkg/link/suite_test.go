package link

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pair is two links that can reach each other, over the in-memory network or real UDP sockets
// on loopback (wireguard-go genTestPair style).
type pair struct {
	a, b         Link
	aAddr, bAddr netip.AddrPort // where each receives (Dst for the other's sends)
	maxPayload   int
	real         bool
}

// from returns the Src a's sends carry.
func (p *pair) src(l Link, at netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(at.Addr(), l.SourcePort(at.Addr(), 0xC0DE))
}

// Variants of the shared suite.
const (
	varMem    = "mem"
	varUDP    = "udp"     // one IPv4 socket per link on 127.0.0.1 / 127.0.0.2
	varUDPGSO = "udp-gso" // the same with GSO forced on and GRO on
	varUDP6   = "udp6"    // IPv6 on ::1 (GSO on by default for IPv6)
	varMulti  = "udp-multi"
)

var variants = []string{varMem, varUDP, varUDPGSO, varUDP6, varMulti}

func genTestPair(tb testing.TB, variant string) *pair {
	tb.Helper()
	ip := netip.MustParseAddr
	switch variant {
	case varMem:
		n := NewMemNetwork(MemOptions{QueueDepth: 4096, Full: BlockWhenFull})
		a, b := mustAttach(tb, n, memA), mustAttach(tb, n, memB)
		return &pair{a: a, b: b, aAddr: netip.AddrPortFrom(memA, UDPPort), bAddr: netip.AddrPortFrom(memB, UDPPort),
			maxPayload: MaxDatagram}
	case varUDP, varUDPGSO:
		o := UDPOptions{AnyPort: true}
		if variant == varUDPGSO {
			o.GSO, o.GRO = GSOOn, true
		}
		oa, ob := o, o
		oa.Addrs, ob.Addrs = []netip.Addr{ip("127.0.0.1")}, []netip.Addr{ip("127.0.0.2")}
		a, b := listenTB(tb, oa), listenTB(tb, ob)
		return &pair{a: a, b: b, aAddr: a.LocalAddrPorts()[0], bAddr: b.LocalAddrPorts()[0], maxPayload: 65507, real: true}
	case varUDP6:
		a := listenTB(tb, UDPOptions{Addrs: []netip.Addr{ip("::1")}, AnyPort: true, GRO: true})
		b := listenTB(tb, UDPOptions{Addrs: []netip.Addr{ip("::1")}, AnyPort: true, GRO: true})
		return &pair{a: a, b: b, aAddr: a.LocalAddrPorts()[0], bAddr: b.LocalAddrPorts()[0],
			maxPayload: 65536 - 40 - 8, real: true} // lo's MTU with DF: no IPv6 fragments
	case varMulti:
		a := listenTB(tb, UDPOptions{Addrs: []netip.Addr{ip("127.0.0.3"), ip("127.0.0.4")}, AnyPort: true})
		b := listenTB(tb, UDPOptions{Addrs: []netip.Addr{ip("127.0.0.5"), ip("127.0.0.6")}, AnyPort: true})
		return &pair{a: a, b: b, aAddr: a.LocalAddrPorts()[1], bAddr: b.LocalAddrPorts()[1], maxPayload: 65507, real: true}
	}
	tb.Fatalf("unknown variant %q", variant)
	return nil
}

func listenTB(tb testing.TB, o UDPOptions) *UDPLink {
	tb.Helper()
	l, err := listenUDP(o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	return l
}

func forBoth(t *testing.T, f func(t *testing.T, p *pair)) {
	for _, v := range variants {
		t.Run(v, func(t *testing.T) { f(t, genTestPair(t, v)) })
	}
}

// mkBatch returns n datagrams from p.a to p.b, datagram i = size bytes tagged with tag and i.
func (p *pair) mkBatch(n, size int, tag uint32) []Datagram {
	out := make([]Datagram, n)
	for i := range out {
		b := make([]byte, size)
		for k := range b {
			b[k] = byte(k*7 + i)
		}
		if size >= 8 {
			binary.BigEndian.PutUint32(b, tag)
			binary.BigEndian.PutUint32(b[4:], uint32(i))
		}
		out[i] = Datagram{Buf: b, Src: p.src(p.a, p.aAddr), Dst: p.bAddr}
	}
	return out
}

// recvN receives exactly n datagrams at b with batches of size batch.
func recvN(t testing.TB, l Link, n, batch int) []Datagram {
	t.Helper()
	var got []Datagram
	in := recvBufs(batch)
	// Safety bound, not a wait: if datagrams were lost, closing the link turns a hang into a
	// failure that shows the counters.
	wd := time.AfterFunc(10*time.Second, func() { l.Close() })
	defer wd.Stop()
	for len(got) < n {
		k, err := l.Recv(in)
		if err != nil {
			var st Stats
			if sl, ok := l.(StatsLink); ok {
				st = sl.Stats()
			}
			t.Fatalf("recv after %d of %d: %v (receiver stats %+v)", len(got), n, err, st)
		}
		if k < 1 || k > batch {
			t.Fatalf("recv returned %d for a batch of %d", k, batch)
		}
		for i := 0; i < k; i++ {
			got = append(got, Datagram{Buf: append([]byte(nil), in[i].Buf...), Src: in[i].Src, Dst: in[i].Dst})
		}
	}
	return got
}

func (p *pair) check(t *testing.T, sent, got []Datagram) {
	t.Helper()
	if len(got) != len(sent) {
		t.Fatalf("received %d datagrams, sent %d", len(got), len(sent))
	}
	for i := range sent {
		if string(got[i].Buf) != string(sent[i].Buf) {
			t.Fatalf("datagram %d: %d bytes differ from the %d sent", i, len(got[i].Buf), len(sent[i].Buf))
		}
		if got[i].Src != sent[i].Src {
			t.Fatalf("datagram %d: Src %v, want %v", i, got[i].Src, sent[i].Src)
		}
		if got[i].Dst != p.bAddr {
			t.Fatalf("datagram %d: Dst %v, want %v", i, got[i].Dst, p.bAddr)
		}
	}
}

func TestSuiteOrderWithinBatch(t *testing.T) {
	forBoth(t, func(t *testing.T, p *pair) {
		out := p.mkBatch(48, 300, 1)
		if err := p.a.Send(out); err != nil {
			t.Fatal(err)
		}
		p.check(t, out, recvN(t, p.b, len(out), 64))
		if s := p.a.(StatsLink).Stats(); s.Sent != 48 || s.SendBatches < 1 {
			t.Fatalf("sender stats %+v", s)
		}
		if s := p.b.(StatsLink).Stats(); s.Received != 48 {
			t.Fatalf("receiver stats %+v", s)
		}
	})
}

func TestSuiteBatchBoundaries(t *testing.T) {
	forBoth(t, func(t *testing.T, p *pair) {
		// Larger than the preferred batch (sent in several sendmmsg calls), received 5 at a time.
		out := p.mkBatch(p.a.BatchSize()*2+7, 100, 2)
		if err := p.a.Send(out); err != nil {
			t.Fatal(err)
		}
		p.check(t, out, recvN(t, p.b, len(out), 5))
		// Batches of 1 and an empty batch.
		one := p.mkBatch(1, 64, 3)
		if err := p.a.Send(one); err != nil {
			t.Fatal(err)
		}
		if err := p.a.Send(nil); err != nil {
			t.Fatal(err)
		}
		p.check(t, one, recvN(t, p.b, 1, 1))
		if k, err := p.b.Recv(nil); k != 0 || err != nil {
			t.Fatalf("Recv(nil) = %d, %v", k, err)
		}
	})
}

func TestSuiteLargePayloads(t *testing.T) {
	forBoth(t, func(t *testing.T, p *pair) {
		// 4096 payload + BTH + RETH + ICRC; the largest UDP payload; an empty one.
		sizes := []int{4096 + 12 + 16 + 4, p.maxPayload, 0, 1}
		var out []Datagram
		for i, s := range sizes {
			out = append(out, p.mkBatch(1, s, uint32(10+i))...)
		}
		if err := p.a.Send(out); err != nil {
			t.Fatal(err)
		}
		if s := p.a.(StatsLink).Stats(); s.Drops != 0 {
			t.Fatalf("sender dropped %d datagrams", s.Drops)
		}
		p.check(t, out, recvN(t, p.b, len(out), 4))
	})
}

func TestSuiteCloseUnblocksRecv(t *testing.T) {
	forBoth(t, func(t *testing.T, p *pair) {
		done := make(chan error, 1)
		go func() {
			_, err := p.b.Recv(recvBufs(4))
			done <- err
		}()
		if err := p.b.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Recv after Close: %v, want net.ErrClosed", err)
		}
		if _, err := p.b.Recv(recvBufs(1)); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("second Recv: %v", err)
		}
		if err := p.b.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
	})
}

func TestSuiteConcurrentSend(t *testing.T) {
	forBoth(t, func(t *testing.T, p *pair) {
		const senders, per = 4, 100
		var wg sync.WaitGroup
		errs := make(chan error, senders)
		for g := 0; g < senders; g++ {
			batch := p.mkBatch(per, 200, uint32(g))
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < per; i += 10 {
					if err := p.a.Send(batch[i : i+10]); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		got := recvN(t, p.b, senders*per, 16) // receives while the senders send
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if s := p.a.(StatsLink).Stats(); s.Sent != senders*per || s.Drops != 0 {
			t.Fatalf("sender stats %+v", s)
		}
		next := make([]uint32, senders)
		for _, d := range got {
			g, i := binary.BigEndian.Uint32(d.Buf), binary.BigEndian.Uint32(d.Buf[4:])
			if g >= senders || i != next[g] {
				t.Fatalf("sender %d: got datagram %d, want %d (per-sender order must hold)", g, i, next[g])
			}
			next[g]++
		}
	})
}

func TestSuiteSendValidation(t *testing.T) {
	forBoth(t, func(t *testing.T, p *pair) {
		good := p.mkBatch(1, 10, 0)[0]
		bad := good
		bad.Src = netip.AddrPortFrom(bad.Src.Addr(), 0)
		if err := p.a.Send([]Datagram{good, bad}); !errors.Is(err, ErrInvalidAddr) {
			t.Fatalf("zero source port: %v", err)
		}
		bad = good
		bad.Src = netip.AddrPortFrom(netip.MustParseAddr("198.18.9.9"), 5)
		if err := p.a.Send([]Datagram{bad}); !errors.Is(err, ErrNoLocalAddr) {
			t.Fatalf("foreign source: %v", err)
		}
		// Nothing of the refused batches may have been sent: the next datagram is the first.
		next := p.mkBatch(1, 10, 99)
		if err := p.a.Send(next); err != nil {
			t.Fatal(err)
		}
		p.check(t, next, recvN(t, p.b, 1, 4))
	})
}
