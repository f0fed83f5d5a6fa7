package proto

import (
	"bytes"
	"errors"
	"testing"

	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/internal/qp"
)

func newPostPair(t testing.TB) (prod, cons *PostRing, mem []byte) {
	mem = make([]byte, PostRingBytes)
	p, ok1 := NewPostRing(mem, true)
	c, ok2 := NewPostRing(mem, false)
	if !ok1 || !ok2 {
		t.Fatal("NewPostRing refused a ring of PostRingBytes")
	}
	return p, c, mem
}

// TestPostRingOrderWrapFull: records come out in order and byte-exact across
// many wraps (pad records), a full ring refuses a write without writing, and
// the doorbell is asked for only while the consumer is not awake.
func TestPostRingOrderWrapFull(t *testing.T) {
	p, c, _ := newPostPair(t)
	var buf []byte
	next := 0
	mk := func(i int) []byte {
		m := make([]byte, 1+(i*37)%3000)
		m[0] = byte(wire.OpPostSendAsync)
		for j := 1; j < len(m); j++ {
			m[j] = byte(i + j)
		}
		return m
	}
	written := 0
	for round := 0; round < 50; round++ {
		// Fill until full.
		for {
			ok, _ := p.Write(mk(written))
			if !ok {
				break
			}
			written++
		}
		if written == next {
			t.Fatal("nothing fit")
		}
		// Drain a part (half), then refill on the next round: positions move around the ring.
		stop := next + (written-next)/2 + 1
		for next < stop {
			m, err := c.Next(&buf)
			if err != nil || m == nil {
				t.Fatalf("record %d: %v %v", next, m, err)
			}
			if !bytes.Equal(m, mk(next)) {
				t.Fatalf("record %d differs", next)
			}
			next++
		}
	}
	for next < written {
		m, err := c.Next(&buf)
		if err != nil || !bytes.Equal(m, mk(next)) {
			t.Fatalf("record %d: %v", next, err)
		}
		next++
	}
	if m, err := c.Next(&buf); m != nil || err != nil {
		t.Fatalf("empty ring returned %v %v", m, err)
	}
	if ok, _ := p.Write(make([]byte, MaxPostRecord+1)); ok {
		t.Fatal("oversized record accepted")
	}
	c.SetAwake(1)
	if ok, ring := p.Write([]byte{1}); !ok || ring {
		t.Fatalf("awake consumer: ok %v ring %v, want true false", ok, ring)
	}
	c.SetAwake(0)
	if ok, ring := p.Write([]byte{1}); !ok || !ring {
		t.Fatalf("sleeping consumer: ok %v ring %v, want true true", ok, ring)
	}
}

// TestPostRingCorrupt: each way a client can corrupt its ring is reported,
// never followed.
func TestPostRingCorrupt(t *testing.T) {

	cases := map[string]func(mem []byte){
		"tail beyond capacity": func(mem []byte) { ne.PutUint64(mem[postTail:], PostRingData+8) },
		"unaligned tail":       func(mem []byte) { ne.PutUint64(mem[postTail:], 12) },
		"zero length":          func(mem []byte) { ne.PutUint32(mem[PostRingHeader:], 0) },
		"length beyond tail":   func(mem []byte) { ne.PutUint32(mem[PostRingHeader:], 4096) },
		"length beyond max":    func(mem []byte) { ne.PutUint32(mem[PostRingHeader:], MaxPostRecord+1) },
		"unknown kind":         func(mem []byte) { ne.PutUint32(mem[PostRingHeader+4:], 7) },
		"pad not to the end":   func(mem []byte) { ne.PutUint32(mem[PostRingHeader+4:], RecordPad) },
	}
	for name, corrupt := range cases {
		p, c, mem := newPostPair(t)
		if ok, _ := p.Write(make([]byte, 100)); !ok {
			t.Fatal("write")
		}
		corrupt(mem)
		var buf []byte
		if m, err := c.Next(&buf); !errors.Is(err, ErrRingCorrupt) {
			t.Errorf("%s: got %v %v, want ErrRingCorrupt", name, m, err)
		}
	}
}

// FuzzPostRing: whatever a client writes into the ring's header and data,
// the consumer returns records within bounds or ErrRingCorrupt, never
// panics, and terminates; each record decodes (or is refused) without a
// panic, as the daemon's drainer would do.
func FuzzPostRing(f *testing.F) {
	post, _ := AppendPostSend(nil, wire.OpPostSendAsync, 1, []qp.SendWR{{WRID: 1, Opcode: qp.WRRDMAWrite, SGL: []qp.SGE{{Length: 8, LKey: 1}}}})
	recv, _ := AppendPostRecv(nil, wire.OpPostRecvAsync, 1, []qp.RecvWR{{WRID: 1, SGL: []qp.SGE{{Length: 8}}}})
	f.Add(uint64(0), uint64(0), post, recv, uint32(0))
	f.Add(uint64(PostRingData-16), uint64(PostRingData-16), post, recv, uint32(0))
	f.Add(uint64(0), uint64(24), []byte{9, 0, 0, 0, 1, 0, 0, 0}, []byte{}, uint32(5))
	f.Fuzz(func(t *testing.T, start, extra uint64, a, b []byte, flip uint32) {
		mem := make([]byte, PostRingBytes)
		start &^= 7 // counters start aligned (0 in a new ring)
		ne.PutUint64(mem[postTail:], start)
		ne.PutUint64(mem[postHead:], start)
		p, _ := NewPostRing(mem, true)
		c, _ := NewPostRing(mem, false)
		p.Write(a)
		p.Write(b)
		// Arbitrary client scribbling: a word of the data and the tail.
		if len(a) > 0 {
			ne.PutUint32(mem[PostRingHeader+int(flip)%(PostRingData-4):], flip)
		}
		if extra%3 == 0 {
			ne.PutUint64(mem[postTail:], start+extra)
		}
		var buf []byte
		var sd SendDecoder
		var rd RecvDecoder
		for i := 0; i < 1<<16; i++ {
			m, err := c.Next(&buf)
			if err != nil || m == nil {
				return
			}
			if len(m) == 0 || len(m) > MaxPostRecord {
				t.Fatalf("record of %d bytes", len(m))
			}
			if op, _, n, rest, err := PostHeader(m); err == nil {
				switch op {
				case wire.OpPostSendAsync:
					sd.Decode(rest, n)
				case wire.OpPostRecvAsync:
					rd.Decode(rest, n)
				}
			}
		}
		t.Fatal("consumer did not terminate")
	})
}
