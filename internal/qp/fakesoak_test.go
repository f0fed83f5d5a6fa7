package qp

import (
	"encoding/binary"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/pkg/link/fault"
)

// The fake-clock soak: pkg/roce's soak (random RC work both ways through
// 10% drop, 5% duplicate, 5% reorder) on the channel double and the
// ManualClock, so a run is a pure function of its seed: any failure
// reproduces exactly (-fakesoak.seed) and time jumps straight to the next
// timer, so thousands of timeouts cost nothing.
var (
	fakeSoakSeeds = flag.Int("fakesoak.seeds", 4, "fake-clock soak: seeds to run")
	fakeSoakSeed  = flag.Uint64("fakesoak.seed", 0, "fake-clock soak: run only this seed")
	fakeSoakMsgs  = flag.Int("fakesoak.msgs", 1500, "fake-clock soak: messages per direction")
)

func TestFakeClockSoak(t *testing.T) {
	seeds := []uint64{}
	if *fakeSoakSeed != 0 {
		seeds = append(seeds, *fakeSoakSeed)
	} else {
		for i := 1; i <= *fakeSoakSeeds; i++ {
			seeds = append(seeds, uint64(i))
		}
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { fakeSoak(t, seed, *fakeSoakMsgs) })
	}
}

const fsWindow = 16

type fsWR struct {
	op      WROpcode
	n, roff int
	seq     uint64
	want    uint64
}

type fsDir struct {
	src, dst  *side
	id        uint64
	rng       *rand.Rand
	posted    int
	completed int
	wrs       [fsWindow]fsWR
	expect    []fsWR // SEND/WRITE_IMM receive completions, in order
	faa, cas  uint64
	sizes     map[uint64]int // seq -> size (diagnostics)
	readMax   int            // READs of up to readMax bytes (0: as the other WRs; srread_test.go)
}

// layout in each side's 4 MiB buffer
const (
	fsLocal  = 0       // 16 x 4 KiB
	fsRecv   = 1 << 16 // 16 x 4 KiB
	fsWrite  = 2 << 16 // 16 x 4 KiB
	fsRead   = 3 << 16 // 64 KiB of fixed bytes
	fsAtomic = 4 << 16
)

func fsPattern(b []byte, id, seq uint64) {
	x := id*0x9E3779B97F4A7C15 ^ seq*0xBF58476D1CE4E5B9 | 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
}

func (d *fsDir) post(t *testing.T) {
	seq := uint64(d.posted)
	slot := d.posted % fsWindow
	loc := fsLocal + slot*4096
	w := &d.wrs[slot]
	*w = fsWR{seq: seq}
	size := d.rng.IntN(3*256 + 40)
	wr := SendWR{WRID: seq, Flags: SendSignaled}
	switch r := d.rng.IntN(10); {
	case r < 3:
		wr.Opcode = WRSend
	case r < 5:
		wr.Opcode = WRRDMAWrite
	case r < 6:
		wr.Opcode = WRRDMAWriteWithImm
	case r < 8:
		wr.Opcode = WRRDMARead
	case r < 9:
		wr.Opcode = WRAtomicFetchAndAdd
	default:
		wr.Opcode = WRAtomicCmpAndSwp
	}
	w.op = wr.Opcode
	switch wr.Opcode {
	case WRSend, WRRDMAWrite, WRRDMAWriteWithImm:
		fsPattern(d.src.buf[loc:loc+size], d.id, seq)
		wr.SGL = []SGE{d.src.sge(loc, size)}
		wr.Imm = uint32(seq)
		if wr.Opcode != WRSend {
			wr.RemoteAddr, wr.RKey = d.dst.va(fsWrite+slot*4096), d.dst.mr.RKey()
		}
		if wr.Opcode != WRRDMAWrite {
			d.expect = append(d.expect, fsWR{op: wr.Opcode, n: size, seq: seq})
		}
		w.n = size
	case WRRDMARead:
		w.roff = d.rng.IntN(60000)
		if d.readMax > 0 {
			size = d.rng.IntN(d.readMax + 1)
			w.roff = d.rng.IntN(64<<10 - d.readMax)
		}
		clear(d.src.buf[loc : loc+size])
		wr.SGL = []SGE{d.src.sge(loc, size)}
		wr.RemoteAddr, wr.RKey = d.dst.va(fsRead+w.roff), d.dst.mr.RKey()
		w.n = size
	case WRAtomicFetchAndAdd:
		wr.SGL = []SGE{d.src.sge(loc, 8)}
		wr.RemoteAddr, wr.RKey, wr.CompareAdd = d.dst.va(fsAtomic), d.dst.mr.RKey(), d.rng.Uint64()
		w.want, d.faa = d.faa, d.faa+wr.CompareAdd
		w.n = 8
	case WRAtomicCmpAndSwp:
		wr.SGL = []SGE{d.src.sge(loc, 8)}
		wr.RemoteAddr, wr.RKey, wr.Swap = d.dst.va(fsAtomic+8), d.dst.mr.RKey(), d.rng.Uint64()
		wr.CompareAdd = d.cas
		if d.rng.IntN(3) == 0 {
			wr.CompareAdd = d.rng.Uint64()
		}
		w.want = d.cas
		if wr.CompareAdd == d.cas {
			d.cas = wr.Swap
		}
		w.n = 8
	}
	if d.sizes == nil {
		d.sizes = map[uint64]int{}
	}
	d.sizes[seq] = w.n
	d.src.postSend(t, wr)
	d.posted++
}

func (d *fsDir) repost(t *testing.T, slot int) {
	d.dst.postRecv(t, RecvWR{WRID: uint64(slot), SGL: []SGE{d.dst.sge(fsRecv+slot*4096, 4096)}})
}

// poll checks completions; it returns how many it saw.
func (d *fsDir) poll(t *testing.T) int {
	t.Helper()
	got := 0
	for _, wc := range pollAll(d.src.scq) {
		got++
		slot := d.completed % fsWindow
		w := &d.wrs[slot]
		loc := fsLocal + slot*4096
		if wc.WRID != w.seq || wc.Status != cq.StatusSuccess || wc.ByteLen != uint32(w.n) {
			t.Fatalf("dir %d: completion %+v (%v), want WR %d %v of %d bytes", d.id, wc, wc.Status, w.seq, w.op, w.n)
		}
		switch w.op {
		case WRRDMAWrite, WRRDMAWriteWithImm:
			off := fsWrite + slot*4096
			want := make([]byte, w.n)
			fsPattern(want, d.id, w.seq)
			eq(t, fmt.Sprintf("dir %d WRITE %d", d.id, w.seq), d.dst.buf[off:off+w.n], want)
		case WRRDMARead:
			eq(t, fmt.Sprintf("dir %d READ %d", d.id, w.seq), d.src.buf[loc:loc+w.n], d.dst.buf[fsRead+w.roff:fsRead+w.roff+w.n])
		case WRAtomicFetchAndAdd, WRAtomicCmpAndSwp:
			if v := binary.LittleEndian.Uint64(d.src.buf[loc:]); v != w.want {
				t.Fatalf("dir %d: %v %d returned %#x, want %#x", d.id, w.op, w.seq, v, w.want)
			}
		}
		d.completed++
	}
	for _, wc := range pollAll(d.dst.rcq) {
		got++
		if len(d.expect) == 0 {
			t.Fatalf("dir %d: unexpected receive %+v", d.id, wc)
		}
		e := d.expect[0]
		d.expect = d.expect[1:]
		slot := int(wc.WRID)
		if wc.Status != cq.StatusSuccess || uint32(e.seq) != wc.ImmData && e.op == WRRDMAWriteWithImm {
			t.Fatalf("dir %d: receive %+v (%v), want %+v", d.id, wc, wc.Status, e)
		}
		if e.op == WRSend {
			if wc.ByteLen != uint32(e.n) {
				var same []uint64
				for k, v := range d.sizes {
					if v == int(wc.ByteLen) {
						same = append(same, k)
					}
				}
				t.Fatalf("dir %d: receive %+v, want SEND %d of %d bytes (WRs of %d bytes: %v)", d.id, wc, e.seq, e.n, wc.ByteLen, same)
			}
			want := make([]byte, e.n)
			fsPattern(want, d.id, e.seq)
			eq(t, fmt.Sprintf("dir %d SEND %d", d.id, e.seq), d.dst.buf[fsRecv+slot*4096:fsRecv+slot*4096+e.n], want)
		}
		d.repost(t, slot)
	}
	return got
}

func fakeSoak(t *testing.T, seed uint64, msgs int) { fakeSoakOpts(t, seed, msgs, connOpts{}) }

// fakeSoakOpts is fakeSoak with the connection's selective repeat flags from co.
func fakeSoakOpts(t *testing.T, seed uint64, msgs int, co connOpts) {
	fakeSoakRun(t, seed, msgs, co, 0)
}

// fakeSoakRun is fakeSoakOpts with READs of up to readMax bytes (0: as the other WRs).
func fakeSoakRun(t *testing.T, seed uint64, msgs int, co connOpts, readMax int) {
	n := newNet(t)
	fo := fault.DirOptions{Drop: 0.10, Duplicate: 0.05, Reorder: 0.05, ReorderDepth: 3}
	var links []*fault.Link
	mk := func(addr string, qpn uint32, s2 uint64) *side {
		ip := netip.MustParseAddr(addr)
		return n.newSide(addr, sideOpts{qpn: qpn, cap: Cap{MaxSendWR: fsWindow, MaxRecvWR: 8, MaxSendSGE: 2, MaxRecvSGE: 2},
			out: func(c *chanOut) Output {
				fl := fault.Wrap(chanLink{c, ip}, fault.Options{Seed1: seed, Seed2: s2, Clock: n.clk, Send: fo})
				links = append(links, fl)
				return fl
			}})
	}
	a := mk("10.0.0.1", 0x11, 1)
	b := mk("10.0.0.2", 0x12, 2)
	defer func() {
		for _, l := range links {
			l.Close()
		}
	}()
	n.connect(a, b, connOpts{mtu: MTU256, psnA: 0xFFFFFF - 300, psnB: 12345, timeout: 12, retry: 7, rnrRetry: 7, minRNR: 1,
		srA: co.srA, srB: co.srB})
	for _, s := range []*side{a, b} {
		fsPattern(s.buf[fsRead:fsRead+64<<10], 0xEAD, 0)
	}
	dirs := []*fsDir{
		{src: a, dst: b, id: 0, rng: rand.New(rand.NewPCG(seed, 0)), readMax: readMax},
		{src: b, dst: a, id: 1, rng: rand.New(rand.NewPCG(seed, 1)), readMax: readMax},
	}
	for _, d := range dirs {
		for i := 0; i < 8; i++ {
			d.repost(t, i)
		}
	}
	start := n.clk.Now()
	idle := 0
	for {
		done := true
		for _, d := range dirs {
			for d.posted < msgs && d.posted-d.completed < fsWindow {
				d.post(t)
			}
			if d.completed < msgs || len(d.expect) > 0 {
				done = false
			}
		}
		if done {
			break
		}
		n.pump()
		got := 0
		for _, d := range dirs {
			got += d.poll(t)
		}
		if got > 0 {
			idle = 0
			continue
		}
		if a.qp.State() != StateRTS || b.qp.State() != StateRTS {
			t.Fatalf("seed %d: states %v %v after %d/%d completions", seed, a.qp.State(), b.qp.State(), dirs[0].completed, dirs[1].completed)
		}
		dl, ok := n.clk.NextDeadline()
		if !ok {
			t.Fatalf("seed %d: stuck with no timer: %d/%d completed", seed, dirs[0].completed, dirs[1].completed)
		}
		if idle++; idle > 100 {
			t.Fatalf("seed %d: no progress over 100 timer expiries: %d/%d completed", seed, dirs[0].completed, dirs[1].completed)
		}
		n.clk.Advance(dl.Sub(n.clk.Now()))
	}
	for _, d := range dirs {
		if v := binary.LittleEndian.Uint64(d.dst.buf[fsAtomic:]); v != d.faa {
			t.Fatalf("dir %d: FETCH_ADD word %#x, want %#x", d.id, v, d.faa)
		}
		if v := binary.LittleEndian.Uint64(d.dst.buf[fsAtomic+8:]); v != d.cas {
			t.Fatalf("dir %d: CMP_SWP word %#x, want %#x", d.id, v, d.cas)
		}
	}
	t.Logf("seed %d: %d messages, %v of fake time; a %+v", seed, 2*msgs, n.clk.Now().Sub(start), a.cnt.Snapshot())
	_ = time.Second
}
