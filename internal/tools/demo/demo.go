// Package demo is `softroce demo`: two devices in one process connected by an RC QP pair,
// every operation (SEND, WRITE, WRITE with immediate, READ, both atomics) checked byte for
// byte, then a WRITE throughput stream. Its End and helpers are reused by `softroce stats
// --demo` and `softroce perf --loopback`.
package demo

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/spf13/pflag"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/internal/tools/cli"
	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/roce"
)

// Command is `softroce demo`.
var Command = cli.Command{
	Name:    "demo",
	Summary: "two devices in one process: RC SEND/WRITE/READ/atomics, verified, with throughput",
	Main:    Main,
}

// End is one side of the demo connection.
type End struct {
	Dev      *roce.Device
	PD       *mr.PD
	SCQ, RCQ *cq.CQ
	QP       *roce.QP
	Buf      []byte
	MR       *mr.MR
	Addr     netip.Addr
}

// Config is a parsed demo command line.
type Config struct {
	// Mem uses the in-memory link instead of UDP on 127.0.0.1/127.0.0.2.
	Mem bool
	// Portable uses plain sockets (roce.UDPOptions.Portable).
	Portable bool
	// Port is the UDP port of both devices.
	Port uint16
	// MTU is the path MTU.
	MTU qp.MTU
	// Bytes is the length of the WRITE throughput stream.
	Bytes int
}

// ErrFailed is returned by Run when a check failed (the output says which).
var ErrFailed = errors.New("demo: a check failed")

// flags are the command line's values before ParseArgs checks them.
type flags struct {
	Config
	mtu  int
	port uint
}

func newFlagSet(f *flags) *pflag.FlagSet {
	fs := cli.NewFlagSet("demo")
	fs.BoolVar(&f.Mem, "mem", false, "use the in-memory link instead of UDP on 127.0.0.1/127.0.0.2")
	fs.BoolVar(&f.Portable, "portable", false, "UDP with plain sockets (one datagram per call) instead of sendmmsg/recvmmsg")
	fs.UintVarP(&f.port, "port", "p", 4791, "UDP `port` (both devices)")
	fs.IntVarP(&f.mtu, "mtu", "m", 4096, "path `MTU`: 256, 512, 1024, 2048 or 4096")
	fs.IntVarP(&f.Bytes, "bytes", "b", 64<<20, "`bytes` of the WRITE throughput stream")
	return fs
}

// Usage writes the command's usage and options.
func Usage(w io.Writer) {
	fmt.Fprint(w, "usage: softroce demo [options]\n\nOptions:\n")
	cli.PrintFlags(w, newFlagSet(&flags{}))
}

// ParseArgs parses the demo's command line (GNU getopt style, cli.NewFlagSet).
func ParseArgs(args []string) (Config, error) {
	var f flags
	fs := newFlagSet(&f)
	if err := cli.Parse(fs, args); err != nil {
		return Config{}, err
	}
	c := f.Config
	c.MTU = qp.MTUFromBytes(f.mtu)
	switch {
	case fs.NArg() != 0:
		return c, fmt.Errorf("%w: unexpected argument %q", cli.ErrUsage, fs.Arg(0))
	case !c.MTU.Valid() || c.MTU.Bytes() != f.mtu:
		return c, fmt.Errorf("%w: --mtu %d: 256, 512, 1024, 2048 or 4096", cli.ErrUsage, f.mtu)
	case c.Bytes < 1:
		return c, fmt.Errorf("%w: --bytes %d", cli.ErrUsage, c.Bytes)
	case f.port == 0 || f.port > 65535:
		return c, fmt.Errorf("%w: --port %d", cli.ErrUsage, f.port)
	}
	c.Port = uint16(f.port)
	return c, nil
}

// Main is the command: exit status 0 when every check passed, 1 when one failed, 2 for a bad
// command line.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := ParseArgs(args)
	if errors.Is(err, pflag.ErrHelp) {
		Usage(stdout)
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "demo: %v\n", err)
		return 2
	}
	if err := Run(ctx, c, stdout); err != nil {
		if !errors.Is(err, ErrFailed) {
			fmt.Fprintf(stderr, "demo: %v\n", err)
		}
		return 1
	}
	return 0
}

// Run opens the two devices, connects them and runs the checks, writing the report to out.
func Run(_ context.Context, c Config, out io.Writer) error {
	a4, b4 := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	var da, db *roce.Device
	var err error
	kind := "UDP"
	if c.Mem {
		kind = "in-memory"
		nw := mem.NewNetwork(mem.Options{QueueDepth: 8192})
		la, err1 := nw.Attach(a4)
		lb, err2 := nw.Attach(b4)
		if err = errors.Join(err1, err2); err == nil {
			if da, err = roce.Open(roce.Options{Link: la, Name: "softroce0"}); err == nil {
				db, err = roce.Open(roce.Options{Link: lb, Name: "softroce1"})
			}
		}
	} else {
		if c.Portable {
			kind = "UDP (portable sockets)"
		}
		if da, err = roce.OpenUDP(roce.UDPOptions{Addrs: []netip.Addr{a4}, Port: c.Port, Name: "softroce0", Portable: c.Portable}); err == nil {
			db, err = roce.OpenUDP(roce.UDPOptions{Addrs: []netip.Addr{b4}, Port: c.Port, Name: "softroce1", Portable: c.Portable})
		}
	}
	if da != nil {
		defer da.Close()
	}
	if db != nil {
		defer db.Close()
	}
	if err != nil {
		return fmt.Errorf("open devices: %w", err)
	}
	bufSize := 16 << 20
	a, err := NewEnd(da, bufSize)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	b, err := NewEnd(db, bufSize)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	if err := Connect(a, b, c.MTU); err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	fmt.Fprintf(out, "softroce demo: %s link, %v <-> %v, RC QPN %#x <-> %#x, path MTU %d\n",
		kind, a.Addr, b.Addr, a.QP.Num(), b.QP.Num(), c.MTU.Bytes())
	if run(out, a, b, c.Bytes) != 0 {
		return ErrFailed
	}
	return nil
}

// NewEnd creates one side on d: a PD, two CQs, a size-byte buffer registered for every
// access, and an RC QP in RESET.
func NewEnd(d *roce.Device, size int) (*End, error) {
	e := &End{Dev: d, Addr: d.Addrs()[0], Buf: make([]byte, size)}
	var err error
	if e.PD, err = d.AllocPD(); err != nil {
		return nil, err
	}
	if e.SCQ, err = d.CreateCQ(1024); err != nil {
		return nil, err
	}
	if e.RCQ, err = d.CreateCQ(1024); err != nil {
		return nil, err
	}
	acc := mr.AccessLocalWrite | mr.AccessRemoteWrite | mr.AccessRemoteRead | mr.AccessRemoteAtomic
	if e.MR, err = d.RegMR(e.PD, e.Buf, 0x1000_0000, acc); err != nil {
		return nil, err
	}
	e.QP, err = d.CreateQP(roce.QPInit{Type: qp.TypeRC, PD: e.PD, SendCQ: e.SCQ, RecvCQ: e.RCQ,
		Cap: qp.Cap{MaxSendWR: 256, MaxRecvWR: 256, MaxSendSGE: 4, MaxRecvSGE: 4, MaxInlineData: 64}})
	return e, err
}

// Connect moves both QPs to RTS, each toward the other (path MTU mtu).
func Connect(a, b *End, mtu qp.MTU) error {
	acc := mr.AccessLocalWrite | mr.AccessRemoteWrite | mr.AccessRemoteRead | mr.AccessRemoteAtomic
	up := func(e, peer *End, rq, sq uint32) error {
		steps := []struct {
			a qp.Attr
			m qp.AttrMask
		}{
			{qp.Attr{State: qp.StateInit, Port: 1, AccessFlags: acc}, qp.AttrState | qp.AttrPKeyIndex | qp.AttrPort | qp.AttrAccessFlags},
			{qp.Attr{State: qp.StateRTR, AH: qp.AHAttr{DGID: peer.Addr, SGIDIndex: uint8(e.Dev.GIDIndex(e.Addr)), Port: 1, HopLimit: 64}, PathMTU: mtu,
				DestQPN: peer.QP.Num(), RQPSN: rq, MaxDestRDAtomic: 16, MinRNRTimer: 12},
				qp.AttrState | qp.AttrAV | qp.AttrPathMTU | qp.AttrDestQPN | qp.AttrRQPSN | qp.AttrMaxDestRDAtomic | qp.AttrMinRNRTimer},
			{qp.Attr{State: qp.StateRTS, SQPSN: sq, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRDAtomic: 16},
				qp.AttrState | qp.AttrSQPSN | qp.AttrTimeout | qp.AttrRetryCnt | qp.AttrRNRRetry | qp.AttrMaxQPRDAtomic},
		}
		for _, s := range steps {
			if err := e.QP.Modify(&s.a, s.m); err != nil {
				return err
			}
		}
		return nil
	}
	if err := up(a, b, 0xABCDE, 0x12345); err != nil {
		return err
	}
	return up(b, a, 0x12345, 0xABCDE)
}

// SGE is the scatter/gather element of n bytes at off in e's buffer.
func (e *End) SGE(off, n int) qp.SGE {
	return qp.SGE{Addr: e.MR.IOVA() + uint64(off), Length: uint32(n), LKey: e.MR.LKey()}
}

// VA is the IOVA of off in e's buffer.
func (e *End) VA(off int) uint64 { return e.MR.IOVA() + uint64(off) }

// Wait polls c until n completions arrive (10 s bound) and checks them.
func Wait(c *cq.CQ, n int) ([]cq.WC, error) {
	out := make([]cq.WC, 0, n)
	buf := make([]cq.WC, 32)
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for len(out) < n {
		k := c.Poll(buf[:min(len(buf), n-len(out))])
		out = append(out, buf[:k]...)
		if k > 0 {
			continue
		}
		if err := c.ReqNotify(false); err != nil {
			return out, err
		}
		if k = c.Poll(buf[:min(len(buf), n-len(out))]); k > 0 {
			out = append(out, buf[:k]...)
			continue
		}
		select {
		case <-c.Channel():
		case <-deadline.C:
			return out, fmt.Errorf("timed out with %d of %d completions", len(out), n)
		}
	}
	for _, wc := range out {
		if wc.Status != cq.StatusSuccess {
			return out, fmt.Errorf("completion WR %d: %v", wc.WRID, wc.Status)
		}
	}
	return out, nil
}

// FillPattern fills b with a pattern that differs per seed.
func FillPattern(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i*31) ^ seed ^ byte(i>>11)
	}
}

// run runs the checks from a to b and returns the number that failed.
func run(stdout io.Writer, a, b *End, total int) int {
	const size = 1<<20 + 12345 // several packets, not a multiple of the MTU
	const dst = 4 << 20
	failed := 0
	check := func(name string, err error) {
		if err != nil {
			failed++
			fmt.Fprintf(stdout, "  %-16s FAIL  %v\n", name, err)
			return
		}
		fmt.Fprintf(stdout, "  %-16s ok\n", name)
	}
	post := func(e *End, wr qp.SendWR) error {
		_, err := e.QP.PostSend([]qp.SendWR{wr})
		return err
	}
	// SEND
	check("SEND", func() error {
		FillPattern(a.Buf[:size], 1)
		if _, err := b.QP.PostRecv([]qp.RecvWR{{WRID: 1, SGL: []qp.SGE{b.SGE(dst, size)}}}); err != nil {
			return err
		}
		if err := post(a, qp.SendWR{WRID: 1, Opcode: qp.WRSend, SGL: []qp.SGE{a.SGE(0, size)}, Flags: qp.SendSignaled}); err != nil {
			return err
		}
		if _, err := Wait(a.SCQ, 1); err != nil {
			return err
		}
		wc, err := Wait(b.RCQ, 1)
		if err != nil {
			return err
		}
		if wc[0].Opcode != cq.OpRecv || wc[0].ByteLen != size {
			return fmt.Errorf("receive completion %v len %d", wc[0].Opcode, wc[0].ByteLen)
		}
		if !bytes.Equal(b.Buf[dst:dst+size], a.Buf[:size]) {
			return errors.New("data differs")
		}
		return nil
	}())
	// WRITE
	check("RDMA_WRITE", func() error {
		FillPattern(a.Buf[:size], 2)
		if err := post(a, qp.SendWR{WRID: 2, Opcode: qp.WRRDMAWrite, SGL: []qp.SGE{a.SGE(0, size)}, Flags: qp.SendSignaled,
			RemoteAddr: b.VA(dst), RKey: b.MR.RKey()}); err != nil {
			return err
		}
		if _, err := Wait(a.SCQ, 1); err != nil {
			return err
		}
		if !bytes.Equal(b.Buf[dst:dst+size], a.Buf[:size]) {
			return errors.New("data differs")
		}
		return nil
	}())
	// WRITE_WITH_IMM
	check("RDMA_WRITE_IMM", func() error {
		FillPattern(a.Buf[:size], 3)
		if _, err := b.QP.PostRecv([]qp.RecvWR{{WRID: 3}}); err != nil {
			return err
		}
		if err := post(a, qp.SendWR{WRID: 3, Opcode: qp.WRRDMAWriteWithImm, SGL: []qp.SGE{a.SGE(0, size)}, Flags: qp.SendSignaled,
			Imm: 0xC0FFEE, RemoteAddr: b.VA(dst), RKey: b.MR.RKey()}); err != nil {
			return err
		}
		if _, err := Wait(a.SCQ, 1); err != nil {
			return err
		}
		wc, err := Wait(b.RCQ, 1)
		if err != nil {
			return err
		}
		if wc[0].Opcode != cq.OpRecvRDMAWithImm || wc[0].ImmData != 0xC0FFEE || wc[0].Flags&cq.FlagWithImm == 0 || wc[0].ByteLen != size {
			return fmt.Errorf("receive completion %+v", wc[0])
		}
		if !bytes.Equal(b.Buf[dst:dst+size], a.Buf[:size]) {
			return errors.New("data differs")
		}
		return nil
	}())
	// READ
	check("RDMA_READ", func() error {
		FillPattern(b.Buf[dst:dst+size], 4)
		clear(a.Buf[:size])
		if err := post(a, qp.SendWR{WRID: 4, Opcode: qp.WRRDMARead, SGL: []qp.SGE{a.SGE(0, size)}, Flags: qp.SendSignaled,
			RemoteAddr: b.VA(dst), RKey: b.MR.RKey()}); err != nil {
			return err
		}
		if _, err := Wait(a.SCQ, 1); err != nil {
			return err
		}
		if !bytes.Equal(a.Buf[:size], b.Buf[dst:dst+size]) {
			return errors.New("data differs")
		}
		return nil
	}())
	// atomics
	const word = 8 << 20
	check("ATOMIC_CMP_SWP", func() error {
		binary.LittleEndian.PutUint64(b.Buf[word:], 0x1111)
		if err := post(a, qp.SendWR{WRID: 5, Opcode: qp.WRAtomicCmpAndSwp, SGL: []qp.SGE{a.SGE(0, 8)}, Flags: qp.SendSignaled,
			RemoteAddr: b.VA(word), RKey: b.MR.RKey(), CompareAdd: 0x1111, Swap: 0x2222}); err != nil {
			return err
		}
		if _, err := Wait(a.SCQ, 1); err != nil {
			return err
		}
		if o, n := binary.LittleEndian.Uint64(a.Buf), binary.LittleEndian.Uint64(b.Buf[word:]); o != 0x1111 || n != 0x2222 {
			return fmt.Errorf("returned %#x, remote now %#x", o, n)
		}
		return nil
	}())
	check("ATOMIC_FETCH_ADD", func() error {
		if err := post(a, qp.SendWR{WRID: 6, Opcode: qp.WRAtomicFetchAndAdd, SGL: []qp.SGE{a.SGE(8, 8)}, Flags: qp.SendSignaled,
			RemoteAddr: b.VA(word), RKey: b.MR.RKey(), CompareAdd: 5}); err != nil {
			return err
		}
		if _, err := Wait(a.SCQ, 1); err != nil {
			return err
		}
		if o, n := binary.LittleEndian.Uint64(a.Buf[8:]), binary.LittleEndian.Uint64(b.Buf[word:]); o != 0x2222 || n != 0x2227 {
			return fmt.Errorf("returned %#x, remote now %#x", o, n)
		}
		return nil
	}())
	// throughput: a stream of 1 MiB WRITEs, 8 in flight, every one signaled
	var gbps float64
	check(fmt.Sprintf("WRITE %d MiB", total>>20), func() error {
		const chunk = 1 << 20
		const inflight = 8
		FillPattern(a.Buf[:inflight*chunk], 5)
		n := (total + chunk - 1) / chunk
		start := time.Now()
		posted, done := 0, 0
		for done < n {
			for posted < n && posted-done < inflight {
				off := (posted % inflight) * chunk
				ln := min(chunk, total-posted*chunk)
				if err := post(a, qp.SendWR{WRID: uint64(100 + posted), Opcode: qp.WRRDMAWrite, SGL: []qp.SGE{a.SGE(off, ln)},
					Flags: qp.SendSignaled, RemoteAddr: b.VA(dst + off), RKey: b.MR.RKey()}); err != nil {
					return err
				}
				posted++
			}
			if _, err := Wait(a.SCQ, 1); err != nil {
				return err
			}
			done++
		}
		el := time.Since(start)
		gbps = float64(total) * 8 / el.Seconds() / 1e9
		if !bytes.Equal(b.Buf[dst:dst+inflight*chunk], a.Buf[:inflight*chunk]) {
			return errors.New("data differs")
		}
		fmt.Fprintf(stdout, "  %-16s %.2f Gbit/s (%d bytes in %v)\n", "throughput", gbps, total, el.Round(time.Millisecond))
		return nil
	}())
	sa, sb := a.Dev.Stats(), b.Dev.Stats()
	fmt.Fprintf(stdout, "counters %s: sent_pkts %d rcvd_pkts %d retries %d; %s: sent_pkts %d rcvd_pkts %d duplicate_request %d out_of_seq_request %d\n",
		a.Dev.Name(), sa.SentPkts, sa.RcvdPkts, sa.CompleterRetryErr, b.Dev.Name(), sb.SentPkts, sb.RcvdPkts, sb.DuplicateRequest, sb.OutOfSeqRequest)
	if failed > 0 {
		fmt.Fprintf(stdout, "FAIL: %d of 7 checks failed\n", failed)
		return failed
	}
	fmt.Fprintln(stdout, "PASS: all 7 checks passed")
	return 0
}
