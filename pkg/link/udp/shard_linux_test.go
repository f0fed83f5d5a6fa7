package udp

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
)

// TestUDPShardsSteerByQPN: datagrams (plain and GSO runs) reach shard DestQP mod n.
func TestUDPShardsSteerByQPN(t *testing.T) {
	for _, n := range []int{2, 3} {
		shards, err := ListenShards(Options{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.2")}, AnyPort: true, GRO: true}, n)
		if err != nil {
			t.Fatal(err)
		}
		port := shards[0].LocalAddrPorts()[0].Port()
		for i, s := range shards {
			if p := s.LocalAddrPorts()[0].Port(); p != port {
				t.Fatalf("shard %d on port %d, shard 0 on %d", i, p, port)
			}
		}
		a := listenTB(t, Options{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}, AnyPort: true})
		src := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), a.SourcePort(netip.MustParseAddr("127.0.0.1"), 0))
		dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), port)
		want := make([]int, n)
		var batch []link.Datagram
		var runs []uint8
		for qpn := uint32(0x11); qpn < 0x11+12; qpn++ {
			k := 1 + int(qpn%4) // runs of 1..4 datagrams per QP
			for j := 0; j < k; j++ {
				pkt := make([]byte, 1000+bth.BTHSize+bth.ICRCSize)
				bth.BTH(pkt).Encode(&bth.BTHFields{Opcode: bth.OpRCWriteMiddle, PKey: 0xFFFF, DestQP: qpn, PSN: bth.PSN(j)})
				batch = append(batch, link.Datagram{Buf: pkt, Src: src, Dst: dst})
			}
			runs = append(runs, uint8(k))
			want[qpn%uint32(n)] += k
		}
		if err := a.SendRuns(batch, runs); err != nil {
			t.Fatal(err)
		}
		safety := time.AfterFunc(10*time.Second, func() {
			for _, s := range shards {
				s.Close()
			}
		})
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i, s := range shards {
			wg.Add(1)
			go func() {
				defer wg.Done()
				in := recvBufs(16)
				for got := 0; got < want[i]; {
					k, err := s.Recv(in)
					if err != nil {
						errs[i] = err
						return
					}
					for _, d := range in[:k] {
						if q := bth.BTH(d.Buf).DestQP(); int(q)%n != i {
							errs[i] = errors.New("datagram for another shard")
							return
						}
					}
					got += k
				}
			}()
		}
		wg.Wait()
		safety.Stop()
		for i, s := range shards {
			if errs[i] != nil {
				t.Fatalf("%d shards: shard %d: %v (stats %+v)", n, i, errs[i], statsOf(s))
			}
			s.Close()
			if _, err := s.Recv(recvBufs(1)); !errors.Is(err, net.ErrClosed) {
				t.Fatalf("closed shard: %v", err)
			}
		}
	}
}
