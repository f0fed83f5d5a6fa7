package udp

import (
	"fmt"
	"os"

	"github.com/softroce/softroce/pkg/link"
	"golang.org/x/sys/unix"
)

// MaxShards bounds ListenShards.
const MaxShards = 64

// ListenShards opens n links on the same addresses and port (SO_REUSEPORT), one per receive
// worker, and steers every received datagram to shard DestQP mod n: a classic BPF program
// (SO_ATTACH_REUSEPORT_CBPF) reads the 24-bit destination QP from bytes 5..7 of the BTH (IBTA
// 9.2, Table 34; the program sees the UDP payload) and returns the shard's index in the port's
// reuseport group. A GRO train or GSO message is steered by its first segment (the engine's
// runs never mix QPs). Datagrams too short for a BTH go to shard 0, which drops them. Any shard
// can send for any QP (same address and port on the wire). The shards share each address's
// entropy-port sockets (Options.Entropy). n <= 1 is Listen.
//
// AnyPort binds the first shard to a kernel-chosen port and the others to the same one (one
// address only).
func ListenShards(o Options, n int) ([]*Link, error) {
	if n <= 1 {
		l, err := Listen(o)
		if err != nil {
			return nil, err
		}
		return []*Link{l}, nil
	}
	if n > MaxShards {
		return nil, fmt.Errorf("listen udp: %d shards (max %d): %w", n, MaxShards, link.ErrInvalidAddr)
	}
	if o.AnyPort && len(o.Addrs) != 1 {
		return nil, fmt.Errorf("listen udp shards: AnyPort needs exactly one address: %w", link.ErrInvalidAddr)
	}
	o.reusePort = true
	links := make([]*Link, 0, n)
	fail := func(err error) ([]*Link, error) {
		for _, l := range links {
			l.Close()
		}
		return nil, err
	}
	for i := 0; i < n; i++ {
		l, err := Listen(o)
		if err != nil {
			return fail(fmt.Errorf("shard %d: %w", i, err))
		}
		links = append(links, l)
		if i == 0 && o.AnyPort {
			o.AnyPort, o.Port = false, l.socks[0].local.Port()
		}
		if i > 0 {
			// One entropy pool per address for all shards: a port is bound once, whichever
			// shard's QP asks first (entropy_linux.go); shard 0 reports it in Stats.
			for k, s := range l.socks {
				if p := links[0].socks[k].pool; p != nil {
					s.pool.release()
					p.refs.Add(1)
					s.pool = p
				}
			}
		}
	}
	prog := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 4}, // A = BTH bytes 4..7
		{Code: unix.BPF_ALU | unix.BPF_AND | unix.BPF_K, K: 0xFFFFFF},
		{Code: unix.BPF_ALU | unix.BPF_MOD | unix.BPF_K, K: uint32(n)},
		{Code: unix.BPF_RET | unix.BPF_A},
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	for _, s := range links[0].socks {
		var serr error
		if err := s.rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptSockFprog(int(fd), unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_CBPF, &fprog)
		}); err != nil {
			serr = err
		}
		if serr != nil {
			return fail(os.NewSyscallError("setsockopt SO_ATTACH_REUSEPORT_CBPF", serr))
		}
	}
	return links, nil
}
