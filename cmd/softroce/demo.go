package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/roce"
)

func init() {
	register(&command{
		name:    "demo",
		summary: "two devices in one process: RC SEND/WRITE/READ/atomics, verified, with throughput",
		run:     runDemo,
	})
}

// demoEnd is one side of the demo connection.
type demoEnd struct {
	dev      *roce.Device
	pd       *mr.PD
	scq, rcq *cq.CQ
	qp       *roce.QP
	buf      []byte
	mr       *mr.MR
	addr     netip.Addr
}

func runDemo(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	mem := fs.Bool("mem", false, "use the in-memory link instead of UDP on 127.0.0.1/127.0.0.2")
	portable := fs.Bool("portable", false, "UDP with plain sockets (one datagram per call) instead of sendmmsg/recvmmsg")
	port := fs.Uint("port", 4791, "UDP port (both devices)")
	mtuFlag := fs.Int("mtu", 4096, "path MTU: 256, 512, 1024, 2048 or 4096")
	total := fs.Int("bytes", 64<<20, "bytes of the WRITE throughput stream")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	mtu := qp.MTUFromBytes(*mtuFlag)
	if !mtu.Valid() || mtu.Bytes() != *mtuFlag || *total < 1 || *port == 0 || *port > 65535 {
		fmt.Fprintln(stderr, "demo: bad -mtu, -bytes or -port")
		return 2
	}
	a4, b4 := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	var da, db *roce.Device
	var err error
	kind := "UDP"
	if *mem {
		kind = "in-memory"
		nw := link.NewMemNetwork(link.MemOptions{QueueDepth: 8192})
		la, err1 := nw.Attach(a4)
		lb, err2 := nw.Attach(b4)
		if err = errors.Join(err1, err2); err == nil {
			if da, err = roce.Open(roce.Options{Link: la, Name: "softroce0"}); err == nil {
				db, err = roce.Open(roce.Options{Link: lb, Name: "softroce1"})
			}
		}
	} else {
		if *portable {
			kind = "UDP (portable sockets)"
		}
		if da, err = roce.OpenUDP(roce.UDPOptions{Addrs: []netip.Addr{a4}, Port: uint16(*port), Name: "softroce0", Portable: *portable}); err == nil {
			db, err = roce.OpenUDP(roce.UDPOptions{Addrs: []netip.Addr{b4}, Port: uint16(*port), Name: "softroce1", Portable: *portable})
		}
	}
	if da != nil {
		defer da.Close()
	}
	if db != nil {
		defer db.Close()
	}
	if err != nil {
		fmt.Fprintf(stderr, "demo: open devices: %v\n", err)
		return 1
	}
	bufSize := 16 << 20
	a, err := newDemoEnd(da, bufSize)
	if err == nil {
		var b *demoEnd
		if b, err = newDemoEnd(db, bufSize); err == nil {
			err = demoConnect(a, b, mtu)
			if err == nil {
				fmt.Fprintf(stdout, "softroce demo: %s link, %v <-> %v, RC QPN %#x <-> %#x, path MTU %d\n",
					kind, a.addr, b.addr, a.qp.Num(), b.qp.Num(), mtu.Bytes())
				return demoRun(stdout, stderr, a, b, *total)
			}
		}
	}
	fmt.Fprintf(stderr, "demo: setup: %v\n", err)
	return 1
}

func newDemoEnd(d *roce.Device, size int) (*demoEnd, error) {
	e := &demoEnd{dev: d, addr: d.Addrs()[0], buf: make([]byte, size)}
	var err error
	if e.pd, err = d.AllocPD(); err != nil {
		return nil, err
	}
	if e.scq, err = d.CreateCQ(1024); err != nil {
		return nil, err
	}
	if e.rcq, err = d.CreateCQ(1024); err != nil {
		return nil, err
	}
	acc := mr.AccessLocalWrite | mr.AccessRemoteWrite | mr.AccessRemoteRead | mr.AccessRemoteAtomic
	if e.mr, err = d.RegMR(e.pd, e.buf, 0x1000_0000, acc); err != nil {
		return nil, err
	}
	e.qp, err = d.CreateQP(roce.QPInit{Type: qp.TypeRC, PD: e.pd, SendCQ: e.scq, RecvCQ: e.rcq,
		Cap: qp.Cap{MaxSendWR: 256, MaxRecvWR: 256, MaxSendSGE: 4, MaxRecvSGE: 4, MaxInlineData: 64}})
	return e, err
}

func demoConnect(a, b *demoEnd, mtu qp.MTU) error {
	acc := mr.AccessLocalWrite | mr.AccessRemoteWrite | mr.AccessRemoteRead | mr.AccessRemoteAtomic
	up := func(e, peer *demoEnd, rq, sq uint32) error {
		steps := []struct {
			a qp.Attr
			m qp.AttrMask
		}{
			{qp.Attr{State: qp.StateInit, Port: 1, AccessFlags: acc}, qp.AttrState | qp.AttrPKeyIndex | qp.AttrPort | qp.AttrAccessFlags},
			{qp.Attr{State: qp.StateRTR, AH: qp.AHAttr{DGID: peer.addr, SGIDIndex: uint8(e.dev.GIDIndex(e.addr)), Port: 1, HopLimit: 64}, PathMTU: mtu,
				DestQPN: peer.qp.Num(), RQPSN: rq, MaxDestRDAtomic: 16, MinRNRTimer: 12},
				qp.AttrState | qp.AttrAV | qp.AttrPathMTU | qp.AttrDestQPN | qp.AttrRQPSN | qp.AttrMaxDestRDAtomic | qp.AttrMinRNRTimer},
			{qp.Attr{State: qp.StateRTS, SQPSN: sq, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRDAtomic: 16},
				qp.AttrState | qp.AttrSQPSN | qp.AttrTimeout | qp.AttrRetryCnt | qp.AttrRNRRetry | qp.AttrMaxQPRDAtomic},
		}
		for _, s := range steps {
			if err := e.qp.Modify(&s.a, s.m); err != nil {
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

func (e *demoEnd) sge(off, n int) qp.SGE {
	return qp.SGE{Addr: e.mr.IOVA() + uint64(off), Length: uint32(n), LKey: e.mr.LKey()}
}

func (e *demoEnd) va(off int) uint64 { return e.mr.IOVA() + uint64(off) }

// wait polls c until n completions arrive (10 s bound) and checks them.
func demoWait(c *cq.CQ, n int) ([]cq.WC, error) {
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

func fillPattern(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i*31) ^ seed ^ byte(i>>11)
	}
}

func demoRun(stdout, stderr io.Writer, a, b *demoEnd, total int) int {
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
	post := func(e *demoEnd, wr qp.SendWR) error {
		_, err := e.qp.PostSend([]qp.SendWR{wr})
		return err
	}
	// SEND
	check("SEND", func() error {
		fillPattern(a.buf[:size], 1)
		if _, err := b.qp.PostRecv([]qp.RecvWR{{WRID: 1, SGL: []qp.SGE{b.sge(dst, size)}}}); err != nil {
			return err
		}
		if err := post(a, qp.SendWR{WRID: 1, Opcode: qp.WRSend, SGL: []qp.SGE{a.sge(0, size)}, Flags: qp.SendSignaled}); err != nil {
			return err
		}
		if _, err := demoWait(a.scq, 1); err != nil {
			return err
		}
		wc, err := demoWait(b.rcq, 1)
		if err != nil {
			return err
		}
		if wc[0].Opcode != cq.OpRecv || wc[0].ByteLen != size {
			return fmt.Errorf("receive completion %v len %d", wc[0].Opcode, wc[0].ByteLen)
		}
		if !bytes.Equal(b.buf[dst:dst+size], a.buf[:size]) {
			return errors.New("data differs")
		}
		return nil
	}())
	// WRITE
	check("RDMA_WRITE", func() error {
		fillPattern(a.buf[:size], 2)
		if err := post(a, qp.SendWR{WRID: 2, Opcode: qp.WRRDMAWrite, SGL: []qp.SGE{a.sge(0, size)}, Flags: qp.SendSignaled,
			RemoteAddr: b.va(dst), RKey: b.mr.RKey()}); err != nil {
			return err
		}
		if _, err := demoWait(a.scq, 1); err != nil {
			return err
		}
		if !bytes.Equal(b.buf[dst:dst+size], a.buf[:size]) {
			return errors.New("data differs")
		}
		return nil
	}())
	// WRITE_WITH_IMM
	check("RDMA_WRITE_IMM", func() error {
		fillPattern(a.buf[:size], 3)
		if _, err := b.qp.PostRecv([]qp.RecvWR{{WRID: 3}}); err != nil {
			return err
		}
		if err := post(a, qp.SendWR{WRID: 3, Opcode: qp.WRRDMAWriteWithImm, SGL: []qp.SGE{a.sge(0, size)}, Flags: qp.SendSignaled,
			Imm: 0xC0FFEE, RemoteAddr: b.va(dst), RKey: b.mr.RKey()}); err != nil {
			return err
		}
		if _, err := demoWait(a.scq, 1); err != nil {
			return err
		}
		wc, err := demoWait(b.rcq, 1)
		if err != nil {
			return err
		}
		if wc[0].Opcode != cq.OpRecvRDMAWithImm || wc[0].ImmData != 0xC0FFEE || wc[0].Flags&cq.FlagWithImm == 0 || wc[0].ByteLen != size {
			return fmt.Errorf("receive completion %+v", wc[0])
		}
		if !bytes.Equal(b.buf[dst:dst+size], a.buf[:size]) {
			return errors.New("data differs")
		}
		return nil
	}())
	// READ
	check("RDMA_READ", func() error {
		fillPattern(b.buf[dst:dst+size], 4)
		clear(a.buf[:size])
		if err := post(a, qp.SendWR{WRID: 4, Opcode: qp.WRRDMARead, SGL: []qp.SGE{a.sge(0, size)}, Flags: qp.SendSignaled,
			RemoteAddr: b.va(dst), RKey: b.mr.RKey()}); err != nil {
			return err
		}
		if _, err := demoWait(a.scq, 1); err != nil {
			return err
		}
		if !bytes.Equal(a.buf[:size], b.buf[dst:dst+size]) {
			return errors.New("data differs")
		}
		return nil
	}())
	// atomics
	const word = 8 << 20
	check("ATOMIC_CMP_SWP", func() error {
		binary.LittleEndian.PutUint64(b.buf[word:], 0x1111)
		if err := post(a, qp.SendWR{WRID: 5, Opcode: qp.WRAtomicCmpAndSwp, SGL: []qp.SGE{a.sge(0, 8)}, Flags: qp.SendSignaled,
			RemoteAddr: b.va(word), RKey: b.mr.RKey(), CompareAdd: 0x1111, Swap: 0x2222}); err != nil {
			return err
		}
		if _, err := demoWait(a.scq, 1); err != nil {
			return err
		}
		if o, n := binary.LittleEndian.Uint64(a.buf), binary.LittleEndian.Uint64(b.buf[word:]); o != 0x1111 || n != 0x2222 {
			return fmt.Errorf("returned %#x, remote now %#x", o, n)
		}
		return nil
	}())
	check("ATOMIC_FETCH_ADD", func() error {
		if err := post(a, qp.SendWR{WRID: 6, Opcode: qp.WRAtomicFetchAndAdd, SGL: []qp.SGE{a.sge(8, 8)}, Flags: qp.SendSignaled,
			RemoteAddr: b.va(word), RKey: b.mr.RKey(), CompareAdd: 5}); err != nil {
			return err
		}
		if _, err := demoWait(a.scq, 1); err != nil {
			return err
		}
		if o, n := binary.LittleEndian.Uint64(a.buf[8:]), binary.LittleEndian.Uint64(b.buf[word:]); o != 0x2222 || n != 0x2227 {
			return fmt.Errorf("returned %#x, remote now %#x", o, n)
		}
		return nil
	}())
	// throughput: a stream of 1 MiB WRITEs, 8 in flight, every one signaled
	var gbps float64
	check(fmt.Sprintf("WRITE %d MiB", total>>20), func() error {
		const chunk = 1 << 20
		const inflight = 8
		fillPattern(a.buf[:inflight*chunk], 5)
		n := (total + chunk - 1) / chunk
		start := time.Now()
		posted, done := 0, 0
		for done < n {
			for posted < n && posted-done < inflight {
				off := (posted % inflight) * chunk
				ln := min(chunk, total-posted*chunk)
				if err := post(a, qp.SendWR{WRID: uint64(100 + posted), Opcode: qp.WRRDMAWrite, SGL: []qp.SGE{a.sge(off, ln)},
					Flags: qp.SendSignaled, RemoteAddr: b.va(dst + off), RKey: b.mr.RKey()}); err != nil {
					return err
				}
				posted++
			}
			if _, err := demoWait(a.scq, 1); err != nil {
				return err
			}
			done++
		}
		el := time.Since(start)
		gbps = float64(total) * 8 / el.Seconds() / 1e9
		if !bytes.Equal(b.buf[dst:dst+inflight*chunk], a.buf[:inflight*chunk]) {
			return errors.New("data differs")
		}
		fmt.Fprintf(stdout, "  %-16s %.2f Gbit/s (%d bytes in %v)\n", "throughput", gbps, total, el.Round(time.Millisecond))
		return nil
	}())
	sa, sb := a.dev.Stats(), b.dev.Stats()
	fmt.Fprintf(stdout, "counters %s: sent_pkts %d rcvd_pkts %d retries %d; %s: sent_pkts %d rcvd_pkts %d duplicate_request %d out_of_seq_request %d\n",
		a.dev.Name(), sa.SentPkts, sa.RcvdPkts, sa.CompleterRetryErr, b.dev.Name(), sb.SentPkts, sb.RcvdPkts, sb.DuplicateRequest, sb.OutOfSeqRequest)
	if failed > 0 {
		fmt.Fprintf(stdout, "FAIL: %d of 7 checks failed\n", failed)
		return 1
	}
	fmt.Fprintln(stdout, "PASS: all 7 checks passed")
	return 0
}
