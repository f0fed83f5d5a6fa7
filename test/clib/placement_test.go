package clib

import (
	"encoding/binary"
	"encoding/hex"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestCPlacementFlush runs the memory placement peer of the interop pairings
// (test/interop/placement/placement.c) built against Debian 13's rdma-core 56, whose
// verbs.h has ibv_wr_flush (test/interop/placement/build-flush), as that build is, through
// the libraries, server and client on two daemons: the client's RDMA WRITE, FLUSHes at both
// selectivity levels, ATOMIC WRITEs and READs all complete successfully (the FLUSHes as
// IBV_WC_FLUSH) and the server's region is byte for byte what they placed. A program built
// against the newer headers reaches the library's wr_flush through its own struct ibv_qp_ex
// layout. The first run downloads trixie's rdma-core packages into build-flush's cache; the
// test skips, saying why, when they cannot be had.
func TestCPlacementFlush(t *testing.T) {
	needDevice(t)
	root := filepath.Join(t.TempDir(), "trixie")
	if out, err := exec.Command(filepath.Join("..", "interop", "placement", "build-flush"), root).CombinedOutput(); err != nil {
		t.Skipf("the rdma-core 56 build of the placement peer (needs deb.debian.org once): %v: %s", err, out)
	}
	bin := filepath.Join(root, "placement")
	a, b := startDaemon(t), startDaemon(t)
	port := freePort(t)
	args := func(d daemon) []string {
		return []string{"-d", d.dev.Name(), "-g", strconv.Itoa(d.dev.GIDIndex(d.addr)), "-p", strconv.Itoa(port)}
	}
	sout, cout := pair(t, tool{name: bin, args: args(a), d: a},
		tool{name: bin, args: append(args(b), a.addr.String()), d: b}, port, 60*time.Second)
	if n, f := strings.Count(cout, " status=0 (success)"), strings.Count(cout, "opcode=8 status=0 (success)"); n != 8 || f != 2 ||
		!strings.Contains(cout, "placement: client ok (8 operations)") {
		t.Errorf("client: %d successful completions (want 8), %d of them IBV_WC_FLUSH (want 2):\n%s", n, f, cout)
	}
	// the server's region: byte i = i*7+3, the WRITE's 256 bytes (0xa5 ^ k) at 512, the last
	// ATOMIC WRITEs at 8 and at 4088 (placement.c's sequence)
	want := make([]byte, 4096)
	for i := range want {
		want[i] = byte(i*7 + 3)
	}
	for k := 0; k < 256; k++ {
		want[512+k] = byte(0xa5 ^ k)
	}
	binary.LittleEndian.PutUint64(want[8:], 0x8877665544332211)
	binary.LittleEndian.PutUint64(want[4088:], 0x0102030405060708)
	lines := regexp.MustCompile(`(?m)^mem ([0-9a-f]{4}) ([0-9a-f]{128})$`).FindAllStringSubmatch(sout, -1)
	if len(lines) != 64 {
		t.Fatalf("server: %d region lines, want 64:\n%s", len(lines), sout)
	}
	got := make([]byte, 0, 4096)
	for _, l := range lines {
		b, err := hex.DecodeString(l[2])
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, b...)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("server region byte %#x = %#02x, want %#02x", i, got[i], want[i])
		}
	}
}
