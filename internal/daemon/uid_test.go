package daemon_test

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/softroce/softroce/internal/daemon"
	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/client"
	"github.com/softroce/softroce/pkg/roce"
)

// udQPs creates UD QPs on c until one is refused; it returns the first and how many it made.
func udQPs(c *client.Conn) (roce.QueuePair, int, error) {
	pd, err := c.AllocPD()
	if err != nil {
		return nil, 0, err
	}
	x, err := c.CreateCQ(4)
	if err != nil {
		return nil, 0, err
	}
	in := roce.VerbsQPInit{Type: qp.TypeUD, PD: pd, SendCQ: x, RecvCQ: x, Cap: qp.Cap{MaxSendWR: 2, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1}}
	var first roce.QueuePair
	for n := 0; n < 10; n++ {
		q, err := c.CreateQP(in)
		if err != nil {
			return first, n, err
		}
		if first == nil {
			first = q
		}
	}
	return first, 10, nil
}

// uidChild (the "uid" role of TestMain) is a client of SRC_SOCK running as another user: it
// creates QPs until one is refused, then asks for a controlled Q_Key, and reports both.
func uidChild() int {
	c, err := client.Dial(os.Getenv("SRC_SOCK"))
	if err != nil {
		fmt.Println("FAIL dial:", err)
		return 1
	}
	defer c.Close()
	q, n, err := udQPs(c)
	if q == nil {
		fmt.Println("FAIL no QP:", err)
		return 1
	}
	quota := errors.Is(err, proto.ErrQuota)
	qerr := q.Modify(&qp.Attr{State: qp.StateInit, Port: 1, QKey: controlledQKey}, qp.AttrState|qp.AttrPKeyIndex|qp.AttrPort|qp.AttrQKey)
	d, err := c.Debug()
	if err != nil {
		fmt.Println("FAIL debug:", err)
		return 1
	}
	fmt.Printf("UID %d QPS %d QUOTA %v USERQPS %d QKEYPERM %v\n", d.UID, n, quota, d.User.QPs, errors.Is(qerr, proto.ErrPermission))
	return 0
}

// TestLimitsTwoUsers: two users are held to their limits separately, and the default
// privilege policy is the kernel's. As root, the test holds the one QP its user may have and
// is refused a second; a client running as uid 65534 (nobody) still gets its own one (and is
// refused a second), is counted under its own uid, and is refused a controlled Q_Key, which
// root may set.
func TestLimitsTwoUsers(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root (a client process of another uid)")
	}
	withLimits(t, daemon.Limits{QPs: 1}, daemon.Limits{})
	da, _ := memPair(t)
	bin := reachableByAll(t, da.sock)
	dir := filepath.Dir(bin)

	root := da.dial(t)
	q, n, err := udQPs(root)
	if n != 1 || !errors.Is(err, proto.ErrQuota) {
		t.Fatalf("root: %d QPs, then %v; want 1, then ErrQuota", n, err)
	}
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), "SOFTROCE_DAEMON_CHILD=uid", "SRC_SOCK="+da.sock)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("client as uid 65534: %v\n%s", err, out)
	}
	if want := "UID 65534 QPS 1 QUOTA true USERQPS 1 QKEYPERM true"; strings.TrimSpace(string(out)) != want {
		t.Fatalf("client as uid 65534: %q, want %q", strings.TrimSpace(string(out)), want)
	}
	if err := q.Modify(&qp.Attr{State: qp.StateInit, Port: 1, QKey: controlledQKey}, qp.AttrState|qp.AttrPKeyIndex|qp.AttrPort|qp.AttrQKey); err != nil {
		t.Fatalf("root's controlled Q_Key: %v", err)
	}
	if d, err := root.Debug(); err != nil || d.UID != 0 || d.User.QPs != 1 || d.Refused.QPs != 2 {
		t.Fatalf("root's view: uid %d, QPs %d, refused %d (%v)", d.UID, d.User.QPs, d.Refused.QPs, err)
	}
}

// reachableByAll makes the sockets and a copy of this test binary usable by any user (a client
// process of another uid): the sockets mode 0666, the directories up to them 0755. It returns
// the copy's path, in a directory of its own.
func reachableByAll(t *testing.T, socks ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, p := range append([]string{filepath.Join(dir, "x")}, socks...) {
		for d := filepath.Dir(p); d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
			os.Chmod(d, 0o755)
		}
		if p != filepath.Join(dir, "x") {
			if err := os.Chmod(p, 0o666); err != nil {
				t.Fatal(err)
			}
		}
	}
	bin := filepath.Join(dir, "daemon.test")
	src, err := os.Open(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	return bin
}
