package main

import (
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/afxdp"
	"github.com/softroce/softroce/pkg/link/udp"
)

// wserver / wclient: ib_write_lat's loop over the link's XDP write responder
// (afxdp.Options.WriteMemory, xdpwrite_linux.go) with no RDMA engine: each side posts an
// 8-byte RC WRITE Only frame (BTH, RETH, payload, ICRC) into the peer's device memory through
// its ring, then waits for the peer's ACK (the peer's XDP program sends it from the sender's
// own transmit) and for the peer's WRITE to land in its own device memory. The floor of a
// write-latency test whose responder is the program (docs/performance.md).
//
//	probe wserver ADDR PEER       answers
//	probe wclient ADDR PEER N     N round trips, printed like client
func writeResponderPingPong(args []string, isClient bool) error {
	fs := flag.NewFlagSet("wprobe", flag.ContinueOnError)
	if err := fs.Parse(args); err != nil {
		return err
	}
	local, peer, err := probeAddrs(fs, isClient)
	if err != nil {
		return err
	}
	l, err := afxdp.Open(afxdp.Options{UDP: udp.Options{Addrs: []netip.Addr{local}, GSO: udp.GSOOff,
		Entropy: udp.EntropyOptions{Off: true}}, WriteMemory: 1 << 16})
	if err != nil {
		return err
	}
	defer l.Close()
	ul := l
	const qpn, rkey = 0x11, 0x100
	sport := l.SourcePort(local, 0xC011)
	var ack [16]byte
	bth.BTH(ack[:]).Encode(&bth.BTHFields{Opcode: bth.OpRCAck, PKey: 0xFFFF, DestQP: qpn})
	bth.AETH(ack[bth.BTHSize:]).Encode(&bth.AETHFields{Syndrome: bth.SyndromeACK(0x1F)})
	st, err := ul.AddWriteQP(link.WriteQP{QPN: qpn, PD: 1, Peer: peer, SrcPort: sport, ACK: ack}, 0, 0, false)
	if err != nil {
		return err
	}
	if err := ul.AddWriteMR(rkey, 1, 0, 4096, 0); err != nil {
		return err
	}
	mem := ul.DeviceMemory()
	flag := (*uint32)(unsafe.Pointer(&mem[0]))
	src := netip.AddrPortFrom(local, sport)
	dst := netip.AddrPortFrom(peer, link.UDPPort)
	ep := bth.Endpoints{Src: local, Dst: peer, SrcPort: sport, DstPort: link.UDPPort}
	pkt := make([]byte, bth.BTHSize+bth.RETHSize+8+4)
	out := []link.Datagram{{Buf: pkt, Src: src, Dst: dst}}
	psn := uint32(0)
	post := func(v uint32) error {
		bth.BTH(pkt).Encode(&bth.BTHFields{Opcode: bth.OpRCWriteOnly, PKey: 0xFFFF, DestQP: qpn, AckReq: true, PSN: bth.PSN(psn)})
		bth.RETH(pkt[bth.BTHSize:]).Encode(&bth.RETHFields{VA: 0, RKey: rkey, DMALen: 8})
		p := pkt[bth.BTHSize+bth.RETHSize:]
		*(*uint32)(unsafe.Pointer(&p[0])) = v
		bth.SetICRC(pkt, bth.ICRC(&ep, pkt))
		psn++
		return l.Send(out)
	}
	in := make([]link.Datagram, l.BatchSize())
	bufs := make([][]byte, len(in))
	for i := range bufs {
		bufs[i] = make([]byte, link.MaxDatagram)
	}
	acks := 0
	// wait until the peer's value v is in our memory and acked ACKs arrived
	wait := func(v uint32, acked int, deadline time.Time) error {
		for k := 0; ; k++ {
			if atomic.LoadUint32(flag) == v && acks >= acked {
				return nil
			}
			for i := range in {
				in[i].Buf = bufs[i]
			}
			n, err := ul.TryRecv(in)
			if err != nil {
				return err
			}
			for i := range n {
				if b := in[i].Buf; len(b) >= bth.BTHSize && bth.BTH(b).Opcode() == bth.OpRCAck {
					acks++
				}
			}
			if k%4096 == 0 && !deadline.IsZero() && time.Now().After(deadline) {
				return fmt.Errorf("timed out: value %#x (want %#x), %d ACKs (want %d), %d WRITEs executed",
					atomic.LoadUint32(flag), v, acks, acked, st.Executed())
			}
		}
	}
	if !isClient {
		for i := uint32(1); ; i++ {
			if err := wait(i, int(i)-1, time.Time{}); err != nil {
				return err
			}
			if err := post(i); err != nil {
				return err
			}
			if i == 0xffff {
				return errors.New("too many rounds")
			}
		}
	}
	n, err := atoi(fs.Arg(2))
	if err != nil {
		return err
	}
	// the first sends go through the socket until the peer's MAC address is known: warm up
	v := make([]time.Duration, n)
	for i := 1; i <= n; i++ {
		t0 := time.Now()
		if err := post(uint32(i)); err != nil {
			return err
		}
		if err := wait(uint32(i), i, time.Now().Add(5*time.Second)); err != nil {
			return err
		}
		v[i-1] = time.Since(t0)
	}
	s, xs := ul.Stats(), ul.XDPStats()
	report(fmt.Sprintf("go write-responder rtt [sent %d/%d ring, executed %d, GOMAXPROCS=%d]",
		xs.Sent, s.Sent, st.Executed(), runtime.GOMAXPROCS(0)), v)
	return nil
}
