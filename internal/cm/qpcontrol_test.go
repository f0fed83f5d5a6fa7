package cm

import (
	"net/netip"
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/link"
)

type nullOut struct{}

func (nullOut) Send([]link.Datagram) error                     { return nil }
func (nullOut) SourcePort(_ netip.Addr, entropy uint16) uint16 { return entropy }

// newEngineQP makes a real engine QP in INIT.
func newEngineQP(t *testing.T, clk qp.Clock, typ qp.Type, qpn uint32, local netip.Addr) *qp.QP {
	t.Helper()
	tbl := mr.NewTable(mr.TableOptions{})
	pd, err := tbl.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	scq, err := cq.New(cq.Options{Capacity: 16})
	if err != nil {
		t.Fatal(err)
	}
	rcq, err := cq.New(cq.Options{Capacity: 16})
	if err != nil {
		t.Fatal(err)
	}
	q, err := qp.New(qp.Config{Type: typ, QPN: qpn, PD: pd, MRs: tbl, SendCQ: scq, RecvCQ: rcq,
		Cap: qp.Cap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}, Out: nullOut{}, Clock: clk,
		Resolve: func(ah *qp.AHAttr) (qp.Path, error) { return qp.Path{Src: local, Dst: ah.DGID}, nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(q.Destroy)
	all := mr.AccessLocalWrite | mr.AccessRemoteWrite | mr.AccessRemoteRead
	if err := q.Modify(&qp.Attr{State: qp.StateInit, Port: 1, AccessFlags: all},
		qp.AttrState|qp.AttrPKeyIndex|qp.AttrPort|qp.AttrAccessFlags); err != nil {
		t.Fatal(err)
	}
	return q
}

// TestEngineQPs: two Managers connect two real engine QPs through
// NewQPControl; both end in RTS with matching PSNs and QPNs. The side that
// disconnects goes to ERR at once, the other when it disconnects in turn.
func TestEngineQPs(t *testing.T) {
	for _, typ := range []qp.Type{qp.TypeRC, qp.TypeUC} {
		p := newPair(t, Options{})
		qa := newEngineQP(t, p.clk, typ, 0x11, gidA)
		qb := newEngineQP(t, p.clk, typ, 0x22, gidB)
		p.b.m.Listen(svc)
		o := p.connectOpts()
		o.QP = NewQPControl(qa, QPControlOptions{})
		if typ == qp.TypeUC {
			o.Transport = TransportUC
		}
		ca, err := p.a.m.Connect(o)
		if err != nil {
			t.Fatal(err)
		}
		p.flow(p.a, p.b)
		cb := p.b.lastEvent().Conn
		if err := cb.Accept(AcceptOptions{QPN: qb.Num(), StartingPSN: 0x5678, ResponderResources: 1, InitiatorDepth: 1,
			RNRRetryCount: 7, QP: NewQPControl(qb, QPControlOptions{})}); err != nil {
			t.Fatalf("%v: Accept: %v", typ, err)
		}
		p.flow(p.b, p.a)
		p.flow(p.a, p.b)
		p.a.wantEvents(EventEstablished)
		p.b.wantEvents(EventConnectRequest, EventEstablished)
		aa, ab := qa.Query(), qb.Query()
		if qa.State() != qp.StateRTS || qb.State() != qp.StateRTS {
			t.Fatalf("%v: states %v %v", typ, qa.State(), qb.State())
		}
		if aa.DestQPN != 0x22 || ab.DestQPN != 0x11 || aa.SQPSN != ab.RQPSN || ab.SQPSN != aa.RQPSN ||
			aa.SQPSN != 0x5678 || ab.SQPSN != 0x1234 || aa.PathMTU != qp.MTU(3) || aa.AH.DGID != gidB || ab.AH.DGID != gidA {
			t.Fatalf("%v: attrs\nA %+v\nB %+v", typ, aa, ab)
		}
		if typ == qp.TypeRC && (aa.Timeout != testPath.LocalACKTimeout || aa.RetryCnt != 7 || aa.RNRRetry != 7 || ab.RNRRetry != 6) {
			t.Fatalf("RC attrs\nA %+v\nB %+v", aa, ab)
		}
		ca.Disconnect(nil)
		p.flow(p.a, p.b)
		if qa.State() != qp.StateErr || qb.State() != qp.StateRTS {
			t.Fatalf("%v: after the DREQ %v %v", typ, qa.State(), qb.State())
		}
		if err := cb.Disconnect(nil); err != nil || qb.State() != qp.StateErr {
			t.Fatalf("%v: passive disconnect %v, state %v", typ, err, qb.State())
		}
	}
}
