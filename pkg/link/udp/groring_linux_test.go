package udp

import (
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/softroce/softroce/pkg/link"
)

// ringSetup is a GRO receiver, a GSO sender (one flow: the backlog) and n plain sockets (one
// flow each: the sparse ones), all on loopback.
func ringSetup(t *testing.T, n int) (a, b *Link, src, dst netip.AddrPort, sparse []*net.UDPConn) {
	t.Helper()
	lo1, lo2 := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	a = listenTB(t, Options{Addrs: []netip.Addr{lo1}, AnyPort: true})
	b = listenTB(t, Options{Addrs: []netip.Addr{lo2}, AnyPort: true, GRO: true})
	src = netip.AddrPortFrom(lo1, a.SourcePort(lo1, 0))
	dst = b.LocalAddrPorts()[0]
	for i := 0; i < n; i++ {
		c, err := net.DialUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(lo1, 0)), net.UDPAddrFromAddrPort(dst))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		sparse = append(sparse, c)
	}
	return a, b, src, dst, sparse
}

// ringRecv reads n datagrams from b through RecvView in batches of size batch, as the
// payloads' strings and their sources, one slice per call.
func ringRecv(t *testing.T, b *Link, n, batch int) (calls [][]string, from [][]netip.AddrPort) {
	t.Helper()
	in := recvBufs(batch)
	for got := 0; got < n; {
		k, err := b.RecvView(in)
		if err != nil {
			t.Fatal(err)
		}
		var c []string
		var f []netip.AddrPort
		for i := 0; i < k; i++ {
			c = append(c, string(in[i].Buf))
			f = append(f, in[i].Src)
		}
		calls, from = append(calls, c), append(from, f)
		got += k
	}
	return calls, from
}

// TestGRORingSparseFirst: a flow's lone datagram is handed out ahead of another flow's GRO
// backlog that arrived before it (fq_codel's sparse flows first); a flow's own datagrams keep
// their order: the backlog flow's lone datagram, queued after its GRO message, does not pass it.
func TestGRORingSparseFirst(t *testing.T) {
	a, b, src, dst, sparse := ringSetup(t, 2)
	run := mkRun(src, dst, 8, 1040, 1040, 1)
	if err := a.SendRuns(run, []uint8{8}); err != nil {
		t.Fatal(err)
	}
	tail := mkRun(src, dst, 1, 300, 300, 2)
	if err := a.Send(tail); err != nil {
		t.Fatal(err)
	}
	for i, c := range sparse {
		if _, err := c.Write([]byte(fmt.Sprintf("sparse %d", i))); err != nil {
			t.Fatal(err)
		}
	}
	calls, from := ringRecv(t, b, 8+1+2, 64)
	var got []string
	for _, c := range calls {
		got = append(got, c...)
	}
	want := []string{"sparse 0", "sparse 1"}
	for _, d := range append(run, tail...) {
		want = append(want, string(d.Buf))
	}
	if len(got) != len(want) {
		t.Fatalf("%d datagrams, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("datagram %d is not the expected one (sparse flows first, each flow in order); calls %d", i, len(calls))
		}
	}
	if f := from[0][0]; f != sparse[0].LocalAddr().(*net.UDPAddr).AddrPort() {
		t.Fatalf("first datagram from %v", f)
	}
	if st := statsOf(b); st.GROReceives == 0 {
		t.Fatalf("the backlog did not arrive as a GRO message: %+v", st)
	}
}

// TestGRORingOldestKeepsHalf: however many sparse flows arrive, the oldest message keeps at
// least half of every batch; nothing is lost or reordered within a flow.
func TestGRORingOldestKeepsHalf(t *testing.T) {
	a, b, src, dst, sparse := ringSetup(t, 6)
	run := mkRun(src, dst, 16, 1040, 1040, 3)
	if err := a.SendRuns(run, []uint8{16}); err != nil {
		t.Fatal(err)
	}
	for i, c := range sparse {
		if _, err := c.Write([]byte(fmt.Sprintf("sparse %d", i))); err != nil {
			t.Fatal(err)
		}
	}
	calls, from := ringRecv(t, b, 16+6, 4)
	nextRun, nextSparse := 0, 0
	for ci, c := range calls {
		fromRun := 0
		for i, s := range c {
			if from[ci][i] == src {
				if s != string(run[nextRun].Buf) {
					t.Fatalf("call %d: backlog datagram %d out of order", ci, nextRun)
				}
				nextRun++
				fromRun++
				continue
			}
			if s != fmt.Sprintf("sparse %d", nextSparse) {
				t.Fatalf("call %d: %q, want sparse %d", ci, s, nextSparse)
			}
			nextSparse++
		}
		if nextRun < len(run) && fromRun < len(c)/2 {
			t.Fatalf("call %d: %d of %d datagrams from the oldest flow, want at least half", ci, fromRun, len(c))
		}
	}
	if nextRun != len(run) || nextSparse != len(sparse) {
		t.Fatalf("got %d backlog and %d sparse datagrams", nextRun, nextSparse)
	}
	if len(calls[0]) != 4 || from[0][0] == src || from[0][2] != src {
		t.Fatalf("first call from %v: want two sparse datagrams, then the backlog", from[0])
	}
}

// TestGRORingTopUp: while the ring still holds a message, a receive call reads what arrived
// since into its free slots, and a sparse datagram that arrived after a large backlog is
// handed out in the next call, not after the backlog.
func TestGRORingTopUp(t *testing.T) {
	a, b, src, dst, sparse := ringSetup(t, 1)
	var run []link.Datagram
	for m := 0; m < 4; m++ {
		r := mkRun(src, dst, 32, 1040, 1040, byte(m))
		for k := range r { // distinct payloads across messages
			r[k].Buf[len(r[k].Buf)-5] = byte(m)
		}
		if err := a.SendRuns(r, []uint8{32}); err != nil {
			t.Fatal(err)
		}
		run = append(run, r...)
	}
	in := recvBufs(8)
	k, err := b.RecvView(in)
	if err != nil || k != 8 {
		t.Fatalf("first call: %d, %v", k, err)
	}
	if _, err := sparse[0].Write([]byte("late")); err != nil {
		t.Fatal(err)
	}
	if k, err = b.RecvView(in); err != nil || k != 8 {
		t.Fatalf("second call: %d, %v", k, err)
	}
	if string(in[0].Buf) != "late" {
		t.Fatalf("the late sparse datagram waits behind the backlog (first of the call: %d bytes from %v)", len(in[0].Buf), in[0].Src)
	}
	for i := 1; i < k; i++ {
		if string(in[i].Buf) != string(run[8+i-1].Buf) {
			t.Fatalf("backlog datagram %d out of order", 8+i-1)
		}
	}
}
