package rdmacm

import (
	"errors"
	"testing"

	"github.com/softroce/softroce/internal/cm"
	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/qp"
)

// TestSelectiveRepeatOption: two softroce devices connect through the CM; the QPs have
// selective repeat (queried from the engine) exactly when both IDs asked (the active ID, and
// the listening ID or the request's ID before Accept), and data flows either way.
func TestSelectiveRepeatOption(t *testing.T) {
	for i, tc := range []struct {
		name                 string
		active, listener, rq bool
		want                 bool
	}{
		{name: "both", active: true, listener: true, want: true},
		{name: "both, request ID", active: true, rq: true, want: true},
		{name: "active only", active: true},
		{name: "passive only", listener: true},
		{name: "neither"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b, _ := pair(t, nil, nil)
			srv, cli := newSide(t, b, cm.PSTCP), newSide(t, a, cm.PSTCP)
			port := uint16(4800 + i)
			if tc.listener {
				if err := srv.id.SetOption(OptionSelectiveRepeat, 1); err != nil {
					t.Fatal(err)
				}
			}
			listen(t, srv, port)
			if tc.active {
				if err := cli.id.SetOption(OptionSelectiveRepeat, 1); err != nil {
					t.Fatal(err)
				}
			}
			qa := connectTo(t, cli, port, ConnParam{RetryCount: 7, RNRRetryCount: 7})
			req := next(t, srv.ch, EventConnectRequest)
			if req.Param.SelectiveRepeat != tc.active {
				t.Fatalf("CONNECT_REQUEST offer %v, want %v", req.Param.SelectiveRepeat, tc.active)
			}
			qb := srv.createQP(t, req.ID)
			if tc.rq {
				if err := req.ID.SetOption(OptionSelectiveRepeat, 1); err != nil {
					t.Fatal(err)
				}
			}
			if err := req.ID.Accept(nil); err != nil {
				t.Fatal(err)
			}
			est := next(t, cli.ch, EventEstablished)
			next(t, srv.ch, EventEstablished)
			if est.Param.SelectiveRepeat != tc.want {
				t.Fatalf("ESTABLISHED accepted %v, want %v", est.Param.SelectiveRepeat, tc.want)
			}
			if sa, sb := qa.Query().SelectiveRepeat, qb.Query().SelectiveRepeat; sa != tc.want || sb != tc.want {
				t.Fatalf("QPs' selective repeat %v and %v, want %v", sa, sb, tc.want)
			}
			if cli.id.SelectiveRepeat() != tc.want || req.ID.SelectiveRepeat() != tc.want {
				t.Fatalf("IDs report %v and %v, want %v", cli.id.SelectiveRepeat(), req.ID.SelectiveRepeat(), tc.want)
			}
			copy(cli.buf, "negotiated")
			if _, err := qa.PostSend([]qp.SendWR{{WRID: 1, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
				SGL: []qp.SGE{{Addr: 0x10000, Length: 10, LKey: cli.mr.LKey()}}, RemoteAddr: 0x10000, RKey: srv.mr.RKey()}}); err != nil {
				t.Fatal(err)
			}
			if wc := cli.wc(t); wc.Status != cq.StatusSuccess || string(srv.buf[:10]) != "negotiated" {
				t.Fatalf("write %+v, target %q", wc, srv.buf[:10])
			}
			if err := cli.id.SetOption(OptionSelectiveRepeat, 0); !errors.Is(err, ErrState) {
				t.Fatalf("the option on a connected ID: %v", err)
			}
		})
	}
}

// TestSelectiveRepeatExternalQP: QPs the programs move themselves with InitQPAttr get the
// negotiated attribute too, the passive one before Accept.
func TestSelectiveRepeatExternalQP(t *testing.T) {
	a, b, _ := pair(t, nil, nil)
	srv, cli := newSide(t, b, cm.PSTCP), newSide(t, a, cm.PSTCP)
	if err := srv.id.SetOption(OptionSelectiveRepeat, 1); err != nil {
		t.Fatal(err)
	}
	listen(t, srv, 4790)
	if err := cli.id.SetOption(OptionSelectiveRepeat, 1); err != nil {
		t.Fatal(err)
	}
	resolveTo(t, cli, 4790)
	qa := extQP(t, a, cli)
	moveQP(t, cli.id, qa, qp.StateInit)
	if err := cli.id.Connect(ConnParam{QPNum: qa.Num(), RetryCount: 7, RNRRetryCount: 7}); err != nil {
		t.Fatal(err)
	}
	req := next(t, srv.ch, EventConnectRequest)
	qb := extQP(t, b, srv)
	for _, s := range []qp.State{qp.StateInit, qp.StateRTR, qp.StateRTS} {
		moveQP(t, req.ID, qb, s)
	}
	if err := req.ID.Accept(&ConnParam{QPNum: qb.Num(), RNRRetryCount: 7}); err != nil {
		t.Fatal(err)
	}
	next(t, cli.ch, EventConnectResponse)
	moveQP(t, cli.id, qa, qp.StateRTR)
	moveQP(t, cli.id, qa, qp.StateRTS)
	if err := cli.id.Establish(); err != nil {
		t.Fatal(err)
	}
	next(t, srv.ch, EventEstablished)
	if !qa.Query().SelectiveRepeat || !qb.Query().SelectiveRepeat {
		t.Fatalf("external QPs' selective repeat %v and %v", qa.Query().SelectiveRepeat, qb.Query().SelectiveRepeat)
	}
}

// rawREQ is a REQ for port on addrB from QP qpn at addrA, built field by field as Linux's
// rdma_cm builds one (cm_format_req in a zero-filled MAD): the word at byte 24 is word.
func rawREQ(port uint16, qpn uint32, word uint32) []byte {
	mad := make([]byte, cm.MADSize)
	h := cm.CMHeader(cm.AttrREQ, 0x0000000400001234)
	cm.MAD(mad).Encode(&h)
	hdr, _ := cm.NewCMAHeader(addrA, addrB, 40000)
	var pd [cm.REQPrivateDataSize]byte
	cm.BuildPrivateData(pd[:], &hdr, nil)
	f := cm.REQFields{LocalCommID: 0x1234, ServiceID: cm.ServiceID(cm.PSTCP, port), LocalCAGUID: 0x0200_00ff_fe00_00aa,
		Resv24: word, LocalQPN: qpn, ResponderResources: 1, InitiatorDepth: 1,
		RemoteCMResponseTimeout: cm.DefaultCMResponseTimeout, StartingPSN: 0x4321,
		LocalCMResponseTimeout: cm.DefaultCMResponseTimeout, RetryCount: 7, PKey: 0xFFFF, PathMTU: 3,
		RNRRetryCount: 7, MaxCMRetries: cm.DefaultMaxCMRetries, PrivateData: pd,
		Primary: cm.PathFields{LocalLID: 0xFFFF, RemoteLID: 0xFFFF, LocalGID: cm.AddrGID(addrA),
			RemoteGID: cm.AddrGID(addrB), FlowLabel: 0x6007c, HopLimit: 64, LocalACKTimeout: 19}}
	cm.REQ(cm.MAD(mad).Data()).Encode(&f)
	return mad
}

// TestSelectiveRepeatRawREQ: a listener that asks for selective repeat, sent a REQ as kernel
// rxe sends it (reserved word zero), accepts without it: its QP has none and its REP accepts
// nothing. The same REQ with softroce's offer in the word gets it (the test can tell).
func TestSelectiveRepeatRawREQ(t *testing.T) {
	for i, tc := range []struct {
		name string
		word uint32
		want bool
	}{
		{"kernel rxe", 0, false},
		{"stray bit", 1, false},
		{"softroce offer", cm.ExtOffer(cm.ExtSelectiveRepeat), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, b, _ := pair(t, nil, nil)
			srv := newSide(t, b, cm.PSTCP)
			if err := srv.id.SetOption(OptionSelectiveRepeat, 1); err != nil {
				t.Fatal(err)
			}
			port := uint16(4820 + i)
			listen(t, srv, port)
			if err := b.CM().HandleMAD(cm.Addr{GID: addrA, QPN: cm.GSIQPN, PKey: 0xFFFF}, rawREQ(port, 0x77, tc.word)); err != nil {
				t.Fatal(err)
			}
			req := next(t, srv.ch, EventConnectRequest)
			if req.Param.SelectiveRepeat != tc.want {
				t.Fatalf("offer read as %v, want %v", req.Param.SelectiveRepeat, tc.want)
			}
			qb := srv.createQP(t, req.ID)
			if err := req.ID.Accept(nil); err != nil {
				t.Fatal(err)
			}
			if got := qb.Query().SelectiveRepeat; got != tc.want {
				t.Fatalf("QP selective repeat %v, want %v", got, tc.want)
			}
			if req.ID.SelectiveRepeat() != tc.want {
				t.Fatalf("ID reports %v", req.ID.SelectiveRepeat())
			}
		})
	}
}

// TestSelectiveRepeatOptionRefusals: UD IDs and IDs past connecting refuse the option.
func TestSelectiveRepeatOptionRefusals(t *testing.T) {
	a, _, _ := pair(t, nil, nil)
	ud := newSide(t, a, cm.PSUDP)
	if err := ud.id.SetOption(OptionSelectiveRepeat, 1); !errors.Is(err, ErrInvalidArg) {
		t.Fatalf("selective repeat on a UD ID: %v", err)
	}
}
