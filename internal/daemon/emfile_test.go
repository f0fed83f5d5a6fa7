package daemon_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/daemon"
	"github.com/softroce/softroce/pkg/client"
	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/roce"
)

// emfileChild (the "emfile" role of TestMain) runs a server in a process whose descriptor
// table it fills: a client connects with the last free descriptor, so the server's accept4
// fails with EMFILE. The server must keep serving (back off, retry): once descriptors are
// freed the client's Dial completes and its requests are answered.
func emfileChild() int {
	fail := func(f string, a ...any) int { fmt.Printf("FAIL "+f+"\n", a...); return 1 }
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: 128, Max: 128}); err != nil {
		return fail("setrlimit: %v", err)
	}
	l, err := mem.NewNetwork(mem.Options{}).Attach(ipA)
	if err != nil {
		return fail("%v", err)
	}
	dev, err := roce.Open(roce.Options{Link: l})
	if err != nil {
		return fail("%v", err)
	}
	srv, err := daemon.New(daemon.Options{Device: dev, Logger: discardLogger()})
	if err != nil {
		return fail("%v", err)
	}
	sock := filepath.Join(os.Getenv("SRC_DIR"), "emfile.sock")
	ln, err := daemon.Listen(sock, 0o600, -1)
	if err != nil {
		return fail("%v", err)
	}
	backoff := make(chan error, 1)
	daemon.SetAcceptBackoffHook(func(err error) {
		select {
		case backoff <- err:
		default:
		}
	})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	// Fill the descriptor table, then free one for the client's socket.
	var fill []int
	for {
		fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			if !errors.Is(err, syscall.EMFILE) {
				return fail("filling: %v", err)
			}
			break
		}
		fill = append(fill, fd)
	}
	unix.Close(fill[len(fill)-1])
	fill = fill[:len(fill)-1]
	dialed := make(chan error, 1)
	var c *client.Conn
	go func() {
		var err error
		c, err = client.Dial(sock)
		dialed <- err
	}()
	select {
	case err := <-backoff:
		if !errors.Is(err, syscall.EMFILE) {
			return fail("accept backed off on %v, want EMFILE", err)
		}
	case err := <-served:
		return fail("Serve returned on a full descriptor table: %v", err)
	case err := <-dialed:
		return fail("Dial finished with the descriptor table full: %v", err)
	}
	for _, fd := range fill {
		unix.Close(fd)
	}
	select {
	case err := <-dialed:
		if err != nil {
			return fail("Dial after descriptors were freed: %v", err)
		}
	case err := <-served:
		return fail("Serve returned: %v", err)
	}
	if _, err := c.AllocPD(); err != nil {
		return fail("AllocPD: %v", err)
	}
	c.Close()
	fmt.Println("OK")
	return 0
}

// TestAcceptEMFILE: a daemon out of file descriptors backs off and keeps serving (before,
// the EMFILE from accept4 ended Serve, and softroce daemon exited with every client).
func TestAcceptEMFILE(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "SOFTROCE_DAEMON_CHILD=emfile", "SRC_DIR="+t.TempDir())
	p := startProc(t, "emfile", cmd, false)
	if line := p.expect(t, ""); line != "OK" {
		t.Fatal(line)
	}
	if err := p.cmd.Wait(); err != nil {
		t.Fatal(err)
	}
}
