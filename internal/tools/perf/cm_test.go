package perf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/oob/perftest"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/internal/rocetest"
	"github.com/softroce/softroce/internal/tools/tooltest"
	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/roce"
)

// TestPerfCMRecord: the binary key record of -R has perftest's layout (struct pingpong_dest
// on x86-64, big-endian fields) and reads back.
func TestPerfCMRecord(t *testing.T) {
	d := perftest.Dest{OutReads: 128, QPN: 0x123456, PSN: 0xabcdef, RKey: 0xdeadbeef, VAddr: 0x7f5a00001000}
	d.SetAddr(netip.MustParseAddr("198.18.0.2"))
	var b [perfCMRecordSize + 4]byte
	for i := range b {
		b[i] = 0xee
	}
	encodeCMRecord(b[:], &d, 1)
	want := map[int]uint32{0: 0, 4: 128, 8: 0x123456, 12: 0xabcdef, 16: 0xdeadbeef, 20: 0, 48: 0, 52: 1}
	for off, v := range want {
		if got := binary.BigEndian.Uint32(b[off:]); got != v {
			t.Errorf("offset %d: %#x, want %#x", off, got, v)
		}
	}
	if got := binary.BigEndian.Uint64(b[24:]); got != d.VAddr {
		t.Errorf("vaddr %#x", got)
	}
	if !bytes.Equal(b[32:48], []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 18, 0, 2}) {
		t.Errorf("gid % x", b[32:48])
	}
	if b[perfCMRecordSize] != 0xee {
		t.Error("wrote past the record")
	}
	got, err := parseCMRecord(b[:perfCMRecordSize])
	if err != nil || got != d {
		t.Errorf("parse: %+v %v, want %+v", got, err, d)
	}
	if _, err := parseCMRecord(b[:perfCMRecordSize-1]); !errors.Is(err, errPerfPeer) {
		t.Errorf("short record: %v", err)
	}
	// a peer's garbage in the 24-bit fields is masked, never trusted as is
	b[8] = 0xff
	if got, _ := parseCMRecord(b[:perfCMRecordSize]); got.QPN != 0x123456 {
		t.Errorf("QPN %#x", got.QPN)
	}
}

// TestPerfCMFlags: -R is accepted for the bandwidth tests and refused for latency; a -R
// server needs -d.
func TestPerfCMFlags(t *testing.T) {
	for _, ok := range [][]string{{"write", "-R", "-d", "127.0.0.1"}, {"write", "-R", "-d", "127.0.0.1", "--selective-repeat"}, {"read", "-R", "-d", "127.0.0.1"}, {"atomic", "-R", "10.0.0.1"}, {"send", "--rdma_cm", "-d", "127.0.0.1"}, {"send", "-R", "10.0.0.1"}} {
		c, err := parsePerf(ok, new(bytes.Buffer))
		if err != nil || !c.RDMACM {
			t.Errorf("%v: %v", ok, err)
		}
	}
	for _, bad := range []struct {
		args []string
		want error
	}{
		{[]string{"write", "--lat", "-R", "-d", "127.0.0.1"}, errPerfUnsupported},
		{[]string{"write", "-R"}, errPerfUsage},
		{[]string{"write", "-R", "--loopback"}, errPerfUsage},
	} {
		if _, err := parsePerf(bad.args, new(bytes.Buffer)); !errors.Is(err, bad.want) {
			t.Errorf("%v: %v, want %v", bad.args, err, bad.want)
		}
	}
}

// perfCMPair runs a -R server on 127.0.0.1 and a -R client on 127.0.0.2 in this process.
func perfCMPair(t *testing.T, args ...string) (srvOut, cliOut string) {
	t.Helper()
	so, se, co, ce := perfCMPairSides(t, args, nil, nil)
	if se != "" || ce != "" {
		t.Errorf("stderr: server %q client %q", se, ce)
	}
	return so, co
}

// perfCMPairSides is perfCMPair with srvExtra and cliExtra added to one side's arguments; it
// returns both sides' stdout and stderr.
func perfCMPairSides(t *testing.T, args, srvExtra, cliExtra []string) (srvOut, srvErr, cliOut, cliErr string) {
	t.Helper()
	common := append(append([]string{}, args...), "-R", "-p", "18515", "--roce-port", strconv.Itoa(int(tooltest.FreeUDPPort(t))),
		"--timeout", "20s", "--run-timeout", "20s")
	var se, co, ce bytes.Buffer
	so := rocetest.NewWatch(perftest.WaitingBanner)
	var wg sync.WaitGroup
	var srvStatus int
	wg.Add(1)
	go func() {
		defer wg.Done()
		srvStatus = perfMain(append(append(append([]string{}, common...), srvExtra...), "-d", "127.0.0.1"), &perfEnv{Stdout: so, Stderr: &se})
	}()
	// start the client once the server's device exists (a REQ sent to no device at all
	// waits for the CM's retransmission, seconds); until its listener exists the client's
	// requests are refused and retried (rdma_cm_client_connection)
	select {
	case <-so.Seen():
	case <-time.After(20 * time.Second):
		t.Fatal("the server did not start")
	}
	cliStatus := perfMain(append(append(append([]string{}, common...), cliExtra...), "-d", "127.0.0.2", "127.0.0.1"), &perfEnv{Stdout: &co, Stderr: &ce})
	wg.Wait()
	if srvStatus != 0 || cliStatus != 0 {
		t.Errorf("%v: exit status server %d client %d\nserver:\n%s\nclient:\n%s", args, srvStatus, cliStatus, so.String(), co.String())
	}
	return so.String(), se.String(), co.String(), ce.String()
}

// TestPerfCMSelectiveRepeat: with -R, --selective-repeat is negotiated by the CM: given on
// both sides, every data connection has it (no note); given on one side only, the run
// completes with go-back-N and that side notes on stderr that the peer did not accept it.
func TestPerfCMSelectiveRepeat(t *testing.T) {
	sr := []string{"--selective-repeat"}
	const note = "--selective-repeat: the peer did not accept it on 2 of 2 data connections"
	args := []string{"write", "-s", "65536", "-n", "50", "-q", "2"}
	for _, c := range []struct {
		name             string
		srv, cli         []string
		srvNote, cliNote bool
	}{
		{"both", sr, sr, false, false},
		{"client only", nil, sr, false, true},
		{"server only", sr, nil, true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			so, se, co, ce := perfCMPairSides(t, args, c.srv, c.cli)
			cfg, err := parsePerf(args, new(bytes.Buffer))
			if err != nil {
				t.Fatal(err)
			}
			checkPerfPair(t, so, co, cfg.Test, []int{65536}, 50, 2, false)
			if strings.Contains(se, note) != c.srvNote || strings.Contains(ce, note) != c.cliNote {
				t.Errorf("stderr: server %q client %q", se, ce)
			}
			if !c.srvNote && se != "" || !c.cliNote && ce != "" {
				t.Errorf("stderr: server %q client %q", se, ce)
			}
		})
	}
}

// TestPerfCMPairs runs send and write bandwidth with -R softroce <-> softroce in this process:
// the exchange over its rdma_cm QP (no TCP listener exists), the data QPs connected by
// rdma_cm, both outputs checked as for the TCP exchange plus the rdma_cm banner lines.
func TestPerfCMPairs(t *testing.T) {
	for _, c := range []struct {
		args       []string
		sizes      []int
		iters, qps int
	}{
		{[]string{"write", "-s", "3000", "-n", "200"}, []int{3000}, 200, 1},
		{[]string{"write", "-s", "65536", "-n", "50", "-q", "2", "--report_gbits"}, []int{65536}, 50, 2},
		{[]string{"send", "-s", "3000", "-n", "200"}, []int{3000}, 200, 1},
		{[]string{"send", "-s", "64", "-n", "300", "-q", "2", "-r", "16"}, []int{64}, 300, 2},
		{[]string{"send", "-a", "-n", "5"}, perfSizes(&perfConfig{All: true}, 0), 5, 1},
		{[]string{"read", "-s", "3000", "-n", "200"}, []int{3000}, 200, 1},
		{[]string{"read", "-s", "3000", "-n", "100", "-q", "2", "-o", "4"}, []int{3000}, 100, 2},
		{[]string{"atomic", "-n", "200"}, []int{8}, 200, 1},
		{[]string{"atomic", "-n", "200", "-A", "CMP_AND_SWAP"}, []int{8}, 200, 1},
	} {
		t.Run(strings.Join(c.args, "_"), func(t *testing.T) {
			cfg, err := parsePerf(c.args, new(bytes.Buffer))
			if err != nil {
				t.Fatal(err)
			}
			so, co := perfCMPair(t, c.args...)
			checkPerfPair(t, so, co, cfg.Test, c.sizes, c.iters, c.qps, cfg.Gbits)
			for _, o := range []struct{ who, out string }{{"server", so}, {"client", co}} {
				if !strings.Contains(o.out, " rdma_cm QPs\t : ON\n Data ex. method : rdma_cm") {
					t.Errorf("%s: no rdma_cm banner lines", o.who)
				}
			}
			if !strings.Contains(so, " Waiting for client rdma_cm QP to connect\n") || strings.Contains(co, "Waiting for client rdma_cm") {
				t.Error("the server (only) invites the client's rdma_cm QP")
			}
			if t.Failed() {
				t.Logf("server:\n%s\nclient:\n%s", so, co)
			}
		})
	}
	t.Logf("exchange completions found without a CQ event: %d", perfCMRepolled.Load())
}

// TestPerfCMNoPeer: a -R client without a server gives up after its retries (each refused at
// once by the peer's CM: no listener), and a -R server without a client within --timeout;
// both exit 1.
func TestPerfCMNoPeer(t *testing.T) {
	port := strconv.Itoa(int(tooltest.FreeUDPPort(t)))
	// a device on 127.0.0.1 with nobody listening: the client's REQs are rejected
	var wg sync.WaitGroup
	var srvStatus int
	var so, se bytes.Buffer
	wg.Add(1)
	go func() {
		defer wg.Done()
		// listens on -p 18000; the client asks for 18001
		srvStatus = perfMain([]string{"write", "-R", "-d", "127.0.0.1", "-p", "18000", "--roce-port", port, "--timeout", "3s"},
			&perfEnv{Stdout: &so, Stderr: &se})
	}()
	var out, errb bytes.Buffer
	start := time.Now()
	st := perfMain([]string{"write", "-R", "-d", "127.0.0.2", "-p", "18001", "--roce-port", port, "--timeout", "2s", "127.0.0.1"},
		&perfEnv{Stdout: &out, Stderr: &errb})
	if st != 1 || !strings.Contains(errb.String(), "Unable to perform rdma_client function") {
		t.Errorf("client: status %d, stderr %q", st, errb.String())
	}
	if d := time.Since(start); d > 2*time.Second+time.Duration(perfCMRetries)*(perfCMRetryDelay+200*time.Millisecond) {
		t.Errorf("client took %v", d)
	}
	wg.Wait()
	if srvStatus != 1 || !strings.Contains(se.String(), "no client connected to rdma_cm port 18000") {
		t.Errorf("server: status %d, stderr %q", srvStatus, se.String())
	}
}

// TestPerfCMAddressLines: with -R perftest prints the address lines of its SEND exchange
// (create_comm_struct sets the exchange's verb to SEND): no RKey and VAddr, even for WRITE.
func TestPerfCMAddressLines(t *testing.T) {
	so, co := perfCMPair(t, "write", "-s", "64", "-n", "20")
	for _, out := range []string{so, co} {
		if n := strings.Count(out, " address: LID 0000 QPN "); n != 2 || strings.Contains(out, "RKey") || strings.Contains(out, "VAddr") {
			t.Errorf("address lines with RKey/VAddr or not 2:\n%s", out)
		}
	}
}

// perfRacyCQ is a CQ whose completion arrives right after the waiter arms it (between
// ReqNotify and the waiter's second look), the window where a completion must not be lost.
type perfRacyCQ struct {
	*cq.CQ
	armed int
}

func (c *perfRacyCQ) ReqNotify(s bool) error {
	err := c.CQ.ReqNotify(s)
	if c.armed++; c.armed == 1 {
		c.CQ.Push(&cq.WC{WRID: 7, Status: cq.StatusSuccess, ByteLen: 4}, false)
	}
	return err
}

// TestPerfCMWaitArmRace: a completion pushed just after arming is returned (once), not
// consumed and forgotten; with nothing more to come the next wait times out, naming the QP.
func TestPerfCMWaitArmRace(t *testing.T) {
	d := perfTestDevice(t)
	c, err := cq.New(cq.Options{Capacity: 4})
	if err != nil {
		t.Fatal(err)
	}
	m, err := newPerfCMComm(&perfConfig{Timeout: time.Second}, d.Verbs(), perftest.Client, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer m.close()
	q, err := d.Verbs().CreateQP(roce.VerbsQPInit{Type: qp.TypeRC, PD: m.pd, SendCQ: m.scq, RecvCQ: m.rcq, Cap: qp.Cap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	m.q = q
	start := time.Now()
	if err := m.wait(&perfRacyCQ{CQ: c}, 5*time.Second, "test"); err != nil || m.wcs[0].WRID != 7 {
		t.Fatalf("wait: %v, wc %+v", err, m.wcs[0])
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("found after %v", el)
	}
	err = m.wait(c, 150*time.Millisecond, "test")
	if !errors.Is(err, errPerfTimeout) || !strings.Contains(err.Error(), "exchange QP") {
		t.Errorf("second wait: %v", err)
	}
}

// perfTestDevice is a device on an in-memory link.
func perfTestDevice(t *testing.T) *roce.Device {
	t.Helper()
	l, err := mem.NewNetwork(mem.Options{}).Attach(netip.MustParseAddr("10.9.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	d, err := roce.Open(roce.Options{Link: l})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}
