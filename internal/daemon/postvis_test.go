package daemon_test

import (
	"net/netip"
	"os"
	"runtime"
	"runtime/pprof"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/daemon"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/roce"
)

// visRounds is the number of post-then-signal rounds per transport.
const visRounds = 300

// TestPostRecvVisible (ibverbs semantics): a receive posted through the post ring is on the queue the
// moment PostRecv returns. The receiving client posts one receive asynchronously (the ring
// path, by the daemon's counters), and with no socket request in between tells the sender (a Go
// channel: the out-of-band exchange of an ibverbs program) to SEND at once. Both daemons are
// real UDP devices on 127.x; the sender's daemon keeps its drainer polling (--post-spin), so the
// SEND leaves as fast as the daemon can send it. RC with rnr_retry 0: every SEND completes
// successfully, no RNR NAK is sent or received (send_rnr_err, rcvd_rnr_err,
// retry_rnr_exceeded_err stay 0). UC: every message is delivered (UC drops a message that finds
// no receive WQE; a WRITE after each SEND tells the receiver the SEND has been handled).
//
// SOFTROCE_TEST_NO_REFILL=1 runs it with the daemon's RecvRefill hook disabled, to show what
// the hook fixes: the test then fails with the number of rounds that lost their message.
func TestPostRecvVisible(t *testing.T) {
	if os.Getenv("SOFTROCE_TEST_NO_REFILL") == "1" {
		daemon.SetRecvRefillDisabled(true)
		defer daemon.SetRecvRefillDisabled(false)
	}
	for i, typ := range []qp.Type{qp.TypeRC, qp.TypeUC} {
		t.Run(typ.String(), func(t *testing.T) { testPostRecvVisible(t, typ, 30+i, false) })
	}
	// The receiver's drainer ignores its doorbell: only the hook puts the receives on the queue
	// (deterministic: without it every message is lost).
	t.Run("RC-hook-only", func(t *testing.T) { testPostRecvVisible(t, qp.TypeRC, 33, true) })
}

func udpDaemon(t *testing.T, ip netip.Addr, name string, spin time.Duration) *testDaemon {
	t.Helper()
	dev, err := roce.OpenUDP(roce.UDPOptions{Addrs: []netip.Addr{ip}})
	if err != nil {
		t.Skip("UDP loopback unavailable:", err)
	}
	testPostSpin = spin
	defer func() { testPostSpin = 0 }()
	return serveDevice(t, dev, name)
}

// visEnd is one side: a PD, a CQ, a buffer and an RC or UC QP, through roce.Verbs.
type visEnd struct {
	v    roce.Verbs
	typ  qp.Type
	pd   roce.ProtectionDomain
	cq   roce.CompletionQueue
	buf  []byte
	m    roce.MemoryRegion
	q    roce.QueuePair
	wc   []cq.WC
	iova uint64
}

func newVisEnd(t *testing.T, v roce.Verbs, typ qp.Type) *visEnd {
	t.Helper()
	e := &visEnd{v: v, typ: typ, iova: 0x40000, wc: make([]cq.WC, 8)}
	var err error
	if e.pd, err = v.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if e.cq, err = v.CreateCQ(64); err != nil {
		t.Fatal(err)
	}
	if e.buf, err = v.AllocBuffer(1 << 16); err != nil {
		t.Fatal(err)
	}
	if e.m, err = v.RegMR(e.pd, e.buf, e.iova, mr.AccessLocalWrite|mr.AccessRemoteWrite); err != nil {
		t.Fatal(err)
	}
	e.newQP(t)
	return e
}

func (e *visEnd) newQP(t *testing.T) {
	t.Helper()
	var err error
	if e.q, err = e.v.CreateQP(roce.VerbsQPInit{Type: e.typ, PD: e.pd, SendCQ: e.cq, RecvCQ: e.cq,
		Cap: qp.Cap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		t.Fatal(err)
	}
}

// connect moves the QP to RTS: RC with rnr_retry 0 (the first RNR NAK fails the SEND).
func (e *visEnd) connect(t *testing.T, peer netip.Addr, peerQPN uint32) {
	t.Helper()
	rc := e.typ == qp.TypeRC
	must := func(a *qp.Attr, m qp.AttrMask) {
		t.Helper()
		if err := e.q.Modify(a, m); err != nil {
			t.Fatal(err)
		}
	}
	must(&qp.Attr{State: qp.StateInit, Port: 1, AccessFlags: mr.AccessRemoteWrite},
		qp.AttrState|qp.AttrPKeyIndex|qp.AttrPort|qp.AttrAccessFlags)
	m := qp.AttrState | qp.AttrAV | qp.AttrPathMTU | qp.AttrDestQPN | qp.AttrRQPSN
	if rc {
		m |= qp.AttrMaxDestRDAtomic | qp.AttrMinRNRTimer
	}
	must(&qp.Attr{State: qp.StateRTR, AH: qp.AHAttr{DGID: peer, SGIDIndex: 1}, PathMTU: qp.MTU1024,
		DestQPN: peerQPN, MaxDestRDAtomic: 1, MinRNRTimer: 1}, m)
	m = qp.AttrState | qp.AttrSQPSN
	if rc {
		m |= qp.AttrTimeout | qp.AttrRetryCnt | qp.AttrRNRRetry | qp.AttrMaxQPRDAtomic
	}
	must(&qp.Attr{State: qp.StateRTS, Timeout: 14, RetryCnt: 7, RNRRetry: 0, MaxRDAtomic: 1}, m)
}

// poll returns up to n completions without blocking.
func (e *visEnd) poll(n int) []cq.WC { return e.wc[:e.cq.Poll(e.wc[:n])] }

// waitWC spins (yielding) for n completions, bounded by waitLimit.
func (e *visEnd) waitWC(t *testing.T, n int) []cq.WC {
	var out []cq.WC
	for deadline := time.Now().Add(waitLimit); len(out) < n; runtime.Gosched() {
		out = append(out, e.poll(n-len(out))...)
		if time.Now().After(deadline) {
			t.Errorf("timed out with %d of %d completions", len(out), n)
			pprof.Lookup("goroutine").WriteTo(os.Stderr, 2)
			return out
		}
	}
	return out
}

// word is the uint64 at off of the registered buffer, read atomically: the daemon writes it
// through its own mapping of the memfd.
func (e *visEnd) word(off int) uint64 {
	return atomic.LoadUint64((*uint64)(unsafe.Pointer(&e.buf[off])))
}

const visFlag = 4096 // the offset of the UC round flag in the receiver's buffer

func testPostRecvVisible(t *testing.T, typ qp.Type, pair int, paused bool) {
	ipA, ipB := loopbackPair(pair)
	da := udpDaemon(t, ipA, "a", 50*time.Microsecond) // the sender's
	db := udpDaemon(t, ipB, "b", 0)                   // the receiver's: a sleeping drainer (default)
	s := newVisEnd(t, da.dial(t), typ)
	r := newVisEnd(t, db.dial(t), typ)
	link := func() {
		s.connect(t, ipB, r.q.Num())
		r.connect(t, ipA, s.q.Num())
	}
	link()
	db.srv.PauseDrainers(paused)
	base, statsA, statsB := db.srv.Debug(), s.v.Stats(), r.v.Stats()

	// the sender: one round per value from go, its completions to done
	goCh, done := make(chan uint32), make(chan []cq.WC)
	defer close(goCh)
	go func() {
		for i := range goCh {
			wrs := []qp.SendWR{{WRID: uint64(i), Opcode: qp.WRSendWithImm, Imm: i, Flags: qp.SendSignaled,
				SGL: []qp.SGE{{Addr: s.iova, Length: 64, LKey: s.m.LKey()}}}}
			if typ == qp.TypeUC {
				*(*uint64)(unsafe.Pointer(&s.buf[128])) = uint64(i) + 1
				wrs = append(wrs, qp.SendWR{WRID: 1 << 40, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
					SGL:        []qp.SGE{{Addr: s.iova + 128, Length: 8, LKey: s.m.LKey()}},
					RemoteAddr: r.iova + visFlag, RKey: r.m.RKey()})
			}
			if _, err := s.q.PostSend(wrs); err != nil {
				t.Error("PostSend:", err)
				done <- nil
				continue
			}
			got := append([]cq.WC(nil), s.waitWC(t, len(wrs))...)
			if len(got) < len(wrs) {
				t.Logf("sender's daemon: %+v", da.srv.Debug())
			}
			done <- got
		}
	}()

	lost, rebuilt := 0, 0
	for i := uint32(0); i < visRounds && !t.Failed(); i++ {
		if _, err := r.q.PostRecv([]qp.RecvWR{{WRID: uint64(i), SGL: []qp.SGE{{Addr: r.iova, Length: 256, LKey: r.m.LKey()}}}}); err != nil {
			t.Fatal("PostRecv:", err)
		}
		goCh <- i // the out-of-band "go": no socket request since PostRecv
		swc := <-done
		if len(swc) == 0 || t.Failed() {
			break
		}
		delivered := true
		var w cq.WC
		switch {
		case swc[0].Status == cq.StatusRNRRetryExcErr:
			delivered = false
		case swc[0].Status != cq.StatusSuccess || swc[0].WRID != uint64(i):
			t.Fatalf("round %d: sender completion %+v", i, swc[0])
		case typ == qp.TypeUC:
			// the WRITE behind the SEND has landed: the SEND was handled before it
			for deadline := time.Now().Add(waitLimit); r.word(visFlag) != uint64(i)+1; runtime.Gosched() {
				if time.Now().After(deadline) {
					t.Fatalf("round %d: the flag WRITE never landed", i)
				}
			}
			if got := r.poll(1); len(got) == 1 {
				w = got[0]
			} else {
				delivered = false
			}
		default:
			if got := r.waitWC(t, 1); len(got) == 1 {
				w = got[0]
			}
		}
		if !delivered {
			// The message was lost (RC: RNR NAK; UC: dropped). Start again on new QPs, so
			// the receive still queued does not shift the later rounds.
			lost++
			if err := s.q.Destroy(); err != nil {
				t.Fatal(err)
			}
			if err := r.q.Destroy(); err != nil {
				t.Fatal(err)
			}
			s.newQP(t)
			r.newQP(t)
			link()
			s.poll(8)
			r.poll(8)
			rebuilt++
			continue
		}
		if w.Status != cq.StatusSuccess || w.WRID != uint64(i) || w.ImmData != i ||
			w.Flags&cq.FlagWithImm == 0 || w.ByteLen != 64 {
			t.Fatalf("round %d: receive completion %+v", i, w)
		}
	}
	if lost > 0 {
		t.Errorf("%s: %d of %d messages lost (sent after PostRecv returned, no receive WQE found)", typ, lost, visRounds)
	}
	d := db.srv.Debug()
	t.Logf("%s: %d rounds, %d lost, %d hook drains in the receiver's daemon, %d duplicate requests", typ, visRounds, lost,
		d.Refills-base.Refills, r.v.Stats().DuplicateRequest-statsB.DuplicateRequest)
	// One refill per round; a retransmitted SEND (a late ACK on a loaded machine) reaching the
	// receiver as a duplicate finds the queue empty again and asks once more, so each
	// duplicate request the receiver counted allows one more.
	dups := r.v.Stats().DuplicateRequest - statsB.DuplicateRequest
	if refills := d.Refills - base.Refills; paused && rebuilt == 0 && (refills < visRounds || refills > visRounds+dups) {
		t.Errorf("%d refills with the drainer paused, want one per round (%d) plus at most one per duplicate request (%d)",
			refills, visRounds, dups)
	}
	if got := d.RingPosts - base.RingPosts; rebuilt == 0 && got != visRounds {
		t.Errorf("receiver's ring posts %d, want %d (the receives must take the post ring)", got, visRounds)
	}
	if rebuilt == 0 && d.SocketPosts != base.SocketPosts {
		t.Errorf("receiver's socket posts %d, want 0", d.SocketPosts-base.SocketPosts)
	}
	ma, mb := s.v.Stats().Map(), r.v.Stats().Map()
	oa, ob := statsA.Map(), statsB.Map()
	for _, c := range []struct {
		m, o map[string]uint64
		name string
	}{{mb, ob, "send_rnr_err"}, {ma, oa, "rcvd_rnr_err"}, {ma, oa, "retry_rnr_exceeded_err"}} {
		if n := c.m[c.name] - c.o[c.name]; n != 0 {
			t.Errorf("%s: %d", c.name, n)
		}
	}
}

// TestRecvRefillZeroAlloc: the refill path allocates nothing. The receiver's daemon ignores
// its client's doorbell (PauseDrainers), so each step's receive, posted through the ring,
// reaches the engine only when the peer's SEND finds the queue empty: the QP holds the SEND,
// RecvRefill rings the drainer, which drains the ring and executes the SEND (QP.Refilled). The
// whole process (both daemons, both clients) is measured; the refill count shows the path ran
// once per step.
func TestRecvRefillZeroAlloc(t *testing.T) {
	ipA, ipB := loopbackPair(32)
	da := udpDaemon(t, ipA, "a", 50*time.Microsecond)
	db := udpDaemon(t, ipB, "b", 0)
	s := newVisEnd(t, da.dial(t), qp.TypeRC)
	r := newVisEnd(t, db.dial(t), qp.TypeRC)
	s.connect(t, ipB, r.q.Num())
	r.connect(t, ipA, s.q.Num())
	send := []qp.SendWR{{WRID: 1, Opcode: qp.WRSend, Flags: qp.SendSignaled, SGL: []qp.SGE{{Addr: s.iova, Length: 64, LKey: s.m.LKey()}}}}
	recv := []qp.RecvWR{{WRID: 2, SGL: []qp.SGE{{Addr: r.iova, Length: 64, LKey: r.m.LKey()}}}}
	wait := func(e *visEnd) { // completion channel, as alloc_test.go
		for {
			k := e.cq.Poll(e.wc[:1])
			if k == 0 {
				e.cq.ReqNotify(false)
				if k = e.cq.Poll(e.wc[:1]); k == 0 {
					<-e.cq.Channel()
					continue
				}
			}
			if e.wc[0].Status != cq.StatusSuccess {
				t.Fatalf("completion %+v", e.wc[0])
			}
			return
		}
	}
	db.srv.PauseDrainers(true) // every receive reaches the engine through RecvRefill
	step := func() {
		if _, err := r.q.PostRecv(recv); err != nil {
			t.Fatal(err)
		}
		if _, err := s.q.PostSend(send); err != nil {
			t.Fatal(err)
		}
		wait(s)
		wait(r)
	}
	for i := 0; i < 50; i++ {
		step()
	}
	base := db.srv.Debug().Refills
	if n := testing.AllocsPerRun(300, step); n > 0.05 {
		t.Fatalf("%.2f allocations per SEND/RECV through the daemons", n)
	}
	refills := db.srv.Debug().Refills - base
	if refills < 300 {
		t.Fatalf("%d refills in 300 steps: the refill path was not measured", refills)
	}
}
