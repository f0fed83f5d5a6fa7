package perftest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/softroce/softroce/internal/oob"
	"github.com/softroce/softroce/internal/oob/internal/capstream"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var captures = []struct {
	name string
	test Test
}{
	{"ib_write_bw", WriteBW},
	{"ib_read_bw", ReadBW},
	{"ib_send_bw", SendBW},
	{"ib_atomic_bw_cas", AtomicBW},
	{"ib_atomic_bw_faa", AtomicBW},
	{"ib_write_lat", WriteLat},
	{"ib_read_lat", ReadLat},
	{"ib_send_lat", SendLat},
}

// rounds returns how many key records a side sends in Setup and in Finish
// (one QP), and whether Finish exchanges BW reports and "done".
func rounds(t Test) (setup, finish int, reports, done bool) {
	switch {
	case t == WriteLat:
		return 4, 0, false, false
	case t.Send():
		return 4, 1, false, true
	case t.BW():
		return 3, 2, true, true
	default: // read/atomic lat
		return 4, 1, false, true
	}
}

// side is one side's stream cut into its messages.
type side struct {
	version string
	sys     SysData
	mtu     MTU
	records []Dest
	report  BWReport
	raw     []byte
}

// split cuts a captured stream along the layout the source prescribes; the
// stream must have exactly the expected length.
func split(t *testing.T, b []byte, test Test) side {
	t.Helper()
	setup, finish, reports, done := rounds(test)
	want := VersionSize + 4 + 4 + 2 + (setup+finish)*RecordSize
	if reports {
		want += 5 * 8
	}
	if done {
		want += len(Done)
	}
	if len(b) != want {
		t.Fatalf("%v: stream of %d bytes, want %d", test, len(b), want)
	}
	s := side{raw: b, version: cstr(b[:16])}
	s.sys.CycleBuffer = int32(binary.BigEndian.Uint32(b[16:]))
	s.sys.CacheLine = int32(binary.BigEndian.Uint32(b[20:]))
	if b[25] != 0 {
		t.Fatalf("MTU message %q", b[24:26])
	}
	s.mtu = MTU(b[24] - '0')
	off := 26
	rec := func() {
		d, err := ParseRecord(b[off : off+RecordSize])
		if err != nil {
			t.Fatal(err)
		}
		if enc := d.AppendEncode(nil); !bytes.Equal(enc, b[off:off+RecordSize]) {
			t.Fatalf("record re-encodes to %q, captured %q", enc, b[off:off+RecordSize])
		}
		s.records = append(s.records, d)
		off += RecordSize
	}
	for range setup {
		rec()
	}
	if reports {
		rec()
		u := func(i int) uint64 { return binary.BigEndian.Uint64(b[off+8*i:]) }
		s.report = BWReport{Size: u(0), Iters: u(1), BWPeak: math.Float64frombits(u(2)),
			BWAvg: math.Float64frombits(u(3)), MsgRate: math.Float64frombits(u(4))}
		off += 40
		finish--
	}
	for range finish {
		rec()
	}
	if done && !bytes.Equal(b[off:], Done[:]) {
		t.Fatalf("stream ends with %q", b[off:])
	}
	for i, r := range s.records {
		if r != s.records[0] {
			t.Fatalf("record %d differs from the first: %+v", i, r)
		}
	}
	return s
}

func load(t *testing.T, name string) (*capstream.Script, side, side) {
	t.Helper()
	s, err := capstream.Load(name+".pcap", oob.DefaultPort, nil)
	if err != nil {
		t.Fatal(err)
	}
	var test Test
	for _, c := range captures {
		if c.name == name {
			test = c.test
		}
	}
	return s, split(t, s.Bytes(true), test), split(t, s.Bytes(false), test)
}

// TestCapturedLayout parses every message of every perftest capture and
// checks the values the capture notes and logs show.
func TestCapturedLayout(t *testing.T) {
	for _, c := range captures {
		_, cl, sv := load(t, c.name)
		for _, s := range []side{cl, sv} {
			if s.version != "6.06" || s.sys != DefaultSysData || s.mtu != MTU1024 {
				t.Errorf("%s: version %q sys %+v mtu %d", c.name, s.version, s.sys, s.mtu)
			}
			if s.records[0].GID[10] != 0xff || s.records[0].GID[12] != 198 {
				t.Errorf("%s: GID % x", c.name, s.records[0].GID)
			}
		}
		wantOut := uint16(0x80) // rxe's max_qp_rd_atom, asked by READ and atomic tests
		if c.test == WriteBW || c.test == WriteLat || c.test.Send() {
			wantOut = 1
		}
		if cl.records[0].OutReads != wantOut {
			t.Errorf("%s: out_reads %#x", c.name, cl.records[0].OutReads)
		}
		if c.test.BW() && !c.test.Send() {
			if cl.report.Iters != 5 {
				t.Errorf("%s: client report %+v", c.name, cl.report)
			}
		}
	}
	_, cl, sv := load(t, "ib_write_bw")
	want := Dest{OutReads: 1, QPN: 0x17, PSN: 0x0583dc, RKey: 0x78c, VAddr: 0x5593f16ae000, GID: [16]byte{10: 0xff, 11: 0xff, 12: 198, 13: 19, 15: 1}}
	if cl.records[0] != want {
		t.Errorf("ib_write_bw client record %+v", cl.records[0])
	}
	if cl.report.Size != 3000 || sv.records[0].PSN != 0x7bc628 {
		t.Errorf("ib_write_bw: %+v %+v", cl.report, sv.records[0])
	}
}

// run drives one side through Setup and Finish with the captured values.
func run(ctx context.Context, c *Conn, test Test, me, peer side) error {
	sess, err := c.Setup(ctx, &Setup{
		Test: test, SysData: me.sys, MTU: me.mtu, Local: me.records[:1],
		Connect: func(remote []Dest, mtu MTU) error {
			if len(remote) != 1 || remote[0] != peer.records[0] || mtu != MTU1024 {
				return errors.New("Connect got the wrong remote records or MTU")
			}
			return nil
		},
	})
	if err != nil {
		return err
	}
	if sess.RemoteVersion != peer.version || sess.MTU != MTU1024 || sess.SysData != DefaultSysData {
		return errors.New("wrong session values")
	}
	rem, err := c.Finish(ctx, test, &me.records[0], me.report)
	if err != nil {
		return err
	}
	// Bit-exact: the server's "report" is garbage that may not be a number.
	if math.Float64bits(rem.BWAvg) != math.Float64bits(peer.report.BWAvg) || rem.Size != peer.report.Size || rem.Iters != peer.report.Iters {
		return errors.New("wrong remote report")
	}
	return nil
}

// TestClientReplay: our client against a fake server replaying the captured
// server bytes must send exactly the captured client bytes.
func TestClientReplay(t *testing.T) {
	for _, c := range captures {
		t.Run(c.name, func(t *testing.T) {
			s, cl, sv := load(t, c.name)
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
			conn, err := Dial(context.Background(), ln.Addr().String(), Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if err := run(context.Background(), conn, c.test, cl, sv); err != nil {
				t.Fatal(err)
			}
			if c.test == WriteLat {
				conn.Close()
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestServerReplay: our server against a fake client replaying the captured
// client bytes must send exactly the captured server bytes (the server's BW
// "report" is the uninitialised memory the real server sent, reproduced bit
// for bit).
func TestServerReplay(t *testing.T) {
	for _, c := range captures {
		t.Run(c.name, func(t *testing.T) {
			s, cl, sv := load(t, c.name)
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
			conn, err := Accept(context.Background(), ln, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if err := run(context.Background(), conn, c.test, sv, cl); err != nil {
				t.Fatal(err)
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestOurClientOurServer runs every test's flow between the two roles of
// this package with 3 QPs, per-port reports and BeforeSync.
func TestOurClientOurServer(t *testing.T) {
	for _, c := range captures {
		t.Run(c.test.String(), func(t *testing.T) {
			ln := listen(t)
			mk := func(base uint32) []Dest {
				return []Dest{{QPN: base, PSN: 1}, {QPN: base + 1, PSN: 2}, {QPN: base + 2, PSN: 3, RKey: 9, VAddr: 1 << 40}}
			}
			o := Options{PerPortReport: true}
			type result struct {
				sess   *Session
				rep    BWReport
				synced bool
				err    error
			}
			side := func(conn *Conn, local []Dest, mtu MTU, rep BWReport) result {
				var r result
				connected := false
				r.sess, r.err = conn.Setup(context.Background(), &Setup{Test: c.test, MTU: mtu, Local: local,
					SysData:    SysData{CycleBuffer: 8192, CacheLine: 64},
					Connect:    func([]Dest, MTU) error { connected = true; return nil },
					BeforeSync: func() error { r.synced = connected; return nil },
				})
				if r.err == nil {
					r.rep, r.err = conn.Finish(context.Background(), c.test, &local[0], rep)
				}
				conn.Close()
				return r
			}
			srv := make(chan result, 1)
			go func() {
				conn, err := Accept(context.Background(), ln, o)
				if err != nil {
					srv <- result{err: err}
					return
				}
				srv <- side(conn, mk(100), MTU4096, BWReport{Size: 1})
			}()
			conn, err := Dial(context.Background(), ln.Addr().String(), o)
			if err != nil {
				t.Fatal(err)
			}
			crep := BWReport{Size: 4096, Iters: 15, BWPeak: 1.5, BWAvg: 1.25, MsgRate: 0.5, BWAvgP1: 1, MsgRateP1: 2, BWAvgP2: 3, MsgRateP2: -4}
			cr := side(conn, mk(200), MTU1024, crep)
			sr := <-srv
			if cr.err != nil || sr.err != nil {
				t.Fatalf("client %v, server %v", cr.err, sr.err)
			}
			if cr.sess.MTU != MTU1024 || sr.sess.MTU != MTU1024 || cr.sess.SysData.CycleBuffer != 8192 {
				t.Errorf("sessions %+v %+v", cr.sess, sr.sess)
			}
			if len(sr.sess.Remote) != 3 || sr.sess.Remote[2] != mk(200)[2] || cr.sess.Remote[0] != mk(100)[0] {
				t.Errorf("remote records %+v / %+v", sr.sess.Remote, cr.sess.Remote)
			}
			if !cr.synced || !sr.synced {
				t.Errorf("BeforeSync ran before Connect")
			}
			if c.test.BW() && !c.test.Send() && (sr.rep != crep || cr.rep.Size != 1) {
				t.Errorf("reports: server got %+v, client got %+v", sr.rep, cr.rep)
			}
		})
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

// fakeServer accepts one connection and runs f on it.
func fakeServer(t *testing.T, f func(c net.Conn)) string {
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

func version(v string) []byte {
	b := make([]byte, VersionSize)
	copy(b, v)
	return b
}

func TestVersionMismatch(t *testing.T) {
	addr := fakeServer(t, func(c net.Conn) {
		c.Read(make([]byte, VersionSize))
		c.Write(version("5.60"))
	})
	conn, err := Dial(context.Background(), addr, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = conn.Setup(context.Background(), &Setup{Local: []Dest{{}}, Connect: func([]Dest, MTU) error { return nil }, MTU: MTU1024})
	var ve *VersionError
	if !errors.As(err, &ve) || !errors.Is(err, ErrVersion) || ve.Remote != "5.60" {
		t.Fatalf("err = %v", err)
	}
	if want := `perftest: peer perftest version "5.60", expected 6.06 (compatible: >= 5.70)`; err.Error() != want {
		t.Fatalf("message %q, want %q", err.Error(), want)
	}
}

func TestAtof(t *testing.T) {
	for in, want := range map[string]float64{"6.06": 6.06, "5.70": 5.7, "6.10-beta": 6.1, "": 0, "x": 0, "7": 7, "5.7.1": 5.7} {
		if got := atof(in); got != want {
			t.Errorf("atof(%q) = %v, want %v", in, got, want)
		}
	}
}

func TestMTUExchange(t *testing.T) {
	cases := []struct {
		mine   MTU
		peer   string
		agreed MTU
		remote int
	}{
		{MTU1024, "3\x00", MTU1024, 3},
		{MTU4096, "2\x00", MTU512, 2},
		{MTU256, "5\x00", MTU256, 5},
		{MTU1024, "9\x00", MTU1024, 9}, // invalid remote: ignored, as check_mtu does
		{MTU1024, "x\x00", MTU1024, 0},
	}
	for _, tc := range cases {
		addr := fakeServer(t, func(c net.Conn) {
			c.Read(make([]byte, 2))
			c.Write([]byte(tc.peer))
		})
		conn, err := Dial(context.Background(), addr, Options{})
		if err != nil {
			t.Fatal(err)
		}
		agreed, remote, err := conn.ExchangeMTU(context.Background(), tc.mine)
		conn.Close()
		if err != nil || agreed != tc.agreed || remote != tc.remote {
			t.Errorf("%+v: agreed %d remote %d err %v", tc, agreed, remote, err)
		}
	}
	if _, _, err := (&Conn{}).ExchangeMTU(context.Background(), 6); !errors.Is(err, ErrMTU) {
		t.Errorf("invalid local MTU: %v", err)
	}
	if MTUFromBytes(2048) != MTU2048 || MTUFromBytes(1000) != 0 || MTU(0).Bytes() != 0 {
		t.Error("MTU conversions")
	}
}

// pastClock makes every step deadline already expired: timeouts without waiting.
func pastClock() time.Time { return time.Unix(1000, 0) }

func TestSilentPeerTimesOut(t *testing.T) {
	hold := make(chan struct{})
	addr := fakeServer(t, func(c net.Conn) { <-hold })
	defer close(hold)
	conn, err := Dial(context.Background(), addr, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.s = oob.NewStream(conn.s.Conn(), oob.Options{Now: pastClock})
	_, err = conn.ExchangeVersion(context.Background())
	if !errors.Is(err, oob.ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	// And with the real clock and a short bound.
	conn.s = oob.NewStream(conn.s.Conn(), oob.Options{Timeout: 20 * time.Millisecond})
	if _, err := conn.HandShake(context.Background(), &Dest{}); !errors.Is(err, oob.ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
}

func TestServerSilentClient(t *testing.T) {
	ln := listen(t)
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	conn, err := Accept(context.Background(), ln, Options{Options: oob.Options{Now: pastClock}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExchangeVersion(context.Background()); !errors.Is(err, oob.ErrTimeout) {
		t.Fatalf("err = %v", err)
	}
}

func TestAcceptCanceled(t *testing.T) {
	ln := listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := Accept(ctx, ln, Options{})
		errc <- err
	}()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
}

func TestPeerErrors(t *testing.T) {
	rec := (&Dest{QPN: 1}).AppendEncode(nil)
	setupUpToRecords := func(c net.Conn) {
		c.Read(make([]byte, VersionSize))
		c.Write(version("6.06"))
		for _, n := range []int{4, 4, 2} {
			b := make([]byte, n)
			c.Read(b)
			c.Write(b)
		}
		c.Read(make([]byte, RecordSize))
	}
	cases := []struct {
		name string
		f    func(c net.Conn)
		want error
	}{
		{"closes after version", func(c net.Conn) { c.Read(make([]byte, VersionSize)) }, oob.ErrPeerClosed},
		{"short record", func(c net.Conn) { setupUpToRecords(c); c.Write(rec[:50]) }, oob.ErrPeerClosed},
		{"garbage record", func(c net.Conn) { setupUpToRecords(c); c.Write(bytes.Repeat([]byte("z"), RecordSize)) }, ErrRecord},
		{"record changes", func(c net.Conn) {
			setupUpToRecords(c)
			c.Write(rec)
			c.Read(make([]byte, RecordSize))
			c.Write((&Dest{QPN: 2}).AppendEncode(nil))
		}, ErrRemoteChanged},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			addr := fakeServer(t, tc.f)
			conn, err := Dial(context.Background(), addr, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_, err = conn.Setup(context.Background(), &Setup{Test: WriteBW, MTU: MTU1024, Local: []Dest{{QPN: 7}},
				Connect: func([]Dest, MTU) error { return nil }})
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
	if _, err := (&Conn{}).Setup(context.Background(), &Setup{}); !errors.Is(err, ErrSetup) {
		t.Errorf("empty Setup: %v", err)
	}
}

func TestRecordNoGID(t *testing.T) {
	d := Dest{LID: 0x12, OutReads: 0x80, QPN: 0x123456, PSN: 0xabcdef, RKey: 0xdeadbeef, VAddr: 0x7f0000001000, SRQN: 5}
	b := d.AppendEncodeNoGID(nil)
	if want := "0012:0080:123456:abcdef:deadbeef:00007f0000001000:00000005\x00"; string(b) != want || len(b) != RecordSizeNoGID {
		t.Fatalf("%q", b)
	}
	got, err := ParseRecordNoGID(b)
	if err != nil || got != d {
		t.Fatalf("%+v %v", got, err)
	}
	// Both sides of a NoGID exchange.
	ln := listen(t)
	errc := make(chan error, 1)
	go func() {
		conn, err := Accept(context.Background(), ln, Options{NoGID: true})
		if err == nil {
			_, err = conn.HandShake(context.Background(), &Dest{QPN: 3})
			conn.Close()
		}
		errc <- err
	}()
	conn, err := Dial(context.Background(), ln.Addr().String(), Options{NoGID: true})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rem, err := conn.HandShake(context.Background(), &d)
	if err != nil || rem.QPN != 3 {
		t.Fatalf("%+v %v", rem, err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func TestParseRecord(t *testing.T) {
	good := "0000:0001:000017:0583dc:0000078c:00005593f16ae000:00:00:00:00:00:00:00:00:00:00:ff:ff:c6:13:00:01:00000000:\x00"
	if len(good) != RecordSize {
		t.Fatalf("len %d", len(good))
	}
	d, err := ParseRecord([]byte(good))
	if err != nil || d.QPN != 0x17 || d.GID[15] != 1 {
		t.Fatalf("%+v %v", d, err)
	}
	bad := []string{
		"",
		strings.Replace(good, "0583dc", "1000000", 1),             // PSN > 24 bits
		strings.Replace(good, "0000:0001", "10000:0001", 1),       // LID > 16 bits
		strings.Replace(good, ":ff:ff:", ":fff:ff:", 1),           // GID byte > 8 bits
		strings.Replace(good, "00000000:\x00", "00000000\x00", 1), // no trailing colon
		strings.Replace(good, ":c6:13", ":c6::13", 1),
		strings.Replace(good, "0000078c", "0000078g", 1),
		good[:60],
		strings.Replace(good, "00005593f16ae000", "100005593f16ae000", 1), // 17 digits
	}
	for _, in := range bad {
		if _, err := ParseRecord([]byte(in)); !errors.Is(err, ErrRecord) || !errors.Is(err, oob.ErrMalformed) {
			t.Errorf("ParseRecord(%q): %v", in, err)
		}
	}
	if _, err := ParseRecordNoGID([]byte("1:2:3")); !errors.Is(err, ErrRecord) {
		t.Errorf("no-GID short: %v", err)
	}
	buf := make([]byte, 0, RecordSize)
	if n := testing.AllocsPerRun(100, func() { buf = d.AppendEncode(buf[:0]) }); n != 0 {
		t.Errorf("AppendEncode allocates %v", n)
	}
}

func FuzzParseRecord(f *testing.F) {
	f.Add([]byte("0000:0001:000017:0583dc:0000078c:00005593f16ae000:00:00:00:00:00:00:00:00:00:00:ff:ff:c6:13:00:01:00000000:\x00"))
	f.Add([]byte("0:0:0:0:0:0:0:0:0:0:0:0:0:0:0:0:0:0:0:0:0:0:0:"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if d, err := ParseRecord(b); err == nil {
			if d2, err := ParseRecord(d.AppendEncode(nil)); err != nil || d2 != d {
				t.Fatalf("round trip %+v -> %+v %v", d, d2, err)
			}
		}
		if d, err := ParseRecordNoGID(b); err == nil {
			if d2, err := ParseRecordNoGID(d.AppendEncodeNoGID(nil)); err != nil || d2 != d {
				t.Fatalf("round trip %+v -> %+v %v", d, d2, err)
			}
		}
	})
}

// TestFinishWaitsForMeasurement: the first round of Finish is not bounded by
// the per-step timeout (the peer may be measuring for minutes), only by
// FinishTimeout and the context.
func TestFinishWaitsForMeasurement(t *testing.T) {
	for _, tc := range []struct {
		name   string
		finish time.Duration
		want   error
	}{
		{"unbounded", 0, context.Canceled},
		{"bounded", 20 * time.Millisecond, oob.ErrTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln := listen(t)
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			// Every ordinary step would time out at once (fake clock in the past).
			conn, err := Accept(context.Background(), ln, Options{Options: oob.Options{Now: pastClock}, FinishTimeout: tc.finish})
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() {
				_, err := conn.Finish(ctx, WriteBW, &Dest{}, BWReport{})
				errc <- err
			}()
			if tc.want == context.Canceled {
				// Still waiting after a real step would have expired: prove it
				// by a read on the client side that sees nothing.
				c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
				if n, _ := c.Read(make([]byte, 1)); n != 0 {
					t.Fatal("server sent something")
				}
				cancel()
			}
			if err := <-errc; !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			cancel()
		})
	}
}
