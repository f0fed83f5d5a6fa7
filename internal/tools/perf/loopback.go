package perf

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sort"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/internal/tools/demo"
	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/roce"
)

// softroce perf --loopback: both ends in this process (two devices on 127.0.0.1 and
// 127.0.0.2, or on the in-memory link with --mem), no out-of-band exchange. It measures the
// engine alone; the perftest-compatible two-process mode is in run.go.

// perfLoopback runs c.Verb (write, read or send) between two devices in this process with
// c.TxDepth messages in flight and prints bandwidth and completion latency.
func perfLoopback(c *perfConfig, stdout io.Writer) error {
	if c.Verb == "atomic" || c.Lat {
		return fmt.Errorf("%w: --loopback measures write, read or send bandwidth only", errPerfUsage)
	}
	size, iters, depth := c.Size, c.Iters, c.TxDepth
	mtu := c.MTU
	if mtu == 0 {
		mtu = qp.MTU4096
	}
	a4, b4 := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	var da, db *roce.Device
	var err error
	if c.Mem {
		nw := mem.NewNetwork(mem.Options{QueueDepth: 8192})
		la, e1 := nw.Attach(a4)
		lb, e2 := nw.Attach(b4)
		if err = errors.Join(e1, e2); err == nil {
			if da, err = roce.Open(roce.Options{Link: la}); err == nil {
				db, err = roce.Open(roce.Options{Link: lb})
			}
		}
	} else if da, err = roce.OpenUDP(roce.UDPOptions{Addrs: []netip.Addr{a4}, Port: c.RocePort, Portable: c.Portable}); err == nil {
		db, err = roce.OpenUDP(roce.UDPOptions{Addrs: []netip.Addr{b4}, Port: c.RocePort, Portable: c.Portable})
	}
	if da != nil {
		defer da.Close()
	}
	if db != nil {
		defer db.Close()
	}
	if err != nil {
		return err
	}
	span := size * depth
	a, err := demo.NewEnd(da, span)
	var b *demo.End
	if err == nil {
		if b, err = demo.NewEnd(db, span); err == nil {
			err = demo.Connect(a, b, mtu)
		}
	}
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	lat := make([]time.Duration, 0, iters)
	sent := make([]time.Time, depth)
	sge := make([]qp.SGE, 1)
	wr := make([]qp.SendWR, 1)
	wrFor := func(i int) []qp.SendWR {
		off := (i % depth) * size
		sge[0] = a.SGE(off, size)
		wr[0] = qp.SendWR{WRID: uint64(i), SGL: sge, Flags: qp.SendSignaled, RemoteAddr: b.VA(off), RKey: b.MR.RKey()}
		switch c.Verb {
		case "write":
			wr[0].Opcode = qp.WRRDMAWrite
		case "read":
			wr[0].Opcode = qp.WRRDMARead
		default:
			wr[0].Opcode = qp.WRSend
		}
		return wr
	}
	rsge := make([]qp.SGE, 1)
	rwr := make([]qp.RecvWR, 1)
	postRecv := func(i int) error {
		rsge[0] = b.SGE((i%depth)*size, size)
		rwr[0] = qp.RecvWR{WRID: uint64(i), SGL: rsge}
		_, err := b.QP.PostRecv(rwr)
		return err
	}
	if c.Verb == "send" { // one receive per message, reposted as they complete
		for i := 0; i < min(depth, iters); i++ {
			if err := postRecv(i); err != nil {
				return err
			}
		}
	}
	wcs := make([]cq.WC, 32)
	rwcs := make([]cq.WC, 32)
	posted, done, recvPosted := 0, 0, min(depth, iters)
	start := time.Now()
	deadline := start.Add(c.RunTimeout)
	for done < iters {
		for posted < iters && posted-done < depth {
			sent[posted%depth] = time.Now()
			if _, err := a.QP.PostSend(wrFor(posted)); err != nil {
				return fmt.Errorf("post: %w", err)
			}
			posted++
		}
		k := a.SCQ.Poll(wcs)
		now := time.Now()
		for i := 0; i < k; i++ {
			if wcs[i].Status != cq.StatusSuccess {
				return fmt.Errorf("completion %d: %v", wcs[i].WRID, wcs[i].Status)
			}
			lat = append(lat, now.Sub(sent[int(wcs[i].WRID)%depth]))
		}
		done += k
		if c.Verb == "send" {
			r := b.RCQ.Poll(rwcs)
			for i := 0; i < r && recvPosted < iters; i++ {
				if err := postRecv(recvPosted); err != nil {
					return err
				}
				recvPosted++
			}
		}
		if k == 0 {
			if now.After(deadline) {
				return fmt.Errorf("timed out after %d of %d messages", done, iters)
			}
			// sleep until a completion instead of spinning (2 cores)
			_ = a.SCQ.ReqNotify(false)
			_ = b.RCQ.ReqNotify(false)
			if a.SCQ.Len() == 0 && (c.Verb != "send" || b.RCQ.Len() == 0) {
				select {
				case <-a.SCQ.Channel():
				case <-b.RCQ.Channel():
				case <-time.After(100 * time.Millisecond):
				}
			}
		}
	}
	el := time.Since(start)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(p float64) time.Duration { return lat[int(p*float64(len(lat)-1))] }
	kind := "UDP"
	switch {
	case c.Mem:
		kind = "in-memory"
	case c.Portable:
		kind = "UDP (portable sockets)"
	}
	bytes := float64(size) * float64(iters)
	fmt.Fprintf(stdout, "softroce perf --loopback: RC %s, %s link, size %d, MTU %d, depth %d, %d messages\n", c.Verb, kind, size, mtu.Bytes(), depth, iters)
	fmt.Fprintf(stdout, "  bandwidth  %.2f Gbit/s  %.0f msg/s\n", bytes*8/el.Seconds()/1e9, float64(iters)/el.Seconds())
	fmt.Fprintf(stdout, "  completion latency  p50 %v  p99 %v  max %v\n", pct(0.5).Round(time.Microsecond/10),
		pct(0.99).Round(time.Microsecond/10), lat[len(lat)-1].Round(time.Microsecond/10))
	s := da.Stats()
	fmt.Fprintf(stdout, "  counters: sent_pkts %d rcvd_pkts %d completer_retry_err %d rcvd_seq_err %d\n",
		s.SentPkts, s.RcvdPkts, s.CompleterRetryErr, s.RcvdSeqErr)
	return nil
}
