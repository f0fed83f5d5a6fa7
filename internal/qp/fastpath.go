package qp

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
)

// The fast path of the requester and responder output (docs/engine.md, "Pipeline"):
//
//   - Send buffers are not owned by the QP: a txSet (64 packet buffers, the batch and its GSO
//     runs, ~270 KiB) is taken from a process-wide free list when the first packet of a burst is built and
//     returned once the burst was handed to the Output (Output.Send never keeps the buffers), so
//     an idle QP holds no send memory and 10,000 QPs fit in a few tens of MiB.
//   - When the Output is a link.RunSender that currently uses GSO for the source address, the
//     packets of a burst are grouped into GSO runs by link.RunRule as they are built, and the
//     ICRC of the k-th packet of a run is computed with IPv4 ID k (IBTA A17.3.3: the ICRC covers
//     the Identification field; the kernel numbers the segments of one GSO send 0, 1, 2, ...).
//     The link sends each run as exactly one UDP_SEGMENT message and rewrites the ICRC for ID 0
//     if it has to send a datagram plainly after all.

// txSet is one burst's send buffers.
type txSet struct {
	bufs  [txBuffers][]byte
	batch []link.Datagram
	runs  []uint8
	rule  link.RunRule
	// pseudo-header CRC states by run index for one (endpoints, length): run packets k > 0
	// need the pseudo-header with IPv4 ID k (index 0 uses the QP's icrcCache).
	runEP    bth.Endpoints
	runN     int
	runState [txBuffers]uint32
	runOK    [txBuffers]bool
}

// txPool is a free list of bursts shared by every QP of the process (a mutex-guarded stack:
// sync.Pool would do, but drops items at random under the race detector and at every other GC,
// which the zero-allocation tests would see). At most txPoolMax idle sets are kept.
var txPool struct {
	mu   sync.Mutex
	free []*txSet
}

const txPoolMax = 64

// txLast holds the set put back last, taken first (one atomic swap each way instead of the
// free list's lock and unlock; a ping-pong's QP takes and returns one set per message).
var txLast atomic.Pointer[txSet]

func getTxSet() *txSet {
	if txLast.Load() != nil {
		if t := txLast.Swap(nil); t != nil {
			return t
		}
	}
	txPool.mu.Lock()
	if n := len(txPool.free); n > 0 {
		t := txPool.free[n-1]
		txPool.free[n-1] = nil
		txPool.free = txPool.free[:n-1]
		txPool.mu.Unlock()
		return t
	}
	txPool.mu.Unlock()
	t := &txSet{batch: make([]link.Datagram, 0, txBuffers), runs: make([]uint8, 0, txBuffers)}
	for i := range t.bufs {
		t.bufs[i] = make([]byte, txBufSize)
	}
	return t
}

func putTxSet(t *txSet) {
	if txLast.Load() == nil && txLast.CompareAndSwap(nil, t) {
		return
	}
	txPool.mu.Lock()
	if len(txPool.free) < txPoolMax {
		txPool.free = append(txPool.free, t)
	}
	txPool.mu.Unlock()
}

// txSetFor returns the QP's current burst, taking one from the pool if it has none.
func (q *QP) txSetFor() *txSet {
	if q.out == nil {
		q.out = getTxSet()
	}
	return q.out
}

// releaseTx returns an empty burst to the pool.
func (q *QP) releaseTx() {
	t := q.out
	if t == nil {
		return
	}
	for i := range t.batch {
		t.batch[i] = link.Datagram{}
	}
	t.batch = t.batch[:0]
	t.runs = t.runs[:0]
	t.rule.Reset()
	q.out = nil
	putTxSet(t)
}

// runIndex places the next packet (n bytes, src -> dst) in the burst's GSO runs and returns its
// index in its run: the IPv4 ID it will carry on the wire (0 without GSO runs).
func (q *QP) runIndex(t *txSet, n int, src, dst netip.AddrPort, tclass uint8) uint16 {
	if k := len(t.batch); k > 0 && t.batch[k-1].TClass != tclass {
		// a run shares one IP header: another traffic class (UD AHs) starts afresh
		t.rule.Join(0, src, dst)
	}
	if q.runs == nil || !src.Addr().Is4() || !q.runs.RunGSO(src.Addr()) {
		// plain datagram: a run of one
		t.rule.Join(0, src, dst) // closes any open run
		t.runs = append(t.runs, 1)
		return 0
	}
	k := t.rule.Join(n, src, dst)
	if k == 0 {
		t.runs = append(t.runs, 1)
	} else {
		t.runs[len(t.runs)-1]++
	}
	return uint16(k)
}

// runICRCState returns the pseudo-header CRC state for ep with IPv4 ID k (k > 0), cached per
// (endpoints, length) in the burst.
func (t *txSet) runICRCState(ep *bth.Endpoints, n int, k uint16) uint32 {
	if t.runN != n || !t.runEP.Equal(ep) {
		t.runEP, t.runN = *ep, n
		t.runOK = [txBuffers]bool{}
	}
	if int(k) < len(t.runState) {
		if !t.runOK[k] {
			e := *ep
			e.IPID = k
			t.runState[k] = bth.PseudoHeaderCRC(&e, n)
			t.runOK[k] = true
		}
		return t.runState[k]
	}
	e := *ep
	e.IPID = k
	return bth.PseudoHeaderCRC(&e, n)
}

// sendBurst hands the burst to the Output: as GSO runs when any run has more than one packet.
func (q *QP) sendBurst(t *txSet) error {
	if q.runs != nil {
		q.pairRun(t)
		for _, r := range t.runs {
			if r > 1 {
				return q.runs.SendRuns(t.batch, t.runs)
			}
		}
	}
	return q.cfg.Out.Send(t.batch)
}

// pseudoHeader returns the cache entry holding bth.PseudoHeaderCRC(ep, n) (IBTA A17.3.3: the
// masked IP and UDP headers the ICRC covers depend only on the endpoints and the length). The
// QP keeps the last two: a bulk flow's full-MTU packets and last packet, and a latency test's
// alternating ACKs and requests, each skip the 36-byte CRC.
func (q *QP) pseudoHeader(ep *bth.Endpoints, n int) *icrcCache {
	c := &q.icrc
	if c[0].ok && c[0].n == n && c[0].ep.Equal(ep) {
		return &c[0]
	}
	if c[1].ok && c[1].n == n && c[1].ep.Equal(ep) {
		c[0], c[1] = c[1], c[0]
		return &c[0]
	}
	c[1] = c[0]
	c[0] = icrcCache{ep: *ep, n: n, state: bth.PseudoHeaderCRC(ep, n), ok: true}
	return &c[0]
}

// pairRun makes one GSO run of a burst that is a response followed by a longer request to the
// same peer: a polled device's deferred ACK (roce.Options.Polled) and the WRITE the application
// posted next. As built they are two plain datagrams (a run cannot grow past its first
// datagram's length); swapped, the request leads and sets the segment size and the response is
// the shorter last segment, so both leave as one UDP_SEGMENT message — one trip through the
// kernel's UDP/IP path and one socket read at the peer instead of two. The request stays
// segment 0 (its ICRC was computed for IPv4 ID 0); the response becomes segment 1 and gets
// its ICRC recomputed for ID 1 (IBTA A17.3.3). The two belong to opposite directions of the
// connection (the responder's ACK stream and the requester's request stream), which IBTA
// orders independently (9.7.1), so their order on the wire does not matter.
//
// The AF_XDP path sends such a pair as one GSO frame too where it can (link.PairSender, its
// GSO pairs: a veth, Linux 6.2 and later). Without GSO (the AF_XDP path's frames otherwise)
// the pair keeps its order, the ACK first. Request first
// was tried (docs/performance.md, "Tried and not kept"): the peer then reads the WRITE before the ACK it
// waits for, and flushes its own deferred ACK alone on its next Poll — two sends per half trip
// instead of one, 12% slower on the host and no better in the lab guest.
func (q *QP) pairRun(t *txSet) {
	if len(t.batch) != 2 || len(t.runs) != 2 {
		return
	}
	rsp, req := &t.batch[0], &t.batch[1]
	if len(rsp.Buf) < bth.BTHSize || len(rsp.Buf) >= len(req.Buf) || rsp.Src != req.Src || rsp.Dst != req.Dst ||
		rsp.TClass != req.TClass || !rsp.Src.Addr().Is4() || !q.pairGSO(rsp.Src.Addr()) {
		return
	}
	if bth.BTH(rsp.Buf).Opcode().Info().Request || !bth.BTH(req.Buf).Opcode().Info().Request {
		return
	}
	ep := bth.Endpoints{Src: rsp.Src.Addr(), Dst: rsp.Dst.Addr(), SrcPort: rsp.Src.Port(), DstPort: rsp.Dst.Port()}
	bth.SetICRC(rsp.Buf, bth.ICRCContinue(t.runICRCState(&ep, len(rsp.Buf), 1), rsp.Buf))
	t.batch[0], t.batch[1] = t.batch[1], t.batch[0]
	t.runs = append(t.runs[:0], 2)
}

// pairGSO reports whether the Output sends a pair run from local as one GSO message.
func (q *QP) pairGSO(local netip.Addr) bool {
	if q.pairs != nil {
		return q.pairs.PairGSO(local)
	}
	return q.runs.RunGSO(local)
}

// ensureSQ allocates the send ring at the first PostSend (Cap.MaxSendWR slots).
func (q *QP) ensureSQ() {
	if q.sq != nil {
		return
	}
	c := &q.cfg.Cap
	q.sq = make([]sendWQE, c.MaxSendWR)
	sges := make([]SGE, int(c.MaxSendWR)*int(c.MaxSendSGE))
	var inl []byte
	if c.MaxInlineData > 0 {
		inl = make([]byte, int(c.MaxSendWR)*int(c.MaxInlineData))
	}
	for i := range q.sq {
		n := int(c.MaxSendSGE)
		q.sq[i].sge = sges[i*n : i*n : (i+1)*n]
		if inl != nil {
			m := int(c.MaxInlineData)
			q.sq[i].inline = inl[i*m : i*m : (i+1)*m]
		}
	}
}

// ensureRQ allocates the receive ring at the first PostRecv (Cap.MaxRecvWR slots).
func (q *QP) ensureRQ() {
	if q.rq != nil || q.cfg.SRQ != nil {
		return
	}
	c := &q.cfg.Cap
	n := int(c.MaxRecvWR)
	if n == 0 {
		n = 1
	}
	q.rq = make([]recvWQE, n)
	sges := make([]SGE, n*int(c.MaxRecvSGE))
	for i := range q.rq {
		k := int(c.MaxRecvSGE)
		q.rq[i].sge = sges[i*k : (i+1)*k : (i+1)*k]
	}
}

// ReceiveDeferred is Receive for a receive loop that handles a batch of packets: the packets the
// responder and the completer produce stay queued in the QP's burst, and the timer is not re-armed,
// until FlushReceived. The caller must call FlushReceived(now) once after the batch for every QP
// on which ReceiveDeferred returned true (false: the packet was dropped, nothing is pending). So
// the ACKs of a batch of requests leave in one burst (one sendmmsg; each is still its own ACK, as
// rxe sends them: the replay tests compare them with rxe's byte for byte), and the requests that a
// batch of ACKs lets through leave in one burst: fewer system calls per packet on both sides.
func (q *QP) ReceiveDeferred(now time.Time, p *bth.Packet, src, dst netip.AddrPort) bool {
	q.mu.Lock()
	if q.receiveHold(p, src, dst) { // held behind a busy responder or for the owner's refill (hold.go)
		q.mu.Unlock()
		return false
	}
	ok := q.receive(now, p, src, dst)
	if q.tmr.active && !q.outstanding() {
		// everything acknowledged: the ACK timer stops now (IBTA 9.7.6.1.3), not at the flush,
		// so that a request posted before the flush starts it afresh instead of inheriting
		// this response's time as its start (a polled application posts before its next Poll)
		q.tmr.active = false
	}
	q.mu.Unlock()
	return ok
}

// FlushReceived sends what ReceiveDeferred calls queued and re-arms the QP's timer (as Receive
// does after each packet).
func (q *QP) FlushReceived(now time.Time) {
	q.mu.Lock()
	q.flush()
	q.armTimerAt(now)
	q.mu.Unlock()
}

// FlushDeferred is FlushReceived without a clock reading: it reads the QP's clock after the
// send, and only if the timer needs the time (an ACK timer that starts, or a timer to reset;
// IBTA 9.7.6.1.3). A polled device's flush of the ACK its previous Poll deferred, which the
// application's next PostSend already sent while starting the timer, reads no clock.
func (q *QP) FlushDeferred() {
	q.mu.Lock()
	q.flush()
	q.armTimer()
	q.mu.Unlock()
}
