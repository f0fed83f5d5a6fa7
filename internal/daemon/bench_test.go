package daemon_test

import (
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/roce"
)

// loopbackPair returns two loopback addresses unique to this process and an index.
func loopbackPair(i int) (netip.Addr, netip.Addr) {
	pid := os.Getpid()
	return netip.AddrFrom4([4]byte{127, byte(100 + pid%100), byte(pid / 100 % 250), byte(10 + 2*i)}),
		netip.AddrFrom4([4]byte{127, byte(100 + pid%100), byte(pid / 100 % 250), byte(11 + 2*i)})
}

func udpDevice(b *testing.B, ip netip.Addr) *roce.Device {
	d, err := roce.OpenUDP(roce.UDPOptions{Addrs: []netip.Addr{ip}})
	if err != nil {
		b.Skip("UDP loopback unavailable:", err)
	}
	return d
}

// BenchmarkWrite64K: 64 KiB RDMA WRITEs, 16 in flight, UDP loopback, MTU
// 4096, the same Verbs code embedded (both devices in this process) and
// through two daemons (servers in this process, the program a client over
// the unix socket: every post is a socket round trip, completions come
// through the shared ring, data through the shared memfd).
// Completions are waited for on the completion channel (ReqNotify, poll,
// wait: ib_write_bw -e); busy-polling starves the engine's goroutines on a
// small shared machine.
func BenchmarkWrite64K(b *testing.B) { benchWrite(b, 65536, 16, 4) }

// BenchmarkWrite64B: one 64-byte WRITE at a time (latency: the post round
// trip and the completion wakeup dominate).
func BenchmarkWrite64B(b *testing.B) { benchWrite(b, 64, 1, 8) }

// writeLoop runs n signaled WRITEs of size bytes from a to p with depth in
// flight (completed slots re-posted in one call), calling start once the
// connection is up; it returns when all n completed.
func writeLoop(tb testing.TB, va, vb roce.Verbs, ipA, ipB netip.Addr, size, depth, n int, start func()) {
	writeLoopMem(tb, va, vb, ipA, ipB, size, depth, n, start, false)
}

// writeLoopMem is writeLoop with both programs' memory their own (processMem: a heap slice,
// registered where it is; the daemon copies through /proc/self/mem) or from AllocBuffer.
func writeLoopMem(tb testing.TB, va, vb roce.Verbs, ipA, ipB netip.Addr, size, depth, n int, start func(), processMem bool) {
	var a, p *end
	if processMem {
		a = newEndBuf(tb, va, make([]byte, size*depth), uint32(depth), rcAccess)
		p = newEndBuf(tb, vb, make([]byte, size*depth), uint32(depth), rcAccess)
	} else {
		a = newEnd(tb, va, size*depth, uint32(depth), rcAccess)
		p = newEnd(tb, vb, size*depth, uint32(depth), rcAccess)
	}
	a.timeout, p.timeout = 16, 16 // 268 ms: a loaded machine must not fail the run
	a.connect(tb, ipB, p.q.Num(), uint8(va.GIDIndex(ipA)))
	p.connect(tb, ipA, a.q.Num(), uint8(vb.GIDIndex(ipB)))
	writeStream(tb, a, p.iova, p.m.RKey(), size, depth, n, start)
}

// benchWait is how writeStream waits for its completions, from the
// environment (the same in the benchmark's child processes):
// SOFTROCE_DAEMON_BENCH_MOD = the moderation count (cq.Moderation.Count;
// default depth/2, "half the window"; 1 = no moderation),
// SOFTROCE_DAEMON_BENCH_PERIOD = its period in microseconds (default
// 1000: only the run's last WRITEs, fewer than the count, wait for it),
// SOFTROCE_DAEMON_BENCH_WAIT=channel waits on Channel instead of Wait.
// writeStream also fills the source buffer (SOFTROCE_DAEMON_BENCH_FILL=0 does not).
func benchWait(depth int) (m cq.Moderation, channel bool) {
	count, period := max(depth/2, 1), 1000
	if v, err := strconv.Atoi(os.Getenv("SOFTROCE_DAEMON_BENCH_MOD")); err == nil && v > 0 {
		count = v
	}
	if v, err := strconv.Atoi(os.Getenv("SOFTROCE_DAEMON_BENCH_PERIOD")); err == nil && v >= 0 {
		period = v
	}
	return cq.Moderation{Count: uint16(min(count, 65535)), PeriodUS: uint16(min(period, 65535))},
		os.Getenv("SOFTROCE_DAEMON_BENCH_WAIT") == "channel"
}

// writeStream is writeLoop's sending half: a's QP is connected; the peer's
// buffer is at piova/prkey (depth*size bytes). Completions are waited for
// as benchWait says: ReqNotify, poll, Wait (or the channel), with the CQ's
// event moderated to half the window by default.
func writeStream(tb testing.TB, a *end, piova uint64, prkey uint32, size, depth, n int, start func()) {
	mod, useChannel := benchWait(depth)
	if err := a.v.ModifyCQ(a.cq, mod); err != nil {
		tb.Fatal("ModifyCQ:", err)
	}
	// The source holds data, as a program's would (SOFTROCE_DAEMON_BENCH_FILL=0: untouched).
	// An untouched heap buffer (embedded mode) reads from the kernel's shared zero page, so
	// its copies hit the cache every time; a memfd (daemon mode) has pages of its own.
	if os.Getenv("SOFTROCE_DAEMON_BENCH_FILL") != "0" {
		pattern(a.buf, 1)
	}
	wrs := make([]qp.SendWR, depth)
	for i := range wrs {
		wrs[i] = qp.SendWR{WRID: uint64(i), Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
			SGL:        []qp.SGE{{Addr: a.iova + uint64(i*size), Length: uint32(size), LKey: a.m.LKey()}},
			RemoteAddr: piova + uint64(i*size), RKey: prkey}
	}
	batch := make([]qp.SendWR, 0, depth)
	wcs := make([]cq.WC, depth)
	start()
	posted, done := min(depth, n), 0
	if _, err := a.q.PostSend(wrs[:posted]); err != nil {
		tb.Fatal(err)
	}
	for done < n {
		k := a.cq.Poll(wcs)
		if k == 0 {
			a.cq.ReqNotify(false)
			if k = a.cq.Poll(wcs); k == 0 {
				if useChannel {
					<-a.cq.Channel()
				} else if err := a.cq.Wait(); err != nil {
					tb.Fatal("Wait:", err)
				}
				continue
			}
		}
		for _, wc := range wcs[:k] {
			if wc.Status != cq.StatusSuccess {
				tb.Fatalf("completion %+v", wc)
			}
		}
		done += k
		if m := min(k, n-posted); m > 0 {
			batch = batch[:0]
			for _, wc := range wcs[:m] {
				batch = append(batch, wrs[wc.WRID])
			}
			if _, err := a.q.PostSend(batch); err != nil {
				tb.Fatal(err)
			}
			posted += m
		}
	}
}

func benchWrite(b *testing.B, size, depth, pairBase int) {
	run := func(b *testing.B, va, vb roce.Verbs, ipA, ipB netip.Addr, processMem bool) {
		b.SetBytes(int64(size))
		b.ReportAllocs()
		writeLoopMem(b, va, vb, ipA, ipB, size, depth, b.N, b.ResetTimer, processMem)
		b.StopTimer()
	}
	b.Run("embedded", func(b *testing.B) {
		ipA, ipB := loopbackPair(pairBase)
		da, db := udpDevice(b, ipA), udpDevice(b, ipB)
		defer da.Close()
		defer db.Close()
		run(b, da.Verbs(), db.Verbs(), ipA, ipB, false)
	})
	b.Run("daemon", func(b *testing.B) {
		ipA, ipB := loopbackPair(pairBase + 1)
		// The same devices as embedded (roce.OpenUDP: GSO runs, GRO), as
		// `softroce daemon` opens them.
		sa, sb := serveDevice(b, udpDevice(b, ipA), "a"), serveDevice(b, udpDevice(b, ipB), "b")
		run(b, sa.dial(b), sb.dial(b), ipA, ipB, false)
	})
	// The programs' own memory (as a C program's malloc'd buffers): each 64 KiB message is
	// one pread (sender's daemon, read ahead) and one pwrite (receiver's daemon, written
	// behind) on /proc/<pid>/mem, not one per packet (internal/qp/copybatch.go).
	b.Run("daemon-process-memory", func(b *testing.B) {
		ipA, ipB := loopbackPair(pairBase + 2)
		sa, sb := serveDevice(b, udpDevice(b, ipA), "a"), serveDevice(b, udpDevice(b, ipB), "b")
		run(b, sa.dial(b), sb.dial(b), ipA, ipB, true)
	})
}

// BenchmarkProcMemCopy: the cost of one copy through /proc/self/mem (what the daemon pays per
// packet and SGE of an SR_MR_PROCESS region), reading and writing, next to a plain copy of the
// same bytes: the fixed cost per call and the cost per byte.
func BenchmarkProcMemCopy(b *testing.B) {
	f, err := os.OpenFile("/proc/self/mem", os.O_RDWR, 0)
	if err != nil {
		b.Skip(err)
	}
	defer f.Close()
	src := make([]byte, 1<<20)
	pattern(src, 1)
	addr := int64(uintptr(unsafe.Pointer(&src[0])))
	for _, size := range []int{64, 1024, 4096, 65536} {
		dst := make([]byte, size)
		b.Run(fmt.Sprintf("pread/%d", size), func(b *testing.B) {
			b.SetBytes(int64(size))
			for i := 0; i < b.N; i++ {
				if n, err := unix.Pread(int(f.Fd()), dst, addr); err != nil || n != size {
					b.Fatal(n, err)
				}
			}
		})
		b.Run(fmt.Sprintf("pwrite/%d", size), func(b *testing.B) {
			b.SetBytes(int64(size))
			for i := 0; i < b.N; i++ {
				if n, err := unix.Pwrite(int(f.Fd()), dst, addr); err != nil || n != size {
					b.Fatal(n, err)
				}
			}
		})
		b.Run(fmt.Sprintf("copy/%d", size), func(b *testing.B) {
			b.SetBytes(int64(size))
			for i := 0; i < b.N; i++ {
				copy(dst, src)
			}
		})
	}
	runtime.KeepAlive(src)
}
