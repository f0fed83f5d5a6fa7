package fault

import (
	"net/netip"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/softroce/softroce/internal/clock"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/mem"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newManualClock returns the shared fake clock (clock.Manual, the engine's qp.ManualClock):
// time moves only in Advance, which runs due timers in deadline order in the calling
// goroutine, allocating nothing.
func newManualClock() *clock.Manual { return clock.NewManual(time.Unix(1_700_000_000, 0)) }

var (
	addrA = netip.MustParseAddr("198.18.0.1")
	addrB = netip.MustParseAddr("198.18.0.2")
	srcA  = netip.AddrPortFrom(addrA, 0xC001)
	dstB  = netip.AddrPortFrom(addrB, link.UDPPort)
)

// endpoints are the ICRC endpoints of a datagram from srcA to dstB (IPv4 ID 0).
func endpoints() *bth.Endpoints {
	return &bth.Endpoints{Src: addrA, Dst: addrB, SrcPort: srcA.Port(), DstPort: dstB.Port()}
}

// pkt builds a valid RoCEv2 packet with pkg/bth encoders: BTH (IBTA 9.2), zeroed extension
// headers, payload bytes (a multiple of 4, only for opcodes that carry payload) and a correct
// ICRC for srcA -> dstB (IBTA A17.3.3).
func pkt(tb testing.TB, op bth.Opcode, qpn uint32, psn bth.PSN, payload int) []byte {
	tb.Helper()
	info := op.Info()
	if !info.Valid {
		tb.Fatalf("opcode %v", op)
	}
	if !info.Payload {
		payload = 0
	}
	if info.FixedPayload > 0 {
		payload = info.FixedPayload
	}
	b := make([]byte, info.HdrLen+payload+bth.ICRCSize)
	bth.BTH(b).Encode(&bth.BTHFields{Opcode: op, PKey: 0xFFFF, DestQP: qpn, PSN: psn, AckReq: true})
	if info.Hdrs&bth.HdrAETH != 0 {
		off := bth.BTHSize
		bth.AETH(b[off:]).Encode(&bth.AETHFields{Syndrome: bth.SyndromeACK(0x1F), MSN: uint32(psn)})
	}
	for i := info.HdrLen; i < info.HdrLen+payload; i++ {
		b[i] = byte(i*7 + int(psn))
	}
	bth.SetICRC(b, bth.ICRC(endpoints(), b))
	if _, err := bth.Parse(b); err != nil {
		tb.Fatalf("built packet does not parse: %v", err)
	}
	return b
}

func dg(b []byte) link.Datagram { return link.Datagram{Buf: b, Src: srcA, Dst: dstB} }

// memPair returns a plain link at addrA and a plain link at addrB on a lossless in-memory
// network (queues deep enough for the tests).
func memPair(t *testing.T) (a, b link.Link) {
	t.Helper()
	n := mem.NewNetwork(mem.Options{QueueDepth: 1 << 17})
	a, err := n.Attach(addrA)
	if err != nil {
		t.Fatal(err)
	}
	b, err = n.Attach(addrB)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// recvN receives exactly n datagrams (blocking; the test's timeout catches a hang) and returns
// copies of their payloads.
func recvN(t *testing.T, l link.Link, n int) [][]byte {
	t.Helper()
	batch := make([]link.Datagram, 8)
	for i := range batch {
		batch[i].Buf = make([]byte, link.MaxDatagram)
	}
	var out [][]byte
	for len(out) < n {
		for i := range batch {
			batch[i].Buf = batch[i].Buf[:cap(batch[i].Buf)]
		}
		k, err := l.Recv(batch[:min(len(batch), n-len(out))])
		if err != nil {
			t.Fatalf("recv after %d of %d: %v", len(out), n, err)
		}
		for _, d := range batch[:k] {
			out = append(out, append([]byte(nil), d.Buf...))
		}
	}
	return out
}

// psns returns the PSN of each packet.
func psns(ps [][]byte) []uint32 {
	out := make([]uint32, len(ps))
	for i, p := range ps {
		out[i] = uint32(bth.BTH(p).PSN())
	}
	return out
}

// innerSent is how many datagrams the inner in-memory link has handed to the network.
func innerSent(t *testing.T, l link.Link) uint64 {
	t.Helper()
	return l.(link.StatsLink).Stats().Sent
}

// eventLog collects events (OnEvent runs under the injector's lock; the log has its own).
type eventLog struct {
	mu sync.Mutex
	ev []Event
	ch chan Event
}

func newEventLog() *eventLog { return &eventLog{ch: make(chan Event, 1<<16)} }

func (l *eventLog) add(e Event) {
	l.mu.Lock()
	l.ev = append(l.ev, e)
	l.mu.Unlock()
	select {
	case l.ch <- e:
	default:
	}
}

func (l *eventLog) all() []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Event(nil), l.ev...)
}

func (l *eventLog) kinds(k Action) []Event {
	var out []Event
	for _, e := range l.all() {
		if e.Kind == k {
			out = append(out, e)
		}
	}
	return out
}

// wait blocks until an event of kind k arrives (the receive pump runs asynchronously).
func (l *eventLog) wait(t *testing.T, k Action) Event {
	t.Helper()
	for e := range l.ch {
		if e.Kind == k {
			return e
		}
	}
	t.Fatal("event log closed")
	return Event{}
}
