package cm

import (
	"bytes"
	"encoding/binary"
	mrand "math/rand"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/qp"
)

// Replays of the kernel-rxe captures against our Manager: fed the kernel's
// messages and the same choices (comm ID, QPN, PSN, GUID, TID agent), our
// side must emit the kernel's messages byte for byte.

// fixedRand yields the given bytes first (the comm ID to allocate), then
// pseudo-random ones.
type fixedRand struct {
	b []byte
	r *mrand.Rand
}

func (f *fixedRand) Read(p []byte) (int, error) {
	n := copy(p, f.b)
	f.b = f.b[n:]
	if n < len(p) {
		f.r.Read(p[n:])
	}
	return len(p), nil
}

func commIDRand(id uint32) *fixedRand {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], id)
	return &fixedRand{b: b[:], r: mrand.New(mrand.NewSource(7))}
}

type replaySide struct {
	*side
	kernel map[AttrID][]byte
}

func newReplaySide(t *testing.T, capture string, o Options, gid Addr) *replaySide {
	clk := qp.NewManualClock(time.Unix(1_700_000_000, 0))
	s := &side{t: t, w: &wire{}, addr: gid}
	o.Transport, o.Clock = s.w, clk
	o.Events = func(e Event) { s.ev = append(s.ev, e) }
	m, err := NewManager(o)
	if err != nil {
		t.Fatal(err)
	}
	s.m = m
	k := map[AttrID][]byte{}
	for _, c := range readCaptureMADs(t, capture) {
		k[MAD(c.mad).AttrID()] = c.mad
	}
	return &replaySide{side: s, kernel: k}
}

func (r *replaySide) wantKernel(attr AttrID) {
	r.t.Helper()
	got := r.wantSent(attr)[0].mad
	if !bytes.Equal(got, r.kernel[attr]) {
		r.t.Fatalf("our %v differs from kernel rxe's\n ours %x\nrxe  %x", attr, got, r.kernel[attr])
	}
}

func (r *replaySide) feed(attr AttrID, from Addr) {
	r.t.Helper()
	if err := r.m.HandleMAD(from, r.kernel[attr]); err != nil {
		r.t.Fatal(err)
	}
}

func mustParse(t *testing.T, b []byte) Message {
	t.Helper()
	m, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// replayActive plays rdma_connect's side (client, 198.19.0.1).
func replayActive(t *testing.T, capture string, activeDisconnects bool) {
	k := readCaptureMADs(t, capture)
	req := mustParse(t, k[0].mad).REQ
	rep := mustParse(t, k[1].mad).REP
	tid := MAD(k[0].mad).TID()
	client, server := Addr{GID: req.Primary().LocalGID(), QPN: 1}, Addr{GID: req.Primary().RemoteGID(), QPN: 1}
	r := newReplaySide(t, capture, Options{CAGUID: req.LocalCAGUID(), TIDHigh: uint32(tid >> 32),
		Rand: commIDRand(req.LocalCommID())}, client)

	h, user, err := ParsePrivateData(req.PrivateData())
	if err != nil {
		t.Fatal(err)
	}
	hf, err := NewCMAHeader(h.Src(), h.Dst(), h.SrcPort())
	if err != nil {
		t.Fatal(err)
	}
	var pd [REQPrivateDataSize]byte
	n, _ := BuildPrivateData(pd[:], &hf, user)
	pp := req.Primary()
	c, err := r.m.Connect(ConnectOptions{
		ServiceID: req.ServiceID(), QPN: req.LocalQPN(), StartingPSN: req.StartingPSN(),
		Path: Path{SGID: pp.LocalGID(), DGID: pp.RemoteGID(), FlowLabel: pp.FlowLabel(), HopLimit: pp.HopLimit(),
			TrafficClass: pp.TrafficClass(), SL: pp.SL(), MTU: req.PathMTU(), PacketRate: pp.PacketRate(),
			LocalACKTimeout: pp.LocalACKTimeout()},
		ResponderResources: req.ResponderResources(), InitiatorDepth: req.InitiatorDepth(),
		RetryCount: req.RetryCount(), RNRRetryCount: req.RNRRetryCount(), PrivateData: pd[:n],
	})
	if err != nil {
		t.Fatal(err)
	}
	r.wantKernel(AttrREQ)
	r.feed(AttrREP, server)
	ev := r.lastEvent()
	r.wantEvents(EventEstablished)
	if ev.Remote.QPN != rep.LocalQPN() || ev.Remote.StartingPSN != rep.StartingPSN() {
		t.Fatalf("ESTABLISHED %+v", ev.Remote)
	}
	r.wantKernel(AttrRTU)
	if activeDisconnects {
		if err := c.Disconnect(nil); err != nil {
			t.Fatal(err)
		}
		r.wantKernel(AttrDREQ)
		r.feed(AttrDREP, server)
	} else {
		r.feed(AttrDREQ, server)
		r.wantKernel(AttrDREP)
	}
	r.wantEvents(EventDisconnected)
	wantState(t, c, StateTimewait)
}

// replayPassive plays rdma_accept's side (server, 198.19.0.2).
func replayPassive(t *testing.T, capture string, activeDisconnects bool) {
	k := readCaptureMADs(t, capture)
	req := mustParse(t, k[0].mad).REQ
	rep := mustParse(t, k[1].mad).REP
	o := Options{CAGUID: rep.LocalCAGUID(), Rand: commIDRand(rep.LocalCommID())}
	if !activeDisconnects {
		o.TIDHigh = uint32(MAD(k[3].mad).TID() >> 32)
	}
	client, server := Addr{GID: req.Primary().LocalGID(), QPN: 1}, Addr{GID: req.Primary().RemoteGID(), QPN: 1}
	r := newReplaySide(t, capture, o, server)
	if _, err := r.m.Listen(req.ServiceID()); err != nil {
		t.Fatal(err)
	}
	r.feed(AttrREQ, client)
	ev := r.lastEvent()
	r.wantEvents(EventConnectRequest)
	f := rep.Fields()
	err := ev.Conn.Accept(AcceptOptions{QPN: f.LocalQPN, StartingPSN: f.StartingPSN,
		ResponderResources: f.ResponderResources, InitiatorDepth: f.InitiatorDepth, RNRRetryCount: f.RNRRetryCount,
		TargetACKDelay: f.TargetACKDelay, PrivateData: f.PrivateData[:]})
	if err != nil {
		t.Fatal(err)
	}
	r.wantKernel(AttrREP)
	r.feed(AttrRTU, client)
	r.wantEvents(EventEstablished)
	if activeDisconnects {
		r.feed(AttrDREQ, client)
		r.wantKernel(AttrDREP)
	} else {
		if err := ev.Conn.Disconnect(nil); err != nil {
			t.Fatal(err)
		}
		r.wantKernel(AttrDREQ)
		r.feed(AttrDREP, client)
	}
	r.wantEvents(EventDisconnected)
	wantState(t, ev.Conn, StateTimewait)
}

func TestReplayRping(t *testing.T) {
	t.Run("active", func(t *testing.T) { replayActive(t, "rping", true) })
	t.Run("passive", func(t *testing.T) { replayPassive(t, "rping", true) })
}

func TestReplayUcmatose(t *testing.T) {
	// ucmatose: the server disconnects.
	t.Run("active", func(t *testing.T) { replayActive(t, "ucmatose", false) })
	t.Run("passive", func(t *testing.T) { replayPassive(t, "ucmatose", false) })
}

func TestReplayUdaddy(t *testing.T) {
	k := readCaptureMADs(t, "udaddy")
	sreq := mustParse(t, k[0].mad).SIDRReq
	srep := mustParse(t, k[1].mad).SIDRRep
	h, _, err := ParsePrivateData(sreq.PrivateData())
	if err != nil {
		t.Fatal(err)
	}
	client, server := Addr{GID: h.Src(), QPN: 1, PKey: 0xFFFF}, Addr{GID: h.Dst(), QPN: 1, PKey: 0xFFFF}

	a := newReplaySide(t, "udaddy", Options{TIDHigh: uint32(MAD(k[0].mad).TID() >> 32),
		Rand: commIDRand(sreq.RequestID())}, client)
	c, err := a.m.ResolveSIDR(SIDROptions{ServiceID: sreq.ServiceID(), Peer: server, PrivateData: sreq.PrivateData()})
	if err != nil {
		t.Fatal(err)
	}
	a.wantKernel(AttrSIDRReq)

	b := newReplaySide(t, "udaddy", Options{}, server)
	b.m.Listen(sreq.ServiceID())
	b.feed(AttrSIDRReq, client)
	ev := b.lastEvent()
	b.wantEvents(EventConnectRequest)
	if err := ev.Conn.SIDRReply(SIDRReplyOptions{QPN: srep.QPN(), QKey: srep.QKey(), PrivateData: srep.PrivateData()}); err != nil {
		t.Fatal(err)
	}
	b.wantKernel(AttrSIDRRep)

	a.feed(AttrSIDRRep, server)
	ev = a.lastEvent()
	a.wantEvents(EventEstablished)
	if ev.Conn != c || ev.UD != (UDParam{QPN: 0x21, QKey: RDMAUDPQKey}) {
		t.Fatalf("event %+v", ev)
	}
}
