package devinfo

import (
	"bytes"
	"context"
	"io"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/daemontest"
	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/roce"
)

func TestDevinfoEmbedded(t *testing.T) {
	var out, errb bytes.Buffer
	if rc := Main(context.Background(), []string{"-v", "-d", "127.0.0.1"}, &out, &errb); rc != 0 {
		t.Fatalf("exit %d: %s", rc, errb.String())
	}
	for _, want := range []string{"hca_id:\tsoftroce0", "state:\t\t\tPORT_ACTIVE (4)", "active_mtu:\t\t4096 (5)",
		"GID[  0]:\t\tfe80:0000:0000:0000:0200:00ff:fe00:0000", "node_guid:\t\t\t0200:00ff:fe00:0000",
		"sys_image_guid:\t\t\t0200:00ff:fe00:0000", "GID[  1]:\t\t0000:0000:0000:0000:0000:ffff:7f00:0001, RoCE v2", "max_qp:"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("devinfo lacks %q:\n%s", want, out.String())
		}
	}
}

func TestDevinfoDaemon(t *testing.T) {
	l, err := mem.NewNetwork(mem.Options{}).Attach(netip.MustParseAddr("10.7.0.1"), netip.MustParseAddr("10.7.0.2"))
	if err != nil {
		t.Fatal(err)
	}
	dev, err := roce.Open(roce.Options{Link: l, Name: "softrocetest"})
	if err != nil {
		t.Fatal(err)
	}
	sock, _ := daemontest.Serve(t, dev)
	var out, errb bytes.Buffer
	if rc := Main(context.Background(), []string{"--daemon", sock}, &out, &errb); rc != 0 {
		t.Fatalf("exit %d: %s", rc, errb.String())
	}
	for _, want := range []string{"hca_id:\tsoftrocetest", "node_guid:\t\t\t0200:00ff:fe00:0000", "GID[  1]:\t\t0000:0000:0000:0000:0000:ffff:0a07:0001", "GID[  2]:\t\t0000:0000:0000:0000:0000:ffff:0a07:0002"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("devinfo --daemon lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if rc := Main(context.Background(), []string{"-l", "--daemon=" + sock}, &out, &errb); rc != 0 || out.String() != "1 HCA found:\n\tsoftrocetest\n\n" {
		t.Fatalf("-l: exit %d: %q", rc, out.String())
	}
	if rc := Main(context.Background(), []string{"--daemon", filepath.Join(t.TempDir(), "none.sock")}, io.Discard, io.Discard); rc != 1 {
		t.Fatalf("devinfo on a missing socket: exit %d", rc)
	}
}

// TestDevinfoArgs: ibv_devinfo's command line (getopt "d:i:lv" with its long names), as it
// accepts and refuses it.
func TestDevinfoArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want Config
	}{
		{[]string{"-v"}, Config{Verbose: true}},
		{[]string{"-vl"}, Config{Verbose: true, List: true}},
		{[]string{"-d127.0.0.1", "-i1", "--verbose"}, Config{Listen: []string{"127.0.0.1"}, Verbose: true}},
		{[]string{"--ib-dev=lo", "--ib-port", "1", "-d", "127.0.0.2"}, Config{Listen: []string{"lo", "127.0.0.2"}}},
		{[]string{"--verb", "--li"}, Config{Verbose: true, List: true}},
	} {
		c, err := ParseArgs(tc.args)
		if err != nil || c.Verbose != tc.want.Verbose || c.List != tc.want.List || strings.Join(c.Listen, ",") != strings.Join(tc.want.Listen, ",") {
			t.Errorf("%q: %+v %v, want %+v", tc.args, c, err, tc.want)
		}
	}
	for _, args := range [][]string{{"-i", "2"}, {"-i0"}, {"-d"}, {"-x"}, {"extra"}, {"-d", "lo", "--daemon", "s"}} {
		if _, err := ParseArgs(args); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
}

// TestDevinfoGetopt: command lines are accepted and refused as ibv_devinfo's getopt_long
// ("d:i:lv" and its long names) accepts and refuses them; where ibverbs-utils is installed
// (the lab's packages, CI) each is also run through ibv_devinfo, without an RDMA device: its
// parser refused a line when it printed its usage. (ibv_devinfo takes -i 2 and fails later on
// a one-port device; softroce refuses it at once: not in the table.)
func TestDevinfoGetopt(t *testing.T) {
	for _, tc := range []struct {
		args   string
		accept bool
	}{
		{"-v", true}, {"-vl", true}, {"--verb --li", true}, {"-d127.0.0.1 -i1", true}, {"--ib-dev=lo --ib-port 1", true},
		{"-x", false}, {"-i0", false}, {"-d", false}, {"--nosuch", false}, {"--i 1", false},
	} {
		args := strings.Fields(tc.args)
		if _, err := ParseArgs(args); (err == nil) != tc.accept {
			t.Errorf("devinfo %s: %v, want accepted %v", tc.args, err, tc.accept)
		}
		bin, err := exec.LookPath("ibv_devinfo")
		if err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, _ := exec.CommandContext(ctx, bin, args...).CombinedOutput()
		cancel()
		if accepted := !strings.Contains(string(out), "Usage:"); accepted != tc.accept {
			t.Errorf("%s %s: accepted %v, the table says %v:\n%s", bin, tc.args, accepted, tc.accept, out)
		}
	}
}
