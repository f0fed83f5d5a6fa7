// Package linktest is the test suite every link.Link implementation runs (link/mem, link/udp):
// order within a batch, batches larger than BatchSize received a few at a time, single and
// empty batches, large and empty payloads, Close unblocking Recv, concurrent senders, refusal
// of invalid batches. A path's tests build Pairs of its links and call Run (wireguard-go's
// genTestPair style).
package linktest

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/softroce/softroce/pkg/link"
)

// Pair is two links that can reach each other.
type Pair struct {
	A, B         link.Link
	AAddr, BAddr netip.AddrPort // where each receives (Dst for the other's sends)
	MaxPayload   int            // the largest datagram the path carries
}

// Variant is one set-up of a path: Name names its subtests, New builds a fresh Pair (its
// links closed by the test's cleanup).
type Variant struct {
	Name string
	New  func(tb testing.TB) *Pair
}

// Run runs the suite over each variant.
func Run(t *testing.T, variants ...Variant) {
	tests := []struct {
		name string
		f    func(t *testing.T, p *Pair)
	}{
		{"OrderWithinBatch", orderWithinBatch},
		{"BatchBoundaries", batchBoundaries},
		{"LargePayloads", largePayloads},
		{"CloseUnblocksRecv", closeUnblocksRecv},
		{"ConcurrentSend", concurrentSend},
		{"SendValidation", sendValidation},
		{"TrafficClass", trafficClass},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, v := range variants {
				t.Run(v.Name, func(t *testing.T) { tc.f(t, v.New(t)) })
			}
		})
	}
}

// Src returns the Src a send from at on l carries (the port l.SourcePort gives a fixed
// entropy port).
func Src(l link.Link, at netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(at.Addr(), l.SourcePort(at.Addr(), 0xC0DE))
}

// RecvBufs returns n datagrams with buffers of link.MaxDatagram bytes.
func RecvBufs(n int) []link.Datagram {
	b := make([]link.Datagram, n)
	for i := range b {
		b[i].Buf = make([]byte, link.MaxDatagram)
	}
	return b
}

// MkBatch returns n datagrams from p.A to p.B, datagram i = size bytes tagged with tag and i.
func (p *Pair) MkBatch(n, size int, tag uint32) []link.Datagram {
	out := make([]link.Datagram, n)
	for i := range out {
		b := make([]byte, size)
		for k := range b {
			b[k] = byte(k*7 + i)
		}
		if size >= 8 {
			binary.BigEndian.PutUint32(b, tag)
			binary.BigEndian.PutUint32(b[4:], uint32(i))
		}
		out[i] = link.Datagram{Buf: b, Src: Src(p.A, p.AAddr), Dst: p.BAddr}
	}
	return out
}

// RecvN receives exactly n datagrams at l with batches of size batch.
func RecvN(t testing.TB, l link.Link, n, batch int) []link.Datagram {
	t.Helper()
	var got []link.Datagram
	in := RecvBufs(batch)
	// Safety bound, not a wait: if datagrams were lost, closing the link turns a hang into a
	// failure that shows the counters.
	wd := time.AfterFunc(10*time.Second, func() { l.Close() })
	defer wd.Stop()
	for len(got) < n {
		k, err := l.Recv(in)
		if err != nil {
			var st link.Stats
			if sl, ok := l.(link.StatsLink); ok {
				st = sl.Stats()
			}
			t.Fatalf("recv after %d of %d: %v (receiver stats %+v)", len(got), n, err, st)
		}
		if k < 1 || k > batch {
			t.Fatalf("recv returned %d for a batch of %d", k, batch)
		}
		for i := 0; i < k; i++ {
			got = append(got, link.Datagram{Buf: append([]byte(nil), in[i].Buf...), Src: in[i].Src, Dst: in[i].Dst,
				TClass: in[i].TClass})
		}
	}
	return got
}

// Check compares what B received with what A sent (payloads, sources, traffic classes, and B's
// address).
func (p *Pair) Check(t *testing.T, sent, got []link.Datagram) {
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
		if got[i].Dst != p.BAddr {
			t.Fatalf("datagram %d: Dst %v, want %v", i, got[i].Dst, p.BAddr)
		}
		if got[i].TClass != sent[i].TClass {
			t.Fatalf("datagram %d: TClass %#x, want %#x", i, got[i].TClass, sent[i].TClass)
		}
	}
}

// trafficClass: each datagram arrives with the IPv4 TOS / IPv6 Traffic Class it was sent with,
// the ECN field included (ECT(0), and CE as a switch marks it: link.Datagram.CE), also where
// equal-size datagrams would be sent as one GSO message and coalesced again by GRO (neither
// merges different classes).
func trafficClass(t *testing.T, p *Pair) {
	classes := []uint8{link.ECNECT0, link.ECNECT0, link.ECNCE, link.ECNCE, 0, 0xB8 | link.ECNECT0, link.ECNECT0, 0x48 | link.ECNCE}
	out := p.MkBatch(len(classes), 700, 4)
	for i, c := range classes {
		out[i].TClass = c
	}
	if err := p.A.Send(out); err != nil {
		t.Fatal(err)
	}
	got := RecvN(t, p.B, len(out), 64)
	p.Check(t, out, got)
	for i := range got {
		if got[i].CE() != (classes[i]&link.ECNMask == link.ECNCE) {
			t.Fatalf("datagram %d (class %#x): CE %v", i, classes[i], got[i].CE())
		}
	}
}

func orderWithinBatch(t *testing.T, p *Pair) {
	out := p.MkBatch(48, 300, 1)
	if err := p.A.Send(out); err != nil {
		t.Fatal(err)
	}
	p.Check(t, out, RecvN(t, p.B, len(out), 64))
	if s := p.A.(link.StatsLink).Stats(); s.Sent != 48 || s.SendBatches < 1 {
		t.Fatalf("sender stats %+v", s)
	}
	if s := p.B.(link.StatsLink).Stats(); s.Received != 48 {
		t.Fatalf("receiver stats %+v", s)
	}
}

func batchBoundaries(t *testing.T, p *Pair) {
	// Larger than the preferred batch (sent in several sendmmsg calls), received 5 at a time.
	out := p.MkBatch(p.A.BatchSize()*2+7, 100, 2)
	if err := p.A.Send(out); err != nil {
		t.Fatal(err)
	}
	p.Check(t, out, RecvN(t, p.B, len(out), 5))
	// Batches of 1 and an empty batch.
	one := p.MkBatch(1, 64, 3)
	if err := p.A.Send(one); err != nil {
		t.Fatal(err)
	}
	if err := p.A.Send(nil); err != nil {
		t.Fatal(err)
	}
	p.Check(t, one, RecvN(t, p.B, 1, 1))
	if k, err := p.B.Recv(nil); k != 0 || err != nil {
		t.Fatalf("Recv(nil) = %d, %v", k, err)
	}
}

func largePayloads(t *testing.T, p *Pair) {
	// 4096 payload + BTH + RETH + ICRC; the largest UDP payload; an empty one.
	sizes := []int{4096 + 12 + 16 + 4, p.MaxPayload, 0, 1}
	var out []link.Datagram
	for i, s := range sizes {
		out = append(out, p.MkBatch(1, s, uint32(10+i))...)
	}
	if err := p.A.Send(out); err != nil {
		t.Fatal(err)
	}
	if s := p.A.(link.StatsLink).Stats(); s.Drops != 0 {
		t.Fatalf("sender dropped %d datagrams", s.Drops)
	}
	p.Check(t, out, RecvN(t, p.B, len(out), 4))
}

func closeUnblocksRecv(t *testing.T, p *Pair) {
	done := make(chan error, 1)
	go func() {
		_, err := p.B.Recv(RecvBufs(4))
		done <- err
	}()
	if err := p.B.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Recv after Close: %v, want net.ErrClosed", err)
	}
	if _, err := p.B.Recv(RecvBufs(1)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("second Recv: %v", err)
	}
	if err := p.B.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func concurrentSend(t *testing.T, p *Pair) {
	const senders, per = 4, 100
	var wg sync.WaitGroup
	errs := make(chan error, senders)
	for g := 0; g < senders; g++ {
		batch := p.MkBatch(per, 200, uint32(g))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i += 10 {
				if err := p.A.Send(batch[i : i+10]); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	got := RecvN(t, p.B, senders*per, 16) // receives while the senders send
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if s := p.A.(link.StatsLink).Stats(); s.Sent != senders*per || s.Drops != 0 {
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
}

func sendValidation(t *testing.T, p *Pair) {
	good := p.MkBatch(1, 10, 0)[0]
	bad := good
	bad.Src = netip.AddrPortFrom(bad.Src.Addr(), 0)
	if err := p.A.Send([]link.Datagram{good, bad}); !errors.Is(err, link.ErrInvalidAddr) {
		t.Fatalf("zero source port: %v", err)
	}
	bad = good
	bad.Src = netip.AddrPortFrom(netip.MustParseAddr("198.18.9.9"), 5)
	if err := p.A.Send([]link.Datagram{bad}); !errors.Is(err, link.ErrNoLocalAddr) {
		t.Fatalf("foreign source: %v", err)
	}
	// Nothing of the refused batches may have been sent: the next datagram is the first.
	next := p.MkBatch(1, 10, 99)
	if err := p.A.Send(next); err != nil {
		t.Fatal(err)
	}
	p.Check(t, next, RecvN(t, p.B, 1, 4))
}

// TryRecv checks rx's link.PollReceiver: it never waits — an empty link returns 0, nil — and
// returns what tx sent to dst once it is there (rounds of 3 datagrams of several sizes, with
// empty reads before and between them); after Close it returns net.ErrClosed.
func TryRecv(t *testing.T, tx, rx link.Link, dst netip.AddrPort) {
	pr := rx.(link.PollReceiver)
	batch := make([]link.Datagram, 8)
	bufs := make([][]byte, len(batch))
	for i := range bufs {
		bufs[i] = make([]byte, link.MaxDatagram)
	}
	reset := func() {
		for i := range batch {
			batch[i].Buf = bufs[i]
		}
	}
	reset()
	if n, err := pr.TryRecv(batch); n != 0 || err != nil {
		t.Fatalf("empty link: %d, %v", n, err)
	}
	a, b := tx.LocalAddrs()[0], dst.Addr()
	src := netip.AddrPortFrom(a, tx.SourcePort(a, 0xC123))
	// rounds of different sizes (GRO: one message of 3 segments each, its segment size
	// in the control data), empty reads before and between them (which leave the GRO
	// headers prepared: the next read must still see the new lengths)
	for round, size := range []int{8, 20, 4000, 40} {
		var out []link.Datagram
		for i := 0; i < 3; i++ {
			p := make([]byte, size)
			p[0], p[size-1] = byte(i), byte(round)
			out = append(out, link.Datagram{Buf: p, Src: src, Dst: dst})
		}
		if err := tx.Send(out); err != nil {
			t.Fatal(err)
		}
		got := 0
		deadline := time.Now().Add(10 * time.Second)
		for got < len(out) {
			reset()
			n, err := pr.TryRecv(batch[:len(batch)-got])
			if err != nil {
				t.Fatal(err)
			}
			for k := 0; k < n; k++ {
				d := batch[k]
				if len(d.Buf) != size || d.Buf[0] != byte(got) || d.Buf[size-1] != byte(round) || d.Src.Addr() != a || d.Dst.Addr() != b {
					t.Fatalf("round %d datagram %d: %d bytes [%d ... %d] from %v to %v", round, got, len(d.Buf), d.Buf[0], d.Buf[len(d.Buf)-1], d.Src, d.Dst)
				}
				got++
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %d of %d datagrams", round, got, len(out))
			}
		}
		for i := 0; i < 3; i++ {
			reset()
			if n, err := pr.TryRecv(batch); n != 0 || err != nil {
				t.Fatalf("drained link: %d, %v", n, err)
			}
		}
	}
	rx.Close()
	if _, err := pr.TryRecv(batch); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

// SizeName names a benchmark's datagram size: "64B", "4KiB".
func SizeName(n int) string {
	if n%1024 == 0 {
		return strconv.Itoa(n/1024) + "KiB"
	}
	return strconv.Itoa(n) + "B"
}
