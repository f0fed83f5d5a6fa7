package daemon_test

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/daemon"
	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/internal/event"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/internal/rocetest"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/roce"
)

// stallBound bounds the median time a bystander's 4 KiB WRITE takes while another tenant
// floods its post ring.
const stallBound = 50 * time.Millisecond

// TestRefillDoesNotStallReceive: one tenant cannot freeze the device's shared receive loop
// through the receive-refill hook. The attacker keeps its post ring full of junk records (its
// drainer never finds the ring empty) and a SEND ONLY reaches one of its QPs while its receive
// queue is empty: "reset" — a QP in RESET, the packet from an address nobody connected (the
// QP's own checks must drop it before any hook runs); "connected" — a QP in RTR whose path is
// the injecting address, so the packet passes every check and needs a receive the client may
// still have in its ring. Meanwhile a bystander on the same daemon makes 20 RC WRITEs to
// another daemon. The devices run on an injected clock that never moves (no ACK timeout, no
// retry: a WRITE completes only if its ACK is received), and the flood lasts until the last
// WRITE completed or 20 s passed: every WRITE must complete while the flood goes on, and the
// median under stallBound (the maximum is logged; on a loaded host the OS may deschedule the
// process for longer). Before the hook ran after the QP's checks and without waiting for the
// attacker's post lock, the receive loop waited for the drainer as long as the flood lasted:
// no WRITE completed during it (on the real clock the bystander's WRITE ended in
// RETRY_EXC_ERR after its retries).
func TestRefillDoesNotStallReceive(t *testing.T) {
	for _, mode := range []string{"reset", "connected"} {
		t.Run(mode, func(t *testing.T) { testRefillStall(t, mode == "connected") })
	}
}

func testRefillStall(t *testing.T, connected bool) {
	ipC := netip.MustParseAddr("10.9.0.3")
	nw := mem.NewNetwork(mem.Options{QueueDepth: 8192})
	la, err := nw.Attach(ipA)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := nw.Attach(ipB)
	if err != nil {
		t.Fatal(err)
	}
	lc, err := nw.Attach(ipC) // the injector: a host with no QP
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	clk := qp.NewManualClock(time.Unix(1000, 0))
	da, db := clockDaemon(t, la, "a", clk), clockDaemon(t, lb, "b", clk)

	v := newEnd(t, da.dial(t), 1<<16, 8, rcAccess)
	p := newEnd(t, db.dial(t), 1<<16, 8, rcAccess)
	v.connect(t, ipB, p.q.Num(), 1)
	p.connect(t, ipA, v.q.Num(), 1)
	v.write(t, 0, 0, 4096, p, 0) // warm up both paths
	if wc := v.wait(t, 1)[0]; wc.Status != cq.StatusSuccess {
		t.Fatalf("warm-up WRITE: %v", wc.Status)
	}

	// The attacker: a raw connection with a PD, a CQ and an RC QP (no SRQ: the hook is set).
	atk := dialRaw(t, da.sock)
	aq := rawRCQP(t, atk, connected, mr.AccessRemoteWrite)
	// The flood: another process (the attacker's program) writes truncated send posts into
	// the attacker's post ring as fast as the ring takes them; the daemon refuses and logs
	// each. It runs until the bystander is done or 20 s passed.
	memfd, bell, size := openRingFDs(t, atk)
	flood := exec.Command(os.Args[0], "-test.run=^$")
	flood.Env = append(os.Environ(), "SOFTROCE_DAEMON_CHILD=flood", "SRC_RING_BYTES="+strconv.Itoa(size))
	flood.ExtraFiles = []*os.File{os.NewFile(uintptr(memfd), "ring"), os.NewFile(uintptr(bell), "bell")}
	flood.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the test
	if err := flood.Start(); err != nil {
		t.Fatal(err)
	}
	for _, f := range flood.ExtraFiles {
		f.Close()
	}
	var stop atomic.Bool
	stopFlood := func() {
		if !stop.Swap(true) {
			flood.Process.Kill()
			flood.Wait()
		}
	}
	defer stopFlood()
	deadline := time.AfterFunc(20*time.Second, stopFlood)
	defer deadline.Stop()
	base := da.srv.Debug().RingPosts
	for da.srv.Debug().RingPosts-base < 10000 {
		runtime.Gosched() // the drainer is busy with the flood
	}

	// One SEND ONLY from the injector to the attacker's QP, whose receive queue is empty.
	ep := bth.Endpoints{Src: ipC, Dst: ipA, SrcPort: 0xC001, DstPort: bth.UDPPort}
	spec := rocetest.Spec{Opcode: bth.OpRCSendOnly, DestQP: aq.QPN, AckReq: true, Payload: make([]byte, 8)}
	pkt, err := spec.Append(nil, &ep)
	if err != nil {
		t.Fatal(err)
	}
	if err := lc.Send([]link.Datagram{{Buf: pkt, Src: netip.AddrPortFrom(ipC, ep.SrcPort),
		Dst: netip.AddrPortFrom(ipA, bth.UDPPort)}}); err != nil {
		t.Fatal(err)
	}

	const writes = 20
	lat := make([]time.Duration, 0, writes)
	for i := 1; i <= writes; i++ {
		t0 := time.Now()
		v.write(t, uint64(i), 0, 4096, p, 4096)
		wc := v.wait(t, 1)[0]
		d := time.Since(t0)
		if stop.Load() {
			t.Fatalf("bystander WRITE %d completed only after the flood ended (%v)", i, d)
		}
		if wc.Status != cq.StatusSuccess || wc.WRID != uint64(i) {
			t.Fatalf("bystander WRITE %d during the flood: %v after %v", i, wc.Status, d)
		}
		lat = append(lat, d)
	}
	posts := da.srv.Debug().RingPosts - base
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("bystander WRITE latency during the flood (%d junk posts drained): median %v, max %v",
		posts, lat[len(lat)/2], lat[len(lat)-1])
	if lat[len(lat)/2] > stallBound {
		t.Fatalf("bystander WRITEs took %v (median) during the flood (bound %v)", lat[len(lat)/2], stallBound)
	}
}

// TestRefillNeverWaitsForPostLock: the receive loop never waits for a client's post lock.
// The attacker's post lock is held (by the test, standing for a drainer that the client keeps
// busy, or a long socket request) while the attacker's ring holds a receive for its connected
// QP and a SEND ONLY for that QP arrives: the SEND waits (held by the QP: neither executed nor
// NAKed) while the bystander's 20 WRITEs complete; when the lock is released the receive is
// posted first and the SEND lands in it (no RNR NAK). The devices run on a clock that never
// moves: a WRITE completes only if its ACK is received. Before, the receive loop waited for
// the lock and no bystander WRITE completed while it was held.
func TestRefillNeverWaitsForPostLock(t *testing.T) {
	ipC := netip.MustParseAddr("10.9.0.3")
	nw := mem.NewNetwork(mem.Options{QueueDepth: 8192})
	la, err := nw.Attach(ipA)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := nw.Attach(ipB)
	if err != nil {
		t.Fatal(err)
	}
	lc, err := nw.Attach(ipC)
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	clk := qp.NewManualClock(time.Unix(1000, 0))
	da, db := clockDaemon(t, la, "a", clk), clockDaemon(t, lb, "b", clk)
	v := newEnd(t, da.dial(t), 1<<16, 8, rcAccess)
	p := newEnd(t, db.dial(t), 1<<16, 8, rcAccess)
	v.connect(t, ipB, p.q.Num(), 1)
	p.connect(t, ipA, v.q.Num(), 1)

	atk := dialRaw(t, da.sock)
	aq := rawRCQP(t, atk, true, 0)
	ring, bell := openRawRing(t, atk)

	unlock := da.srv.LockPosts(aq.QPN)
	locked := true
	defer func() {
		if locked {
			unlock()
		}
	}()
	recv, _ := proto.AppendPostRecv(nil, wire.OpPostRecvAsync, proto.Handle(aq.Handle), []qp.RecvWR{{WRID: 5}})
	if ok, _ := ring.Write(recv); !ok {
		t.Fatal("ring full")
	}
	proto.Signal(bell)
	ep := bth.Endpoints{Src: ipC, Dst: ipA, SrcPort: 0xC001, DstPort: bth.UDPPort}
	spec := rocetest.Spec{Opcode: bth.OpRCSendOnly, DestQP: aq.QPN, AckReq: true}
	pkt, err := spec.Append(nil, &ep)
	if err != nil {
		t.Fatal(err)
	}
	s0 := da.dev.Stats()
	if err := lc.Send([]link.Datagram{{Buf: pkt, Src: netip.AddrPortFrom(ipC, ep.SrcPort),
		Dst: netip.AddrPortFrom(ipA, bth.UDPPort)}}); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 20; i++ {
		v.write(t, uint64(i), 0, 4096, p, 4096)
		wc, ok := waitOne(v, 5*time.Second)
		if !ok {
			t.Fatalf("bystander WRITE %d did not complete in 5 s while the attacker's post lock is held", i)
		}
		if wc.Status != cq.StatusSuccess || wc.WRID != uint64(i) {
			t.Fatalf("bystander WRITE %d: %v", i, wc.Status)
		}
	}
	if s := da.dev.Stats(); s.RDMARecvs != s0.RDMARecvs || s.SendRNRErr != s0.SendRNRErr {
		t.Fatalf("the attacker's SEND was answered while its post lock was held: %d received, %d RNR NAKs",
			s.RDMARecvs-s0.RDMARecvs, s.SendRNRErr-s0.SendRNRErr)
	}
	unlock()
	locked = false
	for end := time.Now().Add(waitLimit); da.dev.Stats().RDMARecvs == s0.RDMARecvs; {
		if time.Now().After(end) {
			t.Fatal("the held SEND never landed in the receive posted through the ring")
		}
		runtime.Gosched()
	}
	if s := da.dev.Stats(); s.SendRNRErr != s0.SendRNRErr {
		t.Fatalf("%d RNR NAKs: the SEND ran before the receive in the ring was posted", s.SendRNRErr-s0.SendRNRErr)
	}
}

// waitOne polls e's CQ for one completion for at most limit.
func waitOne(e *end, limit time.Duration) (cq.WC, bool) {
	for end := time.Now().Add(limit); time.Now().Before(end); {
		if e.cq.Poll(e.wc[:1]) == 1 {
			return e.wc[0], true
		}
		runtime.Gosched()
	}
	return cq.WC{}, false
}

// openRingFDs opens r's post ring and returns the ring's memfd, its doorbell and the ring's
// size (the caller owns both descriptors).
func openRingFDs(t *testing.T, r *raw) (memfd, bell, size int) {
	t.Helper()
	if _, _, err := r.c.WriteMsgUnix(proto.AppendRequest(nil, wire.OpOpenRings, nil), nil, nil); err != nil {
		t.Fatal(err)
	}
	buf, oob := make([]byte, 4096), make([]byte, 256)
	n, oobn, _, _, err := r.c.ReadMsgUnix(buf, oob)
	h, body, _ := proto.ParseHdr(buf[:n])
	if err != nil || h.Status != 0 {
		t.Fatalf("OpOpenRings: %v %q", err, buf[:n])
	}
	var resp wire.OpenRingsResp
	if _, ok := wire.Read(body, &resp); !ok {
		t.Fatalf("%d-byte response", len(body))
	}
	fds := proto.ParseRights(oob[:oobn])
	if len(fds) != 3 { // ring memfd, doorbell, event eventfd
		t.Fatalf("%d fds", len(fds))
	}
	proto.CloseFD(fds[2])
	return fds[0], fds[1], int(resp.Bytes)
}

// rawRCQP creates a PD, a CQ and an RC QP (no SRQ: the refill hook is set) on r's
// connection; connected moves the QP to RTR with the injector (ipC) as its path, access its
// remote access flags.
func rawRCQP(t *testing.T, r *raw, connected bool, access mr.Access) wire.CreateQPResp {
	t.Helper()
	var pd wire.Handle
	if err := r.call(wire.OpAllocPD, nil, wire.Bytes(&pd)); err != nil {
		t.Fatal(err)
	}
	var c wire.CreateCQResp
	if err := r.call(wire.OpCreateCQ, wire.Bytes(&wire.CreateCQReq{CQE: 16}), wire.Bytes(&c)); err != nil {
		t.Fatal(err)
	}
	var aq wire.CreateQPResp
	if err := r.call(wire.OpCreateQP, wire.Bytes(&wire.CreateQPReq{QPType: uint8(qp.TypeRC), PD: pd.Handle, SendCQ: c.Handle,
		RecvCQ: c.Handle, Cap: wire.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}}), wire.Bytes(&aq)); err != nil {
		t.Fatal(err)
	}
	if !connected {
		return aq
	}
	ipC := netip.MustParseAddr("10.9.0.3")
	for _, m := range [][]byte{
		modifyMsg(aq.Handle, qp.Attr{State: qp.StateInit, Port: 1, AccessFlags: access},
			qp.AttrState|qp.AttrPKeyIndex|qp.AttrPort|qp.AttrAccessFlags),
		modifyMsg(aq.Handle, qp.Attr{State: qp.StateRTR, AH: qp.AHAttr{DGID: ipC, SGIDIndex: 1}, PathMTU: qp.MTU1024,
			DestQPN: 0x77, MaxDestRDAtomic: 1, MinRNRTimer: 1},
			qp.AttrState|qp.AttrAV|qp.AttrPathMTU|qp.AttrDestQPN|qp.AttrRQPSN|qp.AttrMaxDestRDAtomic|qp.AttrMinRNRTimer),
	} {
		if err := r.send(m, nil); err != nil {
			t.Fatal(err)
		}
	}
	return aq
}

// modifyMsg is ibv_modify_qp's request on QP h.
func modifyMsg(h uint32, a qp.Attr, mask qp.AttrMask) []byte {
	return proto.AppendRequest(nil, wire.OpModifyQP, wire.Bytes(&wire.ModifyQPReq{Handle: h, AttrMask: uint32(mask), Attr: proto.QPAttrToWire(&a)}))
}

// floodChild is the attacker's flooding program (SOFTROCE_DAEMON_CHILD=flood): the post ring's
// memfd is fd 3, its doorbell fd 4; it writes truncated send posts until it is killed.
func floodChild() int {
	size, _ := strconv.Atoi(os.Getenv("SRC_RING_BYTES"))
	mem, err := unix.Mmap(3, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		fmt.Fprintln(os.Stderr, "flood:", err)
		return 1
	}
	ring, ok := proto.NewPostRing(mem, true)
	if !ok {
		fmt.Fprintln(os.Stderr, "flood: ring view")
		return 1
	}
	junk := proto.AppendRequest(nil, wire.OpPostSendAsync, []byte{1, 2})
	for {
		if ok, ringIt := ring.Write(junk); ok && ringIt {
			proto.Signal(4)
		}
	}
}

// clockDaemon is startDaemon with the device on clk.
func clockDaemon(t *testing.T, l link.Link, name string, clk qp.Clock) *testDaemon {
	t.Helper()
	var srv atomic.Pointer[daemon.Server]
	dev, err := roce.Open(roce.Options{Link: l, Name: name, Clock: clk, Events: func(e event.Event) {
		if s := srv.Load(); s != nil {
			s.Event(e)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	d := serveDevice(t, dev, name)
	srv.Store(d.srv)
	return d
}
