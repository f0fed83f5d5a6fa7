package pingpong

import (
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/oob/internal/capstream"
)

// TestLogLines reproduces the tools' stdout (testdata/*.log, copied from the
// lab's captures/logs) from the captured records and the measured time.
func TestLogLines(t *testing.T) {
	cases := []struct {
		name string
		tool Tool
		size int
	}{
		{"rc_pingpong", ToolRC, 3000},
		{"rc_pingpong_small", ToolRC, 64},
		{"uc_pingpong", ToolUC, 3000},
		{"ud_pingpong", ToolUD, 512},
		{"srq_pingpong", ToolSRQ, 64},
	}
	const iters = 2
	for _, c := range cases {
		s := load(t, c.name+".pcap")
		n := c.tool.Records()
		cl := records(t, s.Bytes(true), n, true)
		sv := records(t, s.Bytes(false), n, false)
		used := 1
		if c.tool == ToolSRQ {
			used = 2 // -q 2
		}
		for _, side := range []struct {
			log           string
			local, remote []Dest
		}{{"client", cl, sv}, {"server", sv, cl}} {
			raw, err := os.ReadFile(filepath.Join("testdata", c.name+"."+side.log+".log"))
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.SplitAfter(string(raw), "\n")
			var want strings.Builder
			for i := range used {
				want.WriteString(LocalLine(c.tool, side.local[i]))
			}
			for i := range used {
				want.WriteString(RemoteLine(side.remote[i]))
			}
			// The time comes from the log: usec/iter x iters, whole microseconds.
			iterLine := lines[2*used+1]
			f := strings.Fields(iterLine)
			perIter, err := strconv.ParseFloat(f[len(f)-2], 64)
			if err != nil {
				t.Fatalf("%s: %q", c.name, iterLine)
			}
			usec := math.Round(perIter * iters)
			want.WriteString(ResultLines(c.size, iters, time.Duration(usec)*time.Microsecond))
			if got := strings.Join(lines[:2*used+2], ""); got != want.String() {
				t.Errorf("%s %s:\n log  %q\n ours %q", c.name, side.log, got, want.String())
			}
		}
	}
}

func TestResultLinesEdge(t *testing.T) {
	if got, want := ResultLines(4096, 1000, 0), "8192000 bytes in 0.00 seconds = inf Mbit/sec\n1000 iters in 0.00 seconds = 0.00 usec/iter\n"; got != want {
		t.Errorf("zero time: %q, want %q", got, want)
	}
	// usec/iters is a single-precision division in the C code.
	got := ResultLines(1, 3, 1000001*time.Microsecond)
	if !strings.HasSuffix(got, "= 333333.66 usec/iter\n") {
		t.Errorf("float division: %q", got)
	}
}

func TestNtopGID(t *testing.T) {
	cases := map[string]string{
		"::ffff:198.19.0.1":    "::ffff:198.19.0.1",
		"::":                   "::",
		"::1":                  "::1",
		"::2":                  "::0.0.0.2", // glibc: 7 zero words and a last word other than 1
		"::1.2.3.4":            "::1.2.3.4",
		"fe80::5054:ff:fe18:2": "fe80::5054:ff:fe18:2",
		"2001:db8:198:18::1":   "2001:db8:198:18::1",
		"2001:db8::1:0:0:1":    "2001:db8::1:0:0:1",
	}
	for in, want := range cases {
		if got := NtopGID(netip.MustParseAddr(in).As16()); got != want {
			t.Errorf("NtopGID(%s) = %q, want %q", in, got, want)
		}
	}
	if got := LocalLine(ToolUD, Dest{QPN: 0x14, PSN: 0x31f37}); got != "  local address:  LID 0x0000, QPN 0x000014, PSN 0x031f37: GID ::\n" {
		t.Errorf("ud local line %q", got)
	}
}

// TestReplayDetectsDifference makes sure the replay harness can fail: a
// client that sends a different PSN than the capture is caught.
func TestReplayDetectsDifference(t *testing.T) {
	s := load(t, "rc_pingpong.pcap")
	local := records(t, s.Bytes(true), 1, true)
	local[0].PSN ^= 1
	ln := listen(t)
	errc := make(chan error, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			errc <- err
			return
		}
		defer conn.Close()
		errc <- s.Replay(conn, false, time.Second)
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.Write(local[0].Encode())
	err = <-errc
	c.Close()
	if _, ok := err.(*capstream.MismatchError); !ok {
		t.Fatalf("replay error %v, want a mismatch", err)
	}
}
