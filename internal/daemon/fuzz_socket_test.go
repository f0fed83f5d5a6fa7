package daemon_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/roce"
)

// fuzzFDs are the file descriptors a fuzzed message may carry (selected by its first byte):
// what a client could pass, right or wrong.
type fuzzFDs struct{ fds []int }

// newFuzzFDs opens them; the mem file is a sacrificial child's (the daemon may write where a
// fuzzed registration and a fuzzed loopback transfer say: never into this process).
func newFuzzFDs(t testing.TB) *fuzzFDs {
	f := &fuzzFDs{}
	child := exec.Command("sleep", "3600")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { child.Process.Kill(); child.Wait() })
	add := func(fd int, err error) {
		if err != nil {
			t.Fatal(err)
		}
		f.fds = append(f.fds, fd)
	}
	sealed, mem, err := proto.NewMemfd("fuzz-sealed", 1<<16)
	add(sealed, err)
	proto.Unmap(mem)
	add(unix.MemfdCreate("fuzz-unsealed", unix.MFD_CLOEXEC))
	unix.Ftruncate(f.fds[len(f.fds)-1], 1<<16)
	var p [2]int
	add(p[0], unix.Pipe2(p[:], unix.O_CLOEXEC))
	f.fds = append(f.fds, p[1])
	add(unix.Open(fmt.Sprintf("/proc/%d/mem", child.Process.Pid), unix.O_RDWR|unix.O_CLOEXEC, 0))
	add(unix.Open("/proc/self/status", unix.O_RDONLY|unix.O_CLOEXEC, 0))
	add(unix.Eventfd(0, unix.EFD_CLOEXEC))
	return f
}

func (f *fuzzFDs) close() { proto.CloseFDs(f.fds) }

// pick returns the fds selector s names: 0 none, 1..n one of them, above that two.
func (f *fuzzFDs) pick(s byte) []int {
	n := len(f.fds)
	switch {
	case s == 0:
		return nil
	case int(s) <= n:
		return f.fds[s-1 : s]
	}
	return []int{f.fds[int(s)%n], f.fds[int(s/7)%n]}
}

// FuzzSocket drives a real daemon over its unix socket with arbitrary message sequences, each
// message carrying real file descriptors (a sealed and an unsealed memfd, a pipe, the
// process's /proc/self/mem, a procfs text file, an eventfd): the daemon never panics, answers
// every request that expects an answer, and once the connection closes has released every
// object, mapping and file descriptor the session held.
func FuzzSocket(f *testing.F) {
	l, err := mem.NewNetwork(mem.Options{}).Attach(netip.MustParseAddr("10.6.9.1"))
	if err != nil {
		f.Fatal(err)
	}
	dev, err := roce.Open(roce.Options{Link: l})
	if err != nil {
		f.Fatal(err)
	}
	d := serveDevice(f, dev, "fuzz")
	fds := newFuzzFDs(f)
	defer fds.close()
	// Baseline: after one client came and went (lazily started parts exist).
	if probe, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: d.sock, Net: "unixpacket"}); err == nil {
		probe.Write(proto.AppendRequest(nil, wire.OpHello, wire.Bytes(&wire.HelloReq{Magic: wire.Magic, Version: wire.Version})))
		probe.Read(make([]byte, 4096))
		probe.Close()
	}
	waitNoClients(f, d)
	base := d.srv.Debug()

	m := func(sel byte, op wire.Op, body []byte) []byte {
		return append([]byte{sel}, proto.AppendRequest(nil, op, body)...)
	}
	join := func(ms ...[]byte) []byte {
		var out []byte
		for _, x := range ms {
			out = append(append(out, x...), 0xFF, 0xFE)
		}
		return out
	}
	hello := m(0, wire.OpHello, wire.Bytes(&wire.HelloReq{Magic: wire.Magic, Version: wire.Version}))
	// the child's memory: its stack top is mapped, wherever it is; the start of its text too
	reg := wire.RegMRReq{PD: 1, Access: 15, Addr: 0x400000, Length: 4096, IOVA: 0x1000, Source: wire.MRProcess}
	regfd := wire.RegMRReq{PD: 1, Access: 1, Length: 4096, Source: wire.MRMemfd}
	post, _ := proto.AppendPostSend(nil, wire.OpPostSend, 5, []qp.SendWR{{WRID: 1, Opcode: qp.WRSend, Flags: qp.SendInline, Inline: []byte("x")}})
	f.Add(join(hello, m(4, wire.OpAttachMem, nil), m(0, wire.OpAllocPD, nil), m(0, wire.OpRegMR, wire.Bytes(&reg)),
		m(1, wire.OpRegMR, wire.Bytes(&regfd)), m(0, wire.OpCreateCQ, wire.Bytes(&wire.CreateCQReq{CQE: 8})),
		m(0, wire.OpCreateQP, wire.Bytes(&wire.CreateQPReq{PD: 1, SendCQ: 4, RecvCQ: 4, QPType: uint8(qp.TypeRC),
			Cap: wire.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 16}})),
		append([]byte{0}, post...), m(0, wire.OpOpenRings, nil), m(0, wire.OpCMCreateChannel, nil),
		m(6, wire.OpDebug, nil)))
	f.Add(join(hello, m(2, wire.OpAttachMem, nil), m(3, wire.OpAttachMem, nil), m(5, wire.OpAttachMem, nil),
		m(200, wire.OpRegMR, wire.Bytes(&regfd)), m(1, wire.OpQueryGIDs, wire.Bytes(&wire.PortReq{Port: 1}))))
	f.Add(join(m(1, wire.OpAllocPD, nil), []byte{0, 1, 2, 3}, hello, m(0, 0xFFFF, nil)))
	// memory windows, with a descriptor each (which the daemon closes)
	f.Add(join(hello, m(0, wire.OpAllocPD, nil), m(1, wire.OpAllocMW, wire.Bytes(&wire.AllocMWReq{PD: 1, Type: 1})),
		m(2, wire.OpAllocMW, wire.Bytes(&wire.AllocMWReq{PD: 1, Type: 2})), m(0, wire.OpDeallocMW, wire.Bytes(&wire.Handle{Handle: 2})),
		m(0, wire.OpDeallocPD, wire.Bytes(&wire.Handle{Handle: 1}))))
	f.Fuzz(func(t *testing.T, stream []byte) {
		c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: d.sock, Net: "unixpacket"})
		if err != nil {
			t.Fatal(err)
		}
		rbuf, oob := make([]byte, proto.MaxMsg), make([]byte, 512)
		// One request answered first (refused before HELLO): the session exists, so waiting for
		// no clients below waits for its end.
		c.Write(proto.AppendRequest(nil, wire.OpDebug, nil))
		c.SetReadDeadline(time.Now().Add(waitLimit))
		if _, err := c.Read(rbuf); err != nil {
			t.Fatal(err)
		}
		for len(stream) > 0 {
			msg := stream
			if i := bytes.Index(stream, []byte{0xFF, 0xFE}); i >= 0 {
				msg, stream = stream[:i], stream[i+2:]
			} else {
				stream = nil
			}
			if len(msg) < 2 {
				continue
			}
			var rights []byte
			if pass := fds.pick(msg[0]); len(pass) > 0 {
				rights = unix.UnixRights(pass...)
			}
			msg = msg[1:]
			if _, _, err := c.WriteMsgUnix(msg, rights, nil); err != nil {
				break // the daemon closed the connection
			}
			if h, _, ok := proto.ParseHdr(msg); ok && (h.Op == wire.OpPostSendAsync || h.Op == wire.OpPostRecvAsync) {
				continue // no response
			}
			c.SetReadDeadline(time.Now().Add(waitLimit))
			n, oobn, _, _, err := c.ReadMsgUnix(rbuf, oob)
			if err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					t.Fatalf("no response to % x", msg[:min(len(msg), 16)])
				}
				break
			}
			proto.CloseFDs(proto.ParseRights(oob[:oobn]))
			if _, _, ok := proto.ParseHdr(rbuf[:n]); !ok {
				t.Fatalf("a %d-byte response", n)
			}
		}
		c.Close()
		waitNoClients(t, d)
		got := d.srv.Debug()
		if got.PDs != 0 || got.MRs != 0 || got.CQs != 0 || got.SRQs != 0 || got.QPs != 0 || got.CMIDs != 0 ||
			got.CMChannels != 0 || got.MappedBytes != base.MappedBytes || got.FDs != base.FDs || d.srv.LiveMWs() != 0 {
			t.Fatalf("after the client left: %+v, baseline %+v", got, base)
		}
	})
}

func waitNoClients(t testing.TB, d *testDaemon) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := d.srv.WaitClients(ctx, 0); err != nil {
		t.Fatal(err)
	}
}
