//go:build interop

package interop

// The first interop test: a Go port of test/rxelab/tools/host-rc-client.py.
// A raw RoCEv2 RC peer on a plain UDP socket (every header and the ICRC from pkg/bth,
// via internal/rocetest) completes real ibv_rc_pingpong exchanges with kernel rxe:
//
//   - out of band: the pingpong TCP exchange on 18515 (rdma-core libibverbs/examples);
//   - RC SEND First/Middle/Last/Only (IBTA 9.2.1, 9.7.2) from an unconnected socket bound
//     to 198.18.0.1:4791 with DF, so Linux writes IPv4 ID 0, the ID our ICRC covers
//     (IBTA A17.3.3);
//   - rxe's ACKs (IBTA 9.7.5.1, AETH 9.3.5) and SENDs are parsed with bth.Parse, their
//     ICRC checked with bth.SolveIPv4ID (rxe numbers IPv4 IDs upward), and cross-checked
//     against the real IDs in a tcpdump capture of the tap;
//   - we ACK rxe's SENDs (coalesced, when AckReq is set, MSN = messages completed);
//   - the guest tool must exit 0 with its normal report.
//
// The negative case sends a SEND with a wrong ICRC, then one whose ICRC assumes IPv4 ID 1
// (the kernel writes 0): rxe must drop both silently (no answer, and its rcvd_pkts counter,
// which rxe_rcv() increments only after the ICRC check, does not move), then ACK the
// correct packet with the same PSN. (Debian's 6.1 rdma_rxe logs nothing for a bad ICRC.)

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/rocetest"
	"github.com/softroce/softroce/internal/testcap"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/test/rxelab"
)

func init() {
	pairings = append(pairings,
		pairing{Name: "raw-rc-send-64x2", Direction: SoftroceToRxe, Run: func(t *testing.T, lab *rxelab.Lab) {
			rawPingpong(t, lab, rawOptions{Size: 64, Iters: 2, Client: true})
		}},
		pairing{Name: "raw-rc-send-3000x2", Direction: SoftroceToRxe, Run: func(t *testing.T, lab *rxelab.Lab) {
			rawPingpong(t, lab, rawOptions{Size: 3000, Iters: 2, Client: true})
		}},
		pairing{Name: "raw-rc-send-64x2", Direction: RxeToSoftroce, Run: func(t *testing.T, lab *rxelab.Lab) {
			rawPingpong(t, lab, rawOptions{Size: 64, Iters: 2, Client: false})
		}},
		pairing{Name: "raw-rc-send-3000x2", Direction: RxeToSoftroce, Run: func(t *testing.T, lab *rxelab.Lab) {
			rawPingpong(t, lab, rawOptions{Size: 3000, Iters: 2, Client: false})
		}},
		pairing{Name: "raw-rc-bad-icrc", Direction: SoftroceToRxe, Run: rawBadICRC},
	)
}

var (
	hostIP  = netip.MustParseAddr(rxelab.HostIP)
	guestIP = netip.MustParseAddr(rxelab.GuestIP)
	guestEP = netip.AddrPortFrom(guestIP, bth.UDPPort)
	// pathMTU is the RoCE MTU: the lab's 1500-byte link gives rxe active_mtu 1024.
	pathMTU = 1024
)

// gidOf is the RoCEv2 GID of an IPv4 address (::ffff:a.b.c.d).
func gidOf(a netip.Addr) netip.Addr { return netip.AddrFrom16(a.As16()) }

type rawOptions struct {
	Size, Iters int
	// Client: we are the pingpong client (we send first); else the guest tool is.
	Client bool
	// GSO sends each multi-packet message with one UDP_SEGMENT sendmsg (gso_test.go).
	GSO bool
}

// rcSide is our raw RC QP: PSNs, MSN, and the packets seen (for the capture cross-check).
type rcSide struct {
	t      *testing.T
	peer   *rocetest.Peer
	qpn    uint32
	remote rocetest.PingpongDest

	sendPSN bth.PSN // next PSN we send
	recvPSN bth.PSN // next PSN we expect from rxe
	msn     uint32  // messages we completed (AETH MSN we report)

	inMsg []byte // message being reassembled
	recvd [][]byte

	// ackedThrough is the PSN of the last of our packets rxe acknowledged (valid if anyAck).
	ackedThrough bth.PSN
	anyAck       bool

	gso     bool         // send messages with UDP GSO (sendGSO)
	seen    []seenPacket // every packet received from rxe
	sentIDs []uint16     // IPv4 ID each packet we sent must carry on the wire, in order
}

type seenPacket struct {
	Op   bth.Opcode
	PSN  bth.PSN
	IPID uint16
}

// sendMessage sends one RC SEND message, segmented at the path MTU; AckReq on the last
// packet (IBTA 9.7.2: the requester asks for an ACK at the end of a message).
func (s *rcSide) sendMessage(msg []byte) bth.PSN {
	s.t.Helper()
	var last bth.PSN
	segs := rocetest.SegmentSend(len(msg), pathMTU)
	if s.gso && len(segs) > 1 {
		return s.sendGSO(msg, segs)
	}
	for i, seg := range segs {
		sp := rocetest.Spec{Opcode: seg.Opcode, DestQP: s.remote.QPN, PSN: s.sendPSN,
			AckReq: i == len(segs)-1, Payload: msg[seg.Off : seg.Off+seg.Len]}
		if _, err := s.peer.Send(guestEP, &sp); err != nil {
			s.t.Fatalf("send %v psn %#x: %v", seg.Opcode, uint32(s.sendPSN), err)
		}
		s.sentIDs = append(s.sentIDs, 0)
		last = s.sendPSN
		s.sendPSN = s.sendPSN.Add(1)
	}
	return last
}

// ack sends an RC ACK for psn with our MSN (syndrome 0x1F: ACK, no credit info, as rxe).
func (s *rcSide) ack(psn bth.PSN) {
	s.t.Helper()
	sp := rocetest.Spec{Opcode: bth.OpRCAck, DestQP: s.remote.QPN, PSN: psn,
		AETH: &bth.AETHFields{Syndrome: bth.SyndromeACK(31), MSN: s.msn}}
	if _, err := s.peer.Send(guestEP, &sp); err != nil {
		s.t.Fatalf("send ACK: %v", err)
	}
	s.sentIDs = append(s.sentIDs, 0)
}

// recv handles one packet from rxe: ICRC (via the solved IPv4 ID), ACKs of our
// messages, SEND segments in PSN order (duplicates re-ACKed, IBTA 9.7.5.1.2).
func (s *rcSide) recv(deadline time.Time) {
	s.t.Helper()
	r, err := s.peer.Recv(deadline)
	if err != nil {
		s.t.Fatalf("waiting for rxe: %v (sendPSN %#x, recvPSN %#x, messages received %d)", err, uint32(s.sendPSN), uint32(s.recvPSN), len(s.recvd))
	}
	if r.From != netip.AddrPortFrom(guestIP, r.From.Port()) {
		s.t.Fatalf("packet from %v, want %v", r.From, guestIP)
	}
	// rxe derives the UDP source port from the QPN pair (IBTA A17.3.2 entropy; rxe_net.c)
	if want := bth.SourcePort(s.remote.QPN, s.qpn); r.From.Port() != want {
		s.t.Errorf("rxe source port %d, bth.SourcePort(%#x, %#x) = %d", r.From.Port(), s.remote.QPN, s.qpn, want)
	}
	f := r.Pkt.BTH.Fields()
	if !r.IDSolved {
		s.t.Fatalf("ICRC of %s matches no IPv4 ID", rocetest.Describe(&r.Pkt))
	}
	s.seen = append(s.seen, seenPacket{Op: f.Opcode, PSN: f.PSN, IPID: r.IPID})
	s.t.Logf("rxe -> us: %s ip-id=%d sport=%d", rocetest.Describe(&r.Pkt), r.IPID, r.From.Port())
	if f.DestQP != s.qpn {
		s.t.Fatalf("destqp %#x, want ours %#x", f.DestQP, s.qpn)
	}
	if f.PKey != rocetest.DefaultPKey {
		s.t.Errorf("pkey %#x, want %#x", f.PKey, rocetest.DefaultPKey)
	}
	info := f.Opcode.Info()
	switch {
	case f.Opcode == bth.OpRCAck:
		a := r.Pkt.AETH.Fields()
		if bth.SyndromeType(a.Syndrome) != bth.AckTypeACK {
			s.t.Fatalf("rxe answered with %v (syndrome %#x) for psn %#x", bth.SyndromeType(a.Syndrome), a.Syndrome, uint32(f.PSN))
		}
		if !f.PSN.LessThan(s.sendPSN) {
			s.t.Fatalf("ACK for psn %#x we never sent (next %#x)", uint32(f.PSN), uint32(s.sendPSN))
		}
		s.ackedThrough, s.anyAck = f.PSN, true
	case info.Kind == bth.KindSend && info.Transport == bth.TransportRC:
		if f.PSN != s.recvPSN {
			if f.PSN.LessThan(s.recvPSN) { // duplicate (rxe retried): re-ACK
				s.ack(s.recvPSN.Add(^uint32(0)))
				return
			}
			s.t.Fatalf("rxe SEND psn %#x, expected %#x", uint32(f.PSN), uint32(s.recvPSN))
		}
		if info.First == (s.inMsg != nil) { // First while a message is open, or Middle/Last without one
			s.t.Fatalf("%v out of message order (IBTA 9.7.2)", f.Opcode)
		}
		if info.First {
			s.inMsg = []byte{}
		}
		if !info.Last && len(r.Pkt.Payload) != pathMTU {
			s.t.Errorf("%v carries %d bytes, want the path MTU %d", f.Opcode, len(r.Pkt.Payload), pathMTU)
		}
		s.inMsg = append(s.inMsg, r.Pkt.Payload...)
		s.recvPSN = s.recvPSN.Add(1)
		if info.Last {
			s.recvd = append(s.recvd, s.inMsg)
			s.inMsg = nil
			s.msn++
		}
		if f.AckReq {
			s.ack(f.PSN)
		} else if info.Last {
			s.t.Errorf("rxe sent %v without AckReq", f.Opcode)
		}
	default:
		s.t.Fatalf("unexpected %s", rocetest.Describe(&r.Pkt))
	}
}

func payloadFor(size, iter int, client bool) []byte {
	b := make([]byte, size)
	seed := 0x11
	if !client {
		seed = 0x5d
	}
	for i := range b {
		b[i] = byte(i*7 + iter*13 + seed)
	}
	return b
}

// dialInNetns connects to the guest's pingpong server from inside the lab netns,
// retrying until it listens (the guest job starts asynchronously).
func dialInNetns(t *testing.T, lab *rxelab.Lab, addr string, deadline time.Time) net.Conn {
	t.Helper()
	for {
		var c net.Conn
		err := lab.InNetns(func() error {
			var err error
			d := net.Dialer{Timeout: 2 * time.Second}
			c, err = d.Dial("tcp4", addr)
			return err
		})
		if err == nil {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("connect %s: %v", addr, err)
		}
		// the guest server is not listening yet: wait for it (bounded by deadline)
		<-time.After(100 * time.Millisecond)
	}
}

// startCapture starts tcpdump on the tap for RoCE traffic; the returned func stops it
// and returns the decoded RoCE datagrams.
func startCapture(t *testing.T, lab *rxelab.Lab) func() []testcap.IPUDP {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tap.pcap")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := lab.Tcpdump(ctx, path, "udp", "port", strconv.Itoa(bth.UDPPort))
	if err != nil {
		t.Fatalf("tcpdump: %v", err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = c.Stop()
		}
	})
	return func() []testcap.IPUDP {
		stopped = true
		if err := c.Stop(); err != nil {
			t.Errorf("tcpdump: %v", err)
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatalf("capture: %v", err)
		}
		defer f.Close()
		frames, err := testcap.ReadStream(f)
		if err != nil {
			t.Fatalf("capture: %v", err)
		}
		var out []testcap.IPUDP
		for i := range frames {
			if d, ok := testcap.DecodeIPUDP(&frames[i]); ok {
				out = append(out, d)
			}
		}
		if keep := os.Getenv("INTEROP_KEEP_PCAP"); keep != "" {
			b, _ := os.ReadFile(path)
			_ = os.WriteFile(filepath.Join(keep, strings.NewReplacer("/", "_", ">", "").Replace(t.Name())+".pcap"), b, 0o644)
		}
		decodeClean(t, path, len(out)) // the same capture through `softroce decode`
		return out
	}
}

// checkCapture cross-checks the wire: every RoCE packet's ICRC verifies over the real
// IP header; ours carry DF and the IDs our ICRCs assumed (0 for plain sends); rxe's carry DF, TTL 64, UDP checksum 0, and the IDs
// SolveIPv4ID recovered, incrementing (neighbours may swap).
func checkCapture(t *testing.T, wire []testcap.IPUDP, s *rcSide) {
	t.Helper()
	var fromUs, fromRxe []testcap.IPUDP
	for _, d := range wire {
		want, err := bth.ICRCFromIP(d.IP)
		if err != nil {
			t.Errorf("ICRCFromIP: %v", err)
			continue
		}
		if got := bth.GetICRC(d.Payload); got != want {
			t.Errorf("captured %v -> %v id %d: ICRC %#08x, computed over the real header %#08x", d.Src, d.Dst, d.ID, got, want)
		}
		if !d.DF {
			t.Errorf("captured %v -> %v id %d without DF", d.Src, d.Dst, d.ID)
		}
		switch d.Src {
		case hostIP:
			fromUs = append(fromUs, d)
		case guestIP:
			fromRxe = append(fromRxe, d)
			if d.TTL != 64 {
				t.Errorf("rxe TTL %d, want 64", d.TTL)
			}
			if d.UDPChecksum != 0 {
				t.Errorf("rxe UDP checksum %#04x, want 0", d.UDPChecksum)
			}
		}
	}
	if len(fromUs) != len(s.sentIDs) {
		t.Errorf("capture has %d packets from us, we sent %d", len(fromUs), len(s.sentIDs))
	} else {
		for i, d := range fromUs {
			if d.ID != s.sentIDs[i] {
				t.Errorf("our packet %d carries IPv4 ID %d, our ICRC assumed %d", i, d.ID, s.sentIDs[i])
			}
		}
	}
	if len(fromRxe) != len(s.seen) {
		t.Fatalf("capture has %d packets from rxe, we received %d", len(fromRxe), len(s.seen))
	}
	for i, d := range fromRxe {
		b := bth.BTH(d.Payload)
		got := s.seen[i]
		if b.Opcode() != got.Op || b.PSN() != got.PSN {
			t.Errorf("rxe packet %d: wire %v psn %#x, socket %v psn %#x", i, b.Opcode(), uint32(b.PSN()), got.Op, uint32(got.PSN))
			continue
		}
		if d.ID != got.IPID {
			t.Errorf("rxe packet %d (%v psn %#x): SolveIPv4ID recovered ID %d, the wire has %d", i, got.Op, uint32(got.PSN), got.IPID, d.ID)
		}
		// rxe numbers its packets' IDs upward from one counter, but its responder (ACKs) and
		// requester (SENDs) may take them on two CPUs, so two neighbours can leave in swapped
		// order (ID 8080 after 8081): near each other and distinct, not strictly increasing
		if i > 0 {
			if step := int16(d.ID - fromRxe[i-1].ID); step == 0 || step > 16 || step < -16 {
				t.Errorf("rxe IPv4 IDs %d then %d: not from one incrementing counter", fromRxe[i-1].ID, d.ID)
			}
		}
	}
	t.Logf("wire: %d packets from us with IDs %v, %d from rxe with IDs %v, all ICRCs valid", len(fromUs), ids(fromUs), len(fromRxe), ids(fromRxe))
}

func ids(d []testcap.IPUDP) []uint16 {
	out := make([]uint16, len(d))
	for i := range d {
		out[i] = d[i].ID
	}
	return out
}

// guestJob is a guest tool run in the background.
type guestJob struct {
	job    *rxelab.Job
	waited bool
}

// startGuest starts ibv_rc_pingpong in the guest and makes sure it is killed if the test
// ends before waiting for it.
func startGuest(t *testing.T, lab *rxelab.Lab, args string) *guestJob {
	t.Helper()
	job, err := lab.ExecBG(context.Background(), "exec stdbuf -oL ibv_rc_pingpong "+args, rxelab.ExecOptions{Timeout: 60 * time.Second})
	if err != nil {
		t.Fatalf("guest: %v", err)
	}
	g := &guestJob{job: job}
	t.Cleanup(func() {
		if !g.waited {
			_ = job.Kill()
			out, st, _ := job.Wait(context.Background())
			t.Logf("guest ibv_rc_pingpong (killed) status %d:\n%s", st, out)
		}
	})
	return g
}

func waitGuest(t *testing.T, g *guestJob) string {
	t.Helper()
	out, st, err := g.job.Wait(context.Background())
	g.waited = true
	if err != nil {
		t.Fatalf("guest job: %v", err)
	}
	t.Logf("guest ibv_rc_pingpong (exit %d):\n%s", st, out)
	if st != 0 {
		t.Fatalf("guest ibv_rc_pingpong exit status %d, want 0", st)
	}
	return string(out)
}

// checkReport checks the pingpong's final report lines (rc_pingpong.c main()).
func checkReport(t *testing.T, out string, o rawOptions, mine rocetest.PingpongDest) {
	t.Helper()
	wantRemote := fmt.Sprintf("remote address: LID 0x0000, QPN 0x%06x, PSN 0x%06x, GID ::ffff:%s", mine.QPN, uint32(mine.PSN), rxelab.HostIP)
	if !strings.Contains(out, wantRemote) {
		t.Errorf("guest output lacks %q", wantRemote)
	}
	bytesRe := regexp.MustCompile(fmt.Sprintf(`(?m)^%d bytes in [0-9.]+ seconds = [0-9.]+ Mbit/sec$`, o.Size*o.Iters*2))
	itersRe := regexp.MustCompile(fmt.Sprintf(`(?m)^%d iters in [0-9.]+ seconds = [0-9.]+ usec/iter$`, o.Iters))
	if !bytesRe.MatchString(out) || !itersRe.MatchString(out) {
		t.Errorf("guest output lacks the normal report (%v, %v)", bytesRe, itersRe)
	}
}

// rawPingpong runs one ibv_rc_pingpong exchange between the guest and our raw RC peer.
func rawPingpong(t *testing.T, lab *rxelab.Lab, o rawOptions) {
	deadline := time.Now().Add(60 * time.Second)
	stopCapture := startCapture(t, lab)

	var peer *rocetest.Peer
	if err := lab.InNetns(func() error {
		var err error
		peer, err = rocetest.ListenPeer(rocetest.PeerOptions{Local: netip.AddrPortFrom(hostIP, bth.UDPPort)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer peer.Close()

	mine := rocetest.PingpongDest{QPN: 0x000abc, PSN: 0x000123, GID: gidOf(hostIP)}
	if !o.Client {
		mine.QPN, mine.PSN = 0x000bcd, 0xfffffe // our PSNs cross the 24-bit wrap
	}
	args := fmt.Sprintf("-d %s -g %d -m %d -s %d -n %d", rxelab.GuestDev, rxelab.GuestGIDIndex, pathMTU, o.Size, o.Iters)
	var theirs rocetest.PingpongDest
	var job *guestJob
	if o.Client {
		job = startGuest(t, lab, args)
		conn := dialInNetns(t, lab, net.JoinHostPort(rxelab.GuestIP, strconv.Itoa(rocetest.PingpongPort)), deadline)
		_ = conn.SetDeadline(deadline)
		var err error
		theirs, err = rocetest.PingpongClientExchange(conn, mine)
		conn.Close()
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
		theirs, err = rocetest.PingpongServerExchange(conn, mine, nil)
		conn.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("oob: ours %s, rxe's %s", mine.Marshal()[:51], theirs.Marshal()[:51])
	if theirs.GID != gidOf(guestIP) {
		t.Fatalf("rxe GID %v, want %v (GID index %d)", theirs.GID, gidOf(guestIP), rxelab.GuestGIDIndex)
	}

	s := &rcSide{t: t, peer: peer, qpn: mine.QPN, remote: theirs, sendPSN: mine.PSN, recvPSN: theirs.PSN, gso: o.GSO}
	// pingpong.c: the client sends message k once its message k-1 completed and it has
	// received k messages; the server sends message k after receiving message k.
	lead := 1
	if o.Client {
		lead = 0
	}
	sentMsgs := 0
	var lastPSN bth.PSN
	ourMsgs := [][]byte{}
	for sentMsgs < o.Iters || len(s.recvd) < o.Iters || !s.anyAck || s.ackedThrough != lastPSN {
		acked := sentMsgs == 0 || (s.anyAck && s.ackedThrough == lastPSN)
		if sentMsgs < o.Iters && acked && len(s.recvd) == sentMsgs+lead {
			msg := payloadFor(o.Size, sentMsgs, o.Client)
			ourMsgs = append(ourMsgs, msg)
			lastPSN = s.sendMessage(msg)
			sentMsgs++
			continue
		}
		s.recv(deadline)
	}
	// The tool receives into the buffer it sends from: what rxe sends after receiving our
	// message k is our message k, byte for byte.
	for i, m := range s.recvd {
		var want []byte
		switch {
		case o.Client:
			want = ourMsgs[i]
		case i > 0:
			want = ourMsgs[i-1]
		default:
			want = bytes.Repeat([]byte{0x7b}, o.Size) // rc_pingpong.c fills its buffer with 0x7b
		}
		if !bytes.Equal(m, want) {
			t.Errorf("message %d from rxe: %d bytes, not the expected echo", i, len(m))
		}
	}
	out := waitGuest(t, job)
	checkReport(t, out, o, mine)
	checkCapture(t, stopCapture(), s)
}

// rawBadICRC: rxe drops a SEND whose ICRC is wrong, and one whose ICRC assumes IPv4 ID 1,
// without an answer, then ACKs the correct SEND with the same PSN.
func rawBadICRC(t *testing.T, lab *rxelab.Lab) {
	deadline := time.Now().Add(60 * time.Second)

	var peer *rocetest.Peer
	if err := lab.InNetns(func() error {
		var err error
		peer, err = rocetest.ListenPeer(rocetest.PeerOptions{Local: netip.AddrPortFrom(hostIP, bth.UDPPort)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	job := startGuest(t, lab, fmt.Sprintf("-d %s -g %d -m %d -s 64 -n 1", rxelab.GuestDev, rxelab.GuestGIDIndex, pathMTU))
	conn := dialInNetns(t, lab, net.JoinHostPort(rxelab.GuestIP, strconv.Itoa(rocetest.PingpongPort)), deadline)
	_ = conn.SetDeadline(deadline)
	mine := rocetest.PingpongDest{QPN: 0x000cde, PSN: 0x000777, GID: gidOf(hostIP)}
	theirs, err := rocetest.PingpongClientExchange(conn, mine)
	conn.Close()
	if err != nil {
		t.Fatal(err)
	}
	rcvd0 := rxeCounter(t, lab, "rcvd_pkts")
	msg := payloadFor(64, 0, true)
	spec := rocetest.Spec{Opcode: bth.OpRCSendOnly, DestQP: theirs.QPN, PSN: mine.PSN, AckReq: true, Payload: msg}

	// 1. wrong ICRC
	bad := spec
	bad.CorruptICRC = true
	if _, err := peer.Send(guestEP, &bad); err != nil {
		t.Fatal(err)
	}
	expectSilence(t, peer, 1500*time.Millisecond, "SEND with a corrupted ICRC")
	// 2. ICRC computed for IPv4 ID 1 while the kernel writes 0
	ep := peer.Endpoints(guestEP)
	ep.IPID = 1
	pkt, err := spec.Append(nil, &ep)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := peer.Conn.WriteToUDPAddrPort(pkt, guestEP); err != nil {
		t.Fatal(err)
	}
	expectSilence(t, peer, 1500*time.Millisecond, "SEND whose ICRC assumes IPv4 ID 1")
	if d := rxeCounter(t, lab, "rcvd_pkts") - rcvd0; d != 0 {
		t.Errorf("rxe counted %d received packets for the two bad ones, want 0 (dropped at the ICRC check)", d)
	}

	// 3. the correct packet, same PSN: ACKed, and the exchange completes.
	s := &rcSide{t: t, peer: peer, qpn: mine.QPN, remote: theirs, sendPSN: mine.PSN, recvPSN: theirs.PSN}
	last := s.sendMessage(msg)
	for !s.anyAck || s.ackedThrough != last || len(s.recvd) < 1 {
		s.recv(deadline)
	}
	if !bytes.Equal(s.recvd[0], msg) {
		t.Errorf("rxe's answer is not the echo of our message")
	}
	waitGuest(t, job)
	if d := rxeCounter(t, lab, "rcvd_pkts") - rcvd0; d != 2 {
		t.Errorf("rxe counted %d received packets in all, want 2 (our good SEND and our ACK)", d)
	}
}

// expectSilence fails if any datagram arrives within d.
func expectSilence(t *testing.T, peer *rocetest.Peer, d time.Duration, what string) {
	t.Helper()
	r, err := peer.Recv(time.Now().Add(d))
	if err == nil {
		t.Fatalf("after a %s rxe answered: %s", what, rocetest.Describe(&r.Pkt))
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("after a %s: %v", what, err)
	}
}

// rxeCounter reads one of rxe0's hw_counters in the guest (rxe_hw_counters.c).
func rxeCounter(t *testing.T, lab *rxelab.Lab, name string) int {
	t.Helper()
	out, st, err := lab.Exec(context.Background(), "cat /sys/class/infiniband/"+rxelab.GuestDev+"/ports/1/hw_counters/"+name, rxelab.ExecOptions{Timeout: 20 * time.Second})
	if err != nil || st != 0 {
		t.Fatalf("guest counter %s: status %d, %v", name, st, err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("guest counter %s = %q: %v", name, out, err)
	}
	return n
}
