package daemon_test

import (
	"encoding/binary"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/link/fault"
	"github.com/softroce/softroce/pkg/link/mem"
)

// The daemon soak (scripts/soak): the random RC mix of the engine's soak (pkg/roce
// TestSoak) run by clients of two daemons, so every work request and completion goes through
// the daemons' rings — posts through the post rings (the drainers' turns), completions
// through the completion rings and their arms (Channel waits), receives made visible by the
// refill — while the devices' links drop, duplicate, reorder and corrupt datagrams. Big READs
// (more than 128 response packets) are in the mix. Every byte, every completion and every
// atomic result is checked against a model.
var (
	soakMsgs = flag.Int("soak.msgs", 0, "daemon soak: messages (0: a short default)")
	soakSeed = flag.Uint64("soak.seed", 1, "daemon soak: seed of the faults and of the work mix")
	soakBig  = flag.Int("soak.bigread", 200<<10, "daemon soak: largest big READ in bytes (one READ in 8 is between half of it and it; MTU 1024)")
)

const (
	dsWindow = 16 // WRs in flight per direction
	dsRQ     = 8  // receives per QP (fewer: RNR NAKs happen)
	dsSlot   = 4096
	dsMax    = 3089 // largest ordinary message
	dsRead   = 64 << 10
)

// dsLayout is one end's buffer: local slots (send sources, READ targets, atomic results),
// receive slots, WRITE targets of the peer, the bytes the peer READs, the atomic words and
// the big READs' target.
type dsLayout struct{ local, recv, write, readSrc, readLen, atomic, big, size int }

func newDSLayout(big int) dsLayout {
	var l dsLayout
	l.recv = dsWindow * dsSlot
	l.write = l.recv + dsRQ*dsSlot
	l.readSrc = l.write + dsWindow*dsSlot
	l.readLen = max(dsRead, big)
	l.atomic = l.readSrc + l.readLen
	l.big = l.atomic + 64
	l.size = l.big + big
	return l
}

// dsDir is one direction of one pair: src posts, dst answers.
type dsDir struct {
	id        uint64
	src, dst  *end
	l         dsLayout
	rng       *rand.Rand
	n, big    int
	posted    int
	completed int
	wrs       [dsWindow]struct {
		op        qp.WROpcode
		n, roff   int
		seq, want uint64
		big       bool
	}
	expect []struct {
		seq, n int
		op     cq.Opcode
		imm    uint32
	}
	recvSeq  int
	faa, cas uint64
	bigOut   bool
	bigReads int
}

func dsPattern(b []byte, id uint64, seq int) {
	x := id*0x9E3779B97F4A7C15 ^ uint64(seq)*0xBF58476D1CE4E5B9 | 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
}

func (s *dsDir) sge(e *end, off, n int) qp.SGE {
	return qp.SGE{Addr: e.iova + uint64(off), Length: uint32(n), LKey: e.m.LKey()}
}

func (s *dsDir) postRecv(slot int) error {
	off := s.l.recv + slot*dsSlot
	_, err := s.dst.q.PostRecv([]qp.RecvWR{{WRID: uint64(slot), SGL: []qp.SGE{s.sge(s.dst, off, dsSlot/2), s.sge(s.dst, off+dsSlot/2, dsSlot/2)}}})
	return err
}

func (s *dsDir) post() error {
	seq, slot := s.posted, s.posted%dsWindow
	loc := s.l.local + slot*dsSlot
	w := &s.wrs[slot]
	w.seq, w.big, w.want = uint64(seq), false, 0
	size := s.rng.IntN(dsMax + 1)
	wr := qp.SendWR{WRID: uint64(seq), Flags: qp.SendSignaled, RKey: s.dst.m.RKey()}
	r := s.rng.IntN(100)
	switch {
	case r < 22:
		wr.Opcode = qp.WRSend
	case r < 30:
		wr.Opcode = qp.WRSendWithImm
	case r < 52:
		wr.Opcode = qp.WRRDMAWrite
	case r < 60:
		wr.Opcode = qp.WRRDMAWriteWithImm
	case r < 80:
		wr.Opcode = qp.WRRDMARead
	case r < 90:
		wr.Opcode = qp.WRAtomicFetchAndAdd
	default:
		wr.Opcode = qp.WRAtomicCmpAndSwp
	}
	w.op = wr.Opcode
	switch wr.Opcode {
	case qp.WRSend, qp.WRSendWithImm, qp.WRRDMAWrite, qp.WRRDMAWriteWithImm:
		dsPattern(s.src.buf[loc:loc+size], s.id, seq)
		if size > 0 {
			wr.SGL = []qp.SGE{s.sge(s.src, loc, size)}
		}
		wr.Imm = uint32(seq) ^ uint32(s.id)<<24
		w.n = size
		e := struct {
			seq, n int
			op     cq.Opcode
			imm    uint32
		}{seq, size, cq.OpRecv, 0}
		if wr.Opcode == qp.WRSendWithImm || wr.Opcode == qp.WRRDMAWriteWithImm {
			e.imm = wr.Imm
		}
		if wr.Opcode == qp.WRRDMAWrite || wr.Opcode == qp.WRRDMAWriteWithImm {
			wr.RemoteAddr = s.dst.iova + uint64(s.l.write+slot*dsSlot)
			e.op = cq.OpRecvRDMAWithImm
		}
		if wr.Opcode != qp.WRRDMAWrite {
			s.expect = append(s.expect, e)
		}
	case qp.WRRDMARead:
		if s.big > 0 && !s.bigOut && s.rng.IntN(8) == 0 {
			size = s.big/2 + s.rng.IntN(s.big/2+1)
			loc, w.big, s.bigOut = s.l.big, true, true
		}
		w.roff = s.rng.IntN(s.l.readLen - size + 1)
		clear(s.src.buf[loc : loc+size])
		if size > 0 {
			wr.SGL = []qp.SGE{s.sge(s.src, loc, size)}
		}
		wr.RemoteAddr = s.dst.iova + uint64(s.l.readSrc+w.roff)
		w.n = size
	case qp.WRAtomicFetchAndAdd:
		wr.SGL = []qp.SGE{s.sge(s.src, loc, 8)}
		wr.RemoteAddr = s.dst.iova + uint64(s.l.atomic)
		wr.CompareAdd = s.rng.Uint64() >> s.rng.IntN(64)
		w.want, w.n = s.faa, 8
		s.faa += wr.CompareAdd
	case qp.WRAtomicCmpAndSwp:
		wr.SGL = []qp.SGE{s.sge(s.src, loc, 8)}
		wr.RemoteAddr = s.dst.iova + uint64(s.l.atomic+8)
		wr.CompareAdd, wr.Swap = s.cas, s.rng.Uint64()
		if s.rng.IntN(3) == 0 {
			wr.CompareAdd = s.rng.Uint64()
		}
		w.want, w.n = s.cas, 8
		if wr.CompareAdd == s.cas {
			s.cas = wr.Swap
		}
	}
	if _, err := s.src.q.PostSend([]qp.SendWR{wr}); err != nil {
		return fmt.Errorf("dir %d: PostSend %d: %w", s.id, seq, err)
	}
	s.posted++
	return nil
}

func (s *dsDir) onSend(wc *cq.WC) error {
	slot := s.completed % dsWindow
	w := &s.wrs[slot]
	loc := s.l.local + slot*dsSlot
	if wc.WRID != w.seq || wc.Status != cq.StatusSuccess {
		return fmt.Errorf("dir %d: send completion %+v (%v), want WR %d", s.id, *wc, wc.Status, w.seq)
	}
	switch w.op {
	case qp.WRRDMAWrite, qp.WRRDMAWriteWithImm:
		want := make([]byte, w.n)
		dsPattern(want, s.id, int(w.seq))
		off := s.l.write + slot*dsSlot
		if string(s.dst.buf[off:off+w.n]) != string(want) {
			return fmt.Errorf("dir %d: WRITE %d (%d bytes) differs at the peer", s.id, w.seq, w.n)
		}
	case qp.WRRDMARead:
		if w.big {
			loc = s.l.big
			s.bigOut = false
			s.bigReads++
		}
		src := s.dst.buf[s.l.readSrc+w.roff : s.l.readSrc+w.roff+w.n]
		if string(s.src.buf[loc:loc+w.n]) != string(src) {
			return fmt.Errorf("dir %d: READ %d (%d bytes at %d) differs", s.id, w.seq, w.n, w.roff)
		}
	case qp.WRAtomicFetchAndAdd, qp.WRAtomicCmpAndSwp:
		if got := binary.LittleEndian.Uint64(s.src.buf[loc:]); got != w.want {
			return fmt.Errorf("dir %d: %v %d returned %#x, want %#x", s.id, w.op, w.seq, got, w.want)
		}
	}
	s.completed++
	return nil
}

func (s *dsDir) onRecv(wc *cq.WC) error {
	if len(s.expect) == 0 {
		return fmt.Errorf("dir %d: unexpected receive %+v", s.id, *wc)
	}
	e := s.expect[0]
	s.expect = s.expect[1:]
	slot := int(wc.WRID)
	if wc.Status != cq.StatusSuccess || wc.Opcode != e.op || wc.ImmData != e.imm || (e.op == cq.OpRecv && int(wc.ByteLen) != e.n) ||
		slot != s.recvSeq%dsRQ {
		return fmt.Errorf("dir %d: receive %+v (%v), want message %d (%d bytes, %v)", s.id, *wc, wc.Status, e.seq, e.n, e.op)
	}
	if e.op == cq.OpRecv {
		want := make([]byte, e.n)
		dsPattern(want, s.id, e.seq)
		off := s.l.recv + slot*dsSlot
		if string(s.dst.buf[off:off+e.n]) != string(want) {
			return fmt.Errorf("dir %d: SEND %d (%d bytes) differs", s.id, e.seq, e.n)
		}
	}
	s.recvSeq++
	return s.postRecv(slot)
}

// dsEnd is one end's goroutine state: its CQ holds the completions of the direction it sends
// in (out) and of the one it receives in (in).
type dsEnd struct {
	e       *end
	out, in *dsDir
	wcs     []cq.WC
}

func (x *dsEnd) poll() (int, error) {
	k := x.e.cq.Poll(x.wcs)
	for i := 0; i < k; i++ {
		wc := &x.wcs[i]
		var err error
		if wc.Opcode >= cq.OpRecv {
			err = x.in.onRecv(wc)
		} else {
			err = x.out.onSend(wc)
		}
		if err != nil {
			return k, err
		}
	}
	return k, nil
}

func TestDaemonSoak(t *testing.T) {
	n := *soakMsgs
	if n == 0 {
		n = 2000
		if testing.Short() || raceOn {
			n = 600
		}
	}
	big := *soakBig
	nw := mem.NewNetwork(mem.Options{QueueDepth: 8192})
	faults := fault.DirOptions{Drop: 0.10, Duplicate: 0.05, Reorder: 0.05, ReorderDepth: 3, Corrupt: 0.01}
	var daemons []*testDaemon
	for i, addr := range []netip.Addr{ipA, ipB} {
		l, err := nw.Attach(addr)
		if err != nil {
			t.Fatal(err)
		}
		fl := fault.Wrap(l, fault.Options{Seed1: *soakSeed, Seed2: uint64(i + 1), Send: faults})
		daemons = append(daemons, startDaemon(t, fl, fmt.Sprintf("soak%d", i), 0))
	}
	const pairs = 3
	lay := newDSLayout(big)
	rng := rand.New(rand.NewPCG(*soakSeed, 0xd5))
	var ends []*dsEnd
	for p := 0; p < pairs; p++ {
		a := newEnd(t, daemons[0].dial(t), lay.size, dsWindow, rcAccess)
		b := newEnd(t, daemons[1].dial(t), lay.size, dsWindow, rcAccess)
		a.timeout, b.timeout = 14, 14 // 67 ms, perftest's
		if raceOn {
			a.timeout, b.timeout = 16, 16 // a race-instrumented engine on a loaded machine
		}
		// 7 retries, perftest's: the soak checks what arrives, not how soon a QP gives up.
		// With 3, the links' 10% drops (and corruption) each way end a QP with
		// RETRY_EXC_ERR every few runs, as IBTA specifies (4 timeouts in a row without
		// progress: the request or its first response lost each time).
		a.retry, b.retry = 7, 7
		a.connect(t, ipB, b.q.Num(), 1)
		b.connect(t, ipA, a.q.Num(), 1)
		for _, e := range []*end{a, b} {
			dsPattern(e.buf[lay.readSrc:lay.readSrc+lay.readLen], 0xEAD, p)
		}
		ab := &dsDir{id: uint64(2 * p), src: a, dst: b, l: lay, n: n / (2 * pairs), big: big, rng: rand.New(rand.NewPCG(rng.Uint64(), 1))}
		ba := &dsDir{id: uint64(2*p + 1), src: b, dst: a, l: lay, n: n / (2 * pairs), big: big, rng: rand.New(rand.NewPCG(rng.Uint64(), 2))}
		ends = append(ends, &dsEnd{e: a, out: ab, in: ba, wcs: make([]cq.WC, 32)}, &dsEnd{e: b, out: ba, in: ab, wcs: make([]cq.WC, 32)})
		for _, d := range []*dsDir{ab, ba} {
			for i := 0; i < dsRQ; i++ {
				if err := d.postRecv(i); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, len(ends))
	var mu sync.Mutex // a direction's model is shared by its two ends' goroutines
	for i, x := range ends {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stall := time.NewTimer(20 * time.Second)
			defer stall.Stop()
			done := func() bool {
				mu.Lock()
				defer mu.Unlock()
				return x.out.completed >= x.out.n && len(x.in.expect) == 0 && x.in.completed >= x.in.n
			}
			for !done() {
				mu.Lock()
				var err error
				for err == nil && x.out.posted < x.out.n && x.out.posted-x.out.completed < dsWindow {
					err = x.out.post()
				}
				k := 0
				if err == nil {
					k, err = x.poll()
				}
				mu.Unlock()
				if err != nil {
					errs[i] = err
					return
				}
				if k > 0 {
					stall.Reset(20 * time.Second)
					continue
				}
				x.e.cq.ReqNotify(false)
				mu.Lock()
				k, err = x.poll()
				mu.Unlock()
				if err != nil {
					errs[i] = err
					return
				}
				if k > 0 {
					continue
				}
				select {
				case <-x.e.cq.Channel():
				case <-time.After(2 * time.Millisecond): // the peer end may have finished the model
				case <-stall.C:
					errs[i] = fmt.Errorf("end %d: stalled: sent %d/%d posted %d, received %d expected %d", i, x.out.completed, x.out.n, x.out.posted, x.in.recvSeq, len(x.in.expect))
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	msgs, bigs := 0, 0
	for _, x := range ends {
		d := x.out
		msgs += d.completed
		bigs += d.bigReads
		if got := binary.LittleEndian.Uint64(d.dst.buf[lay.atomic:]); got != d.faa {
			t.Errorf("dir %d: FETCH_ADD word %#x, want %#x", d.id, got, d.faa)
		}
		if got := binary.LittleEndian.Uint64(d.dst.buf[lay.atomic+8:]); got != d.cas {
			t.Errorf("dir %d: CMP_SWP word %#x, want %#x", d.id, got, d.cas)
		}
	}
	if big > 0 && bigs == 0 {
		t.Error("no big READ ran")
	}
	dbg := daemons[0].srv.Debug()
	t.Logf("daemon soak: %d messages (%d big READs of up to %d bytes) in %v through the daemons' rings (ring posts %d, socket posts %d, refills %d, drain yields %d)",
		msgs, bigs, big, time.Since(start).Round(time.Millisecond), dbg.RingPosts, dbg.SocketPosts, dbg.Refills, dbg.DrainYields)
}
