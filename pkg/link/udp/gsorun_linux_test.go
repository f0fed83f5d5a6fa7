package udp

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/internal/linktest"
)

// mkRun builds n RoCE datagrams (UD SEND ONLY, distinct payloads) of size bytes (the last
// lastSize) from src to dst with the ICRC of datagram k computed for IPv4 ID k, as the engine
// does for a GSO run.
func mkRun(src, dst netip.AddrPort, n, size, lastSize int, seed byte) []link.Datagram {
	out := make([]link.Datagram, n)
	for k := range out {
		sz := size
		if k == n-1 {
			sz = lastSize
		}
		pkt := make([]byte, sz)
		bth.BTH(pkt).Encode(&bth.BTHFields{Opcode: bth.OpUDSendOnly, PKey: 0xFFFF, DestQP: 0x12, PSN: bth.PSN(k)})
		for i := bth.BTHSize; i < len(pkt)-bth.ICRCSize; i++ {
			pkt[i] = byte(i*int(seed+1) + k)
		}
		ep := bth.Endpoints{Src: src.Addr(), Dst: dst.Addr(), SrcPort: src.Port(), DstPort: dst.Port(), IPID: uint16(k)}
		bth.SetICRC(pkt, bth.ICRC(&ep, pkt))
		out[k] = link.Datagram{Buf: pkt, Src: src, Dst: dst}
	}
	return out
}

// checkWire verifies every captured packet's ICRC over its real IPv4 header (IBTA A17.3.3) and
// compares its IPv4 ID and payload with what was sent.
func checkWire(got []ipv4UDP, sent []link.Datagram, wantID func(i int) uint16) error {
	if len(got) != len(sent) {
		return fmt.Errorf("captured %d packets, sent %d", len(got), len(sent))
	}
	for i, h := range got {
		c, err := bth.ICRCFromIP(h.raw)
		if err != nil {
			return err
		}
		if c != bth.GetICRC(sent[i].Buf) {
			return fmt.Errorf("packet %d (ID %d): ICRC over the wire header %#08x, packet carries %#08x", i, h.id, c, bth.GetICRC(sent[i].Buf))
		}
		if h.id != wantID(i) || h.payloadLen != len(sent[i].Buf) {
			return fmt.Errorf("packet %d: ID %d, %d bytes; want ID %d, %d bytes", i, h.id, h.payloadLen, wantID(i), len(sent[i].Buf))
		}
	}
	return nil
}

// TestSendRunsICRCOnTheWire sends engine-style runs through a tun without offloads in a private
// netns (the kernel segments GSO sends in software, so every segment has its own IPv4 header),
// reads the packets back and checks every ICRC over the real header: segment k carries ID k and
// was computed for k. Then GSO is refused (SO_NO_CHECK makes UDP_SEGMENT fail with EINVAL): the
// link falls back, rewrites the ICRCs for ID 0, and the wire still verifies.
func TestSendRunsICRCOnTheWire(t *testing.T) {
	inNetns(t, func() error {
		fd, local, err := openTun()
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		l, err := Listen(Options{Addrs: []netip.Addr{local}, AnyPort: true})
		if err != nil {
			return err
		}
		defer l.Close()
		if !l.RunGSO(local) || l.GSOEnabled(local) {
			return fmt.Errorf("GSOAuto on IPv4: RunGSO %v (want true), plain GSO %v (want false)", l.RunGSO(local), l.GSOEnabled(local))
		}
		src := l.LocalAddrPorts()[0]
		dst := netip.MustParseAddrPort("198.18.0.2:4791")
		run1 := mkRun(src, dst, 9, 1040, 340, 1) // 8 full + a shorter tail
		run2 := mkRun(src, dst, 1, 600, 600, 2)  // a run of one
		run3 := mkRun(src, dst, 4, 528, 528, 3)
		batch := append(append(append([]link.Datagram{}, run1...), run2...), run3...)
		if err := l.SendRuns(batch, []uint8{9, 1, 4}); err != nil {
			return err
		}
		if st := statsOf(l); st.GSOSends != 2 || st.Sent != 14 || st.Fallbacks != 0 {
			return fmt.Errorf("stats %+v: want 2 GSO messages, 14 sent", st)
		}
		got, err := readMatching(fd, false, src, dst, len(batch))
		if err != nil {
			return err
		}
		ids := []uint16{0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 1, 2, 3}
		if err := checkWire(got, batch, func(i int) uint16 { return ids[i] }); err != nil {
			return fmt.Errorf("GSO runs: %w", err)
		}

		// Fallback: the kernel refuses UDP_SEGMENT on a no-checksum socket.
		var serr error
		if err := l.socks[0].rc.Control(func(f uintptr) {
			serr = unix.SetsockoptInt(int(f), unix.SOL_SOCKET, unix.SO_NO_CHECK, 1)
		}); err != nil || serr != nil {
			return fmt.Errorf("SO_NO_CHECK: %v %v", err, serr)
		}
		run4 := mkRun(src, dst, 6, 1040, 1040, 4)
		run5 := mkRun(src, dst, 3, 800, 200, 5)
		batch = append(append([]link.Datagram{}, run4...), run5...)
		if err := l.SendRuns(batch, []uint8{6, 3}); err != nil {
			return err
		}
		if st := statsOf(l); st.Fallbacks != 1 || l.RunGSO(local) || st.Sent != 14+9 || st.Drops != 0 {
			return fmt.Errorf("after the refusal: stats %+v RunGSO %v; want one fallback, GSO off, 9 more sent", st, l.RunGSO(local))
		}
		got, err = readMatching(fd, false, src, dst, len(batch))
		if err != nil {
			return err
		}
		if err := checkWire(got, batch, func(int) uint16 { return 0 }); err != nil {
			return fmt.Errorf("fallback: %w", err)
		}
		return nil
	})
}

// TestSendRunsLoopback: runs reach a GRO receiver in order and intact, invalid runs are refused
// before anything is sent, GSOOff disables runs, and nothing allocates.
func TestSendRunsLoopback(t *testing.T) {
	p := genTestPair(t, varUDP)
	a := p.A.(*Link)
	b := listenTB(t, Options{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.2")}, AnyPort: true, GRO: true})
	src := linktest.Src(a, p.AAddr)
	dst := b.LocalAddrPorts()[0]
	batch := append(mkRun(src, dst, 15, 4128, 4128, 1), mkRun(src, dst, 3, 1000, 100, 2)...)
	runs := []uint8{15, 3}
	in := recvBufs(32)
	round := func() {
		if err := a.SendRuns(batch, runs); err != nil {
			t.Fatal(err)
		}
		for got := 0; got < len(batch); {
			k, err := b.Recv(in)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < k; i++ {
				if string(in[i].Buf) != string(batch[got+i].Buf) {
					t.Fatalf("datagram %d differs", got+i)
				}
			}
			got += k
		}
	}
	round()
	if st := statsOf(a); st.GSOSends != 2 || st.Sent != 18 {
		t.Fatalf("stats %+v: want 2 GSO messages", st)
	}
	if allocs := testing.AllocsPerRun(20, round); allocs != 0 {
		t.Fatalf("%v allocations per SendRuns+Recv round, want 0", allocs)
	}
	if err := a.SendRuns(batch, []uint8{14, 4}); !errors.Is(err, link.ErrInvalidRun) {
		t.Fatalf("a run mixing lengths: %v, want link.ErrInvalidRun", err)
	}
	if st := statsOf(a); st.Sent != 18*22 { // round, AllocsPerRun's warm-up and 20 runs
		t.Fatalf("refused batch sent something: %+v", st)
	}
	off := listenTB(t, Options{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.3")}, AnyPort: true, GSO: GSOOff})
	if off.RunGSO(netip.MustParseAddr("127.0.0.3")) {
		t.Fatal("GSOOff link reports RunGSO")
	}
	small := listenTB(t, Options{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.3")}, AnyPort: true, BatchSize: 8})
	if small.RunGSO(netip.MustParseAddr("127.0.0.3")) {
		t.Fatal("a BatchSize-8 link reports RunGSO")
	}
	// a run longer than the batch cannot be one sendmmsg call: refused, not looped on
	s3 := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.3"), small.SourcePort(netip.MustParseAddr("127.0.0.3"), 0))
	if err := small.SendRuns(mkRun(s3, dst, 9, 100, 100, 6), []uint8{9}); !errors.Is(err, link.ErrInvalidRun) {
		t.Fatalf("a 9-datagram run on a BatchSize-8 link: %v, want link.ErrInvalidRun", err)
	}
	if err := small.SendRuns(mkRun(s3, dst, 8, 100, 100, 6), []uint8{8}); err != nil {
		t.Fatalf("an 8-datagram run on a BatchSize-8 link (sent plainly): %v", err)
	}
}
