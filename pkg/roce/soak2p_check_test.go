package roce

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"math/rand/v2"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/qp"
)

// The two-process soak's work plan and checkers (soak2p_test.go runs them
// on devices; soak2p_check_test.go's own tests run them on a model of the
// network to prove they catch wrong bytes, lost, duplicated and
// double-executed operations).
//
// A direction (one requester QP in one process, its responder in the other)
// is a deterministic plan: operation k of direction id is a pure function
// of (seed, id, k). The requester draws it to post; the responder's process
// draws the same sequence to know what it must RECEIVE (SEND payloads,
// immediates, which receive completions come, in order), what its write
// region must hold at the end and what its atomic words must be. Nothing
// but QP numbers, keys, addresses and the final digests crosses the pipe.

const (
	s2pWindow = soakWindow     // outstanding WRs per direction (send queue depth)
	s2pRQ     = soakRQ         // receive WQEs per QP (< window: RNR NAKs happen)
	s2pWSlots = 2 * s2pWindow  // write slots: WRITE k goes to slot k mod s2pWSlots
	s2pReadID = uint64(0xEAD2) // pattern stream of the static READ regions
)

// s2pLayout is each QP end's registered buffer.
type s2pLayout struct {
	slot    int // bytes per slot (largest message rounded up to 4 KiB)
	local   int // s2pWindow slots: send source, READ target, atomic result
	recv    int // s2pRQ receive slots
	write   int // s2pWSlots slots: the peer's WRITE targets
	readSrc int // readLen static bytes the peer READs
	readLen int
	atomic  int // FETCH_ADD word, CMP_SWP word
	size    int
}

func newS2PLayout(maxSize int) s2pLayout {
	var l s2pLayout
	l.slot = max((maxSize+4095)&^4095, 4096)
	l.local = 0
	l.recv = l.local + s2pWindow*l.slot
	l.write = l.recv + s2pRQ*l.slot
	l.readSrc = l.write + s2pWSlots*l.slot
	l.readLen = max(soakReadLen, l.slot)
	l.atomic = l.readSrc + l.readLen
	l.size = l.atomic + 16
	return l
}

// s2pOp is one planned work request.
type s2pOp struct {
	seq  uint64
	op   qp.WROpcode
	n    int    // bytes
	slot int    // WRITE: destination write slot; READ: source write slot, -1 = the static region
	roff int    // READ of the static region: offset in it
	imm  uint32 // SEND_WITH_IMM, WRITE_WITH_IMM
	add  uint64 // FETCH_ADD: addend; CMP_SWP: compare value
	swap uint64 // CMP_SWP: swap value
	want uint64 // atomics: the original value the responder must return
}

// recv reports whether the operation consumes a receive WQE (IBTA 9.4.1:
// SEND; 9.4.2: RDMA WRITE with immediate).
func (o *s2pOp) recv() bool {
	return o.op == qp.WRSend || o.op == qp.WRSendWithImm || o.op == qp.WRRDMAWriteWithImm
}

func (o *s2pOp) isWrite() bool { return o.op == qp.WRRDMAWrite || o.op == qp.WRRDMAWriteWithImm }

func (o *s2pOp) withImm() bool { return o.op == qp.WRSendWithImm || o.op == qp.WRRDMAWriteWithImm }

// s2pPlan draws a direction's operations.
type s2pPlan struct {
	id       uint64
	n, drawn int
	maxSize  int
	lay      s2pLayout
	rng      *rand.Rand
	faa, cas uint64 // the responder's atomic words after the operations drawn so far
}

func newS2PPlan(seed, id uint64, n, maxSize int, lay s2pLayout) *s2pPlan {
	return &s2pPlan{id: id, n: n, maxSize: maxSize, lay: lay, rng: rand.New(rand.NewPCG(seed, 0x2b0c<<32|id))}
}

func (p *s2pPlan) done() bool { return p.drawn >= p.n }

// next draws the next operation (the mix of the in-process soak; READs
// read either the peer's static region or, one in three, a write slot this
// direction wrote earlier).
func (p *s2pPlan) next() s2pOp {
	o := s2pOp{seq: uint64(p.drawn), slot: -1}
	p.drawn++
	r := p.rng
	o.n = r.IntN(p.maxSize + 1)
	if r.IntN(8) == 0 {
		o.n = r.IntN(64)
	}
	o.op = soakOpcode(r.IntN(100))
	switch o.op {
	case qp.WRSend, qp.WRSendWithImm:
	case qp.WRRDMAWrite, qp.WRRDMAWriteWithImm:
		o.slot = int(o.seq % s2pWSlots)
	case qp.WRRDMARead:
		if r.IntN(3) == 0 {
			// A write slot whose next possible WRITE (seq+k, k >= window)
			// cannot be posted before this READ completes (the send queue
			// holds s2pWindow WRs): even a replayed READ (IBTA 9.7.5.1.3
			// re-reads memory) sees only the WRITEs posted before it.
			k := s2pWindow + r.IntN(s2pWSlots-s2pWindow+1)
			o.slot = int((o.seq + uint64(k)) % s2pWSlots)
		} else {
			o.roff = r.IntN(p.lay.readLen - o.n + 1)
		}
	case qp.WRAtomicFetchAndAdd:
		o.n = 8
		o.add = r.Uint64() >> r.IntN(64)
		o.want = p.faa
		p.faa += o.add
	case qp.WRAtomicCmpAndSwp:
		o.n = 8
		o.add = p.cas
		if r.IntN(3) == 0 {
			o.add = r.Uint64() // (almost surely) fails: the word stays
		}
		o.swap = r.Uint64()
		o.want = p.cas
		if o.add == p.cas {
			p.cas = o.swap
		}
	}
	if o.withImm() {
		o.imm = uint32(o.seq*2654435761) ^ uint32(p.id)
	}
	return o
}

// digestRecv adds a receive completion to a digest: the same bytes on the
// requester (from what it posted) and on the responder (from the WC and
// the receive buffer).
func digestRecv(h hash.Hash, kind byte, imm uint32, withImm bool, payload []byte) {
	var hdr [14]byte
	hdr[0] = kind
	if withImm {
		hdr[1] = 1
		binary.LittleEndian.PutUint32(hdr[2:], imm)
	}
	binary.LittleEndian.PutUint64(hdr[6:], uint64(len(payload)))
	h.Write(hdr[:])
	h.Write(payload)
}

// digestFinal adds the responder's final memory to a digest.
func digestFinal(h hash.Hash, write, readSrc []byte, faa, cas uint64) []byte {
	h.Write(write)
	h.Write(readSrc)
	var w [16]byte
	binary.LittleEndian.PutUint64(w[:], faa)
	binary.LittleEndian.PutUint64(w[8:], cas)
	h.Write(w[:])
	return h.Sum(nil)
}

func s2pWCOp(op qp.WROpcode) cq.Opcode { return wcOp(op) }

// s2pSender is the requester side's checker for one direction.
type s2pSender struct {
	plan     *s2pPlan
	lay      s2pLayout
	peerRead []byte // the peer's static READ region (s2pReadID pattern of the pair)
	shadow   []byte // the peer's write region as the WRITEs posted so far leave it
	ops      [s2pWindow]s2pOp
	posted   int
	checked  int
	bytes    uint64
	dig      hash.Hash // receives as posted
}

func newS2PSender(plan *s2pPlan, pair int) *s2pSender {
	s := &s2pSender{plan: plan, lay: plan.lay, dig: sha256.New()}
	s.peerRead = make([]byte, s.lay.readLen)
	soakPattern(s.peerRead, s2pReadID, uint64(pair))
	s.shadow = make([]byte, s2pWSlots*s.lay.slot)
	return s
}

// prepare draws the next operation and writes its payload into local (the
// WR's local slot, at least lay.slot bytes); the WR is then posted as is.
func (s *s2pSender) prepare(local []byte) *s2pOp {
	o := s.plan.next()
	s.ops[s.posted%s2pWindow] = o
	s.posted++
	switch {
	case o.op == qp.WRSend || o.op == qp.WRSendWithImm || o.isWrite():
		soakPattern(local[:o.n], s.plan.id, o.seq)
		if o.isWrite() {
			copy(s.shadow[o.slot*s.lay.slot:], local[:o.n])
		}
	case o.op == qp.WRRDMARead:
		clear(local[:o.n])
	}
	if o.recv() {
		kind := byte(0)
		payload := local[:o.n]
		if o.isWrite() {
			kind, payload = 1, nil
		}
		digestRecv(s.dig, kind, o.imm, o.withImm(), payload)
	}
	return &s.ops[(s.posted-1)%s2pWindow]
}

// check checks the send completion of the oldest outstanding operation;
// local is its local slot.
func (s *s2pSender) check(wc *cq.WC, local []byte) error {
	o := &s.ops[s.checked%s2pWindow]
	id := s.plan.id
	if s.checked >= s.posted {
		return fmt.Errorf("dir %d: send completion %+v with nothing outstanding", id, *wc)
	}
	if wc.WRID != o.seq || wc.Status != cq.StatusSuccess || wc.Opcode != s2pWCOp(o.op) || wc.ByteLen != uint32(o.n) {
		return fmt.Errorf("dir %d: op %d (%v, %d bytes): send completion %+v (%v)", id, o.seq, o.op, o.n, *wc, wc.Status)
	}
	switch o.op {
	case qp.WRRDMARead:
		var want []byte
		what := "static region"
		if o.slot >= 0 {
			want = s.shadow[o.slot*s.lay.slot:][:o.n]
			what = fmt.Sprintf("write slot %d", o.slot)
		} else {
			want = s.peerRead[o.roff:][:o.n]
		}
		if i := firstDiff(local[:o.n], want); i >= 0 {
			return fmt.Errorf("dir %d: op %d READ (%d bytes of the peer's %s): byte %d is %#x, want %#x", id, o.seq, o.n, what, i, local[i], want[i])
		}
	case qp.WRAtomicFetchAndAdd, qp.WRAtomicCmpAndSwp:
		if got := binary.LittleEndian.Uint64(local); got != o.want {
			return fmt.Errorf("dir %d: op %d %v returned %#x, want %#x (executed twice, never, or out of order)", id, o.seq, o.op, got, o.want)
		}
	}
	s.bytes += uint64(o.n)
	s.checked++
	return nil
}

// digest is what the responder's digest must be once every operation completed.
func (s *s2pSender) digest() []byte {
	return digestFinal(s.dig, s.shadow, s.peerRead, s.plan.faa, s.plan.cas)
}

// s2pReceiver is the responder side's checker for the peer's direction.
type s2pReceiver struct {
	plan      *s2pPlan
	lay       s2pLayout
	pair      int
	shadow    []byte   // this end's write region as the plan's WRITEs leave it
	lastWrite []uint64 // per write slot: the last WRITE's op + 1 (0: none)
	want      s2pOp    // the next receive
	have      bool
	recvSeq   uint64 // receive completions seen
	dig       hash.Hash
}

func newS2PReceiver(plan *s2pPlan, pair int) *s2pReceiver {
	r := &s2pReceiver{plan: plan, lay: plan.lay, pair: pair, dig: sha256.New()}
	r.shadow = make([]byte, s2pWSlots*r.lay.slot)
	r.lastWrite = make([]uint64, s2pWSlots)
	r.advance()
	return r
}

// advance draws operations up to the next one that consumes a receive
// WQE, applying WRITEs to the shadow.
func (r *s2pReceiver) advance() {
	r.have = false
	for !r.plan.done() {
		o := r.plan.next()
		if o.isWrite() {
			soakPattern(r.shadow[o.slot*r.lay.slot:][:o.n], r.plan.id, o.seq)
			r.lastWrite[o.slot] = o.seq + 1
		}
		if o.recv() {
			r.want, r.have = o, true
			return
		}
	}
}

// done reports whether every receive of the plan was seen.
func (r *s2pReceiver) done() bool { return !r.have }

// onRecv checks a receive completion; buf is its receive slot.
func (r *s2pReceiver) onRecv(wc *cq.WC, buf []byte) error {
	id := r.plan.id
	if !r.have {
		return fmt.Errorf("dir %d: receive completion %+v (%v) after the last planned receive (a message delivered twice?)", id, *wc, wc.Status)
	}
	o := &r.want
	wantOp, flags := cq.OpRecv, cq.Flags(0)
	if o.isWrite() {
		wantOp = cq.OpRecvRDMAWithImm
	}
	imm := uint32(0)
	if o.withImm() {
		flags, imm = cq.FlagWithImm, o.imm
	}
	if wc.Status != cq.StatusSuccess || wc.Opcode != wantOp || wc.Flags != flags || wc.ImmData != imm ||
		(wantOp == cq.OpRecv && wc.ByteLen != uint32(o.n)) {
		return fmt.Errorf("dir %d: op %d (%v, %d bytes, imm %#x): receive completion %+v (%v) (a message lost, delivered twice or out of order?)",
			id, o.seq, o.op, o.n, o.imm, *wc, wc.Status)
	}
	if slot := int(wc.WRID); slot != int(r.recvSeq%s2pRQ) {
		return fmt.Errorf("dir %d: op %d: receive WQE %d completed, want %d (out of order)", id, o.seq, slot, r.recvSeq%s2pRQ)
	}
	var payload []byte
	kind := byte(1)
	if wantOp == cq.OpRecv {
		payload, kind = buf[:o.n], 0
		if i := soakPatternEqual(payload, id, o.seq); i >= 0 {
			return fmt.Errorf("dir %d: op %d SEND (%d bytes): received byte %d differs", id, o.seq, o.n, i)
		}
	}
	digestRecv(r.dig, kind, wc.ImmData, wc.Flags&cq.FlagWithImm != 0, payload)
	r.recvSeq++
	r.advance()
	return nil
}

// final checks this end's memory once the peer's requester completed
// everything and returns the digest of what was received. write, readSrc
// and atomic are the end's regions (atomic: the two words).
func (r *s2pReceiver) final(write, readSrc, atomic []byte) ([]byte, error) {
	id := r.plan.id
	var errs []error
	if r.have {
		errs = append(errs, fmt.Errorf("dir %d: op %d (%v) never received (%d receive completions)", id, r.want.seq, r.want.op, r.recvSeq))
		for r.have {
			r.advance()
		}
	}
	if i := firstDiff(write, r.shadow); i >= 0 {
		slot := i / r.lay.slot
		last := "no WRITE"
		if w := r.lastWrite[slot]; w > 0 {
			last = fmt.Sprintf("last WRITE op %d", w-1)
		}
		errs = append(errs, fmt.Errorf("dir %d: write slot %d byte %d is %#x, want %#x (%s)", id, slot, i%r.lay.slot, write[i], r.shadow[i], last))
	}
	want := make([]byte, r.lay.readLen)
	soakPattern(want, s2pReadID, uint64(r.pair))
	if i := firstDiff(readSrc, want); i >= 0 {
		errs = append(errs, fmt.Errorf("dir %d: static READ region byte %d changed", id, i))
	}
	faa, cas := binary.LittleEndian.Uint64(atomic), binary.LittleEndian.Uint64(atomic[8:])
	if faa != r.plan.faa {
		errs = append(errs, fmt.Errorf("dir %d: FETCH_ADD word %#x, want %#x (an add applied twice or never)", id, faa, r.plan.faa))
	}
	if cas != r.plan.cas {
		errs = append(errs, fmt.Errorf("dir %d: CMP_SWP word %#x, want %#x", id, cas, r.plan.cas))
	}
	return digestFinal(r.dig, write, readSrc, faa, cas), errors.Join(errs...)
}

func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
