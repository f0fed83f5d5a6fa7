package cm

import (
	"bytes"
	"testing"
)

// fuzzSeeds returns MADs of every message type: the captured ones and
// those of a scripted exchange (MRA, REJ and SIDR replies included).
func fuzzSeeds(t testing.TB) [][]byte {
	var seeds [][]byte
	for _, name := range captureNames {
		for _, m := range readCaptureMADs(t, name) {
			seeds = append(seeds, m.mad)
		}
	}
	for _, attr := range []AttrID{AttrMRA, AttrREJ} {
		mad, d := newMAD(attr, 0x0000000486a6d7a3)
		switch attr {
		case AttrMRA:
			f := MRAFields{LocalCommID: 1, RemoteCommID: 2, MessageMRAed: MsgREP, ServiceTimeout: 20}
			MRA(d).Encode(&f)
		case AttrREJ:
			f := REJFields{LocalCommID: 1, RemoteCommID: 2, Reason: RejTimeout, ARILength: 8}
			be.PutUint64(f.ARI[:], guidA)
			REJ(d).Encode(&f)
		}
		seeds = append(seeds, mad)
	}
	return seeds
}

// fuzzPair is a pair with a listener, one established connection and one
// pending request, so fuzzed MADs can hit live state.
func fuzzPair(t *testing.T) *pair {
	p := newPair(t, Options{})
	p.establish(t)
	p.b.m.Listen(0x0000000001111c06)
	p.a.m.Connect(p.connectOpts())
	p.a.take()
	return p
}

// FuzzMAD: the parser of every CM message never panics; whatever it accepts
// re-encodes from its Fields to the same bytes; and a Manager with live
// connections survives any MAD.
func FuzzMAD(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkMAD(t, b)
		// Most mutations change the length; also run the same bytes cut or
		// zero-padded to a MAD, so the message bodies get exercised.
		fit := make([]byte, MADSize)
		copy(fit, b)
		checkMAD(t, fit)
	})
}

func checkMAD(t *testing.T, b []byte) {
	{
		msg, err := Parse(b)
		if err == nil {
			if got := reencode(t, &msg); !bytes.Equal(got, b) {
				t.Fatalf("%v: re-encode differs\n got %x\nwant %x", msg.Attr, got, b)
			}
			switch {
			case msg.REQ != nil:
				if h, _, err := ParsePrivateData(msg.REQ.PrivateData()); err == nil {
					_, _ = h.Src(), h.Dst()
				}
				_, _ = msg.REQ.Primary().LocalGID(), msg.REQ.Alternate().RemoteGID()
			case msg.REJ != nil:
				_ = msg.REJ.ARI()
			case msg.SIDRReq != nil:
				ParsePrivateData(msg.SIDRReq.PrivateData())
			}
		}
		p := fuzzPair(t)
		p.b.m.HandleMAD(p.a.addr, b)
		p.a.m.HandleMAD(p.b.addr, b)
		p.flow(p.a, p.b)
		p.flow(p.b, p.a)
		p.clk.Advance(reqAttempt * 100)
	}
}

// TestParseAllocs: parsing a MAD and reading its fields allocates nothing.
func TestParseAllocs(t *testing.T) {
	mad := readCaptureMADs(t, "rping")[0].mad
	var sink uint64
	n := testing.AllocsPerRun(100, func() {
		msg, err := Parse(mad)
		if err != nil {
			t.Fatal(err)
		}
		sink += msg.REQ.ServiceID() + uint64(msg.REQ.LocalQPN()) + uint64(msg.REQ.Primary().FlowLabel())
		f := msg.REQ.Fields()
		sink += uint64(f.StartingPSN)
	})
	if n != 0 {
		t.Fatalf("%v allocations per parse", n)
	}
	_ = sink
}
