package daemon

import (
	"io"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/roce"
)

// FuzzHandle: any request a client sends (a sequence of messages on one
// session) is answered without panicking, and the session's cleanup leaves
// no object behind.
func FuzzHandle(f *testing.F) {
	l, err := mem.NewNetwork(mem.Options{}).Attach(netip.MustParseAddr("10.6.0.1"))
	if err != nil {
		f.Fatal(err)
	}
	dev, err := roce.Open(roce.Options{Link: l})
	if err != nil {
		f.Fatal(err)
	}
	defer dev.Close()
	srv, _ := New(Options{Device: dev, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	msg := func(op wire.Op, body []byte) []byte { return proto.AppendRequest(nil, op, body) }
	// A message stream: messages separated by a 0xFF 0xFE marker.
	join := func(ms ...[]byte) []byte {
		var out []byte
		for _, m := range ms {
			out = append(append(out, m...), 0xFF, 0xFE)
		}
		return out
	}
	h := func(v uint32) []byte { return wire.Bytes(&wire.Handle{Handle: v}) }
	post, _ := proto.AppendPostSend(nil, wire.OpPostSendAsync, 3, []qp.SendWR{{WRID: 1, Opcode: qp.WRSend, SGL: []qp.SGE{{Length: 8, LKey: 1}}}})
	inl, _ := proto.AppendPostSend(nil, wire.OpPostSend, 3, []qp.SendWR{{WRID: 2, Opcode: qp.WRSend, Flags: qp.SendInline | qp.SendSignaled, Inline: []byte("inline!")}})
	recv, _ := proto.AppendPostRecv(nil, wire.OpPostRecv, 3, []qp.RecvWR{{WRID: 1, SGL: []qp.SGE{{Length: 8}}}})
	qpReq := wire.Bytes(&wire.CreateQPReq{QPType: uint8(qp.TypeRC), PD: 1, SendCQ: 2, RecvCQ: 2,
		Cap: wire.QPCap{MaxSendWR: 2, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 64}})
	toInit := wire.Bytes(&wire.ModifyQPReq{Handle: 3, AttrMask: uint32(qp.AttrState | qp.AttrPort | qp.AttrPKeyIndex | qp.AttrAccessFlags),
		Attr: wire.QPAttr{QPState: uint8(qp.StateInit), PortNum: 1}})
	hello := msg(wire.OpHello, wire.Bytes(&wire.HelloReq{Magic: wire.Magic, Version: wire.Version}))
	f.Add(join(hello, msg(wire.OpAllocPD, nil), msg(wire.OpCreateCQ, wire.Bytes(&wire.CreateCQReq{CQE: 4})),
		msg(wire.OpCreateQP, qpReq), msg(wire.OpModifyQP, toInit), post, inl, recv,
		msg(wire.OpQueryQP, wire.Bytes(&wire.QueryQPReq{Handle: 3})), msg(wire.OpDestroyCQ, h(2))))
	f.Add(join(hello, msg(wire.OpCreateSRQ, wire.Bytes(&wire.CreateSRQReq{MaxWR: 4, MaxSGE: 1})),
		msg(wire.OpModifySRQ, wire.Bytes(&wire.ModifySRQReq{Handle: 1, AttrMask: uint32(qp.SRQLimit), SRQLimit: 2}))))
	f.Add(join(hello, msg(wire.OpAllocPD, nil), msg(wire.OpCreateAH, wire.Bytes(&wire.CreateAHReq{PD: 1, Attr: wire.AHAttr{SGIDIndex: 9}}))))
	f.Add(join(hello, msg(wire.OpDebug, nil), msg(wire.OpQueryDevice, nil), msg(wire.OpQueryGIDs, wire.Bytes(&wire.PortReq{Port: 1})),
		msg(wire.OpQueryPKey, wire.Bytes(&wire.PKeyReq{Port: 1})), msg(wire.OpStats, nil)))
	f.Add(join(msg(wire.OpAllocPD, nil), hello)) // before HELLO: refused
	// a CQ resized up, to nothing, beyond max_cqe, down; an MR re-registered with each flag
	// (without its memory attached or a memfd: refused) and with none
	resize := func(h, cqe uint32) []byte {
		return msg(wire.OpResizeCQ, wire.Bytes(&wire.ResizeCQReq{Handle: h, CQE: cqe}))
	}
	f.Add(join(hello, msg(wire.OpCreateCQ, wire.Bytes(&wire.CreateCQReq{CQE: 4})), resize(1, 64), resize(1, 0),
		resize(1, 1<<31), resize(1, 1), resize(2, 8), msg(wire.OpDestroyCQ, h(1)), resize(1, 8)))
	rereg := func(flags, pd, acc, source uint32) []byte {
		return msg(wire.OpReregMR, wire.Bytes(&wire.ReregMRReq{Handle: 3, Flags: flags, PD: pd, Access: acc, Length: 4096, Source: source}))
	}
	f.Add(join(hello, msg(wire.OpAllocPD, nil), msg(wire.OpAllocPD, nil),
		msg(wire.OpRegMR, wire.Bytes(&wire.RegMRReq{PD: 1, Length: 4096, Source: wire.MRProcess})),
		rereg(0, 0, 0, 0), rereg(2, 2, 0, 0), rereg(4, 0, 3, 0), rereg(1, 0, 0, wire.MRMemfd), rereg(1, 0, 0, wire.MRProcess),
		rereg(7, 2, 1, 9), rereg(8, 0, 0, 0), msg(wire.OpDeallocPD, h(2))))
	// memory windows: both types and a refused one, a QP's binds (one naming no window, one of
	// the wrong index), LOCAL_INV and SEND_WITH_INV, a busy PD, deallocs (one bound to nothing)
	mwReq := func(typ uint32) []byte { return wire.Bytes(&wire.AllocMWReq{PD: 1, Type: typ}) }
	binds, _ := proto.AppendPostSend(nil, wire.OpPostSend, 3, []qp.SendWR{
		{WRID: 1, Opcode: qp.WRBindMW, Flags: qp.SendSignaled, Bind: &qp.BindInfo{MWRKey: 0x100, NewRKey: 0x101, Length: 8, Access: 2}},
		{WRID: 2, Opcode: qp.WRLocalInv, InvRKey: 0x101}, {WRID: 3, Opcode: qp.WRSendWithInv, InvRKey: 0x201}})
	badBind, _ := proto.AppendPostSend(nil, wire.OpPostSendAsync, 3, []qp.SendWR{
		{WRID: 4, Opcode: qp.WRBindMW, Bind: &qp.BindInfo{MWRKey: 0x100, NewRKey: 0x201}}})
	f.Add(join(hello, msg(wire.OpAllocPD, nil), msg(wire.OpCreateCQ, wire.Bytes(&wire.CreateCQReq{CQE: 4})),
		msg(wire.OpCreateQP, qpReq), msg(wire.OpAllocMW, mwReq(1)), msg(wire.OpAllocMW, mwReq(2)),
		msg(wire.OpAllocMW, mwReq(3)), msg(wire.OpModifyQP, toInit), binds, badBind,
		msg(wire.OpDeallocPD, h(1)), msg(wire.OpDeallocMW, h(4)), msg(wire.OpDeallocMW, h(4)), msg(wire.OpDeallocMW, h(2))))
	// rdma_cm: an ID listening, a second connecting to it through the device's own CM
	// (loopback), a QP bound, events fetched, a reject, a destroy
	addr := func(ap string) wire.SockAddr { return proto.AddrPortToWire(netip.MustParseAddrPort(ap)) }
	f.Add(join(hello, msg(wire.OpCMCreateChannel, nil),
		msg(wire.OpCMCreateID, wire.Bytes(&wire.CMCreateIDReq{Channel: 1, PortSpace: 0x0106})),
		msg(wire.OpCMBindAddr, wire.Bytes(&wire.CMBindReq{ID: 2, Addr: addr("10.6.0.1:7000")})),
		msg(wire.OpCMListen, wire.Bytes(&wire.CMListenReq{ID: 2, Backlog: 2})),
		msg(wire.OpAllocPD, nil), msg(wire.OpCreateCQ, wire.Bytes(&wire.CreateCQReq{CQE: 4})),
		msg(wire.OpCreateQP, wire.Bytes(&wire.CreateQPReq{QPType: uint8(qp.TypeRC), PD: 3, SendCQ: 4, RecvCQ: 4,
			Cap: wire.QPCap{MaxSendWR: 2, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1}})),
		msg(wire.OpCMCreateID, wire.Bytes(&wire.CMCreateIDReq{Channel: 1, PortSpace: 0x0106})),
		msg(wire.OpCMResolveAddr, wire.Bytes(&wire.CMResolveAddrReq{ID: 6, Dst: addr("10.6.0.1:7000")})),
		msg(wire.OpCMResolveRoute, wire.Bytes(&wire.CMResolveRouteReq{ID: 6})),
		msg(wire.OpCMSetQP, wire.Bytes(&wire.CMSetQPReq{ID: 6, QP: 5})),
		msg(wire.OpCMConnect, wire.Bytes(&wire.CMConnReq{ID: 6})),
		msg(wire.OpCMGetEvents, wire.Bytes(&wire.CMGetEventsReq{Channel: 1})),
		msg(wire.OpCMQueryID, h(6)),
		msg(wire.OpCMInitQPAttr, wire.Bytes(&wire.CMInitQPAttrReq{ID: 6, QPState: uint32(qp.StateRTR)})),
		msg(wire.OpCMReject, wire.Bytes(&wire.CMRejectReq{ID: 7, PrivateDataLen: 2})),
		msg(wire.OpCMDisconnect, h(6)),
		msg(wire.OpCMDestroyID, h(2)), msg(wire.OpCMDestroyChannel, h(1))))
	f.Add(join(hello, msg(wire.OpCMCreateChannel, nil), msg(wire.OpCMCreateChannel, nil),
		msg(wire.OpCMCreateID, wire.Bytes(&wire.CMCreateIDReq{Channel: 1, PortSpace: 0x0111})),
		msg(wire.OpCMMigrateID, wire.Bytes(&wire.CMMigrateReq{ID: 3, Channel: 2})),
		msg(wire.OpCMAccept, wire.Bytes(&wire.CMConnReq{ID: 3})),
		msg(wire.OpCMListen, wire.Bytes(&wire.CMListenReq{ID: 3}))))
	f.Fuzz(func(t *testing.T, stream []byte) {
		ss := &session{s: srv, next: 1, objs: map[proto.Handle]any{}, ten: srv.acct.user(0), memFD: -1} // before HELLO
		srv.nextID++
		ss.id = srv.nextID
		for len(stream) > 0 {
			m := stream
			for i := 0; i+1 < len(stream); i++ {
				if stream[i] == 0xFF && stream[i+1] == 0xFE {
					m, stream = stream[:i], stream[i+2:]
					break
				}
			}
			if len(m) == len(stream) {
				stream = nil
			}
			if len(m) == 0 {
				continue
			}
			if len(m) < proto.HdrSize {
				continue // the run loop answers a short message itself
			}
			var fds []int
			ss.wbuf = ss.wbuf[:0]
			rights := ss.handle(m, &fds)
			proto.CloseFDs(proto.ParseRights(rights)) // the run loop closes what it sent
			hd, _, _ := proto.ParseHdr(m)
			if len(ss.wbuf) == 0 && hd.Op != wire.OpPostSendAsync && hd.Op != wire.OpPostRecvAsync {
				t.Fatalf("no response to op %d", hd.Op)
			}
		}
		ss.cleanup()
		if d := srv.Debug(); d.PDs != 0 || d.MRs != 0 || d.CQs != 0 || d.SRQs != 0 || d.QPs != 0 || d.CMIDs != 0 || d.CMChannels != 0 || d.MappedBytes != 0 {
			t.Fatalf("objects left after cleanup: %+v", d)
		}
		if n := srv.nMW.Load(); n != 0 {
			t.Fatalf("%d memory windows left after cleanup", n)
		}
		if u := srv.acct.usedBy(ss.ten); u != (usage{}) {
			t.Fatalf("charges left after cleanup: %+v", u.proto())
		}
		srv.acct.leave(ss.ten)
	})
}
