package fault

import (
	"math"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
)

// pbuf is a pooled datagram copy (held, corrupted, duplicated or queued for Recv). Buffers are
// reused: the pool stops allocating once it holds as many as the traffic needs at once.
type pbuf struct{ b []byte }

// maxFree bounds the free list, so a burst does not pin memory forever.
const maxFree = 4096

// held is a datagram held back by Delay, Reorder or a delayed Duplicate. It is released when the
// clock reaches deadline or, if count > 0, when count more datagrams have passed.
type held struct {
	pb       *pbuf
	src, dst netip.AddrPort
	tclass   uint8
	seq      uint64
	rule     int
	deadline time.Time
	count    int
}

type readyEnt struct {
	pb       *pbuf
	src, dst netip.AddrPort
	tclass   uint8
}

// decision is what happens to one datagram.
type decision struct {
	rule      int
	drop      bool
	corrupt   bool
	bitU      uint64
	dup       bool
	dupDelay  time.Duration
	reorder   bool
	hold      int
	holdDelay time.Duration
	delay     time.Duration
	mark      bool
}

// draws are the random values of one datagram, always drawn in this order so that each fault
// kind's outcome depends only on the seed, the direction and the datagram's index.
type draws struct {
	drop, corrupt, dup, reorder float64
	bit, dupDelay, hold, jitter uint64
	mark                        float64
}

// dir is one direction of the injector. All fields below mu are guarded by it. This file
// decides what happens to each datagram (draws, rules, corruption); deliver.go delivers it.
type dir struct {
	l       *Link
	which   Direction
	o       DirOptions
	valid   []bool // o.Rules[i] passed Validate
	active  bool
	random  bool
	clock   Clock
	onEvent func(Event)
	seed1   uint64
	seed2   uint64
	qmax    int
	onTimer func()

	// pass-through counters (direction with no fault: no lock taken)
	ptSeen, ptDelivered atomic.Uint64

	mu      sync.Mutex
	closed  bool
	pcg     rand.PCG
	rng     *rand.Rand
	pkt     bth.Packet
	seq     uint64
	matches []uint64
	held    []held
	timer   Timer
	armed   bool
	armedAt time.Time
	now     time.Time
	haveNow bool
	free    []*pbuf
	out     []link.Datagram
	outPB   []*pbuf
	stats   DirStats

	// receive side
	ready    []readyEnt // ring
	rhead    int
	rcount   int
	notEmpty sync.Cond
	notFull  sync.Cond
	pumpErr  error
}

func clampP(p float64) float64 {
	if !(p > 0) { // NaN too
		return 0
	}
	return math.Min(p, 1)
}

func clampD(d time.Duration) time.Duration { return max(d, 0) }

func newDir(l *Link, which Direction, o DirOptions) *dir {
	o.Drop, o.Duplicate, o.Reorder, o.Corrupt = clampP(o.Drop), clampP(o.Duplicate), clampP(o.Reorder), clampP(o.Corrupt)
	o.DuplicateDelay, o.ReorderDelay = clampD(o.DuplicateDelay), clampD(o.ReorderDelay)
	o.Delay, o.Jitter = clampD(o.Delay), clampD(o.Jitter)
	o.ReorderDepth = max(o.ReorderDepth, 1)
	if o.ReorderDelay == 0 {
		o.ReorderDelay = DefaultReorderDelay
	}
	if o.CorruptRegion > CorruptAnywhere {
		o.CorruptRegion = CorruptCovered
	}
	o.Rules = append([]Rule(nil), o.Rules...)
	d := &dir{l: l, which: which, o: o, clock: l.opts.Clock, onEvent: l.opts.OnEvent,
		seed1: l.opts.Seed1, seed2: l.opts.Seed2, qmax: l.opts.RecvQueue}
	d.valid = make([]bool, len(o.Rules))
	for i := range o.Rules {
		d.valid[i] = o.Rules[i].Validate() == nil
	}
	d.matches = make([]uint64, len(o.Rules))
	d.random = o.random()
	d.active = o.active()
	d.rng = rand.New(&d.pcg)
	d.onTimer = d.fire
	d.notEmpty.L = &d.mu
	d.notFull.L = &d.mu
	if which == DirRecv && d.active {
		d.ready = make([]readyEnt, d.qmax)
	}
	return d
}

// splitmix64's finalizer: decorrelates consecutive datagram indexes before they seed the PCG.
func mix(x uint64) uint64 {
	x += 0x9E3779B97F4A7C15
	x = (x ^ x>>30) * 0xBF58476D1CE4E5B9
	x = (x ^ x>>27) * 0x94D049BB133111EB
	return x ^ x>>31
}

// draw seeds the PCG for datagram seq of this direction and draws its values.
func (d *dir) draw(seq uint64) draws {
	salt := uint64(d.which+1) * 0xD1B54A32D192ED03
	d.pcg.Seed(mix(d.seed1^salt^mix(seq)), mix(d.seed2+seq))
	var v draws
	v.drop = d.rng.Float64()
	v.corrupt = d.rng.Float64()
	v.bit = d.rng.Uint64()
	v.dup = d.rng.Float64()
	v.dupDelay = d.rng.Uint64()
	v.reorder = d.rng.Float64()
	v.hold = d.rng.Uint64()
	v.jitter = d.rng.Uint64()
	v.mark = d.rng.Float64() // last: the earlier draws do not move
	return v
}

// parseBTH returns the BTH of b if bth.ParseInto accepts b. The cheap checks first keep
// ParseInto's error allocation off the path for datagrams that are obviously not RoCE.
func parseBTH(p *bth.Packet, b []byte) (bth.BTH, bool) {
	if len(b) < bth.BTHSize+bth.ICRCSize {
		return nil, false
	}
	h := bth.BTH(b[:bth.BTHSize])
	if h.TVer() != 0 || !h.Opcode().Valid() {
		return nil, false
	}
	if bth.ParseInto(p, b) != nil {
		return nil, false
	}
	return h, true
}

func (d *dir) clockNow() time.Time {
	if !d.haveNow {
		d.now, d.haveNow = d.clock.Now(), true
	}
	return d.now
}

func (d *dir) get(src []byte) *pbuf {
	var pb *pbuf
	if n := len(d.free); n > 0 {
		pb = d.free[n-1]
		d.free[n-1] = nil
		d.free = d.free[:n-1]
	} else {
		pb = &pbuf{b: make([]byte, 0, max(len(src), 2048))}
	}
	pb.b = append(pb.b[:0], src...)
	return pb
}

func (d *dir) put(pb *pbuf) {
	if len(d.free) < maxFree {
		d.free = append(d.free, pb)
	}
}

func (d *dir) event(kind Action, seq uint64, rule int, buf []byte, bit int, delay time.Duration, hold int) {
	if d.onEvent == nil {
		return
	}
	e := Event{Dir: d.which, Kind: kind, Seq: seq, Rule: rule, Len: len(buf), Bit: bit, Delay: delay, Hold: hold}
	if h, ok := parseBTH(&d.pkt, buf); ok {
		e.Parsed, e.Op, e.PSN, e.QPN = true, h.Opcode(), h.PSN(), h.DestQP()
	}
	d.onEvent(e)
}

// flip flips the bit chosen by u within the region; ok=false if the region is empty.
// The bit index is byte*8 + (0 = most significant bit).
func flip(b []byte, region CorruptRegion, u uint64) (bit int, ok bool) {
	n := len(b)
	skip4 := region != CorruptAnywhere
	if region == CorruptOutsideICRC {
		n -= bth.ICRCSize
	}
	if n <= 0 {
		return 0, false
	}
	bits := uint64(n) * 8
	if skip4 && n > 4 {
		bits -= 8 // BTH byte 4 is masked by the ICRC (IBTA A17.3.3)
	}
	k := u % bits
	byteIdx := int(k / 8)
	if skip4 && byteIdx >= 4 {
		byteIdx++
	}
	b[byteIdx] ^= 0x80 >> (k % 8)
	return byteIdx*8 + int(k%8), true
}

// decide returns the fault for datagram seq with payload buf.
func (d *dir) decide(seq uint64, buf []byte) decision {
	dec := decision{rule: -1}
	if len(d.o.Rules) > 0 {
		h, ok := parseBTH(&d.pkt, buf)
		for i := range d.o.Rules {
			r := &d.o.Rules[i]
			if !d.valid[i] || !r.matches(h, ok) {
				continue
			}
			d.matches[i]++
			if dec.rule < 0 && (r.Nth == 0 || d.matches[i] == uint64(r.Nth)) {
				dec.rule = i
			}
		}
	}
	latency := d.o.Delay > 0 || d.o.Jitter > 0
	if dec.rule >= 0 {
		r := &d.o.Rules[dec.rule]
		d.stats.RuleFired++
		var v draws
		if r.Action == Corrupt || latency {
			v = d.draw(seq)
		}
		switch r.Action {
		case Drop:
			dec.drop = true
		case Corrupt:
			dec.corrupt, dec.bitU = true, v.bit
		case Duplicate:
			dec.dup, dec.dupDelay = true, r.Delay
		case Reorder:
			dec.reorder, dec.hold, dec.holdDelay = true, max(r.Hold, 1), r.Delay
			if dec.holdDelay == 0 {
				dec.holdDelay = d.o.ReorderDelay
			}
			return dec
		case Delay:
			dec.delay = r.Delay
			return dec
		case Mark:
			dec.mark = true
		}
		if latency {
			dec.delay = d.latency(&v)
		}
		return dec
	}
	if !d.random {
		return dec
	}
	v := d.draw(seq)
	o := &d.o
	dec.drop = v.drop < o.Drop
	dec.corrupt, dec.bitU = v.corrupt < o.Corrupt, v.bit
	dec.dup = v.dup < o.Duplicate
	if dec.dup && o.DuplicateDelay > 0 {
		dec.dupDelay = time.Duration(1 + v.dupDelay%uint64(o.DuplicateDelay))
	}
	dec.mark = v.mark < o.Mark
	dec.reorder = v.reorder < o.Reorder
	if dec.reorder {
		dec.hold = 1 + int(v.hold%uint64(o.ReorderDepth))
		dec.holdDelay = o.ReorderDelay
	}
	if latency {
		dec.delay = d.latency(&v)
	}
	return dec
}

func (d *dir) latency(v *draws) time.Duration {
	j := time.Duration(0)
	if d.o.Jitter > 0 {
		j = time.Duration(v.jitter % uint64(d.o.Jitter+1))
	}
	return d.o.Delay + j
}

// process applies the faults to one datagram, appending what goes out now to d.out.
func (d *dir) process(dg *link.Datagram) {
	seq := d.seq
	d.seq++
	d.stats.Seen++
	buf := dg.Buf
	dec := d.decide(seq, buf)
	if dec.drop {
		d.stats.Dropped++
		d.event(Drop, seq, dec.rule, buf, 0, 0, 0)
		return
	}
	tc := dg.TClass
	if dec.mark && tc&link.ECNMask != link.ECNNotECT && tc&link.ECNMask != link.ECNCE {
		// a switch's ECN mark (RFC 3168 section 5: ECT becomes CE; a not-ECT packet is left as
		// it is, an AQM would drop it instead)
		tc |= link.ECNCE
		d.stats.Marked++
		d.event(Mark, seq, dec.rule, buf, 0, 0, 0)
	}
	var pb *pbuf
	if dec.corrupt {
		pb = d.get(buf)
		if bit, ok := flip(pb.b, d.o.CorruptRegion, dec.bitU); ok {
			d.stats.Corrupted++
			d.event(Corrupt, seq, dec.rule, pb.b, bit, 0, 0)
			buf = pb.b
		} else {
			d.put(pb)
			pb = nil
		}
	}
	passed := false
	var deadline time.Time
	count := 0
	switch {
	case dec.reorder:
		if pb == nil {
			pb = d.get(buf)
		}
		deadline, count = d.clockNow().Add(dec.holdDelay), dec.hold
		d.stats.Reordered++
		d.hold(held{pb: pb, src: dg.Src, dst: dg.Dst, tclass: tc, seq: seq, rule: dec.rule, deadline: deadline, count: count})
		d.event(Reorder, seq, dec.rule, buf, 0, dec.holdDelay, dec.hold)
	case dec.delay > 0:
		if pb == nil {
			pb = d.get(buf)
		}
		deadline = d.clockNow().Add(dec.delay)
		d.stats.Delayed++
		d.hold(held{pb: pb, src: dg.Src, dst: dg.Dst, tclass: tc, seq: seq, rule: dec.rule, deadline: deadline})
		d.event(Delay, seq, dec.rule, buf, 0, dec.delay, 0)
	default:
		d.emit(buf, pb, dg.Src, dg.Dst, tc)
		passed = true
	}
	if dec.dup {
		d.stats.Duplicated++
		switch {
		case dec.dupDelay > 0:
			d.hold(held{pb: d.get(buf), src: dg.Src, dst: dg.Dst, tclass: tc, seq: seq, rule: dec.rule,
				deadline: d.clockNow().Add(dec.dupDelay)})
			d.event(Duplicate, seq, dec.rule, buf, 0, dec.dupDelay, 0)
		case !passed:
			// the original is held: the copy waits right behind it
			d.hold(held{pb: d.get(buf), src: dg.Src, dst: dg.Dst, tclass: tc, seq: seq, rule: dec.rule,
				deadline: deadline, count: count})
			d.event(Duplicate, seq, dec.rule, buf, 0, 0, 0)
		default:
			d.event(Duplicate, seq, dec.rule, buf, 0, 0, 0)
			d.emit(buf, nil, dg.Src, dg.Dst, tc)
		}
	}
	if passed {
		d.tick()
	}
}
