package roce

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/mem"
)

// gatherLink returns datagrams from Recv only in batches of want, so a test knows what one
// receive batch holds; it counts the ACKs it sends and the Send calls that carried them.
type gatherLink struct {
	link.Link
	want int
	buf  []link.Datagram
	acks atomic.Int64
	// first and firstSends count the ACKs sent while the device handled the first batch
	// (between the first Recv's return and the second Recv call) and the Sends they took.
	first, firstSends atomic.Int64
	calls             atomic.Int64
}

func (l *gatherLink) Send(b []link.Datagram) error {
	if l.calls.Load() == 1 {
		l.firstSends.Add(1)
	}
	for i := range b {
		if len(b[i].Buf) > 0 && bth.Opcode(b[i].Buf[0]) == bth.OpRCAck {
			l.acks.Add(1)
			if l.calls.Load() == 1 {
				l.first.Add(1)
			}
		}
	}
	return l.Link.Send(b)
}

func (l *gatherLink) Recv(b []link.Datagram) (int, error) {
	l.calls.Add(1)
	for len(l.buf) < l.want {
		tmp := make([]link.Datagram, l.want-len(l.buf))
		for i := range tmp {
			tmp[i].Buf = make([]byte, link.MaxDatagram)
		}
		n, err := l.Link.Recv(tmp)
		if err != nil {
			return 0, err
		}
		l.buf = append(l.buf, tmp[:n]...)
	}
	n := copy(b, l.buf)
	l.buf = l.buf[n:]
	return n, nil
}

// TestReceiveBatchOneSend: 8 one-packet WRITEs that reach the responder's device in one receive
// batch are answered with their 8 ACKs in one Send (qp.ReceiveDeferred, flushed after the batch),
// which complete all 8 at the requester; per-packet flushing took 8 Sends.
func TestReceiveBatchOneSend(t *testing.T) {
	nw := mem.NewNetwork(mem.Options{QueueDepth: 1024})
	la, err := nw.Attach(addrA)
	if err != nil {
		t.Fatal(err)
	}
	lb0, err := nw.Attach(addrB)
	if err != nil {
		t.Fatal(err)
	}
	const msgs = 8
	lb := &gatherLink{Link: lb0, want: msgs}
	da, err := Open(Options{Link: la, Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	db, err := Open(Options{Link: lb, Name: "b"})
	if err != nil {
		da.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		da.Close()
		db.Close()
	})
	a, b := newEnd(t, da, qp.TypeRC, 1<<16), newEnd(t, db, qp.TypeRC, 1<<16)
	connect(t, a, b, qp.MTU1024, 10, 20)
	a.fill(0, msgs*512, 5)
	wrs := make([]qp.SendWR, msgs)
	for i := range wrs {
		wrs[i] = qp.SendWR{WRID: uint64(i), Opcode: qp.WRRDMAWrite, SGL: []qp.SGE{a.sge(i*512, 512)},
			Flags: qp.SendSignaled, RemoteAddr: b.va(i * 512), RKey: b.mr.RKey()}
	}
	post(t, a, wrs...)
	wcs := waitWC(t, a.scq, msgs)
	for i, w := range wcs {
		if w.Status != 0 || w.WRID != uint64(i) {
			t.Fatalf("completion %d: %+v", i, w)
		}
	}
	same(t, "written data", b.buf[:msgs*512], a.buf[:msgs*512])
	// (ACKs after the first batch would answer retransmissions, if an ACK timeout on a loaded
	// machine caused any: the completions above came from the first batch's ACK)
	if acks, sends := lb.first.Load(), lb.firstSends.Load(); acks != msgs || sends != 1 {
		t.Fatalf("responder sent %d ACKs in %d Sends for one batch of %d requests, want %d in 1", acks, sends, msgs, msgs)
	}
}

// gateLink holds the ACKs the device sends until the gate opens; it reports when its Close is
// called, and the gate opens then (the device closed its link while an ACK was in flight) or
// when the test opens it.
type gateLink struct {
	link.Link
	gate   chan struct{}
	once   sync.Once
	held   chan struct{} // closed when the first ACK waits at the gate
	hold   sync.Once
	closed atomic.Bool
}

func (l *gateLink) open() { l.once.Do(func() { close(l.gate) }) }

func (l *gateLink) Send(b []link.Datagram) error {
	for i := range b {
		if len(b[i].Buf) > 0 && bth.Opcode(b[i].Buf[0]) == bth.OpRCAck {
			l.hold.Do(func() { close(l.held) })
			<-l.gate
			break
		}
	}
	return l.Link.Send(b)
}

func (l *gateLink) Close() error {
	l.closed.Store(true)
	err := l.Link.Close()
	l.open()
	return err
}

// TestCloseSendsDeferredACK: a SEND's receive completion can be polled while the receive batch
// that produced it has not yet sent the SEND's ACK (qp.ReceiveDeferred; the flush follows the
// batch). A program that polls it and closes its device at once must not lose that ACK (IBTA
// 9.7.5.1; rxe acknowledges before the QP can go): Close waits for the batch being handled, so
// the requester's SEND completes successfully. Without the wait, Close closes the link while
// the ACK is held at the gate and the requester never gets it.
func TestCloseSendsDeferredACK(t *testing.T) {
	nw := mem.NewNetwork(mem.Options{QueueDepth: 1024})
	la, err := nw.Attach(addrA)
	if err != nil {
		t.Fatal(err)
	}
	lb0, err := nw.Attach(addrB)
	if err != nil {
		t.Fatal(err)
	}
	lb := &gateLink{Link: lb0, gate: make(chan struct{}), held: make(chan struct{})}
	da, err := Open(Options{Link: la, Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { da.Close() })
	db, err := Open(Options{Link: lb, Name: "b"})
	if err != nil {
		t.Fatal(err)
	}
	bClosed := false
	t.Cleanup(func() {
		lb.open()
		if !bClosed {
			db.Close()
		}
	})
	a, b := newEnd(t, da, qp.TypeRC, 1<<12), newEnd(t, db, qp.TypeRC, 1<<12)
	connect(t, a, b, qp.MTU1024, 10, 20)
	if _, err := b.qp.PostRecv([]qp.RecvWR{{WRID: 7, SGL: []qp.SGE{b.sge(0, 256)}}}); err != nil {
		t.Fatal(err)
	}
	a.fill(0, 64, 3)
	post(t, a, qp.SendWR{WRID: 1, Opcode: qp.WRSend, SGL: []qp.SGE{a.sge(0, 64)}, Flags: qp.SendSignaled})
	if w := waitWC(t, b.rcq, 1); w[0].Status != 0 || w[0].WRID != 7 {
		t.Fatalf("receive completion %+v", w[0])
	}
	<-lb.held // the ACK is in the batch's flush, held
	done := make(chan struct{})
	go func() {
		db.Close()
		close(done)
	}()
	// the gate opens when Close reaches the link (the ACK then goes to a closed link), or here
	// once Close has had the chance to: with the fix Close waits for the batch instead
	select {
	case <-done:
		t.Fatal("Close returned while a receive batch was still sending its ACKs")
	case <-time.After(50 * time.Millisecond):
	}
	lb.open()
	<-done
	bClosed = true
	w := waitWC(t, a.scq, 1)
	if w[0].Status != 0 || w[0].WRID != 1 {
		t.Fatalf("requester's SEND completed %+v, want success: its ACK was lost when the responder closed", w[0])
	}
}
