//go:build interop

package interop

// The lossy-wire pingpong with softroce's engine used directly (pkg/roce, OpenUDP in the lab
// netns) instead of the CLI, so softroce's own counters (Device.Stats: retransmitted_pkts,
// completer_retry_err, rcvd_seq_err, duplicate_request, out_of_seq_request, ...) can be read
// after the run, next to rxe's. Same wire as netem_test.go: netem on the guest's eth0 and, if
// the host has nft, 5% of softroce's datagrams dropped in the lab netns. rc_pingpong echoes:
// each message rxe sends is the last one it received from us (rawPingpong, rc_send_test.go),
// so every byte is checked.

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/internal/rocetest"
	"github.com/softroce/softroce/pkg/roce"
	"github.com/softroce/softroce/test/rxelab"
)

func init() {
	for _, client := range []bool{true, false} {
		client := client
		dir := RxeToSoftroce
		if client {
			dir = SoftroceToRxe
		}
		pairings = append(pairings, pairing{Name: "netem-engine-rc-3000x500", Direction: dir,
			Run: func(t *testing.T, lab *rxelab.Lab) {
				nmEngine(t, lab, rawOptions{Size: 3000, Iters: 500, Client: client})
			}})
	}
}

func nmEngine(t *testing.T, lab *rxelab.Lab, o rawOptions) {
	ingress := netemOn(t, lab)
	hostDrops := hostLossOn(t, lab)
	before := rxeCounters(t, lab)
	stopCapture := ppStartCapture(t, lab)
	deadline := time.Now().Add(90 * time.Second)

	var dev *roce.Device
	if err := lab.InNetns(func() error {
		var err error
		dev, err = roce.OpenUDP(roce.UDPOptions{Addrs: []netip.Addr{hostIP}, MTU: qp.MTU1024, Name: "softroce0"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	const slots = 16
	size := o.Size
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	scq, err := dev.CreateCQ(64)
	if err != nil {
		t.Fatal(err)
	}
	rcq, err := dev.CreateCQ(64)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2*slots*4096)
	m, err := dev.RegMR(pd, buf, 0x1000000, mr.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	q, err := dev.CreateQP(roce.QPInit{Type: qp.TypeRC, PD: pd, SendCQ: scq, RecvCQ: rcq,
		Cap: qp.Cap{MaxSendWR: slots, MaxRecvWR: slots, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Modify(&qp.Attr{State: qp.StateInit, Port: 1}, qp.AttrState|qp.AttrPKeyIndex|qp.AttrPort|qp.AttrAccessFlags); err != nil {
		t.Fatal(err) // INIT first: receives may be posted from INIT on
	}
	sge := func(off, n int) []qp.SGE {
		return []qp.SGE{{Addr: m.IOVA() + uint64(off), Length: uint32(n), LKey: m.LKey()}}
	}
	recvOff := func(slot int) int { return (slots + slot) * 4096 }
	for i := 0; i < slots; i++ {
		if _, err := q.PostRecv([]qp.RecvWR{{WRID: uint64(i), SGL: sge(recvOff(i), 4096)}}); err != nil {
			t.Fatal(err)
		}
	}
	mine := rocetest.PingpongDest{QPN: q.Num(), PSN: 0xFFFF00, GID: gidOf(hostIP)}
	up := func(theirs rocetest.PingpongDest) error {
		for _, s := range []struct {
			a qp.Attr
			m qp.AttrMask
		}{
			{qp.Attr{State: qp.StateRTR, AH: qp.AHAttr{DGID: theirs.GID, SGIDIndex: uint8(dev.GIDIndex(hostIP)), Port: 1, HopLimit: 1},
				PathMTU: qp.MTU1024, DestQPN: theirs.QPN, RQPSN: uint32(theirs.PSN), MaxDestRDAtomic: 1, MinRNRTimer: 12},
				qp.AttrState | qp.AttrAV | qp.AttrPathMTU | qp.AttrDestQPN | qp.AttrRQPSN | qp.AttrMaxDestRDAtomic | qp.AttrMinRNRTimer},
			// rc_pingpong's values: timeout 14, retry_cnt 7, rnr_retry 7
			{qp.Attr{State: qp.StateRTS, SQPSN: uint32(mine.PSN), Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRDAtomic: 1},
				qp.AttrState | qp.AttrSQPSN | qp.AttrTimeout | qp.AttrRetryCnt | qp.AttrRNRRetry | qp.AttrMaxQPRDAtomic},
		} {
			if err := q.Modify(&s.a, s.m); err != nil {
				return err
			}
		}
		return nil
	}
	args := fmt.Sprintf("-d %s -g %d -m %d -s %d -n %d", rxelab.GuestDev, rxelab.GuestGIDIndex, pathMTU, o.Size, o.Iters)
	var theirs rocetest.PingpongDest
	var job *guestJob
	start := time.Now()
	if o.Client {
		job = startGuest(t, lab, args)
		conn := dialInNetns(t, lab, net.JoinHostPort(rxelab.GuestIP, strconv.Itoa(rocetest.PingpongPort)), deadline)
		_ = conn.SetDeadline(deadline)
		theirs, err = rocetest.PingpongClientExchange(conn, mine)
		conn.Close()
		if err == nil {
			err = up(theirs)
		}
		if err != nil {
			t.Fatal(err)
		}
	} else {
		var ln net.Listener
		if err := lab.InNetns(func() error {
			var err error
			ln, err = net.Listen("tcp4", net.JoinHostPort(rxelab.HostIP, strconv.Itoa(rocetest.PingpongPort)))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		job = startGuest(t, lab, args+" "+rxelab.HostIP)
		_ = ln.(*net.TCPListener).SetDeadline(deadline)
		conn, err := ln.Accept()
		ln.Close()
		if err != nil {
			t.Fatalf("accept: %v", err)
		}
		_ = conn.SetDeadline(deadline)
		_, err = rocetest.PingpongServerExchange(conn, mine, up)
		conn.Close()
		if err != nil {
			t.Fatal(err)
		}
	}

	// pingpong.c: the client sends message k once its message k-1 completed and it has
	// received k messages; the server sends message k after receiving message k.
	lead := 1
	if o.Client {
		lead = 0
	}
	sent, recvd, sendBusy := 0, 0, false
	lastRace := false // our last SEND's ACK lost after the peer finished (accepted below)
	flushed := false  // receives flushed after every message arrived (the race's ERR)
	var last []byte   // our last message: rxe echoes it
	wcs := make([]cq.WC, 16)
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for sent < o.Iters || recvd < o.Iters || sendBusy {
		if sent < o.Iters && !sendBusy && recvd == sent+lead {
			msg := payloadFor(size, sent, o.Client)
			copy(buf[(sent%slots)*4096:], msg)
			if _, err := q.PostSend([]qp.SendWR{{WRID: uint64(sent), Opcode: qp.WRSend, SGL: sge((sent%slots)*4096, size), Flags: qp.SendSignaled}}); err != nil {
				t.Fatal(err)
			}
			last = msg
			sent++
			sendBusy = true
		}
		got := 0
		for _, wc := range wcs[:scq.Poll(wcs)] {
			got++
			if wc.Status == cq.StatusRetryExcErr && wc.WRID == uint64(o.Iters-1) && sent == o.Iters && recvd == o.Iters {
				// the last-ACK race (docs/reliability.md, lastACKRace): everything received,
				// our last SEND resent into a peer that may have exited; the guest's report
				// decides below
				lastRace, sendBusy = true, false
				continue
			}
			if wc.Status != cq.StatusSuccess || wc.WRID != uint64(sent-1) {
				t.Fatalf("send completion %+v (%v)", wc, wc.Status)
			}
			sendBusy = false
		}
		for _, wc := range wcs[:rcq.Poll(wcs)] {
			got++
			if wc.Status == cq.StatusWRFlushErr && sent == o.Iters && recvd == o.Iters {
				// the last-ACK race's RETRY_EXC_ERR moved the QP to ERR, which flushes the
				// receives posted for messages that will not come (IBTA 10.3.1, Error
				// state); the send completion saying so may be polled after this one, and
				// must come (checked after the loop)
				flushed = true
				continue
			}
			if wc.Status != cq.StatusSuccess || wc.ByteLen != uint32(size) {
				t.Fatalf("receive completion %+v (%v)", wc, wc.Status)
			}
			slot := int(wc.WRID)
			want := last
			if !o.Client && recvd == 0 {
				want = bytes.Repeat([]byte{0x7b}, size) // rc_pingpong.c fills its buffer with 0x7b
			}
			if !bytes.Equal(buf[recvOff(slot):recvOff(slot)+size], want) {
				t.Fatalf("message %d from rxe is not the expected echo", recvd)
			}
			recvd++
			if _, err := q.PostRecv([]qp.RecvWR{{WRID: uint64(slot), SGL: sge(recvOff(slot), 4096)}}); err != nil {
				t.Fatal(err)
			}
		}
		if got > 0 {
			continue
		}
		_ = scq.ReqNotify(false)
		_ = rcq.ReqNotify(false)
		select {
		case <-scq.Channel():
		case <-rcq.Channel():
		case <-time.After(10 * time.Millisecond):
		case <-timer.C:
			t.Fatalf("timeout: sent %d received %d, QP %v; counters %v", sent, recvd, q.State(), dev.Stats().Map())
		}
	}
	if flushed && !lastRace {
		t.Fatalf("receives flushed, but the last SEND completed without the retry error that moves the QP to ERR")
	}
	wall := time.Since(start)
	ours := dev.Stats().Map()
	out := waitGuest(t, job)
	checkReport(t, out, o, mine)
	if lastRace && !t.Failed() {
		t.Logf("LAST-ACK RACE: the guest completed every iteration and exited; our last SEND (wr_id %d) got no ACK (lost on the lossy wire) before its QP was gone — accepted, as in the pingpong pairings", o.Iters-1)
	}
	after := rxeCounters(t, lab)
	wire, lost := stopCapture()
	w := nmWire(t, wire)
	if lost {
		t.Logf("tcpdump dropped packets: the wire counts below are lower bounds")
	}
	var names []string
	for k, v := range ours {
		if v != 0 {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	var sb strings.Builder
	for _, k := range names {
		fmt.Fprintf(&sb, " %s=%d", k, ours[k])
	}
	host := "off"
	if hostDrops != nil {
		host = "5% (" + hostDrops() + ")"
	}
	dir := map[bool]string{true: SoftroceToRxe, false: RxeToSoftroce}[o.Client]
	t.Logf("NETEM netem-engine-rc-%dx%d %s: wall %v, guest ingress netem %v, softroce->rxe loss %s\n  rxe counters:%s\n  softroce counters:%s\n  wire softroce: requests %d (sent again %d), seq NAKs %d; wire rxe: requests %d (sent again %d), seq NAKs %d",
		o.Size, o.Iters, dir, wall.Round(time.Millisecond), ingress, host, counterDelta(before, after), sb.String(),
		w[hostIP].requests, w[hostIP].retrans, w[hostIP].seqNAKs, w[guestIP].requests, w[guestIP].retrans, w[guestIP].seqNAKs)
	if lastRace { // the QP is in ERR after its last SEND's retry exhaustion, counted once
		if q.State() != qp.StateErr || ours["retry_exceeded_err"] != 1 || ours["rdma_sends"] != uint64(o.Iters-1) || ours["rdma_recvs"] != uint64(o.Iters) {
			t.Errorf("last-ACK race: QP %v, counters %v: want ERR, one retry exhaustion, rdma_sends %d, rdma_recvs %d", q.State(), ours, o.Iters-1, o.Iters)
		}
		return
	}
	if q.State() != qp.StateRTS {
		t.Errorf("QP state %v after the run", q.State())
	}
	if ours["retry_exceeded_err"] != 0 || ours["rdma_sends"] != uint64(o.Iters) || ours["rdma_recvs"] != uint64(o.Iters) {
		t.Errorf("softroce counters %v: want rdma_sends = rdma_recvs = %d, no retry exhaustion", ours, o.Iters)
	}
	_ = context.Background
}
