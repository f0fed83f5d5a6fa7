package fault

import (
	"errors"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
)

// Receive-side faults: a plain sender, the injector on the receiver.

func TestRecvDropRule(t *testing.T) {
	a, b := memPair(t)
	g := Wrap(b, Options{Recv: DirOptions{Rules: []Rule{{Action: Drop, Match: MatchPSN, PSN: 2}}}})
	defer g.Close()
	sendPSNs(t, a, 0, 5)
	if got := psns(recvN(t, g, 4)); !slices.Equal(got, []uint32{0, 1, 3, 4}) {
		t.Fatalf("got %v", got)
	}
	if s := g.Stats().Recv; s.Seen != 5 || s.Dropped != 1 || s.RuleFired != 1 || s.Delivered != 4 {
		t.Fatalf("stats %+v", s)
	}
}

func TestRecvDuplicateAndCorrupt(t *testing.T) {
	a, b := memPair(t)
	g := Wrap(b, Options{Seed1: 5, Recv: DirOptions{Duplicate: 1, Corrupt: 1}})
	defer g.Close()
	sendPSNs(t, a, 0, 3)
	got := recvN(t, g, 6)
	if p := psns(got); !slices.Equal(p, []uint32{0, 0, 1, 1, 2, 2}) {
		t.Fatalf("got %v", p)
	}
	for i, p := range got {
		if bth.VerifyICRC(endpoints(), p) {
			t.Fatalf("datagram %d verifies", i)
		}
	}
	if s := g.Stats().Recv; s.Duplicated != 3 || s.Corrupted != 3 {
		t.Fatalf("stats %+v", s)
	}
}

func TestRecvDelayFakeClock(t *testing.T) {
	clk := newManualClock()
	a, b := memPair(t)
	log := newEventLog()
	g := Wrap(b, Options{Clock: AdaptClock(clk), OnEvent: log.add, Recv: DirOptions{Delay: 3 * time.Millisecond}})
	defer g.Close()
	// A Recv blocked before the datagram arrives must be woken by the clock's release.
	done := make(chan []uint32)
	go func() {
		batch := []link.Datagram{{Buf: make([]byte, link.MaxDatagram)}}
		n, err := g.Recv(batch)
		if err != nil || n != 1 {
			done <- nil
			return
		}
		done <- psns([][]byte{batch[0].Buf})
	}()
	sendPSNs(t, a, 7, 1)
	e := log.wait(t, Delay) // the pump has taken it and holds it
	if e.Dir != DirRecv || e.PSN != 7 || e.Delay != 3*time.Millisecond {
		t.Fatalf("event %+v", e)
	}
	clk.Advance(3*time.Millisecond - 1)
	if g.Queued() != 0 || g.Held(DirRecv) != 1 {
		t.Fatalf("queued %d held %d before the delay", g.Queued(), g.Held(DirRecv))
	}
	clk.Advance(1)
	if got := <-done; !slices.Equal(got, []uint32{7}) {
		t.Fatalf("got %v", got)
	}
	if clk.Pending() != 0 {
		t.Fatal("timer left armed")
	}
}

func TestRecvReorderRule(t *testing.T) {
	clk := newManualClock()
	a, b := memPair(t)
	g := Wrap(b, Options{Clock: AdaptClock(clk),
		Recv: DirOptions{Rules: []Rule{{Action: Reorder, Match: MatchPSN, PSN: 1, Hold: 2}}}})
	defer g.Close()
	sendPSNs(t, a, 0, 5)
	if got := psns(recvN(t, g, 5)); !slices.Equal(got, []uint32{0, 2, 3, 1, 4}) {
		t.Fatalf("got %v", got)
	}
}

func TestRecvReorderReleasedByClock(t *testing.T) {
	clk := newManualClock()
	a, b := memPair(t)
	log := newEventLog()
	g := Wrap(b, Options{Clock: AdaptClock(clk), OnEvent: log.add,
		Recv: DirOptions{ReorderDelay: 4 * time.Millisecond, Rules: []Rule{{Action: Reorder, Match: MatchPSN, PSN: 9, Hold: 3}}}})
	defer g.Close()
	sendPSNs(t, a, 9, 1) // the last datagram: nothing follows it, only the clock frees it
	if e := log.wait(t, Reorder); e.Delay != 4*time.Millisecond || e.Hold != 3 {
		t.Fatalf("event %+v", e)
	}
	clk.Advance(4 * time.Millisecond)
	if got := psns(recvN(t, g, 1)); !slices.Equal(got, []uint32{9}) {
		t.Fatalf("got %v", got)
	}
	if r := log.kinds(Release); len(r) != 1 || r[0].Seq != 0 || r[0].Rule != 0 {
		t.Fatalf("release events %+v", r)
	}
}

func TestRecvTruncatesLikeALink(t *testing.T) {
	a, b := memPair(t)
	g := Wrap(b, Options{Recv: DirOptions{Duplicate: 1}})
	defer g.Close()
	p := pkt(t, bth.OpRCSendOnly, 1, 1, 256)
	if err := a.Send([]link.Datagram{dg(p)}); err != nil {
		t.Fatal(err)
	}
	batch := []link.Datagram{{Buf: make([]byte, 16)}, {Buf: make([]byte, link.MaxDatagram)}}
	n, err := g.Recv(batch)
	for n < 2 && err == nil {
		var k int
		k, err = g.Recv(batch[n:])
		n += k
	}
	if err != nil || len(batch[0].Buf) != 16 || len(batch[1].Buf) != len(p) || batch[1].Src != srcA || batch[1].Dst != dstB {
		t.Fatalf("n=%d err=%v lens %d %d", n, err, len(batch[0].Buf), len(batch[1].Buf))
	}
}

func TestRecvClose(t *testing.T) {
	clk := newManualClock()
	a, b := memPair(t)
	log := newEventLog()
	g := Wrap(b, Options{Clock: AdaptClock(clk), OnEvent: log.add, Recv: DirOptions{Delay: time.Hour}})
	errc := make(chan error)
	go func() {
		_, err := g.Recv([]link.Datagram{{Buf: make([]byte, link.MaxDatagram)}})
		errc <- err
	}()
	sendPSNs(t, a, 0, 3)
	for range 3 {
		log.wait(t, Delay)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("blocked Recv returned %v", err)
	}
	if _, err := g.Recv([]link.Datagram{{Buf: make([]byte, 64)}}); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Recv after Close: %v", err)
	}
	if s := g.Stats().Recv; s.Discarded != 3 || s.Held != 0 || len(log.kinds(Discard)) != 3 || clk.Pending() != 0 {
		t.Fatalf("stats %+v timers %d", s, clk.Pending())
	}
	if g.Close() != nil {
		t.Fatal("second Close")
	}
}

func TestSendCloseDiscardsHeld(t *testing.T) {
	clk := newManualClock()
	a, _ := memPair(t)
	f := Wrap(a, Options{Clock: AdaptClock(clk), Send: DirOptions{Delay: time.Second, Duplicate: 1, DuplicateDelay: time.Second}})
	sendPSNs(t, f, 0, 4)
	if f.Held(DirSend) != 8 || clk.Pending() != 1 {
		t.Fatalf("held %d timers %d", f.Held(DirSend), clk.Pending())
	}
	f.Close()
	clk.Advance(time.Hour)
	if s := f.Stats().Send; s.Discarded != 8 || s.Released != 0 || clk.Pending() != 0 || innerSent(t, a) != 0 {
		t.Fatalf("stats %+v timers %d", s, clk.Pending())
	}
}
