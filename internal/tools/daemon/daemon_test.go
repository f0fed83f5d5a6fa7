package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/internal/rocetest"
	"github.com/softroce/softroce/internal/tools/cli"
	"github.com/softroce/softroce/internal/tools/tooltest"
	"github.com/softroce/softroce/pkg/client"
)

// TestDaemonFlags: bad options and config are refused before anything is opened (exit 2, or 1
// for an unreadable --config file); good ones in getopt style, merged with the file.
func TestDaemonFlags(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "c.json")
	os.WriteFile(cfg, []byte(`{"listen": ["127.0.0.1"], "bogus": 1}`), 0o600)
	badLimit := filepath.Join(t.TempDir(), "l.json")
	os.WriteFile(badLimit, []byte(`{"listen": ["127.0.0.1"], "limits": {"qpz": 1}}`), 0o600)
	for _, tc := range []struct {
		args   []string
		status int
	}{
		{[]string{"--config", cfg}, 1},
		{[]string{"--config", badLimit}, 1},
		{[]string{"--listen", "127.0.0.1", "--mtu", "1000", "--socket", filepath.Join(t.TempDir(), "s")}, 2},
		{[]string{"--listen", "127.0.0.1", "--metrics", "0.0.0.0:9000", "--port", "0"}, 2},
		{[]string{"--listen", "127.0.0.1", "--post-spin", "fast"}, 2},
		{[]string{"--listen", "127.0.0.1", "--limit", "qps=many"}, 2},
		{[]string{"--listen", "127.0.0.1", "--limit", "bogus=1"}, 2},
		{[]string{"--listen", "127.0.0.1", "--limit", "qps"}, 2},
		{[]string{"--listen", "127.0.0.1", "--limit", "inflight=0"}, 2},
		{[]string{"--listen", "127.0.0.1", "--log", "xml"}, 2},
		{[]string{"-listen", "127.0.0.1"}, 2},
		{[]string{"--listen", "127.0.0.1", "extra"}, 2},
		{[]string{"--listen", "127.0.0.1", "--cc", "rp_ai_rate=0"}, 2},
		{[]string{"--listen", "127.0.0.1", "--cc", "rp_bogus=1"}, 2},
		{[]string{"--listen", "127.0.0.1", "--workers", "-1"}, 2},
		{[]string{"--listen", "127.0.0.1", "--workers", "65"}, 2},
	} {
		var errb bytes.Buffer
		if rc := Main(context.Background(), tc.args, io.Discard, &errb); rc != tc.status {
			t.Errorf("%q: exit %d, want %d (%s)", tc.args, rc, tc.status, errb.String())
		}
	}
	good := filepath.Join(t.TempDir(), "g.json")
	os.WriteFile(good, []byte(`{"listen": ["127.0.0.2"], "socket": "/tmp/x.sock", "mtu": 2048, "log": "json", "limits": {"qps": 9, "cqs": 7, "inflight": 64}, "cc": "rp_ai_rate=2,rp_hai_rate=20", "workers": 3, "rxe_flush_icrc": true}`), 0o600)
	c, err := ParseArgs([]string{"-c", good, "-s/tmp/y.sock", "--port=14791", "--limit", "qps=4", "--limit=mapped_bytes=2G", "--post-spin=2us",
		"--cc", "rp_ai_rate=1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Device.Addrs) != 1 || c.Device.Addrs[0] != netip.MustParseAddr("127.0.0.2") || c.Socket != "/tmp/y.sock" ||
		c.Device.Port != 14791 || c.Device.MTU != qp.MTU2048 || !c.JSONLog || c.Limits.QPs != 4 || c.Limits.MappedBytes != 2<<30 || c.Limits.CQs != 7 || c.PostSpin != 2*time.Microsecond ||
		c.Device.FastPath.Workers != 3 {
		t.Errorf("config %+v", c)
	}
	if p := c.Device.CC; p == nil || p.AIRate != 1 || p.HAIRate != 20 || p.TimeReset != 300 || !p.Enabled {
		t.Errorf("--cc over the file's cc: %+v", p)
	}
	if !c.Device.RxeFlushICRC {
		t.Errorf("rxe_flush_icrc from the file: off")
	}
	if c, err := ParseArgs([]string{"-c", good, "--rxe-flush-icrc=false"}); err != nil || c.Device.RxeFlushICRC {
		t.Errorf("--rxe-flush-icrc=false over the file's: %v %v", err, c.Device.RxeFlushICRC)
	}
	if c.Limits.InFlight != 64 {
		t.Errorf("inflight from the file: %d", c.Limits.InFlight)
	}
	if c, err := ParseArgs([]string{"-c", good, "--limit", "inflight=none"}); err != nil || c.Limits.InFlight != -1 {
		t.Errorf("--limit inflight=none over the file's: %v %d", err, c.Limits.InFlight)
	}
	if c, err := ParseArgs([]string{"-c", good, "--workers", "2"}); err != nil || c.Device.FastPath.Workers != 2 {
		t.Errorf("--workers over the file's workers: %v %+v", err, c.Device.FastPath)
	}
	c, err = ParseArgs([]string{"-l", "127.0.0.1", "-l127.0.0.2", "--mtu", "1024"})
	if err != nil || len(c.Device.Addrs) != 2 || c.Device.MTU != qp.MTU1024 || c.Socket != client.DefaultSocket || c.GID != -1 || c.Device.CC != nil ||
		c.Device.FastPath.Workers != 0 {
		t.Errorf("-l twice: %+v %v", c, err)
	}
	if _, err := ParseArgs([]string{"--nonsense"}); !errors.Is(err, cli.ErrUsage) {
		t.Errorf("unknown option: %v", err)
	}
}

// TestDaemonRun: Run serves a device on a socket until its context ends; a client sees the
// device the options describe (with two receive workers: the device opens both); --trace
// leaves an execution trace of the run.
func TestDaemonRun(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "d.sock")
	tr := filepath.Join(t.TempDir(), "run.trace")
	port := tooltest.FreeUDPPort(t)
	c, err := ParseArgs([]string{"--listen", "127.0.0.1", "--socket", sock, "--port", fmt.Sprintf("%#x", port), "--name", "softrocerun", "--workers", "2", "--rxe-flush-icrc", "--trace", tr})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	log := rocetest.NewWatch("softroce daemon ready")
	done := make(chan error, 1)
	go func() { done <- Run(ctx, c, log) }()
	select {
	case <-log.Seen():
	case err := <-done:
		cancel()
		t.Fatalf("Run: %v\n%s", err, log.String())
	}
	cl, err := client.Dial(sock)
	if err != nil {
		cancel()
		<-done
		t.Fatal(err)
	}
	if cl.Name() != "softrocerun" {
		t.Errorf("device %q", cl.Name())
	}
	cl.Close()
	cancel()
	if err := <-done; err != nil || !strings.Contains(log.String(), "softroce daemon ready") || !strings.Contains(log.String(), fmt.Sprintf("port=%d", port)) ||
		!strings.Contains(log.String(), "workers=2") || !strings.Contains(log.String(), "rxe_flush_icrc=true") {
		t.Errorf("Run: %v\n%s", err, log.String())
	}
	if b, err := os.ReadFile(tr); err != nil || !bytes.HasPrefix(b, []byte("go 1.")) || !bytes.Contains(b[:16], []byte(" trace")) {
		t.Errorf("--trace: %v, %d bytes", err, len(b))
	}
}
