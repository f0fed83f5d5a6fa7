package roce

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/qp"
)

// The two-process soak's checkers must catch every way delivery can go
// wrong. These tests run one direction's plan through a model of an RC pair
// (each operation executed once, in order, like a correct responder),
// first faithfully — the checkers must accept it and the digests match —
// then with one injected fault each: the checkers must reject it, naming
// the operation.

// s2pModelFault is the one thing the model does wrong (op numbers are
// plan sequence numbers; -1 = none).
type s2pModelFault struct {
	corruptSend  int // flip a byte of this SEND's delivered payload
	dupSend      int // deliver this SEND (or WRITE_WITH_IMM) twice
	loseSend     int // never deliver this SEND (its send completion still comes)
	dupFAA       int // execute this FETCH_ADD twice
	corruptWrite int // flip the first byte this WRITE places
	loseWrite    int // do not place this WRITE
	wrongImm     int // deliver this op's immediate data wrong
}

func noModelFault() s2pModelFault {
	return s2pModelFault{-1, -1, -1, -1, -1, -1, -1}
}

type s2pModelResult struct {
	sendErr, recvErr error
	sent, recv       []byte // digests
	kinds            map[qp.WROpcode]int
	readBacks        int
}

const (
	s2pModelSeed = 7
	s2pModelN    = 3000
	s2pModelMax  = 3 * 1024
)

// s2pModelRun runs direction 3 (pair 1) of seed s2pModelSeed through the model.
func s2pModelRun(f s2pModelFault) s2pModelResult {
	lay := newS2PLayout(s2pModelMax)
	snd := newS2PSender(newS2PPlan(s2pModelSeed, 3, s2pModelN, s2pModelMax, lay), 1)
	rcv := newS2PReceiver(newS2PPlan(s2pModelSeed, 3, s2pModelN, s2pModelMax, lay), 1)
	res := s2pModelResult{kinds: map[qp.WROpcode]int{}}
	dst := make([]byte, lay.size) // the responder's MR
	soakPattern(dst[lay.readSrc:lay.readSrc+lay.readLen], s2pReadID, 1)
	local := make([]byte, lay.slot)
	var recvSeq uint64
	note := func(p *error, err error) {
		if err != nil && *p == nil {
			*p = err
		}
	}
	deliver := func(o *s2pOp, payload []byte) {
		wc := cq.WC{WRID: recvSeq % s2pRQ, Status: cq.StatusSuccess, Opcode: cq.OpRecv, ByteLen: uint32(len(payload))}
		if o.isWrite() {
			wc.Opcode, wc.ByteLen = cq.OpRecvRDMAWithImm, uint32(o.n)
		}
		if o.withImm() {
			wc.Flags, wc.ImmData = cq.FlagWithImm, o.imm
			if int(o.seq) == f.wrongImm {
				wc.ImmData ^= 0x100
			}
		}
		buf := dst[lay.recv+int(wc.WRID)*lay.slot:][:lay.slot]
		copy(buf, payload)
		recvSeq++
		note(&res.recvErr, rcv.onRecv(&wc, buf))
	}
	for !snd.plan.done() {
		o := snd.prepare(local)
		res.kinds[o.op]++
		seq := int(o.seq)
		switch o.op {
		case qp.WRSend, qp.WRSendWithImm:
			payload := bytes.Clone(local[:o.n])
			if seq == f.corruptSend && len(payload) > 0 {
				payload[len(payload)/2] ^= 0x10
			}
			if seq != f.loseSend {
				deliver(o, payload)
			}
			if seq == f.dupSend {
				deliver(o, payload)
			}
		case qp.WRRDMAWrite, qp.WRRDMAWriteWithImm:
			if seq != f.loseWrite {
				w := dst[lay.write+o.slot*lay.slot:]
				copy(w, local[:o.n])
				if seq == f.corruptWrite && o.n > 0 {
					w[0] ^= 0x01
				}
			}
			if o.recv() {
				deliver(o, nil)
				if seq == f.dupSend {
					deliver(o, nil)
				}
			}
		case qp.WRRDMARead:
			src := dst[lay.readSrc+o.roff:]
			if o.slot >= 0 {
				src = dst[lay.write+o.slot*lay.slot:]
				res.readBacks++
			}
			copy(local, src[:o.n])
		case qp.WRAtomicFetchAndAdd:
			w := dst[lay.atomic:]
			old := binary.LittleEndian.Uint64(w)
			binary.LittleEndian.PutUint64(w, old+o.add)
			if seq == f.dupFAA {
				binary.LittleEndian.PutUint64(w, old+2*o.add)
			}
			binary.LittleEndian.PutUint64(local, old)
		case qp.WRAtomicCmpAndSwp:
			w := dst[lay.atomic+8:]
			old := binary.LittleEndian.Uint64(w)
			if old == o.add {
				binary.LittleEndian.PutUint64(w, o.swap)
			}
			binary.LittleEndian.PutUint64(local, old)
		}
		wc := cq.WC{WRID: o.seq, Status: cq.StatusSuccess, Opcode: s2pWCOp(o.op), ByteLen: uint32(o.n)}
		note(&res.sendErr, snd.check(&wc, local))
	}
	d, err := rcv.final(dst[lay.write:lay.write+s2pWSlots*lay.slot], dst[lay.readSrc:lay.readSrc+lay.readLen], dst[lay.atomic:lay.atomic+16])
	note(&res.recvErr, err)
	res.recv, res.sent = d, snd.digest()
	return res
}

// s2pModelOps draws the model's plan (what both checkers draw).
func s2pModelOps() []s2pOp {
	p := newS2PPlan(s2pModelSeed, 3, s2pModelN, s2pModelMax, newS2PLayout(s2pModelMax))
	var ops []s2pOp
	for !p.done() {
		ops = append(ops, p.next())
	}
	return ops
}

func TestSoak2PCheckerAcceptsCorrectRun(t *testing.T) {
	r := s2pModelRun(noModelFault())
	if r.sendErr != nil || r.recvErr != nil {
		t.Fatalf("a correct run rejected: requester %v; responder %v", r.sendErr, r.recvErr)
	}
	if !bytes.Equal(r.sent, r.recv) || len(r.sent) != 32 {
		t.Fatalf("digests %x (sent) and %x (received) differ", r.sent, r.recv)
	}
	for _, op := range []qp.WROpcode{qp.WRSend, qp.WRSendWithImm, qp.WRRDMAWrite, qp.WRRDMAWriteWithImm,
		qp.WRRDMARead, qp.WRAtomicFetchAndAdd, qp.WRAtomicCmpAndSwp} {
		if r.kinds[op] < s2pModelN/50 {
			t.Errorf("only %d %v in %d operations", r.kinds[op], op, s2pModelN)
		}
	}
	if r.readBacks < s2pModelN/50 {
		t.Errorf("only %d READs of a write slot", r.readBacks)
	}
	// the plan is a function of (seed, direction): another direction differs
	lay := newS2PLayout(s2pModelMax)
	a, b := newS2PPlan(s2pModelSeed, 3, 10, s2pModelMax, lay), newS2PPlan(s2pModelSeed, 2, 10, s2pModelMax, lay)
	same := 0
	for !a.done() {
		if x, y := a.next(), b.next(); x.op == y.op && x.n == y.n {
			same++
		}
	}
	if same == 10 {
		t.Error("directions 2 and 3 draw the same plan")
	}
}

func TestSoak2PCheckerCatches(t *testing.T) {
	ops := s2pModelOps()
	// pick the operations to damage, from the middle of the run
	find := func(ok func(o *s2pOp) bool) int {
		for i := len(ops) / 3; i < len(ops); i++ {
			if ok(&ops[i]) {
				return i
			}
		}
		t.Fatal("no operation fits")
		return -1
	}
	send := find(func(o *s2pOp) bool { return o.op == qp.WRSend && o.n > 100 })
	sendImm := find(func(o *s2pOp) bool { return o.op == qp.WRSendWithImm && o.n > 0 })
	faa := find(func(o *s2pOp) bool { return o.op == qp.WRAtomicFetchAndAdd && o.add != 0 })
	nextFAA := find(func(o *s2pOp) bool { return o.seq > uint64(faa) && o.op == qp.WRAtomicFetchAndAdd })
	// a WRITE that a later READ reads back before any WRITE to its slot
	readBack, readWrite := -1, -1
	for i := len(ops) / 3; i < len(ops) && readBack < 0; i++ {
		if o := &ops[i]; o.op == qp.WRRDMARead && o.slot >= 0 && o.n > 0 {
			for j := i - 1; j >= 0; j-- {
				if ops[j].isWrite() && ops[j].slot == o.slot {
					if ops[j].n > 0 {
						readBack, readWrite = i, j
					}
					break
				}
			}
		}
	}
	// the last WRITE of a slot (nothing overwrites it) with data
	lastWrite := -1
	for i := len(ops) - 1; i >= 0 && lastWrite < 0; i-- {
		if ops[i].isWrite() && ops[i].n > 64 {
			lastWrite = i
			for j := i + 1; j < len(ops); j++ {
				if ops[j].isWrite() && ops[j].slot == ops[i].slot {
					lastWrite = -1
				}
			}
		}
	}
	if readBack < 0 || lastWrite < 0 {
		t.Fatal("plan has no read-back or no final WRITE")
	}
	cases := []struct {
		name     string
		mod      func(f *s2pModelFault)
		sendWant string // substring of the requester's error ("" = none expected)
		recvWant string // substring of the responder's error ("" = none expected)
	}{
		{"wrong byte in a SEND", func(f *s2pModelFault) { f.corruptSend = send }, "", fmt.Sprintf("op %d SEND", send)},
		{"SEND delivered twice", func(f *s2pModelFault) { f.dupSend = send }, "", "receive completion"},
		{"SEND lost", func(f *s2pModelFault) { f.loseSend = send }, "", "receive completion"},
		{"wrong immediate", func(f *s2pModelFault) { f.wrongImm = sendImm }, "", fmt.Sprintf("op %d (", sendImm)},
		{"FETCH_ADD executed twice", func(f *s2pModelFault) { f.dupFAA = faa },
			fmt.Sprintf("op %d ATOMIC_FETCH_AND_ADD returned", nextFAA), "FETCH_ADD word"},
		{"wrong byte in a WRITE read back", func(f *s2pModelFault) { f.corruptWrite = readWrite },
			fmt.Sprintf("op %d READ", readBack), ""},
		{"wrong byte in the last WRITE of a slot", func(f *s2pModelFault) { f.corruptWrite = lastWrite },
			"", fmt.Sprintf("last WRITE op %d", lastWrite)},
		{"WRITE lost", func(f *s2pModelFault) { f.loseWrite = lastWrite }, "", fmt.Sprintf("last WRITE op %d", lastWrite)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := noModelFault()
			c.mod(&f)
			r := s2pModelRun(f)
			if r.sendErr == nil && r.recvErr == nil {
				t.Fatal("not detected by either checker")
			}
			check := func(side string, err error, want string) {
				if want == "" {
					return
				}
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("%s error %v, want one containing %q", side, err, want)
				}
			}
			check("requester", r.sendErr, c.sendWant)
			check("responder", r.recvErr, c.recvWant)
			if c.name != "wrong byte in a WRITE read back" && bytes.Equal(r.sent, r.recv) {
				t.Errorf("digests equal: %x", r.sent)
			}
			t.Logf("requester: %v\nresponder: %v", r.sendErr, r.recvErr)
		})
	}
}
