package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/daemon"
	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/event"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/client"
	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/roce"
)

// daemonChild serves a device on an in-memory link at SRC_SOCK until it is killed (the
// "daemon" role of TestMain): a daemon in a process of its own, for tests that SIGKILL it.
func daemonChild() int {
	l, err := mem.NewNetwork(mem.Options{}).Attach(ipA)
	if err != nil {
		fmt.Println("FAIL", err)
		return 1
	}
	dev, err := roce.Open(roce.Options{Link: l, Name: "killed"})
	if err != nil {
		fmt.Println("FAIL", err)
		return 1
	}
	srv, err := daemon.New(daemon.Options{Device: dev, Logger: discardLogger()})
	if err != nil {
		fmt.Println("FAIL", err)
		return 1
	}
	ln, err := daemon.Listen(os.Getenv("SRC_SOCK"), 0o600, -1)
	if err != nil {
		fmt.Println("FAIL", err)
		return 1
	}
	fmt.Println("READY")
	srv.Serve(ln)
	return 0
}

// TestDaemonKilled: a client sees a SIGKILLed daemon at once. A Wait parked on a CQ's
// notify eventfd and a Channel both end, asynchronous posts (which write shared memory and
// never touch the socket) fail with proto.ErrDisconnected, ReqNotify too, and Events
// delivers DEVICE_FATAL — each within a second. (Before, Wait and Channel blocked forever
// and posts returned nil.)
func TestDaemonKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a daemon process")
	}
	sock := filepath.Join(t.TempDir(), "killed.sock")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "SOFTROCE_DAEMON_CHILD=daemon", "SRC_SOCK="+sock)
	d := startProc(t, "daemon", cmd, false)
	d.expect(t, "READY")

	c, err := client.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	e := newEnd(t, c, 1<<16, 64, rcAccess)
	e.timeout = 0 // infinite: nothing completes before the kill
	e.connect(t, ipB, 0x77, 1)
	cq2, err := c.CreateCQ(4)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.cq.ReqNotify(false); err != nil {
		t.Fatal(err)
	}
	if err := cq2.ReqNotify(false); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- e.cq.Wait() }()
	ch := cq2.Channel()
	// One asynchronous post before the kill reaches the engine (a WRITE into nowhere,
	// retried forever: no completion).
	write := []qp.SendWR{{WRID: 1, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
		SGL: []qp.SGE{{Addr: e.iova, Length: 8, LKey: e.m.LKey()}}, RemoteAddr: 0x1000, RKey: 0x1234}}
	if _, err := e.q.PostSend(write); err != nil {
		t.Fatal("post before the kill:", err)
	}

	if err := d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	d.cmd.Wait()
	killed := time.Now()
	ctx, cancel := context.WithDeadline(context.Background(), killed.Add(time.Second))
	defer cancel()
	select {
	case err := <-waited:
		if !errors.Is(err, proto.ErrDisconnected) {
			t.Fatalf("Wait after the daemon died: %v, want ErrDisconnected", err)
		}
	case <-ctx.Done():
		t.Fatal("Wait still blocked 1 s after the daemon was killed")
	}
	select {
	case <-ch:
	case <-ctx.Done():
		t.Fatal("Channel silent 1 s after the daemon was killed")
	}
	if err := cq2.ReqNotify(false); !errors.Is(err, proto.ErrDisconnected) {
		t.Fatalf("ReqNotify after the daemon died: %v, want ErrDisconnected", err)
	}
	if err := e.cq.Wait(); !errors.Is(err, proto.ErrDisconnected) {
		t.Fatalf("a second Wait: %v, want ErrDisconnected", err)
	}
	if _, err := e.q.PostSend(write); !errors.Is(err, proto.ErrDisconnected) {
		t.Fatalf("asynchronous PostSend after the daemon died: %v, want ErrDisconnected", err)
	}
	recv := []qp.RecvWR{{WRID: 2, SGL: []qp.SGE{{Addr: e.iova, Length: 8, LKey: e.m.LKey()}}}}
	if _, err := e.q.PostRecv(recv); !errors.Is(err, proto.ErrDisconnected) {
		t.Fatalf("asynchronous PostRecv after the daemon died: %v, want ErrDisconnected", err)
	}
	for {
		select {
		case ev := <-c.Events():
			if ev.Type != event.DeviceFatal {
				continue
			}
		case <-ctx.Done():
			t.Fatal("no DEVICE_FATAL event 1 s after the daemon was killed")
		}
		break
	}
	t.Logf("everything saw the dead daemon within %v", time.Since(killed))
}
