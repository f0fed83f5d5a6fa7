package fault

import (
	"bytes"
	"math"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/mem"
)

// capture is an inner link that records (or just counts) what is sent.
type capture struct {
	mu    sync.Mutex
	keep  bool
	sent  [][]byte
	count int
}

func (c *capture) Send(batch []link.Datagram) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.count += len(batch)
	if c.keep {
		for _, d := range batch {
			c.sent = append(c.sent, bytes.Clone(d.Buf))
		}
	}
	return nil
}
func (c *capture) Recv([]link.Datagram) (int, error)              { return 0, net.ErrClosed }
func (c *capture) BatchSize() int                                 { return 64 }
func (c *capture) LocalAddrs() []netip.Addr                       { return []netip.Addr{addrA} }
func (c *capture) SourcePort(_ netip.Addr, entropy uint16) uint16 { return entropy }
func (c *capture) Close() error                                   { return nil }

var mixed = DirOptions{Drop: 0.05, Duplicate: 0.05, Corrupt: 0.05, Reorder: 0.05, ReorderDepth: 3,
	DuplicateDelay: 0, Jitter: 50 * time.Microsecond}

// runSeq sends n datagrams split into batches of the given sizes (cycled) and returns the
// event log and what reached the inner link.
func runSeq(t *testing.T, seed uint64, o DirOptions, n int, sizes []int) ([]Event, [][]byte) {
	t.Helper()
	clk := newManualClock()
	c := &capture{keep: true}
	log := newEventLog()
	f := Wrap(c, Options{Seed1: seed, Seed2: 77, Clock: AdaptClock(clk), OnEvent: log.add, Send: o})
	defer f.Close()
	var all []link.Datagram
	for i := 0; i < n; i++ {
		all = append(all, dg(pkt(t, bth.OpRCWriteMiddle, 0x40, bth.PSN(i), 64)))
	}
	for i, k := 0, 0; i < n; k++ {
		m := min(sizes[k%len(sizes)], n-i)
		if err := f.Send(all[i : i+m]); err != nil {
			t.Fatal(err)
		}
		i += m
	}
	clk.Advance(time.Second)
	return log.all(), c.sent
}

func TestDeterministicAcrossBatching(t *testing.T) {
	ev1, out1 := runSeq(t, 42, mixed, 3000, []int{1})
	ev2, out2 := runSeq(t, 42, mixed, 3000, []int{7, 1, 64, 3})
	if !slices.Equal(ev1, ev2) {
		t.Fatal("same seed, same datagrams, different batching: different events")
	}
	if !slices.EqualFunc(out1, out2, bytes.Equal) {
		t.Fatal("same seed: different output")
	}
	for _, k := range []Action{Drop, Duplicate, Corrupt, Reorder, Delay, Release} {
		if len(filter(ev1, k)) == 0 {
			t.Fatalf("no %v event: the test would not notice a difference", k)
		}
	}
	ev3, _ := runSeq(t, 43, mixed, 3000, []int{1})
	if slices.Equal(ev1, ev3) {
		t.Fatal("different seeds gave the same events")
	}
}

func filter(ev []Event, k Action) []Event {
	var out []Event
	for _, e := range ev {
		if e.Kind == k {
			out = append(out, e)
		}
	}
	return out
}

func seqSet(ev []Event, k Action) map[uint64]bool {
	m := map[uint64]bool{}
	for _, e := range filter(ev, k) {
		m[e.Seq] = true
	}
	return m
}

// Each fault kind has its own draw: adding drops does not move which datagrams get corrupted.
func TestFaultKindsIndependent(t *testing.T) {
	evC, _ := runSeq(t, 5, DirOptions{Corrupt: 0.1}, 2000, []int{5})
	evDC, _ := runSeq(t, 5, DirOptions{Corrupt: 0.1, Drop: 0.3}, 2000, []int{5})
	c, dc, d := seqSet(evC, Corrupt), seqSet(evDC, Corrupt), seqSet(evDC, Drop)
	for s := range c {
		if !d[s] && !dc[s] {
			t.Fatalf("datagram %d: corrupted without drops, not with them", s)
		}
	}
	for s := range dc {
		if !c[s] {
			t.Fatalf("datagram %d corrupted only when drops were added", s)
		}
	}
	if len(d) == 0 || len(dc) == 0 {
		t.Fatal("nothing happened")
	}
}

func within(t *testing.T, name string, got uint64, n float64, p float64) {
	t.Helper()
	mean := n * p
	sd := math.Sqrt(n * p * (1 - p))
	if math.Abs(float64(got)-mean) > 5*sd {
		t.Fatalf("%s: %d, want %.0f ± %.0f", name, got, mean, 5*sd)
	}
}

func TestRatesSend100k(t *testing.T) {
	const n = 100_000
	clk := newManualClock()
	c := &capture{}
	o := DirOptions{Drop: 0.1, Duplicate: 0.05, Corrupt: 0.02, Reorder: 0.03, ReorderDepth: 4}
	f := Wrap(c, Options{Seed1: 2024, Clock: AdaptClock(clk), Send: o})
	p := dg(pkt(t, bth.OpRCSendMiddle, 0x40, 1, 256))
	batch := make([]link.Datagram, 50)
	for i := range batch {
		batch[i] = p
	}
	for i := 0; i < n/len(batch); i++ {
		if err := f.Send(batch); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(time.Second)
	s := f.Stats().Send
	kept := float64(n) * (1 - o.Drop)
	within(t, "dropped", s.Dropped, n, o.Drop)
	within(t, "duplicated", s.Duplicated, kept, o.Duplicate)
	within(t, "corrupted", s.Corrupted, kept, o.Corrupt)
	within(t, "reordered", s.Reordered, kept, o.Reorder)
	if s.Seen != n || s.Delivered != s.Seen-s.Dropped+s.Duplicated || c.count != int(s.Delivered) || s.Released < s.Reordered || s.Held != 0 {
		t.Fatalf("accounting: %+v inner %d", s, c.count)
	}
	f.Close()
}

func TestRatesRecv100k(t *testing.T) {
	const n = 100_000
	n0 := mem.NewNetwork(mem.Options{QueueDepth: 4096, Full: mem.BlockWhenFull})
	a, _ := n0.Attach(addrA)
	b, _ := n0.Attach(addrB)
	defer a.Close()
	o := DirOptions{Drop: 0.1, Duplicate: 0.05, Corrupt: 0.02}
	g := Wrap(b, Options{Seed1: 99, Recv: o})
	defer g.Close()
	p := dg(pkt(t, bth.OpRCSendMiddle, 0x40, 1, 64))
	errc := make(chan error, 1)
	go func() {
		batch := make([]link.Datagram, 32)
		for i := range batch {
			batch[i] = p
		}
		for i := 0; i < n/len(batch); i++ {
			if err := a.Send(batch); err != nil {
				errc <- err
				return
			}
		}
		errc <- a.Send(batch[:n%len(batch)])
	}()
	batch := make([]link.Datagram, 64)
	for i := range batch {
		batch[i].Buf = make([]byte, 2048)
	}
	got, bad := uint64(0), uint64(0)
	for {
		if s := g.Stats().Recv; s.Seen == n && got == s.Delivered {
			break
		}
		for i := range batch {
			batch[i].Buf = batch[i].Buf[:cap(batch[i].Buf)]
		}
		k, err := g.Recv(batch)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range batch[:k] {
			if !bth.VerifyICRC(endpoints(), d.Buf) {
				bad++
			}
		}
		got += uint64(k)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	s := g.Stats().Recv
	kept := float64(n) * (1 - o.Drop)
	within(t, "dropped", s.Dropped, n, o.Drop)
	within(t, "duplicated", s.Duplicated, kept, o.Duplicate)
	within(t, "corrupted", s.Corrupted, kept, o.Corrupt)
	// a corrupted datagram that is also duplicated arrives twice, both bad
	if bad < s.Corrupted || bad > 2*s.Corrupted || got != n-s.Dropped+s.Duplicated {
		t.Fatalf("received %d (%d bad), stats %+v", got, bad, s)
	}
}
