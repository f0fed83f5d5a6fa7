package fault

import (
	"reflect"
	"testing"
	"time"

	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
)

func FuzzParseRule(f *testing.F) {
	for _, s := range []string{"drop:op=READ_RESPONSE_MIDDLE:nth=3", "dup:op=ACK:psn=5", "corrupt:qpn=0x12:nth=1",
		"reorder:hold=2:delay=1ms", "delay:op=0x0c:delay=5ms", "drop=0.1,reorder=0.2,depth=3,jitter=1us,dup:psn=1",
		"region=anywhere;corrupt=1", "drop:op=", "::=="} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if r, err := ParseRule(s); err == nil {
			back, err := ParseRule(r.String())
			if err != nil || back != r {
				t.Fatalf("%q -> %q -> %+v %v", s, r.String(), back, err)
			}
		}
		if o, err := ParseDirOptions(s); err == nil {
			back, err := ParseDirOptions(o.String())
			if err != nil || !reflect.DeepEqual(back, o) {
				t.Fatalf("%q -> %q -> %+v %v", s, o.String(), back, err)
			}
		}
	})
}

// FuzzInjector pushes arbitrary datagrams (valid RoCE or not) through every fault with
// fuzzed options and rules: no panic, and the accounting adds up once the clock has released
// everything.
func FuzzInjector(f *testing.F) {
	seed := pkt(f, bth.OpRCReadRespMiddle, 0x12, 5, 32)
	f.Add(uint64(1), []byte{0x40, 0x40, 0x40, 0x40, 0x10, 3, 0, 0}, append([]byte{byte(len(seed))}, seed...))
	f.Add(uint64(7), []byte{0xFF, 0, 0x80, 0, 0xFF, 1, 2, 5}, []byte{3, 1, 2, 3, 0, 200})
	f.Fuzz(func(t *testing.T, s uint64, knobs []byte, data []byte) {
		k := make([]byte, 8)
		copy(k, knobs)
		p := func(b byte) float64 { return float64(b) / 255 }
		clk := newManualClock()
		c := &capture{}
		o := DirOptions{Drop: p(k[0]), Duplicate: p(k[1]), Corrupt: p(k[2]), Reorder: p(k[3]),
			ReorderDepth: int(k[5] % 5), CorruptRegion: CorruptRegion(k[6] % 3),
			Jitter: time.Duration(k[4]) * time.Microsecond, DuplicateDelay: time.Duration(k[7]) * time.Microsecond,
			Rules: []Rule{{Action: Action(1 + k[7]%5), Match: Match(k[6] % 8), Op: bth.Opcode(k[4]), PSN: bth.PSN(k[5]),
				QPN: uint32(k[3]), Nth: int(k[2] % 4), Delay: time.Duration(1+k[1]) * time.Microsecond}}}
		if o.Rules[0].Validate() != nil {
			o.Rules[0].Delay = 0 // keep rules that only lack a valid delay
		}
		fl := Wrap(c, Options{Seed1: s, Clock: AdaptClock(clk), OnEvent: func(Event) {}, Send: o})
		defer fl.Close()
		var batch []link.Datagram
		for len(data) > 0 {
			n := min(int(data[0]), len(data)-1)
			batch = append(batch, link.Datagram{Buf: data[1 : 1+n], Src: srcA, Dst: dstB})
			data = data[1+n:]
		}
		if err := fl.Send(batch); err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Hour)
		st := fl.Stats().Send
		if st.Seen != uint64(len(batch)) || st.Held != 0 || st.Delivered != st.Seen-st.Dropped+st.Duplicated ||
			uint64(c.count) != st.Delivered {
			t.Fatalf("stats %+v inner %d", st, c.count)
		}
	})
}
