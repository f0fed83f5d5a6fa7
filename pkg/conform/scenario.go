package conform

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/rocetest"
	"github.com/softroce/softroce/pkg/bth"
)

// Scenario is one conformance check: a DUT setup, packets the bench sends, and the
// replies, silences, completions and memory effects the IBTA rules require.
type Scenario struct {
	// Name is unique, lower-case, dash-separated ("rc-send-only-ack").
	Name string
	// Section cites the IBTA Vol. 1 (1.5) section or compliance statement checked.
	Section string
	// Summary says what is sent and what must happen.
	Summary string
	// RxeDeviation, if set, says how kernel rxe (6.1) deviates from the spec here; the
	// scenario then expects rxe's observed behaviour from the rxe DUT (Case.RxeDeviates).
	RxeDeviation string
	// Softroce documents softroce's chosen behaviour where the spec leaves a choice or
	// rxe deviates.
	Softroce string
	// SoftroceDeviation, if set, says how softroce deviates from the spec by design (for
	// example what a UDP socket cannot see); the scenario then expects softroce's
	// documented behaviour from the softroce DUT (Case.SoftroceDeviates).
	SoftroceDeviation string
	// Needs is the device_cap_flags_ex bits the scenario needs (CapAtomicWrite, ...): a DUT
	// whose capabilities are known (DeviceCapper, Bench.DevCaps) and lack one skips it.
	Needs uint64
	// Run performs the scenario; failures are reported through the Case.
	Run func(c *Case)
}

// Outcome of a scenario.
const (
	Pass = "pass"
	Fail = "fail"
	Skip = "skip"
)

// Result is the outcome of one scenario (one line of --json).
type Result struct {
	Name    string `json:"name"`
	Section string `json:"section"`
	Result  string `json:"result"`
	Detail  string `json:"detail"`
	// Log is the scenario's trace (not in the JSON line).
	Log      []string      `json:"-"`
	Duration time.Duration `json:"-"`
}

// RunOptions configure Run.
type RunOptions struct {
	// Match selects scenarios by name (nil = all).
	Match *regexp.Regexp
	// Progress, if set, gets each result as soon as it is known.
	Progress func(Result)
}

type caseAbort struct{}

// Case is the running state of one scenario: the DUT QP it set up, the bench's QPN and
// PSNs, and helpers that send, expect and check (each failure aborts the scenario, like
// testing.T.Fatal).
type Case struct {
	B *Bench
	// Index is the scenario's position in the run (it makes the bench QPN and PSNs unique).
	Index int
	sc    *Scenario

	// Cfg is the DUT QP's configuration (after Setup).
	Cfg QPConfig
	// QPN is the DUT's QPN, BenchQPN the bench's.
	QPN, BenchQPN uint32
	// PSN is the bench's next request PSN (Next advances it).
	PSN bth.PSN

	recvMR  *MRInfo
	qps     []uint32
	mrs     []int
	log     []string
	skipped string
	detail  string
}

// Logf adds a line to the scenario's trace.
func (c *Case) Logf(format string, args ...any) {
	c.log = append(c.log, fmt.Sprintf(format, args...))
}

// Fatalf fails the scenario with detail and stops it.
func (c *Case) Fatalf(format string, args ...any) {
	c.detail = fmt.Sprintf(format, args...)
	c.Logf("FAIL: %s", c.detail)
	panic(caseAbort{})
}

// Skipf skips the scenario (the DUT cannot run it) and stops it.
func (c *Case) Skipf(format string, args ...any) {
	c.skipped = fmt.Sprintf(format, args...)
	panic(caseAbort{})
}

// RxeDeviates reports whether the DUT is kernel rxe and the scenario documents an rxe
// deviation: the scenario must then expect rxe's behaviour.
func (c *Case) RxeDeviates() bool { return c.B.Rxe && c.sc.RxeDeviation != "" }

// SoftroceDeviates reports whether the DUT is softroce and the scenario documents a
// softroce deviation by design.
func (c *Case) SoftroceDeviates() bool { return c.B.Softroce && c.sc.SoftroceDeviation != "" }

// AllAccess is the remote access a scenario QP or MR gets by default.
const AllAccess = mr.AccessLocalWrite | mr.AccessRemoteWrite | mr.AccessRemoteRead | mr.AccessRemoteAtomic

// DefaultMTU is the path MTU of scenario QPs: rxe's active MTU on the lab's 1500-byte link.
const DefaultMTU = 1024

// DefaultMinRNRTimer is the RNR timer code scenario QPs advertise (14 = 1.28 ms).
const DefaultMinRNRTimer = 14

// Setup creates the scenario's DUT QP (defaults: RC, MTU 1024, min_rnr_timer 14, 4
// responder resources, all remote access), connected to the bench QPN; edit adjusts the
// configuration first. It sets c.QPN, c.BenchQPN, c.PSN and c.Cfg.
func (c *Case) Setup(edit func(*QPConfig)) uint32 {
	cfg := c.baseConfig()
	if edit != nil {
		edit(&cfg)
	}
	qpn, err := c.B.DUT.CreateQP(cfg)
	if err != nil {
		c.Fatalf("create QP %v: %v", cfg.Type, err)
	}
	c.adopt(cfg, qpn)
	return qpn
}

// baseConfig is Setup's default configuration for the case's next QP.
func (c *Case) baseConfig() QPConfig {
	return QPConfig{
		Type: RC, BenchAddr: c.B.Peer.Local.Addr(),
		BenchQPN: 0x0c0000 + uint32(c.Index)*0x10 + uint32(len(c.qps)),
		BenchPSN: bth.PSN(0x100010 + uint32(c.Index)*0x1000),
		DUTPSN:   bth.PSN(0x200020 + uint32(c.Index)*0x1000),
		MTU:      DefaultMTU, MinRNRTimer: DefaultMinRNRTimer, Timeout: 14, RetryCnt: 3, RNRRetry: 3,
		MaxDestRDAtomic: 4, MaxRDAtomic: 4, Access: AllAccess, QKey: 0x11111111,
	}
}

// adopt makes the created QP qpn (configured as cfg) the case's QP.
func (c *Case) adopt(cfg QPConfig, qpn uint32) {
	c.qps = append(c.qps, qpn)
	c.Cfg, c.QPN, c.BenchQPN, c.PSN = cfg, qpn, cfg.BenchQPN, cfg.BenchPSN
	c.Logf("DUT %v QP %#x <-> bench QPN %#x, bench PSN %#x, DUT PSN %#x, MTU %d", cfg.Type, qpn, cfg.BenchQPN, uint32(cfg.BenchPSN), uint32(cfg.DUTPSN), cfg.MTU)
}

// MR registers a DUT memory region of size bytes filled with Pattern(size, seed), or
// left as registered for seed 0 (both DUTs hand out zeroed regions).
func (c *Case) MR(size int, acc mr.Access, seed byte) MRInfo {
	m, err := c.B.DUT.RegMR(MRConfig{Size: size, Access: acc})
	if err != nil {
		c.Fatalf("reg MR (%d bytes, %s): %v", size, accessString(acc), err)
	}
	return c.adoptMR(m, acc, seed)
}

// adoptMR makes the registered region m the case's (deregistered at the end) and fills it
// as MR does.
func (c *Case) adoptMR(m MRInfo, acc mr.Access, seed byte) MRInfo {
	size := m.Size
	c.mrs = append(c.mrs, m.ID)
	if size > 0 && seed != 0 {
		if err := c.B.DUT.WriteMR(m.ID, 0, Pattern(size, seed)); err != nil {
			c.Fatalf("write MR: %v", err)
		}
	}
	c.Logf("DUT MR %d: %d bytes at %#x rkey %#x (%s)", m.ID, size, m.VA, m.RKey, accessString(acc))
	return m
}

// Pattern returns n deterministic bytes for seed.
func Pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7+int(seed)*31) ^ byte(i>>8)
	}
	return b
}

// RecvSlot is the size of each receive buffer Recv posts.
const RecvSlot = 4096

// Recv posts n receive WRs on the QP, WR i with a RecvSlot-byte buffer (or size bytes if
// size > 0) at offset i*RecvSlot of a scratch region (WR IDs 1000+i upward).
func (c *Case) Recv(n, size int) {
	if c.recvMR == nil {
		m := c.MR(64*RecvSlot, mr.AccessLocalWrite, 0)
		c.recvMR = &m
	}
	if size <= 0 {
		size = RecvSlot
	}
	for i := range n {
		if err := c.B.DUT.PostRecv(c.QPN, RecvConfig{MR: c.recvMR.ID, Off: i * RecvSlot, Len: size, Count: 1, WRID: uint64(1000 + i)}); err != nil {
			c.Fatalf("post recv: %v", err)
		}
	}
}

// RecvData reads n bytes of receive buffer i.
func (c *Case) RecvData(i, n int) []byte { return c.Mem(*c.recvMR, i*RecvSlot, n) }

// Mem reads DUT memory.
func (c *Case) Mem(m MRInfo, off, n int) []byte {
	b, err := c.B.DUT.ReadMR(m.ID, off, n)
	if err != nil {
		c.Fatalf("read MR: %v", err)
	}
	return b
}

// SetMem writes DUT memory.
func (c *Case) SetMem(m MRInfo, off int, data []byte) {
	if err := c.B.DUT.WriteMR(m.ID, off, data); err != nil {
		c.Fatalf("write MR: %v", err)
	}
}

// Next returns the bench's next PSN and advances it.
func (c *Case) Next() bth.PSN {
	p := c.PSN
	c.PSN = c.PSN.Add(1)
	return p
}

// Send sends s to the DUT (DestQP 0 means the scenario's DUT QP; use SendRaw for QP 0).
func (c *Case) Send(s rocetest.Spec) {
	if s.DestQP == 0 {
		s.DestQP = c.QPN
	}
	c.SendRaw(s)
}

// SendRaw sends s as is.
func (c *Case) SendRaw(s rocetest.Spec) {
	pkt, err := c.B.Send(&s)
	if err != nil {
		c.Fatalf("send %v psn %#x: %v", s.Opcode, uint32(s.PSN), err)
	}
	c.Logf("bench -> DUT: %v destqp=%#x psn=%#x ackreq=%v payload=%d (%d bytes)", s.Opcode, s.DestQP, uint32(s.PSN), s.AckReq, len(s.Payload), len(pkt))
}

func (c *Case) skippedPkt(s string) { c.Logf("ignored: %s", s) }

// Expect waits (Bench.Reply) for the next packet to the bench QP and matches it against e.
func (c *Case) Expect(what string, e rocetest.Expect) *rocetest.Received {
	return c.ExpectWithin(what, e, c.B.reply())
}

// ExpectWithin is Expect with an explicit timeout.
func (c *Case) ExpectWithin(what string, e rocetest.Expect, timeout time.Duration) *rocetest.Received {
	r, err := c.B.ExpectWithin(c.BenchQPN, &e, timeout, c.skippedPkt)
	if r != nil {
		c.Logf("DUT -> bench: %s", rocetest.Describe(&r.Pkt))
	}
	if err != nil {
		c.Fatalf("%s: %v", what, err)
	}
	return r
}

// ExpectAck expects an ACK (syndrome 0x1F-class ACK, IBTA 9.3.5) for psn with msn.
func (c *Case) ExpectAck(psn bth.PSN, msn uint32) *rocetest.Received {
	return c.Expect(fmt.Sprintf("ACK psn %#x msn %d", uint32(psn), msn), rocetest.Expect{
		Opcode: rocetest.Ptr(bth.OpRCAck), PSN: &psn, AckType: rocetest.Ptr(bth.AckTypeACK), MSN: &msn})
}

// ExpectNAK expects a NAK (IBTA 9.7.5.2) with code for psn and msn.
func (c *Case) ExpectNAK(psn bth.PSN, code uint8, msn uint32) *rocetest.Received {
	return c.Expect(fmt.Sprintf("NAK %d psn %#x msn %d", code, uint32(psn), msn), rocetest.Expect{
		Opcode: rocetest.Ptr(bth.OpRCAck), PSN: &psn, Syndrome: rocetest.Ptr(bth.SyndromeNAK(code)), MSN: &msn})
}

// ExpectRNR expects an RNR NAK (IBTA 9.7.5.2.8) for psn carrying timer code timer.
func (c *Case) ExpectRNR(psn bth.PSN, timer uint8, msn uint32) *rocetest.Received {
	return c.Expect(fmt.Sprintf("RNR NAK psn %#x timer %d msn %d", uint32(psn), timer, msn), rocetest.Expect{
		Opcode: rocetest.Ptr(bth.OpRCAck), PSN: &psn, Syndrome: rocetest.Ptr(bth.SyndromeRNR(timer)), MSN: &msn})
}

// ExpectNothing fails if the DUT sends anything to the bench QP within the quiet time.
func (c *Case) ExpectNothing(what string) { c.ExpectNothingFor(what, c.B.quiet()) }

// ExpectNothingFor is ExpectNothing with an explicit listening time.
func (c *Case) ExpectNothingFor(what string, d time.Duration) {
	if err := c.B.ExpectNothingFor(c.BenchQPN, d, c.skippedPkt); err != nil {
		c.Fatalf("%s: expected silence: %v", what, err)
	}
}

// Poll waits for up to n completions (Reply at most) and returns them.
func (c *Case) Poll(n int) []Completion {
	wcs, err := c.B.DUT.Poll(c.QPN, n, c.B.reply())
	if err != nil {
		c.Fatalf("poll: %v", err)
	}
	for _, w := range wcs {
		c.Logf("DUT completion %v", w)
	}
	return wcs
}

// ExpectCompletions waits for exactly the completions want (in order; WRID 0 in want
// matches any WRID) and fails on a difference.
func (c *Case) ExpectCompletions(want ...Completion) []Completion {
	got := c.Poll(len(want))
	if len(got) != len(want) {
		c.Fatalf("%d completions %v, want %d %v", len(got), got, len(want), want)
	}
	for i := range want {
		w, g := want[i], got[i]
		if w.WRID == 0 {
			w.WRID = g.WRID
		}
		if c.Cfg.Type != UD {
			// IBV_WC_GRH is defined for UD only (kernel rxe sets it on RC/UC too)
			w.Flags &^= cq.FlagGRH
			g.Flags &^= cq.FlagGRH
		}
		if g != w {
			c.Fatalf("completion %d: got %v, want %v", i, got[i], w)
		}
	}
	return got
}

// ExpectNoCompletion fails if a completion appears within the quiet time.
func (c *Case) ExpectNoCompletion(what string) {
	wcs, err := c.B.DUT.Poll(c.QPN, 1, c.B.quiet()/3)
	if err != nil {
		c.Fatalf("poll: %v", err)
	}
	if len(wcs) > 0 {
		c.Fatalf("%s: unexpected completion %v", what, wcs[0])
	}
}

// ExpectMem fails unless DUT memory at off holds want.
func (c *Case) ExpectMem(what string, m MRInfo, off int, want []byte) {
	got := c.Mem(m, off, len(want))
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && got[i] == want[i] {
			i++
		}
		c.Fatalf("%s: memory differs at byte %d of %d (got %#02x, want %#02x)", what, i, len(want), got[i], want[i])
	}
}

// ExpectState fails unless the DUT QP is in state want.
func (c *Case) ExpectState(want QPState) {
	st, err := c.B.DUT.State(c.QPN)
	if err != nil {
		c.Fatalf("query QP: %v", err)
	}
	if st != want {
		c.Fatalf("QP state %v, want %v", st, want)
	}
}

// Check fails the scenario with msg unless ok.
func (c *Case) Check(ok bool, format string, args ...any) {
	if !ok {
		c.Fatalf(format, args...)
	}
}

func (c *Case) cleanup() {
	for _, q := range c.qps {
		if err := c.B.DUT.DestroyQP(q); err != nil {
			c.Logf("cleanup: destroy QP %#x: %v", q, err)
		}
	}
	for _, m := range c.mrs {
		if err := c.B.DUT.DeregMR(m); err != nil {
			c.Logf("cleanup: dereg MR %d: %v", m, err)
		}
	}
}

// Run runs the scenarios (those o.Match selects) against b, one after the other.
func Run(b *Bench, scs []Scenario, o RunOptions) []Result {
	var out []Result
	for i := range scs {
		sc := &scs[i]
		if o.Match != nil && !o.Match.MatchString(sc.Name) {
			continue
		}
		r := RunOne(b, sc, i)
		if o.Progress != nil {
			o.Progress(r)
		}
		out = append(out, r)
	}
	return out
}

// RunOne runs one scenario; index makes its QPNs and PSNs unique within a run.
func RunOne(b *Bench, sc *Scenario, index int) (res Result) {
	c := &Case{B: b, Index: index, sc: sc}
	t0 := time.Now()
	res = Result{Name: sc.Name, Section: sc.Section}
	if caps, ok := b.deviceCaps(); ok && caps&sc.Needs != sc.Needs {
		res.Result = Skip
		res.Detail = fmt.Sprintf("the DUT's device_cap_flags_ex %#x lacks %s", caps, capNames(sc.Needs&^caps))
		return res
	}
	b.Drain()
	func() {
		defer func() {
			if r := recover(); r != nil {
				if _, ok := r.(caseAbort); !ok {
					c.detail = fmt.Sprintf("panic: %v", r)
				}
			}
		}()
		sc.Run(c)
	}()
	c.cleanup()
	switch {
	case c.skipped != "":
		res.Result, res.Detail = Skip, c.skipped
	case c.detail != "":
		res.Result, res.Detail = Fail, c.detail
	default:
		res.Result = Pass
		if c.RxeDeviates() {
			res.Detail = "rxe deviation: " + sc.RxeDeviation
		}
		if c.SoftroceDeviates() {
			res.Detail = "softroce deviation: " + sc.SoftroceDeviation
		}
	}
	res.Log, res.Duration = c.log, time.Since(t0)
	return res
}

// WriteTable prints results as a table: scenario, section, result, detail.
func WriteTable(w io.Writer, rs []Result) {
	nw, sw := len("scenario"), len("section")
	for _, r := range rs {
		nw, sw = max(nw, len(r.Name)), max(sw, len(r.Section))
	}
	fmt.Fprintf(w, "%-*s  %-*s  %-6s  %s\n", nw, "scenario", sw, "section", "result", "detail")
	var pass, fail, skip int
	for _, r := range rs {
		switch r.Result {
		case Pass:
			pass++
		case Fail:
			fail++
		default:
			skip++
		}
		fmt.Fprintf(w, "%-*s  %-*s  %-6s  %s\n", nw, r.Name, sw, r.Section, r.Result, strings.ReplaceAll(r.Detail, "\n", " "))
	}
	fmt.Fprintf(w, "%d scenarios: %d pass, %d fail, %d skip\n", len(rs), pass, fail, skip)
}

// WriteJSON writes one JSON object per result per line (keys name, section, result, detail).
func WriteJSON(w io.Writer, rs []Result) error {
	enc := json.NewEncoder(w)
	for i := range rs {
		if err := enc.Encode(&rs[i]); err != nil {
			return err
		}
	}
	return nil
}
