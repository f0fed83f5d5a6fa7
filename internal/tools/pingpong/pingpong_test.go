package pingpong

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/oob"
	oobpp "github.com/softroce/softroce/internal/oob/pingpong"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/internal/tools/cli"
	tooltest "github.com/softroce/softroce/internal/tools/tooltest"
)

// ppEnv is where a test's run writes, plus the Config's test seams.
type ppEnv struct {
	Stdout, Stderr io.Writer
	Listener       net.Listener
	Fill           func(buf []byte)
	OnRecv         func(wc *cq.WC, data []byte)
}

// pingpongMain is Main with env's seams.
func pingpongMain(args []string, env *ppEnv) int {
	return main(context.Background(), args, env.Stdout, env.Stderr, func(c *Config) {
		c.Listener, c.Fill, c.OnRecv = env.Listener, env.Fill, env.OnRecv
	})
}

// ppSide is the result of one side of a run.
type ppSide struct {
	status         int
	stdout, stderr string
	recvs          int
	recvErrs       []string
}

// ppPair runs a server (on 127.0.0.1) and a client (on 127.0.0.2) of one tool in this
// process with the same extra flags; every received message is checked against the
// client's send pattern (the echo of the client's buffer, the GRH included for UD).
func ppPair(t *testing.T, tool string, extra ...string) (srv, cli ppSide) {
	t.Helper()
	return ppPairVia(t, tool, tooltest.FreeUDPPort(t), "", "", extra...)
}

// ppPairVia is ppPair on RoCE UDP port roce, with a side going through the softroce daemon
// listening on srvDaemon or cliDaemon when that is not empty (the daemon's device must be on
// the side's address, 127.0.0.1 for the server, 127.0.0.2 for the client, port roce).
func ppPairVia(t *testing.T, tool string, roce uint16, srvDaemon, cliDaemon string, extra ...string) (srv, cli ppSide) {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tcpPort := ln.Addr().(*net.TCPAddr).Port
	sideArgs := func(daemon string) []string {
		a := []string{tool, "-p", strconv.Itoa(tcpPort), "--timeout", "20s"}
		if daemon != "" {
			return append(append(a, "--daemon", daemon), extra...)
		}
		return append(append(a, "--roce-port", strconv.Itoa(int(roce))), extra...)
	}

	// The client fills its buffer with random bytes, keeping the -c pattern (a zero at each
	// page start); every message either side receives must be exactly that.
	pattern := make([]byte, 1<<20)
	for i := range pattern {
		pattern[i] = byte(rand.Uint32())
	}
	ppFillPages(pattern)
	isUD := tool == "ud"
	check := func(s *ppSide, peer netip.Addr) func(wc *cq.WC, data []byte) {
		return func(wc *cq.WC, data []byte) {
			s.recvs++
			if len(s.recvErrs) > 5 {
				return
			}
			payload := data
			if isUD {
				if err := checkGRH(data, peer); err != nil {
					s.recvErrs = append(s.recvErrs, fmt.Sprintf("recv %d: %v", s.recvs, err))
				}
				if wc.Flags&cq.FlagGRH == 0 {
					s.recvErrs = append(s.recvErrs, fmt.Sprintf("recv %d: no GRH flag", s.recvs))
				}
				if len(payload) < ppGRHSize {
					s.recvErrs = append(s.recvErrs, fmt.Sprintf("recv %d: %d bytes", s.recvs, len(data)))
					return
				}
				payload = data[ppGRHSize:]
			}
			if !bytes.Equal(payload, pattern[:len(payload)]) {
				s.recvErrs = append(s.recvErrs, fmt.Sprintf("recv %d: %d bytes differ from the client's buffer", s.recvs, len(payload)))
			}
			if wc.Opcode != cq.OpRecv {
				s.recvErrs = append(s.recvErrs, fmt.Sprintf("recv %d: opcode %v", s.recvs, wc.Opcode))
			}
		}
	}
	var sOut, sErr, cOut, cErr bytes.Buffer
	lo1, lo2 := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		env := &ppEnv{Stdout: &sOut, Stderr: &sErr, Listener: ln, OnRecv: check(&srv, lo2)}
		srv.status = pingpongMain(append(sideArgs(srvDaemon), "-d", "127.0.0.1"), env)
	}()
	env := &ppEnv{Stdout: &cOut, Stderr: &cErr, OnRecv: check(&cli, lo1),
		Fill: func(b []byte) { copy(b, pattern) }}
	cli.status = pingpongMain(append(sideArgs(cliDaemon), "-d", "127.0.0.2", "127.0.0.1"), env)
	wg.Wait()
	srv.stdout, srv.stderr, cli.stdout, cli.stderr = sOut.String(), sErr.String(), cOut.String(), cErr.String()
	return srv, cli
}

// checkGRH checks the 40 bytes a UD receive starts with: for IPv4 the first 20 are unused
// and the last 20 are the IPv4 header of the packet (ibverbs/rxe layout, IBTA 11.4.1.2).
func checkGRH(data []byte, src netip.Addr) error {
	if len(data) < ppGRHSize {
		return fmt.Errorf("%d bytes, no room for a GRH", len(data))
	}
	ip := data[20:40]
	if ip[0] != 0x45 {
		return fmt.Errorf("GRH: IPv4 version/IHL %#x, want 0x45", ip[0])
	}
	if got := netip.AddrFrom4([4]byte(ip[12:16])); got != src {
		return fmt.Errorf("GRH: source %v, want %v", got, src)
	}
	if n := int(binary.BigEndian.Uint16(ip[2:4])); n != len(data)-20+8+12+8+4 {
		// total length = IP 20 + UDP 8 + BTH 12 + DETH 8 + payload + ICRC 4
		return fmt.Errorf("GRH: IPv4 total length %d for %d payload bytes", n, len(data)-ppGRHSize)
	}
	return nil
}

var (
	localRe  = regexp.MustCompile(`(?m)^  local address:  LID 0x0000, QPN 0x([0-9a-f]{6}), PSN 0x([0-9a-f]{6})[,:] GID (\S+)$`)
	remoteRe = regexp.MustCompile(`(?m)^  remote address: LID 0x0000, QPN 0x([0-9a-f]{6}), PSN 0x([0-9a-f]{6}), GID (\S+)$`)
)

// checkPPOutput checks one side's stdout: numQP local and remote lines (ud's local line has
// the colon), the peer's local addresses as our remote ones, the two result lines, no
// "invalid data" line.
func checkPPOutput(t *testing.T, who string, s, peer ppSide, tool string, size, iters, numQP int, gid string) {
	t.Helper()
	if s.status != 0 {
		t.Errorf("%s: exit %d\nstdout:\n%s\nstderr:\n%s", who, s.status, s.stdout, s.stderr)
		return
	}
	locals := localRe.FindAllStringSubmatch(s.stdout, -1)
	remotes := remoteRe.FindAllStringSubmatch(s.stdout, -1)
	peerLocals := localRe.FindAllStringSubmatch(peer.stdout, -1)
	if len(locals) != numQP || len(remotes) != numQP || len(peerLocals) != numQP {
		t.Errorf("%s: %d local, %d remote lines (peer %d local), want %d:\n%s", who, len(locals), len(remotes), len(peerLocals), numQP, s.stdout)
		return
	}
	for i := range locals {
		if locals[i][3] != gid {
			t.Errorf("%s: local GID %s, want %s", who, locals[i][3], gid)
		}
		if remotes[i][1] != peerLocals[i][1] || remotes[i][2] != peerLocals[i][2] || remotes[i][3] != peerLocals[i][3] {
			t.Errorf("%s: remote line %d %v is not the peer's local line %v", who, i, remotes[i][1:], peerLocals[i][1:])
		}
	}
	sep := ","
	if tool == "ud" {
		sep = ":"
	}
	if !strings.Contains(s.stdout, "PSN 0x"+locals[0][2]+sep+" GID") {
		t.Errorf("%s: local line separator is not %q", who, sep)
	}
	bytesRe := regexp.MustCompile(fmt.Sprintf(`(?m)^%d bytes in [0-9.]+ seconds = [0-9.]+ Mbit/sec\n%d iters in [0-9.]+ seconds = [0-9.]+ usec/iter\n`, size*iters*2, iters))
	if !bytesRe.MatchString(s.stdout) {
		t.Errorf("%s: no result lines for size %d, %d iters:\n%s", who, size, iters, s.stdout)
	}
	if strings.Contains(s.stdout, "invalid data") {
		t.Errorf("%s: -c found invalid data:\n%s", who, s.stdout)
	}
	if s.stderr != "" {
		t.Errorf("%s: stderr %q", who, s.stderr)
	}
	for _, e := range s.recvErrs {
		t.Errorf("%s: %s", who, e)
	}
}

// TestPingpongPairs runs every tool between two in-process softroce devices over UDP on
// 127.0.0.1 / 127.0.0.2, with -c, message sizes below and above the 1024-byte path MTU (ud:
// below and at its limit, one packet), busy polling and -e.
func TestPingpongPairs(t *testing.T) {
	cases := []struct {
		tool        string
		size, iters int
		numQP       int
		flags       []string
	}{
		{"rc", 64, 50, 1, []string{"-e"}},
		{"rc", 3000, 50, 1, nil},
		{"rc", 4096, 20, 1, []string{"-e", "-m", "2048", "-r", "4"}}, // receives refilled
		{"uc", 64, 50, 1, nil},
		{"uc", 3000, 50, 1, []string{"-e"}},
		{"ud", 64, 50, 1, []string{"-e"}},
		{"ud", 4096, 50, 1, nil}, // loopback MTU 65536 -> port MTU 4096
		{"srq", 64, 60, 16, []string{"-e"}},
		{"srq", 3000, 60, 4, []string{"-q", "4", "-r", "8"}},
		{"rc", 3000, 50, 1, []string{"--selective-repeat"}},
		{"srq", 3000, 60, 4, []string{"-q", "4", "-r", "8", "--selective-repeat"}},
	}
	for _, c := range cases {
		name := fmt.Sprintf("%s-%dx%d-%s", c.tool, c.size, c.iters, strings.Join(c.flags, ""))
		t.Run(name, func(t *testing.T) {
			flags := append([]string{"-c", "-s", strconv.Itoa(c.size), "-n", strconv.Itoa(c.iters)}, c.flags...)
			srv, cli := ppPair(t, c.tool, flags...)
			checkPPOutput(t, "server", srv, cli, c.tool, c.size, c.iters, c.numQP, "::ffff:127.0.0.1")
			checkPPOutput(t, "client", cli, srv, c.tool, c.size, c.iters, c.numQP, "::ffff:127.0.0.2")
			// each side receives at least iters messages (srq: the count is over all QPs)
			if srv.recvs < c.iters || cli.recvs < c.iters {
				t.Errorf("received %d (server) and %d (client) messages, want >= %d", srv.recvs, cli.recvs, c.iters)
			}
		})
	}
}

// TestPingpongUDTooBig: ud_pingpong refuses a message larger than the port MTU.
func TestPingpongUDTooBig(t *testing.T) {
	srv, _ := ppPairServerOnly(t, "ud", "-s", "4097", "-d", "127.0.0.1")
	if srv.status != 1 || !strings.Contains(srv.stderr, "Requested size larger than port MTU (4096)") {
		t.Fatalf("exit %d, stderr %q", srv.status, srv.stderr)
	}
}

// ppPairServerOnly runs one side alone with a short timeout.
func ppPairServerOnly(t *testing.T, args ...string) (ppSide, net.Listener) {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	args = append(args, "--roce-port", strconv.Itoa(int(tooltest.FreeUDPPort(t))), "--timeout", "300ms",
		"-p", strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))
	st := pingpongMain(args, &ppEnv{Stdout: &out, Stderr: &errb, Listener: ln})
	return ppSide{status: st, stdout: out.String(), stderr: errb.String()}, ln
}

// TestPingpongNoPeer: every wait is bounded: a server nobody connects to, a client whose
// server does not listen, and a server whose client exchanges addresses and then goes
// silent all exit 1 with a clear message instead of hanging.
func TestPingpongNoPeer(t *testing.T) {
	t.Run("server-alone", func(t *testing.T) {
		s, _ := ppPairServerOnly(t, "rc", "-d", "127.0.0.1")
		if s.status != 1 || !strings.Contains(s.stderr, "no client connected") {
			t.Fatalf("exit %d, stderr %q", s.status, s.stderr)
		}
		if len(localRe.FindAllString(s.stdout, -1)) != 1 {
			t.Errorf("with -d the local address is printed before waiting: %q", s.stdout)
		}
	})
	t.Run("client-alone", func(t *testing.T) {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close() // nobody listens there now
		var out, errb bytes.Buffer
		st := pingpongMain([]string{"uc", "-d", "127.0.0.2", "-p", strconv.Itoa(port), "--timeout", "300ms",
			"--roce-port", strconv.Itoa(int(tooltest.FreeUDPPort(t))), "127.0.0.1"}, &ppEnv{Stdout: &out, Stderr: &errb})
		if st != 1 || !strings.Contains(errb.String(), "Couldn't connect to 127.0.0.1:"+strconv.Itoa(port)) {
			t.Fatalf("exit %d, stderr %q", st, errb.String())
		}
	})
	for _, zeroGID := range []bool{false, true} {
		// zeroGID: the client sends a zero GID (a tool run without -g); the server then uses
		// the TCP peer address, connects its QP and waits for a SEND that never comes.
		t.Run(fmt.Sprintf("silent-client-zero-gid=%v", zeroGID), func(t *testing.T) {
			ln, err := net.Listen("tcp4", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			var out, errb bytes.Buffer
			done := make(chan int)
			go func() {
				done <- pingpongMain([]string{"rc", "-d", "127.0.0.1", "-e", "--timeout", "300ms", "--roce-port",
					strconv.Itoa(int(tooltest.FreeUDPPort(t))), "-p", "1"}, &ppEnv{Stdout: &out, Stderr: &errb, Listener: ln})
			}()
			// a client that exchanges a plausible record and never sends a packet
			me := oobpp.Dest{QPN: 0x99, PSN: 0x1234}
			wantGID := "::"
			if !zeroGID {
				me.SetAddr(netip.MustParseAddr("127.0.0.2"))
				wantGID = "::ffff:127.0.0.2"
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			remote, err := oobpp.Dial(ctx, ln.Addr().String(), []oobpp.Dest{me}, oobpp.Options{Options: oob.Options{Timeout: 5 * time.Second}})
			if err != nil {
				t.Fatal(err)
			}
			st := <-done
			if st != 1 || !strings.Contains(errb.String(), "timed out: no completion") {
				t.Fatalf("exit %d, stderr %q", st, errb.String())
			}
			if remote[0].QPN < 0x11 || remote[0].Addr().Unmap() != netip.MustParseAddr("127.0.0.1") {
				t.Errorf("server record %+v", remote[0])
			}
			if !strings.Contains(out.String(), "remote address: LID 0x0000, QPN 0x000099, PSN 0x001234, GID "+wantGID+"\n") {
				t.Errorf("stdout %q", out.String())
			}
		})
	}
}

// TestPingpongServerWithoutDev: without -d the server opens its device on the address the
// client reached it on, and prints its local line after the client connected.
func TestPingpongServerWithoutDev(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	roce := strconv.Itoa(int(tooltest.FreeUDPPort(t)))
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	var sOut, sErr, cOut, cErr bytes.Buffer
	done := make(chan int)
	go func() {
		done <- pingpongMain([]string{"rc", "-e", "-n", "5", "-s", "100", "--roce-port", roce, "-p", port},
			&ppEnv{Stdout: &sOut, Stderr: &sErr, Listener: ln})
	}()
	// the client without -d routes to 127.0.0.1 from 127.0.0.1: use 127.0.0.2 explicitly
	cst := pingpongMain([]string{"rc", "-d", "127.0.0.2", "-e", "-n", "5", "-s", "100", "--roce-port", roce, "-p", port, "127.0.0.1"},
		&ppEnv{Stdout: &cOut, Stderr: &cErr})
	sst := <-done
	if sst != 0 || cst != 0 {
		t.Fatalf("server %d %s%s; client %d %s%s", sst, sOut.String(), sErr.String(), cst, cOut.String(), cErr.String())
	}
	if !strings.Contains(sOut.String(), "GID ::ffff:127.0.0.1\n  remote address:") {
		t.Errorf("server output %q", sOut.String())
	}
}

// TestPingpongFlags checks the command line: defaults, getopt-like permutation, the options
// each tool knows, and the refusals.
func TestPingpongFlags(t *testing.T) {
	c, err := ParseArgs([]string{"ud"})
	if err != nil || c.Size != 1024 || c.Tool != oobpp.ToolUD || c.Port != 18515 || c.RxDepth != 500 || c.Iters != 1000 || c.Server != "" {
		t.Errorf("ud defaults %+v, %v", c, err)
	}
	c, err = ParseArgs([]string{"srq", "10.1.2.3", "-s", "0x40", "--num-qp", "3", "-e", "-c", "-g", "1"})
	if err != nil || c.Size != 64 || c.NumQP != 3 || !c.Events || !c.Validate || c.GIDIndex != 1 || c.Server != "10.1.2.3" || c.MTU != qp.MTU1024 {
		t.Errorf("srq %+v, %v", c, err)
	}
	c, err = ParseArgs([]string{"-m", "4096", "-d", "lo", "h"})
	if err != nil || c.Tool != oobpp.ToolRC || c.MTU != qp.MTU4096 || c.Dev.Interface != "lo" || c.Server != "h" || c.NumQP != 1 || c.Size != 4096 {
		t.Errorf("rc %+v, %v", c, err)
	}
	c, err = ParseArgs([]string{"uc", "-l", "5", "--sl", "7", "-p", "18999", "-r", "9", "-n", "3", "h"})
	if err != nil || c.SL != 7 || c.Port != 18999 || c.RxDepth != 9 || c.Iters != 3 {
		t.Errorf("uc -l/--sl -p -r -n: %+v, %v", c, err)
	}
	c, err = ParseArgs([]string{"ud", "-l", "15"})
	if err != nil || c.SL != 15 {
		t.Errorf("ud -l 15: %+v, %v", c, err)
	}
	for _, args := range [][]string{{"rc", "-l", "16"}, {"srq", "--sl", "-1"}} {
		if _, err := ParseArgs(args); !errors.Is(err, errPPUsage) || !strings.Contains(err.Error(), "service levels are 0..15") {
			t.Errorf("%q: %v, want the service level refusal", args, err)
		}
	}
	bad := map[string][]string{
		"unsupported":  {"rc", "-o"},
		"ts":           {"rc", "-t"},
		"dm":           {"rc", "-j"},
		"odp on srq":   {"srq", "--odp"},
		"ud has no -m": {"ud", "-m", "1024"},
		"uc has no -o": {"uc", "-o"},
		"rc has no -q": {"rc", "-q", "2"},
		"mtu":          {"rc", "-m", "1000"},
		"port":         {"rc", "-p", "70000"},
		"ib port":      {"rc", "-i", "2"},
		"two servers":  {"rc", "a", "b"},
		"qp > rx":      {"srq", "-q", "8", "-r", "4"},
		"qp max":       {"srq", "-q", "256", "-r", "500"},
		"size":         {"rc", "-s", "0"},
		"rx depth":     {"srq", "-r", "10000000000"},
		"iters":        {"uc", "-n", "0"},
		"bad dev":      {"rc", "-d", "a/b"},
		"unknown":      {"rc", "--bogus"},
	}
	for name, args := range bad {
		var out, errb bytes.Buffer
		if st := pingpongMain(args, &ppEnv{Stdout: &out, Stderr: &errb}); st != 1 || errb.Len() == 0 {
			t.Errorf("%s %q: exit %d, stderr %q", name, args, st, errb.String())
		}
	}
	var out, errb bytes.Buffer
	if st := pingpongMain([]string{"rc", "-t"}, &ppEnv{Stdout: &out, Stderr: &errb}); !strings.Contains(errb.String(), "not supported by softroce") {
		t.Errorf("-t: exit %d %q", st, errb.String())
	}
}

// TestPingpongGetopt: command lines of ibv_{rc,uc,ud,srq}_pingpong as their getopt_long
// reads them (attached values, grouped flags, --name=value, unambiguous abbreviations,
// options after the host) are accepted with the same meaning; what getopt_long refuses
// (an option without its value, an ambiguous abbreviation, an option the tool lacks) is
// refused.
func TestPingpongGetopt(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want func(c Config) bool
	}{
		{[]string{"rc", "-g1", "-s4096", "-n1000", "-ec", "h"}, func(c Config) bool {
			return c.GIDIndex == 1 && c.Size == 4096 && c.Iters == 1000 && c.Events && c.Validate && c.Server == "h"
		}},
		{[]string{"h", "-d", "127.0.0.2", "-m2048"}, func(c Config) bool {
			return c.Tool == oobpp.ToolRC && c.Dev.Addr.String() == "127.0.0.2" && c.MTU == qp.MTU2048 && c.Server == "h"
		}},
		{[]string{"srq", "-q4", "-r8", "-ce", "--gid-idx=1"}, func(c Config) bool {
			return c.NumQP == 4 && c.RxDepth == 8 && c.Validate && c.Events && c.GIDIndex == 1 && c.Server == ""
		}},
		{[]string{"ud", "--size=512", "--iters", "10", "--rx", "4", "--ib-dev=lo"}, func(c Config) bool {
			return c.Size == 512 && c.Iters == 10 && c.RxDepth == 4 && c.Dev.Interface == "lo"
		}},
		{[]string{"uc", "--chk", "--eve", "-p18600", "h"}, func(c Config) bool {
			return c.Validate && c.Events && c.Port == 18600
		}},
		{[]string{"rc", "-N", "--new_send", "-i", "1", "-l0", "--", "h"}, func(c Config) bool { return c.Server == "h" }},
		{[]string{"rc", "-s", "12abc", "-n0x10"}, func(c Config) bool { return c.Size == 12 && c.Iters == 16 }}, // strtoul
	} {
		c, err := ParseArgs(tc.args)
		if err != nil || !tc.want(c) {
			t.Errorf("%q: %+v, %v", tc.args, c, err)
		}
	}
	for _, args := range [][]string{
		{"rc", "-s"},                // the value is missing
		{"rc", "--i", "5"},          // ambiguous: ib-dev, ib-port, iters, iodp
		{"ud", "-m2048"},            // ud_pingpong has no -m
		{"uc", "-ce", "-q", "2"},    // only srq has -q
		{"rc", "--iters=5", "-x"},   // unknown
		{"srq", "--num-qp"},         // the value is missing
		{"rc", "--events=yes", "h"}, // no such bool value
	} {
		if _, err := ParseArgs(args); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
	// The same and more, checked against the tools themselves where rdma-core's
	// ibverbs-utils are installed (the lab's packages, CI): their parser accepted a command
	// line when they went on to look for a device.
	for _, tc := range []struct {
		args   string
		accept bool
	}{
		{"rc -g1 -s4096 -n1000 -ec h", true},
		{"rc -s 12abc", true}, // strtoul: 12
		{"rc -s 0x40 --rx-depth=8 --iters 5", true},
		{"rc --gid 1 --chk", true},
		{"uc -l 3 -p18600 h", true},
		{"ud -s 512 -r 4 -e", true},
		{"srq -q4 -r8 -ce", true},
		{"rc -m 1000", false},
		{"rc -x", false},
		{"rc --i 5", false},
		{"rc -q 2", false},
		{"ud -m 1024", false},
		{"uc -o", false},
		{"rc -s", false},
	} {
		args := strings.Fields(tc.args)
		_, err := ParseArgs(args)
		if (err == nil) != tc.accept && !errors.Is(err, ErrUnsupported) {
			t.Errorf("%s: accepted %v, want %v (%v)", tc.args, err == nil, tc.accept, err)
		}
		bin, lerr := exec.LookPath("ibv_" + args[0] + "_pingpong")
		if lerr != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, _ := exec.CommandContext(ctx, bin, args[1:]...).CombinedOutput()
		cancel()
		if accepted := !strings.Contains(string(out), "Usage:"); accepted != tc.accept {
			t.Errorf("%s %s: accepted %v, the table says %v:\n%s", bin, strings.Join(args[1:], " "), accepted, tc.accept, out)
		}
	}
}

// TestPingpongPages is the -c pattern and check of rdma-core v44: a zero byte at each page
// start of the client's buffer, one "invalid data in page N" line per page that differs.
func TestPingpongPages(t *testing.T) {
	b := bytes.Repeat([]byte{0x7b}, 3*ppPageSize+10)
	ppFillPages(b)
	for i := range b {
		want := byte(0x7b)
		if i%ppPageSize == 0 {
			want = 0
		}
		if b[i] != want {
			t.Fatalf("byte %d = %#x, want %#x", i, b[i], want)
		}
	}
	var w bytes.Buffer
	if n := ppCheckPages(&w, b); n != 0 || w.Len() != 0 {
		t.Fatalf("clean buffer: %d bad, %q", n, w.String())
	}
	b[ppPageSize] = 1
	b[3*ppPageSize] = 0x7b
	b[5] = 9 // not a page start: not checked, as in the tools
	if n := ppCheckPages(&w, b); n != 2 || w.String() != "invalid data in page 1\ninvalid data in page 3\n" {
		t.Fatalf("%d bad, %q", n, w.String())
	}
}

// TestDevFlag checks -d parsing, local address resolution and rxe's port MTU rule.
// TestPingpongLoopAllocs: one ping-pong round trip (SEND, RECV, echo, with the receive
// refills) between two in-process devices on UDP sockets (127.0.0.1, 127.0.0.2) allocates
// nothing, in the pingpong loop nor in the engine and link under it. (The in-memory test link
// copies each datagram, so it is not used here.)
func TestPingpongLoopAllocs(t *testing.T) {
	for _, tc := range []struct {
		tool string
		args []string
	}{
		{"rc", []string{"-s", "3000"}},
		{"uc", []string{"-s", "3000"}},
		{"ud", []string{"-s", "512"}},
		{"srq", []string{"-s", "3000", "-q", "2"}},
	} {
		t.Run(tc.tool, func(t *testing.T) {
			addrs := []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")}
			port := tooltest.FreeUDPPort(t)
			var ctxs [2]*ppCtx
			var loops [2]*ppLoop
			for i, a := range addrs {
				ld, err := cli.OpenLocal(&cli.DevFlag{Addr: a}, cli.DevOptions{Port: port, MTU: qp.MTU1024})
				if err != nil {
					t.Fatal(err)
				}
				defer ld.Dev.Close()
				c, err := ParseArgs(append([]string{tc.tool, "-n", "1000000000", "-r", "16"}, tc.args...))
				if err != nil {
					t.Fatal(err)
				}
				if ctxs[i], err = newPPCtx(&c, ld.Verbs()); err != nil {
					t.Fatal(err)
				}
				defer ctxs[i].close()
			}
			for i := range ctxs {
				if err := ctxs[i].connect(ctxs[1-i].mine, addrs[1-i]); err != nil {
					t.Fatal(err)
				}
				loops[i] = ctxs[i].newLoop()
			}
			if err := loops[0].start(true); err != nil {
				t.Fatal(err)
			}
			pump := func(l *ppLoop) bool {
				n := l.p.cq.Poll(l.wcs)
				for i := 0; i < n; i++ {
					if err := l.handle(&l.wcs[i]); err != nil {
						t.Fatal(err)
					}
				}
				return n > 0
			}
			timer := time.NewTimer(time.Hour)
			defer timer.Stop()
			round := func() { // until the client has received one more echo
				target := loops[0].rcnt + 1
				deadline := time.Now().Add(10 * time.Second)
				for loops[0].rcnt < target {
					if a, b := pump(loops[0]), pump(loops[1]); a || b {
						continue
					}
					if time.Now().After(deadline) {
						t.Fatalf("no progress: client %d/%d, server %d/%d (sent/received)", loops[0].scnt, loops[0].rcnt, loops[1].scnt, loops[1].rcnt)
					}
					// sleep on both CQs (armed, then checked, as ibverbs consumers do)
					c0, c1 := ctxs[0].cq.(*cq.CQ), ctxs[1].cq.(*cq.CQ)
					_, _ = c0.ReqNotify(false), c1.ReqNotify(false)
					if c0.Len() == 0 && c1.Len() == 0 {
						timer.Reset(5 * time.Millisecond)
						select {
						case <-c0.Channel():
						case <-c1.Channel():
						case <-timer.C:
						}
						timer.Stop()
					}
				}
			}
			for i := 0; i < 40; i++ { // warm up: pools, the refill of the 16 receives
				round()
			}
			if n := testing.AllocsPerRun(100, round); n != 0 {
				t.Errorf("%v allocations per round trip", n)
			}
			if loops[0].rcnt < 140 || loops[1].rcnt < 140 {
				t.Errorf("only %d and %d messages received", loops[0].rcnt, loops[1].rcnt)
			}
		})
	}
}

// TestPingpongPeerExits: a server that stops after 5 exchanges while the client wants more.
// The client's 6th SEND reaches the server before it closes (RC: and is acknowledged), so the
// client waits for an echo that never comes and times out; if the server closed first, an RC
// client's SEND is never acknowledged and the engine gives up after retry_cnt 7 (IBTA
// 9.7.6.1.3), which the tool reports as the failed completion. Either way: exit 1, no hang.
func TestPingpongPeerExits(t *testing.T) {
	for _, tc := range []struct {
		tool string
		want []string
	}{
		{"rc", []string{"timed out: no completion for 1s (6 of 1000 SENDs and 5 of 1000 RECVs completed)",
			"Failed status transport retry counter exceeded (12) for wr_id 2"}},
		{"uc", []string{"timed out: no completion for 1s (6 of 1000 SENDs and 5 of 1000 RECVs completed)"}},
	} {
		t.Run(tc.tool, func(t *testing.T) {
			ln, err := net.Listen("tcp4", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			roce := strconv.Itoa(int(tooltest.FreeUDPPort(t)))
			port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
			var sOut, sErr, cOut, cErr bytes.Buffer
			done := make(chan int)
			go func() {
				done <- pingpongMain([]string{tc.tool, "-d", "127.0.0.1", "-e", "-n", "5", "-s", "100", "--roce-port", roce, "-p", port},
					&ppEnv{Stdout: &sOut, Stderr: &sErr, Listener: ln})
			}()
			cst := pingpongMain([]string{tc.tool, "-d", "127.0.0.2", "-e", "-n", "1000", "-s", "100", "--timeout", "1s", "--roce-port", roce, "-p", port, "127.0.0.1"},
				&ppEnv{Stdout: &cOut, Stderr: &cErr})
			if sst := <-done; sst != 0 {
				t.Errorf("server exit %d: %s", sst, sErr.String())
			}
			found := false
			for _, w := range tc.want {
				found = found || strings.Contains(cErr.String(), w)
			}
			if cst != 1 || !found {
				t.Errorf("client exit %d, stderr %q, want %q", cst, cErr.String(), tc.want)
			}
			if strings.Contains(cOut.String(), "iters in") {
				t.Errorf("client printed results: %q", cOut.String())
			}
		})
	}
}

// TestPingpongSelectiveRepeatFlag: --selective-repeat sets the attribute for rc and srq and is
// refused where it cannot apply (uc, ud, --daemon).
func TestPingpongSelectiveRepeatFlag(t *testing.T) {
	for _, tool := range []string{"rc", "srq"} {
		c, err := ParseArgs([]string{tool, "--selective-repeat"})
		if err != nil || !c.SelectiveRepeat {
			t.Fatalf("%s: %v %v", tool, c.SelectiveRepeat, err)
		}
	}
	for _, args := range [][]string{{"uc", "--selective-repeat"}, {"ud", "--selective-repeat"},
		{"rc", "--selective-repeat", "--daemon", "/nonexistent"}} {
		if _, err := ParseArgs(args); !errors.Is(err, ErrUnsupported) {
			t.Fatalf("%v: %v, want ErrUnsupported", args, err)
		}
	}
}

// TestPingpongLinger: a server given --linger stays up after its last iteration, its QP still
// answering: a client that wants one exchange more than the server's -n gets its extra SEND
// acknowledged (6 of its SENDs complete, none fails), then times out waiting for the echo; the
// server has not returned by then, and returns 0 once its context ends. A negative --linger is
// a usage error.
func TestPingpongLinger(t *testing.T) {
	if _, err := ParseArgs([]string{"rc", "--linger", "-1s"}); !errors.Is(err, errPPUsage) {
		t.Fatalf("--linger -1s: %v, want a usage error", err)
	}
	if c, err := ParseArgs([]string{"rc", "--linger", "250ms"}); err != nil || c.Linger != 250*time.Millisecond {
		t.Fatalf("--linger 250ms: %v %v", c.Linger, err)
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	roce := strconv.Itoa(int(tooltest.FreeUDPPort(t)))
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var sOut, sErr, cOut, cErr bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- main(ctx, []string{"rc", "-d", "127.0.0.1", "-n", "5", "-s", "100", "--linger", "1h", "--roce-port", roce, "-p", port},
			&sOut, &sErr, func(c *Config) { c.Listener = ln })
	}()
	cst := pingpongMain([]string{"rc", "-d", "127.0.0.2", "-n", "6", "-s", "100", "--timeout", "1s", "--roce-port", roce, "-p", port, "127.0.0.1"},
		&ppEnv{Stdout: &cOut, Stderr: &cErr})
	if want := "(6 of 6 SENDs and 5 of 6 RECVs completed)"; cst != 1 || !strings.Contains(cErr.String(), want) || strings.Contains(cErr.String(), "Failed status") {
		t.Errorf("client exit %d, stderr %q; want a timeout with %s", cst, cErr.String(), want)
	}
	select {
	case st := <-done:
		t.Fatalf("the server returned (exit %d) before its linger ended: %s", st, sErr.String())
	default:
	}
	cancel()
	if st := <-done; st != 0 || !strings.Contains(sOut.String(), "5 iters in") {
		t.Errorf("server exit %d, stdout %q, stderr %q", st, sOut.String(), sErr.String())
	}
}
