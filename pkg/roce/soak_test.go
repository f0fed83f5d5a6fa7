package roce

import (
	"encoding/binary"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/fault"
	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/link/udp"
)

// The soak test (docs/reliability.md): random mixes of SEND, SEND_WITH_IMM,
// WRITE, WRITE_WITH_IMM, READ, CMP_SWP, FETCH_ADD, ATOMIC_WRITE and FLUSH on
// several RC QP pairs, in both directions at once, between two devices whose
// links drop 10%, duplicate 5%, reorder 5% and corrupt 1% of the datagrams
// they send (pkg/link/fault, seeded). Every work request must complete
// successfully, every byte must arrive as sent, and every atomic must return
// exactly the value a sequential model predicts (so none ran twice or not
// at all); the final atomic words must equal the model's. An ATOMIC_WRITE's
// word never goes back to an older value (a duplicate executed again after a
// later one would), and a persistent FLUSH finds, when the responder runs it,
// the bytes of the last WRITE before it in the range it flushes (the region's
// Persister checks them), each FLUSH exactly once.
//
// Short by default; long runs: -soak.msgs=N (or SOFTROCE_SOAK_MSGS), see
// scripts/soak.
var (
	soakMsgs  = flag.Int("soak.msgs", 0, "soak: messages per link kind (0: SOFTROCE_SOAK_MSGS or a short default)")
	soakSeed  = flag.Uint64("soak.seed", 1, "soak: seed of the fault injector and of the work mix")
	soakLinks = flag.String("soak.links", "mem,udp", "soak: link kinds to run (mem, udp; udp2p: two processes over UDP, soak2p_test.go)")
	soakPairs = flag.Int("soak.pairs", 4, "soak: RC QP pairs (each runs traffic both ways)")
	soakMax   = flag.Int("soak.maxsize", 3*1024+17, "soak: largest message in bytes (MTU is 1024)")
	soakTmo   = flag.Int("soak.timeout", 14, "soak: ACK timeout code (4.096 us x 2^code; 14 = 67 ms, perftest's default)")
	soakBig   = flag.Int("soak.bigread", 0, "soak: largest big READ in bytes (0: none); one READ in 8 is between half of it and it, one at a time per direction (MTU 1024: above 128 KiB, more than 128 response packets)")
)

// soakFaults are the fault rates, per sent datagram on each device.
func soakFaults() fault.DirOptions {
	return fault.DirOptions{Drop: 0.10, Duplicate: 0.05, Reorder: 0.05, ReorderDepth: 3, Corrupt: 0.01}
}

func soakCount(t *testing.T) int {
	if *soakMsgs > 0 {
		return *soakMsgs
	}
	if s := os.Getenv("SOFTROCE_SOAK_MSGS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			t.Fatalf("SOFTROCE_SOAK_MSGS=%q", s)
		}
		return n
	}
	if testing.Short() || raceSoak {
		return 800
	}
	return 4000
}

func TestSoak(t *testing.T) {
	n := soakCount(t)
	for _, kind := range strings.Split(*soakLinks, ",") {
		t.Run(kind, func(t *testing.T) {
			if kind == "udp2p" { // two processes (soak2p_test.go)
				t.Logf("%s", runSoak2P(t, soak2pConfig{Msgs: n, Seed: *soakSeed, Pairs: *soakPairs,
					MaxSize: *soakMax, Timeout: uint8(*soakTmo)}))
				return
			}
			res := runSoak(t, soakConfig{kind: kind, msgs: n, seed: *soakSeed, pairs: *soakPairs, maxSize: *soakMax, timeout: uint8(*soakTmo),
				bigRead: *soakBig})
			t.Logf("%s", res)
		})
	}
}

type soakConfig struct {
	kind    string // "mem" or "udp"
	msgs    int    // total messages (all QPs, both directions)
	seed    uint64
	pairs   int
	maxSize int
	faults  *fault.DirOptions // nil = soakFaults()
	// bigRead, if > 0, is the largest big READ: one READ in 8 is between bigRead/2 and
	// bigRead bytes (more than 128 response packets above 128 KiB at MTU 1024), one
	// outstanding at a time per direction, into a region of its own.
	bigRead int
	// timeout is the ACK timeout code (0 = 14). retry_cnt is 7, so a QP
	// fails after 8 timeouts in a row without progress. On this shared
	// 2-core machine (load 5-9) codes 10 and 12 (34 and 134 ms without
	// progress) failed runs: when the process is starved, the receive
	// backlog (thousands of datagrams, each timeout adding a go-back-N
	// window) outlasts the retries. 14 (67 ms, 0.5 s) is perftest's.
	timeout uint8
}

// soakResult is what a run did.
type soakResult struct {
	kind             string
	msgs, bytes      uint64
	wall             time.Duration
	a, b             qp.Stats
	fa, fb           fault.Stats
	retrans, retries uint64
	bigReads         int
}

func (r soakResult) String() string {
	f := func(s fault.Stats) string {
		return fmt.Sprintf("seen %d dropped %d duplicated %d reordered %d corrupted %d",
			s.Send.Seen, s.Send.Dropped, s.Send.Duplicated, s.Send.Reordered, s.Send.Corrupted)
	}
	c := func(s qp.Stats) string {
		m := s.Map()
		keys := []string{"sent_pkts", "rcvd_pkts", "retransmitted_pkts", "completer_retry_err", "rcvd_seq_err",
			"out_of_seq_request", "duplicate_request", "send_rnr_err", "rcvd_rnr_err", "rcvd_dropped", "rcvd_icrc_solved"}
		var sb strings.Builder
		for _, k := range keys {
			fmt.Fprintf(&sb, " %s=%d", k, m[k])
		}
		return sb.String()
	}
	return fmt.Sprintf("soak %s: %d messages (%d big READs), %d bytes, %d retransmitted packets, %d retries (timeouts+seq NAKs), wall %v (%.0f msg/s)\n"+
		"  faults a: %s\n  faults b: %s\n  counters a:%s\n  counters b:%s",
		r.kind, r.msgs, r.bigReads, r.bytes, r.retrans, r.retries, r.wall.Round(time.Millisecond),
		float64(r.msgs)/r.wall.Seconds(), f(r.fa), f(r.fb), c(r.a), c(r.b))
}

// soakPattern fills b with the bytes of message seq of stream id.
func soakPattern(b []byte, id, seq uint64) {
	x := id*0x9E3779B97F4A7C15 ^ seq*0xBF58476D1CE4E5B9 | 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
}

func soakPatternEqual(b []byte, id, seq uint64) int {
	x := id*0x9E3779B97F4A7C15 ^ seq*0xBF58476D1CE4E5B9 | 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		if b[i] != byte(x) {
			return i
		}
	}
	return -1
}

// Layout of each end's registered buffer (slot = the largest message
// rounded up to 4 KiB).
const (
	soakWindow  = 16 // outstanding WRs per direction (= send queue depth)
	soakRQ      = 8  // receive WQEs per QP: fewer than the window, so RNR NAKs happen
	soakReadLen = 64 << 10
)

type soakLayout struct {
	slot, local, recv, write, readSrc, readLen, atomic, size int
	big, bigLen                                              int // big READs' target (bigRead)
}

// soakAWWord is the offset of the ATOMIC_WRITE word (after the FETCH_ADD and CMP_SWP words).
func (l *soakLayout) soakAWWord() int { return l.atomic + 16 }

// newSoakLayout lays out one end's buffer for messages of up to maxSize bytes and big READs
// of up to bigRead bytes (0: none).
func newSoakLayout(maxSize, bigRead int) soakLayout {
	var l soakLayout
	l.slot = (maxSize + 4095) &^ 4095
	if l.slot == 0 {
		l.slot = 4096
	}
	l.local = 0                             // local slots: send source, READ target, atomic result
	l.recv = l.local + soakWindow*l.slot    // receive slots
	l.write = l.recv + soakRQ*l.slot        // WRITE targets of the peer
	l.readSrc = l.write + soakWindow*l.slot // static bytes the peer READs
	l.readLen = max(soakReadLen, l.slot, bigRead)
	l.atomic = l.readSrc + l.readLen // FETCH_ADD word, CMP_SWP word
	l.big, l.bigLen = l.atomic+64, bigRead
	l.size = l.big + l.bigLen
	return l
}

// soakLinkPair opens the two links of a run.
func soakLinkPair(t *testing.T, kind string) (link.Link, link.Link, uint16) {
	t.Helper()
	switch kind {
	case "mem":
		nw := mem.NewNetwork(mem.Options{QueueDepth: 8192})
		la, err := nw.Attach(addrA)
		if err != nil {
			t.Fatal(err)
		}
		lb, err := nw.Attach(addrB)
		if err != nil {
			t.Fatal(err)
		}
		return la, lb, 0
	case "udp":
		for try := 0; try < 20; try++ {
			port := uint16(bth.UDPPort)
			if try > 0 {
				port = uint16(20000 + rand.IntN(40000))
			}
			la, err := udp.Listen(udp.Options{Addrs: []netip.Addr{addrA}, Port: port})
			if err != nil {
				continue
			}
			lb, err := udp.Listen(udp.Options{Addrs: []netip.Addr{addrB}, Port: port})
			if err != nil {
				la.Close()
				continue
			}
			return hbLink{la}, hbLink{lb}, port
		}
		t.Fatal("no free UDP port pair on loopback")
	}
	t.Fatalf("unknown link kind %q", kind)
	return nil, nil, 0
}

// soakEnd is one side of a QP pair.
type soakEnd struct {
	qp       *QP
	scq, rcq *cq.CQ
	buf      []byte
	mr       *mr.MR
	addr     netip.Addr
	dev      *Device
	l        soakLayout
	pers     soakPersister // the region's Persister: checks each persistent FLUSH
}

// soakFlush is what a persistent FLUSH must find when the responder runs it: the bytes of
// WRITE seq of direction id (n bytes at off in the region), in the range (whole: the whole
// region) it flushes.
type soakFlush struct {
	id, seq uint64
	off, n  int
	whole   bool
}

// soakPersister checks the persistent FLUSHes of the one direction that targets its end, in
// the order the responder runs them (PSN order, once each).
type soakPersister struct {
	mu     sync.Mutex
	buf    []byte
	expect []soakFlush
	done   int
	err    error
}

func (p *soakPersister) push(f soakFlush) {
	p.mu.Lock()
	p.expect = append(p.expect, f)
	p.mu.Unlock()
}

// Persist implements mr.Persister.
func (p *soakPersister) Persist(b []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.expect) == 0 {
		p.fail(fmt.Errorf("persistent FLUSH %d executed, only %d posted (a duplicate executed again?)", p.done+1, p.done))
		return nil
	}
	f := p.expect[0]
	p.expect = p.expect[1:]
	p.done++
	got := b
	if f.whole {
		if len(b) != len(p.buf) {
			p.fail(fmt.Errorf("dir %d: FLUSH after WRITE %d (whole region) got %d bytes, want %d", f.id, f.seq, len(b), len(p.buf)))
			return nil
		}
		got = b[f.off : f.off+f.n]
	} else if len(b) != f.n {
		p.fail(fmt.Errorf("dir %d: FLUSH after WRITE %d got %d bytes, want %d", f.id, f.seq, len(b), f.n))
		return nil
	}
	if i := soakPatternEqual(got, f.id, f.seq); i >= 0 {
		p.fail(fmt.Errorf("dir %d: FLUSH after WRITE %d (%d bytes): byte %d not placed before the FLUSH ran", f.id, f.seq, f.n, i))
	}
	return nil
}

func (p *soakPersister) fail(err error) {
	if p.err == nil {
		p.err = err
	}
}

func (e *soakEnd) va(off int) uint64 { return e.mr.IOVA() + uint64(off) }
func (e *soakEnd) sge(off, n int) qp.SGE {
	return qp.SGE{Addr: e.va(off), Length: uint32(n), LKey: e.mr.LKey()}
}

func newSoakEnd(t *testing.T, d *Device, l soakLayout) *soakEnd {
	t.Helper()
	e := &soakEnd{dev: d, addr: d.Addrs()[0], l: l, buf: make([]byte, l.size)}
	pd, err := d.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	if e.scq, err = d.CreateCQ(soakWindow * 2); err != nil {
		t.Fatal(err)
	}
	if e.rcq, err = d.CreateCQ(soakRQ * 2); err != nil {
		t.Fatal(err)
	}
	e.pers.buf = e.buf
	if e.mr, err = d.RegMRWith(pd, e.buf, 0x5000_0000, mr.AccessLocalWrite|mr.AccessRemoteWrite|mr.AccessRemoteRead|
		mr.AccessRemoteAtomic|mr.AccessFlushGlobal|mr.AccessFlushPersistent, RegMROptions{Persist: &e.pers}); err != nil {
		t.Fatal(err)
	}
	if e.qp, err = d.CreateQP(QPInit{Type: qp.TypeRC, PD: pd, SendCQ: e.scq, RecvCQ: e.rcq,
		Cap: qp.Cap{MaxSendWR: soakWindow, MaxRecvWR: soakRQ, MaxSendSGE: 2, MaxRecvSGE: 2, MaxInlineData: 8}}); err != nil {
		t.Fatal(err)
	}
	return e
}

// soakConnect brings a pair to RTS: MTU 1024, the ACK timeout code given
// (the in-process links answer in microseconds), retry_cnt 7,
// rnr_retry 7 (infinite), min_rnr_timer code 1 (0.01 ms).
func soakConnect(t *testing.T, a, b *soakEnd, psnA, psnB uint32, timeout uint8) {
	t.Helper()
	all := mr.AccessRemoteWrite | mr.AccessRemoteRead | mr.AccessRemoteAtomic | mr.AccessLocalWrite |
		mr.AccessFlushGlobal | mr.AccessFlushPersistent
	up := func(e, peer *soakEnd, rq, sq uint32) {
		steps := []struct {
			a qp.Attr
			m qp.AttrMask
		}{
			{qp.Attr{State: qp.StateInit, Port: 1, AccessFlags: all}, qp.AttrState | qp.AttrPKeyIndex | qp.AttrPort | qp.AttrAccessFlags},
			{qp.Attr{State: qp.StateRTR, AH: qp.AHAttr{DGID: peer.addr, SGIDIndex: uint8(e.dev.GIDIndex(e.addr)), Port: 1},
				PathMTU: qp.MTU1024, DestQPN: peer.qp.Num(), RQPSN: rq, MaxDestRDAtomic: 16, MinRNRTimer: 1},
				qp.AttrState | qp.AttrAV | qp.AttrPathMTU | qp.AttrDestQPN | qp.AttrRQPSN | qp.AttrMaxDestRDAtomic | qp.AttrMinRNRTimer},
			{qp.Attr{State: qp.StateRTS, SQPSN: sq, Timeout: timeout, RetryCnt: 7, RNRRetry: 7, MaxRDAtomic: 16},
				qp.AttrState | qp.AttrSQPSN | qp.AttrTimeout | qp.AttrRetryCnt | qp.AttrRNRRetry | qp.AttrMaxQPRDAtomic},
		}
		for _, s := range steps {
			if err := e.qp.Modify(&s.a, s.m); err != nil {
				t.Fatal(err)
			}
		}
	}
	up(a, b, psnB, psnA)
	up(b, a, psnA, psnB)
}

// recvExpect is a receive completion the receiver must see, in order.
type recvExpect struct {
	seq uint64
	n   int
	op  cq.Opcode
	imm uint32
	flg cq.Flags
}

// soakDir drives one direction of one QP pair: src posts, dst responds.
type soakDir struct {
	id       uint64
	src, dst *soakEnd
	rng      *rand.Rand
	n        int // WRs to post
	maxSize  int
	bigRead  int  // soakConfig.bigRead
	bigOut   bool // a big READ is outstanding
	bigReads int  // big READs completed

	posted, completed int
	wrs               [soakWindow]soakWR
	expect            []recvExpect
	recvSeq           uint64 // receive slots posted so far
	faa, cas          uint64 // model of the responder's atomic words
	aw                uint64 // the last ATOMIC_WRITE's value (0: none yet)
	lastWrite         *soakFlush
	flushes           int // persistent FLUSHes posted
	bytes             uint64
	last              time.Time // last completion (diagnostics)
}

// soakWR is what a posted WR must produce.
type soakWR struct {
	op      qp.WROpcode
	n, roff int
	seq     uint64
	want    uint64 // atomics: the value the responder must return
	big     bool   // a big READ (into the layout's big region)
}

func (s *soakDir) postRecv(slot int) error {
	l := &s.dst.l
	off := l.recv + slot*l.slot
	_, err := s.dst.qp.PostRecv([]qp.RecvWR{{WRID: uint64(slot), SGL: []qp.SGE{s.dst.sge(off, l.slot/2), s.dst.sge(off+l.slot/2, l.slot/2)}}})
	return err
}

// post posts WR number s.posted.
func (s *soakDir) post() error {
	seq := uint64(s.posted)
	slot := s.posted % soakWindow
	l := &s.src.l
	loc := l.local + slot*l.slot
	w := &s.wrs[slot]
	*w = soakWR{seq: seq}
	wr := qp.SendWR{WRID: seq, Flags: qp.SendSignaled}
	size := s.rng.IntN(s.maxSize + 1)
	if s.rng.IntN(8) == 0 {
		size = s.rng.IntN(64) // many tiny messages too
	}
	wr.Opcode = soakOpcodePlacement(s.rng.IntN(100))
	w.op = wr.Opcode
	switch wr.Opcode {
	case qp.WRSend, qp.WRSendWithImm, qp.WRRDMAWrite, qp.WRRDMAWriteWithImm:
		soakPattern(s.src.buf[loc:loc+size], s.id, seq)
		wr.SGL = s.sgl(loc, size)
		wr.Imm = uint32(seq*2654435761) ^ uint32(s.id)
		w.n = size
		e := recvExpect{seq: seq, n: size, op: cq.OpRecv}
		if wr.Opcode == qp.WRSendWithImm || wr.Opcode == qp.WRRDMAWriteWithImm {
			e.imm, e.flg = wr.Imm, cq.FlagWithImm
		}
		if wr.Opcode == qp.WRRDMAWrite || wr.Opcode == qp.WRRDMAWriteWithImm {
			wr.RemoteAddr, wr.RKey = s.dst.va(l.write+slot*l.slot), s.dst.mr.RKey()
			e.op = cq.OpRecvRDMAWithImm
			s.lastWrite = &soakFlush{id: s.id, seq: seq, off: l.write + slot*l.slot, n: size}
		}
		if wr.Opcode != qp.WRRDMAWrite {
			s.expect = append(s.expect, e)
		}
	case qp.WRRDMARead:
		if s.bigRead > 0 && !s.bigOut && s.rng.IntN(8) == 0 {
			size = s.bigRead/2 + s.rng.IntN(s.bigRead/2+1)
			loc, w.big, s.bigOut = l.big, true, true
		}
		w.roff = s.rng.IntN(l.readLen - size + 1)
		clear(s.src.buf[loc : loc+size])
		wr.SGL = s.sgl(loc, size)
		wr.RemoteAddr, wr.RKey = s.dst.va(l.readSrc+w.roff), s.dst.mr.RKey()
		w.n = size
	case qp.WRAtomicFetchAndAdd:
		wr.SGL = []qp.SGE{s.src.sge(loc, 8)}
		wr.RemoteAddr, wr.RKey = s.dst.va(l.atomic), s.dst.mr.RKey()
		wr.CompareAdd = s.rng.Uint64() >> s.rng.IntN(64)
		w.want = s.faa
		s.faa += wr.CompareAdd
		w.n = 8
	case qp.WRAtomicCmpAndSwp:
		wr.SGL = []qp.SGE{s.src.sge(loc, 8)}
		wr.RemoteAddr, wr.RKey = s.dst.va(l.atomic+8), s.dst.mr.RKey()
		wr.CompareAdd = s.cas
		if s.rng.IntN(3) == 0 {
			wr.CompareAdd = s.rng.Uint64() // (almost surely) fails: the word stays
		}
		wr.Swap = s.rng.Uint64()
		w.want = s.cas
		if wr.CompareAdd == s.cas {
			s.cas = wr.Swap
		}
		w.n = 8
	case qp.WRAtomicWrite:
		// the values grow: a duplicate executed again after a later one would take the word back
		s.aw = s.id<<48 | (seq + 1)
		binary.LittleEndian.PutUint64(s.src.buf[loc:], s.aw)
		wr.SGL = []qp.SGE{s.src.sge(loc, 8)}
		if s.rng.IntN(2) == 0 {
			wr.Flags |= qp.SendInline
		}
		wr.RemoteAddr, wr.RKey = s.dst.va(l.soakAWWord()), s.dst.mr.RKey()
		w.want, w.n = s.aw, 8
	case qp.WRFlush:
		// the range of the last WRITE posted before it, persistent and/or global; sometimes
		// the whole region
		wr.RKey = s.dst.mr.RKey()
		wr.FlushType = []qp.FlushType{qp.FlushGlobal | qp.FlushPersistent, qp.FlushGlobal, qp.FlushPersistent}[s.rng.IntN(3)]
		f := soakFlush{id: s.id, seq: 0, off: l.write, n: 0}
		if s.lastWrite != nil {
			f = *s.lastWrite
		}
		wr.RemoteAddr, wr.FlushLength = s.dst.va(f.off), uint32(f.n)
		if s.rng.IntN(8) == 0 {
			wr.FlushLevel, f.whole = qp.FlushMR, true
		}
		if wr.FlushType&qp.FlushPersistent != 0 {
			s.dst.pers.push(f)
			s.flushes++
		}
		w.n = f.n
	}
	if _, err := s.src.qp.PostSend([]qp.SendWR{wr}); err != nil {
		return fmt.Errorf("dir %d: PostSend %d: %w", s.id, seq, err)
	}
	s.posted++
	return nil
}

// sgl splits [off, off+n) in two SGEs (or none) so gathers cross SGEs.
func (s *soakDir) sgl(off, n int) []qp.SGE {
	if n == 0 {
		return nil
	}
	h := n / 3
	if h == 0 {
		return []qp.SGE{s.src.sge(off, n)}
	}
	return []qp.SGE{s.src.sge(off, h), s.src.sge(off+h, n-h)}
}

// onSend checks one send completion (the oldest outstanding WR).
func (s *soakDir) onSend(wc *cq.WC) error {
	slot := s.completed % soakWindow
	w := &s.wrs[slot]
	l := &s.src.l
	loc := l.local + slot*l.slot
	want := cq.WC{WRID: w.seq, Status: cq.StatusSuccess, Opcode: wcOp(w.op), ByteLen: uint32(w.n)}
	if wc.WRID != want.WRID || wc.Status != want.Status || wc.Opcode != want.Opcode || wc.ByteLen != want.ByteLen {
		return fmt.Errorf("dir %d: send completion %+v (%v), want %+v", s.id, *wc, wc.Status, want)
	}
	switch w.op {
	case qp.WRRDMAWrite, qp.WRRDMAWriteWithImm:
		off := l.write + slot*l.slot
		if i := soakPatternEqual(s.dst.buf[off:off+w.n], s.id, w.seq); i >= 0 {
			return fmt.Errorf("dir %d: WRITE %d (%d bytes): remote byte %d differs", s.id, w.seq, w.n, i)
		}
	case qp.WRRDMARead:
		if w.big {
			loc = l.big
			s.bigOut = false
			s.bigReads++
		}
		src := s.dst.buf[l.readSrc+w.roff : l.readSrc+w.roff+w.n]
		got := s.src.buf[loc : loc+w.n]
		for i := range got {
			if got[i] != src[i] {
				return fmt.Errorf("dir %d: READ %d (%d bytes at %d): byte %d differs", s.id, w.seq, w.n, w.roff, i)
			}
		}
	case qp.WRAtomicFetchAndAdd, qp.WRAtomicCmpAndSwp:
		if got := binary.LittleEndian.Uint64(s.src.buf[loc:]); got != w.want {
			return fmt.Errorf("dir %d: %v %d returned %#x, want %#x (executed twice, never, or out of order)",
				s.id, w.op, w.seq, got, w.want)
		}
	case qp.WRAtomicWrite:
		// later ATOMIC_WRITEs may have landed already (the responder runs ahead of the
		// completions), never an earlier one after this
		got := binary.LittleEndian.Uint64(soakWord(s.dst.buf[s.dst.l.soakAWWord():]))
		if got>>48 != s.id || got < w.want || got > s.aw {
			return fmt.Errorf("dir %d: ATOMIC_WRITE %d: word %#x, want between %#x and %#x (a duplicate executed again, or lost)",
				s.id, w.seq, got, w.want, s.aw)
		}
	}
	s.bytes += uint64(w.n)
	s.completed++
	return nil
}

// onRecv checks one receive completion against the oldest expectation.
func (s *soakDir) onRecv(wc *cq.WC) error {
	if len(s.expect) == 0 {
		return fmt.Errorf("dir %d: unexpected receive completion %+v (%v)", s.id, *wc, wc.Status)
	}
	e := s.expect[0]
	s.expect = s.expect[1:]
	slot := int(wc.WRID)
	if wc.Status != cq.StatusSuccess || wc.Opcode != e.op || wc.ImmData != e.imm || wc.Flags != e.flg ||
		(e.op == cq.OpRecv && wc.ByteLen != uint32(e.n)) {
		return fmt.Errorf("dir %d: receive completion %+v (%v), want %+v (message %d delivered twice or lost?)",
			s.id, *wc, wc.Status, e, e.seq)
	}
	if slot != int(s.recvSeq%soakRQ) {
		return fmt.Errorf("dir %d: receive WQE %d completed, want %d (out of order)", s.id, slot, s.recvSeq%soakRQ)
	}
	if e.op == cq.OpRecv {
		off := s.dst.l.recv + slot*s.dst.l.slot
		if i := soakPatternEqual(s.dst.buf[off:off+e.n], s.id, e.seq); i >= 0 {
			return fmt.Errorf("dir %d: SEND %d (%d bytes): received byte %d differs", s.id, e.seq, e.n, i)
		}
	}
	s.recvSeq++
	return s.postRecv(slot)
}

func wcOp(op qp.WROpcode) cq.Opcode {
	switch op {
	case qp.WRAtomicWrite:
		return cq.OpAtomicWrite
	case qp.WRFlush:
		return cq.OpFlush
	case qp.WRRDMAWrite, qp.WRRDMAWriteWithImm:
		return cq.OpRDMAWrite
	case qp.WRRDMARead:
		return cq.OpRDMARead
	case qp.WRAtomicCmpAndSwp:
		return cq.OpCompSwap
	case qp.WRAtomicFetchAndAdd:
		return cq.OpFetchAdd
	}
	return cq.OpSend
}

// run posts s.n WRs keeping up to soakWindow outstanding and checks every
// completion; stall bounds the time without any completion.
func (s *soakDir) run(stall time.Duration) error {
	for i := 0; i < soakRQ; i++ {
		if err := s.postRecv(i); err != nil {
			return err
		}
	}
	wcs := make([]cq.WC, soakWindow)
	timer := time.NewTimer(stall)
	defer timer.Stop()
	for s.completed < s.n || len(s.expect) > 0 {
		for s.posted < s.n && s.posted-s.completed < soakWindow {
			if err := s.post(); err != nil {
				return err
			}
		}
		got := 0
		for {
			k := s.src.scq.Poll(wcs)
			for i := 0; i < k; i++ {
				if err := s.onSend(&wcs[i]); err != nil {
					return err
				}
			}
			m := s.dst.rcq.Poll(wcs)
			for i := 0; i < m; i++ {
				if err := s.onRecv(&wcs[i]); err != nil {
					return err
				}
			}
			got += k + m
			if k+m == 0 {
				break
			}
		}
		if got > 0 {
			s.last = time.Now()
			timer.Reset(stall)
			continue
		}
		if s.completed >= s.n && len(s.expect) == 0 {
			break
		}
		s.src.scq.ReqNotify(false)
		s.dst.rcq.ReqNotify(false)
		select {
		case <-s.src.scq.Channel():
		case <-s.dst.rcq.Channel():
		case <-time.After(time.Millisecond):
			// the notifications armed above may have raced with a
			// completion: poll again
		case <-timer.C:
			return fmt.Errorf("dir %d: stalled %v: %d of %d completed, %d receives pending; requester %v responder %v",
				s.id, stall, s.completed, s.n, len(s.expect), s.src.qp.State(), s.dst.qp.State())
		}
	}
	return nil
}

func runSoak(t *testing.T, c soakConfig) soakResult {
	t.Helper()
	if c.pairs < 1 {
		c.pairs = 1
	}
	lay := newSoakLayout(c.maxSize, c.bigRead)
	fo := soakFaults()
	if c.faults != nil {
		fo = *c.faults
	}
	la, lb, port := soakLinkPair(t, c.kind)
	fla := fault.Wrap(la, fault.Options{Seed1: c.seed, Seed2: 1, Send: fo})
	flb := fault.Wrap(lb, fault.Options{Seed1: c.seed, Seed2: 2, Send: fo})
	da, err := Open(Options{Link: fla, Port: port, Name: "soak-a"})
	if err != nil {
		t.Fatal(err)
	}
	db, err := Open(Options{Link: flb, Port: port, Name: "soak-b"})
	if err != nil {
		da.Close()
		t.Fatal(err)
	}
	defer func() {
		da.Close()
		db.Close()
	}()
	timeout := c.timeout
	if timeout == 0 {
		timeout = 14
	}
	if raceSoak && timeout < 16 {
		timeout = 16
	}
	rng := rand.New(rand.NewPCG(c.seed, 0x50a1c))
	dirs := make([]*soakDir, 0, 2*c.pairs)
	per := (c.msgs + 2*c.pairs - 1) / (2 * c.pairs)
	for i := 0; i < c.pairs; i++ {
		a, b := newSoakEnd(t, da, lay), newSoakEnd(t, db, lay)
		// start PSNs near the wrap so it is crossed under loss
		soakConnect(t, a, b, bth.PSNMask-uint32(rng.IntN(2000)), rng.Uint32N(1<<24), timeout)
		for _, e := range []*soakEnd{a, b} {
			soakPattern(e.buf[lay.readSrc:lay.readSrc+lay.readLen], 0xEAD, uint64(i))
			binary.LittleEndian.PutUint64(e.buf[lay.atomic:], 0)
			binary.LittleEndian.PutUint64(e.buf[lay.atomic+8:], 0)
		}
		for k, pr := range [][2]*soakEnd{{a, b}, {b, a}} {
			id := uint64(2*i + k)
			dirs = append(dirs, &soakDir{id: id, src: pr[0], dst: pr[1], n: per, maxSize: c.maxSize,
				bigRead: c.bigRead, rng: rand.New(rand.NewPCG(c.seed, id))})
		}
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, len(dirs))
	for i, d := range dirs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.last = time.Now()
			errs[i] = d.run(20 * time.Second)
			if errs[i] != nil {
				errs[i] = fmt.Errorf("%w (after %d completions; the one before came %v earlier)", errs[i], d.completed, time.Since(d.last).Round(time.Millisecond))
			}
		}()
	}
	wg.Wait()
	res := soakResult{kind: c.kind, wall: time.Since(start), a: da.Stats(), b: db.Stats(), fa: fla.Stats(), fb: flb.Stats()}
	failed := false
	for _, err := range errs {
		if err != nil {
			t.Error(err)
			failed = true
		}
	}
	for _, d := range dirs {
		res.msgs += uint64(d.completed)
		res.bytes += d.bytes
		res.bigReads += d.bigReads
		if failed {
			continue
		}
		// the responder's words equal the model: each atomic ran exactly once
		if got := binary.LittleEndian.Uint64(d.dst.buf[lay.atomic:]); got != d.faa {
			t.Errorf("dir %d: FETCH_ADD word %#x, want %#x", d.id, got, d.faa)
		}
		if got := binary.LittleEndian.Uint64(d.dst.buf[lay.atomic+8:]); got != d.cas {
			t.Errorf("dir %d: CMP_SWP word %#x, want %#x", d.id, got, d.cas)
		}
		if got := binary.LittleEndian.Uint64(soakWord(d.dst.buf[lay.soakAWWord():])); got != d.aw {
			t.Errorf("dir %d: ATOMIC_WRITE word %#x, want the last one's %#x", d.id, got, d.aw)
		}
		p := &d.dst.pers
		p.mu.Lock()
		if p.err != nil {
			t.Error(p.err)
		}
		if p.done != d.flushes || len(p.expect) != 0 {
			t.Errorf("dir %d: %d persistent FLUSHes ran, %d posted", d.id, p.done, d.flushes)
		}
		p.mu.Unlock()
		if st := d.src.qp.State(); st != qp.StateRTS {
			t.Errorf("dir %d: QP state %v", d.id, st)
		}
	}
	for _, s := range []qp.Stats{res.a, res.b} {
		m := s.Map()
		res.retrans += m["retransmitted_pkts"]
		res.retries += m["completer_retry_err"]
		if m["retry_exceeded_err"] != 0 || m["retry_rnr_exceeded_err"] != 0 {
			t.Errorf("retries exhausted: %v", m)
		}
	}
	if failed {
		t.Logf("%s", res)
	}
	return res
}

// soakOpcodePlacement is TestSoak's mix: soakOpcode's, with 5% of RDMA ATOMIC_WRITE and 5% of
// FLUSH taken from READ's and the atomics' shares: SEND 22%, SEND_WITH_IMM 8%, WRITE 22%,
// WRITE_WITH_IMM 8%, READ 16%, FETCH_ADD 7%, CMP_SWP 7%, ATOMIC_WRITE 5%, FLUSH 5%.
func soakOpcodePlacement(r int) qp.WROpcode {
	switch {
	case r < 60:
		return soakOpcode(r)
	case r < 76:
		return qp.WRRDMARead
	case r < 83:
		return qp.WRAtomicFetchAndAdd
	case r < 90:
		return qp.WRAtomicCmpAndSwp
	case r < 95:
		return qp.WRAtomicWrite
	default:
		return qp.WRFlush
	}
}

// soakWord returns the 8 bytes of b as read by one atomic load: the responder stores its
// ATOMIC_WRITE word with one while a direction checks it.
func soakWord(b []byte) []byte {
	var w [8]byte
	binary.NativeEndian.PutUint64(w[:], atomic.LoadUint64((*uint64)(unsafe.Pointer(&b[0]))))
	return w[:]
}

// soakOpcode is the soaks' operation mix for a percentile r in [0, 100): SEND 22%,
// SEND_WITH_IMM 8%, WRITE 22%, WRITE_WITH_IMM 8%, READ 20%, FETCH_ADD 10%, CMP_SWP 10%
// (the two-process soak's; TestSoak adds the memory placement operations, soakOpcodePlacement).
func soakOpcode(r int) qp.WROpcode {
	switch {
	case r < 22:
		return qp.WRSend
	case r < 30:
		return qp.WRSendWithImm
	case r < 52:
		return qp.WRRDMAWrite
	case r < 60:
		return qp.WRRDMAWriteWithImm
	case r < 80:
		return qp.WRRDMARead
	case r < 90:
		return qp.WRAtomicFetchAndAdd
	default:
		return qp.WRAtomicCmpAndSwp
	}
}
