package fault

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/udp"
)

// The injector on real UDP sockets on loopback: send-side rule drop + duplicate, and a
// receive-side corruption caught by the ICRC computed for the real endpoints.
func TestUDPLoopback(t *testing.T) {
	ip := netip.MustParseAddr
	la, err := udp.Listen(udp.Options{Addrs: []netip.Addr{ip("127.0.0.1")}, AnyPort: true})
	if err != nil {
		t.Skipf("no UDP sockets: %v", err)
	}
	lb, err := udp.Listen(udp.Options{Addrs: []netip.Addr{ip("127.0.0.2")}, AnyPort: true})
	if err != nil {
		la.Close()
		t.Skipf("no UDP socket on 127.0.0.2: %v", err)
	}
	aAddr := la.LocalAddrPorts()[0]
	bAddr := lb.LocalAddrPorts()[0]
	f := Wrap(la, Options{Send: DirOptions{Rules: mustRules(t, "drop:op=WRITE_MIDDLE:nth=2,dup:psn=4")}})
	defer f.Close()
	log := newEventLog()
	g := Wrap(lb, Options{Seed1: 8, OnEvent: log.add, Recv: DirOptions{Rules: mustRules(t, "corrupt:psn=5")}})
	defer g.Close()

	src := netip.AddrPortFrom(aAddr.Addr(), f.SourcePort(aAddr.Addr(), 0xC0DE))
	ep := &bth.Endpoints{Src: src.Addr(), Dst: bAddr.Addr(), SrcPort: src.Port(), DstPort: bAddr.Port()}
	var batch []link.Datagram
	for i := 0; i < 6; i++ {
		b := pkt(t, bth.OpRCWriteMiddle, 0x21, bth.PSN(i), 128)
		bth.SetICRC(b, bth.ICRC(ep, b))
		batch = append(batch, link.Datagram{Buf: b, Src: src, Dst: bAddr})
	}
	if err := f.Send(batch); err != nil {
		t.Fatal(err)
	}
	got := recvN(t, g, 6) // PSN 1 dropped (2nd WRITE MIDDLE), PSN 4 twice
	if p := psns(got); !slices.Equal(p, []uint32{0, 2, 3, 4, 4, 5}) {
		t.Fatalf("got %v", p)
	}
	for i, b := range got {
		if ok := bth.VerifyICRC(ep, b); ok == (i == 5) {
			t.Fatalf("datagram %d: ICRC ok=%v", i, ok)
		}
	}
	if c := log.kinds(Corrupt); len(c) != 1 || c[0].PSN != 5 || c[0].Dir != DirRecv {
		t.Fatalf("corrupt events %+v", c)
	}
}
