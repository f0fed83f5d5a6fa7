package udp

import (
	"net/netip"
	"testing"
)

// TestRecvView: a GSO run arrives through RecvView as views of the link's GRO buffer (not the
// caller's), intact and in order, without allocating; a link without GRO falls back to Recv.
func TestRecvView(t *testing.T) {
	a := listenTB(t, Options{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}, AnyPort: true})
	b := listenTB(t, Options{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.2")}, AnyPort: true, GRO: true})
	src := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), a.SourcePort(netip.MustParseAddr("127.0.0.1"), 0))
	dst := b.LocalAddrPorts()[0]
	batch := mkRun(src, dst, 12, 1040, 500, 4)
	in := recvBufs(32)
	own := make([][]byte, len(in))
	for i := range in {
		own[i] = in[i].Buf[:cap(in[i].Buf)]
	}
	round := func() {
		if err := a.SendRuns(batch, []uint8{12}); err != nil {
			t.Fatal(err)
		}
		for got := 0; got < len(batch); {
			for i := range in {
				in[i].Buf = own[i]
			}
			k, err := b.RecvView(in)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < k; i++ {
				if string(in[i].Buf) != string(batch[got+i].Buf) || in[i].Src != src || in[i].Dst != dst {
					t.Fatalf("datagram %d differs", got+i)
				}
				if &in[i].Buf[0] == &own[i][0] {
					t.Fatalf("datagram %d was copied into the caller's buffer", got+i)
				}
			}
			got += k
		}
	}
	round()
	if st := statsOf(b); st.GROReceives == 0 {
		t.Fatalf("no GRO read: %+v", st)
	}
	if allocs := testing.AllocsPerRun(20, round); allocs != 0 {
		t.Fatalf("%v allocations per round", allocs)
	}
	// without GRO: Recv into the caller's buffers
	c := listenTB(t, Options{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.3")}, AnyPort: true})
	one := mkRun(src, c.LocalAddrPorts()[0], 1, 300, 300, 5)
	if err := a.SendRuns(one, []uint8{1}); err != nil {
		t.Fatal(err)
	}
	in[0].Buf = own[0]
	if k, err := c.RecvView(in[:1]); err != nil || k != 1 || &in[0].Buf[0] != &own[0][0] || string(in[0].Buf) != string(one[0].Buf) {
		t.Fatalf("plain RecvView: %d %v", k, err)
	}
}
