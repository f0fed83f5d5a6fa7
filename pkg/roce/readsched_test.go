package roce

import (
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/internal/rocetest"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/mem"
)

// readRig is a device A serving READs to a raw requester at addrC (an injector link that never
// reads its queue: the responses are dropped there), and a bystander QP pair: a requester on
// device B writing to a responder on A. Both devices run on a clock that never moves, so no
// ACK timer fires: a bystander WRITE completes only when A has received it and its ACK is back.
type readRig struct {
	da, db   *Device
	inj      link.Link
	r        *end // A's QP the injector READs from
	x, y     *end // bystander: x on B writes to y on A
	readSize int
}

var addrC = netip.MustParseAddr("127.0.0.3")

func newReadRig(t *testing.T, readSize int) *readRig {
	t.Helper()
	nw := mem.NewNetwork(mem.Options{QueueDepth: 8192})
	la, err := nw.Attach(addrA)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := nw.Attach(addrB)
	if err != nil {
		t.Fatal(err)
	}
	inj, err := nw.Attach(addrC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inj.Close() })
	clk := qp.NewManualClock(time.Unix(1000, 0))
	rg := &readRig{inj: inj, readSize: readSize}
	if rg.da, err = Open(Options{Link: la, Clock: clk}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rg.da.Close() })
	if rg.db, err = Open(Options{Link: lb, Clock: clk}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rg.db.Close() })
	rg.x, rg.y = newEnd(t, rg.db, qp.TypeRC, 1<<16), newEnd(t, rg.da, qp.TypeRC, 1<<16)
	connect(t, rg.x, rg.y, qp.MTU4096, 1, 2)
	// The READ's memory: never written, so the kernel backs it with the zero page.
	rg.r = newEnd(t, rg.da, qp.TypeRC, readSize)
	for _, s := range []struct {
		a qp.Attr
		m qp.AttrMask
	}{
		{qp.Attr{State: qp.StateInit, Port: 1, AccessFlags: mr.AccessRemoteRead}, qp.AttrState | qp.AttrPKeyIndex | qp.AttrPort | qp.AttrAccessFlags},
		{qp.Attr{State: qp.StateRTR, AH: qp.AHAttr{DGID: addrC, SGIDIndex: uint8(rg.da.GIDIndex(addrA)), Port: 1}, PathMTU: qp.MTU4096,
			DestQPN: 0x77, MaxDestRDAtomic: 4},
			qp.AttrState | qp.AttrAV | qp.AttrPathMTU | qp.AttrDestQPN | qp.AttrRQPSN | qp.AttrMaxDestRDAtomic | qp.AttrMinRNRTimer},
		{qp.Attr{State: qp.StateRTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRDAtomic: 1},
			qp.AttrState | qp.AttrSQPSN | qp.AttrTimeout | qp.AttrRetryCnt | qp.AttrRNRRetry | qp.AttrMaxQPRDAtomic},
	} {
		if err := rg.r.qp.Modify(&s.a, s.m); err != nil {
			t.Fatal(err)
		}
	}
	return rg
}

// readReq builds the injector's READ request for the whole region at psn.
func (rg *readRig) readReq(t *testing.T, psn bth.PSN) link.Datagram {
	t.Helper()
	ep := bth.Endpoints{Src: addrC, Dst: addrA, SrcPort: 0xC001, DstPort: bth.UDPPort}
	spec := rocetest.Spec{Opcode: bth.OpRCReadRequest, DestQP: rg.r.qp.Num(), PSN: psn, AckReq: true,
		RETH: &bth.RETHFields{VA: rg.r.va(0), RKey: rg.r.mr.RKey(), DMALen: uint32(rg.readSize)}}
	pkt, err := spec.Append(nil, &ep)
	if err != nil {
		t.Fatal(err)
	}
	return link.Datagram{Buf: pkt, Src: netip.AddrPortFrom(addrC, ep.SrcPort), Dst: netip.AddrPortFrom(addrA, bth.UDPPort)}
}

// bigReadSize is the READ of TestBigReadDoesNotStallBystander: 1 GiB (under the race detector,
// whose shadow memory would follow every byte read, 64 MiB).
func bigReadSize() int {
	if raceSoak {
		return 64 << 20
	}
	return 1 << 30
}

// TestBigReadDoesNotStallBystander: a 1 GiB RDMA READ (262144 response packets) does not hold
// up the other QPs of the device. A raw requester READs 1 GiB from QP r on device A; once A has
// started sending the responses, a bystander on device B makes 20 4 KiB WRITEs to another QP
// on A. On a clock that never moves each WRITE completes only when A received it and sent its
// ACK: all 20 must complete while A is still sending the READ's responses (its sent-packet
// count short of the READ's), each faster than the bystander's ACK timeout (16.8 ms for the
// usual timeout 12; the maximum is logged). Before, the responder built every response of a
// READ on the receive goroutine when the request arrived, and the first WRITE completed only
// after all of them had been sent.
func TestBigReadDoesNotStallBystander(t *testing.T) {
	rg := newReadRig(t, bigReadSize())
	total := uint64(rg.readSize / 4096)
	base := rg.da.Stats().SentPkts
	if err := rg.inj.Send([]link.Datagram{rg.readReq(t, 0)}); err != nil {
		t.Fatal(err)
	}
	for rg.da.Stats().SentPkts-base < 64 { // the responses have started
		runtime.Gosched()
	}
	var worst time.Duration
	for i := 1; i <= 20; i++ {
		t0 := time.Now()
		post(t, rg.x, qp.SendWR{WRID: uint64(i), Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
			SGL: rg.x.sgl(0, 4096, 1), RemoteAddr: rg.y.va(0), RKey: rg.y.mr.RKey()})
		wc := waitWC(t, rg.x.scq, 1)[0]
		d := time.Since(t0)
		sent := rg.da.Stats().SentPkts - base
		if sent >= total {
			t.Fatalf("bystander WRITE %d completed after %v, once the READ's %d responses had all been sent (%d packets)", i, d, total, sent)
		}
		checkWC(t, wc, cq.WC{WRID: uint64(i), Opcode: cq.OpRDMAWrite, ByteLen: 4096})
		worst = max(worst, d)
	}
	t.Logf("20 bystander WRITEs during a %d MiB READ (%d of %d responses sent): slowest %v",
		rg.readSize>>20, rg.da.Stats().SentPkts-base, total, worst)
	if err := rg.r.qp.Destroy(); err != nil { // the rest of the READ is not needed
		t.Fatal(err)
	}
}

// TestDuplicateReadsBounded: duplicate READ requests do not multiply the responder's work. A
// requester that resends a 4 MiB READ 50 times at once (the same PSN, as after a timeout)
// gets one set of responses plus at most a few bursts, not 51 sets: a duplicate restarts the
// READ's responses from its PSN (rxe's responder resource replay) instead of queueing another
// full replay. A SEND after them (no receive posted: its RNR NAK is the responder's last word,
// sent after every READ response) marks the end. Before, each duplicate replayed all 1024
// responses at once on the receive goroutine (52224 packets).
func TestDuplicateReadsBounded(t *testing.T) {
	rg := newReadRig(t, 4<<20)
	const dups = 50
	n := uint64(rg.readSize / 4096)
	base := rg.da.Stats().SentPkts
	// the injector reads its queue until the SEND's NAK: responses counted there too
	done := make(chan uint64, 1)
	go func() {
		buf := make([]link.Datagram, 64)
		for i := range buf {
			buf[i].Buf = make([]byte, link.MaxDatagram)
		}
		var got uint64
		for {
			for i := range buf {
				buf[i].Buf = buf[i].Buf[:cap(buf[i].Buf)]
			}
			k, err := rg.inj.Recv(buf)
			if err != nil {
				done <- 0
				return
			}
			for _, d := range buf[:k] {
				if p, err := bth.Parse(d.Buf); err == nil && p.BTH.Opcode() == bth.OpRCAck {
					done <- got
					return
				}
				got++
			}
		}
	}()
	batch := make([]link.Datagram, 0, dups+2)
	for i := 0; i <= dups; i++ {
		batch = append(batch, rg.readReq(t, 0))
	}
	ep := bth.Endpoints{Src: addrC, Dst: addrA, SrcPort: 0xC001, DstPort: bth.UDPPort}
	send := rocetest.Spec{Opcode: bth.OpRCSendOnly, DestQP: rg.r.qp.Num(), PSN: bth.PSN(n), AckReq: true}
	pkt, err := send.Append(nil, &ep)
	if err != nil {
		t.Fatal(err)
	}
	batch = append(batch, link.Datagram{Buf: pkt, Src: netip.AddrPortFrom(addrC, ep.SrcPort), Dst: netip.AddrPortFrom(addrA, bth.UDPPort)})
	if err := rg.inj.Send(batch); err != nil {
		t.Fatal(err)
	}
	var got uint64
	select {
	case got = <-done:
	case <-time.After(60 * time.Second):
		t.Fatalf("no NAK for the SEND after 60 s (%d responses sent)", rg.da.Stats().SentPkts-base)
	}
	sent := rg.da.Stats().SentPkts - base - 1 // less the NAK
	t.Logf("1 READ + %d duplicates of %d packets: %d responses sent, %d received by the requester", dups, n, sent, got)
	if sent < n || sent > 2*n {
		t.Fatalf("%d responses for a READ of %d packets and %d duplicates: want between %d and %d", sent, n, dups, n, 2*n)
	}
}

// TestReadResponsesRoundRobin: two QPs of one device answering large READs at once share the
// responder scheduler evenly: after the first qp.ReadInline responses each (built when the
// request arrives), their responses alternate a burst (qp.ReadBudget packets) at a time; a
// run that began before both were past their inline responses is counted from that point. Both
// READs answer the same requester address, whose queue keeps their order.
func TestReadResponsesRoundRobin(t *testing.T) {
	rg := newReadRig(t, 8<<20)
	r2 := newEnd(t, rg.da, qp.TypeRC, rg.readSize)
	for _, s := range []struct {
		a qp.Attr
		m qp.AttrMask
	}{
		{qp.Attr{State: qp.StateInit, Port: 1, AccessFlags: mr.AccessRemoteRead}, qp.AttrState | qp.AttrPKeyIndex | qp.AttrPort | qp.AttrAccessFlags},
		{qp.Attr{State: qp.StateRTR, AH: qp.AHAttr{DGID: addrC, SGIDIndex: uint8(rg.da.GIDIndex(addrA)), Port: 1}, PathMTU: qp.MTU4096,
			DestQPN: 0x78, MaxDestRDAtomic: 4},
			qp.AttrState | qp.AttrAV | qp.AttrPathMTU | qp.AttrDestQPN | qp.AttrRQPSN | qp.AttrMaxDestRDAtomic | qp.AttrMinRNRTimer},
		{qp.Attr{State: qp.StateRTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRDAtomic: 1},
			qp.AttrState | qp.AttrSQPSN | qp.AttrTimeout | qp.AttrRetryCnt | qp.AttrRNRRetry | qp.AttrMaxQPRDAtomic},
	} {
		if err := r2.qp.Modify(&s.a, s.m); err != nil {
			t.Fatal(err)
		}
	}
	req1 := rg.readReq(t, 0)
	rg2 := *rg
	rg2.r = r2
	req2 := rg2.readReq(t, 0)
	if err := rg.inj.Send([]link.Datagram{req1, req2}); err != nil {
		t.Fatal(err)
	}
	n := rg.readSize / 4096
	buf := make([]link.Datagram, 256)
	for i := range buf {
		buf[i].Buf = make([]byte, link.MaxDatagram)
	}
	var got [2]int
	run, longest, last := 0, 0, uint32(0)
	for got[0]+got[1] < 2*n {
		for i := range buf {
			buf[i].Buf = buf[i].Buf[:cap(buf[i].Buf)]
		}
		k, err := rg.inj.Recv(buf)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range buf[:k] {
			p, err := bth.Parse(d.Buf)
			if err != nil {
				t.Fatal(err)
			}
			dqp := p.BTH.DestQP()
			// runs are counted only while both QPs are past the responses built on the
			// receive goroutine and both have responses to send: a QP's inline responses may
			// go out right before its first burst, as one run
			both := got[0] > qp.ReadInline && got[1] > qp.ReadInline && got[0] < n && got[1] < n
			got[dqp-0x77]++
			switch {
			case !both:
				run, last = 0, dqp
			case dqp == last:
				run++
			default:
				run, last = 1, dqp
			}
			longest = max(longest, run)
		}
	}
	t.Logf("two READs of %d responses: longest run of one QP's responses %d", n, longest)
	if longest > qp.ReadBudget {
		t.Fatalf("one QP sent %d responses in a row while the other had responses to send (turn: %d)", longest, qp.ReadBudget)
	}
}
