package cm

import (
	"bytes"
	"testing"

	"github.com/softroce/softroce/internal/qp"
)

// The REQ's reserved word at data byte 24 and the REP's reserved low nibble of byte 27 (IBTA
// 12.6.5 Table 106, 12.6.8 Table 110) carry softroce's selective repeat offer and acceptance
// (ext.go).
const (
	reqExtOff = MADHeaderSize + reqResv24
	repExtOff = MADHeaderSize + repByte27
)

// TestExtGolden: the bytes of an offer and an acceptance, and what reads as one.
func TestExtGolden(t *testing.T) {
	req := make([]byte, DataSize)
	REQ(req).Encode(&REQFields{LocalCommID: 0x11223344, LocalCAGUID: 0x0102030405060708,
		LocalQKey: 0xa1a2a3a4, Resv24: ExtOffer(ExtSelectiveRepeat)})
	if got, want := req[16:32], []byte{1, 2, 3, 4, 5, 6, 7, 8, 0x53, 0x52, 0x00, 0x01, 0xa1, 0xa2, 0xa3, 0xa4}; !bytes.Equal(got, want) {
		t.Fatalf("REQ bytes 16-31 %x, want %x", got, want)
	}
	if !REQ(req).SelectiveRepeat() || REQ(req).ExtOffered() != ExtSelectiveRepeat || REQ(req).LocalQKey() != 0xa1a2a3a4 {
		t.Fatalf("offer not read back: %#x", REQ(req).ExtOffered())
	}
	for _, w := range []uint32{0, 1, 0x00000001, 0x53530001, 0x5352fffe, 0xffffffff &^ (ExtTag << 16)} {
		REQ(req).Encode(&REQFields{Resv24: w})
		if REQ(req).SelectiveRepeat() {
			t.Errorf("word %#08x reads as a selective repeat offer", w)
		}
	}
	if ExtOffer(0) != 0 {
		t.Errorf("ExtOffer(0) = %#x", ExtOffer(0))
	}

	rep := make([]byte, DataSize)
	REP(rep).Encode(&REPFields{RNRRetryCount: 7, SRQ: true, Resv4: ExtSelectiveRepeat, LocalCAGUID: 0x0102030405060708})
	if got, want := rep[26:36], []byte{0, 0xf1, 1, 2, 3, 4, 5, 6, 7, 8}; !bytes.Equal(got, want) {
		t.Fatalf("REP bytes 26-35 %x, want %x", got, want)
	}
	if r := REP(rep); !r.SelectiveRepeat() || r.RNRRetryCount() != 7 || !r.SRQ() {
		t.Fatalf("REP read back: sr %v rnr %d srq %v", r.SelectiveRepeat(), r.RNRRetryCount(), r.SRQ())
	}
	REP(rep).Encode(&REPFields{RNRRetryCount: 7, SRQ: true, Resv4: 0xe})
	if REP(rep).SelectiveRepeat() {
		t.Fatal("REP nibble 0xe reads as an acceptance")
	}
}

// TestExtCapturesZero: kernel rxe's REQs and REPs (its CM zero-fills MADs and sets named
// fields only) offer and accept nothing.
func TestExtCapturesZero(t *testing.T) {
	for _, name := range []string{"rping", "ucmatose"} {
		for _, c := range readCaptureMADs(t, name) {
			msg := mustParse(t, c.mad)
			switch {
			case msg.REQ != nil && (msg.REQ.ExtOffered() != 0 || be.Uint32(c.mad[reqExtOff:]) != 0):
				t.Errorf("%s frame %d: kernel REQ word %#x", name, c.frame, be.Uint32(c.mad[reqExtOff:]))
			case msg.REP != nil && msg.REP.ExtAccepted() != 0:
				t.Errorf("%s frame %d: kernel REP nibble %#x", name, c.frame, msg.REP.ExtAccepted())
			}
		}
	}
}

// TestSelectiveRepeatNegotiation: the QPs get selective repeat exactly when the active side
// offers it and the passive side accepts; the REQ and REP carry it in their reserved bits.
func TestSelectiveRepeatNegotiation(t *testing.T) {
	for _, tc := range []struct {
		name            string
		offer, accept   bool
		uc              bool
		wantOffer, want bool
	}{
		{name: "both", offer: true, accept: true, wantOffer: true, want: true},
		{name: "active only", offer: true, wantOffer: true},
		{name: "passive only", accept: true},
		{name: "neither"},
		{name: "UC", offer: true, accept: true, uc: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, Options{})
			if _, err := p.b.m.Listen(svc); err != nil {
				t.Fatal(err)
			}
			o := p.connectOpts()
			o.SelectiveRepeat = tc.offer
			if tc.uc {
				o.Transport = TransportUC
			}
			ca, err := p.a.m.Connect(o)
			if err != nil {
				t.Fatal(err)
			}
			req := p.a.w.sent[0].mad
			wantWord := uint32(0)
			if tc.wantOffer {
				wantWord = 0x53520001
			}
			if w := be.Uint32(req[reqExtOff:]); w != wantWord {
				t.Fatalf("REQ word %#08x, want %#08x", w, wantWord)
			}
			p.flow(p.a, p.b)
			ev := p.b.lastEvent()
			p.b.wantEvents(EventConnectRequest)
			cb := ev.Conn
			if ev.Remote.SelectiveRepeat != tc.wantOffer || cb.PeerOffersSelectiveRepeat() != tc.wantOffer {
				t.Fatalf("CONNECT_REQUEST offer %v/%v, want %v", ev.Remote.SelectiveRepeat, cb.PeerOffersSelectiveRepeat(), tc.wantOffer)
			}
			if err := cb.Accept(AcceptOptions{QPN: 0x22, StartingPSN: 0x5678, RNRRetryCount: 5, QP: p.b.qp,
				SelectiveRepeat: tc.accept}); err != nil {
				t.Fatal(err)
			}
			rep := p.b.w.sent[0].mad
			wantNibble := byte(0)
			if tc.want {
				wantNibble = 1
			}
			if rep[repExtOff] != 5<<5|wantNibble {
				t.Fatalf("REP byte 27 %#02x, want %#02x", rep[repExtOff], 5<<5|wantNibble)
			}
			p.flow(p.b, p.a)
			ev = p.a.lastEvent()
			p.a.wantEvents(EventEstablished)
			if ev.Remote.SelectiveRepeat != tc.want {
				t.Fatalf("ESTABLISHED accepted %v, want %v", ev.Remote.SelectiveRepeat, tc.want)
			}
			p.flow(p.a, p.b)
			p.b.wantEvents(EventEstablished)
			for i, c := range []*Conn{ca, cb} {
				s := []*side{p.a, p.b}[i]
				if c.SelectiveRepeat() != tc.want || s.qp.rtr.SelectiveRepeat != tc.want {
					t.Fatalf("side %d: SelectiveRepeat %v, RTR %v, want %v", i, c.SelectiveRepeat(), s.qp.rtr.SelectiveRepeat, tc.want)
				}
				if !eqIDs(s.qp.calls, []string{"RTR", "RTS"}) {
					t.Fatalf("side %d: QP calls %v", i, s.qp.calls)
				}
			}
		})
	}
}

// TestSelectiveRepeatUnsolicitedREP: a REP whose reserved bits accept what was never offered
// changes nothing.
func TestSelectiveRepeatUnsolicitedREP(t *testing.T) {
	p := newPair(t, Options{})
	p.b.m.Listen(svc)
	if _, err := p.a.m.Connect(p.connectOpts()); err != nil {
		t.Fatal(err)
	}
	p.flow(p.a, p.b)
	cb := p.b.lastEvent().Conn
	if err := cb.Accept(AcceptOptions{QPN: 0x22, QP: p.b.qp, SelectiveRepeat: true}); err != nil {
		t.Fatal(err)
	}
	p.b.w.sent[0].mad[repExtOff] |= ExtSelectiveRepeat // as a peer that sets reserved bits would
	p.flow(p.b, p.a)
	if ev := p.a.lastEvent(); ev.Type != EventEstablished || ev.Remote.SelectiveRepeat || p.a.qp.rtr.SelectiveRepeat {
		t.Fatalf("unsolicited acceptance taken: %v %+v, RTR %v", ev.Type, ev.Remote, p.a.qp.rtr.SelectiveRepeat)
	}
}

// TestSelectiveRepeatKernelPeer replays kernel rxe's side of rping.pcap against a softroce side
// that asks for selective repeat: our REQ is the kernel's but for the offer in its reserved
// word; the kernel's REP (reserved bits zero) leaves the QP without it. As the passive side,
// the kernel's REQ (word zero) gets the kernel's REP byte for byte, and no selective repeat.
func TestSelectiveRepeatKernelPeer(t *testing.T) {
	k := readCaptureMADs(t, "rping")
	req := mustParse(t, k[0].mad).REQ
	rep := mustParse(t, k[1].mad).REP
	client, server := Addr{GID: req.Primary().LocalGID(), QPN: 1}, Addr{GID: req.Primary().RemoteGID(), QPN: 1}

	t.Run("active", func(t *testing.T) {
		tid := MAD(k[0].mad).TID()
		r := newReplaySide(t, "rping", Options{CAGUID: req.LocalCAGUID(), TIDHigh: uint32(tid >> 32),
			Rand: commIDRand(req.LocalCommID())}, client)
		q := &fakeQP{}
		pp := req.Primary()
		_, err := r.m.Connect(ConnectOptions{
			ServiceID: req.ServiceID(), QPN: req.LocalQPN(), StartingPSN: req.StartingPSN(),
			Path: Path{SGID: pp.LocalGID(), DGID: pp.RemoteGID(), FlowLabel: pp.FlowLabel(), HopLimit: pp.HopLimit(),
				TrafficClass: pp.TrafficClass(), SL: pp.SL(), MTU: req.PathMTU(), PacketRate: pp.PacketRate(),
				LocalACKTimeout: pp.LocalACKTimeout()},
			ResponderResources: req.ResponderResources(), InitiatorDepth: req.InitiatorDepth(),
			RetryCount: req.RetryCount(), RNRRetryCount: req.RNRRetryCount(), PrivateData: req.PrivateData(),
			QP: q, SelectiveRepeat: true,
		})
		if err != nil {
			t.Fatal(err)
		}
		got := r.wantSent(AttrREQ)[0].mad
		want := append([]byte(nil), k[0].mad...)
		copy(want[reqExtOff:], []byte{0x53, 0x52, 0x00, 0x01})
		if !bytes.Equal(got, want) {
			t.Fatalf("our REQ is not the kernel's with the offer\n ours %x\nwant %x", got, want)
		}
		r.feed(AttrREP, server)
		ev := r.lastEvent()
		r.wantEvents(EventEstablished)
		if ev.Remote.SelectiveRepeat || ev.Conn.SelectiveRepeat() || q.rtr.SelectiveRepeat || len(q.calls) != 2 {
			t.Fatalf("selective repeat with kernel rxe's REP: event %v, conn %v, RTR %v (%v)",
				ev.Remote.SelectiveRepeat, ev.Conn.SelectiveRepeat(), q.rtr.SelectiveRepeat, q.calls)
		}
		r.wantKernel(AttrRTU)
	})

	t.Run("passive", func(t *testing.T) {
		r := newReplaySide(t, "rping", Options{CAGUID: rep.LocalCAGUID(), Rand: commIDRand(rep.LocalCommID())}, server)
		if _, err := r.m.Listen(req.ServiceID()); err != nil {
			t.Fatal(err)
		}
		r.feed(AttrREQ, client)
		ev := r.lastEvent()
		r.wantEvents(EventConnectRequest)
		if ev.Remote.SelectiveRepeat || ev.Conn.PeerOffersSelectiveRepeat() {
			t.Fatal("kernel rxe's REQ read as an offer")
		}
		q := &fakeQP{}
		f := rep.Fields()
		if err := ev.Conn.Accept(AcceptOptions{QPN: f.LocalQPN, StartingPSN: f.StartingPSN,
			ResponderResources: f.ResponderResources, InitiatorDepth: f.InitiatorDepth, RNRRetryCount: f.RNRRetryCount,
			TargetACKDelay: f.TargetACKDelay, PrivateData: f.PrivateData[:], QP: q, SelectiveRepeat: true}); err != nil {
			t.Fatal(err)
		}
		r.wantKernel(AttrREP)
		if q.rtr.SelectiveRepeat || ev.Conn.SelectiveRepeat() {
			t.Fatal("selective repeat after kernel rxe's REQ")
		}
	})
}

// TestRTRAttrSelectiveRepeat: the RTR modification carries AttrSelectiveRepeat for a
// negotiated RC connection only.
func TestRTRAttrSelectiveRepeat(t *testing.T) {
	for _, tc := range []struct {
		typ  qp.Type
		sr   bool
		want bool
	}{{qp.TypeRC, true, true}, {qp.TypeRC, false, false}, {qp.TypeUC, true, false}} {
		a, m := RTRAttr(tc.typ, &RTRParams{SelectiveRepeat: tc.sr}, QPControlOptions{})
		if a.SelectiveRepeat != tc.want || (m&qp.AttrSelectiveRepeat != 0) != tc.want {
			t.Errorf("%v sr %v: attr %v mask %v", tc.typ, tc.sr, a.SelectiveRepeat, m&qp.AttrSelectiveRepeat != 0)
		}
	}
}
