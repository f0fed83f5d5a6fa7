package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/daemon"
	"github.com/softroce/softroce/internal/event"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/client"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/roce"
)

// waitLimit bounds every wait for a completion (a hang fails, it does not stall the suite).
const waitLimit = 20 * time.Second

// end is one side of an RC connection built only through roce.Verbs, so the
// same code runs embedded and through the daemon.
type end struct {
	v    roce.Verbs
	pd   roce.ProtectionDomain
	cq   roce.CompletionQueue
	buf  []byte
	m    roce.MemoryRegion
	q    roce.QueuePair
	wc   []cq.WC
	iova uint64
	// timeout is the ACK timeout code connect uses (0 = infinite); retry its retry count
	// (newEnd: 3).
	timeout, retry uint8
}

const rcAccess = mr.AccessLocalWrite | mr.AccessRemoteWrite | mr.AccessRemoteRead | mr.AccessRemoteAtomic

func newEnd(t testing.TB, v roce.Verbs, size int, depth uint32, acc mr.Access) *end {
	t.Helper()
	buf, err := v.AllocBuffer(size)
	if err != nil {
		t.Fatal("AllocBuffer:", err)
	}
	return newEndBuf(t, v, buf, depth, acc)
}

// newEndBuf is newEnd over buf: memory from AllocBuffer (shared with the daemon) or any other
// memory of the program (registered where it is, reached by the daemon through copies).
func newEndBuf(t testing.TB, v roce.Verbs, buf []byte, depth uint32, acc mr.Access) *end {
	t.Helper()
	e := &end{v: v, iova: 0x10000, wc: make([]cq.WC, 64), timeout: 12, retry: 3, buf: buf}
	var err error
	if e.pd, err = v.AllocPD(); err != nil {
		t.Fatal("AllocPD:", err)
	}
	if e.cq, err = v.CreateCQ(int(4 * depth)); err != nil {
		t.Fatal("CreateCQ:", err)
	}
	if e.m, err = v.RegMR(e.pd, e.buf, e.iova, acc); err != nil {
		t.Fatal("RegMR:", err)
	}
	if e.q, err = v.CreateQP(roce.VerbsQPInit{Type: qp.TypeRC, PD: e.pd, SendCQ: e.cq, RecvCQ: e.cq,
		Cap: qp.Cap{MaxSendWR: depth, MaxRecvWR: depth, MaxSendSGE: 2, MaxRecvSGE: 2}}); err != nil {
		t.Fatal("CreateQP:", err)
	}
	return e
}

// connect moves e's QP to RTS towards the peer (timeout code 12 = 16.8 ms,
// 3 retries unless e.retry says otherwise: a dead peer is detected in well under a second).
func (e *end) connect(t testing.TB, peer netip.Addr, peerQPN uint32, sgid uint8) {
	t.Helper()
	if err := e.q.Modify(&qp.Attr{State: qp.StateInit, Port: 1, AccessFlags: rcAccess},
		qp.AttrState|qp.AttrPKeyIndex|qp.AttrPort|qp.AttrAccessFlags); err != nil {
		t.Fatal("INIT:", err)
	}
	if err := e.q.Modify(&qp.Attr{State: qp.StateRTR, AH: qp.AHAttr{DGID: peer, SGIDIndex: sgid},
		PathMTU: qp.MTU4096, DestQPN: peerQPN, RQPSN: 0, MaxDestRDAtomic: 4, MinRNRTimer: 1},
		qp.AttrState|qp.AttrAV|qp.AttrPathMTU|qp.AttrDestQPN|qp.AttrRQPSN|qp.AttrMaxDestRDAtomic|qp.AttrMinRNRTimer); err != nil {
		t.Fatal("RTR:", err)
	}
	if err := e.q.Modify(&qp.Attr{State: qp.StateRTS, SQPSN: 0, Timeout: e.timeout, RetryCnt: e.retry, RNRRetry: 7, MaxRDAtomic: 4},
		qp.AttrState|qp.AttrSQPSN|qp.AttrTimeout|qp.AttrRetryCnt|qp.AttrRNRRetry|qp.AttrMaxQPRDAtomic); err != nil {
		t.Fatal("RTS:", err)
	}
}

// wait returns the next n completions (ReqNotify + Channel, as an ibverbs
// program with a completion channel does).
func (e *end) wait(t testing.TB, n int) []cq.WC {
	t.Helper()
	out := make([]cq.WC, 0, n)
	timeout := time.NewTimer(waitLimit)
	defer timeout.Stop()
	for len(out) < n {
		k := e.cq.Poll(e.wc[:min(len(e.wc), n-len(out))])
		if k > 0 {
			out = append(out, e.wc[:k]...)
			continue
		}
		if err := e.cq.ReqNotify(false); err != nil {
			t.Fatal("ReqNotify:", err)
		}
		if k = e.cq.Poll(e.wc[:min(len(e.wc), n-len(out))]); k > 0 {
			out = append(out, e.wc[:k]...)
			continue
		}
		select {
		case <-e.cq.Channel():
		case <-timeout.C:
			t.Fatalf("timed out with %d of %d completions", len(out), n)
		}
	}
	return out
}

func (e *end) write(t testing.TB, wrid uint64, off, n int, peer *end, roff int) {
	t.Helper()
	if _, err := e.q.PostSend([]qp.SendWR{{WRID: wrid, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
		SGL:        []qp.SGE{{Addr: e.iova + uint64(off), Length: uint32(n), LKey: e.m.LKey()}},
		RemoteAddr: peer.iova + uint64(roff), RKey: peer.m.RKey()}}); err != nil {
		t.Fatal("PostSend WRITE:", err)
	}
}

func pattern(b []byte, seed int) {
	x := uint32(seed)*2654435761 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
}

// daemonOn opens a device on link l and serves it on a socket in dir.
type testDaemon struct {
	dev  *roce.Device
	srv  *daemon.Server
	sock string
	done chan error
}

func startDaemon(t testing.TB, l link.Link, name string, port uint16) *testDaemon {
	t.Helper()
	var srv atomic.Pointer[daemon.Server] // asynchronous events go to the server, as in softroce daemon
	dev, err := roce.Open(roce.Options{Link: l, Name: name, Port: port, Events: func(e event.Event) {
		if s := srv.Load(); s != nil {
			s.Event(e)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	d := serveDevice(t, dev, name)
	srv.Store(d.srv)
	return d
}

// testPostSpin, testLimits and testCeiling are the daemons' Options.PostSpin, Options.Limits
// and Options.Ceiling (a test may set them before starting its daemons).
var (
	testPostSpin            time.Duration
	testLimits, testCeiling daemon.Limits
	testPrivileged          func(uid uint32) bool
)

// serveDevice serves dev (closed by the cleanup) on a socket in a temporary directory.
func serveDevice(t testing.TB, dev *roce.Device, name string) *testDaemon {
	t.Helper()
	srv, err := daemon.New(daemon.Options{Device: dev, Logger: discardLogger(), PostSpin: testPostSpin,
		Limits: testLimits, Ceiling: testCeiling, Privileged: testPrivileged})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), name+".sock")
	ln, err := daemon.Listen(sock, 0o600, -1)
	if err != nil {
		t.Fatal(err)
	}
	d := &testDaemon{dev: dev, srv: srv, sock: sock, done: make(chan error, 1)}
	go func() { d.done <- srv.Serve(ln) }()
	t.Cleanup(func() { d.stop(t) })
	return d
}

func (d *testDaemon) stop(t testing.TB) {
	if d.srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := d.srv.Shutdown(ctx); err != nil {
		t.Error("Shutdown:", err)
	}
	if err := <-d.done; !errors.Is(err, daemon.ErrServerClosed) {
		t.Error("Serve:", err)
	}
	d.dev.Close()
	d.srv = nil
}

func (d *testDaemon) dial(t testing.TB) *client.Conn {
	t.Helper()
	c, err := client.Dial(d.sock)
	if err != nil {
		t.Fatal("Dial:", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// waitIdle waits until the server has at most n clients.
func (d *testDaemon) waitIdle(t testing.TB, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := d.srv.WaitClients(ctx, n); err != nil {
		t.Fatal(fmt.Errorf("waiting for %d clients: %w (have %+v)", n, err, d.srv.Debug()))
	}
}

func dialNoCleanup(sock string) (*client.Conn, error) { return client.Dial(sock) }
