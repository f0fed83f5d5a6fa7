package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"sort"
	"time"

	"github.com/softroce/softroce/pkg/cq"
	"github.com/softroce/softroce/pkg/qp"
	"github.com/softroce/softroce/pkg/roce"
	"github.com/softroce/softroce/pkg/roce/link"
)

func init() {
	register(&command{
		name:    "perf",
		summary: "in-process bandwidth and latency: RC WRITE, READ or SEND between two devices",
		run:     runPerf,
	})
}

// runPerf measures one operation between two devices in this process (an
// ib_write_bw / ib_write_lat analogue without the out-of-band exchange).
func runPerf(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("perf", flag.ContinueOnError)
	fs.SetOutput(stderr)
	mem := fs.Bool("mem", false, "in-memory link instead of UDP on 127.0.0.1/127.0.0.2")
	portable := fs.Bool("portable", false, "UDP with plain sockets instead of sendmmsg/recvmmsg")
	port := fs.Uint("port", 4791, "UDP port")
	op := fs.String("op", "write", "operation: write, read or send")
	size := fs.Int("size", 65536, "message size in bytes")
	iters := fs.Int("iters", 2000, "messages (>= 5)")
	depth := fs.Int("depth", 16, "messages in flight (bandwidth); 1 for latency")
	mtuFlag := fs.Int("mtu", 4096, "path MTU")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	mtu := qp.MTUFromBytes(*mtuFlag)
	if !mtu.Valid() || mtu.Bytes() != *mtuFlag || *size < 1 || *size > 8<<20 || *iters < 5 || *depth < 1 || *depth > 128 ||
		*port == 0 || *port > 65535 || (*op != "write" && *op != "read" && *op != "send") {
		fmt.Fprintln(stderr, "perf: bad flags")
		return 2
	}
	a4, b4 := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	var da, db *roce.Device
	var err error
	if *mem {
		nw := link.NewMemNetwork(link.MemOptions{QueueDepth: 8192})
		la, e1 := nw.Attach(a4)
		lb, e2 := nw.Attach(b4)
		if err = errors.Join(e1, e2); err == nil {
			if da, err = roce.Open(roce.Options{Link: la}); err == nil {
				db, err = roce.Open(roce.Options{Link: lb})
			}
		}
	} else if da, err = roce.OpenUDP(roce.UDPOptions{Addrs: []netip.Addr{a4}, Port: uint16(*port), Portable: *portable}); err == nil {
		db, err = roce.OpenUDP(roce.UDPOptions{Addrs: []netip.Addr{b4}, Port: uint16(*port), Portable: *portable})
	}
	if da != nil {
		defer da.Close()
	}
	if db != nil {
		defer db.Close()
	}
	if err != nil {
		fmt.Fprintf(stderr, "perf: %v\n", err)
		return 1
	}
	span := *size * *depth
	a, err := newDemoEnd(da, span)
	var b *demoEnd
	if err == nil {
		if b, err = newDemoEnd(db, span); err == nil {
			err = demoConnect(a, b, mtu)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "perf: setup: %v\n", err)
		return 1
	}
	lat := make([]time.Duration, 0, *iters)
	sent := make([]time.Time, *depth)
	wrFor := func(i int) qp.SendWR {
		slot := i % *depth
		off := slot * *size
		wr := qp.SendWR{WRID: uint64(i), SGL: []qp.SGE{a.sge(off, *size)}, Flags: qp.SendSignaled,
			RemoteAddr: b.va(off), RKey: b.mr.RKey()}
		switch *op {
		case "write":
			wr.Opcode = qp.WRRDMAWrite
		case "read":
			wr.Opcode = qp.WRRDMARead
		default:
			wr.Opcode = qp.WRSend
		}
		return wr
	}
	if *op == "send" { // one receive per message, reposted as they complete
		for i := 0; i < min(*depth, *iters); i++ {
			if _, err := b.qp.PostRecv([]qp.RecvWR{{WRID: uint64(i), SGL: []qp.SGE{b.sge((i%*depth)**size, *size)}}}); err != nil {
				fmt.Fprintf(stderr, "perf: %v\n", err)
				return 1
			}
		}
	}
	wcs := make([]cq.WC, 32)
	rwcs := make([]cq.WC, 32)
	posted, done, recvPosted := 0, 0, min(*depth, *iters)
	start := time.Now()
	deadline := start.Add(60 * time.Second)
	for done < *iters {
		for posted < *iters && posted-done < *depth {
			sent[posted%*depth] = time.Now()
			if _, err := a.qp.PostSend([]qp.SendWR{wrFor(posted)}); err != nil {
				fmt.Fprintf(stderr, "perf: post: %v\n", err)
				return 1
			}
			posted++
		}
		k := a.scq.Poll(wcs)
		now := time.Now()
		for i := 0; i < k; i++ {
			if wcs[i].Status != cq.StatusSuccess {
				fmt.Fprintf(stderr, "perf: completion %d: %v\n", wcs[i].WRID, wcs[i].Status)
				return 1
			}
			lat = append(lat, now.Sub(sent[int(wcs[i].WRID)%*depth]))
		}
		done += k
		if *op == "send" {
			r := b.rcq.Poll(rwcs)
			for i := 0; i < r && recvPosted < *iters; i++ {
				if _, err := b.qp.PostRecv([]qp.RecvWR{{WRID: uint64(recvPosted), SGL: []qp.SGE{b.sge((recvPosted%*depth)**size, *size)}}}); err != nil {
					fmt.Fprintf(stderr, "perf: %v\n", err)
					return 1
				}
				recvPosted++
			}
		}
		if k == 0 {
			if now.After(deadline) {
				fmt.Fprintf(stderr, "perf: timed out after %d of %d messages\n", done, *iters)
				return 1
			}
			// sleep until a completion instead of spinning (2 cores)
			_ = a.scq.ReqNotify(false)
			_ = b.rcq.ReqNotify(false)
			if a.scq.Len() == 0 && (*op != "send" || b.rcq.Len() == 0) {
				select {
				case <-a.scq.Channel():
				case <-b.rcq.Channel():
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
	case *mem:
		kind = "in-memory"
	case *portable:
		kind = "UDP (portable sockets)"
	}
	bytes := float64(*size) * float64(*iters)
	fmt.Fprintf(stdout, "softroce perf: RC %s, %s link, size %d, MTU %d, depth %d, %d messages\n", *op, kind, *size, mtu.Bytes(), *depth, *iters)
	fmt.Fprintf(stdout, "  bandwidth  %.2f Gbit/s  %.0f msg/s\n", bytes*8/el.Seconds()/1e9, float64(*iters)/el.Seconds())
	fmt.Fprintf(stdout, "  completion latency  p50 %v  p99 %v  max %v\n", pct(0.5).Round(time.Microsecond/10),
		pct(0.99).Round(time.Microsecond/10), lat[len(lat)-1].Round(time.Microsecond/10))
	s := da.Stats()
	fmt.Fprintf(stdout, "  counters: sent_pkts %d rcvd_pkts %d completer_retry_err %d rcvd_seq_err %d\n",
		s.SentPkts, s.RcvdPkts, s.CompleterRetryErr, s.RcvdSeqErr)
	return 0
}
