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
			// rounds of different sizes (GRO: one message of 3 segments each, its segment size
			// in the control data), empty reads before and between them (which leave the GRO
			// headers prepared: the next read must still see the new lengths)
			for round, size := range []int{8, 20, 4000, 40} {
				var out []Datagram
				for i := 0; i < 3; i++ {
					p := make([]byte, size)
					p[0], p[size-1] = byte(i), byte(round)
					out = append(out, Datagram{Buf: p, Src: src, Dst: dst})
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
						if len(d.Buf) != size || d.Buf[0] != byte(got) || d.Buf[size-1] != byte(round) || d.Src.Addr() != a || d.Dst.Addr() != b {
							t.Fatalf("round %d datagram %d: %d bytes [%d ... %d] from %v to %v", round, got, len(d.Buf), d.Buf[0], d.Buf[len(d.Buf)-1], d.Src, d.Dst)
						}
						got++
					}
					if time.Now().After(deadline) {
						t.Fatalf("round %d: %d of %d datagrams", round, got, len(out))
					}
				}
				for i := 0; i < 3; i++ {
					reset()
					if n, err := pr.TryRecv(batch); n != 0 || err != nil {
						t.Fatalf("drained link: %d, %v", n, err)
					}
				}
			}
			rx.Close()
			if _, err := pr.TryRecv(batch); !errors.Is(err, net.ErrClosed) {
				t.Fatalf("after Close: %v", err)
			}
		})
	}
}
