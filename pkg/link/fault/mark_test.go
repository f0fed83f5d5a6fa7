package fault

import (
	"testing"
	"time"

	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
)

// recvClasses receives n datagrams and returns their traffic classes.
func recvClasses(t *testing.T, l link.Link, n int) []uint8 {
	t.Helper()
	batch := make([]link.Datagram, n)
	for i := range batch {
		batch[i].Buf = make([]byte, link.MaxDatagram)
	}
	var out []uint8
	for len(out) < n {
		k, err := l.Recv(batch[:n-len(out)])
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range batch[:k] {
			out = append(out, d.TClass)
		}
	}
	return out
}

// TestMarkECN: Mark sets CE on ECN-capable datagrams only (RFC 3168 section 5: ECT(0) and ECT(1)
// become CE; not-ECT stays, CE stays), the DSCP bits untouched, on Send and on Recv, by
// probability and by rule; the class survives a delay and a reorder; Stats.Marked counts.
func TestMarkECN(t *testing.T) {
	classes := []uint8{link.ECNECT0, link.ECNECT1, link.ECNNotECT, link.ECNCE, 0xB8 | link.ECNECT0, 0x48}
	want := []uint8{link.ECNCE, link.ECNCE, link.ECNNotECT, link.ECNCE, 0xB8 | link.ECNCE, 0x48}
	for _, recv := range []bool{false, true} {
		a, b := memPair(t)
		o := Options{Seed1: 1, Seed2: 2}
		d := DirOptions{Mark: 1}
		if recv {
			o.Recv = d
		} else {
			o.Send = d
		}
		fa, fb := Wrap(a, o), Wrap(b, o)
		var out []link.Datagram
		for i, c := range classes {
			g := dg(pkt(t, bth.OpRCWriteOnly, 7, bth.PSN(i), 8))
			g.TClass = c
			out = append(out, g)
		}
		if err := fa.Send(out); err != nil {
			t.Fatal(err)
		}
		got := recvClasses(t, fb, len(classes))
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("recv %v: datagram %d sent %#x arrived %#x, want %#x", recv, i, classes[i], got[i], want[i])
			}
		}
		st := fa.Stats().Send.Marked + fb.Stats().Recv.Marked
		if st != 3 {
			t.Fatalf("recv %v: %d marked, want 3 (ECT(0), ECT(1), DSCP+ECT(0))", recv, st)
		}
		fa.Close()
		fb.Close()
	}

	// a rule marks the 2nd WRITE Only; a delay and a reorder keep each datagram's class
	a, b := memPair(t)
	clk := newManualClock()
	rule, err := ParseRule("mark:op=WRITE_ONLY:nth=2")
	if err != nil {
		t.Fatal(err)
	}
	reo, err := ParseRule("reorder:op=SEND_ONLY:hold=1")
	if err != nil {
		t.Fatal(err)
	}
	del, err := ParseRule("delay:op=ACK:delay=1ms")
	if err != nil {
		t.Fatal(err)
	}
	fa := Wrap(a, Options{Clock: clk, Send: DirOptions{Rules: []Rule{rule, reo, del}}})
	defer fa.Close()
	ops := []bth.Opcode{bth.OpRCWriteOnly, bth.OpRCWriteOnly, bth.OpRCSendOnly, bth.OpRCWriteOnly, bth.OpRCAck}
	var out []link.Datagram
	for i, op := range ops {
		g := dg(pkt(t, op, 7, bth.PSN(i), 8))
		g.TClass = 0x48 | link.ECNECT0
		if op == bth.OpRCSendOnly {
			g.TClass = 0xB8 | link.ECNECT1
		}
		out = append(out, g)
	}
	if err := fa.Send(out); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Millisecond)
	// order on the wire: WRITE, WRITE (marked), WRITE, SEND (reordered past the WRITE), ACK (delayed)
	got := recvClasses(t, b, len(ops))
	wantOrder := []uint8{0x48 | link.ECNECT0, 0x48 | link.ECNCE, 0x48 | link.ECNECT0, 0xB8 | link.ECNECT1, 0x48 | link.ECNECT0}
	for i := range wantOrder {
		if got[i] != wantOrder[i] {
			t.Fatalf("rules: datagram %d arrived with %#x, want %#x (all %x)", i, got[i], wantOrder[i], got)
		}
	}
	if s := fa.Stats().Send; s.Marked != 1 {
		t.Fatalf("rule marked %d", s.Marked)
	}
	if o, err := ParseDirOptions("mark=0.25,ce:op=ACK"); err != nil || o.Mark != 0.25 || o.Rules[0].Action != Mark ||
		o.String() != "mark=0.25,mark:op=ACKNOWLEDGE" {
		t.Fatalf("parse: %+v %v %q", o, err, o.String())
	}
}
