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

// FuzzPostRingDrain: whatever bytes a client puts into its post ring (data
// and tail), a session with live objects (PD, CQ, QP in RTS-capable INIT,
// MR-less) drains it without panicking, and cleanup leaves no object,
// mapping or goroutine of the ring behind.
func FuzzPostRingDrain(f *testing.F) {
	l, err := mem.NewNetwork(mem.Options{}).Attach(netip.MustParseAddr("10.6.0.2"))
	if err != nil {
		f.Fatal(err)
	}
	dev, err := roce.Open(roce.Options{Link: l})
	if err != nil {
		f.Fatal(err)
	}
	defer dev.Close()
	srv, _ := New(Options{Device: dev, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	record := func(m []byte) []byte {
		b := binary.NativeEndian.AppendUint32(nil, uint32(len(m)))
		b = binary.NativeEndian.AppendUint32(b, proto.RecordPost)
		b = append(b, m...)
		for len(b)%8 != 0 {
			b = append(b, 0)
		}
		return b
	}
	post, _ := proto.AppendPostSend(nil, wire.OpPostSendAsync, 3, []qp.SendWR{{WRID: 1, Opcode: qp.WRSend, Flags: qp.SendSignaled, SGL: []qp.SGE{{Length: 8, LKey: 1}}}})
	recv, _ := proto.AppendPostRecv(nil, wire.OpPostRecvAsync, 3, []qp.RecvWR{{WRID: 1, SGL: []qp.SGE{{Length: 8}}}})
	f.Add(append(record(post), record(recv)...), uint64(0))
	f.Add(record(recv), uint64(8))
	f.Add([]byte{16, 0, 0, 0, 2, 0, 0, 0}, uint64(3))
	f.Fuzz(func(t *testing.T, data []byte, tailAdj uint64) {
		if len(data) > proto.PostRingData {
			return
		}
		ss := testSession(srv, 1)
		for _, m := range []struct {
			op   wire.Op
			body []byte
		}{{wire.OpAllocPD, nil}, {wire.OpCreateCQ, wire.Bytes(&wire.CreateCQReq{CQE: 4})},
			{wire.OpCreateQP, wire.Bytes(&wire.CreateQPReq{QPType: uint8(qp.TypeRC), PD: 1, SendCQ: 2, RecvCQ: 2,
				Cap: wire.QPCap{MaxSendWR: 2, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1}})},
			{wire.OpModifyQP, wire.Bytes(&wire.ModifyQPReq{Handle: 3, AttrMask: uint32(qp.AttrState | qp.AttrPort | qp.AttrPKeyIndex | qp.AttrAccessFlags),
				Attr: wire.QPAttr{QPState: uint8(qp.StateInit), PortNum: 1}})},
			{wire.OpOpenRings, nil}} {
			var fds []int
			rights := ss.handle(proto.AppendRequest(nil, m.op, m.body), &fds)
			proto.CloseFDs(proto.ParseRights(rights))
			if h, b, _ := proto.ParseHdr(ss.wbuf); h.Status != 0 {
				t.Fatalf("setup op %d failed: %s", m.op, b)
			}
		}
		mem := ss.ring.mem
		copy(mem[proto.PostRingHeader:], data)
		tail := uint64(len(data)) + tailAdj%16
		if tailAdj%5 == 0 {
			tail = tailAdj
		}
		atomic.StoreUint64((*uint64)(unsafe.Pointer(&mem[0])), tail) // publish, as a client does
		ss.postMu.Lock()
		ss.drainLocked()
		ss.postMu.Unlock()
		ss.cleanup()
		if d := srv.Debug(); d.PDs != 0 || d.MRs != 0 || d.CQs != 0 || d.SRQs != 0 || d.QPs != 0 || d.MappedBytes != 0 {
			t.Fatalf("objects left after cleanup: %+v", d)
		}
	})
}
