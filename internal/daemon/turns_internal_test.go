package daemon

import (
	"encoding/binary"
	"io"
	"log/slog"
	"net/netip"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/roce"
)

// turnSession is a session with a PD, a CQ, an RC QP in INIT (receives allowed) and a post
// ring whose drainer is paused; the QP is in RTS towards an address nobody answers: the test publishes records and drains by hand.
func turnSession(t *testing.T) (*session, func(records ...[]byte)) {
	l, err := mem.NewNetwork(mem.Options{}).Attach(netip.MustParseAddr("10.6.0.3"))
	if err != nil {
		t.Fatal(err)
	}
	dev, err := roce.Open(roce.Options{Link: l})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	srv, _ := New(Options{Device: dev, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	srv.drainPaused.Store(true)
	ss := testSession(srv, 1)
	var fds []int
	for i, m := range [][]byte{reqMsg[wire.Handle](wire.OpAllocPD, nil), reqMsg(wire.OpCreateCQ, &wire.CreateCQReq{CQE: 4096}),
		reqMsg(wire.OpCreateQP, &wire.CreateQPReq{QPType: uint8(qp.TypeRC), PD: 1, SendCQ: 2, RecvCQ: 2,
			Cap: wire.QPCap{MaxSendWR: 16, MaxRecvWR: 4096, MaxSendSGE: 1, MaxRecvSGE: 1}}),
		modifyQPMsg(3, qp.Attr{State: qp.StateInit, Port: 1}, qp.AttrState|qp.AttrPort|qp.AttrPKeyIndex|qp.AttrAccessFlags),
		modifyQPMsg(3, qp.Attr{State: qp.StateRTR, AH: qp.AHAttr{DGID: netip.MustParseAddr("10.6.0.4"), SGIDIndex: 1},
			PathMTU: qp.MTU1024, DestQPN: 0x99, MaxDestRDAtomic: 1, MinRNRTimer: 1},
			qp.AttrState|qp.AttrAV|qp.AttrPathMTU|qp.AttrDestQPN|qp.AttrRQPSN|qp.AttrMaxDestRDAtomic|qp.AttrMinRNRTimer),
		modifyQPMsg(3, qp.Attr{State: qp.StateRTS, Timeout: 0, RetryCnt: 1, RNRRetry: 1, MaxRDAtomic: 1},
			qp.AttrState|qp.AttrSQPSN|qp.AttrTimeout|qp.AttrRetryCnt|qp.AttrRNRRetry|qp.AttrMaxQPRDAtomic),
		reqMsg[wire.Handle](wire.OpOpenRings, nil)} {
		ss.wbuf = ss.wbuf[:0]
		proto.CloseFDs(proto.ParseRights(ss.handle(m, &fds)))
		if st, err := ss.lastStatus(); st != 0 {
			t.Fatalf("setup step %d failed: %v", i, err)
		}
	}
	t.Cleanup(ss.cleanup)
	var tail uint64
	publish := func(records ...[]byte) {
		mem := ss.ring.mem
		for _, m := range records {
			b := binary.LittleEndian.AppendUint32(nil, uint32(len(m)))
			b = binary.LittleEndian.AppendUint32(b, proto.RecordPost)
			b = append(b, m...)
			for len(b)%8 != 0 {
				b = append(b, 0)
			}
			copy(mem[proto.PostRingHeader+int(tail%proto.PostRingData):], b)
			tail += uint64(len(b))
		}
		atomic.StoreUint64((*uint64)(unsafe.Pointer(&mem[0])), tail)
	}
	return ss, publish
}

// TestDrainTurns: a drain turn posts at most drainTurnRecords records, or stops once it
// posted drainTurnBytes of send payload, and says whether more are left; the socket path's
// drain takes everything published before it.
func TestDrainTurns(t *testing.T) {
	ss, publish := turnSession(t)
	recv, _ := proto.AppendPostRecv(nil, wire.OpPostRecvAsync, 3, []qp.RecvWR{{WRID: 1, SGL: []qp.SGE{{Length: 8}}}})
	var recs [][]byte
	for i := 0; i < 100; i++ {
		recs = append(recs, recv)
	}
	publish(recs...)
	ss.postMu.Lock()
	defer ss.postMu.Unlock()
	for turn, left := 0, 100; left > 0; turn++ {
		before := ss.s.ringPosts.Load()
		more, err := ss.drain(drainTurnRecords, drainTurnBytes)
		if err != nil {
			t.Fatal(err)
		}
		took := int(ss.s.ringPosts.Load() - before)
		left -= took
		if took != min(drainTurnRecords, took+left) || more != (left > 0) {
			t.Fatalf("turn %d took %d records (more %v), %d left", turn, took, more, left)
		}
	}
	publish(recs...)
	before := ss.s.ringPosts.Load()
	if err := ss.drainLocked(); err != nil || ss.s.ringPosts.Load()-before != 100 {
		t.Fatalf("socket drain took %d of 100: %v", ss.s.ringPosts.Load()-before, err)
	}
	// 100 KiB WRITEs: three make a turn (300 KiB >= 256 KiB).
	write, _ := proto.AppendPostSend(nil, wire.OpPostSendAsync, 3, []qp.SendWR{{WRID: 2, Opcode: qp.WRRDMAWrite,
		Flags: qp.SendSignaled, SGL: []qp.SGE{{Length: 100 << 10, LKey: 1}}, RemoteAddr: 0x1000, RKey: 1}})
	publish(write, write, write, write, write)
	before = ss.s.ringPosts.Load()
	more, err := ss.drain(drainTurnRecords, drainTurnBytes)
	if took := ss.s.ringPosts.Load() - before; err != nil || took != 3 || !more {
		t.Fatalf("a turn of 100 KiB WRITEs took %d (more %v, %v), want 3", took, more, err)
	}
}
