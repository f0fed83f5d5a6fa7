package conform

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// run is the softroce binary's dispatch for these tests: args[0] is "conform".
func run(args []string, stdout, stderr io.Writer) int {
	return Main(context.Background(), args[1:], stdout, stderr)
}

func TestConformList(t *testing.T) {
	var out, errb bytes.Buffer
	if st := run([]string{"conform", "--list"}, &out, &errb); st != 0 {
		t.Fatalf("exit %d: %s", st, errb.String())
	}
	if n := strings.Count(out.String(), "\n"); n < 50 {
		t.Errorf("--list printed %d scenarios, want >= 50", n)
	}
}

func TestConformUsage(t *testing.T) {
	for _, args := range [][]string{{"conform"}, {"conform", "--dut", "nonsense"}, {"conform", "--dut", "softroce", "--run", "("}} {
		var out, errb bytes.Buffer
		if st := run(args, &out, &errb); st != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", args, st, errb.String())
		}
	}
}

// TestConformSoftrocePass runs two scenarios in process: exit 0, table and JSON forms.
func TestConformSoftrocePass(t *testing.T) {
	var out, errb bytes.Buffer
	if st := run([]string{"conform", "--dut", "softroce", "--run", "^(rc-send-only-ack|hdr-bad-icrc)$"}, &out, &errb); st != 0 {
		t.Fatalf("exit %d\n%s\n%s", st, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "2 scenarios: 2 pass, 0 fail, 0 skip") {
		t.Errorf("table:\n%s", out.String())
	}
	out.Reset()
	if st := run([]string{"conform", "--dut", "softroce", "--json", "--run", "^rc-send-only-ack$"}, &out, &errb); st != 0 {
		t.Fatalf("--json exit %d: %s", st, errb.String())
	}
	sc := bufio.NewScanner(&out)
	n := 0
	for sc.Scan() {
		var m map[string]string
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		if m["name"] != "rc-send-only-ack" || m["section"] != "9.7.5.1.1" || m["result"] != "pass" || !jsonKeysExactly(m) {
			t.Errorf("JSON line %v", m)
		}
		n++
	}
	if n != 1 {
		t.Errorf("%d JSON lines, want 1", n)
	}
}

// TestConformFailExit: a scenario that fails makes the exit status 1. The DUT here is
// a broken agent that greets and then refuses every control request, so the
// scenario cannot pass.
func TestConformFailExit(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.79.5:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					reply := "ERR broken agent\n"
					if sc.Text() == "HELLO" {
						reply = "OK broken-agent none\n"
					}
					if _, err := io.WriteString(c, reply); err != nil {
						return
					}
				}
			}(c)
		}
	}()
	var out, errb bytes.Buffer
	if st := run([]string{"conform", "--dut", ln.Addr().String(), "--roce", "127.0.79.5:14791", "--bench", "127.0.79.6:14791",
		"--run", "^rc-send-only-ack$", "--quiet", "100ms", "--reply", "300ms"}, &out, &errb); st != 1 {
		t.Fatalf("exit %d, want 1\n%s\n%s", st, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "fail") {
		t.Errorf("table without the failure:\n%s", out.String())
	}
	// --json: the same failure as one object with exactly the four keys, exit 1
	out.Reset()
	errb.Reset()
	if st := run([]string{"conform", "--dut", ln.Addr().String(), "--roce", "127.0.79.5:14791", "--bench", "127.0.79.6:14791",
		"--run", "^rc-send-only-ack$", "--quiet", "100ms", "--reply", "300ms", "--json"}, &out, &errb); st != 1 {
		t.Fatalf("--json exit %d, want 1\n%s\n%s", st, out.String(), errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var m map[string]string
	if len(lines) != 1 || json.Unmarshal([]byte(lines[0]), &m) != nil || !jsonKeysExactly(m) ||
		m["name"] != "rc-send-only-ack" || m["result"] != "fail" || m["detail"] == "" {
		t.Errorf("--json output on failure %q", out.String())
	}
}

// jsonKeysExactly: the --json object has the keys name, section, result, detail and no other.
func jsonKeysExactly(m map[string]string) bool {
	if len(m) != 4 {
		return false
	}
	for _, k := range []string{"name", "section", "result", "detail"} {
		if _, ok := m[k]; !ok {
			return false
		}
	}
	return true
}

// TestConformServe: a --serve agent (softroce DUT) driven by a --dut HOST:PORT bench.
func TestConformServe(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.79.3:0")
	if err != nil {
		t.Fatal(err)
	}
	ctl := ln.Addr().String()
	ln.Close() // the agent binds it again below
	done := make(chan int, 1)
	var aout, aerr bytes.Buffer
	go func() {
		done <- run([]string{"conform", "--serve", ctl, "--roce", "127.0.79.3:14791"}, &aout, &aerr)
	}()
	var out, errb bytes.Buffer
	st := -1
	for try := 0; try < 100 && st != 0; try++ { // until the agent listens
		out.Reset()
		errb.Reset()
		if st = run([]string{"conform", "--dut", ctl, "--roce", "127.0.79.3:14791", "--bench", "127.0.79.4:14791", "--run", "^(rc-send-only-ack|rc-fetch-add)$"}, &out, &errb); st == 2 {
			<-time.After(20 * time.Millisecond)
			continue
		}
		break
	}
	if st != 0 {
		t.Fatalf("bench exit %d\n%s\n%s", st, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "2 scenarios: 2 pass") {
		t.Errorf("bench output:\n%s", out.String())
	}
	if st := <-done; st != 0 {
		t.Errorf("agent exit %d: %s %s", st, aout.String(), aerr.String())
	}
}

// TestConformRxeRefused: the product binary does not drive the lab: --dut rxe is a usage
// error that names the source tree's driver.
func TestConformRxeRefused(t *testing.T) {
	var out, errb bytes.Buffer
	if st := run([]string{"conform", "--dut", "rxe"}, &out, &errb); st != 2 || !strings.Contains(errb.String(), "test/conform/cmd/conform-rxe") {
		t.Fatalf("exit %d: %s", st, errb.String())
	}
}

// TestConformArgs: the command line in GNU getopt style.
func TestConformArgs(t *testing.T) {
	c, err := ParseArgs([]string{"--dut=softroce", "--run", "^rc-", "-v", "--json", "--reply=1s", "--qui", "100ms"})
	if err != nil || c.DUT != "softroce" || c.Match == nil || !c.Match.MatchString("rc-send-only-ack") || !c.Verbose || !c.JSON ||
		c.Reply != time.Second || c.Quiet != 100*time.Millisecond {
		t.Errorf("%+v %v", c, err)
	}
	if c, err = ParseArgs([]string{"--serve", "127.0.0.1:7471", "--daemon", "s"}); err != nil || c.Serve == "" || c.Daemon != "s" {
		t.Errorf("--serve: %+v %v", c, err)
	}
	for _, args := range [][]string{{}, {"-dut", "softroce"}, {"--dut", "softroce", "--serve", "x"}, {"--dut", "x:1", "--daemon", "s"},
		{"--dut", "softroce", "--run", "("}, {"--dut", "softroce", "extra"}} {
		if _, err := ParseArgs(args); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
}
