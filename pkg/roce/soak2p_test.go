package roce

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/fault"
	"github.com/softroce/softroce/pkg/link/udp"
)

// The two-process soak (docs/reliability.md): the RC soak between
// two softroce PROCESSES over real UDP sockets on loopback. TestSoak2P
// re-executes its own test binary (-test.run=^TestSoak2PPeer$ and
// SOFTROCE_SOAK2P_PEER=1) as the peer. The parent's device is 127.0.0.1,
// the peer's 127.0.0.2, both on one port; each wraps its link in the fault
// decorator with the rates on its sends (its own seed), so both
// directions of the wire misbehave. The processes exchange configuration,
// QP numbers, PSNs, R_Keys and addresses as JSON lines (parent -> peer on
// the peer's stdin, peer -> parent on its fd 3; its stdout/stderr are the
// test framework's and are logged), then every RC QP pair runs the random
// mix both ways: each process is the requester of one direction per pair
// and the responder of the other.
//
// Verification (soak2p_check_test.go): the plan of a direction is a
// deterministic function of the seed, so each side checks what it
// RECEIVES: send completions, READ data (the peer's static region, or a
// write slot it wrote before), atomic results against the model (on the
// requester); receive completions in order, SEND payloads and immediates
// (on the responder); at the end the responder checks its write region and
// atomic words against the plan, and the two sides exchange SHA-256
// digests of what was sent (from the bytes posted) and what was received
// (from the receive buffers and the final memory): they must match.
//
// The peer exits when its stdin reaches EOF before the parent's goodbye
// (the parent died): no orphan is ever left.

const s2pPeerEnv = "SOFTROCE_SOAK2P_PEER"

// s2pPeerDied is the peer's exit status when the parent went away.
const s2pPeerDied = 3

// s2pCount is the default message count of TestSoak2P.
func s2pCount(t *testing.T) int {
	if *soakMsgs > 0 {
		return *soakMsgs
	}
	if s := os.Getenv("SOFTROCE_SOAK_MSGS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			t.Fatalf("SOFTROCE_SOAK_MSGS=%q", s)
		}
		return n
	}
	if raceSoak {
		return 3000
	}
	if testing.Short() {
		return 4000
	}
	return 20000
}

// TestSoak2P is the short two-process soak (scripts/soak SOAK_LINKS=udp2p
// runs the long one through TestSoak).
func TestSoak2P(t *testing.T) {
	res := runSoak2P(t, soak2pConfig{Msgs: s2pCount(t), Seed: *soakSeed, Pairs: *soakPairs,
		MaxSize: *soakMax, Timeout: uint8(*soakTmo)})
	t.Logf("%s", res)
}

// soak2pConfig is the run's configuration; the parent sends it to the peer.
type soak2pConfig struct {
	Msgs    int    // messages, all QPs and both directions
	Seed    uint64 // plans and fault injectors
	Pairs   int
	MaxSize int
	Timeout uint8  // ACK timeout code (0: 14)
	Faults  string // send faults of both sides (fault.ParseDirOptions; "": soakFaults())
	Port    uint16 // UDP port of both devices
	Stall   time.Duration
}

func (c *soak2pConfig) perDir() int { return (c.Msgs + 2*c.Pairs - 1) / (2 * c.Pairs) }

// s2pQPInfo is what a QP's peer needs to connect to it and address its MR.
type s2pQPInfo struct {
	QPN, PSN, RKey uint32
	VA             uint64
}

// s2pMsg is one JSON line of the protocol.
//
//	parent -> peer: config (Config, QPs), start, progress, done (Errors), final (Result), bye
//	peer -> parent: bindfail (Errors), hello (QPs), fatal (Errors), progress, done (Errors),
//	                final (Result), verdict (Errors)
type s2pMsg struct {
	Type   string         `json:"type"`
	Config *soak2pConfig  `json:"config,omitempty"`
	QPs    []s2pQPInfo    `json:"qps,omitempty"`
	Errors []string       `json:"errors,omitempty"`
	Done   int            `json:"done,omitempty"`
	Result *s2pSideResult `json:"result,omitempty"`
}

// s2pSideResult is one process's account of the run.
type s2pSideResult struct {
	Msgs, Bytes   uint64            // completed and checked by this side's requesters
	Counters      map[string]uint64 // Device.Stats().Map()
	Faults        fault.Stats       // this side's injector (its sends)
	CorruptCopies uint64            // corrupted datagrams sent, duplicates of them included
	Sent, Recv    map[string]string // direction -> digest (hex): as posted here / as received here
	Wall          time.Duration
}

// soak2pResult is the run's report.
type soak2pResult struct {
	msgs, bytes uint64
	wall        time.Duration
	a, b        s2pSideResult // parent, peer
}

func (r soak2pResult) String() string {
	f := func(s fault.Stats, cc uint64) string {
		return fmt.Sprintf("seen %d dropped %d duplicated %d reordered %d corrupted %d (%d corrupted copies sent)",
			s.Send.Seen, s.Send.Dropped, s.Send.Duplicated, s.Send.Reordered, s.Send.Corrupted, cc)
	}
	c := func(m map[string]uint64) string {
		keys := []string{"sent_pkts", "rcvd_pkts", "retransmitted_pkts", "completer_retry_err", "rcvd_seq_err",
			"out_of_seq_request", "duplicate_request", "send_rnr_err", "rcvd_rnr_err", "rcvd_dropped", "rcvd_icrc_solved",
			"retry_exceeded_err", "retry_rnr_exceeded_err"}
		var sb strings.Builder
		for _, k := range keys {
			fmt.Fprintf(&sb, " %s=%d", k, m[k])
		}
		return sb.String()
	}
	return fmt.Sprintf("soak udp2p (two processes): %d messages, %d bytes, wall %v (%.0f msg/s)\n"+
		"  faults parent: %s\n  faults peer:   %s\n  counters parent:%s\n  counters peer:  %s",
		r.msgs, r.bytes, r.wall.Round(time.Millisecond), float64(r.msgs)/r.wall.Seconds(),
		f(r.a.Faults, r.a.CorruptCopies), f(r.b.Faults, r.b.CorruptCopies), c(r.a.Counters), c(r.b.Counters))
}

// s2pEnd is one process's QP of a pair: the requester of direction
// sendDir, the responder of direction recvDir.
type s2pEnd struct {
	pair     int
	qp       *QP
	scq, rcq *cq.CQ
	buf      []byte
	mr       *mr.MR
	lay      s2pLayout
	psn      uint32
	peer     s2pQPInfo
	snd      *s2pSender
	rcv      *s2pReceiver
	done     atomic.Int64 // send completions checked (progress)
}

func (e *s2pEnd) info() s2pQPInfo {
	return s2pQPInfo{QPN: e.qp.Num(), PSN: e.psn, RKey: e.mr.RKey(), VA: e.mr.IOVA()}
}

func (e *s2pEnd) sge(off, n int) qp.SGE {
	return qp.SGE{Addr: e.mr.IOVA() + uint64(off), Length: uint32(n), LKey: e.mr.LKey()}
}

// s2pSide is one process's half of the run.
type s2pSide struct {
	cfg    soak2pConfig
	parent bool
	dev    *Device
	fl     *fault.Link
	cc     atomic.Uint64 // corrupted copies sent
	ccLast atomic.Uint64 // Seq+1 of the last corrupted datagram
	ends   []*s2pEnd
}

// open binds addr:port (port 0: any), wraps the link in the fault
// injector and opens the device.
func (s *s2pSide) open(addr netip.Addr, port uint16) error {
	ul, err := udp.Listen(udp.Options{Addrs: []netip.Addr{addr}, Port: port, AnyPort: port == 0})
	if err != nil {
		return err
	}
	if port == 0 {
		port = ul.LocalAddrPorts()[0].Port()
	}
	s.cfg.Port = port
	fo := soakFaults()
	if s.cfg.Faults != "" {
		if fo, err = fault.ParseDirOptions(s.cfg.Faults); err != nil {
			ul.Close()
			return err
		}
	}
	seed2 := uint64(1)
	if !s.parent {
		seed2 = 2
	}
	s.fl = fault.Wrap(hbLink{ul}, fault.Options{Seed1: s.cfg.Seed, Seed2: seed2, Send: fo, OnEvent: s.onFault})
	name := "soak2p-peer"
	if s.parent {
		name = "soak2p-parent"
	}
	if s.dev, err = Open(Options{Link: s.fl, Port: port, Name: name}); err != nil {
		s.fl.Close()
		return err
	}
	lay := newS2PLayout(s.cfg.MaxSize)
	rng := rand.New(rand.NewPCG(s.cfg.Seed, seed2<<8|0x2b))
	for i := 0; i < s.cfg.Pairs; i++ {
		e, err := newS2PEnd(s.dev, lay, i)
		if err != nil {
			return err
		}
		// start PSNs near the 2^24 wrap on the parent, anywhere on the peer
		e.psn = rng.Uint32N(1 << 24)
		if s.parent {
			e.psn = bth.PSNMask - uint32(rng.IntN(2000))
		}
		sendDir, recvDir := uint64(2*i), uint64(2*i+1)
		if !s.parent {
			sendDir, recvDir = recvDir, sendDir
		}
		n := s.cfg.perDir()
		e.snd = newS2PSender(newS2PPlan(s.cfg.Seed, sendDir, n, s.cfg.MaxSize, lay), i)
		e.rcv = newS2PReceiver(newS2PPlan(s.cfg.Seed, recvDir, n, s.cfg.MaxSize, lay), i)
		s.ends = append(s.ends, e)
	}
	// The devices' receive goroutines read the static READ regions filled
	// above when the peer's READs arrive: hbLink's Recv acquires this.
	wire.Add(1)
	return nil
}

// onFault counts corrupted datagrams sent, duplicates of them included
// (the receiver must drop every one: its rcvd_dropped).
func (s *s2pSide) onFault(e fault.Event) {
	switch e.Kind {
	case fault.Corrupt:
		s.cc.Add(1)
		s.ccLast.Store(e.Seq + 1)
	case fault.Duplicate:
		if s.ccLast.Load() == e.Seq+1 {
			s.cc.Add(1)
		}
	}
}

func (s *s2pSide) close() {
	if s.dev != nil {
		s.dev.Close()
	} else if s.fl != nil {
		s.fl.Close()
	}
}

func newS2PEnd(d *Device, lay s2pLayout, pair int) (*s2pEnd, error) {
	e := &s2pEnd{pair: pair, lay: lay, buf: make([]byte, lay.size)}
	soakPattern(e.buf[lay.readSrc:lay.readSrc+lay.readLen], s2pReadID, uint64(pair))
	pd, err := d.AllocPD()
	if err != nil {
		return nil, err
	}
	if e.scq, err = d.CreateCQ(s2pWindow * 2); err != nil {
		return nil, err
	}
	if e.rcq, err = d.CreateCQ(s2pRQ * 2); err != nil {
		return nil, err
	}
	acc := mr.AccessLocalWrite | mr.AccessRemoteWrite | mr.AccessRemoteRead | mr.AccessRemoteAtomic
	if e.mr, err = d.RegMR(pd, e.buf, 0x6000_0000+uint64(pair)<<32, acc); err != nil {
		return nil, err
	}
	e.qp, err = d.CreateQP(QPInit{Type: qp.TypeRC, PD: pd, SendCQ: e.scq, RecvCQ: e.rcq,
		Cap: qp.Cap{MaxSendWR: s2pWindow, MaxRecvWR: s2pRQ, MaxSendSGE: 2, MaxRecvSGE: 2}})
	return e, err
}

// connect brings e to RTS towards the peer's QP (IBTA 10.3: INIT, RTR with
// the remote QPN and PSN, RTS): MTU 1024, retry_cnt 7, rnr_retry 7
// (infinite), min_rnr_timer code 1.
func (e *s2pEnd) connect(d *Device, peerAddr netip.Addr, peer s2pQPInfo, timeout uint8) error {
	e.peer = peer
	all := mr.AccessRemoteWrite | mr.AccessRemoteRead | mr.AccessRemoteAtomic | mr.AccessLocalWrite
	local := d.Addrs()[0]
	steps := []struct {
		a qp.Attr
		m qp.AttrMask
	}{
		{qp.Attr{State: qp.StateInit, Port: 1, AccessFlags: all}, qp.AttrState | qp.AttrPKeyIndex | qp.AttrPort | qp.AttrAccessFlags},
		{qp.Attr{State: qp.StateRTR, AH: qp.AHAttr{DGID: peerAddr, SGIDIndex: uint8(d.GIDIndex(local)), Port: 1},
			PathMTU: qp.MTU1024, DestQPN: peer.QPN, RQPSN: peer.PSN, MaxDestRDAtomic: 16, MinRNRTimer: 1},
			qp.AttrState | qp.AttrAV | qp.AttrPathMTU | qp.AttrDestQPN | qp.AttrRQPSN | qp.AttrMaxDestRDAtomic | qp.AttrMinRNRTimer},
		{qp.Attr{State: qp.StateRTS, SQPSN: e.psn, Timeout: timeout, RetryCnt: 7, RNRRetry: 7, MaxRDAtomic: 16},
			qp.AttrState | qp.AttrSQPSN | qp.AttrTimeout | qp.AttrRetryCnt | qp.AttrRNRRetry | qp.AttrMaxQPRDAtomic},
	}
	for _, s := range steps {
		if err := e.qp.Modify(&s.a, s.m); err != nil {
			return fmt.Errorf("pair %d: modify to %v: %w", e.pair, s.a.State, err)
		}
	}
	return nil
}

func (s *s2pSide) connect(peerAddr netip.Addr, peers []s2pQPInfo) error {
	if len(peers) != len(s.ends) {
		return fmt.Errorf("peer has %d QPs, want %d", len(peers), len(s.ends))
	}
	timeout := s.cfg.Timeout
	if timeout == 0 {
		timeout = 14
	}
	// Two processes under the race detector on a busy two-core machine: a side can be
	// off the CPU for seconds (a starved peer process reproduces the failure: retries
	// run out one timeout x 8 after the last completion), and seven retries of a 268 ms
	// timeout (code 16) ran out there. Code 17 (537 ms, 4.3 s of retries) keeps the run
	// about checking the transport, not the scheduler.
	if raceSoak && timeout < 17 {
		timeout = 17
	}
	for i, e := range s.ends {
		if err := e.connect(s.dev, peerAddr, peers[i], timeout); err != nil {
			return err
		}
	}
	return nil
}

func (s *s2pSide) infos() []s2pQPInfo {
	var in []s2pQPInfo
	for _, e := range s.ends {
		in = append(in, e.info())
	}
	return in
}

// post posts the sender's next operation.
func (e *s2pEnd) post() error {
	s := e.snd
	lay := &e.lay
	loc := lay.local + (s.posted%s2pWindow)*lay.slot
	o := s.prepare(e.buf[loc : loc+lay.slot])
	wr := qp.SendWR{WRID: o.seq, Flags: qp.SendSignaled, Opcode: o.op, Imm: o.imm}
	sgl := func(n int) []qp.SGE { // two SGEs, so gathers cross them
		if n == 0 {
			return nil
		}
		h := n / 3
		if h == 0 {
			return []qp.SGE{e.sge(loc, n)}
		}
		return []qp.SGE{e.sge(loc, h), e.sge(loc+h, n-h)}
	}
	switch o.op {
	case qp.WRSend, qp.WRSendWithImm:
		wr.SGL = sgl(o.n)
	case qp.WRRDMAWrite, qp.WRRDMAWriteWithImm:
		wr.SGL = sgl(o.n)
		wr.RemoteAddr, wr.RKey = e.peer.VA+uint64(lay.write+o.slot*lay.slot), e.peer.RKey
	case qp.WRRDMARead:
		wr.SGL = sgl(o.n)
		off := lay.readSrc + o.roff
		if o.slot >= 0 {
			off = lay.write + o.slot*lay.slot
		}
		wr.RemoteAddr, wr.RKey = e.peer.VA+uint64(off), e.peer.RKey
	case qp.WRAtomicFetchAndAdd:
		wr.SGL = []qp.SGE{e.sge(loc, 8)}
		wr.RemoteAddr, wr.RKey, wr.CompareAdd = e.peer.VA+uint64(lay.atomic), e.peer.RKey, o.add
	case qp.WRAtomicCmpAndSwp:
		wr.SGL = []qp.SGE{e.sge(loc, 8)}
		wr.RemoteAddr, wr.RKey, wr.CompareAdd, wr.Swap = e.peer.VA+uint64(lay.atomic+8), e.peer.RKey, o.add, o.swap
	}
	if _, err := e.qp.PostSend([]qp.SendWR{wr}); err != nil {
		return fmt.Errorf("dir %d: PostSend op %d: %w", s.plan.id, o.seq, err)
	}
	return nil
}

// waitCQ waits for a completion event on c (armed by the caller); an
// error means the stall timer fired or the run was aborted.
func waitCQ(c *cq.CQ, timer *time.Timer, abort <-chan struct{}) error {
	select {
	case <-c.Channel():
		return nil
	case <-timer.C:
		return errors.New("stalled")
	case <-abort:
		return errors.New("aborted (a worker failed)")
	}
}

// runSend posts the direction's operations, keeping s2pWindow outstanding,
// and checks every send completion.
func (e *s2pEnd) runSend(stall time.Duration, abort <-chan struct{}) error {
	s := e.snd
	n := s.plan.n
	wcs := make([]cq.WC, s2pWindow)
	timer := time.NewTimer(stall)
	defer timer.Stop()
	last := time.Now()
	for s.checked < n {
		for s.posted < n && s.posted-s.checked < s2pWindow {
			if err := e.post(); err != nil {
				return err
			}
		}
		k := e.scq.Poll(wcs)
		if k == 0 {
			e.scq.ReqNotify(false)
			if k = e.scq.Poll(wcs); k == 0 {
				if err := waitCQ(e.scq, timer, abort); err != nil {
					return fmt.Errorf("dir %d: %w: %d of %d completed (QP %v)", s.plan.id, err, s.checked, n, e.qp.State())
				}
				continue
			}
		}
		for i := range k {
			slot := s.checked % s2pWindow
			loc := e.lay.local + slot*e.lay.slot
			if err := s.check(&wcs[i], e.buf[loc:loc+e.lay.slot]); err != nil {
				return fmt.Errorf("%w (the completion before came %v earlier)", err, time.Since(last).Round(time.Millisecond))
			}
		}
		last = time.Now()
		e.done.Store(int64(s.checked))
		timer.Reset(stall)
	}
	return nil
}

func (e *s2pEnd) postRecv(slot int) error {
	off := e.lay.recv + slot*e.lay.slot
	h := e.lay.slot / 2
	_, err := e.qp.PostRecv([]qp.RecvWR{{WRID: uint64(slot), SGL: []qp.SGE{e.sge(off, h), e.sge(off+h, h)}}})
	return err
}

// runRecv keeps the receive queue full and checks every receive
// completion of the peer's direction.
func (e *s2pEnd) runRecv(stall time.Duration, abort <-chan struct{}) error {
	r := e.rcv
	for i := range s2pRQ {
		if err := e.postRecv(i); err != nil {
			return err
		}
	}
	wcs := make([]cq.WC, s2pRQ)
	timer := time.NewTimer(stall)
	defer timer.Stop()
	for !r.done() {
		k := e.rcq.Poll(wcs)
		if k == 0 {
			e.rcq.ReqNotify(false)
			if k = e.rcq.Poll(wcs); k == 0 {
				if err := waitCQ(e.rcq, timer, abort); err != nil {
					return fmt.Errorf("dir %d: %w: %d receives, waiting for op %d (QP %v)", r.plan.id, err, r.recvSeq, r.want.seq, e.qp.State())
				}
				continue
			}
		}
		for i := range k {
			slot := int(wcs[i].WRID) % s2pRQ
			off := e.lay.recv + slot*e.lay.slot
			if err := r.onRecv(&wcs[i], e.buf[off:off+e.lay.slot]); err != nil {
				return err
			}
			if err := e.postRecv(slot); err != nil {
				return err
			}
		}
		timer.Reset(stall)
	}
	return nil
}

// s2pConn is one side's end of the pipe pair.
type s2pConn struct {
	enc      *json.Encoder
	in       chan s2pMsg
	quit     chan struct{}
	rerr     error     // the reader's error (set before in is closed)
	closeIn  io.Closer // parent: the peer's stdin
	wg       sync.WaitGroup
	stopOnce sync.Once
}

func newS2PConn(r io.Reader, w io.Writer, onEOF func(last string)) *s2pConn {
	c := &s2pConn{enc: json.NewEncoder(w), in: make(chan s2pMsg), quit: make(chan struct{})}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer close(c.in)
		dec := json.NewDecoder(r)
		last := ""
		for {
			var m s2pMsg
			if err := dec.Decode(&m); err != nil {
				c.rerr = err
				if onEOF != nil {
					onEOF(last)
				}
				return
			}
			last = m.Type
			select {
			case c.in <- m:
			case <-c.quit:
				return
			}
		}
	}()
	return c
}

func (c *s2pConn) send(m s2pMsg) error { return c.enc.Encode(&m) }

// recv waits for the next message other than progress, at most idle
// without any message.
func (c *s2pConn) recv(idle time.Duration) (s2pMsg, error) {
	t := time.NewTimer(idle)
	defer t.Stop()
	for {
		select {
		case m, ok := <-c.in:
			if !ok {
				return s2pMsg{}, fmt.Errorf("pipe closed: %v", c.rerr)
			}
			if m.Type == "progress" {
				t.Reset(idle)
				continue
			}
			return m, nil
		case <-t.C:
			return s2pMsg{}, fmt.Errorf("no message for %v", idle)
		}
	}
}

func (c *s2pConn) expect(typ string, idle time.Duration) (s2pMsg, error) {
	m, err := c.recv(idle)
	if err != nil {
		return m, fmt.Errorf("waiting for %q: %w", typ, err)
	}
	if m.Type != typ {
		return m, fmt.Errorf("got %q (%s), want %q", m.Type, strings.Join(m.Errors, "; "), typ)
	}
	return m, nil
}

// stop ends the reader (it returns at the pipe's EOF, or at once if it
// is handing over a message) and waits for it.
func (c *s2pConn) stop() {
	c.stopOnce.Do(func() { close(c.quit) })
	c.wg.Wait()
}

const s2pIdle = 2 * time.Minute // longest silence on the pipe

// run runs this side's workers, exchanges done/final messages with the
// peer and returns this side's result and the errors found here.
func (s *s2pSide) run(c *s2pConn) (res s2pSideResult, peer s2pSideResult, errs []string) {
	stall := s.cfg.Stall
	if stall == 0 {
		stall = 20 * time.Second
	}
	abort := make(chan struct{})
	var abortOnce sync.Once
	doAbort := func() { abortOnce.Do(func() { close(abort) }) }
	var wg sync.WaitGroup
	var mu sync.Mutex
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err.Error())
		mu.Unlock()
	}
	failWorker := func(err error) { // the first failure stops this side's other workers
		fail(err)
		doAbort()
	}
	start := time.Now()
	for _, e := range s.ends {
		wg.Add(2)
		go func() {
			defer wg.Done()
			if err := e.runSend(stall, abort); err != nil {
				failWorker(err)
			}
		}()
		go func() {
			defer wg.Done()
			if err := e.runRecv(stall, abort); err != nil {
				failWorker(err)
			}
		}()
	}
	workers := make(chan struct{})
	go func() { wg.Wait(); close(workers) }()
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	var peerDone *s2pMsg
	idle := time.NewTimer(s2pIdle)
	defer idle.Stop()
	mine := false
	for !mine || peerDone == nil {
		select {
		case <-workers:
			workers = nil
			mine = true
			mu.Lock()
			list := append([]string(nil), errs...)
			mu.Unlock()
			if err := c.send(s2pMsg{Type: "done", Errors: list}); err != nil {
				fail(fmt.Errorf("sending done: %w", err))
			}
		case m, ok := <-c.in:
			idle.Reset(s2pIdle)
			switch {
			case !ok:
				fail(fmt.Errorf("pipe closed during the run: %v", c.rerr))
				doAbort()
				wg.Wait()
				return res, peer, errs
			case m.Type == "progress":
			case m.Type == "done":
				peerDone = &m
				if len(m.Errors) > 0 {
					doAbort()
				}
			default:
				fail(fmt.Errorf("unexpected %q during the run", m.Type))
				doAbort()
			}
		case <-tick.C:
			n := 0
			for _, e := range s.ends {
				n += int(e.done.Load())
			}
			c.send(s2pMsg{Type: "progress", Done: n})
		case <-idle.C:
			fail(fmt.Errorf("no message from the other side for %v", s2pIdle))
			doAbort()
			wg.Wait()
			return res, peer, errs
		}
	}
	res.Wall = time.Since(start)
	// The peer's requesters completed everything: this side's memory is
	// final. The device goroutines that placed it released wire when they
	// sent the ACKs the peer saw; acquire it (the race detector does not
	// see through the sockets and the pipe).
	wire.Load()
	res.Sent, res.Recv = map[string]string{}, map[string]string{}
	for _, e := range s.ends {
		res.Msgs += uint64(e.snd.checked)
		res.Bytes += e.snd.bytes
		if len(errs) == 0 && len(peerDone.Errors) == 0 {
			l := &e.lay
			d, err := e.rcv.final(e.buf[l.write:l.write+s2pWSlots*l.slot], e.buf[l.readSrc:l.readSrc+l.readLen], e.buf[l.atomic:l.atomic+16])
			if err != nil {
				for _, x := range strings.Split(err.Error(), "\n") {
					fail(errors.New(x))
				}
			}
			res.Recv[strconv.FormatUint(e.rcv.plan.id, 10)] = hex.EncodeToString(d)
			res.Sent[strconv.FormatUint(e.snd.plan.id, 10)] = hex.EncodeToString(e.snd.digest())
		}
		if st := e.qp.State(); st != qp.StateRTS {
			fail(fmt.Errorf("pair %d: QP state %v", e.pair, st))
		}
	}
	res.Counters = s.dev.Stats().Map()
	res.Faults = s.fl.Stats()
	res.CorruptCopies = s.cc.Load()
	if err := c.send(s2pMsg{Type: "final", Result: &res}); err != nil {
		fail(fmt.Errorf("sending final: %w", err))
		return res, peer, errs
	}
	m, err := c.expect("final", s2pIdle)
	if err != nil {
		fail(err)
		return res, peer, errs
	}
	if m.Result == nil {
		fail(errors.New("final message without a result"))
		return res, peer, errs
	}
	peer = *m.Result
	if len(errs) == 0 && len(peerDone.Errors) == 0 {
		// both sides check every direction's digests
		for dir, d := range res.Sent {
			if peer.Recv[dir] != d {
				fail(fmt.Errorf("dir %s: digest received by the peer %.16s, sent %.16s", dir, peer.Recv[dir], d))
			}
		}
		for dir, d := range res.Recv {
			if peer.Sent[dir] != d {
				fail(fmt.Errorf("dir %s: digest received %.16s, sent by the peer %.16s", dir, d, peer.Sent[dir]))
			}
		}
	}
	return res, peer, errs
}

// runSoak2P runs the parent side and the peer process.
func runSoak2P(t *testing.T, cfg soak2pConfig) soak2pResult {
	t.Helper()
	if cfg.Pairs < 1 {
		cfg.Pairs = 1
	}
	if cfg.MaxSize < 0 {
		cfg.MaxSize = 0
	}
	cmd, c, out := startS2PPeer(t)
	defer func() {
		if t.Failed() {
			t.Logf("peer output:\n%s", out.String())
		}
	}()
	side := s2pHandshake(t, c, cfg)
	defer side.close()
	if err := c.send(s2pMsg{Type: "start"}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	a, b, errs := side.run(c)
	res := soak2pResult{msgs: a.Msgs + b.Msgs, bytes: a.Bytes + b.Bytes, wall: time.Since(start), a: a, b: b}
	for _, e := range errs {
		t.Errorf("parent: %s", e)
	}
	v, err := c.expect("verdict", s2pIdle)
	if err != nil {
		t.Errorf("peer: %v", err)
	}
	for _, e := range v.Errors {
		t.Errorf("peer: %s", e)
	}
	c.send(s2pMsg{Type: "bye"})
	if err := stopS2PPeer(cmd, c); err != nil {
		t.Errorf("peer: %v", err)
	}
	// the peer's test ran (not skipped) and its TestMain's goleak check passed
	if o := out.String(); !strings.Contains(o, "--- PASS: TestSoak2PPeer") || !strings.HasSuffix(strings.TrimSpace(o), "PASS") {
		t.Errorf("peer did not pass")
	}
	if t.Failed() {
		t.Logf("%s", res)
		return res
	}
	if want := uint64(2 * cfg.Pairs * cfg.perDir()); res.msgs != want {
		t.Errorf("%d messages completed, want %d", res.msgs, want)
	}
	// every direction's digests were compared (on both sides)
	if n := len(a.Sent) + len(b.Sent); n != 2*cfg.Pairs || len(a.Recv)+len(b.Recv) != n {
		t.Errorf("digests of %d directions sent and %d received, want %d", n, len(a.Recv)+len(b.Recv), 2*cfg.Pairs)
	}
	// the faults happened, and recovery with them
	for _, x := range []struct {
		name  string
		me    s2pSideResult
		other s2pSideResult
	}{{"parent", a, b}, {"peer", b, a}} {
		m, f := x.me.Counters, x.me.Faults.Send
		if f.Dropped == 0 || f.Duplicated == 0 || f.Reordered == 0 || f.Corrupted == 0 {
			t.Errorf("%s: injector did not apply every fault: %+v", x.name, f)
		}
		if m["retransmitted_pkts"] == 0 || m["completer_retry_err"] == 0 {
			t.Errorf("%s: no retransmission under 10%% loss: %v", x.name, m)
		}
		if m["duplicate_request"] == 0 || m["out_of_seq_request"] == 0 {
			t.Errorf("%s: responder saw no duplicate or out-of-sequence request: %v", x.name, m)
		}
		// every corrupted datagram the other side sent fails the ICRC
		// check here (IBTA A17.3.3) and is dropped; nothing else is
		// dropped in this run (a socket overflow may lose some first)
		if m["rcvd_dropped"] == 0 || m["rcvd_dropped"] > x.other.CorruptCopies {
			t.Errorf("%s: rcvd_dropped %d, the other side sent %d corrupted datagrams", x.name, m["rcvd_dropped"], x.other.CorruptCopies)
		}
		if m["rcvd_icrc_solved"] != 0 {
			t.Errorf("%s: rcvd_icrc_solved %d: a corrupted datagram passed the ICRC check via the IPv4-ID solver", x.name, m["rcvd_icrc_solved"])
		}
		if m["retry_exceeded_err"] != 0 || m["retry_rnr_exceeded_err"] != 0 {
			t.Errorf("%s: retries exhausted: %v", x.name, m)
		}
	}
	return res
}

// s2pHandshake opens the parent's side, sends the configuration and the
// QPs to the peer, and connects to the peer's QPs. Port: the parent takes
// a free one on 127.0.0.1, the peer tries it on 127.0.0.2 (another on
// "bindfail").
func s2pHandshake(t *testing.T, c *s2pConn, cfg soak2pConfig) *s2pSide {
	t.Helper()
	for try := 0; ; try++ {
		side := &s2pSide{cfg: cfg, parent: true}
		if err := side.open(addrA, 0); err != nil {
			side.close()
			t.Fatal(err)
		}
		if err := c.send(s2pMsg{Type: "config", Config: &side.cfg, QPs: side.infos()}); err != nil {
			side.close()
			t.Fatalf("config to the peer: %v", err)
		}
		m, err := c.recv(s2pIdle)
		if err == nil && m.Type == "hello" {
			if err := side.connect(addrB, m.QPs); err != nil {
				side.close()
				t.Fatal(err)
			}
			return side
		}
		side.close()
		if err != nil {
			t.Fatalf("peer: %v", err)
		}
		if m.Type != "bindfail" || try == 20 {
			t.Fatalf("peer: %s %s", m.Type, strings.Join(m.Errors, "; "))
		}
	}
}

// TestSoak2PPeerExitsWhenParentDies: the peer, in the middle of a run, exits
// on its own with status s2pPeerDied once its stdin closes (what the kernel
// does when the parent process dies), so no orphan is left.
func TestSoak2PPeerExitsWhenParentDies(t *testing.T) {
	cmd, c, out := startS2PPeer(t)
	side := s2pHandshake(t, c, soak2pConfig{Msgs: 1 << 20, Seed: 3, Pairs: 1, MaxSize: 1024})
	defer side.close()
	if err := c.send(s2pMsg{Type: "start"}); err != nil {
		t.Fatal(err)
	}
	err := stopS2PPeer(cmd, c) // closes the peer's stdin and waits (kills after 30 s)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != s2pPeerDied {
		t.Fatalf("peer exit: %v, want status %d\n%s", err, s2pPeerDied, out.String())
	}
	if !strings.Contains(out.String(), "the parent is gone") {
		t.Errorf("peer output:\n%s", out.String())
	}
}

// startS2PPeer starts the peer process: this test binary running
// TestSoak2PPeer. Its stdout and stderr go to out.
func startS2PPeer(t *testing.T) (*exec.Cmd, *s2pConn, *syncBuffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestSoak2PPeer$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), s2pPeerEnv+"=1")
	out := new(syncBuffer)
	cmd.Stdout, cmd.Stderr = out, out
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.ExtraFiles = []*os.File{w} // the peer's fd 3
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		t.Fatal(err)
	}
	w.Close()
	c := newS2PConn(r, stdin, nil)
	c.closeIn = stdin
	t.Cleanup(func() {
		// on every exit path: closing stdin makes the peer exit
		if cmd.ProcessState == nil {
			stopS2PPeer(cmd, c)
		}
		r.Close()
	})
	return cmd, c, out
}

// stopS2PPeer closes the peer's stdin and waits for it to exit (killing it
// after 30 s); it returns an error for a non-zero exit status.
func stopS2PPeer(cmd *exec.Cmd, c *s2pConn) error {
	if c.closeIn != nil {
		c.closeIn.Close()
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		cmd.Process.Signal(syscall.SIGKILL)
		err = fmt.Errorf("did not exit within 30 s after its stdin closed (killed): %v", <-done)
	}
	c.stop()
	return err
}

// syncBuffer is a bytes.Buffer safe for exec's copying goroutine and the
// test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestSoak2PPeer is the peer process of TestSoak2P (it does nothing
// unless started by it).
func TestSoak2PPeer(t *testing.T) {
	if os.Getenv(s2pPeerEnv) != "1" {
		t.Skip("the peer process of TestSoak2P; runs only when TestSoak2P starts it")
	}
	out := os.NewFile(3, "soak2p-parent")
	if out == nil {
		t.Fatal("no fd 3")
	}
	defer out.Close()
	// The parent's goodbye is the last message; EOF before it means the
	// parent died: exit at once (no orphan), whatever the workers do.
	c := newS2PConn(os.Stdin, out, func(last string) {
		if last != "bye" {
			fmt.Fprintf(os.Stderr, "soak2p peer: stdin closed after %q: the parent is gone, exiting\n", last)
			os.Exit(s2pPeerDied)
		}
	})
	defer c.stop()
	fatal := func(err error) {
		c.send(s2pMsg{Type: "fatal", Errors: []string{err.Error()}})
		t.Fatal(err)
	}
	var side *s2pSide
	defer func() {
		if side != nil {
			side.close()
		}
	}()
	for side == nil {
		m, err := c.expect("config", s2pIdle)
		if err != nil {
			t.Fatal(err)
		}
		if m.Config == nil {
			fatal(errors.New("config message without a configuration"))
		}
		s := &s2pSide{cfg: *m.Config}
		if err := s.open(addrB, m.Config.Port); err != nil {
			s.close()
			if errors.Is(err, syscall.EADDRINUSE) || errors.Is(err, link.ErrAddrInUse) {
				c.send(s2pMsg{Type: "bindfail", Errors: []string{err.Error()}})
				continue
			}
			fatal(err)
		}
		side = s
		if err := side.connect(addrA, m.QPs); err != nil {
			fatal(err)
		}
		if err := c.send(s2pMsg{Type: "hello", QPs: side.infos()}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.expect("start", s2pIdle); err != nil {
		t.Fatal(err)
	}
	_, _, errs := side.run(c)
	if err := c.send(s2pMsg{Type: "verdict", Errors: errs}); err != nil {
		t.Error(err)
	}
	for _, e := range errs {
		t.Error(e)
	}
	if _, err := c.expect("bye", s2pIdle); err != nil {
		t.Error(err)
	}
}
