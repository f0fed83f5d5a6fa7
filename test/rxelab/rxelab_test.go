package rxelab

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

func TestMatrixPrint(t *testing.T) {
	var m Matrix
	m.Record("raw-rc-send-64x2", "softroce->rxe", "pass")
	m.Record("raw-rc-send-64x2", "rxe->softroce", "FAIL")
	m.Record("engine-pingpong", "softroce->rxe", "skip")
	var b bytes.Buffer
	m.Print(&b)
	want := "interop matrix (pairing x direction):\n" +
		"pairing           rxe->softroce  softroce->rxe\n" +
		"raw-rc-send-64x2  FAIL           pass         \n" +
		"engine-pingpong   -              skip         \n"
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
	var empty Matrix
	b.Reset()
	empty.Print(&b)
	if !strings.Contains(b.String(), "no pairing ran") {
		t.Errorf("empty matrix: %q", b.String())
	}
}

func TestShQuote(t *testing.T) {
	for _, s := range []string{"", "plain", "it's", `a "b" $c \d`, "x'y'z"} {
		out, err := exec.Command("bash", "-c", "printf %s "+shQuote(s)).Output()
		if err != nil {
			t.Fatal(err)
		}
		if string(out) != s {
			t.Errorf("shQuote(%q) round trip gave %q", s, out)
		}
	}
}

func TestDefaultDir(t *testing.T) {
	t.Setenv("RXE_LAB_DIR", "")
	d := DefaultDir()
	for _, f := range []string{"vm", "setup", "lib.sh"} {
		if _, err := exec.LookPath(d + "/" + f); err != nil && f != "lib.sh" {
			t.Errorf("%s/%s: %v", d, f, err)
		}
	}
	t.Setenv("RXE_LAB_DIR", "/elsewhere")
	if DefaultDir() != "/elsewhere" {
		t.Error("RXE_LAB_DIR ignored")
	}
}

// TestAddressesMatchLibSh: the Go constants are the addresses lib.sh gives the lab.
func TestAddressesMatchLibSh(t *testing.T) {
	out, err := exec.Command("bash", "-c", `. "$0/lib.sh" && echo "$NETNS $TAP $HOST_IP $GUEST_IP $HOST_IP6 $GUEST_IP6"`, DefaultDir()).Output()
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Join([]string{Netns, Tap, HostIP, GuestIP, HostIP6, GuestIP6}, " ")
	if got := strings.TrimSpace(string(out)); got != want {
		t.Errorf("lib.sh: %q, rxelab.go: %q", got, want)
	}
}

// TestCacheAndLockMatchLibSh checks CacheDir and LockPath against what lib.sh computes for
// the same environment, so the Go harness and the scripts agree on the cache and the lock.
func TestCacheAndLockMatchLibSh(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	cases := []map[string]string{
		{},
		{"RXE_LAB_TARGET": "6.12"},
		{"RXE_LAB_TARGET": "6.12", "RXE_LAB_CACHE": "/tmp/c"},
		{"RXE_LAB_CACHE": "/tmp/c"},
		{"RXE_LAB_CACHE": "/tmp/c", "RXE_LAB_LOCK": "/tmp/l"},
	}
	for _, env := range cases {
		for _, k := range []string{"RXE_LAB_TARGET", "RXE_LAB_CACHE", "RXE_LAB_LOCK"} {
			t.Setenv(k, env[k])
		}
		cmd := exec.Command("bash", "-c", `source "$1/lib.sh" && printf '%s\n%s\n' "$CACHE" "$LAB_LOCK"`, "_", DefaultDir())
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%v: lib.sh: %v", env, err)
		}
		want := CacheDir() + "\n" + LockPath() + "\n"
		if string(out) != want {
			t.Errorf("%v: lib.sh says %q, Go says %q", env, out, want)
		}
	}
	t.Setenv("RXE_LAB_TARGET", "6.12; rm")
	if err := exec.Command("bash", "-c", `source "$1/lib.sh"`, "_", DefaultDir()).Run(); err == nil {
		t.Error("lib.sh took RXE_LAB_TARGET=\"6.12; rm\"")
	}
}
