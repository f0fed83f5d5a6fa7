package pingpong

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"time"

	"github.com/softroce/softroce/internal/cq"
	oobpp "github.com/softroce/softroce/internal/oob/pingpong"
)

// ppLoop holds the counters of the ping-pong loop.
type ppLoop struct {
	p                 *ppCtx
	routs, rcnt, scnt int
	refillAt          int
	wcs               []cq.WC
	qpIndex           map[uint32]int
	spins             int
	spinSince         time.Time
	deadline          time.Time
	timer             *time.Timer
}

// run is the tools' main loop, from the first SEND to the last completion.
func (p *ppCtx) run(client bool) (time.Duration, error) {
	c := p.c
	l := p.newLoop()
	if c.Events {
		l.timer = time.NewTimer(c.Timeout)
		defer l.timer.Stop()
	}
	start := time.Now()
	l.deadline = start.Add(c.Timeout)
	if err := l.start(client); err != nil {
		return 0, err
	}
	for l.rcnt < c.Iters || l.scnt < c.Iters {
		ne, err := l.wait()
		if err != nil {
			return 0, err
		}
		for i := 0; i < ne; i++ {
			if err := l.handle(&l.wcs[i]); err != nil {
				return 0, err
			}
		}
	}
	return time.Since(start), nil
}

// newLoop prepares the loop state: every QP waits for a RECV.
func (p *ppCtx) newLoop() *ppLoop {
	c := p.c
	l := &ppLoop{p: p, routs: c.RxDepth, refillAt: 1, wcs: make([]cq.WC, 2), qpIndex: map[uint32]int{}}
	if c.Tool == oobpp.ToolSRQ {
		l.refillAt, l.wcs = c.NumQP, make([]cq.WC, c.NumQP+c.RxDepth)
	}
	for i, q := range p.qps {
		l.qpIndex[q.Num()] = i
	}
	p.pending = make([]int, c.NumQP)
	for i := range p.pending {
		p.pending[i] = ppRecvWRID
	}
	return l
}

// start is what the client does before the loop: fill its buffer (-c) and post the first
// SEND on every QP.
func (l *ppLoop) start(client bool) error {
	p, c := l.p, l.p.c
	if !client {
		return nil
	}
	for i := range p.qps {
		if c.Validate { // for (i = 0; i < size; i += page_size) buf[i] = i / page_size % sizeof(char)
			ppFillPages(p.sendBufOf(i))
		}
		if p.c.Fill != nil {
			p.c.Fill(p.sendBufOf(i))
		}
	}
	for i := range p.qps {
		if err := p.postSend(i); err != nil {
			return fmt.Errorf("%w: Couldn't post send: %w", errPPVerbs, err)
		}
		p.pending[i] |= ppSendWRID
	}
	return nil
}

// wait returns the next completions: busy polling, or (-e) blocking on the CQ's completion
// channel and re-arming it (ibv_get_cq_event, ibv_req_notify_cq), bounded by -timeout since
// the last completion.
func (l *ppLoop) wait() (int, error) {
	p := l.p
	for {
		if ne := p.cq.Poll(l.wcs); ne > 0 {
			l.deadline, l.spinSince = time.Now().Add(p.c.Timeout), time.Time{}
			return ne, nil
		}
		if p.c.Events {
			l.timer.Reset(time.Until(l.deadline))
			select {
			case <-p.cq.Channel():
			case <-l.timer.C:
				return 0, l.timeoutErr()
			}
			if err := p.cq.ReqNotify(false); err != nil {
				return 0, fmt.Errorf("%w: Couldn't request CQ notification: %w", errPPVerbs, err)
			}
			continue // completions queued before the re-arm are polled now
		}
		if err := ppCQErr(p.cq); err != nil {
			return 0, fmt.Errorf("%w: poll CQ failed: %w", errPPVerbs, err)
		}
		l.spins++
		if l.spins&0xff != 0 {
			runtime.Gosched() // busy poll, but let the device's goroutines run
			continue
		}
		now := time.Now()
		if now.After(l.deadline) {
			return 0, l.timeoutErr()
		}
		if l.spinSince.IsZero() {
			l.spinSince = now
			continue
		}
		if now.Sub(l.spinSince) < ppSpinLimit {
			continue
		}
		// Polled for ppSpinLimit without a completion: unlike an HCA, softroce's device runs
		// on the same CPUs as this loop, so sleep on the CQ until the next completion.
		if err := p.cq.ReqNotify(false); err != nil {
			return 0, fmt.Errorf("%w: Couldn't request CQ notification: %w", errPPVerbs, err)
		}
		if ne := p.cq.Poll(l.wcs); ne > 0 { // arrived before the arm
			l.deadline, l.spinSince = time.Now().Add(p.c.Timeout), time.Time{}
			return ne, nil
		}
		t := time.NewTimer(time.Until(l.deadline))
		select {
		case <-p.cq.Channel():
		case <-t.C:
		}
		t.Stop()
		l.spinSince = time.Time{}
	}
}

// ppSpinLimit is how long the polling loop (no -e) spins before it sleeps on the CQ.
const ppSpinLimit = 200 * time.Microsecond

func (l *ppLoop) timeoutErr() error {
	return fmt.Errorf("%w: no completion for %v (%d of %d SENDs and %d of %d RECVs completed): is the peer still there?",
		errPPTimeout, l.p.c.Timeout, l.scnt, l.p.c.Iters, l.rcnt, l.p.c.Iters)
}

// handle is parse_single_wc.
func (l *ppLoop) handle(wc *cq.WC) error {
	p, c := l.p, l.p.c
	if wc.Status != cq.StatusSuccess {
		return &ppWCError{WC: *wc}
	}
	qi := 0
	if c.Tool == oobpp.ToolSRQ { // find_qp
		i, ok := l.qpIndex[wc.QPNum]
		if !ok {
			return fmt.Errorf("%w: Couldn't find QPN %06x", errPPVerbs, wc.QPNum)
		}
		qi = i
	}
	kind := wc.WRID
	if p.srq != nil {
		kind &= 0xff
	}
	switch kind {
	case ppSendWRID:
		l.scnt++
	case ppRecvWRID:
		data := p.buf
		if p.srq != nil {
			slot := int(wc.WRID >> 8)
			if slot >= c.RxDepth {
				return fmt.Errorf("%w: Completion for unknown wr_id %d", errPPVerbs, int(wc.WRID))
			}
			data = p.buf[(c.NumQP+slot)*c.Size:][:c.Size]
			copy(p.last, data) // before the slot is posted again below
			p.haveLast = true
		}
		if p.c.OnRecv != nil {
			p.c.OnRecv(wc, data[:min(int(wc.ByteLen), len(data))])
		}
		if l.routs--; l.routs <= l.refillAt {
			l.routs += p.postRecv(c.RxDepth - l.routs)
			if l.routs < c.RxDepth {
				return fmt.Errorf("%w: Couldn't post receive (%d)", errPPVerbs, l.routs)
			}
		}
		l.rcnt++
	default:
		return fmt.Errorf("%w: Completion for unknown wr_id %d", errPPVerbs, int(wc.WRID))
	}
	p.pending[qi] &^= int(kind)
	if l.scnt < c.Iters && p.pending[qi] == 0 {
		if err := p.postSend(qi); err != nil {
			return fmt.Errorf("%w: Couldn't post send: %w", errPPVerbs, err)
		}
		p.pending[qi] = ppRecvWRID | ppSendWRID
	}
	return nil
}

// sendBufOf is the part of the buffer QP i's SENDs carry (ud: after the GRH room; srq: the
// QP's own send buffer).
func (p *ppCtx) sendBufOf(i int) []byte {
	switch p.c.Tool {
	case oobpp.ToolUD:
		return p.buf[ppGRHSize:]
	case oobpp.ToolSRQ:
		return p.buf[i*p.c.Size:][:p.c.Size]
	}
	return p.buf
}

// finalBuf is the buffer the client checks with -c: ctx->buf, the last message received
// (srq: its copy).
func (p *ppCtx) finalBuf() []byte {
	if p.srq != nil {
		if !p.haveLast {
			return p.sendBufOf(0)
		}
		return p.last
	}
	return p.sendBufOf(0)
}

// ppPageSize is sysconf(_SC_PAGESIZE), the stride of the -c pattern.
var ppPageSize = os.Getpagesize()

// ppFillPages writes the -c pattern of rdma-core v44: buf[i] = i / page_size % sizeof(char)
// at every page start, i.e. a zero byte (sizeof(char) is 1).
func ppFillPages(b []byte) {
	for i := 0; i < len(b); i += ppPageSize {
		//lint:ignore SA4028 rdma-core's expression, kept to show the pattern it writes
		b[i] = byte(i / ppPageSize % 1)
	}
}

// ppCheckPages is the client's -c check after the loop: one "invalid data in page %d" line
// (on stdout) per page whose first byte is not the pattern. Like the tools, it does not change
// the exit status. It returns the number of bad pages.
func ppCheckPages(w io.Writer, b []byte) int {
	bad := 0
	for i := 0; i < len(b); i += ppPageSize {
		//lint:ignore SA4028 rdma-core's expression, as in ppFillPages
		if b[i] != byte(i/ppPageSize%1) {
			fmt.Fprintf(w, "invalid data in page %d\n", i/ppPageSize)
			bad++
		}
	}
	return bad
}
