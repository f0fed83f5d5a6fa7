package main

import (
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"net/netip"
	"os"
	"runtime"
	"time"

	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/afxdp"
	"github.com/softroce/softroce/pkg/link/udp"
	"golang.org/x/sys/unix"
)

// The link ladder (lserver / lclient): the 8-byte round trip of the floor rows, but through
// softroce's own UDP link (pkg/link) with its options switched on one at a time, so a lab
// session can tell which of them the kernel makes expensive. Every rung spins on TryRecv
// (one raw non-blocking recvmmsg, as a polled device does) and sends what it read back:
//
//	-size N    datagram length (40: an 8-byte RDMA WRITE Only, BTH+RETH+8+ICRC)
//	-gro       UDP_GRO on the receiving socket (the device default)
//	-entropy   send from an entropy source-port socket (the device default)
//	-pair      send [N bytes, 20 bytes] as one GSO message (polled mode's [WRITE, ACK]);
//	           the peer reads both before answering
//	-xdp       the link's AF_XDP path (root; afxdp.Options): the datagrams go through the
//	           AF_XDP socket's rings, no receive system call; -pair is then two frames
//	           and one sendto, GSO and GRO are off
//	-native    with -xdp: the driver's XDP hook (afxdp.Options.Native)
//	-gsotx     with -xdp -pair: send the pair as one UDP GSO message through a plain socket
//	           (the receiver's ring then holds it whole, docs/link.md); the receiver counts
//	           bytes. An experiment: in the lab guest it cost as much as two ring frames
//	           (docs/performance.md, "Tried and not kept")
//	-conn      with -gsotx: the socket connected to the peer (the kernel keeps the route)
//	-work N    N rounds of user-space work after each read (a CRC over 64 bytes each): the
//	           receiver busy while the sender's kernel still delivers the pair's second frame
//	-idlework N  the same after each empty read: a spin loop heavier than TryRecv alone
//	-pkttx     with -xdp -pair: send the pair as one AF_PACKET frame with a virtio-net header
//	           asking for UDP GSO (pkttx.go): one skb through the kernel, no route lookup, our
//	           own IPv4 IDs; the first 3 sends go through the ring (they resolve the MAC).
//	           Linux 6.2+ (EINVAL before); what the link's GSO pairs do (xdppair_linux.go)
//	-pairsock  with -gsotx: a connected DF socket whose IPv4 IDs (the ICRC covers them) are
//	           learnt from looped-back transmit timestamps (pairsock.go); the client prints the
//	           IDs it predicted, the server those it saw. An experiment, not kept in the link
//	           (docs/performance.md, "Tried and not kept")
//
// Both sides must be given the same flags. The client prints the round trips like client.
func linkPingPong(args []string, isClient bool) error {
	name := "lserver"
	if isClient {
		name = "lclient"
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	size := fs.Int("size", 40, "datagram length")
	gro := fs.Bool("gro", false, "UDP_GRO on receive")
	entropy := fs.Bool("entropy", false, "send from an entropy source-port socket")
	pair := fs.Bool("pair", false, "send a [size, 20] GSO pair")
	port := fs.Int("port", link.UDPPort, "UDP port of both sides")
	xdp := fs.Bool("xdp", false, "the AF_XDP path")
	native := fs.Bool("native", false, "with -xdp: the driver's XDP hook instead of the generic one")
	gsotx := fs.Bool("gsotx", false, "with -xdp -pair: send the pair as one UDP GSO message through a plain socket (experiment)")
	conn := fs.Bool("conn", false, "with -gsotx: connect the plain socket to the peer (experiment)")
	work := fs.Int("work", 0, "rounds of user-space work (a CRC over 64 bytes each) after each datagram read, while the next may still be arriving (experiment)")
	idlework := fs.Int("idlework", 0, "rounds of the same work after each empty read: a heavier spin (experiment)")
	pkttx := fs.Bool("pkttx", false, "with -xdp -pair: send the pair as one AF_PACKET frame with a virtio-net GSO header (experiment, pkttx.go)")
	pairsock := fs.Bool("pairsock", false, "with -gsotx: a connected DF socket whose IPv4 IDs are learnt (experiment); prints predicted and received IDs")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *size < 21 || *size > 1400 || *port <= 0 || *port > 65535 {
		return errUsage
	}
	local, peer, err := probeAddrs(fs, isClient)
	if err != nil {
		return err
	}
	gso := udp.GSOOff
	if *pair && !*xdp {
		gso = udp.GSOOn
	}
	uo := udp.Options{
		Addrs: []netip.Addr{local}, Port: uint16(*port), GSO: gso, GRO: *gro,
		Entropy: udp.EntropyOptions{Off: !*entropy},
	}
	var l probeLink
	if *xdp {
		l, err = afxdp.Open(afxdp.Options{UDP: uo, Native: *native})
	} else {
		l, err = udp.Listen(uo)
	}
	if err != nil {
		return err
	}
	defer l.Close()
	ul := l
	if *pair && !*xdp && !ul.RunGSO(local) {
		return errors.New("-pair: GSO is off on this socket")
	}
	src := netip.AddrPortFrom(local, l.SourcePort(local, 0xC123))
	dst := netip.AddrPortFrom(peer, uint16(*port))
	out := []link.Datagram{
		{Buf: make([]byte, *size), Src: src, Dst: dst},
		{Buf: make([]byte, 20), Src: src, Dst: dst},
	}
	runs := []uint8{2}
	in := make([]link.Datagram, l.BatchSize())
	bufs := make([][]byte, len(in))
	for i := range bufs {
		bufs[i] = make([]byte, link.MaxDatagram)
	}
	expect := 1
	if *pair {
		expect = 2
	}
	countBytes := *gsotx || *pkttx
	if countBytes {
		expect = *size + 20 // bytes: one superframe or two datagrams
	}
	var gfd int
	if *gsotx {
		if gfd, err = gsoSocket(local); err != nil {
			return err
		}
		if *conn {
			if err := unix.Connect(gfd, &unix.SockaddrInet4{Addr: peer.As4(), Port: *port}); err != nil {
				return err
			}
		}
		defer unix.Close(gfd)
	}
	gbuf := make([]byte, *size+20)
	var ps *pairSock
	if *pairsock {
		if ps, err = newPairSock(local, 0, peer, *port); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "pairsock %v: next ID %d, %d per GSO send\n", ps.local, ps.id, ps.perSend)
	}
	var predicted []uint16
	var pk *pktSock
	sends := 0
	send := func() error {
		if *pkttx {
			if sends++; sends > 3 && pk == nil { // the ring's first sends resolved the peer's MAC
				if pk, err = newPktSock(local, src.Port(), peer, uint16(*port)); err != nil {
					return err
				}
			}
			if pk != nil {
				copy(gbuf, out[0].Buf)
				copy(gbuf[*size:], out[1].Buf)
				return pk.send(gbuf, *size)
			}
			return l.Send(out)
		}
		if ps != nil {
			if len(predicted) < 8 {
				predicted = append(predicted, ps.id)
			}
			return ps.send(gbuf, *size)
		}
		if *gsotx {
			return gsoSend(gfd, gbuf, *size, peer, *port, *conn)
		}
		if *pair && *xdp {
			return l.Send(out)
		}
		if *pair {
			return ul.SendRuns(out, runs)
		}
		return l.Send(out[:1])
	}
	var seenIDs []uint16
	var workBuf [64]byte
	var workSum uint32
	// recv spins until expect datagrams arrived; it reports a 1-byte datagram (the end).
	recv := func() (bool, error) {
		got := 0
		for got < expect {
			for i := range in {
				in[i].Buf = bufs[i]
			}
			n, err := ul.TryRecv(in)
			if err != nil {
				return false, err
			}
			for i := range n {
				if len(in[i].Buf) == 1 {
					return true, nil
				}
				if countBytes {
					got += len(in[i].Buf)
					if in[i].HasIPv4ID && len(seenIDs) < 8 {
						seenIDs = append(seenIDs, in[i].IPv4ID)
					}
				}
			}
			if !countBytes {
				got += n
			}
			w := *work
			if n == 0 {
				w = *idlework
			}
			for range w {
				workSum = crc32.Update(workSum, crc32.IEEETable, workBuf[:])
			}
		}
		return false, nil
	}
	if !isClient {
		for {
			end, err := recv()
			if err != nil || end {
				fmt.Fprintf(os.Stderr, "server saw IDs %v\n", seenIDs)
				return err
			}
			if err := send(); err != nil {
				return err
			}
		}
	}
	n, err := atoi(fs.Arg(2))
	if err != nil {
		return err
	}
	v := make([]time.Duration, n)
	sv := make([]time.Duration, n) // the send alone (how long the kernel's delivery takes)
	for i := range v {
		t0 := time.Now()
		if err := send(); err != nil {
			return err
		}
		sv[i] = time.Since(t0)
		if _, err := recv(); err != nil {
			return err
		}
		v[i] = time.Since(t0)
	}
	_ = l.Send([]link.Datagram{{Buf: []byte{'q'}, Src: src, Dst: dst}})
	if ps != nil {
		fmt.Fprintf(os.Stderr, "client predicted IDs %v\n", predicted)
	}
	var st afxdp.Stats
	if x, ok := l.(afxdp.StatsLink); ok {
		st = x.XDPStats()
	}
	report("go link send", sv)
	report(fmt.Sprintf("go link rtt (size %d gro %v entropy %v pair %v xdp %v [%d/%d/%d], GOMAXPROCS=%d)",
		*size, *gro, *entropy, *pair, *xdp, st.Sent, st.Received, st.Fallbacks, runtime.GOMAXPROCS(0)), v)
	return nil
}

func gsoSocket(local netip.Addr) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
	if err != nil {
		return -1, err
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: local.As4()}); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

func gsoSend(fd int, buf []byte, seg int, peer netip.Addr, port int, connected bool) error {
	oob := gsoCmsg(seg)
	if connected {
		return unix.Sendmsg(fd, buf, oob, nil, 0)
	}
	return unix.Sendmsg(fd, buf, oob, &unix.SockaddrInet4{Addr: peer.As4(), Port: port}, 0)
}

// probeAddrs reads a server's ADDR PEER or a client's ADDR PEER N (N read by the caller).
func probeAddrs(fs *flag.FlagSet, isClient bool) (local, peer netip.Addr, err error) {
	want := 2
	if isClient {
		want = 3
	}
	if fs.NArg() != want {
		return local, peer, errUsage
	}
	if local, err = netip.ParseAddr(fs.Arg(0)); err != nil {
		return local, peer, err
	}
	peer, err = netip.ParseAddr(fs.Arg(1))
	return local, peer, err
}

// probeLink is what the probe needs of a link (link/udp's or link/afxdp's).
type probeLink interface {
	link.Link
	link.RunSender
	link.PollReceiver
}
