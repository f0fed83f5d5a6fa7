// Command scale measures softroce with many connected RC QPs in one process: two UDP devices
// (127.0.0.1 and 127.0.0.2, loopback only) with N RC QPs each, connected pairwise. It prints the
// heap held per idle connected QP (runtime.MemStats after GC, before any work request) and the
// aggregate throughput of 64 KiB RDMA WRITEs spread round-robin over all N QPs with a bounded
// number in flight.
package main

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/roce"
)

func main() {
	n := flag.Int("qps", 1024, "connected RC QPs per device")
	port := flag.Int("port", 34792, "RoCE UDP port")
	dur := flag.Duration("t", 2*time.Second, "throughput measurement time")
	size := flag.Int("s", 65536, "message size")
	inflight := flag.Int("inflight", 64, "WRITEs in flight in total")
	mtu := flag.Int("m", 4096, "path MTU")
	flag.Parse()
	if err := run(*n, uint16(*port), *dur, *size, *inflight, qp.MTUFromBytes(*mtu)); err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(1)
	}
}

func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

type side struct {
	dev *roce.Device
	pd  *mr.PD
	cq  *cq.CQ
	mr  *mr.MR
	buf []byte
	qps []*roce.QP
}

func open(addr string, port uint16, n, bufSize int) (*side, error) {
	attr := qp.DefaultDeviceAttr()
	if attr.MaxQP < n+16 {
		attr.MaxQP = n + 16
	}
	d, err := roce.OpenUDP(roce.UDPOptions{Addrs: []netip.Addr{netip.MustParseAddr(addr)}, Port: port, Attr: &attr})
	if err != nil {
		return nil, err
	}
	s := &side{dev: d, buf: make([]byte, bufSize)}
	if s.pd, err = d.AllocPD(); err != nil {
		return nil, err
	}
	if s.cq, err = d.CreateCQ(attr.MaxCQE); err != nil {
		return nil, err
	}
	acc := mr.AccessLocalWrite | mr.AccessRemoteWrite | mr.AccessRemoteRead
	if s.mr, err = d.RegMR(s.pd, s.buf, 0x1000_0000, acc); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *side) create(n int) error {
	caps := qp.Cap{MaxSendWR: 128, MaxRecvWR: 512, MaxSendSGE: 1, MaxRecvSGE: 1}
	s.qps = make([]*roce.QP, n)
	for i := range s.qps {
		q, err := s.dev.CreateQP(roce.QPInit{Type: qp.TypeRC, PD: s.pd, SendCQ: s.cq, RecvCQ: s.cq, Cap: caps})
		if err != nil {
			return fmt.Errorf("QP %d: %w", i, err)
		}
		s.qps[i] = q
	}
	return nil
}

func up(q *roce.QP, s *side, peer *roce.QP, peerAddr netip.Addr, mtu qp.MTU) error {
	acc := mr.AccessLocalWrite | mr.AccessRemoteWrite | mr.AccessRemoteRead
	steps := []struct {
		a qp.Attr
		m qp.AttrMask
	}{
		{qp.Attr{State: qp.StateInit, Port: 1, AccessFlags: acc}, qp.AttrState | qp.AttrPKeyIndex | qp.AttrPort | qp.AttrAccessFlags},
		{qp.Attr{State: qp.StateRTR, AH: qp.AHAttr{DGID: peerAddr, SGIDIndex: 1, Port: 1, HopLimit: 64}, PathMTU: mtu,
			DestQPN: peer.Num(), RQPSN: 1, MaxDestRDAtomic: 16, MinRNRTimer: 12},
			qp.AttrState | qp.AttrAV | qp.AttrPathMTU | qp.AttrDestQPN | qp.AttrRQPSN | qp.AttrMaxDestRDAtomic | qp.AttrMinRNRTimer},
		{qp.Attr{State: qp.StateRTS, SQPSN: 1, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRDAtomic: 16},
			qp.AttrState | qp.AttrSQPSN | qp.AttrTimeout | qp.AttrRetryCnt | qp.AttrRNRRetry | qp.AttrMaxQPRDAtomic},
	}
	for _, st := range steps {
		if err := q.Modify(&st.a, st.m); err != nil {
			return err
		}
	}
	return nil
}

func run(n int, port uint16, dur time.Duration, size, inflight int, mtu qp.MTU) error {
	if inflight > 128*n {
		inflight = 128 * n
	}
	bufSize := size * inflight
	a, err := open("127.0.0.1", port, n, bufSize)
	if err != nil {
		return err
	}
	defer a.dev.Close()
	b, err := open("127.0.0.2", port, n, bufSize)
	if err != nil {
		return err
	}
	defer b.dev.Close()
	before := heap()
	t0 := time.Now()
	if err := a.create(n); err != nil {
		return err
	}
	if err := b.create(n); err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		if err := up(a.qps[i], a, b.qps[i], b.dev.Addrs()[0], mtu); err != nil {
			return err
		}
		if err := up(b.qps[i], b, a.qps[i], a.dev.Addrs()[0], mtu); err != nil {
			return err
		}
	}
	setup := time.Since(t0)
	after := heap()
	connected := 0
	for i := 0; i < n; i++ {
		if a.qps[i].State() == qp.StateRTS && b.qps[i].State() == qp.StateRTS {
			connected++
		}
	}
	perQP := float64(after-before) / float64(2*n)

	// throughput: inflight WRITEs round-robin over the QPs
	sge := []qp.SGE{{}}
	wr := []qp.SendWR{{Opcode: qp.WRRDMAWrite, SGL: sge, Flags: qp.SendSignaled, RKey: b.mr.RKey()}}
	next := 0
	post := func(slot int) error {
		sge[0] = qp.SGE{Addr: a.mr.IOVA() + uint64(slot*size), Length: uint32(size), LKey: a.mr.LKey()}
		wr[0].WRID = uint64(slot)
		wr[0].RemoteAddr = b.mr.IOVA() + uint64(slot*size)
		q := a.qps[next%n]
		next++
		_, err := q.PostSend(wr)
		return err
	}
	for i := 0; i < inflight; i++ {
		if err := post(i); err != nil {
			return err
		}
	}
	wcs := make([]cq.WC, 64)
	done := 0
	start := time.Now()
	deadline := start.Add(dur)
	last := start
	idle := time.NewTimer(time.Hour)
	for time.Now().Before(deadline) {
		k := a.cq.Poll(wcs)
		if k == 0 {
			// sleep on the CQ (a spinning poller starves the receive goroutines on 2 cores)
			if err := a.cq.ReqNotify(false); err != nil {
				return err
			}
			if k = a.cq.Poll(wcs); k == 0 {
				idle.Reset(time.Second)
				select {
				case <-a.cq.Channel():
				case <-idle.C:
				}
				idle.Stop()
				if time.Since(last) > 5*time.Second {
					return fmt.Errorf("no completion for 5 s (%d done)", done)
				}
				continue
			}
		}
		last = time.Now()
		for _, wc := range wcs[:k] {
			if wc.Status != cq.StatusSuccess {
				return fmt.Errorf("completion %+v", wc)
			}
			done++
			if err := post(int(wc.WRID)); err != nil {
				return err
			}
		}
	}
	el := time.Since(start)
	gbps := float64(done) * float64(size) * 8 / el.Seconds() / 1e9
	fmt.Printf("%d connected RC QP pairs (%d QPs, setup %v): idle %.0f B/QP heap; %d x %d B WRITEs in flight over all QPs: %.2f Gbit/s aggregate\n",
		connected, 2*n, setup.Round(time.Millisecond), perQP, inflight, size, gbps)
	return nil
}
