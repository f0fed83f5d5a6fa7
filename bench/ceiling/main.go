// Command ceiling measures the raw UDP GSO/GRO ceiling of this machine for RoCE-shaped traffic
// over loopback (docs/performance.md, "the ceiling"): the sender builds 64 KiB
// GSO messages of 4 KiB segments (a 12-byte BTH, the payload copied from a "registered" buffer,
// the ICRC of IBTA A17.3.3 computed per segment) and hands each to one sendmsg with UDP_SEGMENT;
// the receiver reads with UDP_GRO (recvmmsg of 8 x 64 KiB), splits by the segment size, checks
// every ICRC and copies the payload into a destination (-buf bytes, cycled through; pages faulted
// in first). It prints the payload rate the
// receiver verified and placed, in Gbit/s, and the loss.
//
// It uses raw x/sys/unix syscalls (no pkg/roce code but pkg/bth's ICRC), so it bounds what any
// userspace RoCE data path in Go can do here. Loopback only (127.0.0.1 -> 127.0.0.2).
package main

import (
	"encoding/binary"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/pkg/bth"
)

func main() {
	dur := flag.Duration("t", 3*time.Second, "measurement time")
	seg := flag.Int("seg", 4096, "payload bytes per segment (RoCE MTU)")
	port := flag.Int("port", 34791, "UDP port")
	noWork := flag.Bool("nowork", false, "skip the RoCE work (payload copy, ICRC): the bare socket ceiling")
	bufSize := flag.Int("buf", 64<<20, "bytes of the source (registered) and destination buffers the payload is copied from and into, cycled through (perftest's write_bw uses one message-sized buffer: -buf 65536)")
	windows := flag.String("window", "8,16,32", "GSO messages in flight, comma-separated: each is measured for -t and the best is the ceiling (flow control: the sender waits for the receiver; 0 = blast)")
	flag.Parse()
	best, bestLine := -1.0, ""
	for _, w := range strings.Split(*windows, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(w))
		if err != nil || n < 0 {
			fmt.Fprintln(os.Stderr, "ceiling: bad -window", w)
			os.Exit(2)
		}
		g, line, err := run(*dur, *seg, *port, !*noWork, n, max(*bufSize, *seg))
		if err != nil {
			fmt.Fprintln(os.Stderr, "ceiling:", err)
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, line)
		if g > best {
			best, bestLine = g, line
		}
	}
	fmt.Println(bestLine)
}

func udpSocket(a netip.AddrPort, gro bool) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16<<20) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 16<<20)
	}
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 4<<20) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 4<<20)
	}
	if gro {
		if err := unix.SetsockoptInt(fd, unix.SOL_UDP, unix.UDP_GRO, 1); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("UDP_GRO: %w", err)
		}
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: int(a.Port()), Addr: a.Addr().As4()}); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

func run(dur time.Duration, seg, port int, work bool, window, bufSize int) (float64, string, error) {
	src := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port))
	dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), uint16(port))
	sfd, err := udpSocket(src, false)
	if err != nil {
		return 0, "", err
	}
	defer unix.Close(sfd)
	rfd, err := udpSocket(dst, true)
	if err != nil {
		return 0, "", err
	}
	// a receive timeout so the receiver notices the end
	tv := unix.Timeval{Usec: 100000}
	_ = unix.SetsockoptTimeval(rfd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)

	pkt := bth.BTHSize + seg + bth.ICRCSize
	nseg := min(64, 65507/pkt)
	ep := bth.Endpoints{Src: src.Addr(), Dst: dst.Addr(), SrcPort: src.Port(), DstPort: dst.Port()}
	state := bth.PseudoHeaderCRC(&ep, pkt)

	// Flow control, as a transport's window would: one credit per GSO message in flight, returned
	// by the receiver per nseg segments placed (a lost message's credit comes back after 20 ms).
	credits := make(chan struct{}, max(window, 1))
	for i := 0; i < window; i++ {
		credits <- struct{}{}
	}
	var stop atomic.Bool
	var sentSegs, rcvdSegs, badSegs atomic.Uint64
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // sender
		defer wg.Done()
		runtime.LockOSThread()
		mrBuf := make([]byte, bufSize)
		for i := range mrBuf {
			mrBuf[i] = byte(i * 7)
		}
		msg := make([]byte, nseg*pkt)
		for k := 0; k < nseg; k++ {
			bth.BTH(msg[k*pkt:]).Encode(&bth.BTHFields{Opcode: bth.OpRCWriteMiddle, PKey: 0xFFFF, DestQP: 0x11})
		}
		sa := unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: dst.Addr().As4()}
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:], dst.Port())
		cmsg := make([]byte, unix.CmsgSpace(2))
		ch := (*unix.Cmsghdr)(unsafe.Pointer(&cmsg[0]))
		ch.Level, ch.Type = unix.SOL_UDP, unix.UDP_SEGMENT
		ch.SetLen(unix.CmsgLen(2))
		*(*uint16)(unsafe.Pointer(&cmsg[unix.CmsgLen(0)])) = uint16(pkt)
		iov := unix.Iovec{Base: &msg[0]}
		iov.SetLen(len(msg))
		h := unix.Msghdr{Name: (*byte)(unsafe.Pointer(&sa)), Namelen: unix.SizeofSockaddrInet4, Iov: &iov, Iovlen: 1,
			Control: &cmsg[0]}
		h.SetControllen(len(cmsg))
		sstates := make([]uint32, nseg)
		for k := range sstates {
			e := ep
			e.IPID = uint16(k)
			sstates[k] = bth.PseudoHeaderCRC(&e, pkt)
		}
		off := 0
		wait := time.NewTimer(time.Hour)
		for psn := uint32(0); !stop.Load(); {
			if window > 0 {
				select {
				case <-credits:
				default:
					wait.Reset(20 * time.Millisecond)
					select {
					case <-credits:
					case <-wait.C:
					}
					wait.Stop()
				}
			}
			if work {
				for k := 0; k < nseg; k++ {
					p := msg[k*pkt : (k+1)*pkt]
					bth.BTH(p).SetPSN(bth.PSN(psn))
					psn++
					if off+seg > len(mrBuf) {
						off = 0
					}
					copy(p[bth.BTHSize:], mrBuf[off:off+seg])
					off += seg
					bth.SetICRC(p, bth.ICRCContinue(sstates[k], p)) // segment k carries IPv4 ID k
				}
			}
			_, _, e := unix.Syscall(unix.SYS_SENDMSG, uintptr(sfd), uintptr(unsafe.Pointer(&h)), 0)
			if e == 0 {
				sentSegs.Add(uint64(nseg))
			} else if e != unix.EINTR && e != unix.ENOBUFS && e != unix.EAGAIN {
				fmt.Fprintln(os.Stderr, "sendmsg:", e)
				return
			}
		}
	}()
	go func() { // receiver
		defer wg.Done()
		runtime.LockOSThread()
		const batch = 8
		dest := make([]byte, bufSize)
		for i := 0; i < len(dest); i += 4096 {
			dest[i] = 1 // fault the pages in before measuring
		}
		bufs := make([][]byte, batch)
		msgs := make([]mmsghdr, batch)
		iovs := make([]unix.Iovec, batch)
		ctl := make([]byte, batch*unix.CmsgSpace(4))
		space := unix.CmsgSpace(4)
		for i := range bufs {
			bufs[i] = make([]byte, 65536)
			iovs[i].Base = &bufs[i][0]
			iovs[i].SetLen(65536)
			msgs[i].hdr.Iov = &iovs[i]
			msgs[i].hdr.Iovlen = 1
		}
		doff := 0
		// the ICRC state of each segment index (kernel: ID k in segment k)
		states := make([]uint32, 64)
		for k := range states {
			e := ep
			e.IPID = uint16(k)
			states[k] = bth.PseudoHeaderCRC(&e, pkt)
		}
		for !stop.Load() {
			for i := range msgs {
				msgs[i].hdr.Control = &ctl[i*space]
				msgs[i].hdr.SetControllen(space)
			}
			n, _, e := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(rfd), uintptr(unsafe.Pointer(&msgs[0])), batch, unix.MSG_WAITFORONE, 0, 0)
			if e != 0 {
				continue
			}
			for i := 0; i < int(n); i++ {
				total := int(msgs[i].len)
				sz := groSize(ctl[i*space : i*space+int(msgs[i].hdr.Controllen)])
				if sz <= 0 {
					sz = total
				}
				for k, o := 0, 0; o < total; k, o = k+1, o+sz {
					p := bufs[i][o:min(o+sz, total)]
					if work {
						st := state
						if k < len(states) {
							st = states[k]
						}
						if len(p) != pkt || bth.ICRCContinue(st, p) != bth.GetICRC(p) {
							badSegs.Add(1)
							continue
						}
						if doff+seg > len(dest) {
							doff = 0
						}
						copy(dest[doff:], p[bth.BTHSize:bth.BTHSize+seg])
						doff += seg
					}
					if rcvdSegs.Add(1)%uint64(nseg) == 0 && window > 0 {
						select {
						case credits <- struct{}{}:
						default:
						}
					}
				}
			}
		}
	}()
	time.Sleep(500 * time.Millisecond) // warm up
	r0, s0 := rcvdSegs.Load(), sentSegs.Load()
	t0 := time.Now()
	time.Sleep(dur)
	r1, s1 := rcvdSegs.Load(), sentSegs.Load()
	el := time.Since(t0)
	stop.Store(true)
	wg.Wait()
	unix.Close(rfd)
	gbps := float64(r1-r0) * float64(seg) * 8 / el.Seconds() / 1e9
	loss := 0.0
	if s1 > s0 {
		loss = 100 * (1 - float64(r1-r0)/float64(s1-s0))
	}
	line := fmt.Sprintf("ceiling: %d-byte segments, %d per GSO message, %d in flight, %d-byte buffers, RoCE work %v: %.2f Gbit/s payload received (%.2f Mpkt/s), loss %.1f%%, bad ICRC %d",
		seg, nseg, window, bufSize, work, gbps, float64(r1-r0)/el.Seconds()/1e6, loss, badSegs.Load())
	return gbps, line, nil
}

type mmsghdr struct {
	hdr unix.Msghdr
	len uint32
	_   [4]byte
}

// groSize returns the UDP_GRO segment size in a control buffer (0 if absent).
func groSize(ctl []byte) int {
	for len(ctl) >= unix.SizeofCmsghdr {
		c := (*unix.Cmsghdr)(unsafe.Pointer(&ctl[0]))
		cl := int(c.Len)
		if cl < unix.SizeofCmsghdr || cl > len(ctl) {
			return 0
		}
		if c.Level == unix.SOL_UDP && c.Type == unix.UDP_GRO && cl >= unix.CmsgLen(2) {
			return int(*(*uint16)(unsafe.Pointer(&ctl[unix.CmsgLen(0)])))
		}
		ctl = ctl[unix.CmsgSpace(cl-unix.CmsgLen(0)):]
	}
	return 0
}
