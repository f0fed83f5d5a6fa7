package daemon

import (
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/softroce/softroce/internal/cm"
	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
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
	x := testSession(srv, 1)
	y := testSession(srv, 100)
	defer x.cleanup()
	defer y.cleanup()
	req := func(ss *session, op wire.Op, body []byte) error {
		_, err := ss.request(op, body)
		return err
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// x: PD 1, CQ 2, QP 3
	must(req(x, wire.OpAllocPD, nil))
	must(req(x, wire.OpCreateCQ, wire.Bytes(&wire.CreateCQReq{CQE: 4})))
	must(req(x, wire.OpCreateQP, wire.Bytes(&wire.CreateQPReq{QPType: uint8(qp.TypeRC), PD: 1, SendCQ: 2, RecvCQ: 2,
		Cap: wire.QPCap{MaxSendWR: 2, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1}})))
	// y: channel 100, ID 101
	must(req(y, wire.OpCMCreateChannel, nil))
	must(req(y, wire.OpCMCreateID, wire.Bytes(&wire.CMCreateIDReq{Channel: 100, PortSpace: uint16(cm.PSTCP)})))
	if err := req(y, wire.OpCMSetQP, wire.Bytes(&wire.CMSetQPReq{ID: 101, QP: 3})); !errors.Is(err, proto.ErrNoObject) {
		t.Fatalf("binding another session's QP: %v, want ErrNoObject", err)
	}
	o := x.objs[3].(*qpObj)
	if o.q.State() != qp.StateReset {
		t.Fatalf("the other session's QP moved to %v", o.q.State())
	}
	// x cannot touch y's ID either
	if err := req(x, wire.OpCMListen, wire.Bytes(&wire.CMListenReq{ID: 101})); !errors.Is(err, proto.ErrNoObject) {
		t.Fatalf("listening on another session's ID: %v, want ErrNoObject", err)
	}
}
