package daemon

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/softroce/softroce/internal/daemon/proto"
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
	msg := func(op proto.Op, v any) []byte {
		j, _ := json.Marshal(v)
		return append([]byte{byte(op)}, j...)
	}
	// A message stream: messages separated by a 0xFF 0xFE marker.
	join := func(ms ...[]byte) []byte {
		var out []byte
		for _, m := range ms {
			out = append(append(out, m...), 0xFF, 0xFE)
		}
		return out
	}
	post, _ := proto.AppendPostSend(nil, proto.OpPostSendAsync, 3, []qp.SendWR{{WRID: 1, Opcode: qp.WRSend, SGL: []qp.SGE{{Length: 8, LKey: 1}}}})
	recv, _ := proto.AppendPostRecv(nil, proto.OpPostRecv, 3, []qp.RecvWR{{WRID: 1, SGL: []qp.SGE{{Length: 8}}}})
	f.Add(join(msg(proto.OpAllocPD, nil), msg(proto.OpCreateCQ, proto.CreateCQReq{CQE: 4}),
		msg(proto.OpCreateQP, proto.CreateQPReq{Type: qp.TypeRC, PD: 1, SendCQ: 2, RecvCQ: 2, Cap: qp.Cap{MaxSendWR: 2, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1}}),
		msg(proto.OpModifyQP, proto.ModifyQPReq{H: 3, Attr: qp.Attr{State: qp.StateInit, Port: 1}, Mask: qp.AttrState | qp.AttrPort | qp.AttrPKeyIndex | qp.AttrAccessFlags}),
		post, recv, msg(proto.OpQueryQP, proto.HandleReq{H: 3}), msg(proto.OpDestroyCQ, proto.HandleReq{H: 2})))
	f.Add(join(msg(proto.OpCreateSRQ, proto.CreateSRQReq{MaxWR: 4, MaxSGE: 1}), msg(proto.OpModifySRQ, proto.ModifySRQReq{H: 1, Mask: qp.SRQLimit, Attr: qp.SRQAttr{SRQLimit: 2}})))
	f.Add(join(msg(proto.OpAllocPD, nil), msg(proto.OpCreateAH, proto.CreateAHReq{PD: 1, Attr: qp.AHAttr{SGIDIndex: 9}})))
	f.Add([]byte{byte(proto.OpDebug)})
	// rdma_cm: an ID listening, a second connecting to it through the device's own CM
	// (loopback), a QP bound, events fetched, a reject, a destroy
	f.Add(join(msg(proto.OpCMCreateID, proto.CMCreateIDReq{PortSpace: 0x0106}),
		msg(proto.OpCMBindAddr, proto.CMAddrReq{H: 1, Addr: netip.MustParseAddrPort("10.6.0.1:7000")}),
		msg(proto.OpCMListen, proto.CMListenReq{H: 1, Backlog: 2}),
		msg(proto.OpAllocPD, nil), msg(proto.OpCreateCQ, proto.CreateCQReq{CQE: 4}),
		msg(proto.OpCreateQP, proto.CreateQPReq{Type: qp.TypeRC, PD: 2, SendCQ: 3, RecvCQ: 3, Cap: qp.Cap{MaxSendWR: 2, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1}}),
		msg(proto.OpCMCreateID, proto.CMCreateIDReq{PortSpace: 0x0106}),
		msg(proto.OpCMResolveAddr, proto.CMAddrReq{H: 5, Addr: netip.MustParseAddrPort("10.6.0.1:7000")}),
		msg(proto.OpCMResolveRoute, proto.HandleReq{H: 5}),
		msg(proto.OpCMSetQP, proto.CMSetQPReq{H: 5, QP: 4}),
		msg(proto.OpCMConnect, proto.CMConnParamReq{H: 5}),
		msg(proto.OpCMGetEvents, nil),
		msg(proto.OpCMReject, proto.CMRejectReq{H: 6, PrivateData: []byte("no")}),
		msg(proto.OpCMDisconnect, proto.HandleReq{H: 5}),
		msg(proto.OpCMDestroyID, proto.HandleReq{H: 1})))
	f.Add(join(msg(proto.OpCMCreateID, proto.CMCreateIDReq{PortSpace: 0x0111}), msg(proto.OpCMAccept, proto.CMConnParamReq{H: 1}),
		msg(proto.OpCMListen, proto.CMListenReq{H: 1})))
	f.Fuzz(func(t *testing.T, stream []byte) {
		ss := &session{s: srv, next: 1, objs: map[proto.Handle]any{}, ten: srv.acct.user(0)}
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
			var fds []int
			rights := ss.handle(m, &fds)
			proto.CloseFDs(proto.ParseRights(rights)) // the run loop closes what it sent
			if len(ss.wbuf) == 0 && proto.Op(m[0]) != proto.OpPostSendAsync && proto.Op(m[0]) != proto.OpPostRecvAsync {
				t.Fatalf("no response to op %d", m[0])
			}
		}
		ss.cleanup()
		if d := srv.Debug(); d.PDs != 0 || d.MRs != 0 || d.CQs != 0 || d.SRQs != 0 || d.QPs != 0 || d.CMIDs != 0 || d.MappedBytes != 0 {
			t.Fatalf("objects left after cleanup: %+v", d)
		}
		if u := srv.acct.usedBy(ss.ten); u != (usage{}) {
			t.Fatalf("charges left after cleanup: %+v", u.proto())
		}
		srv.acct.leave(ss.ten)
	})
}
