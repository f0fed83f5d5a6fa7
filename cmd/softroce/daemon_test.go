package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/daemon"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/roce"
)

func TestDevinfoEmbedded(t *testing.T) {
	var out, errb bytes.Buffer
	if rc := run([]string{"devinfo", "-v", "-d", "127.0.0.1"}, &out, &errb); rc != 0 {
		t.Fatalf("exit %d: %s", rc, errb.String())
	}
	for _, want := range []string{"hca_id:\tsoftroce0", "state:\t\t\tPORT_ACTIVE (4)", "active_mtu:\t\t4096 (5)",
		"GID[  0]:\t\tfe80:", "GID[  1]:\t\t0000:0000:0000:0000:0000:ffff:7f00:0001, RoCE v2", "max_qp:"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("devinfo lacks %q:\n%s", want, out.String())
		}
	}
}

func TestDevinfoDaemon(t *testing.T) {
	l, err := link.NewMemNetwork(link.MemOptions{}).Attach(netip.MustParseAddr("10.7.0.1"), netip.MustParseAddr("10.7.0.2"))
	if err != nil {
		t.Fatal(err)
	}
	dev, err := roce.Open(roce.Options{Link: l, Name: "softrocetest"})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	srv, _ := daemon.New(daemon.Options{Device: dev, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	sock := filepath.Join(t.TempDir(), "d.sock")
	ln, err := daemon.Listen(sock, 0o600, -1)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}()
	var out, errb bytes.Buffer
	if rc := run([]string{"devinfo", "--daemon", sock}, &out, &errb); rc != 0 {
		t.Fatalf("exit %d: %s", rc, errb.String())
	}
	for _, want := range []string{"hca_id:\tsoftrocetest", "GID[  1]:\t\t0000:0000:0000:0000:0000:ffff:0a07:0001", "GID[  2]:\t\t0000:0000:0000:0000:0000:ffff:0a07:0002"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("devinfo --daemon lacks %q:\n%s", want, out.String())
		}
	}
	if rc := run([]string{"devinfo", "--daemon", filepath.Join(t.TempDir(), "none.sock")}, io.Discard, io.Discard); rc == 0 {
		t.Fatal("devinfo on a missing socket succeeded")
	}
}

func TestDaemonFlags(t *testing.T) {
	o, err := daemonUDPOptions([]string{"127.0.0.1", "::ffff:127.0.0.2"})
	if err != nil || len(o.Addrs) != 2 || o.Addrs[1] != netip.MustParseAddr("127.0.0.2") {
		t.Fatalf("addresses: %+v %v", o, err)
	}
	if o, err := daemonUDPOptions([]string{"lo"}); err != nil || o.Interface != "lo" {
		t.Fatalf("interface: %+v %v", o, err)
	}
	if _, err := daemonUDPOptions([]string{"fe80::1%lo"}); err == nil {
		t.Fatal("zoned address accepted")
	}
	if o, err := daemonUDPOptions(nil); err != nil || len(o.Addrs) == 0 {
		t.Fatalf("default (all addresses): %+v %v", o, err)
	}
	// Bad flags and config are refused before anything is opened.
	cfg := filepath.Join(t.TempDir(), "c.json")
	os.WriteFile(cfg, []byte(`{"listen": ["127.0.0.1"], "bogus": 1}`), 0o600)
	for _, args := range [][]string{
		{"daemon", "--config", cfg},
		{"daemon", "--listen", "127.0.0.1", "--mtu", "1000", "--socket", filepath.Join(t.TempDir(), "s")},
		{"daemon", "--listen", "127.0.0.1", "--metrics", "0.0.0.0:9000", "--port", "0"},
		{"daemon", "--listen", "127.0.0.1", "--post-spin", "fast"},
		{"daemon", "--listen", "127.0.0.1", "--quota-qps", "many"},
	} {
		var errb bytes.Buffer
		if rc := run(args, io.Discard, &errb); rc == 0 {
			t.Fatalf("%v accepted", args)
		}
	}
}

func TestStatsDaemon(t *testing.T) {
	l, err := link.NewMemNetwork(link.MemOptions{}).Attach(netip.MustParseAddr("10.7.0.3"))
	if err != nil {
		t.Fatal(err)
	}
	dev, err := roce.Open(roce.Options{Link: l, Name: "softrocestats"})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	srv, _ := daemon.New(daemon.Options{Device: dev, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	sock := filepath.Join(t.TempDir(), "d.sock")
	ln, err := daemon.Listen(sock, 0o600, -1)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}()
	var out, errb bytes.Buffer
	if rc := run([]string{"stats", "--daemon", sock, "-p"}, &out, &errb); rc != 0 {
		t.Fatalf("exit %d: %s", rc, errb.String())
	}
	if !strings.HasPrefix(out.String(), "link softrocestats/1\n") || !strings.Contains(out.String(), "sent_pkts") {
		t.Fatalf("stats --daemon:\n%s", out.String())
	}
	// Without --daemon the stats command is stats.go's (usage error without a file).
	if rc := run([]string{"stats"}, io.Discard, io.Discard); rc != 2 {
		t.Fatalf("stats without arguments: exit %d", rc)
	}
}

// TestListenMTU: `softroce daemon --listen ADDR` takes the port MTU from the interfaces holding
// the addresses, the smallest one, as rxe does (1500 -> 1024, loopback's 65536 -> 4096); none
// known leaves the device default.
func TestListenMTU(t *testing.T) {
	a, b, c := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("192.0.2.9")
	mtus := map[netip.Addr]int{a: 1500, b: 65536}
	look := func(x netip.Addr) int { return mtus[x] }
	for _, tc := range []struct {
		addrs []netip.Addr
		want  qp.MTU
	}{
		{[]netip.Addr{a}, qp.MTU1024},
		{[]netip.Addr{b}, qp.MTU4096},
		{[]netip.Addr{b, a}, qp.MTU1024},
		{[]netip.Addr{c}, 0},
		{[]netip.Addr{c, b}, qp.MTU4096},
		{nil, 0},
	} {
		if got := listenMTU(tc.addrs, look); got != tc.want {
			t.Errorf("listenMTU(%v) = %v, want %v", tc.addrs, got, tc.want)
		}
	}
	if got := listenMTU([]netip.Addr{netip.MustParseAddr("127.0.0.1")}, interfaceMTU); got != qp.MTU4096 {
		t.Errorf("listenMTU(127.0.0.1) on this host = %v, want 4096 (loopback)", got)
	}
}
