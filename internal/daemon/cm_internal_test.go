package daemon

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/softroce/softroce/internal/cm"
	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/roce"
)

// TestCMSetQPOtherSession: a session cannot bind another session's QP to its ID, even by
// sending the raw request (the client library refuses it before): the QP handle is looked up
// in the requesting session's table only.
func TestCMSetQPOtherSession(t *testing.T) {
	l, err := mem.NewNetwork(mem.Options{}).Attach(netip.MustParseAddr("10.6.1.1"))
	if err != nil {
		t.Fatal(err)
	}
	dev, err := roce.Open(roce.Options{Link: l})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	srv, _ := New(Options{Device: dev, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	x := &session{s: srv, next: 1, objs: map[proto.Handle]any{}, ten: srv.acct.user(0)}
	y := &session{s: srv, next: 100, objs: map[proto.Handle]any{}, ten: srv.acct.user(0)}
	defer x.cleanup()
	defer y.cleanup()
	req := func(ss *session, op proto.Op, v any) error {
		j, _ := json.Marshal(v)
		var fds []int
		ss.handle(append([]byte{byte(op)}, j...), &fds)
		if ss.wbuf[0] != proto.StatusOK {
			var e proto.ErrorBody
			json.Unmarshal(ss.wbuf[1:], &e)
			return proto.FromBody(e)
		}
		return nil
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// x: PD 1, CQ 2, QP 3
	must(req(x, proto.OpAllocPD, nil))
	must(req(x, proto.OpCreateCQ, proto.CreateCQReq{CQE: 4}))
	must(req(x, proto.OpCreateQP, proto.CreateQPReq{Type: qp.TypeRC, PD: 1, SendCQ: 2, RecvCQ: 2,
		Cap: qp.Cap{MaxSendWR: 2, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1}}))
	// y: ID 100
	must(req(y, proto.OpCMCreateID, proto.CMCreateIDReq{PortSpace: cm.PSTCP}))
	if err := req(y, proto.OpCMSetQP, proto.CMSetQPReq{H: 100, QP: 3}); !errors.Is(err, proto.ErrNoObject) {
		t.Fatalf("binding another session's QP: %v, want ErrNoObject", err)
	}
	o := x.objs[3].(*qpObj)
	if o.q.State() != qp.StateReset {
		t.Fatalf("the other session's QP moved to %v", o.q.State())
	}
	// x cannot touch y's ID either
	if err := req(x, proto.OpCMListen, proto.CMListenReq{H: 100}); !errors.Is(err, proto.ErrNoObject) {
		t.Fatalf("listening on another session's ID: %v, want ErrNoObject", err)
	}
}
