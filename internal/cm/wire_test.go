package cm

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// TestParseLengths: only exactly 256 bytes parse; every other length is
// ErrLength (truncation at every length, quic-go style).
func TestParseLengths(t *testing.T) {
	mad := readCaptureMADs(t, "rping")[0].mad
	long := append(append([]byte(nil), mad...), 0)
	for n := 0; n <= len(long); n++ {
		_, err := Parse(long[:n])
		if n == MADSize {
			if err != nil {
				t.Fatalf("len %d: %v", n, err)
			}
			continue
		}
		var pe *ParseError
		if !errors.Is(err, ErrLength) || !errors.As(err, &pe) || pe.Len != n {
			t.Fatalf("len %d: %v", n, err)
		}
	}
}

func TestParseHeaderChecks(t *testing.T) {
	base := readCaptureMADs(t, "rping")[0].mad
	cases := []struct {
		off  int
		val  byte
		want error
	}{
		{madBaseVersion, 2, ErrBaseVersion},
		{madMgmtClass, 0x03, ErrNotCM},
		{madClassVersion, 1, ErrClassVersion},
		{madMethod, byte(MethodGetResp), ErrMethod},
		{madAttrID + 1, 0x1A, ErrUnknownAttr}, // APR is not handled
		{madAttrID + 1, 0x01, ErrUnknownAttr}, // ClassPortInfo
	}
	for _, c := range cases {
		b := append([]byte(nil), base...)
		b[c.off] = c.val
		_, err := Parse(b)
		if !errors.Is(err, c.want) {
			t.Errorf("byte %d = %#x: %v, want %v", c.off, c.val, err, c.want)
		}
		if err != nil && !strings.Contains(err.Error(), "cm:") {
			t.Errorf("error text %q", err)
		}
	}
	// A REJ claiming more than 72 bytes of ARI is refused.
	mad, d := newMAD(AttrREJ, 1)
	f := REJFields{ARILength: 73}
	REJ(d).Encode(&f)
	if _, err := Parse(mad); !errors.Is(err, ErrField) {
		t.Errorf("REJ ARI 73: %v", err)
	}
	mad, d = newMAD(AttrSIDRRep, 1)
	g := SIDRRepFields{AddInfoLength: 200}
	SIDRRep(d).Encode(&g)
	if _, err := Parse(mad); !errors.Is(err, ErrField) {
		t.Errorf("SIDR_REP info 200: %v", err)
	}
}

// TestREQSetters: each setter changes exactly its field.
func TestREQSetters(t *testing.T) {
	orig := readCaptureMADs(t, "rping")[0].mad
	cases := []struct {
		name string
		set  func(REQ)
		edit func(*REQFields)
	}{
		{"LocalCommID", func(r REQ) { r.SetLocalCommID(0x01020304) }, func(f *REQFields) { f.LocalCommID = 0x01020304 }},
		{"ServiceID", func(r REQ) { r.SetServiceID(ServiceID(PSUDP, 9)) }, func(f *REQFields) { f.ServiceID = 0x01110009 }},
		{"LocalQPN", func(r REQ) { r.SetLocalQPN(0xABCDEF12) }, func(f *REQFields) { f.LocalQPN = 0xCDEF12 }},
		{"StartingPSN", func(r REQ) { r.SetStartingPSN(0xFFFFFF) }, func(f *REQFields) { f.StartingPSN = 0xFFFFFF }},
		{"RemoteCMResponseTimeout", func(r REQ) { r.SetRemoteCMResponseTimeout(31) }, func(f *REQFields) { f.RemoteCMResponseTimeout = 31 }},
		{"TransportServiceType", func(r REQ) { r.SetTransportServiceType(TransportUC) }, func(f *REQFields) { f.TransportServiceType = TransportUC }},
		{"LocalCMResponseTimeout", func(r REQ) { r.SetLocalCMResponseTimeout(1) }, func(f *REQFields) { f.LocalCMResponseTimeout = 1 }},
		{"RetryCount", func(r REQ) { r.SetRetryCount(0xFA) }, func(f *REQFields) { f.RetryCount = 2 }},
		{"PathMTU", func(r REQ) { r.SetPathMTU(5) }, func(f *REQFields) { f.PathMTU = 5 }},
		{"RNRRetryCount", func(r REQ) { r.SetRNRRetryCount(1) }, func(f *REQFields) { f.RNRRetryCount = 1 }},
		{"MaxCMRetries", func(r REQ) { r.SetMaxCMRetries(0x13) }, func(f *REQFields) { f.MaxCMRetries = 3 }},
		{"SRQ", func(r REQ) { r.SetSRQ(true) }, func(f *REQFields) { f.SRQ = true }},
	}
	for _, c := range cases {
		b := append([]byte(nil), orig...)
		r := REQ(MAD(b).Data())
		want := r.Fields()
		c.edit(&want)
		c.set(r)
		if got := r.Fields(); got != want {
			t.Errorf("%s: fields\n got %+v\nwant %+v", c.name, got, want)
		}
	}
	b := append([]byte(nil), orig...)
	m := MAD(b)
	m.SetMethod(MethodGet)
	m.SetTID(42)
	m.SetAttrID(AttrDREQ)
	m.SetStatus(7)
	if f := m.Fields(); f.Method != MethodGet || f.TID != 42 || f.AttrID != AttrDREQ || f.Status != 7 || f.BaseVersion != 1 {
		t.Errorf("MAD setters: %+v", f)
	}
}

// TestBitFieldsIsolated: oversized values in Fields are masked to their
// width and never spill into neighbouring fields.
func TestBitFieldsIsolated(t *testing.T) {
	d := make([]byte, DataSize)
	f := REQFields{RetryCount: 0xFF, RNRRetryCount: 0xFF, ExtendedTransportType: 0xFF, TransportServiceType: 0xFF,
		Primary: PathFields{FlowLabel: 0xFFFFFFFF, Resv6: 0xFF, PacketRate: 0xFF, Resv3: 0xFF, Resv3b: 0xFF}}
	REQ(d).Encode(&f)
	g := REQ(d).Fields()
	if g.LocalCMResponseTimeout != 0 || g.PathMTU != 0 || g.RDCExists || g.MaxCMRetries != 0 || g.SRQ ||
		g.RemoteCMResponseTimeout != 0 || g.EndToEndFlowControl || g.Primary.SL != 0 || g.Primary.SubnetLocal ||
		g.Primary.LocalACKTimeout != 0 || g.Primary.FlowLabel != 0xFFFFF || g.Primary.PacketRate != 0x3F ||
		g.Primary.Resv6 != 0x3F || g.RetryCount != 7 || g.TransportServiceType != 3 {
		t.Fatalf("%+v", g)
	}
	m := make([]byte, DataSize)
	MRA(m).Encode(&MRAFields{MessageMRAed: 0xFF, Resv6: 0xFF, ServiceTimeout: 0, Resv3: 0xFF})
	if x := MRA(m).Fields(); x.MessageMRAed != 3 || x.ServiceTimeout != 0 || x.Resv3 != 7 {
		t.Fatalf("%+v", x)
	}
	r := make([]byte, DataSize)
	REP(r).Encode(&REPFields{RNRRetryCount: 0xFF, Resv4: 0xFF, FailoverAccepted: 0xFF})
	if x := REP(r).Fields(); x.RNRRetryCount != 7 || x.SRQ || x.Resv4 != 0xF || x.FailoverAccepted != 3 || x.TargetACKDelay != 0 || x.EndToEndFlowControl {
		t.Fatalf("%+v", x)
	}
}

func TestServiceIDAndCMA(t *testing.T) {
	if ServiceID(PSTCP, 7174) != 0x0000000001061c06 || ServiceID(PSUDP, 7174) != 0x0000000001111c06 {
		t.Fatal("service IDs")
	}
	if _, _, ok := SplitServiceID(0x0000000002061c06); ok {
		t.Fatal("out-of-range service ID split")
	}
	src, dst := netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
	h, err := NewCMAHeader(src, dst, 4791)
	if err != nil {
		t.Fatal(err)
	}
	pd := make([]byte, REQPrivateDataSize)
	if n, err := BuildPrivateData(pd, &h, []byte("x")); err != nil || n != CMAHeaderSize+1 {
		t.Fatal(n, err)
	}
	v, user, err := ParsePrivateData(pd)
	if err != nil || v.IPVersion() != 6 || v.Src() != src || v.Dst() != dst || v.SrcPort() != 4791 || user[0] != 'x' {
		t.Fatalf("%v %+v", err, v.Fields())
	}
	if _, err := NewCMAHeader(gidA, dst, 1); !errors.Is(err, ErrAddr) {
		t.Fatalf("mixed families: %v", err)
	}
	if _, err := BuildPrivateData(pd, &h, make([]byte, REQPrivateDataSize)); !errors.Is(err, ErrTooLong) {
		t.Fatalf("too long: %v", err)
	}
	if _, _, err := ParsePrivateData(pd[:35]); !errors.Is(err, ErrCMAShort) {
		t.Fatal(err)
	}
	bad := append([]byte(nil), pd...)
	bad[0] = 0x10
	if _, _, err := ParsePrivateData(bad); !errors.Is(err, ErrCMAVersion) {
		t.Fatal(err)
	}
	bad[0], bad[1] = 0, 0x50
	if _, _, err := ParsePrivateData(bad); !errors.Is(err, ErrCMAIPVersion) {
		t.Fatal(err)
	}
	if g := AddrGID(gidA); GIDAddr(g[:]) != gidA || AddrGID(netip.Addr{}) != ([16]byte{}) {
		t.Fatal("GID conversion")
	}
}

func TestStrings(t *testing.T) {
	checks := map[string]string{
		AttrREQ.String(): "REQ", AttrSIDRRep.String(): "SIDR_REP", AttrID(0x99).String(): "AttrID(0x0099)",
		RejTimeout.String(): "timeout", RejectReason(34).String(): "unrecognized reason 34",
		RejStaleConn.String(): "stale conn", StateMRAREPRcvd.String(): "MRA_REP_RCVD", State(99).String(): "State(99)",
		EventTimewaitExit.String(): "RDMA_CM_EVENT_TIMEWAIT_EXIT", EventConnectRequest.String(): "RDMA_CM_EVENT_CONNECT_REQUEST",
		EventType(77).String(): "EventType(77)",
	}
	for got, want := range checks {
		if got != want {
			t.Errorf("%q, want %q", got, want)
		}
	}
}

func TestManagerAPIErrors(t *testing.T) {
	if _, err := NewManager(Options{}); !errors.Is(err, ErrOptions) {
		t.Fatal(err)
	}
	p := newPair(t, Options{})
	o := p.connectOpts()
	o.PrivateData = make([]byte, REQPrivateDataSize+1)
	if _, err := p.a.m.Connect(o); !errors.Is(err, ErrTooLong) {
		t.Fatal(err)
	}
	o = p.connectOpts()
	o.Transport = TransportRD
	if _, err := p.a.m.Connect(o); !errors.Is(err, ErrOptions) {
		t.Fatal(err)
	}
	l, _ := p.b.m.Listen(svc)
	if l.ServiceID() != svc {
		t.Fatal("listener service ID")
	}
	l.Close()
	if _, err := p.b.m.Listen(svc); err != nil {
		t.Fatalf("Listen after Close: %v", err)
	}
	ca, _ := p.a.m.Connect(p.connectOpts())
	if ca.Peer().GID != gidB || ca.ServiceID() != svc || !ca.Active() {
		t.Fatalf("conn %+v", ca.Peer())
	}
	for name, err := range map[string]error{
		"Accept":     ca.Accept(AcceptOptions{}),
		"Reject":     ca.Reject(RejConsumerDefined, nil),
		"MRA":        ca.SendMRA(1, nil),
		"Establish":  ca.Establish(nil),
		"Disconnect": ca.Disconnect(nil),
		"SIDRReply":  ca.SIDRReply(SIDRReplyOptions{}),
	} {
		if !errors.Is(err, ErrState) {
			t.Errorf("%s in REQ_SENT: %v", name, err)
		}
	}
}

// An MRA for the REP (active side with ManualRTU) stops the passive side's
// REP retransmission for the service timeout.
func TestMRAForREP(t *testing.T) {
	p := newPair(t, Options{})
	p.b.m.Listen(svc)
	o := p.connectOpts()
	o.ManualRTU = true
	ca, _ := p.a.m.Connect(o)
	p.flow(p.a, p.b)
	cb := p.b.lastEvent().Conn
	cb.Accept(AcceptOptions{QPN: 0x22, QP: p.b.qp})
	p.flow(p.b, p.a)
	if err := ca.SendMRA(16, nil); err != nil {
		t.Fatal(err)
	}
	wantState(t, ca, StateMRAREPSent)
	p.flow(p.a, p.b)
	wantState(t, cb, StateMRAREPRcvd)
	p.clk.Advance(reqAttempt * 2)
	p.b.wantSent()
	cb.NotifyEstablished() // data arrived first
	wantState(t, cb, StateEstablished)
	p.b.wantEvents(EventConnectRequest, EventEstablished)
}

func TestManagerClose(t *testing.T) {
	p := newPair(t, Options{})
	p.establish(t)
	p.a.m.Connect(p.connectOpts())
	if p.clk.Pending() == 0 {
		t.Fatal("no timer armed")
	}
	p.a.m.Close()
	p.b.m.Close()
	if n := p.clk.Pending(); n != 0 {
		t.Fatalf("%d timers after Close", n)
	}
	if _, err := p.a.m.Connect(p.connectOpts()); !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
	if _, err := p.a.m.Listen(1); !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
	if err := p.b.m.HandleMAD(p.a.addr, readCaptureMADs(t, "rping")[0].mad); !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
	o := p.connectOpts()
	o.Path.DGID = netip.Addr{}
	if _, err := newPair(t, Options{}).a.m.Connect(o); !errors.Is(err, ErrOptions) {
		t.Fatalf("no destination: %v", err)
	}
	if _, err := newPair(t, Options{}).a.m.ResolveSIDR(SIDROptions{}); !errors.Is(err, ErrOptions) {
		t.Fatalf("SIDR without peer: %v", err)
	}
}
