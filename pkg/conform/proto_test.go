package conform

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cq"
)

// TestClientServe runs scenarios through the control protocol: Client -> Serve ->
// the softroce DUT, the path an agent takes.
func TestClientServe(t *testing.T) {
	b, err := NewLoopback(LoopbackOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	a, c := net.Pipe()
	done := make(chan error, 1)
	go func() { done <- Serve(a, b.DUT, "go-agent") }()
	cl, err := NewClient(c, ClientOptions{Name: "piped", RoCE: b.DUT.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	if cl.Agent != "go-agent softroce" {
		t.Errorf("HELLO: %q", cl.Agent)
	}
	pb := &Bench{DUT: cl, Peer: b.Peer, Softroce: true, Quiet: 100 * time.Millisecond}
	all := Scenarios()
	for _, name := range []string{"rc-send-only-ack", "rc-fetch-add", "rc-read-multi", "ud-send", "req-read", "rc-write-bad-rkey"} {
		for i := range all {
			if all[i].Name == name {
				if r := RunOne(pb, &all[i], 500+i); r.Result != Pass {
					t.Errorf("%s through the protocol: %s: %s\n%s", name, r.Result, r.Detail, strings.Join(r.Log, "\n"))
				}
			}
		}
	}
	// errors come back typed
	if _, err := cl.ReadMR(999, 0, 1); !errors.Is(err, ErrDUT) {
		t.Errorf("ReadMR of a missing region: %v, want ErrDUT", err)
	}
	if _, err := cl.Poll(0xdead, 1, 0); !errors.Is(err, ErrDUT) {
		t.Errorf("Poll of a missing QP: %v, want ErrDUT", err)
	}
	m, err := cl.RegMR(MRConfig{Size: 16, Access: AllAccess})
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.WriteMR(m.ID, 4, []byte{9, 8, 7}); err != nil {
		t.Fatal(err)
	}
	if got, err := cl.ReadMR(m.ID, 0, 8); err != nil || !bytes.Equal(got, []byte{0, 0, 0, 0, 9, 8, 7, 0}) {
		t.Errorf("ReadMR: % x, %v", got, err)
	}
	if got, err := cl.ReadMR(m.ID, 0, 0); err != nil || len(got) != 0 {
		t.Errorf("empty ReadMR: %v, %v", got, err)
	}
	if err := cl.Close(); err != nil {
		t.Error(err)
	}
	if err := <-done; err != nil {
		t.Errorf("Serve: %v", err)
	}
}

// TestServeBadInput: malformed requests get ERR replies, never a crash.
func TestServeBadInput(t *testing.T) {
	d := &Softroce{mrs: nil, bufs: nil, qps: nil}
	for _, line := range []string{"", "NOPE", "MR", "MR x 1", "MRW 1 0 zz", "QP 2 not-an-ip 1 1 1 1024 1 1 1 1 1 1 1 1",
		"POLL 1 1", "RECV 1 2 3 4 5 x", "SEND 1 2 3 4 5 6 7 8 9 10 11 12 -1", "MRR 1 0 99999999999999999999"} {
		reply, bye := serveLine(d, "t", strings.Fields(line))
		if !strings.HasPrefix(reply, "ERR") || bye {
			t.Errorf("%q -> %q", line, reply)
		}
	}
}

// TestServeHostileNumbers: out-of-range numbers from the wire get ERR, never a panic.
func TestServeHostileNumbers(t *testing.T) {
	b, err := NewLoopback(LoopbackOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	d := b.DUT
	m, err := d.RegMR(MRConfig{Size: 64, Access: AllAccess})
	if err != nil {
		t.Fatal(err)
	}
	qpn, err := d.CreateQP(QPConfig{Type: RC, BenchAddr: LoopbackBench, BenchQPN: 5, MTU: 1024, Access: AllAccess})
	if err != nil {
		t.Fatal(err)
	}
	huge := "4611686018427387904" // 1<<62
	for _, line := range []string{
		"MRR " + itoa(m.ID) + " " + huge + " " + huge,
		"MRR " + itoa(m.ID) + " 60 18446744073709551615",
		"MRW " + itoa(m.ID) + " " + huge + " 00",
		"RECV " + itoa(int(qpn)) + " " + itoa(m.ID) + " " + huge + " " + huge + " 1 1",
		"RECV " + itoa(int(qpn)) + " " + itoa(m.ID) + " 0 8 18446744073709551615 1",
		"POLL " + itoa(int(qpn)) + " 18446744073709551615 0",
		"SEND " + itoa(int(qpn)) + " 2 " + itoa(m.ID) + " " + huge + " " + huge + " 0 0 0 0 0 0 0 0",
		"MR 18446744073709551615 0",
	} {
		reply, _ := serveLine(d, "t", strings.Fields(line))
		if !strings.HasPrefix(reply, "ERR") {
			t.Errorf("%q -> %q, want ERR", line, reply)
		}
	}
}

func itoa(v int) string { return strconv.Itoa(v) }

func TestCompletionString(t *testing.T) {
	s := Completion{WRID: 3, Status: cq.StatusRemAccessErr, ByteLen: 5}.String()
	if !strings.Contains(s, "wrid=3") || !strings.Contains(s, "len=5") {
		t.Errorf("%s", s)
	}
	_ = netip.Addr{}
}
