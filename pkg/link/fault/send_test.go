package fault

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
)

// sendPSNs sends one RC SEND ONLY per PSN, one datagram per Send call.
func sendPSNs(t *testing.T, l link.Link, from, n int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		if err := l.Send([]link.Datagram{dg(pkt(t, bth.OpRCSendOnly, 0x11, bth.PSN(i), 16))}); err != nil {
			t.Fatal(err)
		}
	}
}

func seq(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

func TestPassThrough(t *testing.T) {
	a, b := memPair(t)
	f := Wrap(a, Options{})
	g := Wrap(b, Options{})
	sendPSNs(t, f, 0, 5)
	if got := psns(recvN(t, g, 5)); !slices.Equal(got, seq(0, 5)) {
		t.Fatalf("got %v", got)
	}
	s := f.Stats()
	if s.Send.Seen != 5 || s.Send.Delivered != 5 {
		t.Fatalf("send stats %+v", s.Send)
	}
	if r := g.Stats().Recv; r.Seen != 5 || r.Delivered != 5 {
		t.Fatalf("recv stats %+v", r)
	}
	if f.BatchSize() != a.BatchSize() || !slices.Equal(f.LocalAddrs(), a.LocalAddrs()) ||
		f.SourcePort(addrA, 0xC123) != a.SourcePort(addrA, 0xC123) || f.Inner() != a {
		t.Fatal("wrapper does not forward BatchSize/LocalAddrs/SourcePort/Inner")
	}
}

func TestSendDropAll(t *testing.T) {
	a, _ := memPair(t)
	f := Wrap(a, Options{Send: DirOptions{Drop: 1}})
	sendPSNs(t, f, 0, 20)
	if n := innerSent(t, a); n != 0 {
		t.Fatalf("inner sent %d, want 0", n)
	}
	if s := f.Stats().Send; s.Seen != 20 || s.Dropped != 20 || s.Delivered != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestSendDuplicateImmediate(t *testing.T) {
	a, b := memPair(t)
	f := Wrap(a, Options{Send: DirOptions{Duplicate: 1}})
	sendPSNs(t, f, 0, 4)
	want := []uint32{0, 0, 1, 1, 2, 2, 3, 3}
	if got := psns(recvN(t, b, 8)); !slices.Equal(got, want) {
		t.Fatalf("got %v want %v", got, want)
	}
	if s := f.Stats().Send; s.Duplicated != 4 || s.Delivered != 8 {
		t.Fatalf("stats %+v", s)
	}
}

func TestSendDuplicateDelayed(t *testing.T) {
	clk := newManualClock()
	a, b := memPair(t)
	f := Wrap(a, Options{Clock: AdaptClock(clk), Send: DirOptions{Duplicate: 1, DuplicateDelay: 10 * time.Millisecond}})
	sendPSNs(t, f, 0, 3)
	if got := psns(recvN(t, b, 3)); !slices.Equal(got, seq(0, 3)) {
		t.Fatalf("originals %v", got)
	}
	if f.Held(DirSend) != 3 || innerSent(t, a) != 3 {
		t.Fatalf("held %d sent %d", f.Held(DirSend), innerSent(t, a))
	}
	clk.Advance(10 * time.Millisecond) // every copy's delay is in (0, 10ms]
	got := psns(recvN(t, b, 3))
	slices.Sort(got)
	if !slices.Equal(got, seq(0, 3)) || f.Held(DirSend) != 0 || clk.Pending() != 0 {
		t.Fatalf("copies %v held %d timers %d", got, f.Held(DirSend), clk.Pending())
	}
}

func TestSendCorrupt(t *testing.T) {
	for _, region := range []CorruptRegion{CorruptCovered, CorruptOutsideICRC} {
		a, b := memPair(t)
		f := Wrap(a, Options{Seed1: 9, Send: DirOptions{Corrupt: 1, CorruptRegion: region}})
		orig := pkt(t, bth.OpRCWriteOnly, 0x12, 7, 64)
		keep := bytes.Clone(orig)
		for i := 0; i < 50; i++ {
			if err := f.Send([]link.Datagram{dg(orig)}); err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(orig, keep) {
			t.Fatal("Send modified the caller's buffer")
		}
		for i, p := range recvN(t, b, 50) {
			if bth.VerifyICRC(endpoints(), p) {
				t.Fatalf("region %d datagram %d: ICRC still verifies", region, i)
			}
			diff := 0
			for j := range p {
				if p[j] != orig[j] {
					diff++
					if j == 4 || (region == CorruptOutsideICRC && j >= len(p)-bth.ICRCSize) {
						t.Fatalf("region %d: byte %d changed", region, j)
					}
				}
			}
			if diff != 1 {
				t.Fatalf("%d bytes differ, want 1", diff)
			}
		}
		if s := f.Stats().Send; s.Corrupted != 50 {
			t.Fatalf("stats %+v", s)
		}
	}
}

// TestFlipEveryBit checks flip over every bit of each region: exactly one bit changes, never
// in a masked byte (unless CorruptAnywhere), and the ICRC check catches every covered flip
// and none in BTH byte 4 (IBTA A17.3.3 masks it).
func TestFlipEveryBit(t *testing.T) {
	orig := pkt(t, bth.OpRCSendOnly, 0x12, 3, 8)
	ep := endpoints()
	for _, region := range []CorruptRegion{CorruptCovered, CorruptOutsideICRC, CorruptAnywhere} {
		nbits := len(orig) * 8
		seen := map[int]bool{}
		for u := 0; u < nbits; u++ {
			p := bytes.Clone(orig)
			bit, ok := flip(p, region, uint64(u))
			if !ok {
				t.Fatal("no bit")
			}
			if p[bit/8]^orig[bit/8] != 0x80>>(bit%8) {
				t.Fatalf("bit %d: byte %d changed wrongly", bit, bit/8)
			}
			seen[bit] = true
			verifies := bth.VerifyICRC(ep, p)
			if bit/8 == 4 {
				if region != CorruptAnywhere {
					t.Fatalf("region %d flipped masked byte 4", region)
				}
				if !verifies {
					t.Fatal("a flip in BTH byte 4 changed the ICRC: byte 4 should be masked")
				}
				continue
			}
			if verifies {
				t.Fatalf("region %d bit %d: ICRC still verifies", region, bit)
			}
			if region == CorruptOutsideICRC && bit/8 >= len(p)-bth.ICRCSize {
				t.Fatalf("bit %d is in the ICRC", bit)
			}
		}
		want := map[CorruptRegion]int{CorruptCovered: nbits - 8, CorruptOutsideICRC: nbits - 8 - 32, CorruptAnywhere: nbits}[region]
		if len(seen) != want {
			t.Fatalf("region %d: %d distinct bits, want %d", region, len(seen), want)
		}
	}
	if _, ok := flip(make([]byte, 3), CorruptOutsideICRC, 1); ok {
		t.Fatal("flip in an empty region")
	}
	if _, ok := flip(nil, CorruptCovered, 1); ok {
		t.Fatal("flip of an empty datagram")
	}
}

func TestSendDelayFakeClock(t *testing.T) {
	clk := newManualClock()
	a, b := memPair(t)
	f := Wrap(a, Options{Clock: AdaptClock(clk), Send: DirOptions{Delay: 5 * time.Millisecond}})
	sendPSNs(t, f, 0, 3)
	clk.Advance(2 * time.Millisecond)
	sendPSNs(t, f, 3, 2)
	if innerSent(t, a) != 0 || f.Held(DirSend) != 5 {
		t.Fatalf("sent %d held %d before the delay", innerSent(t, a), f.Held(DirSend))
	}
	clk.Advance(3*time.Millisecond - 1)
	if innerSent(t, a) != 0 {
		t.Fatal("released early")
	}
	clk.Advance(1)
	if got := psns(recvN(t, b, 3)); !slices.Equal(got, seq(0, 3)) || f.Held(DirSend) != 2 {
		t.Fatalf("at 5ms: %v held %d", got, f.Held(DirSend))
	}
	clk.Advance(2 * time.Millisecond)
	if got := psns(recvN(t, b, 2)); !slices.Equal(got, seq(3, 2)) {
		t.Fatalf("at 7ms: %v", got)
	}
	if s := f.Stats().Send; s.Delayed != 5 || s.Released != 5 || s.Delivered != 5 || s.Held != 0 || clk.Pending() != 0 {
		t.Fatalf("stats %+v timers %d", s, clk.Pending())
	}
}

func TestSendJitterBounded(t *testing.T) {
	clk := newManualClock()
	a, b := memPair(t)
	log := newEventLog()
	f := Wrap(a, Options{Seed1: 3, Clock: AdaptClock(clk), OnEvent: log.add,
		Send: DirOptions{Delay: time.Millisecond, Jitter: time.Millisecond}})
	sendPSNs(t, f, 0, 200)
	clk.Advance(time.Millisecond - 1)
	if innerSent(t, a) != 0 {
		t.Fatal("released before Delay")
	}
	clk.Advance(time.Millisecond + 1)
	got := psns(recvN(t, b, 200))
	// arrival order is deadline order: sort the events by delay (stable) to predict it
	ev := log.kinds(Delay)
	slices.SortStableFunc(ev, func(x, y Event) int { return int(x.Delay - y.Delay) })
	for i, e := range ev {
		if e.Delay < time.Millisecond || e.Delay > 2*time.Millisecond {
			t.Fatalf("delay %v out of bounds", e.Delay)
		}
		if uint32(e.PSN) != got[i] {
			t.Fatalf("arrival %d is PSN %d, want %d", i, got[i], e.PSN)
		}
	}
	if slices.IsSorted(got) {
		t.Fatal("jitter of up to 1ms reordered nothing among 200 datagrams")
	}
}

func TestSendReorderRandom(t *testing.T) {
	clk := newManualClock()
	a, b := memPair(t)
	log := newEventLog()
	const n, depth = 400, 3
	f := Wrap(a, Options{Seed1: 11, Clock: AdaptClock(clk), OnEvent: log.add,
		Send: DirOptions{Reorder: 0.2, ReorderDepth: depth, ReorderDelay: time.Second}})
	sendPSNs(t, f, 0, n)
	clk.Advance(time.Second) // releases whatever the last datagrams still hold
	got := psns(recvN(t, b, n))
	sorted := slices.Clone(got)
	slices.Sort(sorted)
	if !slices.Equal(sorted, seq(0, n)) {
		t.Fatal("reorder lost or invented datagrams")
	}
	pos := map[uint32]int{}
	for i, p := range got {
		pos[p] = i
	}
	reo := log.kinds(Reorder)
	if len(reo) < n/10 {
		t.Fatalf("only %d reorders", len(reo))
	}
	held := map[uint32]bool{}
	for _, e := range reo {
		held[uint32(e.PSN)] = true
	}
	for _, e := range reo {
		if e.Hold < 1 || e.Hold > depth || uint64(e.PSN) != e.Seq {
			t.Fatalf("event %+v", e)
		}
		// it is released right after the Hold-th later datagram that was not itself held:
		// exactly Hold such datagrams arrive before it (fewer only at the end, where the
		// clock releases it).
		passed := 0
		for p := uint32(e.PSN) + 1; p < n; p++ {
			if !held[p] && pos[p] < pos[uint32(e.PSN)] {
				passed++
			}
		}
		if passed != e.Hold && !(passed < e.Hold && uint32(e.PSN) >= n-4*depth) {
			t.Fatalf("PSN %d (hold %d): %d later datagrams passed it", e.PSN, e.Hold, passed)
		}
	}
	if slices.IsSorted(got) {
		t.Fatal("not reordered")
	}
	if s := f.Stats().Send; s.Reordered != uint64(len(reo)) || s.Released != s.Reordered || s.Delivered != n {
		t.Fatalf("stats %+v", s)
	}
}

func TestSendValidatesBatchFirst(t *testing.T) {
	a, _ := memPair(t)
	log := newEventLog()
	f := Wrap(a, Options{OnEvent: log.add, Send: DirOptions{Duplicate: 1}})
	good := dg(pkt(t, bth.OpRCSendOnly, 1, 1, 4))
	bad := []struct {
		d    link.Datagram
		want error
	}{
		{link.Datagram{Buf: good.Buf, Src: netip.AddrPortFrom(addrA, 0), Dst: dstB}, link.ErrInvalidAddr},
		{link.Datagram{Buf: good.Buf, Src: srcA}, link.ErrInvalidAddr},
		{link.Datagram{Buf: good.Buf, Src: netip.AddrPortFrom(addrB, 1), Dst: dstB}, link.ErrNoLocalAddr},
		{link.Datagram{Buf: make([]byte, link.MaxDatagram+1), Src: srcA, Dst: dstB}, link.ErrTooLarge},
	}
	for i, c := range bad {
		err := f.Send([]link.Datagram{good, c.d})
		if !errors.Is(err, c.want) {
			t.Fatalf("case %d: %v, want %v", i, err, c.want)
		}
	}
	if innerSent(t, a) != 0 || len(log.all()) != 0 || f.Stats().Send.Seen != 0 {
		t.Fatal("an invalid batch sent or faulted something")
	}
	f.Close()
	if err := f.Send([]link.Datagram{good}); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("send after close: %v", err)
	}
}
