package link

import (
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"
)

// TestTryRecv: a PollReceiver never waits — an empty link returns 0, nil — and returns what
// was sent once it is there (plain sockets, GRO sockets whose segments come back as views,
// and the in-memory link); after Close it returns net.ErrClosed.
func TestTryRecv(t *testing.T) {
	a, b := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	for _, kind := range []string{"udp", "udp-gro", "mem"} {
		t.Run(kind, func(t *testing.T) {
			var tx, rx Link
			var dst netip.AddrPort
			switch kind {
			case "mem":
				nw := NewMemNetwork(MemOptions{})
				var err error
				if tx, err = nw.Attach(a); err != nil {
					t.Fatal(err)
				}
				if rx, err = nw.Attach(b); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { tx.Close() })
				dst = netip.AddrPortFrom(b, UDPPort)
			default:
				ut := listenTB(t, UDPOptions{Addrs: []netip.Addr{a}, AnyPort: true})
				ur := listenTB(t, UDPOptions{Addrs: []netip.Addr{b}, AnyPort: true, GRO: kind == "udp-gro"})
				tx, rx, dst = ut, ur, ur.LocalAddrPorts()[0]
			}
			pr := rx.(PollReceiver)
			batch := make([]Datagram, 8)
			bufs := make([][]byte, len(batch))
			for i := range bufs {
				bufs[i] = make([]byte, MaxDatagram)
			}
			reset := func() {
				for i := range batch {
					batch[i].Buf = bufs[i]
				}
			}
			reset()
			if n, err := pr.TryRecv(batch); n != 0 || err != nil {
				t.Fatalf("empty link: %d, %v", n, err)
			}
			src := netip.AddrPortFrom(a, tx.SourcePort(a, 0xC123))
			var out []Datagram
			for i := 0; i < 3; i++ {
				out = append(out, Datagram{Buf: []byte{byte(i), 1, 2, 3, 4, 5, 6, 7}, Src: src, Dst: dst})
			}
			if err := tx.Send(out); err != nil {
				t.Fatal(err)
			}
			got := 0
			deadline := time.Now().Add(10 * time.Second)
			for got < len(out) {
				reset()
				n, err := pr.TryRecv(batch[:len(batch)-got])
				if err != nil {
					t.Fatal(err)
				}
				for k := 0; k < n; k++ {
					d := batch[k]
					if len(d.Buf) != 8 || d.Buf[0] != byte(got) || d.Src.Addr() != a || d.Dst.Addr() != b {
						t.Fatalf("datagram %d: %v from %v to %v", got, d.Buf, d.Src, d.Dst)
					}
					got++
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d of %d datagrams", got, len(out))
				}
			}
			reset()
			if n, err := pr.TryRecv(batch); n != 0 || err != nil {
				t.Fatalf("drained link: %d, %v", n, err)
			}
			rx.Close()
			if _, err := pr.TryRecv(batch); !errors.Is(err, net.ErrClosed) {
				t.Fatalf("after Close: %v", err)
			}
		})
	}
}
