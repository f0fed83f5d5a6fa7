package pingpong

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/softroce/softroce/internal/oob"
	"github.com/softroce/softroce/internal/oob/internal/capstream"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// zeroRecord is what srq_pingpong sends for an unused QP.
var zeroRecord = []byte("0000:000000:000000:00000000000000000000000000000000\x00")

// srqFill reconstructs the server segment srq_pingpong.pcap lacks (stream
// bytes 833..2549, inside the unused records 16..48): zero records.
func srqFill(_ bool, off, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = zeroRecord[(off+i)%RecordSize]
	}
	return b
}

func load(t *testing.T, name string) *capstream.Script {
	t.Helper()
	s, err := capstream.Load(name, oob.DefaultPort, srqFill)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// records parses a side's stream: n records, then "done\0" from the client.
func records(t *testing.T, b []byte, n int, client bool) []Dest {
	t.Helper()
	want := n * RecordSize
	if client {
		want += len(Done)
	}
	if len(b) != want {
		t.Fatalf("stream of %d bytes, want %d", len(b), want)
	}
	if client && !bytes.Equal(b[n*RecordSize:], Done[:]) {
		t.Fatalf("client's last bytes %q, want done\\0", b[n*RecordSize:])
	}
	out := make([]Dest, n)
	for i := range out {
		rec := b[i*RecordSize : (i+1)*RecordSize]
		d, err := Parse(rec)
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if enc := d.Encode(); !bytes.Equal(enc, rec) {
			t.Fatalf("record %d re-encodes to %q, captured %q", i, enc, rec)
		}
		out[i] = d
	}
	return out
}

var captures = []struct {
	file string
	tool Tool
}{
	{"rc_pingpong.pcap", ToolRC},
	{"rc_pingpong_small.pcap", ToolRC},
	{"uc_pingpong.pcap", ToolUC},
	{"ud_pingpong.pcap", ToolUD},
	{"srq_pingpong.pcap", ToolSRQ},
	{"guest-to-host-rc.pcap", ToolRC},
	{"host-to-guest-rc.pcap", ToolRC},
}

// TestParseCaptured parses every record of every capture and checks the
// fields against the capture notes and the tools' logs.
func TestParseCaptured(t *testing.T) {
	for _, c := range captures {
		s := load(t, c.file)
		cl := records(t, s.Bytes(true), c.tool.Records(), true)
		sv := records(t, s.Bytes(false), c.tool.Records(), false)
		if c.tool == ToolSRQ {
			for i := 2; i < SRQRecords; i++ {
				if cl[i] != (Dest{}) || sv[i] != (Dest{}) {
					t.Errorf("srq record %d not zero: %+v %+v", i, cl[i], sv[i])
				}
			}
		}
	}
	s := load(t, "rc_pingpong.pcap")
	cl := records(t, s.Bytes(true), 1, true)[0]
	sv := records(t, s.Bytes(false), 1, false)[0]
	wantCl := Dest{QPN: 0x11, PSN: 0xfe2570, GID: netip.MustParseAddr("::ffff:198.19.0.1").As16()}
	wantSv := Dest{QPN: 0x11, PSN: 0x8b8257, GID: netip.MustParseAddr("::ffff:198.19.0.2").As16()}
	if cl != wantCl || sv != wantSv {
		t.Errorf("rc_pingpong: client %+v server %+v", cl, sv)
	}
	s = load(t, "srq_pingpong.pcap")
	srq := records(t, s.Bytes(true), SRQRecords, true)
	if srq[0].QPN != 0x15 || srq[0].PSN != 0x77769a || srq[1].QPN != 0x16 || srq[1].PSN != 0x2b457c {
		t.Errorf("srq client records %+v %+v", srq[0], srq[1])
	}
}

// replayClient runs our client against a fake server replaying the captured
// server bytes; our client must send exactly the captured client bytes.
func TestClientReplay(t *testing.T) {
	for _, c := range captures {
		t.Run(c.file, func(t *testing.T) {
			s := load(t, c.file)
			n := c.tool.Records()
			local := records(t, s.Bytes(true), n, true)
			wantRemote := records(t, s.Bytes(false), n, false)
			if c.tool == ToolSRQ {
				local = local[:2] // the tool pads with zero records itself
			}
			ln := listen(t)
			errc := make(chan error, 1)
			go func() {
				conn, err := ln.Accept()
				if err != nil {
					errc <- err
					return
				}
				defer conn.Close()
				errc <- s.Replay(conn, false, 5*time.Second)
			}()
			remote, err := Dial(context.Background(), ln.Addr().String(), local, Options{Records: n})
			if err != nil {
				t.Fatal(err)
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			if len(remote) != n {
				t.Fatalf("%d remote records, want %d", len(remote), n)
			}
			for i := range remote {
				if remote[i] != wantRemote[i] {
					t.Fatalf("remote %d = %+v, want %+v", i, remote[i], wantRemote[i])
				}
			}
		})
	}
}

// TestServerReplay runs our server against a fake client replaying the
// captured client bytes; our server must send exactly the captured server
// bytes, and see the client's records before it answers.
func TestServerReplay(t *testing.T) {
	for _, c := range captures {
		t.Run(c.file, func(t *testing.T) {
			s := load(t, c.file)
			n := c.tool.Records()
			wantRemote := records(t, s.Bytes(true), n, true)
			local := records(t, s.Bytes(false), n, false)
			ln := listen(t)
			errc := make(chan error, 1)
			go func() {
				conn, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					errc <- err
					return
				}
				defer conn.Close()
				errc <- s.Replay(conn, true, 5*time.Second)
			}()
			var seen []Dest
			remote, err := Serve(context.Background(), ln, Options{Records: n}, func(r []Dest) ([]Dest, error) {
				seen = append([]Dest(nil), r...)
				return local, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			for i := range wantRemote {
				if remote[i] != wantRemote[i] || seen[i] != wantRemote[i] {
					t.Fatalf("remote %d = %+v (callback saw %+v), want %+v", i, remote[i], seen[i], wantRemote[i])
				}
			}
		})
	}
}

// TestOurClientOurServer: both sides of this package, srq-sized.
func TestOurClientOurServer(t *testing.T) {
	ln := listen(t)
	cl := []Dest{{QPN: 1, PSN: 2, GID: netip.MustParseAddr("2001:db8::1").As16()}, {LID: 7, QPN: 0xFFFFFF, PSN: 0xABCDEF}}
	sv := []Dest{{QPN: 3, PSN: 4}}
	type res struct {
		d   []Dest
		err error
	}
	done := make(chan res, 1)
	go func() {
		d, err := Serve(context.Background(), ln, Options{Records: SRQRecords}, func([]Dest) ([]Dest, error) { return sv, nil })
		done <- res{d, err}
	}()
	got, err := Dial(context.Background(), ln.Addr().String(), cl, Options{Records: SRQRecords})
	if err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if got[0] != sv[0] || got[1] != (Dest{}) || r.d[0] != cl[0] || r.d[1] != cl[1] || len(got) != SRQRecords {
		t.Fatalf("client got %+v..., server got %+v...", got[:2], r.d[:2])
	}
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// peer accepts one connection and runs f on it.
func peer(t *testing.T, f func(c net.Conn)) string {
	t.Helper()
	ln := listen(t)
	fin := make(chan struct{})
	go func() {
		defer close(fin)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		f(c)
	}()
	t.Cleanup(func() { ln.Close(); <-fin })
	return ln.Addr().String()
}

// pastClock is a fake clock far behind: every step deadline is already over.
func pastClock() time.Time { return time.Unix(1000, 0) }

func TestSilentServerTimesOut(t *testing.T) {
	hold := make(chan struct{})
	addr := peer(t, func(c net.Conn) { <-hold })
	defer close(hold)
	c, err := oob.Dial(context.Background(), addr, oob.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The write fits in the socket buffer, the read of the reply times out.
	// With the fake clock the deadline is in the past: no waiting.
	_, err = Client(context.Background(), c, []Dest{{QPN: 1}}, Options{Options: oob.Options{Now: pastClock}})
	if !errors.Is(err, oob.ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	var se *oob.StepError
	if !errors.As(err, &se) || se.Step != "send local address" && se.Step != "read remote address" {
		t.Fatalf("err = %#v", err)
	}
}

func TestSilentServerRealTimeout(t *testing.T) {
	hold := make(chan struct{})
	addr := peer(t, func(c net.Conn) { <-hold })
	defer close(hold)
	start := time.Now()
	_, err := Dial(context.Background(), addr, []Dest{{QPN: 1}}, Options{Options: oob.Options{Timeout: 30 * time.Millisecond}})
	if !errors.Is(err, oob.ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	var se *oob.StepError
	if !errors.As(err, &se) || se.Step != "read remote address" {
		t.Fatalf("err = %v, want a timeout reading the remote address", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %v", d)
	}
}

func TestContextCancel(t *testing.T) {
	hold := make(chan struct{})
	addr := peer(t, func(c net.Conn) { <-hold })
	defer close(hold)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := Dial(ctx, addr, []Dest{{QPN: 1}}, Options{Options: oob.Options{Timeout: -1}})
		errc <- err
	}()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestPeerErrors(t *testing.T) {
	good := (&Dest{QPN: 9}).Encode()
	cases := []struct {
		name  string
		serve func(c net.Conn)
		want  error
	}{
		{"closes", func(c net.Conn) { c.Read(make([]byte, RecordSize)) }, oob.ErrPeerClosed},
		{"short reply", func(c net.Conn) { c.Read(make([]byte, RecordSize)); c.Write(good[:20]) }, oob.ErrPeerClosed},
		{"garbage", func(c net.Conn) {
			c.Read(make([]byte, RecordSize))
			c.Write(bytes.Repeat([]byte{'x'}, RecordSize))
		}, ErrRecord},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			addr := peer(t, tc.serve)
			_, err := Dial(context.Background(), addr, []Dest{{QPN: 1}}, Options{})
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestServerBadDone(t *testing.T) {
	ln := listen(t)
	errc := make(chan error, 1)
	go func() {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			errc <- err
			return
		}
		defer c.Close()
		c.Write((&Dest{QPN: 5}).Encode())
		c.Read(make([]byte, RecordSize))
		c.Write([]byte("DONE\x00"))
		errc <- nil
	}()
	_, err := Serve(context.Background(), ln, Options{}, func([]Dest) ([]Dest, error) { return []Dest{{QPN: 6}}, nil })
	if !errors.Is(err, ErrBadDone) || !errors.Is(err, oob.ErrMalformed) {
		t.Fatalf("err = %v, want ErrBadDone", err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func TestServerCallbackError(t *testing.T) {
	ln := listen(t)
	go func() {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err == nil {
			c.Write((&Dest{QPN: 5}).Encode())
			c.Read(make([]byte, 1))
			c.Close()
		}
	}()
	boom := errors.New("boom")
	_, err := Serve(context.Background(), ln, Options{}, func([]Dest) ([]Dest, error) { return nil, boom })
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v", err)
	}
}

func TestTooMany(t *testing.T) {
	_, err := Client(context.Background(), nil, make([]Dest, 2), Options{})
	if !errors.Is(err, ErrTooMany) {
		t.Fatalf("err = %v", err)
	}
}

func TestParse(t *testing.T) {
	ok := []struct {
		in   string
		want Dest
	}{
		{"0000:000011:fe2570:00000000000000000000ffffc6130001\x00", Dest{QPN: 0x11, PSN: 0xfe2570, GID: netip.MustParseAddr("::ffff:198.19.0.1").As16()}},
		// sscanf("%x") takes any width and upper case.
		{"1:AB:0:FE800000000000000000000000000001", Dest{LID: 1, QPN: 0xab, GID: netip.MustParseAddr("fe80::1").As16()}},
		{"ffff:ffffff:ffffff:ffffffffffffffffffffffffffffffff\x00trailing", Dest{LID: 0xffff, QPN: 0xffffff, PSN: 0xffffff, GID: [16]byte{0: 0xff, 1: 0xff, 2: 0xff, 3: 0xff, 4: 0xff, 5: 0xff, 6: 0xff, 7: 0xff, 8: 0xff, 9: 0xff, 10: 0xff, 11: 0xff, 12: 0xff, 13: 0xff, 14: 0xff, 15: 0xff}}},
	}
	for _, c := range ok {
		d, err := Parse([]byte(c.in))
		if err != nil || d != c.want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", c.in, d, err, c.want)
		}
	}
	bad := []string{
		"",
		"\x00",
		"0000:000011:fe2570",
		"0000:000011:fe2570:",
		"0000:000011:fe2570:00000000000000000000ffffc613000",   // 31 digits
		"0000:000011:fe2570:00000000000000000000ffffc61300011", // 33
		"0000:000011:fe2570:00000000000000000000ffffc613000g",
		"10000:000011:fe2570:00000000000000000000ffffc6130001", // LID > 16 bits
		"0000:1000000:fe2570:00000000000000000000ffffc6130001", // QPN > 24 bits
		"0000:000011:123456789:00000000000000000000ffffc6130001",
		"0000::fe2570:00000000000000000000ffffc6130001",
		"0000;000011;fe2570;00000000000000000000ffffc6130001",
		"-1:000011:fe2570:00000000000000000000ffffc6130001",
	}
	for _, in := range bad {
		if d, err := Parse([]byte(in)); !errors.Is(err, ErrRecord) || !errors.Is(err, oob.ErrMalformed) {
			t.Errorf("Parse(%q) = %+v, %v; want ErrRecord", in, d, err)
		}
	}
}

func TestEncodeMasksAndNoAlloc(t *testing.T) {
	d := Dest{LID: 0xBEEF, QPN: 0x1ABCDEF, PSN: 0xFF123456, GID: [16]byte{15: 1}}
	if got, want := string(d.Encode()), "beef:abcdef:123456:00000000000000000000000000000001\x00"; got != want {
		t.Fatalf("Encode = %q, want %q", got, want)
	}
	buf := make([]byte, 0, RecordSize)
	if n := testing.AllocsPerRun(100, func() { buf = d.AppendEncode(buf[:0]) }); n != 0 {
		t.Fatalf("AppendEncode allocates %v times", n)
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = Parse(buf) }); n != 0 {
		t.Fatalf("Parse allocates %v times", n)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("0000:000011:fe2570:00000000000000000000ffffc6130001\x00"))
	f.Add([]byte("1:2:3:fe800000000000000000000000000001"))
	f.Add(zeroRecord)
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := Parse(b)
		if err != nil {
			return
		}
		// Whatever parses re-encodes to a record that parses to the same.
		d2, err := Parse(d.Encode())
		if err != nil || d2 != d {
			t.Fatalf("round trip %+v -> %+v, %v", d, d2, err)
		}
	})
}
