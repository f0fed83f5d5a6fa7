// Command probe measures what the bare Go runtime costs where softroce runs: clock reads,
// timer sleeps and 8-byte UDP round trips through the netpoller, next to the C baseline in
// pingpong.c. bench/lab-probe.sh runs both in the rxe lab guest (TCG) to find where
// softroce's milliseconds of latency come from (docs/lab.md, "What the guest costs").
//
//	probe clock N                       ns per time.Now (the runtime's nanotime path)
//	probe sleep N US                    actual duration of time.Sleep(US): median, p99
//	probe crc SIZE N                    CRC-32 (IEEE, the ICRC's) throughput over SIZE bytes
//	                                    (GODEBUG=cpu.pclmulqdq=off: the table version)
//	probe copy SIZE N                   copy throughput (memmove) of SIZE bytes
//	probe ops N                         ns per single operation (lock, atomics, clock, map,
//	                                    CRC, call): their ratios in the TCG guest (ops.go)
//	probe server [-mode M] ADDR PORT    UDP echo; M = netpoll (net.UDPConn) or spin
//	                                    (non-blocking recvfrom in a loop)
//	probe client [-mode M] ADDR PORT N  8-byte round trips; M = netpoll (net.UDPConn),
//	                                    block (blocking recvfrom system calls, no netpoller)
//	                                    or spin (non-blocking recvfrom in a loop)
//	probe lserver [flags] ADDR PEER     the spin round trip through pkg/link, its options
//	probe lclient [flags] ADDR PEER N   one at a time (link.go: -size -gro -entropy -pair -xdp)
//	probe wserver ADDR PEER             ib_write_lat's loop over the link's XDP write responder,
//	probe wclient ADDR PEER N           no RDMA engine (wresp.go)
//
// Only the addresses it is given are used (the lab's veth pairs, or loopback).
package main

import (
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"syscall"
	"time"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "probe:", err)
		os.Exit(1)
	}
}

var errUsage = errors.New("usage: probe clock N | sleep N US | crc SIZE N | copy SIZE N | server [-mode netpoll|spin] ADDR PORT | client [-mode netpoll|block|spin] ADDR PORT N")

func atoi(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%q: want a positive number", s)
	}
	return n, nil
}

func run(args []string) error {
	if len(args) < 1 {
		return errUsage
	}
	switch args[0] {
	case "clock":
		if len(args) != 2 {
			return errUsage
		}
		n, err := atoi(args[1])
		if err != nil {
			return err
		}
		fmt.Printf("go time.Now: %.1f ns/op (n=%d, GOMAXPROCS=%d)\n", clockCost(n), n, runtime.GOMAXPROCS(0))
		return nil
	case "sleep":
		if len(args) != 3 {
			return errUsage
		}
		n, err := atoi(args[1])
		if err != nil {
			return err
		}
		us, err := atoi(args[2])
		if err != nil {
			return err
		}
		v := make([]time.Duration, n)
		for i := range v {
			t0 := time.Now()
			time.Sleep(time.Duration(us) * time.Microsecond)
			v[i] = time.Since(t0)
		}
		report(fmt.Sprintf("go time.Sleep(%dus)", us), v)
		return nil
	case "crc", "copy":
		if len(args) != 3 {
			return errUsage
		}
		size, err := atoi(args[1])
		if err != nil {
			return err
		}
		n, err := atoi(args[2])
		if err != nil {
			return err
		}
		src, dst := make([]byte, size), make([]byte, size)
		var sum uint32
		t0 := time.Now()
		for range n {
			if args[0] == "crc" {
				sum = crc32.Update(sum, crc32.IEEETable, src)
			} else {
				copy(dst, src)
			}
		}
		d := time.Since(t0)
		fmt.Printf("go %s %d B: %.1f MB/s (%.2f us per op; %x)\n", args[0], size,
			float64(size)*float64(n)/d.Seconds()/1e6, float64(d.Nanoseconds())/float64(n)/1e3, sum)
		return nil
	case "ops":
		if len(args) != 2 {
			return errUsage
		}
		n, err := atoi(args[1])
		if err != nil {
			return err
		}
		opsCost(n)
		return nil
	case "lserver", "lclient":
		return linkPingPong(args[1:], args[0] == "lclient")
	case "wserver", "wclient":
		return writeResponderPingPong(args[1:], args[0] == "wclient")
	case "server":
		fs := flag.NewFlagSet("server", flag.ContinueOnError)
		mode := fs.String("mode", "netpoll", "netpoll | spin")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if fs.NArg() != 2 {
			return errUsage
		}
		if *mode == "spin" {
			return spinServer(fs.Arg(0), fs.Arg(1))
		}
		return server(fs.Arg(0), fs.Arg(1))
	case "client":
		fs := flag.NewFlagSet("client", flag.ContinueOnError)
		mode := fs.String("mode", "netpoll", "netpoll | block | spin")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if fs.NArg() != 3 {
			return errUsage
		}
		n, err := atoi(fs.Arg(2))
		if err != nil {
			return err
		}
		v, err := client(*mode, fs.Arg(0), fs.Arg(1), n)
		if err != nil {
			return err
		}
		report(fmt.Sprintf("go udp rtt (%s, GOMAXPROCS=%d)", *mode, runtime.GOMAXPROCS(0)), v)
		return nil
	}
	return errUsage
}

// clockCost is the mean cost of one time.Now over n calls, in nanoseconds.
func clockCost(n int) float64 {
	t0 := time.Now()
	var s int64
	for range n {
		s += time.Now().UnixNano() & 1
	}
	_ = s
	return float64(time.Since(t0).Nanoseconds()) / float64(n)
}

func report(what string, v []time.Duration) {
	slices.Sort(v)
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	fmt.Printf("%s n=%d min=%.1f median=%.1f p99=%.1f max=%.1f us\n", what, len(v),
		us(v[0]), us(v[len(v)/2]), us(v[len(v)*99/100]), us(v[len(v)-1]))
}

func server(ip, port string) error {
	a, err := net.ResolveUDPAddr("udp4", net.JoinHostPort(ip, port))
	if err != nil {
		return err
	}
	c, err := net.ListenUDP("udp4", a)
	if err != nil {
		return err
	}
	defer c.Close()
	buf := make([]byte, 2048)
	for {
		k, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			return err
		}
		if k == 1 && buf[0] == 'q' {
			return nil
		}
		if _, err := c.WriteToUDPAddrPort(buf[:k], from); err != nil {
			return err
		}
	}
}

// client does n 8-byte round trips to the echo server and returns their durations.
func client(mode, ip, port string, n int) ([]time.Duration, error) {
	p, err := strconv.Atoi(port)
	if err != nil {
		return nil, err
	}
	dst := net.ParseIP(ip).To4()
	if dst == nil {
		return nil, fmt.Errorf("%q: not an IPv4 address", ip)
	}
	v := make([]time.Duration, n)
	msg := []byte("pingpong")
	buf := make([]byte, 2048)
	if mode == "netpoll" {
		c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: dst, Port: p})
		if err != nil {
			return nil, err
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(time.Minute))
		for i := range v {
			t0 := time.Now()
			if _, err := c.Write(msg); err != nil {
				return nil, err
			}
			if _, err := c.Read(buf); err != nil {
				return nil, err
			}
			v[i] = time.Since(t0)
		}
		_, _ = c.Write([]byte("q"))
		return v, nil
	}
	if mode != "block" && mode != "spin" {
		return nil, errUsage
	}
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_DGRAM, 0)
	if err != nil {
		return nil, err
	}
	defer syscall.Close(fd)
	sa := &syscall.SockaddrInet4{Port: p}
	copy(sa.Addr[:], dst)
	if err := syscall.Connect(fd, sa); err != nil {
		return nil, err
	}
	flags := 0
	if mode == "spin" {
		flags = syscall.MSG_DONTWAIT
	}
	for i := range v {
		t0 := time.Now()
		if err := syscall.Sendto(fd, msg, 0, nil); err != nil {
			return nil, err
		}
		for {
			_, _, err := syscall.Recvfrom(fd, buf, flags)
			if err == nil {
				break
			}
			if err != syscall.EAGAIN && err != syscall.EINTR {
				return nil, err
			}
		}
		v[i] = time.Since(t0)
	}
	_ = syscall.Sendto(fd, []byte("q"), 0, nil)
	return v, nil
}

// spinServer echoes like server but never sleeps: non-blocking recvfrom in a loop on a raw
// socket (no netpoller, no wakeups), the way perftest polls a completion queue.
func spinServer(ip, port string) error {
	p, err := strconv.Atoi(port)
	if err != nil {
		return err
	}
	a := net.ParseIP(ip).To4()
	if a == nil {
		return fmt.Errorf("%q: not an IPv4 address", ip)
	}
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_DGRAM, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	sa := &syscall.SockaddrInet4{Port: p}
	copy(sa.Addr[:], a)
	if err := syscall.Bind(fd, sa); err != nil {
		return err
	}
	buf := make([]byte, 2048)
	for {
		k, from, err := syscall.Recvfrom(fd, buf, syscall.MSG_DONTWAIT)
		if err == syscall.EAGAIN || err == syscall.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if k == 1 && buf[0] == 'q' {
			return nil
		}
		if err := syscall.Sendto(fd, buf[:k], 0, from); err != nil {
			return err
		}
	}
}
