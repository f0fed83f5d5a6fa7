package fault

import (
	"testing"
	"time"

	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/mem"
)

// No fault fires (random draws run, rules are checked): no allocation per datagram.
func TestAllocsSendNoFaultFires(t *testing.T) {
	c := &capture{}
	f := Wrap(c, Options{Seed1: 1, Send: DirOptions{Drop: 1e-12, Corrupt: 1e-12,
		Rules: []Rule{{Action: Drop, Match: MatchOp | MatchPSN, Op: bth.OpRCAck, PSN: 5}}}})
	defer f.Close()
	batch := []link.Datagram{dg(pkt(t, bth.OpRCSendOnly, 1, 1, 64)), dg(pkt(t, bth.OpRCAck, 1, 4, 0))}
	if a := testing.AllocsPerRun(1000, func() { _ = f.Send(batch) }); a != 0 {
		t.Fatalf("%v allocations per Send", a)
	}
	if f.Stats().Send.Dropped != 0 || c.count != 2*1001 {
		t.Fatal("a fault fired")
	}
}

// Faults firing (corrupt, duplicate, reorder, jitter on a fake clock) reuse pooled buffers:
// no allocation per datagram once warm.
func TestAllocsSendFaultsFiring(t *testing.T) {
	clk := newManualClock()
	c := &capture{}
	f := Wrap(c, Options{Seed1: 1, Clock: AdaptClock(clk), Send: DirOptions{Corrupt: 1, Duplicate: 0.5,
		Reorder: 0.3, ReorderDepth: 2, Jitter: time.Microsecond}})
	defer f.Close()
	batch := []link.Datagram{dg(pkt(t, bth.OpRCSendOnly, 1, 1, 64)), dg(pkt(t, bth.OpRCWriteOnly, 1, 2, 256))}
	step := func() {
		_ = f.Send(batch)
		clk.Advance(time.Microsecond)
	}
	for range 200 {
		step()
	}
	// the fake clock's Advance allocates its due list: measure it alone and subtract
	base := testing.AllocsPerRun(500, func() { clk.Advance(time.Microsecond) })
	if a := testing.AllocsPerRun(500, step); a-base > 0 {
		t.Fatalf("%v allocations per Send (clock alone %v)", a, base)
	}
	if s := f.Stats().Send; s.Corrupted == 0 || s.Duplicated == 0 || s.Reordered == 0 || s.Delayed == 0 {
		t.Fatalf("faults did not fire: %+v", s)
	}
}

// Receive path (pump goroutine included: AllocsPerRun counts every goroutine's allocations).
func TestAllocsRecvPath(t *testing.T) {
	// a shallow queue: every ring slot of the in-memory link is warm after the first steps
	n0 := mem.NewNetwork(mem.Options{QueueDepth: 8})
	a, _ := n0.Attach(addrA)
	b, _ := n0.Attach(addrB)
	defer a.Close()
	g := Wrap(b, Options{Seed1: 3, Recv: DirOptions{Duplicate: 1, Corrupt: 0.5,
		Rules: []Rule{{Action: Drop, Match: MatchPSN, PSN: 999}}}})
	defer g.Close()
	out := []link.Datagram{dg(pkt(t, bth.OpRCSendOnly, 1, 1, 64))}
	in := []link.Datagram{{Buf: make([]byte, link.MaxDatagram)}, {Buf: make([]byte, link.MaxDatagram)}}
	step := func() {
		if err := a.Send(out); err != nil {
			t.Fatal(err)
		}
		for got := 0; got < 2; {
			for i := range in {
				in[i].Buf = in[i].Buf[:cap(in[i].Buf)]
			}
			n, err := g.Recv(in[:2-got])
			if err != nil {
				t.Fatal(err)
			}
			got += n
		}
	}
	for range 100 {
		step()
	}
	if n := testing.AllocsPerRun(1000, step); n != 0 {
		t.Fatalf("%v allocations per datagram", n)
	}
}

func BenchmarkSendNoFault(b *testing.B) {
	f := Wrap(&capture{}, Options{Send: DirOptions{Drop: 1e-12}})
	defer f.Close()
	batch := make([]link.Datagram, 32)
	for i := range batch {
		batch[i] = dg(pkt(b, bth.OpRCSendMiddle, 1, bth.PSN(i), 1024))
	}
	b.ReportAllocs()
	b.SetBytes(32 * 1024)
	for b.Loop() {
		_ = f.Send(batch)
	}
}

func BenchmarkSendRules(b *testing.B) {
	f := Wrap(&capture{}, Options{Send: DirOptions{Rules: []Rule{{Action: Drop, Match: MatchOp, Op: bth.OpRCAck, Nth: 3}}}})
	defer f.Close()
	batch := make([]link.Datagram, 32)
	for i := range batch {
		batch[i] = dg(pkt(b, bth.OpRCSendMiddle, 1, bth.PSN(i), 1024))
	}
	b.ReportAllocs()
	b.SetBytes(32 * 1024)
	for b.Loop() {
		_ = f.Send(batch)
	}
}
