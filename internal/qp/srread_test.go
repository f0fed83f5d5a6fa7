package qp

import (
	"fmt"
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
)

// Out-of-order placement of READ responses with selective repeat (srread.go): exact re-requests
// of what is missing, byte-exact data under loss, reordering and duplication, no allocation,
// and no write outside the READ's SGL.

// srReadResult is what one scripted 64 KiB READ shows.
type srReadResult struct {
	responses int      // READ response packets b sent (delivered or dropped by the filter)
	requests  []logged // READ requests a sent
	timeouts  uint64   // ACK timer retries of a
	resent    uint64   // a's retransmitted_pkts
	wc        []cq.WC  // a's completions
	data      bool     // the READ's bytes are b's
}

// srRead READs 64 KiB (64 responses at MTU 1024) from b into a, with b's responses whose
// index in the READ is in drop lost once (the filter drops them before delivery, so they count
// as sent), and WRITE after it if after; the wire runs to completion, the clock jumping to the
// next timer only when it is idle.
func srRead(t *testing.T, sr bool, drop []int, after bool) srReadResult {
	t.Helper()
	w := faultPair(t, connOpts{srA: sr, srB: sr, retry: 7}, "", "")
	a, b := w.a, w.b
	b.fill(1<<20, 64<<10, 11)
	dropped := map[int]bool{}
	var res srReadResult
	logf := w.filter
	w.filter = func(from *side, d *link.Datagram, p *bth.Packet) bool {
		if from == b && p.Info.Kind == bth.KindReadResp {
			res.responses++
			i := int(p.BTH.PSN())
			for _, k := range drop {
				if i == k && !dropped[k] {
					dropped[k] = true
					return false
				}
			}
		}
		return logf(from, d, p)
	}
	wrs := []SendWR{{WRID: 1, Opcode: WRRDMARead, SGL: []SGE{a.sge(0, 64<<10)}, Flags: SendSignaled,
		RemoteAddr: b.va(1 << 20), RKey: b.mr.RKey()}}
	if after {
		wrs = append(wrs, a.write(2, 128<<10, 512, b.va(2<<20), b.mr.RKey(), SendSignaled))
	}
	a.postSend(t, wrs...)
	for k := 0; k < 20; k++ {
		w.pump()
		if res.wc = append(res.wc, pollAll(a.scq)...); len(res.wc) == len(wrs) {
			break
		}
		dl, ok := w.clk.NextDeadline()
		if !ok {
			t.Fatal("stuck with no timer")
		}
		w.clk.Advance(dl.Sub(w.clk.Now()))
	}
	res.requests = w.sent(a, bth.OpRCReadRequest)
	s := a.cnt.Snapshot()
	res.timeouts, res.resent = s.CompleterRetryErr, s.RetransPkts
	res.data = string(a.buf[:64<<10]) == string(b.buf[1<<20:1<<20+64<<10])
	return res
}

// TestSRReadExact: with selective repeat a READ whose responses are lost asks again exactly for
// them, one request per missing run, and the responder sends each once more; without it the
// READ is asked again from its first lost byte and the rest of it is sent again.
func TestSRReadExact(t *testing.T) {
	for _, c := range []struct {
		drop      []int
		after     bool // a WRITE follows the READ (its ACK shows a lost tail)
		sr, gbn   int  // responses sent in all
		asks      []uint32
		srTimeout uint64
	}{
		{drop: []int{10}, sr: 65, gbn: 118, asks: []uint32{10}},
		{drop: []int{3, 10, 11, 40}, sr: 68, gbn: 125, asks: []uint32{3, 10, 40}},
		{drop: []int{0, 62}, sr: 66, gbn: 128, asks: []uint32{0, 62}},
		// the last response lost with nothing after it: the ACK timer asks for it alone
		{drop: []int{20, 63}, sr: 66, gbn: 108, asks: []uint32{20, 63}, srTimeout: 1},
		// ... or the response of the WRITE after it does
		{drop: []int{20, 63}, after: true, sr: 66, gbn: 108, asks: []uint32{20, 63}},
	} {
		t.Run(fmt.Sprint(c.drop, c.after), func(t *testing.T) {
			sr := srRead(t, true, c.drop, c.after)
			gbn := srRead(t, false, c.drop, c.after)
			t.Logf("64-packet READ, %d responses lost: selective repeat %d responses sent (%d READ requests, "+
				"%d timeouts), go-back-N %d (%d requests, %d timeouts)", len(c.drop), sr.responses,
				len(sr.requests), sr.timeouts, gbn.responses, len(gbn.requests), gbn.timeouts)
			for _, r := range []srReadResult{sr, gbn} {
				if !r.data || len(r.wc) == 0 || r.wc[0].Status != cq.StatusSuccess || r.wc[0].ByteLen != 64<<10 {
					t.Fatalf("READ: data ok %v, completions %+v", r.data, r.wc)
				}
			}
			if sr.responses != c.sr || sr.timeouts != c.srTimeout {
				t.Fatalf("selective repeat: %d responses, %d timeouts; want %d, %d", sr.responses, sr.timeouts, c.sr, c.srTimeout)
			}
			if len(sr.requests) != 1+len(c.asks) {
				t.Fatalf("selective repeat: READ requests %+v, want the READ and %v", sr.requests, c.asks)
			}
			lost := 0
			for k, psn := range c.asks {
				r := sr.requests[1+k]
				n := 1
				for _, d := range c.drop {
					if d > int(psn) && d < int(psn)+4 && d == int(psn)+n {
						n++
					}
				}
				lost += n
				if r.psn != bth.PSN(psn) || r.reth.DMALen != uint32(n)<<10 || r.reth.VA != sr.requests[0].reth.VA+uint64(psn)<<10 {
					t.Fatalf("request %d: %+v, want PSN %d for %d bytes at its offset", k, r, psn, n<<10)
				}
			}
			if lost != len(c.drop) || sr.resent != uint64(len(c.asks)) {
				t.Fatalf("asked %d packets again (%d requests counted resent), want %d", lost, sr.resent, len(c.drop))
			}
			if gbn.responses != c.gbn {
				t.Fatalf("go-back-N: %d responses, want %d", gbn.responses, c.gbn)
			}
		})
	}
}

// TestSRReadSoak: the fake-clock soak's mix (SEND, WRITE, WRITE_WITH_IMM, FETCH_ADD, CMP_SWP)
// with READs of up to 4 KiB (16 responses at MTU 256) both ways through 10% drop, 5%
// duplication and 5% reordering: every READ byte, every other byte and every atomic result
// checked, with selective repeat on both QPs and on one of them (a responder without it still
// answers the ranged READs a requester with it asks).
func TestSRReadSoak(t *testing.T) {
	msgs := 1500
	if testing.Short() {
		msgs = 400
	}
	for _, c := range []struct {
		name     string
		srA, srB bool
	}{{"both", true, true}, {"a-only", true, false}, {"b-only", false, true}, {"none", false, false}} {
		for seed := uint64(1); seed <= 3; seed++ {
			t.Run(fmt.Sprint(c.name, "/", seed), func(t *testing.T) {
				fakeSoakRun(t, seed, msgs, connOpts{srA: c.srA, srB: c.srB}, 4096)
			})
		}
	}
}

// TestSRReadZeroAlloc: once the placement records exist, a 64 KiB READ whose responses arrive
// out of order (one late: placed ahead, asked again, the copy ignored) allocates nothing.
func TestSRReadZeroAlloc(t *testing.T) {
	a, b, ra, rb, sa, sb := srRings(t)
	b.qp.cfg.Schedule = nil // all responses at once
	wr := []SendWR{{WRID: 1, Opcode: WRRDMARead, SGL: []SGE{a.sge(0, 64<<10)}, Flags: SendSignaled,
		RemoteAddr: b.va(dstOff), RKey: b.mr.RKey()}}
	wcs := make([]cq.WC, 4)
	run := func() {
		if _, err := a.qp.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		for first := true; ; first = false {
			if drain(ra, sa, b.qp, nil) == 0 && rb.n == 0 {
				break
			}
			if first && rb.n > 40 {
				rb.meta[3], rb.meta[30] = rb.meta[30], rb.meta[3] // 30 early, 3 late
			}
			drain(rb, sb, a.qp, nil)
		}
		if a.scq.Poll(wcs) != 1 || wcs[0].Status != cq.StatusSuccess {
			t.Fatalf("completion %+v", wcs[0])
		}
	}
	run()
	before := a.cnt.Snapshot().RetransPkts
	if allocs := testing.AllocsPerRun(20, run); allocs != 0 {
		t.Fatalf("%.1f allocations per reordered 64 KiB READ", allocs)
	}
	if a.cnt.Snapshot().RetransPkts == before || a.qp.req.srr == nil {
		t.Fatal("no READ response was placed out of order")
	}
}

// TestSRReadMalformed: a response whose length breaks the rules (a middle packet shorter or
// longer than the MTU, the last one longer than the READ's rest, or past the READ's range)
// fails the READ with BAD_RESP_ERR or is dropped: the bytes around the READ's SGL are never
// written.
func TestSRReadMalformed(t *testing.T) {
	for _, c := range []struct {
		name  string
		idx   uint32 // packet of the READ
		n     int    // payload length
		op    bth.Opcode
		fails bool
	}{
		{"middle short", 5, 1000, bth.OpRCReadRespMiddle, true},
		{"middle long", 5, 1100, bth.OpRCReadRespMiddle, true},
		{"last long", 7, 1024, bth.OpRCReadRespLast, true}, // the READ's rest is 1000 bytes
		{"last not last", 7, 1000, bth.OpRCReadRespMiddle, true},
		{"beyond", 8, 1024, bth.OpRCReadRespMiddle, false},
		{"far beyond", 200, 1024, bth.OpRCReadRespMiddle, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := newNet(t)
			a := n.newSide("10.0.0.1", sideOpts{qpn: 0x11})
			b := n.newSide("10.0.0.2", sideOpts{qpn: 0x12})
			n.connect(a, b, connOpts{srA: true, srB: true})
			for i := range a.buf[:16<<10] {
				a.buf[i] = 0xEE
			}
			// a READ of 7 x 1024 + 1000 bytes into [4 KiB, 4 KiB + 8168), PSNs 0..7
			a.postSend(t, SendWR{WRID: 1, Opcode: WRRDMARead, SGL: []SGE{a.sge(4<<10, 7<<10+1000)}, Flags: SendSignaled,
				RemoteAddr: b.va(0), RKey: b.mr.RKey()})
			a.out.q = nil // the request never reaches b: the test answers
			// b's QP builds the responses (BTH, AETH, payload, pad, ICRC) as the test says
			send := func(idx uint32, size int, op bth.Opcode) {
				q := b.qp
				q.mu.Lock()
				buf := q.txBuf()
				h := bth.BTHSize
				if op != bth.OpRCReadRespMiddle {
					bth.AETH(buf[h:]).Encode(&bth.AETHFields{Syndrome: bth.SyndromeACK(0x1F)})
					h += bth.AETHSize
				}
				for i := 0; i < size; i++ {
					buf[h+i] = 0x55
				}
				q.finish(buf, op, false, false, q.attr.DestQPN, bth.PSN(idx), h, size, &q.path)
				q.flush()
				q.mu.Unlock()
				for _, d := range b.out.q {
					n.deliver(b, &d)
				}
				b.out.q, a.out.q = nil, nil
			}
			send(1, 1024, bth.OpRCReadRespMiddle) // ahead of the missing 0: placed
			send(c.idx, c.n, c.op)
			st := a.qp.State()
			if c.fails != (st == StateErr) {
				t.Fatalf("QP in %v", st)
			}
			if c.fails {
				wcs := pollAll(a.scq)
				if len(wcs) != 1 || wcs[0].Status != cq.StatusBadRespErr {
					t.Fatalf("completions %+v, want BAD_RESP_ERR", wcs)
				}
			}
			for i, v := range a.buf[:16<<10] {
				inRead := i >= 4<<10 && i < 4<<10+7<<10+1000
				if !inRead && v != 0xEE {
					t.Fatalf("byte %d outside the READ's SGL written", i)
				}
				if inRead && v != 0xEE && !(i >= 5<<10 && i < 6<<10) {
					t.Fatalf("byte %d of the READ written by a dropped or malformed response", i-4<<10)
				}
			}
		})
	}
}
