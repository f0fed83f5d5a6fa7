package perftest

import (
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestLogs rebuilds each tool's stdout (testdata/*.log, copied from the lab's
// captures/logs) from the first separator to the end: banner, address lines
// from the captured key records, column header, result line and separator.
// For write/read/atomic BW the result line comes from the BW report captured
// on the wire (the client prints its own, the server prints the client's);
// for the other tests the measured numbers are read back from the log, so
// only the layout is checked.
func TestLogs(t *testing.T) {
	for _, c := range captures {
		_, cl, sv := load(t, c.name)
		for _, role := range []Role{Client, Server} {
			me, peer, dev := cl, sv, "rxe1"
			if role == Server {
				me, peer, dev = sv, cl, "rxe2"
			}
			raw, err := os.ReadFile(filepath.Join("testdata", c.name+"."+role.String()+".log"))
			if err != nil {
				t.Fatal(err)
			}
			log := string(raw)
			// The banner starts with the separator right before the title.
			// (READ and atomic tools print one more separator earlier, from
			// ctx_set_max_inline, with a message on stderr.)
			title := strings.Index(log, ResultLine+"                    ")
			if title < 0 {
				t.Fatalf("%s: no banner", c.name)
			}
			start := title
			if role == Server && !strings.HasSuffix(log[:start], WaitingBanner) {
				t.Errorf("%s server: no waiting banner before %q", c.name, log[:start])
			}
			b := Banner{Test: c.test, Role: role, Device: dev, QPs: 1, Transport: "IB", Connection: "RC",
				LinkType: "Ethernet", PCIeRelaxOrder: "ON", TXDepth: 5, RXDepth: 6, CQModeration: 5,
				MTU: MTU1024, GIDIndex: 1, OutReads: 128}
			if !c.test.BW() {
				b.TXDepth = 1
			}
			if c.test == WriteLat {
				b.PCIeRelaxOrder = "OFF"
			}
			if strings.Contains(c.name, "cas") {
				b.Atomic = "CMP_AND_SWAP"
			} else if strings.Contains(c.name, "faa") {
				b.Atomic = "FETCH_AND_ADD"
			}
			var want strings.Builder
			want.WriteString(b.String())
			want.WriteString(AddressLine(c.test, Local, me.records[0], true))
			want.WriteString(AddressLine(c.test, Remote, peer.records[0], true))
			want.WriteString(ResultLine)
			lines := strings.SplitAfter(log, "\n")
			resultLine := lines[len(lines)-3]
			noResults := role == Server && (c.test == ReadLat || c.test == AtomicLat)
			if noResults {
				// read_lat.c: the server closes the connection and prints
				// only the separator.
			} else if c.test.BW() {
				want.WriteString(BWHeader(false))
				if c.test.Send() {
					want.WriteString(FormatBW(parseBW(t, resultLine), nil, false))
				} else {
					want.WriteString(FormatBW(cl.report, nil, false))
				}
			} else {
				want.WriteString(HeaderLat)
				want.WriteString(FormatLat(parseLat(t, resultLine)))
			}
			if !noResults {
				want.WriteString(ResultLine)
			}
			if got := log[start:]; got != want.String() {
				t.Errorf("%s %v:\nlog:\n%s\nours:\n%s", c.name, role, got, want.String())
			}
		}
	}
}

func fields(t *testing.T, line string, n int) []float64 {
	t.Helper()
	f := strings.Fields(line)
	if len(f) != n {
		t.Fatalf("%q: %d fields", line, len(f))
	}
	v := make([]float64, n)
	for i, s := range f {
		x, err := strconv.ParseFloat(s, 64)
		if s == "-nan" { // glibc's spelling of a negative NaN (ib_send_lat.client.log)
			x, err = math.Copysign(math.NaN(), -1), nil
		}
		if err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		v[i] = x
	}
	return v
}

func parseBW(t *testing.T, line string) BWReport {
	v := fields(t, line, 5)
	return BWReport{Size: uint64(v[0]), Iters: uint64(v[1]), BWPeak: v[2], BWAvg: v[3], MsgRate: v[4]}
}

func parseLat(t *testing.T, line string) LatReport {
	v := fields(t, line, 9)
	return LatReport{Size: uint64(v[0]), Iters: uint64(v[1]), Min: v[2], Max: v[3], Typical: v[4], Avg: v[5],
		Stdev: v[6], Percent99: v[7], Percent999: v[8]}
}

// TestNewLatReport reproduces the ib_write_lat server's line from samples:
// 5 iterations give 4 samples; perftest drops the 2 largest, so t_typical is
// the mean of the 2 smallest, t_max and both percentiles are the third, and
// t_stdev is whole (deviations truncated to int: 81.65 -> 81).
func TestNewLatReport(t *testing.T) {
	us := func(v float64) time.Duration { return time.Duration(math.Round(v * 1000)) }
	// Half round trips 268.80, 432.10, 1240.82, 5000 usec (write latency: RTT/2).
	samples := []time.Duration{us(2 * 1240.82), us(2 * 268.80), us(2 * 5000), us(2 * 432.10)}
	r, err := NewLatReport(64, 5, samples, true)
	if err != nil {
		t.Fatal(err)
	}
	want := " 64      5          268.80         1240.82      350.45   \t       350.45      \t81.00  \t\t1240.82 \t\t1240.82\n"
	if got := FormatLat(r); got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
	// Whole round trips (read/atomic) are not halved; an odd count takes the middle value.
	r, err = NewLatReport(8, 6, []time.Duration{us(10), us(30), us(20), us(99), us(98)}, false)
	if err != nil || r.Typical != 20 || r.Min != 10 || r.Max != 98 || r.Avg != 20 || r.Stdev != math.Sqrt(200.0/3) {
		t.Fatalf("%+v %v", r, err)
	}
	if _, err := NewLatReport(1, 3, make([]time.Duration, 2), false); err == nil {
		t.Fatal("no error for 2 samples")
	}
}

func TestFormatBW(t *testing.T) {
	r := BWReport{Size: 65536, Iters: 5000, BWPeak: 11000.456, BWAvg: 10999.994, MsgRate: 0.1759999}
	want := " 65536      5000             11000.46            10999.99\t\t   0.176000\n"
	if got := FormatBW(r, nil, false); got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	// --report_gbits with a small average: REPORT_FMT_EXT, 6 decimals.
	small := BWReport{Size: 2, Iters: 1000, BWPeak: 0.05, BWAvg: 0.04, MsgRate: 2.5}
	want = " 2          1000           0.050000            0.040000            2.500000\n"
	if got := FormatBW(small, nil, true); got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	// Duplex: the remote's numbers are added.
	if got := FormatBW(small, &small, false); !strings.Contains(got, "0.10               0.08") {
		t.Errorf("sum: %q", got)
	}
	if BWHeader(true) != HeaderBWGbits || !strings.Contains(HeaderBWGbits, "BW peak[Gb/sec]    BW average[Gb/sec]") {
		t.Error("gbits header")
	}
}

func TestNewBWReport(t *testing.T) {
	r := NewBWReport(1<<20, 1000, time.Second, time.Millisecond/2, false)
	if r.BWAvg != 1000 || r.MsgRate != 0.001 || r.BWPeak != 2000 || r.Iters != 1000 {
		t.Fatalf("%+v", r)
	}
	g := NewBWReport(125000000, 8, 8*time.Second, 0, true)
	if g.BWAvg != 1 || g.BWPeak != 0 {
		t.Fatalf("%+v", g)
	}
}

func TestAltHexAndNaN(t *testing.T) {
	for _, c := range []struct {
		v     uint64
		width int
		want  string
	}{{0, 4, "0000"}, {0x17, 6, "0x0017"}, {0x583dc, 6, "0x583dc"}, {0x80, 4, "0x80"}, {0x5593f16ae000, 16, "0x005593f16ae000"}} {
		if got := altHex(c.v, c.width); got != c.want {
			t.Errorf("altHex(%#x, %d) = %q, want %q", c.v, c.width, got, c.want)
		}
	}
	if cf(math.Inf(1), 2) != "inf" || cf(math.NaN(), 2) != "nan" || cf(math.Copysign(math.NaN(), -1), 2) != "-nan" || cf(math.Inf(-1), 2) != "-inf" {
		t.Error("C spellings of inf/nan")
	}
}
